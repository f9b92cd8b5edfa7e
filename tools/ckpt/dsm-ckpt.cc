// dsm-ckpt: inspect, verify, export, compare and clean libdsm checkpoints.
//
//   dsm-ckpt info PATH [--tag TAG] [--json]
//   dsm-ckpt verify PATH [--tag TAG] [--fail-nonfinite] [--json]
//   dsm-ckpt export PATH [--tag TAG] --output OUT.h5|OUT.safetensors [--json]
//   dsm-ckpt diff A B [--tag-a TAG] [--tag-b TAG] [--atol X] [--rtol X] [--json]
//   dsm-ckpt clean DIR [--dry-run] [--json]
//
// PATH is a checkpoint directory (DIR/<tag>.h5 and DIR/latest) or one
// checkpoint file. The tool reads the files with serial HDF5 and needs no MPI
// launcher; doc/checkpoint.md specifies the files, doc/dsm-ckpt.md the output.
//
// Exit status: 0 success (diff: equal), 1 failure (verify: a problem found;
// diff: different; any command: an unreadable or invalid file), 2 usage error.
// Text output escapes the control characters of anything read from a file
// (printable()); JSON output is ASCII, with \u escapes.
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <hdf5.h>

#include "ckpt_read.hpp"
#include "core/half.hpp"
#include "dsm_version.h"
#include "safetensors.hpp"

namespace dsm {
namespace ckpt_tool {

namespace {

// ---------------------------------------------------------------- usage

const char *const kUsage =
    "usage: dsm-ckpt info PATH [--tag TAG] [--json]\n"
    "       dsm-ckpt verify PATH [--tag TAG] [--fail-nonfinite] [--json]\n"
    "       dsm-ckpt export PATH [--tag TAG] --output OUT.h5|OUT.safetensors [--dtype fp32|bf16|fp16] [--json]\n"
    "       dsm-ckpt diff A B [--tag-a TAG] [--tag-b TAG] [--atol X] [--rtol X] [--json]\n"
    "       dsm-ckpt clean DIR [--dry-run] [--json]\n"
    "       dsm-ckpt --help | --version\n";

const char *const kInfoHelp =
    "usage: dsm-ckpt info PATH [--tag TAG] [--json]\n"
    "  Describe a checkpoint: its training state (steps, samples, loss scale, learning-rate\n"
    "  schedule step), the setup that wrote it (ZeRO stage, group sizes, mesh, dtype,\n"
    "  optimizer, libdsm version) and every tensor with its shape, elements and bytes.\n"
    "  PATH is a checkpoint directory (its tags are listed; the one `latest` names is\n"
    "  described, or --tag TAG) or one checkpoint .h5 file.\n"
    "  --tag TAG   the tag to describe in a directory\n"
    "  --json      one JSON document (format in doc/dsm-ckpt.md)\n";

const char *const kVerifyHelp =
    "usage: dsm-ckpt verify PATH [--tag TAG] [--fail-nonfinite] [--json]\n"
    "  Recompute the checksum of every tensor and of the client state, and check the\n"
    "  file's structure against the checkpoint format. Prints every problem by dataset\n"
    "  path; exit status 1 when there is one, 0 when the checkpoint is intact.\n"
    "  Tensors holding NaN or infinite values are reported as warnings (how many, the\n"
    "  index of the first); they do not fail the verification unless --fail-nonfinite.\n"
    "  --tag TAG          the tag to verify in a directory (default: the one `latest` names)\n"
    "  --fail-nonfinite   a tensor with NaN or infinite values is a problem (exit status 1)\n"
    "  --json             one JSON document (format in doc/dsm-ckpt.md)\n";

const char *const kExportHelp =
    "usage: dsm-ckpt export PATH [--tag TAG] --output OUT [--dtype fp32|bf16|fp16] [--json]\n"
    "  Write the parameters (the /params tensors, under their original names) to\n"
    "  OUT: a plain HDF5 file when OUT ends in .h5 (one dataset per parameter at the\n"
    "  root, the checkpoint's escaped link names, attribute `name`), a safetensors file\n"
    "  when it ends in .safetensors. Checksums are verified while reading; on any\n"
    "  mismatch nothing is written and the exit status is 1.\n"
    "  --output OUT   the file to write (replaced if it exists)\n"
    "  --dtype DTYPE  fp32 (default: the checkpoint's values as they are), bf16 or fp16\n"
    "                 (rounded to nearest even; NaN and infinities kept). A finite value\n"
    "                 that does not fit (beyond 65504 in fp16) is an error naming the\n"
    "                 tensor, index and value; nothing is written\n"
    "  --tag TAG      the tag to export in a directory (default: the one `latest` names)\n"
    "  --json         a JSON summary on standard output (format in doc/dsm-ckpt.md)\n";

const char *const kDiffHelp =
    "usage: dsm-ckpt diff A B [--tag-a TAG] [--tag-b TAG] [--atol X] [--rtol X] [--json]\n"
    "  Compare two checkpoints tensor by tensor (parameters and optimizer states):\n"
    "  tensors only in one, shape differences, and for equal shapes the largest absolute\n"
    "  and relative difference; also the training-state attributes. Elements a, b are\n"
    "  equal when bitwise equal or |a - b| <= atol + rtol * max(|a|, |b|).\n"
    "  Exit status 0 when equal, 1 when different (or on an error), 2 on a usage error.\n"
    "  --tag-a TAG, --tag-b TAG  the tag of A, of B when it is a directory\n"
    "  --atol X, --rtol X        tolerances, default 0 (exact)\n"
    "  --json                    one JSON document (format in doc/dsm-ckpt.md)\n";

const char *const kCleanHelp =
    "usage: dsm-ckpt clean DIR [--dry-run] [--json]\n"
    "  Remove the leftovers of interrupted saves from a checkpoint directory: the\n"
    "  temporary files DIR/.<tag>.h5.tmp (a checkpoint being written),\n"
    "  DIR/.<tag>.h5.reserve (room kept for its metadata), DIR/.latest.tmp (`latest`\n"
    "  being replaced) and DIR/.dsm-dircheck-<hex> (the shared-directory check) that a\n"
    "  save killed before its commit leaves behind. Nothing else is ever removed: not\n"
    "  a checkpoint, not `latest`,\n"
    "  not another file, not a link or directory with such a name (listed as kept).\n"
    "  Do not run it while a job is saving into DIR: its temporary file would go.\n"
    "  --dry-run   list what would be removed, remove nothing\n"
    "  --json      one JSON document (format in doc/dsm-ckpt.md)\n";

// ---------------------------------------------------------------- arguments

struct Args {
    std::vector<std::string> positional;
    std::map<std::string, std::string> values; // options that take a value
    std::set<std::string> flags;                // options without one that were given
    bool json = false;
};

// Parses the arguments after the subcommand. Options may come anywhere, as
// "--opt VALUE" or "--opt=VALUE"; "--" ends them (for a PATH starting with -).
// Returns 0, 2 after printing a usage error, or -1 after printing --help.
int parse_args(const std::string &cmd, int argc, char **argv, const std::set<std::string> &value_options,
               size_t positional, const char *help, Args &out, const std::set<std::string> &flag_options = {}) {
    bool options = true;
    for (int i = 0; i < argc; ++i) {
        const std::string a = argv[i];
        if (!options || a.size() < 2 || a[0] != '-') {
            if (out.positional.size() == positional) {
                std::fprintf(stderr, "dsm-ckpt %s: unexpected argument '%s' (see dsm-ckpt %s --help)\n", cmd.c_str(),
                             a.c_str(), cmd.c_str());
                return 2;
            }
            out.positional.push_back(a);
        } else if (a == "--") {
            options = false;
        } else if (a == "--help" || a == "-h") {
            std::fputs(help, stdout);
            return -1;
        } else if (a == "--json") {
            out.json = true;
        } else if (flag_options.count(a)) {
            out.flags.insert(a);
        } else {
            const size_t eq = a.find('=');
            const std::string name = a.substr(0, eq);
            if (!value_options.count(name) || flag_options.count(name)) {
                std::fprintf(stderr, "dsm-ckpt %s: unknown option '%s' (see dsm-ckpt %s --help)\n", cmd.c_str(),
                             name.c_str(), cmd.c_str());
                return 2;
            }
            if (eq != std::string::npos) {
                out.values[name] = a.substr(eq + 1);
            } else if (i + 1 < argc) {
                out.values[name] = argv[++i];
            } else {
                std::fprintf(stderr, "dsm-ckpt %s: %s needs a value\n", cmd.c_str(), name.c_str());
                return 2;
            }
        }
    }
    if (out.positional.size() < positional) {
        std::fprintf(stderr, "dsm-ckpt %s: %s\n", cmd.c_str(),
                     positional == 1 ? "missing PATH (a checkpoint directory or .h5 file)"
                     : out.positional.empty() ? "missing checkpoints A and B"
                                              : "missing checkpoint B");
        return 2;
    }
    return 0;
}

std::optional<std::string> value(const Args &a, const std::string &name) {
    const auto it = a.values.find(name);
    if (it == a.values.end()) return std::nullopt;
    return it->second;
}

// A tolerance: a finite number >= 0.
bool parse_tolerance(const std::string &cmd, const std::string &opt, const std::string &v, double &out) {
    char *end = nullptr;
    errno = 0;
    const double x = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0' || errno != 0 || !std::isfinite(x) || x < 0) {
        std::fprintf(stderr, "dsm-ckpt %s: %s '%s' is not a number >= 0\n", cmd.c_str(), opt.c_str(), v.c_str());
        return false;
    }
    out = x;
    return true;
}

// A damaged file can hold names that are not UTF-8, which JSON cannot carry:
// they are printed with U+FFFD in place of the bad bytes rather than failing.
void print_json(const Json &doc) {
    std::printf("%s\n", doc.dump(2, ' ', true, Json::error_handler_t::replace).c_str());
}

// ---------------------------------------------------------------- shared pieces

// An opened checkpoint with where it came from; throws Error / UsageError.
struct Opened {
    Location loc;
    Checkpoint ck;
};

Opened open_checkpoint(const std::string &path, const std::optional<std::string> &tag) {
    Location loc = locate(path, tag);
    Checkpoint ck(loc.file);
    ck.require_format();
    return Opened{std::move(loc), std::move(ck)};
}

Json issues_json(const std::vector<Issue> &issues) {
    Json a = Json::array();
    for (const Issue &i : issues) a.push_back({{"path", i.path}, {"message", i.message}});
    return a;
}

Json shape_json(const std::vector<uint64_t> &shape) {
    Json a = Json::array();
    for (uint64_t d : shape) a.push_back(d);
    return a;
}

Json directory_json(const Location &loc) {
    if (!loc.directory) return nullptr;
    return Json{{"path", loc.dir},
                {"tags", loc.tags},
                {"latest", loc.latest ? Json(*loc.latest) : Json(nullptr)},
                {"latest_problem", loc.latest_problem.empty() ? Json(nullptr) : Json(loc.latest_problem)},
                {"temporary_files", loc.temporary}};
}

std::optional<std::string> leftover_tag(const std::string &name); // see clean

std::string attr_text(const Checkpoint &ck, const char *name) {
    const Attribute *a = ck.attribute(name);
    return a != nullptr ? a->text() : "-";
}

// The same without the quotes around a string, for running text.
std::string attr_plain(const Checkpoint &ck, const char *name) {
    const Attribute *a = ck.attribute(name);
    return a != nullptr && a->kind == Attribute::Kind::String ? a->s : attr_text(ck, name);
}

std::string plural(uint64_t n, const char *one, const char *many) {
    return std::to_string(n) + " " + (n == 1 ? one : many);
}

// The root attributes describing where training stands (doc/checkpoint.md),
// listed first by info.
const std::vector<std::string> &training_state_attributes() {
    static const std::vector<std::string> names = {
        "global_steps",        "micro_steps",           "skipped_steps",
        "global_samples",      "optimizer_steps",       "loss_scale",
        "loss_scale_cur_iter", "loss_scale_last_overflow_iter", "loss_scale_cur_hysteresis",
        "lr_schedule_last_step"};
    return names;
}

// Setup attributes that differ between two saves of one training run without
// the model state differing: resharding (ZeRO stage, group sizes, mesh), the
// name it was saved under, the library that wrote it. diff reports them and
// does not count them.
bool provenance_attribute(const std::string &name) {
    static const std::set<std::string> names = {"tag",
                                                "libdsm_version",
                                                "zero_stage",
                                                "data_parallel_size",
                                                "sequence_parallel_size",
                                                "mesh_shape",
                                                "mesh_names",
                                                "config"};
    return names.count(name) != 0;
}

// ---------------------------------------------------------------- info

// An attribute's value for JSON output. The configuration is JSON text: it is
// given as the object it holds (as its text when that is not valid JSON).
Json attribute_json(const Attribute &a) {
    if (a.name == "config" && a.kind == Attribute::Kind::String && Json::accept(a.s)) return Json::parse(a.s);
    return a.json();
}

Json info_json(const Opened &o) {
    const Checkpoint &ck = o.ck;
    Json attrs = Json::object();
    for (const Attribute &a : ck.attributes()) attrs[a.name] = attribute_json(a);
    Json tensors = Json::array();
    struct Total {
        uint64_t count = 0, elements = 0, bytes = 0;
        Json json() const { return Json{{"count", count}, {"elements", elements}, {"bytes", bytes}}; }
    } params, optimizer;
    for (const Tensor &t : ck.tensors()) {
        tensors.push_back({{"path", t.path},
                           {"kind", t.param() ? "param" : "optimizer_state"},
                           {"state", t.param() ? Json(nullptr) : Json(t.state)},
                           {"name", t.name ? Json(*t.name) : Json(nullptr)},
                           {"trainable", t.trainable ? Json(*t.trainable == 1) : Json(nullptr)},
                           {"dtype", t.dtype},
                           {"shape", shape_json(t.shape)},
                           {"elements", t.elements},
                           {"bytes", t.float32 ? Json(t.bytes()) : Json(nullptr)}});
        Total &tot = t.param() ? params : optimizer;
        ++tot.count;
        tot.elements += t.elements;
        tot.bytes += t.float32 ? t.bytes() : 0;
    }
    const ClientState &cs = ck.client_state();
    return Json{{"format", "dsm-ckpt-info"},
                {"format_version", 1},
                {"path", o.loc.directory ? o.loc.dir : o.loc.file},
                {"file", ck.file()},
                {"tag", o.loc.directory ? Json(o.loc.tag) : Json(nullptr)},
                {"directory", directory_json(o.loc)},
                {"attributes", attrs},
                {"tensors", tensors},
                {"totals", {{"params", params.json()}, {"optimizer_states", optimizer.json()}}},
                {"client_state", cs.present ? Json{{"bytes", cs.bytes}} : Json(nullptr)},
                {"problems", issues_json(ck.problems())},
                {"warnings", issues_json(ck.warnings())}};
}

void info_text(const Opened &o) {
    const Checkpoint &ck = o.ck;
    const Location &loc = o.loc;
    std::printf("checkpoint %s\n", printable(ck.file()).c_str());
    if (loc.directory) {
        std::string tags;
        for (const std::string &t : loc.tags) tags += (tags.empty() ? "" : ", ") + t;
        std::printf("directory  %s: %s %s; latest %s\n", printable(loc.dir).c_str(), loc.tags.size() == 1 ? "tag" : "tags",
                    printable(tags).c_str(), loc.latest ? printable(*loc.latest).c_str() : "(none)");
        if (!loc.latest_problem.empty()) std::printf("           %s\n", printable(loc.latest_problem).c_str());
        for (const std::string &t : loc.temporary)
            std::printf("           leftover temporary file %s (%s)\n", printable(t).c_str(),
                        leftover_tag(t) ? "an interrupted save; dsm-ckpt clean removes it"
                                                   : "not left by a save; dsm-ckpt clean keeps it");
    }
    std::printf("format     %s %s, written by libdsm %s, tag %s\n", printable(attr_plain(ck, "format")).c_str(),
                printable(attr_plain(ck, "format_version")).c_str(),
                printable(attr_plain(ck, "libdsm_version")).c_str(),
                printable(attr_plain(ck, "tag")).c_str());

    std::printf("\ntraining state\n");
    for (const std::string &name : training_state_attributes())
        std::printf("  %-31s %s\n", name.c_str(), printable(attr_text(ck, name.c_str())).c_str());
    std::printf("setup\n");
    for (const char *name : {"zero_stage", "data_parallel_size", "sequence_parallel_size", "mesh_shape", "mesh_names",
                             "compute_dtype", "optimizer"})
        std::printf("  %-31s %s\n", name, printable(attr_text(ck, name)).c_str());
    if (const Attribute *c = ck.attribute("config"))
        std::printf("  %-31s %s\n", "config",
                    c->kind == Attribute::Kind::String ? (std::to_string(c->s.size()) + " bytes of JSON (--json shows it)").c_str()
                                                       : printable(c->text()).c_str());
    // Attributes the format does not name: shown, since a newer writer may add some.
    static const std::set<std::string> known = {"format", "format_version", "libdsm_version", "tag", "zero_stage",
                                                "data_parallel_size", "sequence_parallel_size", "mesh_shape",
                                                "mesh_names", "compute_dtype", "optimizer", "config"};
    bool header = false;
    for (const Attribute &a : ck.attributes()) {
        const auto &ts = training_state_attributes();
        if (known.count(a.name) || std::find(ts.begin(), ts.end(), a.name) != ts.end()) continue;
        if (!header) std::printf("other attributes\n");
        header = true;
        std::printf("  %-31s %s\n", printable(a.name).c_str(), printable(a.text()).c_str());
    }

    uint64_t nparams = 0, ntrainable = 0, nstates = 0, elements = 0, bytes = 0;
    size_t width = 7;
    std::set<std::string> states;
    for (const Tensor &t : ck.tensors()) {
        (t.param() ? nparams : nstates) += 1;
        if (t.param() && t.trainable && *t.trainable == 1) ++ntrainable;
        if (!t.param()) states.insert(t.state);
        elements += t.elements;
        bytes += t.float32 ? t.bytes() : 0;
        width = std::max(width, printable(t.path).size());
    }
    std::string state_list;
    for (const std::string &s : states) state_list += (state_list.empty() ? "" : ", ") + s;
    std::printf("\ntensors: %s (%llu trainable), %s%s%s%s; %s, %s\n", plural(nparams, "parameter", "parameters").c_str(),
                static_cast<unsigned long long>(ntrainable),
                plural(nstates, "optimizer state tensor", "optimizer state tensors").c_str(),
                states.empty() ? "" : " (", printable(state_list).c_str(), states.empty() ? "" : ")",
                plural(elements, "element", "elements").c_str(), plural(bytes, "byte", "bytes").c_str());
    std::printf("  %-*s  %-16s %12s %14s  %s\n", static_cast<int>(width), "dataset", "shape", "elements", "bytes",
                "trainable");
    for (const Tensor &t : ck.tensors()) {
        std::string note;
        if (t.name && *t.name != t.link) note = "  name \"" + *t.name + "\"";
        if (!t.float32) note += "  (" + t.unreadable + ")";
        std::printf("  %-*s  %-16s %12llu %14llu  %s%s\n", static_cast<int>(width), printable(t.path).c_str(),
                    shape_text(t.shape).c_str(), static_cast<unsigned long long>(t.elements),
                    static_cast<unsigned long long>(t.float32 ? t.bytes() : 0),
                    !t.trainable ? "-" : *t.trainable ? "yes" : "no", printable(note).c_str());
    }
    const ClientState &cs = ck.client_state();
    if (cs.present) std::printf("client_state: %s\n", plural(cs.bytes, "byte", "bytes").c_str());
    else std::printf("client_state: none\n");
    if (!ck.problems().empty())
        std::printf("\n%s in the file's structure (dsm-ckpt verify lists them)\n",
                    plural(ck.problems().size(), "problem", "problems").c_str());
}

int cmd_info(int argc, char **argv) {
    Args a;
    if (int rc = parse_args("info", argc, argv, {"--tag"}, 1, kInfoHelp, a)) return rc < 0 ? 0 : rc;
    const Opened o = open_checkpoint(a.positional[0], value(a, "--tag"));
    if (a.json) print_json(info_json(o));
    else info_text(o);
    return 0;
}

// ---------------------------------------------------------------- verify

struct Verified {
    std::string path;
    std::optional<uint64_t> stored, computed;
    bool ok = false;
    Checkpoint::NonFinite nonfinite; // tensors: NaN and infinite elements
};

int cmd_verify(int argc, char **argv) {
    Args a;
    if (int rc = parse_args("verify", argc, argv, {"--tag"}, 1, kVerifyHelp, a, {"--fail-nonfinite"}))
        return rc < 0 ? 0 : rc;
    const bool fail_nonfinite = a.flags.count("--fail-nonfinite") != 0;
    const Opened o = open_checkpoint(a.positional[0], value(a, "--tag"));
    const Checkpoint &ck = o.ck;
    std::vector<Issue> problems = ck.problems();
    std::vector<Issue> warnings = ck.warnings();
    std::vector<Verified> results;
    size_t nonfinite_tensors = 0;
    auto check = [&](const std::string &path, const std::optional<uint64_t> &stored, auto compute) {
        Verified v;
        v.path = path;
        v.stored = stored;
        try {
            v.computed = compute(v.nonfinite);
        } catch (const Error &e) {
            // The message names the file and the dataset; the report names them already.
            std::string msg = e.what();
            const std::string prefix = ck.file() + ": " + path + ": ";
            if (msg.compare(0, prefix.size(), prefix) == 0) msg.erase(0, prefix.size());
            problems.push_back({path, msg});
        }
        v.ok = v.stored && v.computed && *v.stored == *v.computed;
        if (v.stored && v.computed && !v.ok)
            problems.push_back({path, "checksum mismatch: stored " + hex64(*v.stored) + ", computed " +
                                          hex64(*v.computed)});
        if (v.nonfinite.count() > 0) {
            const Checkpoint::NonFinite &nf = v.nonfinite;
            ++nonfinite_tensors;
            (fail_nonfinite ? problems : warnings)
                .push_back({path, plural(nf.count(), "non-finite value", "non-finite values") + " (" +
                                      std::to_string(nf.nan) + " NaN, " + std::to_string(nf.inf) +
                                      " infinite), the first at index " + std::to_string(nf.first)});
        }
        results.push_back(v);
    };
    for (const Tensor &t : ck.tensors())
        if (t.float32)
            check(t.path, t.checksum, [&](Checkpoint::NonFinite &nf) { return ck.compute_checksum(t, nf); });
    const ClientState &cs = ck.client_state();
    if (cs.present && cs.readable)
        check("/client_state", cs.checksum, [&](Checkpoint::NonFinite &) { return ck.compute_client_checksum(); });
    // In the order found: the structure's problems, then the data's.
    const bool ok = problems.empty();
    size_t verified = 0;
    for (const Verified &v : results) verified += v.ok;

    if (a.json) {
        Json checked = Json::array();
        for (const Verified &v : results)
            checked.push_back({{"path", v.path},
                               {"stored", v.stored ? Json(hex64(*v.stored)) : Json(nullptr)},
                               {"computed", v.computed ? Json(hex64(*v.computed)) : Json(nullptr)},
                               {"ok", v.ok},
                               {"nonfinite", v.nonfinite.count()},
                               {"nan", v.nonfinite.nan},
                               {"inf", v.nonfinite.inf},
                               {"first_nonfinite", v.nonfinite.count() ? Json(v.nonfinite.first) : Json(nullptr)}});
        print_json(Json{{"format", "dsm-ckpt-verify"},
                        {"format_version", 1},
                        {"path", o.loc.directory ? o.loc.dir : o.loc.file},
                        {"file", ck.file()},
                        {"tag", o.loc.directory ? Json(o.loc.tag) : Json(nullptr)},
                        {"ok", ok},
                        {"fail_nonfinite", fail_nonfinite},
                        {"nonfinite_tensors", nonfinite_tensors},
                        {"checked", checked},
                        {"problems", issues_json(problems)},
                        {"warnings", issues_json(warnings)}});
    } else {
        for (const Issue &i : problems) std::printf("%s: %s\n", printable(i.path).c_str(), printable(i.message).c_str());
        for (const Issue &i : warnings) std::printf("warning: %s: %s\n", printable(i.path).c_str(), printable(i.message).c_str());
        if (ok)
            std::printf("OK: %s: %s verified%s\n", printable(ck.file()).c_str(),
                        plural(verified, "checksum", "checksums").c_str(),
                        nonfinite_tensors == 0 ? ""
                                               : ("; " + plural(nonfinite_tensors, "tensor holds", "tensors hold") +
                                                  " NaN or infinite values (--fail-nonfinite fails on them)")
                                                     .c_str());
        else
            std::printf("FAILED: %s: %s (%zu of %s verified)\n", printable(ck.file()).c_str(),
                        plural(problems.size(), "problem", "problems").c_str(), verified,
                        plural(results.size(), "checksum", "checksums").c_str());
    }
    if (!ok) {
        std::fflush(stdout);
        std::fprintf(stderr, "dsm-ckpt verify: %s: %s, the first: %s: %s\n", printable(ck.file()).c_str(),
                     plural(problems.size(), "problem", "problems").c_str(), printable(problems[0].path).c_str(),
                     printable(problems[0].message).c_str());
    }
    return ok ? 0 : 1;
}

// ---------------------------------------------------------------- export

// An output written under a temporary name beside OUT and renamed over it only
// when complete, so that OUT is never a partial file and a failed export
// leaves an existing OUT untouched.
class TempOutput {
public:
    explicit TempOutput(const std::string &out) : out_(out) {
        const size_t slash = out.find_last_of('/');
        const std::string dir = slash == std::string::npos ? "" : out.substr(0, slash + 1);
        const std::string base = slash == std::string::npos ? out : out.substr(slash + 1);
        tmp_ = dir + "." + base + ".tmp" + std::to_string(static_cast<long>(getpid()));
    }
    TempOutput(const TempOutput &) = delete;
    TempOutput &operator=(const TempOutput &) = delete;
    ~TempOutput() {
        if (!committed_) std::remove(tmp_.c_str());
    }
    const std::string &path() const { return tmp_; }
    void commit() {
        if (std::rename(tmp_.c_str(), out_.c_str()) != 0)
            throw Error(out_ + ": cannot rename " + tmp_ + " to it: " + std::strerror(errno));
        committed_ = true;
    }

private:
    std::string out_, tmp_;
    bool committed_ = false;
};

// The consolidated weights as a plain HDF5 file: one F32LE dataset per
// parameter at the root, under the checkpoint's link name, with attribute
// `name`; the root holds the tag and step for provenance.
class H5Output {
public:
    // Created at `path` (a temporary name); messages name `shown`.
    // Datasets of `type` (H5T_IEEE_F32LE, or a 16-bit float type).
    H5Output(const std::string &path, const std::string &shown, hid_t type) : path_(shown), type_(type) {
        hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
        if (f < 0) throw Error(shown + ": cannot create: " + hdf5_message());
        file_ = Handle(f, H5Fclose);
    }

    void string_attribute(hid_t obj, const char *name, const std::string &v) {
        Handle type(H5Tcopy(H5T_C_S1), H5Tclose), space(H5Screate(H5S_SCALAR), H5Sclose);
        if (!type.valid() || H5Tset_size(type.get(), H5T_VARIABLE) < 0 ||
            H5Tset_cset(type.get(), H5T_CSET_UTF8) < 0 || !space.valid())
            fail("attribute " + std::string(name));
        Handle attr(H5Acreate2(obj, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
        const char *p = v.c_str();
        if (!attr.valid() || H5Awrite(attr.get(), type.get(), &p) < 0) fail("attribute " + std::string(name));
    }

    void int_attribute(hid_t obj, const char *name, int64_t v) {
        Handle space(H5Screate(H5S_SCALAR), H5Sclose);
        Handle attr(H5Acreate2(obj, name, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
        if (!attr.valid() || H5Awrite(attr.get(), H5T_NATIVE_INT64, &v) < 0) fail("attribute " + std::string(name));
    }

    hid_t root() const { return file_.get(); }

    void begin(const std::string &link, const std::string &name, const std::vector<uint64_t> &shape) {
        const std::vector<hsize_t> dims(shape.begin(), shape.end());
        Handle space(shape.empty() ? H5Screate(H5S_SCALAR)
                                   : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                     H5Sclose);
        if (!space.valid()) fail(link);
        hid_t ds = H5Dcreate2(file_.get(), link.c_str(), type_, space.get(), H5P_DEFAULT, H5P_DEFAULT,
                              H5P_DEFAULT);
        if (ds < 0) fail(link);
        ds_ = Handle(ds, H5Dclose);
        shape_ = shape;
        link_ = link;
        string_attribute(ds, "name", name);
    }

    // The elements of block b, `data` in memory type `mem` (b.data itself, or
    // its conversion).
    void write(const Block &b, hid_t mem, const void *data) {
        if (shape_.empty()) {
            if (H5Dwrite(ds_.get(), mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0) fail(link_);
            return;
        }
        Handle fspace(H5Dget_space(ds_.get()), H5Sclose);
        std::vector<hsize_t> start(shape_.size(), 0), count(shape_.begin(), shape_.end());
        start[0] = b.row0;
        count[0] = b.rows;
        const hsize_t n = b.n;
        Handle mspace(H5Screate_simple(1, &n, nullptr), H5Sclose);
        if (!fspace.valid() || !mspace.valid() ||
            H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr) < 0 ||
            H5Dwrite(ds_.get(), mem, mspace.get(), fspace.get(), H5P_DEFAULT, data) < 0)
            fail(link_);
    }

    void end() { ds_.reset(); }

    void close() {
        ds_.reset();
        if (H5Fflush(file_.get(), H5F_SCOPE_GLOBAL) < 0) fail("flush");
        if (H5Fclose(file_.release()) < 0) throw Error(path_ + ": cannot close: " + hdf5_message());
    }

private:
    [[noreturn]] void fail(const std::string &what) {
        throw Error(path_ + ": " + what + ": cannot write: " + hdf5_message());
    }
    std::string path_, link_;
    hid_t type_;
    Handle file_, ds_;
    std::vector<uint64_t> shape_;
};

enum class OutKind { Hdf5, Safetensors };

bool ends_with(const std::string &s, const std::string &suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The /params tensors, each with what export needs; throws Error naming the
// first that lacks it, since an unverifiable tensor must not be exported.
std::vector<const Tensor *> exportable_params(const Checkpoint &ck) {
    std::vector<const Tensor *> out;
    for (const Tensor &t : ck.tensors()) {
        if (!t.param()) continue;
        const std::string why = !t.float32    ? t.unreadable
                                : !t.name     ? "has no string attribute 'name'"
                                : !t.checksum ? "has no uint64 attribute 'checksum'"
                                              : "";
        if (!why.empty()) throw Error(ck.file() + ": " + t.path + ": " + why + "; nothing exported");
        out.push_back(&t);
    }
    if (out.empty()) throw Error(ck.file() + ": no parameters under /params; nothing exported");
    return out;
}

// The element type of an export (--dtype).
struct ExportDtype {
    const char *option;      // "fp32", "bf16", "fp16"
    const char *safetensors; // the header's dtype
    unsigned bytes;          // per element
    uint16_t (*convert)(float); // core/half.hpp's rounding; nullptr for fp32
    uint16_t inf;            // the bits of +infinity
    const char *largest;     // the largest finite value, for messages
};

const ExportDtype kExportDtypes[] = {
    {"fp32", "F32", 4, nullptr, 0, ""},
    {"bf16", "BF16", 2, [](float x) { return fp32_to_bf16(x); }, 0x7f80u, "3.3895314e38"},
    {"fp16", "F16", 2, [](float x) { return fp32_to_fp16(x); }, 0x7c00u, "65504"},
};

// The HDF5 file type of a 16-bit export: IEEE binary16, or bfloat16 (binary32
// with the low 16 mantissa bits dropped), both little-endian.
Handle h5_half_type(const ExportDtype &d) {
    Handle t(H5Tcopy(H5T_IEEE_F32LE), H5Tclose);
    const bool bf16 = std::strcmp(d.option, "bf16") == 0;
    if (!t.valid() || H5Tset_fields(t.get(), 15, bf16 ? 7 : 10, bf16 ? 8 : 5, 0, bf16 ? 7 : 10) < 0 ||
        H5Tset_precision(t.get(), 16) < 0 || H5Tset_size(t.get(), 2) < 0 ||
        H5Tset_ebias(t.get(), bf16 ? 127 : 15) < 0)
        throw Error(std::string("cannot make the HDF5 ") + d.option + " type: " + hdf5_message());
    return t;
}

// A block of fp32 values converted to a 16-bit dtype into out. A finite value
// that becomes infinite (beyond the range of fp16, or bfloat16's largest
// value) is an error naming the tensor, the row-major index and the value:
// saturating would change the model silently, and Inf would poison it.
void convert_block(const ExportDtype &d, const std::string &file, const Tensor &t, const Block &b,
                   std::vector<uint16_t> &out) {
    out.resize(b.n);
    for (size_t i = 0; i < b.n; ++i) {
        out[i] = d.convert(b.data[i]);
        if ((out[i] & 0x7fffu) != d.inf || !std::isfinite(b.data[i])) continue;
        char value[32];
        std::snprintf(value, sizeof value, "%.9g", static_cast<double>(b.data[i])); // every float, exactly
        throw Error(file + ": " + t.path + ": the value " + value + " at index " + std::to_string(b.offset + i) +
                    " is beyond the " + d.option + " range (largest " + d.largest + "); nothing exported");
    }
}

int cmd_export(int argc, char **argv) {
    Args a;
    if (int rc = parse_args("export", argc, argv, {"--tag", "--output", "--dtype"}, 1, kExportHelp, a))
        return rc < 0 ? 0 : rc;
    const ExportDtype *dtype = &kExportDtypes[0];
    if (const std::optional<std::string> d = value(a, "--dtype")) {
        dtype = nullptr;
        for (const ExportDtype &e : kExportDtypes)
            if (*d == e.option) dtype = &e;
        if (dtype == nullptr) {
            std::fprintf(stderr, "dsm-ckpt export: --dtype '%s' is not fp32, bf16 or fp16\n", printable(*d).c_str());
            return 2;
        }
    }
    const bool half = dtype->convert != nullptr;
    const std::optional<std::string> out = value(a, "--output");
    if (!out || out->empty()) {
        std::fprintf(stderr, "dsm-ckpt export: --output OUT is required\n");
        return 2;
    }
    OutKind kind;
    if (ends_with(*out, ".h5") && out->size() > 3) kind = OutKind::Hdf5;
    else if (ends_with(*out, ".safetensors") && out->size() > 12) kind = OutKind::Safetensors;
    else {
        std::fprintf(stderr, "dsm-ckpt export: --output '%s' must end in .h5 or .safetensors\n", out->c_str());
        return 2;
    }
    const Opened o = open_checkpoint(a.positional[0], value(a, "--tag"));
    const Checkpoint &ck = o.ck;
    const std::vector<const Tensor *> params = exportable_params(ck);

    // Replacing the checkpoint with its weights would lose it.
    struct stat in_st, out_st;
    if (stat(printable(ck.file()).c_str(), &in_st) == 0 && stat(out->c_str(), &out_st) == 0 && in_st.st_dev == out_st.st_dev &&
        in_st.st_ino == out_st.st_ino)
        throw Error(*out + ": is the checkpoint being exported; choose another --output");

    std::vector<std::pair<std::string, std::string>> metadata;
    metadata.emplace_back("format", "pt"); // what transformers expects of PyTorch weights
    metadata.emplace_back("source", "dsm-checkpoint");
    for (const char *name : {"tag", "libdsm_version", "global_steps"})
        if (const Attribute *attr = ck.attribute(name))
            metadata.emplace_back(name, attr->kind == Attribute::Kind::String ? attr->s : attr->text());

    TempOutput tmp(*out);
    uint64_t elements = 0, bytes = 0;
    // Each tensor is written while its checksum is computed; a mismatch
    // throws, and the temporary file is removed: nothing reaches OUT.
    auto verified = [&](const Tensor &t, const std::function<void(const Block &)> &write) {
        Checksum sum;
        ck.read_blocks(t, [&](const Block &b) {
            sum.add_floats(b.data, b.n);
            write(b);
        });
        if (sum.value() != *t.checksum)
            throw Error(ck.file() + ": " + t.path + ": checksum mismatch (stored " + hex64(*t.checksum) +
                        ", computed " + hex64(sum.value()) + "); nothing exported");
        elements += t.elements;
        bytes += t.elements * dtype->bytes;
    };
    if (kind == OutKind::Safetensors) {
        std::vector<SafetensorsEntry> entries;
        uint64_t data_bytes = 0;
        for (const Tensor *t : params) {
            entries.push_back({*t->name, t->shape, t->elements});
            data_bytes += t->elements * dtype->bytes;
        }
        std::string header;
        try {
            header = safetensors_header(entries, metadata, dtype->safetensors, dtype->bytes);
        } catch (const Error &e) { // a name safetensors cannot hold
            throw Error(ck.file() + ": " + e.what() + "; nothing exported");
        }
        SafetensorsWriter w(tmp.path(), *out, header, data_bytes);
        std::vector<uint16_t> converted;
        for (const Tensor *t : params)
            verified(*t, [&](const Block &b) {
                if (!half) return w.write(b.data, 4, b.n);
                convert_block(*dtype, ck.file(), *t, b, converted);
                w.write(converted.data(), 2, b.n);
            });
        w.finish();
    } else {
        Handle half_type;
        if (half) half_type = h5_half_type(*dtype);
        H5Output h5(tmp.path(), *out, half ? half_type.get() : H5T_IEEE_F32LE);
        for (const auto &m : metadata)
            if (m.first == "global_steps") {
                if (const Attribute *attr = ck.attribute("global_steps"); attr && attr->kind == Attribute::Kind::Int)
                    h5.int_attribute(h5.root(), "global_steps", attr->i);
            } else if (m.first != "format") {
                h5.string_attribute(h5.root(), m.first.c_str(), m.second);
            }
        for (const Tensor *t : params) {
            h5.begin(t->link, *t->name, t->shape);
            std::vector<uint16_t> converted;
            verified(*t, [&](const Block &b) {
                if (!half) return h5.write(b, H5T_NATIVE_FLOAT, b.data);
                convert_block(*dtype, ck.file(), *t, b, converted);
                h5.write(b, half_type.get(), converted.data());
            });
            h5.end();
        }
        h5.close();
    }
    tmp.commit();

    struct stat st;
    const long long file_bytes = stat(out->c_str(), &st) == 0 ? static_cast<long long>(st.st_size) : -1;
    const char *kind_name = kind == OutKind::Hdf5 ? "hdf5" : "safetensors";
    if (a.json) {
        Json tensors = Json::array();
        for (const Tensor *t : params)
            tensors.push_back({{"name", *t->name},
                               {"dataset", t->path},
                               {"shape", shape_json(t->shape)},
                               {"elements", t->elements},
                               {"bytes", t->elements * dtype->bytes},
                               {"checksum", hex64(*t->checksum)}});
        print_json(Json{{"format", "dsm-ckpt-export"},
                        {"format_version", 1},
                        {"path", o.loc.directory ? o.loc.dir : o.loc.file},
                        {"file", ck.file()},
                        {"tag", o.loc.directory ? Json(o.loc.tag) : Json(nullptr)},
                        {"output", *out},
                        {"output_format", kind_name},
                        {"dtype", dtype->option},
                        {"tensors", tensors},
                        {"elements", elements},
                        {"bytes", bytes},
                        {"file_bytes", file_bytes}});
    } else {
        std::printf("exported %s (%s, %s of %s data, checksums verified) from %s to %s (%s)\n",
                    plural(params.size(), "parameter", "parameters").c_str(),
                    plural(elements, "element", "elements").c_str(), plural(bytes, "byte", "bytes").c_str(),
                    dtype->option,
                    printable(ck.file()).c_str(), printable(*out).c_str(), kind_name);
    }
    return 0;
}

// ---------------------------------------------------------------- diff

struct TensorDiff {
    std::string path;
    std::vector<uint64_t> shape_a, shape_b;
    bool compared = false; // same shape and both readable
    bool equal = false;
    uint64_t elements = 0, differing = 0, nan_mismatches = 0;
    double max_abs = 0, max_rel = 0;
};

// Compares two tensors of one shape block by block: A is read in blocks, B's
// matching rows beside it, so memory stays at two blocks whatever the size.
// Also recomputes both checksums: a difference caused by a damaged file is
// reported as that.
TensorDiff compare(const Checkpoint &ca, const Tensor &ta, const Checkpoint &cb, const Tensor &tb, double atol,
                   double rtol, std::vector<Issue> &warnings) {
    TensorDiff d;
    d.path = ta.path;
    d.shape_a = ta.shape;
    d.shape_b = tb.shape;
    d.elements = ta.elements;
    if (ta.shape != tb.shape) return d;
    if (!ta.float32 || !tb.float32) {
        warnings.push_back({ta.path, "cannot be compared: in " + std::string(!ta.float32 ? "A" : "B") + " it " +
                                         (!ta.float32 ? ta.unreadable : tb.unreadable)});
        return d;
    }
    d.compared = true;
    Checksum sa, sb;
    std::vector<float> other;
    ca.read_blocks(ta, [&](const Block &b) {
        other.resize(b.n);
        cb.read_rows(tb, b.row0, b.rows, other.data());
        sa.add_floats(b.data, b.n);
        sb.add_floats(other.data(), b.n);
        for (size_t k = 0; k < b.n; ++k) {
            uint32_t xa, xb;
            std::memcpy(&xa, &b.data[k], 4);
            std::memcpy(&xb, &other[k], 4);
            if (xa == xb) continue; // bitwise equal: equal, NaN included
            const double x = b.data[k], y = other[k];
            if (std::isnan(x) || std::isnan(y)) {
                ++d.nan_mismatches;
                ++d.differing;
                continue;
            }
            const double diff = std::fabs(x - y);
            const double mag = std::max(std::fabs(x), std::fabs(y));
            const double rel = std::isinf(diff) ? diff : mag > 0 ? diff / mag : 0.0;
            d.max_abs = std::max(d.max_abs, diff);
            d.max_rel = std::max(d.max_rel, rel);
            // An infinity against a finite value is never within a tolerance
            // (rtol * inf would say it is).
            if (std::isinf(diff) || !(diff <= atol + rtol * mag)) ++d.differing;
        }
    });
    if (ta.checksum && sa.value() != *ta.checksum)
        warnings.push_back({ta.path, "checksum mismatch in A (" + ca.file() + "): the file is damaged"});
    if (tb.checksum && sb.value() != *tb.checksum)
        warnings.push_back({tb.path, "checksum mismatch in B (" + cb.file() + "): the file is damaged"});
    d.equal = d.differing == 0;
    return d;
}

// Four digits: enough to judge a difference; --json gives all of them.
std::string short_number(double v) {
    if (!std::isfinite(v)) return number_text(v);
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.4g", v);
    return buf;
}

// Where two JSON values differ, by dotted key ("zero_optimization.stage"):
// objects are compared member by member, anything else whole. A member
// absent on one side is null there.
struct KeyDiff {
    std::string key;
    Json a, b;
    bool in_a = true, in_b = true;
};

void json_differences(const Json &a, const Json &b, const std::string &prefix, std::vector<KeyDiff> &out) {
    if (!a.is_object() || !b.is_object()) {
        if (a != b) out.push_back({prefix, a, b, true, true});
        return;
    }
    auto key = [&](const std::string &k) { return prefix.empty() ? k : prefix + "." + k; };
    for (const auto &m : a.items()) {
        if (b.contains(m.key())) json_differences(m.value(), b.at(m.key()), key(m.key()), out);
        else out.push_back({key(m.key()), m.value(), nullptr, true, false});
    }
    for (const auto &m : b.items())
        if (!a.contains(m.key())) out.push_back({key(m.key()), nullptr, m.value(), false, true});
}

struct AttrDiff {
    std::string name;
    const Attribute *a = nullptr, *b = nullptr;
    bool counted = false;
    std::vector<KeyDiff> keys; // config: the keys that differ, when both sides are JSON
};

// An attribute value for one line of text: a long string (a configuration)
// is cut, since the differing keys are listed below it.
std::string short_text(const Attribute *a) {
    if (a == nullptr) return "absent";
    std::string t = a->text();
    if (t.size() > 80 || t.find('\n') != std::string::npos) {
        const size_t bytes = a->kind == Attribute::Kind::String ? a->s.size() : t.size();
        t = "(" + std::to_string(bytes) + " bytes)";
    }
    return t;
}

int cmd_diff(int argc, char **argv) {
    Args a;
    if (int rc = parse_args("diff", argc, argv, {"--tag-a", "--tag-b", "--atol", "--rtol"}, 2, kDiffHelp, a))
        return rc < 0 ? 0 : rc;
    double atol = 0, rtol = 0;
    if (auto v = value(a, "--atol"); v && !parse_tolerance("diff", "--atol", *v, atol)) return 2;
    if (auto v = value(a, "--rtol"); v && !parse_tolerance("diff", "--rtol", *v, rtol)) return 2;
    const Opened oa = open_checkpoint(a.positional[0], value(a, "--tag-a"));
    const Opened ob = open_checkpoint(a.positional[1], value(a, "--tag-b"));
    const Checkpoint &ca = oa.ck, &cb = ob.ck;

    // Root attributes: A's order, then those only B has.
    std::vector<AttrDiff> attrs;
    std::vector<std::string> names;
    for (const Attribute &x : ca.attributes()) names.push_back(x.name);
    for (const Attribute &x : cb.attributes())
        if (ca.attribute(x.name) == nullptr) names.push_back(x.name);
    for (const std::string &n : names) {
        AttrDiff d;
        d.name = n;
        d.a = ca.attribute(n);
        d.b = cb.attribute(n);
        if (d.a != nullptr && d.b != nullptr && *d.a == *d.b) continue;
        d.counted = !provenance_attribute(n);
        if (d.a != nullptr && d.b != nullptr) {
            const Json ja = attribute_json(*d.a), jb = attribute_json(*d.b);
            if (ja.is_object() && jb.is_object()) json_differences(ja, jb, "", d.keys);
        }
        attrs.push_back(d);
    }

    // Tensors by dataset path: A's order, then those only B has.
    std::map<std::string, const Tensor *> in_b;
    for (const Tensor &t : cb.tensors()) in_b[t.path] = &t;
    std::vector<std::string> only_a, only_b;
    std::vector<TensorDiff> diffs;
    std::vector<Issue> warnings;
    std::set<std::string> in_a;
    for (const Tensor &t : ca.tensors()) {
        in_a.insert(t.path);
        const auto it = in_b.find(t.path);
        if (it == in_b.end()) only_a.push_back(t.path);
        else diffs.push_back(compare(ca, t, cb, *it->second, atol, rtol, warnings));
    }
    for (const Tensor &t : cb.tensors())
        if (!in_a.count(t.path)) only_b.push_back(t.path);

    // The client state: bytes, compared exactly.
    const ClientState &csa = ca.client_state(), &csb = cb.client_state();
    bool client_equal = csa.present == csb.present;
    if (client_equal && csa.present) client_equal = ca.read_client_state() == cb.read_client_state();

    size_t tensors_differing = 0, attrs_counted = 0;
    for (const TensorDiff &d : diffs) tensors_differing += !d.equal;
    for (const AttrDiff &d : attrs) attrs_counted += d.counted;
    const bool equal =
        tensors_differing == 0 && only_a.empty() && only_b.empty() && attrs_counted == 0 && client_equal;

    if (a.json) {
        auto side = [](const Opened &o) {
            return Json{{"path", o.loc.directory ? o.loc.dir : o.loc.file},
                        {"file", o.ck.file()},
                        {"tag", o.loc.directory ? Json(o.loc.tag) : Json(nullptr)}};
        };
        Json jattrs = Json::array();
        for (const AttrDiff &d : attrs) {
            Json e = {{"name", d.name},
                      {"a", d.a ? attribute_json(*d.a) : Json(nullptr)},
                      {"b", d.b ? attribute_json(*d.b) : Json(nullptr)},
                      {"counted", d.counted}};
            if (!d.keys.empty()) {
                Json keys = Json::array();
                for (const KeyDiff &k : d.keys) {
                    Json entry = {{"key", k.key}};
                    if (k.in_a) entry["a"] = k.a;
                    if (k.in_b) entry["b"] = k.b;
                    keys.push_back(entry);
                }
                e["keys"] = keys;
            }
            jattrs.push_back(e);
        }
        Json jt = Json::array();
        for (const TensorDiff &d : diffs)
            jt.push_back({{"path", d.path},
                          {"shape_a", shape_json(d.shape_a)},
                          {"shape_b", shape_json(d.shape_b)},
                          {"equal", d.equal},
                          {"elements", d.compared ? Json(d.elements) : Json(nullptr)},
                          {"differing_elements", d.compared ? Json(d.differing) : Json(nullptr)},
                          {"nan_mismatches", d.compared ? Json(d.nan_mismatches) : Json(nullptr)},
                          {"max_abs_diff", d.compared ? number_json(d.max_abs) : Json(nullptr)},
                          {"max_rel_diff", d.compared ? number_json(d.max_rel) : Json(nullptr)}});
        print_json(Json{{"format", "dsm-ckpt-diff"},
                        {"format_version", 1},
                        {"a", side(oa)},
                        {"b", side(ob)},
                        {"atol", atol},
                        {"rtol", rtol},
                        {"equal", equal},
                        {"attributes", jattrs},
                        {"only_in_a", only_a},
                        {"only_in_b", only_b},
                        {"tensors", jt},
                        {"client_state",
                         {{"a_bytes", csa.present ? Json(csa.bytes) : Json(nullptr)},
                          {"b_bytes", csb.present ? Json(csb.bytes) : Json(nullptr)},
                          {"equal", client_equal}}},
                        {"warnings", issues_json(warnings)}});
        return equal ? 0 : 1;
    }

    std::printf("A %s\nB %s\n", printable(ca.file()).c_str(), printable(cb.file()).c_str());
    for (const AttrDiff &d : attrs) {
        std::printf("attribute %s: %s (A) vs %s (B)%s\n", printable(d.name).c_str(), printable(short_text(d.a)).c_str(),
                    printable(short_text(d.b)).c_str(), d.counted ? "" : "  [setup, not counted]");
        constexpr size_t kMaxKeys = 20;
        for (size_t k = 0; k < d.keys.size() && k < kMaxKeys; ++k) {
            const KeyDiff &kd = d.keys[k];
            const std::string va = kd.in_a ? kd.a.dump(-1, ' ', false, Json::error_handler_t::replace) : "absent";
            const std::string vb = kd.in_b ? kd.b.dump(-1, ' ', false, Json::error_handler_t::replace) : "absent";
            std::printf("  %s.%s: %s (A) vs %s (B)\n", printable(d.name).c_str(), printable(kd.key).c_str(),
                        printable(va).c_str(), printable(vb).c_str());
        }
        if (d.keys.size() > kMaxKeys) std::printf("  ... and %zu more keys (--json lists them)\n", d.keys.size() - kMaxKeys);
    }
    for (const std::string &p : only_a) std::printf("only in A: %s\n", printable(p).c_str());
    for (const std::string &p : only_b) std::printf("only in B: %s\n", printable(p).c_str());
    for (const TensorDiff &d : diffs) {
        if (d.equal) continue;
        if (d.shape_a != d.shape_b)
            std::printf("%s: shape %s (A) vs %s (B)\n", printable(d.path).c_str(), shape_text(d.shape_a).c_str(),
                        shape_text(d.shape_b).c_str());
        else if (!d.compared)
            std::printf("%s: not compared (unreadable, see the warning)\n", printable(d.path).c_str());
        else
            std::printf("%s: %llu of %llu elements differ%s; max abs diff %s, max rel diff %s\n", printable(d.path).c_str(),
                        static_cast<unsigned long long>(d.differing), static_cast<unsigned long long>(d.elements),
                        d.nan_mismatches ? (" (" + std::to_string(d.nan_mismatches) + " NaN)").c_str() : "",
                        short_number(d.max_abs).c_str(), short_number(d.max_rel).c_str());
    }
    if (!client_equal)
        std::printf("client_state: %s (A) vs %s (B), contents differ\n",
                    csa.present ? plural(csa.bytes, "byte", "bytes").c_str() : "absent",
                    csb.present ? plural(csb.bytes, "byte", "bytes").c_str() : "absent");
    for (const Issue &w : warnings) std::printf("warning: %s: %s\n", printable(w.path).c_str(), printable(w.message).c_str());
    const std::string tol = "atol " + number_text(atol) + ", rtol " + number_text(rtol);
    if (equal)
        std::printf("equal: %s compared (%s)\n", plural(diffs.size(), "tensor", "tensors").c_str(), tol.c_str());
    else
        std::printf("different: %zu of %zu common tensors differ, %zu only in A, %zu only in B, %s (%s)\n",
                    tensors_differing, diffs.size(), only_a.size(), only_b.size(),
                    plural(attrs_counted, "training-state attribute differs", "training-state attributes differ").c_str(),
                    tol.c_str());
    return equal ? 0 : 1;
}

// ---------------------------------------------------------------- clean

// What a save leaves when it is killed before its commit (src/ckpt: the file
// of tag T is written as DIR/.T.h5.tmp, with DIR/.T.h5.reserve beside it,
// and renamed; `latest` is written as DIR/.latest.tmp and renamed; the
// directory check's token is DIR/.dsm-dircheck-<16 hex>): the tag of such a
// name, "" for .latest.tmp and a token, nullopt for any other name.
std::optional<std::string> leftover_tag(const std::string &name) {
    if (name == ".latest.tmp") return std::string();
    const std::string token = ".dsm-dircheck-";
    if (name.size() == token.size() + 16 && name.compare(0, token.size(), token) == 0 &&
        name.find_first_not_of("0123456789abcdef", token.size()) == std::string::npos)
        return std::string();
    for (const std::string suffix : {".h5.tmp", ".h5.reserve"}) {
        if (name.size() <= 1 + suffix.size() || name[0] != '.' ||
            name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
            continue;
        const std::string tag = name.substr(1, name.size() - 1 - suffix.size());
        if (valid_tag(tag)) return tag;
    }
    return std::nullopt;
}

// The kind of a leftover for clean's JSON: "checkpoint" (.T.h5.tmp),
// "reserve" (.T.h5.reserve), "latest" (.latest.tmp) or "token"
// (.dsm-dircheck-...), and what it is in words.
const char *leftover_kind(const std::string &name, const std::string &tag) {
    if (name.rfind(".dsm-dircheck-", 0) == 0) return "token";
    if (tag.empty()) return "latest";
    return name.size() > 8 && name.compare(name.size() - 8, 8, ".reserve") == 0 ? "reserve" : "checkpoint";
}

std::string leftover_what(const std::string &name, const std::string &tag) {
    const std::string kind = leftover_kind(name, tag);
    if (kind == "token") return "an interrupted shared-directory check";
    if (kind == "latest") return "an interrupted update of latest";
    if (kind == "reserve") return "the metadata reserve of an interrupted save of tag " + printable(tag);
    return "an interrupted save of tag " + printable(tag);
}

int cmd_clean(int argc, char **argv) {
    Args a;
    if (int rc = parse_args("clean", argc, argv, {}, 1, kCleanHelp, a, {"--dry-run"})) return rc < 0 ? 0 : rc;
    const bool dry = a.flags.count("--dry-run") != 0;
    const std::string dir = a.positional[0];
    struct stat st;
    if (stat(dir.c_str(), &st) != 0) throw Error(dir + ": " + std::strerror(errno));
    if (!S_ISDIR(st.st_mode))
        throw UsageError(dir + " is not a directory: clean takes a checkpoint directory and removes only the "
                               "temporary files of interrupted saves in it");
    struct Entry {
        std::string name, tag;
        uint64_t bytes = 0;
        bool removed = false;
        std::string why_kept; // a name of ours that is not a regular file
    };
    std::vector<Entry> found;
    {
        std::unique_ptr<DIR, int (*)(DIR *)> d(opendir(dir.c_str()), closedir);
        if (!d) throw Error(dir + ": cannot list: " + std::strerror(errno));
        for (struct dirent *e = readdir(d.get()); e != nullptr; e = readdir(d.get())) {
            const std::string name = e->d_name;
            const std::optional<std::string> tag = leftover_tag(name);
            if (!tag) continue;
            Entry en;
            en.name = name;
            en.tag = *tag;
            struct stat fst;
            // lstat: a link with such a name is not followed, and not removed.
            if (lstat((dir + "/" + name).c_str(), &fst) != 0) continue; // gone meanwhile
            if (S_ISREG(fst.st_mode)) en.bytes = static_cast<uint64_t>(fst.st_size);
            else en.why_kept = S_ISLNK(fst.st_mode) ? "a symbolic link" : S_ISDIR(fst.st_mode) ? "a directory"
                                                                                                 : "not a regular file";
            found.push_back(en);
        }
    }
    std::sort(found.begin(), found.end(), [](const Entry &x, const Entry &y) { return x.name < y.name; });
    uint64_t bytes = 0;
    size_t removed = 0, listed = 0;
    std::string failure;
    for (Entry &en : found) {
        if (!en.why_kept.empty()) continue;
        ++listed;
        bytes += en.bytes;
        if (dry) continue;
        const std::string path = dir + "/" + en.name;
        if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
            if (failure.empty()) failure = path + ": cannot remove: " + std::strerror(errno);
            continue;
        }
        en.removed = true;
        ++removed;
    }
    if (a.json) {
        Json files = Json::array(), kept = Json::array();
        for (const Entry &en : found) {
            if (!en.why_kept.empty()) {
                kept.push_back({{"file", en.name}, {"reason", en.why_kept}});
                continue;
            }
            files.push_back({{"file", en.name},
                             {"kind", leftover_kind(en.name, en.tag)},
                             {"tag", en.tag.empty() ? Json(nullptr) : Json(en.tag)},
                             {"bytes", en.bytes},
                             {"removed", en.removed}});
        }
        print_json(Json{{"format", "dsm-ckpt-clean"},
                        {"format_version", 1},
                        {"path", dir},
                        {"dry_run", dry},
                        {"leftovers", files},
                        {"kept", kept},
                        {"bytes", bytes},
                        {"removed", removed}});
    } else {
        for (const Entry &en : found) {
            const std::string path = printable(dir + "/" + en.name);
            if (!en.why_kept.empty())
                std::printf("kept %s: %s, not a file a save leaves\n", path.c_str(), en.why_kept.c_str());
            else
                std::printf("%s %s (%s, %s)\n", dry ? "would remove" : en.removed ? "removed" : "could not remove",
                            path.c_str(),
                            leftover_what(en.name, en.tag).c_str(),
                            plural(en.bytes, "byte", "bytes").c_str());
        }
        if (listed == 0)
            std::printf("%s: no leftovers of interrupted saves\n", printable(dir).c_str());
        else if (dry)
            std::printf("%s: %s of interrupted saves (%s) would be removed\n", printable(dir).c_str(),
                        plural(listed, "leftover", "leftovers").c_str(), plural(bytes, "byte", "bytes").c_str());
        else
            std::printf("%s: removed %zu of %s of interrupted saves\n", printable(dir).c_str(), removed,
                        plural(listed, "leftover", "leftovers").c_str());
    }
    if (!failure.empty()) throw Error(failure);
    return 0;
}

} // namespace
} // namespace ckpt_tool
} // namespace dsm

int main(int argc, char **argv) {
    using namespace dsm::ckpt_tool;
    if (argc < 2) {
        std::fputs(kUsage, stderr);
        return 2;
    }
    const std::string sub = argv[1];
    if (sub == "--help" || sub == "-h") {
        std::fputs(kUsage, stdout);
        std::puts("Run 'dsm-ckpt SUBCOMMAND --help' for its options; doc/dsm-ckpt.md describes the output.");
        return 0;
    }
    if (sub == "--version") {
        std::printf("dsm-ckpt (libdsm) %s\n", DSM_VERSION_STRING);
        return 0;
    }
    int (*cmd)(int, char **) = sub == "info"     ? cmd_info
                               : sub == "verify" ? cmd_verify
                               : sub == "export" ? cmd_export
                               : sub == "diff"   ? cmd_diff
                               : sub == "clean"  ? cmd_clean
                                                 : nullptr;
    if (cmd == nullptr) {
        std::fprintf(stderr, "dsm-ckpt: unknown subcommand '%s' (info, verify, export, diff, clean; see dsm-ckpt --help)\n",
                     sub.c_str());
        return 2;
    }
    // Failures become one line of ours; HDF5's own stack dump would bury it.
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    install_crash_guard("dsm-ckpt " + sub);
    limit_memory();
    try {
        return cmd(argc - 2, argv + 2);
    } catch (const UsageError &e) {
        std::fprintf(stderr, "dsm-ckpt %s: %s\n", printable(sub).c_str(), printable(e.what()).c_str());
        return 2;
    } catch (const Error &e) {
        std::fprintf(stderr, "dsm-ckpt %s: %s\n", printable(sub).c_str(), printable(e.what()).c_str());
        return 1;
    } catch (const std::bad_alloc &) {
        std::fprintf(stderr, "dsm-ckpt %s: out of memory\n", sub.c_str());
        return 1;
    } catch (const std::exception &e) {
        std::fprintf(stderr, "dsm-ckpt %s: %s\n", printable(sub).c_str(), printable(e.what()).c_str());
        return 1;
    }
}
