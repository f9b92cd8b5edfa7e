// dsm-ckpt diff: two checkpoints compared tensor by tensor and attribute by attribute.
#include "tool.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

namespace dsm {
namespace ckpt_tool {

namespace {

const char *const kDiffHelp =
    "usage: dsm-ckpt diff A B [--tag-a TAG] [--tag-b TAG] [--atol X] [--rtol X] [--all] [--json]\n"
    "  Compare what training reads from two checkpoints: the tensors (parameters and\n"
    "  optimizer states) tensor by tensor, the step counters, the LR schedule's step,\n"
    "  the loss scaler's state (fp16 only: fp32 and bf16 runs never read it) and the\n"
    "  client state. Tensors only in one, shape differences, and for equal shapes the\n"
    "  largest absolute and relative difference. Elements a, b are equal when bitwise\n"
    "  equal or |a - b| <= atol + rtol * max(|a|, |b|). The other attributes (the setup:\n"
    "  ZeRO stage, mesh, configuration; the bookkeeping: tag, version, checksums, a\n"
    "  loss scaler training does not read) are listed apart and not counted.\n"
    "  Was a resume exact? dsm-ckpt diff RESUMED_RUN UNINTERRUPTED_RUN exits 0.\n"
    "  Exit status 0 when equal, 1 when different (or on an error), 2 on a usage error.\n"
    "  --tag-a TAG, --tag-b TAG  the tag of A, of B when it is a directory\n"
    "  --atol X, --rtol X        tolerances, default 0 (exact)\n"
    "  --all                     count every attribute, setup and bookkeeping too\n"
    "  --json                    one JSON document (format in doc/dsm-ckpt.md)\n";

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

// What an attribute is to a training run that loads the checkpoint:
// "training" (read, and counted by default), "setup" (how the run was laid
// out: ZeRO stage, mesh, configuration) or "bookkeeping" (the file's own:
// tag, versions, checksums; the loss scaler's scale, overflow and
// hysteresis where the run never reads them).
const char *attribute_kind(const std::string &name, const Checkpoint &a, const Checkpoint &b) {
    if (provenance_attribute(name)) return "setup";
    // loss_scale_cur_iter counts the steps from the start of training in
    // every run, and a resume restores it.
    static const std::set<std::string> training = {"global_steps",         "micro_steps",
                                                   "skipped_steps",        "global_samples",
                                                   "optimizer_steps",      "lr_schedule_last_step",
                                                   "loss_scale_cur_iter"};
    if (training.count(name)) return "training";
    if (name.rfind("loss_scale", 0) == 0) {
        // The engine restores the loss scaler from a checkpoint of an fp16 run only.
        auto fp16 = [](const Checkpoint &c) {
            const Attribute *d = c.attribute("compute_dtype");
            return d != nullptr && d->kind == Attribute::Kind::String && d->s == "float16";
        };
        return fp16(a) || fp16(b) ? "training" : "bookkeeping";
    }
    static const std::set<std::string> bookkeeping = {"format", "format_version", "attrs_checksum",
                                                      "compute_dtype", "optimizer"};
    if (bookkeeping.count(name)) return "bookkeeping";
    return "training"; // an attribute this tool does not know: counted, to be safe
}

struct AttrDiff {
    std::string name;
    const Attribute *a = nullptr, *b = nullptr;
    const char *kind = "training";
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

} // namespace

int cmd_diff(int argc, char **argv) {
    Args a;
    if (int rc = parse_args("diff", argc, argv, {"--tag-a", "--tag-b", "--atol", "--rtol"}, 2, kDiffHelp, a,
                            {"--all"}))
        return rc < 0 ? 0 : rc;
    const bool all = a.flags.count("--all") != 0;
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
        d.kind = attribute_kind(n, ca, cb);
        d.counted = all || std::string(d.kind) == "training";
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
                      {"kind", d.kind},
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
                        {"all", all},
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
                    printable(short_text(d.b)).c_str(),
                    d.counted ? "" : (std::string("  [") + d.kind + ", not counted]").c_str());
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

} // namespace ckpt_tool
} // namespace dsm
