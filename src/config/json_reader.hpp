// JSON text -> nlohmann::json with duplicate-key and syntax errors, and a
// typed reader for one JSON object that names the full key path in every
// error and remembers which keys were read (the rest are unknown keys).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "config/config.hpp"

namespace dsm {
namespace config {

// Parse `text` (read from `origin`, for messages). DSM_ERR_CONFIG for a syntax
// error (with line and column), a duplicate key (with its path) or a number
// out of range. Comments (// and /* */) are allowed.
Json parse_json_text(const std::string &text, const std::string &origin);

// A short rendering of a JSON value for messages (long values are cut).
std::string show(const Json &value);

// One JSON object being read. Keys that are read (or marked) are known; finish()
// reports the others to the unknown-key list. A missing or null key gives the default.
class Node {
public:
    Node(const Json *object, std::string path, std::vector<std::string> *unknown);

    const std::string &path() const { return path_; }
    std::string key_path(const std::string &key) const;
    bool present() const { return obj_ != nullptr; }
    const Json *object() const { return obj_; }
    // The key is there and not null (does not mark it).
    bool has(const std::string &key) const;
    // The value (marks the key as known); nullptr if missing or null.
    const Json *get(const std::string &key);
    void mark(const std::string &key);

    bool get_bool(const std::string &key, bool def);
    int64_t get_int(const std::string &key, int64_t def, int64_t lo = INT64_MIN, int64_t hi = INT64_MAX);
    // Like get_int; `*given` says whether the key held a value.
    int64_t get_opt_int(const std::string &key, bool *given);
    double get_number(const std::string &key, double def, double lo, double hi, bool lo_open = false);
    std::string get_string(const std::string &key, const std::string &def);
    // One of `choices` compared case-insensitively; returns the index.
    size_t get_choice(const std::string &key, size_t def, std::initializer_list<const char *> choices);

    // The object under `key`: absent or null gives an empty node; another type is an error.
    Node child(const std::string &key);

    // Report every key not read to the unknown-key list.
    void finish();

    [[noreturn]] void fail(const std::string &key, const std::string &expected, const Json &got) const;

private:
    const Json *obj_;
    std::string path_;
    std::vector<std::string> *unknown_;
    std::set<std::string> used_;
};

// The parser's own table of the keys it knows: every key name a Node was
// asked for (read, tested or marked), per object path ("" for the top
// level, "zero_optimization.offload_param" below), whether the configuration
// had it or not. Collected while a KnownKeysScope is alive on the thread.
using KnownKeys = std::map<std::string, std::set<std::string>>;
class KnownKeysScope {
public:
    explicit KnownKeysScope(KnownKeys *known) noexcept;
    ~KnownKeysScope();
    KnownKeysScope(const KnownKeysScope &) = delete;
    KnownKeysScope &operator=(const KnownKeysScope &) = delete;

private:
    KnownKeys *prev_;
};

// Value checks shared by readers: `v` as an integer (integral floats such as
// 5e8 count, as in DeepSpeed); false if it is not one.
bool as_int(const Json &v, int64_t *out);
std::string range_text(int64_t lo, int64_t hi);

} // namespace config
} // namespace dsm
