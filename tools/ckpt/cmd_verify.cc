// dsm-ckpt verify: every checksum recomputed, the structure checked against the format.
#include "tool.hpp"

#include <cstdio>
#include <string>
#include <vector>

namespace dsm {
namespace ckpt_tool {

namespace {

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

struct Verified {
    std::string path;
    std::optional<uint64_t> stored, computed;
    bool ok = false;
    Checkpoint::NonFinite nonfinite; // tensors: NaN and infinite elements
};

} // namespace

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

} // namespace ckpt_tool
} // namespace dsm
