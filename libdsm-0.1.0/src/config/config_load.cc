#include "dsm_config.h"

#include "config/config_load.hpp"

#include <cstdint>
#include <cstdio>

#include "core/agree.hpp"
#include "core/comm.hpp"
#include "core/error.hpp"

namespace dsm {
namespace config {

namespace {

// FNV-1a, 64 bits: ranks compare a digest of the resolved configuration
// rather than the whole text.
std::string digest(const std::string &s) {
    uint64_t h = 1469598103934665603ull;
    for (unsigned char c : s) {
        h ^= c;
        h *= 1099511628211ull;
    }
    char out[17];
    std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(h));
    return out;
}

void flatten(const nlohmann::ordered_json &j, const std::string &path, std::string &out) {
    if (j.is_object() && !j.empty()) {
        for (auto it = j.begin(); it != j.end(); ++it)
            flatten(it.value(), path.empty() ? it.key() : path + "." + it.key(), out);
        return;
    }
    out += path + " = " + j.dump() + "\n";
}

} // namespace

Config load_collective(MPI_Comm comm, const std::string &text_or_path, const ConfigContext &ctx,
                       const std::function<void(const Config &)> &check, dsm_status_t bad_status,
                       const std::string &bad_message) {
    // The caller's communicator may abort on errors: agree on a duplicate.
    Comm own = Comm::dup(comm);
    Config cfg;
    agree(own.get(), [&] {
        if (bad_status != DSM_SUCCESS) DSM_FAIL(bad_status, bad_message);
        cfg = parse_config(text_or_path, ctx);
        if (check) check(cfg);
    });
    agree_same(own.get(), "resolved configurations",
               cat("digest ", digest(config_to_json(cfg))));
    return cfg;
}

std::string config_to_text(const Config &cfg) {
    std::string out;
    flatten(nlohmann::ordered_json::parse(config_to_json(cfg)), "", out);
    return out;
}

} // namespace config
} // namespace dsm
