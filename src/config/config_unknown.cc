// What the reader says about keys it does not know: for each, the known key
// nearest to it at the same level of the configuration (the table of keys is
// the reader's own: every key name it asked for, json_reader.hpp) and what
// applies in its place.
#include "config/config.hpp"

#include <algorithm>
#include <cctype>

#include "core/error.hpp"

namespace dsm {
namespace config {

namespace {

// Levenshtein distance, case-insensitive.
size_t distance(const std::string &a, const std::string &b) {
    std::vector<size_t> row(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= b.size(); ++j) {
            const size_t up = row[j];
            const bool same = std::tolower(static_cast<unsigned char>(a[i - 1])) ==
                              std::tolower(static_cast<unsigned char>(b[j - 1]));
            row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (same ? 0 : 1)});
            diag = up;
        }
    }
    return row[b.size()];
}

// The known key nearest to `name` among `candidates`, "" when none is near
// enough to be a misspelling (at most a third of the name's letters, at
// least 2, differ).
std::string nearest(const std::string &name, const std::set<std::string> &candidates) {
    const size_t limit = std::max<size_t>(2, name.size() / 3);
    std::string best;
    size_t best_d = limit + 1;
    for (const std::string &c : candidates) {
        const size_t d = distance(name, c);
        if (d < best_d && d > 0) {
            best = c;
            best_d = d;
        }
    }
    return best;
}

// What applies for the key at `path` (as the resolved configuration nests
// it), in words where a block has a short summary.
std::string in_effect(const Config &cfg, const std::string &path) {
    if (path == "zero_optimization") return cat("ZeRO stage ", cfg.zero.stage);
    if (path == "fp16" || path == "bf16" || path == "bfloat16")
        return cfg.fp16.enabled ? "fp16" : cfg.bf16.enabled ? "bf16" : "fp32 (no fp16, no bf16)";
    if (path == "optimizer" && cfg.optimizer.type == OptimizerType::NONE) return "no optimizer";
    if (path == "scheduler" && cfg.scheduler.type == SchedulerType::NONE) return "no scheduler (a constant lr)";
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(config_to_json(cfg));
    std::string pointer;
    for (size_t i = 0, next; i <= path.size(); i = next + 1) {
        next = path.find('.', i);
        if (next == std::string::npos) next = path.size();
        pointer += "/" + path.substr(i, next - i);
    }
    const nlohmann::ordered_json::json_pointer p(pointer);
    if (!j.contains(p)) return "";
    std::string v = j.at(p).dump();
    if (v.size() > 60) v = v.substr(0, 57) + "...";
    return path + " = " + v;
}

} // namespace

std::string unknown_keys_message(const Config &cfg, const std::map<std::string, std::set<std::string>> &known,
                                 bool strict) {
    if (cfg.unknown_keys.empty()) return "";
    std::string out = cat("configuration ", cfg.origin, ": unknown keys ", strict ? "(strict checking)" : "ignored",
                          ": ");
    bool first = true;
    for (const std::string &k : cfg.unknown_keys) {
        const size_t dot = k.rfind('.');
        const std::string parent = dot == std::string::npos ? "" : k.substr(0, dot);
        const std::string name = dot == std::string::npos ? k : k.substr(dot + 1);
        out += first ? "" : "; ";
        first = false;
        out += k;
        auto it = known.find(parent);
        const std::string near = it == known.end() ? "" : nearest(name, it->second);
        if (near.empty()) continue;
        const std::string path = parent.empty() ? near : parent + "." + near;
        out += " (did you mean " + path + "?";
        const std::string now = in_effect(cfg, path);
        if (!now.empty()) out += cat(" without it, ", now, " applies");
        out += ")";
    }
    return out;
}

} // namespace config
} // namespace dsm
