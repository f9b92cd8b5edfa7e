#include "dsm_config.h"

#include "core/param.hpp"

#include <strings.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/error.hpp"

namespace dsm {

namespace {

// The registry: a function-local static, so that a parameter of any file may
// register from its static initializer whatever the order of initialization.
struct Registry {
    std::mutex mutex;
    std::vector<const ParamBase *> params;
};

Registry &registry() {
    static Registry r;
    return r;
}

} // namespace

ParamBase::ParamBase(ParamSubsys subsys, const char *name, const char *default_value, const char *help)
    : subsys_(subsys), name_(name), default_(default_value), help_(help) {
    Registry &r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    r.params.push_back(this);
}

bool ParamBase::is_set() const {
    const char *v = std::getenv(name_);
    return v != nullptr && *v != '\0';
}

std::string ParamBase::raw() const {
    const char *v = std::getenv(name_);
    return (v != nullptr && *v != '\0') ? std::string(v) : std::string(default_);
}

void ParamBase::reject(const std::string &text, const std::string &what) const {
    DSM_FAIL(DSM_ERR_INVALID_ARGUMENT, "environment ", name_, "=\"", text, "\": expected ", what);
}

std::vector<const ParamBase *> params() {
    Registry &r = registry();
    std::vector<const ParamBase *> out;
    {
        std::lock_guard<std::mutex> lock(r.mutex);
        out = r.params;
    }
    std::sort(out.begin(), out.end(), [](const ParamBase *a, const ParamBase *b) {
        if (a->subsys() != b->subsys()) return a->subsys() < b->subsys();
        return std::strcmp(a->name(), b->name()) < 0;
    });
    return out;
}

namespace param {

namespace {

// Decimal digits with an optional leading '-': the value, or false when the
// text is not such a number or does not fit in int64_t.
bool parse_decimal(const char *s, const char **end, int64_t *out) {
    if (!(*s == '-' || (*s >= '0' && *s <= '9'))) return false;
    errno = 0;
    char *e = nullptr;
    const long long v = std::strtoll(s, &e, 10);
    if (errno != 0 || e == s || (*s == '-' && e == s + 1)) return false;
    *end = e;
    *out = v;
    return true;
}

} // namespace

std::string Choice::accepts() const {
    std::string list = "one of ";
    for (size_t i = 0; i < choices.size(); ++i) list += cat(i ? ", " : "", choices[i]);
    return list;
}

bool Choice::parse(const std::string &text, value_type *out) const {
    for (const char *c : choices)
        if (strcasecmp(text.c_str(), c) == 0) {
            *out = c;
            return true;
        }
    return false;
}

bool Bool::parse(const std::string &text, value_type *out) const {
    if (text != "0" && text != "1") return false;
    *out = text == "1";
    return true;
}

std::string Int::accepts() const { return what != nullptr ? std::string(what) : cat("an integer from ", min, " to ", max); }

bool Int::parse(const std::string &text, value_type *out) const {
    if (text.empty()) return *out = empty, true;
    const char *end = nullptr;
    int64_t v = 0;
    if (!parse_decimal(text.c_str(), &end, &v) || *end != '\0' || v < min || v > max) return false;
    *out = v;
    return true;
}

std::string Size::accepts() const {
    return cat("a byte count from ", min, " to ", max, " (a K, M or G suffix allowed)");
}

bool Size::parse(const std::string &text, value_type *out) const {
    const char *end = nullptr;
    int64_t v = 0;
    if (!parse_decimal(text.c_str(), &end, &v) || v < 0) return false;
    unsigned shift = 0;
    if (*end == 'k' || *end == 'K') shift = 10, ++end;
    else if (*end == 'm' || *end == 'M') shift = 20, ++end;
    else if (*end == 'g' || *end == 'G') shift = 30, ++end;
    if (*end != '\0') return false;
    const uint64_t x = static_cast<uint64_t>(v);
    if (x > (static_cast<uint64_t>(max) >> shift)) return false;
    const uint64_t bytes = x << shift;
    if (bytes < min) return false;
    *out = static_cast<size_t>(bytes);
    return true;
}

} // namespace param

} // namespace dsm
