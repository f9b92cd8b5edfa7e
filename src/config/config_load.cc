#include "dsm_config.h"

#include "config/config_load.hpp"

#include <cstdint>
#include <cstdio>
#include <map>
#include <new>
#include <utility>
#include <vector>

#include "core/agree.hpp"
#include "core/hash.hpp"
#include "core/comm.hpp"
#include "core/error.hpp"
#include "core/log.hpp"

namespace dsm {
namespace config {

namespace {

// FNV-1a, 64 bits: ranks compare a digest of the resolved configuration
// rather than the whole text.
std::string digest(const std::string &s) {
    const uint64_t h = fnv1a(s);
    char out[17];
    std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(h));
    return out;
}

using Entries = std::vector<std::pair<std::string, std::string>>;

// "key.path" -> value (as JSON) for every leaf, in order. One path string is
// extended and cut back, never copied per level.
void flatten(const nlohmann::ordered_json &j, std::string &path, Entries &out) {
    if (j.is_object() && !j.empty()) {
        size_t len = path.size();
        for (auto it = j.begin(); it != j.end(); ++it) {
            if (len > 0) path += '.';
            path += it.key();
            flatten(it.value(), path, out);
            path.resize(len);
        }
        return;
    }
    out.emplace_back(path, j.dump());
}

Entries entries(const Config &cfg) {
    Entries out;
    std::string path;
    flatten(nlohmann::ordered_json::parse(config_to_json(cfg)), path, out);
    return out;
}

std::string shown(const nlohmann::ordered_json &value) {
    std::string s = value.dump();
    return s.size() <= 80 ? s : s.substr(0, 77) + "...";
}

// The first key path (in `a`'s order, then the keys only `b` has) whose
// value differs between rank 0's resolved configuration `a` and rank
// `rank_b`'s `b` (nullptr: the key is missing), with both values.
bool first_difference(const nlohmann::ordered_json *a, const nlohmann::ordered_json *b, int rank_b,
                      std::string &path, std::string &out) {
    if (a != nullptr && b != nullptr && *a == *b) return false;
    if (a != nullptr && b != nullptr && a->is_object() && b->is_object()) {
        size_t len = path.size();
        auto down = [&](const std::string &key, const nlohmann::ordered_json *x, const nlohmann::ordered_json *y) {
            if (len > 0) path += '.';
            path += key;
            if (first_difference(x, y, rank_b, path, out)) return true;
            path.resize(len);
            return false;
        };
        for (auto it = a->begin(); it != a->end(); ++it) {
            auto jt = b->find(it.key());
            if (down(it.key(), &it.value(), jt == b->end() ? nullptr : &*jt)) return true;
        }
        for (auto jt = b->begin(); jt != b->end(); ++jt)
            if (!a->contains(jt.key()) && down(jt.key(), nullptr, &jt.value())) return true;
        return false;
    }
    out = cat(path, ": rank 0 has ", a ? shown(*a) : "no such key", ", rank ", rank_b, " has ",
              b ? shown(*b) : "no such key");
    return true;
}

// Run `local` as agree() does, turning any other exception (std::bad_alloc
// from a huge configuration) into an agreed error instead of leaving the
// other ranks waiting.
void agree_all(MPI_Comm comm, const std::function<void()> &local) {
    agree(comm, [&] {
        try {
            local();
        } catch (const Error &) {
            throw;
        } catch (const std::bad_alloc &) {
            DSM_FAIL(DSM_ERR_OUT_OF_MEMORY, "out of memory reading the configuration");
        } catch (const std::exception &e) {
            DSM_FAIL(DSM_ERR_INTERNAL, "reading the configuration: ", e.what());
        }
    });
}

} // namespace

namespace {

// The ranks agree that they resolved the same configuration `cfg` (`json`:
// its config_to_json()): they compare a digest; only when they differ do
// rank 0 and the first differing rank send their whole configuration, to
// name the key.
void agree_resolved(MPI_Comm comm, const std::string &json) {
    const std::string mine = digest(json);
    std::string root = bcast_string(comm, 0, mine);
    Agreement same(comm);
    same.run(root == mine ? DSM_SUCCESS : DSM_ERR_MISMATCH);
    if (!same.failed()) return;
    const int first = same.failed_rank();
    // Both texts go to every rank, so that every rank builds the same message.
    std::string diff, path;
    std::string json0 = bcast_string(comm, 0, json);
    std::string json1 = bcast_string(comm, first, json);
    agree_all(comm, [&] {
        nlohmann::ordered_json a = nlohmann::ordered_json::parse(json0), b = nlohmann::ordered_json::parse(json1);
        first_difference(&a, &b, first, path, diff);
    });
    DSM_FAIL(DSM_ERR_MISMATCH, "resolved configurations differ across ranks: ",
             diff.empty() ? cat("rank 0 has ", json0, ", rank ", first, " has ", json1)
                          : "the first differing key is " + diff);
}

} // namespace

Config load_collective(MPI_Comm comm, const std::string &text_or_path, const ConfigContext &ctx,
                       dsm_status_t bad_status,
                       const std::string &bad_message) {
    // The caller's communicator may abort on errors: agree on a duplicate.
    Comm own = Comm::dup(comm);
    int rank = 0;
    DSM_CHECK_MPI(MPI_Comm_rank(own.get(), &rank));
    ConfigContext mine = ctx;
    mine.warn_unknown = ctx.warn_unknown && rank == 0; // one warning per job, not one per rank
    Config cfg;
    std::string json;
    agree_all(own.get(), [&] {
        if (bad_status != DSM_SUCCESS) DSM_FAIL(bad_status, bad_message);
        // Counted by the tests that check a configuration is read once per call.
        DSM_INFO(INIT, "configuration: collective read of %s",
                 text_or_path.find_first_not_of(" \t\r\n") != std::string::npos &&
                         text_or_path[text_or_path.find_first_not_of(" \t\r\n")] == '{'
                     ? "(inline JSON)"
                     : ("'" + text_or_path + "'").c_str());
        cfg = parse_config(text_or_path, mine);
        json = config_to_json(cfg);
    });
    agree_resolved(own.get(), json);
    return cfg;
}

Config adopt_collective(MPI_Comm comm, const Config &read, const ConfigContext &ctx, dsm_status_t bad_status,
                        const std::string &bad_message) {
    Comm own = Comm::dup(comm);
    Config cfg;
    std::string json;
    agree_all(own.get(), [&] {
        if (bad_status != DSM_SUCCESS) DSM_FAIL(bad_status, bad_message);
        cfg = resolve_for(read, ctx);
        json = config_to_json(cfg);
    });
    agree_resolved(own.get(), json);
    return cfg;
}

std::string config_to_text(const Config &cfg) {
    std::string out;
    for (const auto &e : entries(cfg))
        if (e.first != "resolved.no_effect")
            out += e.first + " = " + e.second + (key_has_no_effect(e.first) ? "  # no effect in libdsm\n" : "\n");
    return out;
}

} // namespace config
} // namespace dsm
