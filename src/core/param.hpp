// Typed environment parameters, declared in the file that reads them:
//
//   DSM_PARAM(comm, COMM_NET_CHUNK, param::Size(4096, 1 << 30), "60K", "Bytes per message ...");
//   ...
//   const size_t chunk = param_COMM_NET_CHUNK().value();
//
// declares DSM_COMM_NET_CHUNK of subsystem `comm` with its type, default and
// help, registers it (so that `dsm-info --env` lists it) and defines the
// accessor param_COMM_NET_CHUNK() in that file. Nothing in libdsm reads a
// DSM_ variable except through a declaration like this one.
//
// A value is the environment's when set and non-empty, else the default. It is
// parsed once and cached; the cache follows the environment (a later setenv
// is parsed again, once). A value the type does not accept fails with
// DSM_ERR_INVALID_ARGUMENT: "environment NAME=\"VALUE\": expected ...".
#pragma once

#include <cstdint>
#include <initializer_list>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace dsm {

// The subsystems, in the order dsm-info lists their parameters.
enum class ParamSubsys { log, mesh, topo, comm, engine, cuda, ckpt, sim };

// One registered parameter, as dsm-info lists it.
class ParamBase {
public:
    ParamBase(ParamSubsys subsys, const char *name, const char *default_value, const char *help);
    ParamBase(const ParamBase &) = delete;
    ParamBase &operator=(const ParamBase &) = delete;

    ParamSubsys subsys() const noexcept { return subsys_; }
    const char *name() const noexcept { return name_; }
    const char *default_value() const noexcept { return default_; }
    const char *help() const noexcept { return help_; }
    // The kind of value: "string", "choice", "int", "size", "bool", or a
    // parser's own ("signal").
    virtual const char *type() const noexcept = 0;
    // What the type accepts, as error messages name it.
    virtual std::string accepts() const = 0;

    // Whether the environment sets the parameter (to a non-empty value).
    bool is_set() const;
    // The text of the value: the environment's if set, else the default.
    std::string raw() const;

protected:
    ~ParamBase() = default;
    // DSM_ERR_INVALID_ARGUMENT: "environment NAME=\"text\": expected `what`".
    [[noreturn]] void reject(const std::string &text, const std::string &what) const;

private:
    ParamSubsys subsys_;
    const char *name_;
    const char *default_;
    const char *help_;
};

// Every registered parameter, ordered by subsystem, then by name.
std::vector<const ParamBase *> params();

namespace param {

// Parsers: value_type, a type() name, accepts() and parse(text) that returns
// the value or throws (the caller names the variable). parse() sees the
// environment's text, or the default's; it is not called for an empty text
// unless the type takes one (Text).

// Any text.
struct Text {
    using value_type = std::string;
    const char *type() const noexcept { return "string"; }
    std::string accepts() const { return "any text"; }
    bool parse(const std::string &text, value_type *out) const {
        *out = text;
        return true;
    }
};

// One of a fixed set of words, case-insensitive; the value is the choice as
// declared.
struct Choice {
    using value_type = std::string;
    Choice(std::initializer_list<const char *> choices) : choices(choices) {}
    std::vector<const char *> choices;
    const char *type() const noexcept { return "choice"; }
    std::string accepts() const;
    bool parse(const std::string &text, value_type *out) const;
};

// 1 (true) or 0 (false).
struct Bool {
    using value_type = bool;
    const char *type() const noexcept { return "bool"; }
    std::string accepts() const { return "one of 0, 1"; }
    bool parse(const std::string &text, value_type *out) const;
};

// A decimal integer from min to max; an empty text (unset, empty default)
// gives `empty`. `what` names the expectation in errors (default: "an
// integer from MIN to MAX").
struct Int {
    using value_type = int64_t;
    Int(int64_t min, int64_t max, const char *what = nullptr, int64_t empty = 0)
        : min(min), max(max), what(what), empty(empty) {}
    int64_t min, max;
    const char *what;
    int64_t empty;
    const char *type() const noexcept { return "int"; }
    std::string accepts() const;
    bool parse(const std::string &text, value_type *out) const;
};

// A byte count from min to max, with an optional K, M or G suffix (binary,
// case-insensitive).
struct Size {
    using value_type = size_t;
    Size(size_t min, size_t max) : min(min), max(max) {}
    size_t min, max;
    const char *type() const noexcept { return "size"; }
    std::string accepts() const;
    bool parse(const std::string &text, value_type *out) const;
};

// A value read by a function of the file that declares the parameter:
// `read(text)` returns it or throws dsm::Error with a message of its own; an
// empty text (unset, empty default) gives `empty`. `type` names the kind of
// value for dsm-info, `accepts` what it accepts.
template <typename V> struct Parsed {
    using value_type = V;
    Parsed(const char *type, const char *accepts, V (*read)(const std::string &), V empty)
        : type_(type), accepts_(accepts), read_(read), empty_(empty) {}
    const char *type_;
    const char *accepts_;
    V (*read_)(const std::string &);
    V empty_;
    const char *type() const noexcept { return type_; }
    std::string accepts() const { return accepts_; }
    bool parse(const std::string &text, value_type *out) const {
        *out = text.empty() ? empty_ : read_(text);
        return true;
    }
};

} // namespace param

// A parameter whose value is of type T::value_type.
template <typename T> class Param final : public ParamBase {
public:
    using value_type = typename T::value_type;
    Param(ParamSubsys subsys, const char *name, T type, const char *default_value, const char *help)
        : ParamBase(subsys, name, default_value, help), type_(std::move(type)) {}

    const char *type() const noexcept override { return type_.type(); }
    std::string accepts() const override { return type_.accepts(); }

    // The parsed value; DSM_ERR_INVALID_ARGUMENT when the type rejects it.
    value_type value() const {
        std::string text = raw();
        std::lock_guard<std::mutex> lock(mutex_);
        if (!cached_ || text != cached_text_) {
            value_type v{};
            if (!type_.parse(text, &v)) reject(text, type_.accepts());
            cached_value_ = std::move(v);
            cached_text_ = std::move(text);
            cached_ = true;
        }
        return cached_value_;
    }

private:
    T type_;
    mutable std::mutex mutex_;
    mutable bool cached_ = false;
    mutable std::string cached_text_;
    mutable value_type cached_value_{};
};

// Keeps a parameter registered from load time on (see DSM_PARAM).
struct ParamRegistration {
    explicit ParamRegistration(const ParamBase &) noexcept {}
};

} // namespace dsm

// DSM_PARAM(subsystem, NAME, type, default, help): the parameter DSM_NAME of
// ParamSubsys::subsystem, parsed by `type` (a dsm::param parser or one of the
// file's own), and its accessor param_NAME(). The object is a function-local
// static (safe to use from other static initializers); the registration
// object constructs it at load time so that dsm-info lists it.
#define DSM_PARAM(subsys, NAME, type, default_value, help)                                               \
    [[maybe_unused]] static const auto &param_##NAME() {                                                 \
        using dsm_param_type_ = decltype(type);                                                          \
        static const ::dsm::Param<dsm_param_type_> p(::dsm::ParamSubsys::subsys, "DSM_" #NAME, type,      \
                                                     default_value, help);                               \
        return p;                                                                                        \
    }                                                                                                    \
    static const ::dsm::ParamRegistration param_registration_##NAME(param_##NAME())

// DSM_PARAM_LINK(tag): defines dsm::param_link::tag(), which the library's
// list of parameter files (src/api/param_list.cc) calls so that a static link
// keeps this file, and with it its parameters, whenever it keeps that list.
#define DSM_PARAM_LINK(tag)                                                                              \
    namespace dsm {                                                                                      \
    namespace param_link {                                                                               \
    void tag() noexcept;                                                                                 \
    void tag() noexcept {}                                                                               \
    }                                                                                                    \
    }
