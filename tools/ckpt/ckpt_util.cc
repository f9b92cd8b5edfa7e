// dsm-ckpt: the crash guard, the memory bound, the text and JSON helpers and
// Attribute (see ckpt_read.hpp).
#include "ckpt_read.hpp"

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include <dirent.h>
#include <csignal>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define DSM_CKPT_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define DSM_CKPT_SANITIZED 1
#endif
#endif

namespace dsm {
namespace ckpt_tool {

// ---------------------------------------------------------------- HDF5 errors

namespace {

herr_t collect_error(unsigned, const H5E_error2_t *e, void *data) {
    auto *descs = static_cast<std::vector<std::string> *>(data);
    descs->push_back(e->desc != nullptr ? e->desc : "");
    return 0;
}

// HDF5 1.10 says "truncated file: eof = 2048, sblock->base_addr = 0,
// stored_eof = 13184"; people need the two sizes, not the field names.
std::string explain_truncation(const std::string &msg) {
    unsigned long long eof = 0, stored = 0;
    const char *p = std::strstr(msg.c_str(), "eof = ");
    const char *q = std::strstr(msg.c_str(), "stored_eof = ");
    if (msg.rfind("truncated file", 0) != 0 || p == nullptr || q == nullptr ||
        std::sscanf(p, "eof = %llu", &eof) != 1 || std::sscanf(q, "stored_eof = %llu", &stored) != 1)
        return msg;
    return "truncated file: " + std::to_string(eof) + " bytes, its superblock says " + std::to_string(stored);
}

} // namespace

// ---------------------------------------------------------------- crash guard

namespace {

// Written by the signal handler with write(2) only: no allocation there.
std::string g_crash_prefix;
char g_crash_message[4096];
size_t g_crash_length = 0;

void append(char *buf, size_t &n, size_t cap, const char *s) {
    while (*s != '\0' && n < cap) buf[n++] = *s++;
}

void on_fatal_signal(int sig) {
    // Async-signal-safe: the message was formatted beforehand; only the
    // signal number is added here.
    char tail[160];
    size_t n = 0;
    if (sig == SIGALRM) {
        append(tail, n, sizeof tail, "made no progress reading this file's metadata for 60 s");
    } else {
        const char number[4] = {static_cast<char>(sig >= 10 ? '0' + sig / 10 % 10 : '0' + sig % 10),
                                static_cast<char>(sig >= 10 ? '0' + sig % 10 : ')'), sig >= 10 ? ')' : '\0', '\0'};
        append(tail, n, sizeof tail, "crashed reading this file (signal ");
        append(tail, n, sizeof tail, number);
    }
    append(tail, n, sizeof tail, ": the file is corrupt\n");
    ssize_t ignored = write(STDERR_FILENO, g_crash_message, g_crash_length);
    ignored = write(STDERR_FILENO, tail, n);
    (void)ignored;
    _exit(1);
}

} // namespace

static_assert(kWatchdogSeconds == 60, "the message above says 60 s");

void install_crash_guard(const std::string &prefix) {
    g_crash_prefix = prefix;
    crash_context("");
    // An alternate stack, so that a stack overflow is reported too.
    static char alt[1 << 16];
    stack_t ss{};
    ss.ss_sp = alt;
    ss.ss_size = sizeof alt;
    sigaltstack(&ss, nullptr);
    struct sigaction sa {};
    sa.sa_handler = on_fatal_signal;
    sa.sa_flags = SA_ONSTACK | SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGALRM}) sigaction(sig, &sa, nullptr);
}

void crash_context(const std::string &file) {
    const std::string msg = g_crash_prefix + ": " + (file.empty() ? std::string("") : file + ": ") + "HDF5 ";
    g_crash_length = std::min(msg.size(), sizeof g_crash_message);
    std::memcpy(g_crash_message, msg.data(), g_crash_length);
}


// ---------------------------------------------------------------- memory bound

namespace {

// Far above what the tool needs (two 16 MiB blocks, HDF5's caches, the
// metadata of a large model), far below what a corrupt length asks for.
constexpr uint64_t kMemoryBase = uint64_t(4) << 30;

} // namespace

void limit_memory() {
#ifndef DSM_CKPT_SANITIZED
    struct rlimit rl;
    if (getrlimit(RLIMIT_DATA, &rl) != 0) return;
    if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > kMemoryBase) {
        rl.rlim_cur = rl.rlim_max == RLIM_INFINITY ? kMemoryBase : std::min<rlim_t>(rl.rlim_max, kMemoryBase);
        setrlimit(RLIMIT_DATA, &rl);
    }
#endif
}

void allow_memory(uint64_t bytes) {
#ifndef DSM_CKPT_SANITIZED
    struct rlimit rl;
    if (getrlimit(RLIMIT_DATA, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return;
    const uint64_t want = kMemoryBase + bytes;
    if (rl.rlim_cur >= want) return;
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY ? want : std::min<rlim_t>(rl.rlim_max, want);
    setrlimit(RLIMIT_DATA, &rl);
#else
    (void)bytes;
#endif
}

// ---------------------------------------------------------------- public helpers

bool ends_with(const std::string &s, const std::string &suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string hdf5_message() {
    std::vector<std::string> descs;
    // Upward: the first frame is where HDF5 detected the problem.
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, collect_error, &descs);
    H5Eclear2(H5E_DEFAULT);
    for (const std::string &d : descs)
        if (!d.empty()) return explain_truncation(d);
    return "unknown HDF5 error";
}

void Checksum::add_floats(const float *x, size_t n) {
    sum_ += ckpt::checksum(x, index_, n);
    index_ += n;
}

void Checksum::add_bytes(const uint8_t *x, size_t n) {
    sum_ += ckpt::checksum_bytes(x, index_, n);
    index_ += n;
}

std::string hex64(uint64_t v) {
    char buf[24];
    std::snprintf(buf, sizeof buf, "0x%016" PRIx64, v);
    return buf;
}


std::string printable(const std::string &s) {
    std::string out;
    out.reserve(s.size());
    auto hex = [&](const char *prefix, unsigned v) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "%s%02x", prefix, v);
        out += buf;
    };
    const auto *b = reinterpret_cast<const unsigned char *>(s.data());
    const size_t n = s.size();
    for (size_t i = 0; i < n;) {
        const unsigned c = b[i];
        if (c < 0x20 || c == 0x7f) {
            hex("\\x", c);
            ++i;
            continue;
        }
        if (c < 0x80) {
            out += static_cast<char>(c);
            ++i;
            continue;
        }
        // A UTF-8 sequence: its length from the lead byte, continuation bytes
        // 10xxxxxx, no overlong form, no surrogate, at most U+10FFFF.
        size_t len = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
        bool ok = len != 0 && i + len <= n;
        for (size_t k = 1; ok && k < len; ++k) ok = (b[i + k] & 0xc0) == 0x80;
        if (ok && len == 3) ok = !(c == 0xe0 && b[i + 1] < 0xa0) && !(c == 0xed && b[i + 1] >= 0xa0);
        if (ok && len == 4) ok = !(c == 0xf0 && b[i + 1] < 0x90) && !(c == 0xf4 && b[i + 1] >= 0x90);
        if (!ok) {
            hex("\\x", c);
            ++i;
        } else if (len == 2 && c == 0xc2 && b[i + 1] < 0xa0) {
            hex("\\u00", b[i + 1]); // a C1 control (CSI is U+009B)
            i += 2;
        } else {
            out.append(s, i, len);
            i += len;
        }
    }
    return out;
}

std::string shape_text(const std::vector<uint64_t> &shape) {
    std::string s = "[";
    for (size_t k = 0; k < shape.size(); ++k) s += (k ? ", " : "") + std::to_string(shape[k]);
    return s + "]";
}

std::string number_text(double v) {
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    char buf[40];
    for (int prec = 1; prec <= 17; ++prec) {
        std::snprintf(buf, sizeof buf, "%.*g", prec, v);
        if (std::strtod(buf, nullptr) == v) break;
    }
    return buf;
}

Json number_json(double v) {
    if (std::isfinite(v)) return v;
    return number_text(v);
}

// ---------------------------------------------------------------- Attribute

Json Attribute::json() const {
    switch (kind) {
    case Kind::Int:
        return is_unsigned ? Json(static_cast<uint64_t>(i)) : Json(i);
    case Kind::Float:
        return number_json(f);
    case Kind::String:
        return s;
    case Kind::IntArray: {
        Json a = Json::array();
        for (int64_t x : ints) a.push_back(is_unsigned ? Json(static_cast<uint64_t>(x)) : Json(x));
        return a;
    }
    case Kind::FloatArray: {
        Json a = Json::array();
        for (double x : floats) a.push_back(number_json(x));
        return a;
    }
    default:
        return nullptr;
    }
}

std::string Attribute::text() const {
    auto int_text = [&](int64_t x) {
        return is_unsigned ? std::to_string(static_cast<uint64_t>(x)) : std::to_string(x);
    };
    switch (kind) {
    case Kind::Int:
        return int_text(i);
    case Kind::Float:
        return number_text(f);
    case Kind::String:
        return "\"" + s + "\"";
    case Kind::IntArray: {
        std::string out = "[";
        for (size_t k = 0; k < ints.size(); ++k) out += (k ? ", " : "") + int_text(ints[k]);
        return out + "]";
    }
    case Kind::FloatArray: {
        std::string out = "[";
        for (size_t k = 0; k < floats.size(); ++k) out += (k ? ", " : "") + number_text(floats[k]);
        return out + "]";
    }
    default:
        return "(" + type + ")";
    }
}

bool Attribute::operator==(const Attribute &o) const {
    if (kind != o.kind) return false;
    auto same = [](double x, double y) { return x == y || (std::isnan(x) && std::isnan(y)); };
    switch (kind) {
    case Kind::Int:
        return i == o.i && (is_unsigned == o.is_unsigned || i >= 0);
    case Kind::Float:
        return same(f, o.f);
    case Kind::String:
        return s == o.s;
    case Kind::IntArray:
        return ints == o.ints;
    case Kind::FloatArray:
        return floats.size() == o.floats.size() &&
               std::equal(floats.begin(), floats.end(), o.floats.begin(), same);
    default:
        return type == o.type;
    }
}

} // namespace ckpt_tool
} // namespace dsm
