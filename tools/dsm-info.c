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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

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

static int mesh_main(int argc, char **argv, int json) {
    char *shape_arg = NULL, *names_arg = NULL, *slice_arg = NULL, *flatten_arg = NULL, *placement_arg = NULL;
    for (int i = 0; i < argc; ++i) {
        const char *a = argv[i];
        char **dst = strcmp(a, "--shape") == 0 ? &shape_arg
                   : strcmp(a, "--names") == 0 ? &names_arg
                   : strcmp(a, "--slice") == 0 ? &slice_arg
                   : strcmp(a, "--flatten") == 0 ? &flatten_arg
                   : strcmp(a, "--placement") == 0 ? &placement_arg : NULL;
        if (dst == NULL || i + 1 >= argc) {
            fprintf(stderr, "dsm-info mesh: %s \"%s\"\n", dst == NULL ? "unknown argument" : "missing value after", a);
            return 2;
        }
        *dst = argv[++i];
    }
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
        char *end = NULL;
        long v = strtol(items[d], &end, 10);
        if (*items[d] == '\0' || *end != '\0' || v < -1 || v > 1 << 30) {
            fprintf(stderr, "dsm-info mesh: --shape: \"%s\" is not a size\n", items[d]);
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
            fprintf(stderr, "dsm-info mesh: --placement \"%s\": expected node or none\n", placement_arg);
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

/* Parse a non-negative integer option value; -1 on error. */
static long long parse_count(const char *opt, const char *v) {
    char *end = NULL;
    long long n = strtoll(v, &end, 10);
    if (*v == '\0' || *end != '\0' || n < 0) {
        fprintf(stderr, "dsm-info: %s \"%s\" is not a non-negative integer\n", opt, v);
        return -1;
    }
    return n;
}

/* dsm-info config|lr CONFIG [options]: resolved without running a job. */
static int config_main(int lr, int argc, char **argv, int json) {
    const char *what = lr ? "lr" : "config";
    const char *config = NULL;
    long long world = lr ? 1 : -1, sp = 0, steps = -1;
    unsigned flags = 0;
    for (int i = 0; i < argc; ++i) {
        const char *a = argv[i];
        long long *dst = strcmp(a, "--world-size") == 0 ? &world
                       : strcmp(a, "--sequence-parallel-size") == 0 && !lr ? &sp
                       : strcmp(a, "--steps") == 0 && lr ? &steps : NULL;
        if (dst != NULL) {
            if (i + 1 >= argc) {
                fprintf(stderr, "dsm-info %s: missing value after %s\n", what, a);
                return 2;
            }
            if ((*dst = parse_count(a, argv[++i])) < 0) return 2;
        } else if (strcmp(a, "--strict") == 0 && !lr) {
            flags |= DSM_CONFIG_STRICT;
        } else if (config == NULL && strncmp(a, "--", 2) != 0) {
            config = a;
        } else {
            fprintf(stderr, "dsm-info %s: unknown argument \"%s\"\n", what, a);
            return 2;
        }
    }
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
    int json = 0, env_only = 0, mesh = 0, config = 0, lr = 0;
    char *rest[64];
    int nrest = 0;
    for (int i = 1; i < argc; ++i) {
        if (strcmp(argv[i], "--json") == 0) json = 1;
        else if (strcmp(argv[i], "--env") == 0) env_only = 1;
        else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(argv[i], "--version") == 0) {
            printf("dsm-info (libdsm) %s\n", DSM_VERSION_STRING);
            return 0;
        } else if (i == 1 && strcmp(argv[i], "mesh") == 0) mesh = 1;
        else if (i == 1 && strcmp(argv[i], "config") == 0) config = 1;
        else if (i == 1 && strcmp(argv[i], "lr") == 0) lr = 1;
        else if ((mesh || config || lr) && nrest < 64) rest[nrest++] = argv[i];
        else {
            fprintf(stderr, "dsm-info: unknown argument \"%s\"\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (config || lr) return config_main(lr, nrest, rest, json);
    if (!mesh) return info_main(json, env_only);

    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SINGLE, &provided);
    int rc = mesh_main(nrest, rest, json);
    MPI_Finalize();
    return rc;
}
