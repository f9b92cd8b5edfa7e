#include "config/json_reader.hpp"

#include <strings.h>

#include <cmath>
#include <set>

#include "core/error.hpp"

namespace dsm {
namespace config {

namespace {

// One object or array being parsed: whether it is an object, its last key and
// the keys seen so far. Its path is not kept: it is built from the stack only
// when a message needs it, so nesting costs memory linear in the text.
struct Frame {
    bool is_object;
    std::string last_key;
    std::set<std::string> keys;
};

std::string join(const std::string &path, const std::string &key) {
    return path.empty() ? key : path + "." + key;
}

// The path of the innermost object or array of `stack` ("a.b", "a[].c").
std::string stack_path(const std::vector<Frame> &stack) {
    std::string path;
    for (size_t i = 0; i + 1 < stack.size(); ++i) {
        if (stack[i].is_object) {
            if (!path.empty()) path += '.';
            path += stack[i].last_key;
        } else {
            path += "[]";
        }
    }
    return path;
}

// A path cut for a message (a deep path of long keys can be megabytes).
std::string cut(const std::string &s, size_t max = 200) {
    return s.size() <= max ? s : s.substr(0, max - 3) + "...";
}

// nlohmann's parse_error text is "[json.exception.parse_error.N] parse error at
// line L, column C: detail"; keep what follows "parse error ".
std::string syntax_detail(const std::string &what) {
    const std::string marker = "parse error at ";
    size_t at = what.find(marker);
    if (at != std::string::npos) return what.substr(at + marker.size());
    size_t close = what.find("] ");
    return close == std::string::npos ? what : what.substr(close + 2);
}

} // namespace

Json parse_json_text(const std::string &text, const std::string &origin) {
    // nlohmann's lexer takes a NUL byte as the end of the text: what follows
    // would be dropped silently.
    size_t nul = text.find('\0');
    DSM_REQUIRE(nul == std::string::npos, DSM_ERR_CONFIG, "configuration ", origin,
                ": a NUL byte (\\0) at byte offset ", nul, "; a configuration is JSON text");
    DSM_REQUIRE(text.size() <= kMaxConfigBytes, DSM_ERR_CONFIG, "configuration ", origin, ": ", text.size(),
                " bytes, larger than the limit of 64 MiB (", kMaxConfigBytes, " bytes) on a configuration");
    std::vector<Frame> stack;
    std::string duplicate;
    auto callback = [&](int, Json::parse_event_t event, Json &parsed) -> bool {
        switch (event) {
        case Json::parse_event_t::object_start:
        case Json::parse_event_t::array_start:
            if (stack.size() >= kMaxConfigDepth) {
                std::string where = stack_path(stack);
                DSM_FAIL(DSM_ERR_CONFIG, "configuration ", origin,
                         ": objects and arrays nest deeper than the limit of ", kMaxConfigDepth, " levels",
                         where.empty() ? "" : " (under '", cut(where), where.empty() ? "" : "')");
            }
            stack.push_back(Frame{event == Json::parse_event_t::object_start, {}, {}});
            break;
        case Json::parse_event_t::object_end:
        case Json::parse_event_t::array_end:
            if (!stack.empty()) stack.pop_back();
            break;
        case Json::parse_event_t::key:
            if (!stack.empty()) {
                Frame &f = stack.back();
                f.last_key = parsed.get<std::string>();
                if (!f.keys.insert(f.last_key).second && duplicate.empty())
                    duplicate = join(stack_path(stack), f.last_key);
            }
            break;
        case Json::parse_event_t::value: break;
        }
        return true;
    };
    Json out;
    try {
        out = Json::parse(text, callback, true, true);
    } catch (const Json::parse_error &e) {
        DSM_FAIL(DSM_ERR_CONFIG, "configuration ", origin, ": JSON syntax error at ", syntax_detail(e.what()));
    } catch (const Json::exception &e) {
        DSM_FAIL(DSM_ERR_CONFIG, "configuration ", origin, ": invalid JSON: ", syntax_detail(e.what()));
    }
    DSM_REQUIRE(duplicate.empty(), DSM_ERR_CONFIG, "configuration ", origin, ": duplicate key '", cut(duplicate, 1000),
                "'");
    return out;
}

std::string show(const Json &value) {
    std::string s = value.dump();
    if (s.size() > 80) s = s.substr(0, 77) + "...";
    return s;
}

bool as_int(const Json &v, int64_t *out) {
    if (v.is_number_unsigned()) {
        uint64_t u = v.get<uint64_t>();
        if (u > static_cast<uint64_t>(INT64_MAX)) return false;
        *out = static_cast<int64_t>(u);
        return true;
    }
    if (v.is_number_integer()) {
        *out = v.get<int64_t>();
        return true;
    }
    if (v.is_number_float()) {
        double d = v.get<double>();
        // 2^63 is the first double out of range.
        if (!std::isfinite(d) || d != std::floor(d) || d < -9.2233720368547758e18 || d >= 9.2233720368547758e18)
            return false;
        *out = static_cast<int64_t>(d);
        return true;
    }
    return false;
}

std::string range_text(int64_t lo, int64_t hi) {
    if (lo != INT64_MIN && hi != INT64_MAX) return cat(lo, "..", hi);
    if (lo != INT64_MIN) return cat("an integer >= ", lo);
    if (hi != INT64_MAX) return cat("an integer <= ", hi);
    return "an integer";
}

namespace {
thread_local KnownKeys *t_known = nullptr;
void note_known(const std::string &path, const std::string &key) {
    if (t_known != nullptr) (*t_known)[path].insert(key);
}
} // namespace

KnownKeysScope::KnownKeysScope(KnownKeys *known) noexcept : prev_(t_known) { t_known = known; }
KnownKeysScope::~KnownKeysScope() { t_known = prev_; }

void Node::mark(const std::string &key) {
    note_known(path_, key);
    used_.insert(key);
}

Node::Node(const Json *object, std::string path, std::vector<std::string> *unknown)
    : obj_(object), path_(std::move(path)), unknown_(unknown) {}

std::string Node::key_path(const std::string &key) const { return join(path_, key); }

bool Node::has(const std::string &key) const {
    note_known(path_, key);
    if (obj_ == nullptr) return false;
    auto it = obj_->find(key);
    return it != obj_->end() && !it->is_null();
}

const Json *Node::get(const std::string &key) {
    note_known(path_, key);
    if (obj_ == nullptr) return nullptr;
    auto it = obj_->find(key);
    if (it == obj_->end()) return nullptr;
    used_.insert(key);
    return it->is_null() ? nullptr : &*it;
}

void Node::fail(const std::string &key, const std::string &expected, const Json &got) const {
    DSM_FAIL(DSM_ERR_CONFIG, key_path(key), ": expected ", expected, ", got ", show(got));
}

bool Node::get_bool(const std::string &key, bool def) {
    const Json *v = get(key);
    if (v == nullptr) return def;
    if (!v->is_boolean()) fail(key, "true or false", *v);
    return v->get<bool>();
}

int64_t Node::get_int(const std::string &key, int64_t def, int64_t lo, int64_t hi) {
    const Json *v = get(key);
    if (v == nullptr) return def;
    int64_t x = 0;
    if (!as_int(*v, &x)) fail(key, "an integer", *v);
    if (x < lo || x > hi) fail(key, range_text(lo, hi), *v);
    return x;
}

int64_t Node::get_opt_int(const std::string &key, bool *given) {
    *given = get(key) != nullptr;
    return get_int(key, 0);
}

double Node::get_number(const std::string &key, double def, double lo, double hi, bool lo_open) {
    const Json *v = get(key);
    if (v == nullptr) return def;
    if (!v->is_number()) fail(key, "a number", *v);
    double x = v->get<double>();
    if (!std::isfinite(x)) fail(key, "a finite number", *v);
    if (x < lo || (lo_open && x == lo) || x > hi) {
        std::string range;
        if (std::isfinite(lo) && std::isfinite(hi))
            range = cat("a number in ", lo_open ? "(" : "[", lo, ", ", hi, "]");
        else if (std::isfinite(lo))
            range = cat("a number ", lo_open ? "> " : ">= ", lo);
        else
            range = cat("a number <= ", hi);
        fail(key, range, *v);
    }
    return x;
}

std::string Node::get_string(const std::string &key, const std::string &def) {
    const Json *v = get(key);
    if (v == nullptr) return def;
    if (!v->is_string()) fail(key, "a string", *v);
    return v->get<std::string>();
}

size_t Node::get_choice(const std::string &key, size_t def, std::initializer_list<const char *> choices) {
    const Json *v = get(key);
    if (v == nullptr) return def;
    std::string list;
    for (const char *c : choices) list += (list.empty() ? "" : ", ") + std::string("\"") + c + "\"";
    if (!v->is_string()) fail(key, "one of " + list, *v);
    std::string s = v->get<std::string>();
    size_t i = 0;
    for (const char *c : choices) {
        if (strcasecmp(s.c_str(), c) == 0) return i;
        ++i;
    }
    fail(key, "one of " + list, *v);
}

Node Node::child(const std::string &key) {
    const Json *v = get(key);
    if (v == nullptr) return Node(nullptr, key_path(key), unknown_);
    if (!v->is_object()) fail(key, "an object", *v);
    return Node(v, key_path(key), unknown_);
}

void Node::finish() {
    if (obj_ == nullptr) return;
    for (auto it = obj_->begin(); it != obj_->end(); ++it)
        if (used_.count(it.key()) == 0) unknown_->push_back(key_path(it.key()));
}

} // namespace config
} // namespace dsm
