/*
 * dsm-info: what this libdsm build is, and how a mesh places ranks.
 *
 *   dsm-info [--json]                version, MPI library, features, parameters
 *   dsm-info --env [--json]          the environment parameters with their help
 *   mpiexec -n N dsm-info mesh --shape 2,2,2 [--names dp,cp,tp] [--slice dp,cp]
 *       [--flatten dp,cp] [--placement node|none] [--json]
 *   dsm-info config FILE|JSON --world-size N [--sequence-parallel-size S]
 *       [--strict] [--json]           the resolved DeepSpeed configuration
 *   dsm-info lr FILE|JSON --steps N [--world-size N] [--json]
 *                                    the learning rate after each optimizer step
 *
 * The mesh subcommand prints from rank 0 (doc/dsm-info.md specifies the JSON).
 */
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <utility>
#include <string>
#include <vector>

#include <mpi.h>

#include "../common/cli.hpp"
#include "dsm.h"

#define MAX_LIST DSM_MESH_MAX_DIMS

static void usage(FILE *out) {
    fputs("usage: dsm-info [--json] [--env]\n"
          "       mpiexec -n N dsm-info mesh --shape S0,S1,... [--names N0,N1,...]\n"
          "                [--slice NAMES] [--flatten NAMES] [--placement node|none] [--json]\n"
          "       dsm-info config FILE|JSON --world-size N [--sequence-parallel-size S]\n"
          "                [--strict] [--json]\n"
          "       dsm-info lr FILE|JSON --steps N [--world-size N] [--json]\n"
          "\n"
          "  --json        machine-readable output (format in doc/dsm-info.md)\n"
          "  --env         only the environment parameters, with their help\n"
          "  --shape       mesh shape, outermost first; one entry may be -1 (inferred)\n"
          "  --names       dimension names (default d0,d1,...)\n"
          "  --slice       describe the sub-mesh of these dimensions (mesh order)\n"
          "  --flatten     flatten these dimensions into a group named by joining them\n"
          "                with _ (one dimension D: D_flat)\n"
          "  --placement   node (default: from DSM_MESH_PLACEMENT) or none\n"
          "  --world-size  ranks of the job the configuration is resolved for (lr: default 1)\n"
          "  --sequence-parallel-size\n"
          "                size of the mesh's sequence_parallel dimension; the\n"
          "                data_parallel dimension is world-size / S\n"
          "  --strict      unknown configuration keys are an error\n"
          "  --steps       optimizer steps to show the learning rate for\n",
          out);
}

/* Split "a,b,c" in place into at most MAX_LIST items; returns the count or -1. */
static int split_list(char *s, char *items[]) {
    int n = 0;
    for (char *tok = strtok(s, ","); tok != NULL; tok = strtok(NULL, ",")) {
        if (n == MAX_LIST) return -1;
        items[n++] = tok;
    }
    return n;
}

static int info_main(int json, int env_only) {
    char *text = NULL;
    dsm_status_t st = dsm_info_describe(json ? DSM_FORMAT_JSON : DSM_FORMAT_TEXT, &text);
    if (st != DSM_SUCCESS) {
        fprintf(stderr, "dsm-info: %s\n", dsm_last_error());
        return 1;
    }
    /* --env keeps the parameters only; the JSON document is printed whole
       (its "parameters" member) so that it stays one valid JSON value. */
    const char *p = env_only && !json ? strstr(text, "environment parameters:") : NULL;
    fputs(p != NULL ? p : text, stdout);
    dsm_free(text);
    return 0;
}

/* The options of the subcommands; NULL: not given. */
struct Options {
    char *shape = nullptr, *names = nullptr, *slice = nullptr, *flatten = nullptr, *placement = nullptr;
    const char *config = nullptr;
    long long world = -1, sp = 0, steps = -1;
    unsigned flags = 0;
    int json = 0, env_only = 0;
};

static int mesh_main(const Options &o) {
    char *shape_arg = o.shape, *names_arg = o.names, *slice_arg = o.slice, *flatten_arg = o.flatten,
         *placement_arg = o.placement;
    const int json = o.json;
    if (shape_arg == NULL) {
        fputs("dsm-info mesh: --shape is required\n", stderr);
        return 2;
    }
    char *items[MAX_LIST];
    int shape[MAX_LIST];
    int ndims = split_list(shape_arg, items);
    if (ndims <= 0) {
        fprintf(stderr, "dsm-info mesh: --shape needs 1 to %d sizes\n", MAX_LIST);
        return 2;
    }
    for (int d = 0; d < ndims; ++d) {
        long long v = 0;
        if (!dsm::tools::parse_integer(items[d], -1, 1 << 30, &v)) {
            fprintf(stderr, "dsm-info mesh: --shape: '%s' is not a size from -1 to 1073741824\n", items[d]);
            return 2;
        }
        shape[d] = (int)v;
    }
    char default_names[MAX_LIST][12];
    const char *names[MAX_LIST];
    if (names_arg != NULL) {
        char *n[MAX_LIST];
        int nn = split_list(names_arg, n);
        if (nn != ndims) {
            fprintf(stderr, "dsm-info mesh: --names gives %d names for %d dimensions\n", nn, ndims);
            return 2;
        }
        for (int d = 0; d < ndims; ++d) names[d] = n[d];
    } else {
        for (int d = 0; d < ndims; ++d) {
            snprintf(default_names[d], sizeof default_names[d], "d%d", d);
            names[d] = default_names[d];
        }
    }
    dsm_mesh_options_t opts = DSM_MESH_OPTIONS_INITIALIZER;
    if (placement_arg != NULL) {
        if (strcmp(placement_arg, "node") == 0) opts.placement = DSM_PLACEMENT_NODE;
        else if (strcmp(placement_arg, "none") == 0) opts.placement = DSM_PLACEMENT_NONE;
        else {
            fprintf(stderr, "dsm-info mesh: --placement '%s' is not node or none\n", placement_arg);
            return 2;
        }
    }

    int rank = 0, rc = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    dsm_mesh_t mesh = NULL, view = NULL;
    char *text = NULL;
    dsm_status_t st = dsm_mesh_create_with_options(MPI_COMM_WORLD, ndims, shape, names, &opts, &mesh);
    if (st == DSM_SUCCESS && flatten_arg != NULL) {
        char flat_name[DSM_NAME_MAX + 2] = "";
        char *f[MAX_LIST];
        int nf = split_list(flatten_arg, f);
        for (int i = 0; i < nf; ++i) {
            if (i) strncat(flat_name, "_", sizeof flat_name - strlen(flat_name) - 1);
            strncat(flat_name, f[i], sizeof flat_name - strlen(flat_name) - 1);
        }
        /* One dimension: its name is taken, so the group is NAME_flat. */
        if (nf == 1) strncat(flat_name, "_flat", sizeof flat_name - strlen(flat_name) - 1);
        st = dsm_mesh_flatten(mesh, nf, (const char *const *)f, flat_name, NULL);
    }
    if (st == DSM_SUCCESS && slice_arg != NULL) {
        char *s[MAX_LIST];
        int ns = split_list(slice_arg, s);
        st = dsm_mesh_slice(mesh, ns, (const char *const *)s, &view);
    }
    if (st == DSM_SUCCESS)
        st = dsm_mesh_describe(view != NULL ? view : mesh, json ? DSM_FORMAT_JSON : DSM_FORMAT_TEXT, &text);
    if (st != DSM_SUCCESS) {
        if (rank == 0) fprintf(stderr, "dsm-info mesh: %s\n", dsm_last_error());
        rc = 1;
    } else if (rank == 0) {
        fputs(text, stdout);
        fflush(stdout);
    }
    dsm_free(text);
    dsm_mesh_free(&view);
    dsm_mesh_free(&mesh);
    return rc;
}

/* dsm-info config|lr CONFIG [options]: resolved without running a job. */
static int config_main(int lr, const Options &o) {
    const char *what = lr ? "lr" : "config";
    const char *config = o.config;
    const long long world = o.world < 0 && lr ? 1 : o.world, sp = o.sp, steps = o.steps;
    const unsigned flags = o.flags;
    const int json = o.json;
    if (config == NULL || world < 1 || (lr && steps < 0)) {
        fprintf(stderr, "dsm-info %s: %s\n", what,
                config == NULL ? "a configuration file or inline JSON is required"
                : world < 1    ? "--world-size N (N >= 1) is required"
                               : "--steps N is required");
        return 2;
    }
    if (sp > 0 && world % sp != 0) {
        fprintf(stderr, "dsm-info config: --sequence-parallel-size %lld does not divide --world-size %lld\n", sp, world);
        return 2;
    }
    dsm_config_t cfg = NULL;
    char *text = NULL;
    dsm_status_t st = dsm_config_resolve(config, world, sp > 0 ? world / sp : 0, flags, &cfg);
    if (st == DSM_SUCCESS)
        st = lr ? dsm_config_describe_lr(cfg, steps, json ? DSM_FORMAT_JSON : DSM_FORMAT_TEXT, &text)
                : dsm_config_describe(cfg, json ? DSM_FORMAT_JSON : DSM_FORMAT_TEXT, &text);
    int rc = 0;
    if (st != DSM_SUCCESS) {
        fprintf(stderr, "dsm-info %s: %s\n", what, dsm_last_error());
        rc = 1;
    } else {
        fputs(text, stdout);
    }
    dsm_free(text);
    dsm_config_free(&cfg);
    return rc;
}

int main(int argc, char **argv) {
    /* A subcommand is the first argument; its options follow it. */
    const std::string sub = argc > 1 && (!strcmp(argv[1], "mesh") || !strcmp(argv[1], "config") ||
                                         !strcmp(argv[1], "lr"))
                                ? argv[1]
                                : "";
    const std::string prefix = sub.empty() ? "dsm-info" : "dsm-info " + sub;
    Options o;
    bool help = false, version = false, refused = false;
    auto refuse = [&](const std::string &message, bool shape) {
        fprintf(stderr, "%s: %s\n", prefix.c_str(), message.c_str());
        if (shape) usage(stderr);
        refused = true;
    };
    auto text = [](const char *name, char **dst) {
        return dsm::tools::CliOption{name, true, [dst](const char *v) {
                                         *dst = const_cast<char *>(v);
                                         return true;
                                     }};
    };
    auto count = [&](const char *name, long long *dst) {
        return dsm::tools::CliOption{name, true, [&refuse, name, dst](const char *v) {
                                         if (dsm::tools::parse_integer(v, 0, 1LL << 62, dst)) return true;
                                         refuse(std::string("--") + name + " '" + v + "' is not a non-negative integer",
                                                false);
                                         return false;
                                     }};
    };
    using dsm::tools::flag_option;
    std::vector<dsm::tools::CliOption> options = {
        flag_option("json", [&] { o.json = 1; }),
        dsm::tools::final_option("help", &help),
        dsm::tools::final_option("version", &version),
    };
    /* --env: only the parameters of the build description; no effect on a subcommand. */
    options.push_back(flag_option("env", [&] { o.env_only = 1; }));
    if (sub == "mesh") {
        for (auto &[name, dst] : std::vector<std::pair<const char *, char **>>{
                 {"shape", &o.shape}, {"names", &o.names}, {"slice", &o.slice}, {"flatten", &o.flatten},
                 {"placement", &o.placement}})
            options.push_back(text(name, dst));
    } else if (!sub.empty()) {
        options.push_back(count("world-size", &o.world));
        if (sub == "config") {
            options.push_back(count("sequence-parallel-size", &o.sp));
            options.push_back(flag_option("strict", [&] { o.flags |= DSM_CONFIG_STRICT; }));
        } else {
            options.push_back(count("steps", &o.steps));
        }
    }
    auto argument = [&](const char *arg) {
        if (sub == "config" || sub == "lr") {
            if (o.config == nullptr) {
                o.config = arg;
                return true;
            }
        }
        refuse(std::string("unexpected argument '") + arg + "'", true);
        return false;
    };
    const int skip = sub.empty() ? 0 : 1; /* argv[0] of the parse: the subcommand */
    dsm::tools::parse_command_line(argc - skip, argv + skip, options, argument, refuse);
    if (help) {
        usage(stdout);
        return 0;
    }
    if (version) {
        printf("dsm-info (libdsm) %s\n", DSM_VERSION_STRING);
        return 0;
    }
    if (refused) return 2;
    if (sub == "config" || sub == "lr") return config_main(sub == "lr", o);
    if (sub.empty()) return info_main(o.json, o.env_only);

    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SINGLE, &provided);
    int rc = mesh_main(o);
    MPI_Finalize();
    return rc;
}
