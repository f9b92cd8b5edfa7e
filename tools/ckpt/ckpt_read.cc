// dsm-ckpt: reading checkpoint files (see ckpt_read.hpp, doc/checkpoint.md).
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

// ---------------------------------------------------------------- small helpers

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

bool is_ascii_digit(char c) { return c >= '0' && c <= '9'; }

// "global_step2" < "global_step10": digit runs compare as numbers.
bool natural_less(const std::string &a, const std::string &b) {
    size_t i = 0, j = 0;
    while (i < a.size() && j < b.size()) {
        if (is_ascii_digit(a[i]) && is_ascii_digit(b[j])) {
            size_t i2 = i, j2 = j;
            while (i2 < a.size() && is_ascii_digit(a[i2])) ++i2;
            while (j2 < b.size() && is_ascii_digit(b[j2])) ++j2;
            std::string x = a.substr(i, i2 - i), y = b.substr(j, j2 - j);
            x.erase(0, std::min(x.find_first_not_of('0'), x.size()));
            y.erase(0, std::min(y.find_first_not_of('0'), y.size()));
            if (x.size() != y.size()) return x.size() < y.size();
            if (x != y) return x < y;
            i = i2;
            j = j2;
        } else {
            if (a[i] != b[j]) return a[i] < b[j];
            ++i;
            ++j;
        }
    }
    return a.size() - i < b.size() - j || (a.size() - i == b.size() - j && a < b);
}

bool ends_with(const std::string &s, const std::string &suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string join_path(const std::string &dir, const std::string &name) {
    return !dir.empty() && dir.back() == '/' ? dir + name : dir + "/" + name;
}

std::string join(const std::vector<std::string> &items, const char *sep) {
    std::string out;
    for (size_t k = 0; k < items.size(); ++k) out += (k ? sep : "") + items[k];
    return out;
}

// The names of the links of a group in name order (creation order is not
// always tracked, name order always is).
std::vector<std::string> link_names(hid_t group) {
    H5G_info_t info;
    if (H5Gget_info(group, &info) < 0) throw Error("cannot list: " + hdf5_message());
    std::vector<std::string> names;
    for (hsize_t k = 0; k < info.nlinks; ++k) {
        const ssize_t n = H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, k, nullptr, 0, H5P_DEFAULT);
        if (n < 0) throw Error("cannot list: " + hdf5_message());
        std::string name(static_cast<size_t>(n) + 1, '\0');
        if (H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, k, &name[0], name.size(), H5P_DEFAULT) < 0)
            throw Error("cannot list: " + hdf5_message());
        name.resize(static_cast<size_t>(n));
        names.push_back(name);
    }
    return names;
}

// The type of an HDF5 datatype for messages: "int64", "uint8", "float32", "string".
std::string type_name(hid_t type) {
    const H5T_class_t cls = H5Tget_class(type);
    const size_t bits = H5Tget_size(type) * 8;
    switch (cls) {
    case H5T_INTEGER:
        return (H5Tget_sign(type) == H5T_SGN_NONE ? "uint" : "int") + std::to_string(bits);
    case H5T_FLOAT:
        return "float" + std::to_string(bits);
    case H5T_STRING:
        return "string";
    case H5T_COMPOUND:
        return "compound";
    case H5T_ARRAY:
        return "array";
    case H5T_ENUM:
        return "enum";
    default:
        return "type class " + std::to_string(static_cast<int>(cls));
    }
}

// A string attribute of either kind HDF5 has: variable-length (what the format
// says) or fixed-length (what some writers produce), read as UTF-8 bytes.
std::string read_string_attribute(hid_t attr, hid_t type) {
    Handle mem(H5Tcopy(H5T_C_S1), H5Tclose);
    if (!mem.valid()) throw Error(hdf5_message());
    H5Tset_cset(mem.get(), H5Tget_cset(type));
    if (H5Tis_variable_str(type) > 0) {
        H5Tset_size(mem.get(), H5T_VARIABLE);
        char *p = nullptr;
        if (H5Aread(attr, mem.get(), &p) < 0) throw Error(hdf5_message());
        std::string s = p != nullptr ? p : "";
        H5free_memory(p);
        return s;
    }
    const size_t n = H5Tget_size(type);
    H5Tset_size(mem.get(), n + 1); // room for the terminator HDF5 adds
    H5Tset_strpad(mem.get(), H5T_STR_NULLTERM);
    std::string s(n + 1, '\0');
    if (H5Aread(attr, mem.get(), &s[0]) < 0) throw Error(hdf5_message());
    s.resize(std::strlen(s.c_str()));
    if (H5Tget_strpad(type) == H5T_STR_SPACEPAD) s.erase(s.find_last_not_of(' ') + 1);
    return s;
}

// Reads one attribute whatever its type; throws Error (without the object's
// name: the caller adds it) when HDF5 fails.
Attribute read_attribute(hid_t attr, const std::string &name) {
    Attribute a;
    a.name = name;
    Handle type(H5Aget_type(attr), H5Tclose), space(H5Aget_space(attr), H5Sclose);
    if (!type.valid() || !space.valid()) throw Error(hdf5_message());
    const H5S_class_t sc = H5Sget_simple_extent_type(space.get());
    const hssize_t npoints = H5Sget_simple_extent_npoints(space.get());
    const int rank = H5Sget_simple_extent_ndims(space.get());
    if (sc == H5S_NULL || npoints < 0 || rank < 0) {
        a.type = "empty";
        return a;
    }
    a.scalar = sc == H5S_SCALAR;
    const std::string base = type_name(type.get());
    a.type = a.scalar ? base : base + "[" + std::to_string(npoints) + "]";
    const H5T_class_t cls = H5Tget_class(type.get());
    // The format's attributes are scalars or a few mesh sizes; a corrupt
    // dataspace could claim billions of values.
    if (npoints > (hssize_t(1) << 20)) throw Error("holds " + std::to_string(npoints) + " values, too many");
    const size_t n = static_cast<size_t>(npoints);
    if (cls == H5T_INTEGER) {
        a.kind = a.scalar ? Attribute::Kind::Int : Attribute::Kind::IntArray;
        a.is_unsigned = H5Tget_sign(type.get()) == H5T_SGN_NONE;
        a.bits = static_cast<int>(H5Tget_size(type.get()) * 8);
        // Unsigned values are read as uint64 and kept as their bits, so that a
        // checksum above 2^63 survives (int64 would saturate it).
        std::vector<uint64_t> v(n);
        if (H5Aread(attr, a.is_unsigned ? H5T_NATIVE_UINT64 : H5T_NATIVE_INT64, v.data()) < 0)
            throw Error(hdf5_message());
        for (uint64_t x : v) a.ints.push_back(static_cast<int64_t>(x));
        if (a.scalar && !a.ints.empty()) a.i = a.ints[0];
    } else if (cls == H5T_FLOAT) {
        a.kind = a.scalar ? Attribute::Kind::Float : Attribute::Kind::FloatArray;
        a.bits = static_cast<int>(H5Tget_size(type.get()) * 8);
        a.floats.resize(n);
        if (H5Aread(attr, H5T_NATIVE_DOUBLE, a.floats.data()) < 0) throw Error(hdf5_message());
        if (a.scalar && !a.floats.empty()) a.f = a.floats[0];
    } else if (cls == H5T_STRING && a.scalar) {
        a.kind = Attribute::Kind::String;
        a.s = read_string_attribute(attr, type.get());
    }
    return a;
}

// The attribute `name` of an object, or nothing when it has none.
std::optional<Attribute> find_attribute(hid_t obj, const char *name) {
    const htri_t exists = H5Aexists(obj, name);
    if (exists < 0) throw Error("attribute " + std::string(name) + ": " + hdf5_message());
    if (exists == 0) return std::nullopt;
    Handle attr(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
    if (!attr.valid()) throw Error("attribute " + std::string(name) + ": " + hdf5_message());
    try {
        return read_attribute(attr.get(), name);
    } catch (const Error &e) {
        throw Error("attribute " + std::string(name) + ": " + e.what());
    }
}

// Multiplies with a limit: a corrupt file can claim any dimensions.
bool checked_product(const std::vector<uint64_t> &dims, uint64_t &out) {
    constexpr uint64_t kMax = uint64_t(1) << 61; // elements * 4 bytes stays below 2^63
    uint64_t p = 1;
    for (uint64_t d : dims) {
        if (d != 0 && p > kMax / d) return false;
        p *= d;
    }
    out = p;
    return true;
}

} // namespace

// ---------------------------------------------------------------- crash guard

namespace {

// Written by the signal handler with write(2) only: no allocation there.
std::string g_crash_prefix;
char g_crash_message[4096];
size_t g_crash_length = 0;

// A hang is this long without progress while reading metadata.
constexpr unsigned kWatchdogSeconds = 60;

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

namespace {

// HDF5 1.10 can also loop forever on a corrupt global heap. While the
// metadata is read, each object read re-arms an alarm; a full minute without
// one ends the process with the message above. Data reads are not watched:
// a block may legitimately take long on a slow file system.
class MetadataWatchdog {
public:
    MetadataWatchdog() { progress(); }
    ~MetadataWatchdog() { alarm(0); }
    static void progress() { alarm(kWatchdogSeconds); }
};

} // namespace

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

// ---------------------------------------------------------------- locate

namespace {

// DIR/latest: one line holding a tag. Returns the tag, or "" with `why` set.
std::string read_latest(const std::string &dir, std::string &why, bool &exists) {
    const std::string path = join_path(dir, "latest");
    exists = false;
    struct stat st;
    if (stat(path.c_str(), &st) != 0) {
        why = path + ": " + std::strerror(errno);
        return "";
    }
    exists = true;
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        why = path + ": cannot read: " + std::strerror(errno);
        return "";
    }
    std::string text;
    char buf[512];
    // A tag has at most 200 characters: more than a few hundred bytes is not a tag.
    in.read(buf, sizeof buf);
    text.assign(buf, static_cast<size_t>(in.gcount()));
    std::string tag = text;
    if (!tag.empty() && tag.back() == '\n') tag.pop_back();
    if (!tag.empty() && tag.back() == '\r') tag.pop_back();
    if (!valid_tag(tag)) {
        why = path + ": does not hold a tag (1 to 200 of A-Z a-z 0-9 . _ -, one line)";
        return "";
    }
    return tag;
}

} // namespace

Location locate(const std::string &path, const std::optional<std::string> &tag) {
    if (tag && !valid_tag(*tag))
        throw UsageError("--tag '" + *tag + "' is not a tag (1 to 200 of A-Z a-z 0-9 . _ -, not starting with .)");
    struct stat st;
    if (stat(path.c_str(), &st) != 0) throw Error(path + ": " + std::strerror(errno));
    Location loc;
    if (!S_ISDIR(st.st_mode)) {
        if (tag) throw UsageError("--tag applies to a checkpoint directory; " + path + " is a file");
        loc.file = path;
        return loc;
    }
    loc.directory = true;
    loc.dir = path;
    std::unique_ptr<DIR, int (*)(DIR *)> d(opendir(path.c_str()), closedir);
    if (!d) throw Error(path + ": cannot list: " + std::strerror(errno));
    for (struct dirent *e = readdir(d.get()); e != nullptr; e = readdir(d.get())) {
        const std::string name = e->d_name;
        if (name[0] == '.') {
            if (ends_with(name, ".tmp") || ends_with(name, ".h5.reserve") || name.rfind(".dsm-dircheck-", 0) == 0)
                loc.temporary.push_back(name);
            continue;
        }
        struct stat fst;
        if (!ends_with(name, ".h5") || name.size() <= 3 || stat(join_path(path, name).c_str(), &fst) != 0 ||
            !S_ISREG(fst.st_mode))
            continue;
        loc.tags.push_back(name.substr(0, name.size() - 3));
    }
    std::sort(loc.tags.begin(), loc.tags.end(), natural_less);
    std::sort(loc.temporary.begin(), loc.temporary.end());
    bool latest_exists = false;
    std::string why;
    const std::string latest = read_latest(path, why, latest_exists);
    if (!latest.empty()) loc.latest = latest;
    else loc.latest_problem = why;
    const bool listed = loc.latest && std::find(loc.tags.begin(), loc.tags.end(), *loc.latest) != loc.tags.end();
    if (loc.latest && !listed)
        loc.latest_problem = join_path(path, "latest") + " names tag '" + *loc.latest + "', but " +
                             join_path(path, *loc.latest + ".h5") + " does not exist";

    if (tag) {
        loc.tag = *tag;
        if (std::find(loc.tags.begin(), loc.tags.end(), *tag) == loc.tags.end())
            throw Error(path + ": no tag '" + *tag + "' (" + join_path(path, *tag + ".h5") + " does not exist; tags: " +
                        (loc.tags.empty() ? "none" : join(loc.tags, ", ")) + ")");
    } else if (!loc.latest_problem.empty()) {
        if (loc.tags.empty() && !latest_exists) throw Error(path + ": not a checkpoint directory (no latest, no *.h5)");
        if (!latest_exists)
            throw Error(loc.latest_problem + "; choose a tag with --tag (tags: " +
                        (loc.tags.empty() ? "none" : join(loc.tags, ", ")) + ")");
        throw Error(loc.latest_problem);
    } else {
        loc.tag = *loc.latest;
    }
    loc.file = join_path(path, loc.tag + ".h5");
    return loc;
}

// ---------------------------------------------------------------- Checkpoint

Error Checkpoint::error(const std::string &object, const std::string &what) const {
    return Error(file_ + ": " + (object.empty() ? "" : object + ": ") + what);
}

Checkpoint::Checkpoint(const std::string &file) : file_(file) {
    crash_context(file);
    const MetadataWatchdog watchdog;
    struct stat st;
    if (stat(file.c_str(), &st) != 0) throw Error(file + ": " + std::strerror(errno));
    if (S_ISDIR(st.st_mode)) throw Error(file + ": is a directory, not a checkpoint file");
    if (st.st_size == 0) throw Error(file + ": not an HDF5 file (empty)");
    // The integrity record (format version 2) before HDF5 parses anything:
    // a mismatch is a problem; the file is still read for the report (under
    // the crash guard).
    std::string why;
    const dsm::ckpt::Integrity integrity = dsm::ckpt::check_integrity(file, why);
    if (integrity == dsm::ckpt::Integrity::Corrupt) problem("/", why);
    const htri_t is = H5Fis_hdf5(file.c_str());
    if (is == 0) throw Error(file + ": not an HDF5 file");
    if (is < 0) throw Error(file + ": cannot read: " + hdf5_message());
    hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) throw Error(file + ": cannot open as HDF5: " + hdf5_message());
    h_ = Handle(f, H5Fclose);
    read_root_attributes();
    read_objects();
    check_root_attributes();
    check_optimizer_states();
    if (integrity == dsm::ckpt::Integrity::Absent && format_version() >= 2)
        warning("/", "no integrity record in the user block (the file was rewritten by another program?)");
}

const Attribute *Checkpoint::attribute(const std::string &name) const {
    for (const Attribute &a : attributes_)
        if (a.name == name) return &a;
    return nullptr;
}

namespace {

herr_t collect_attribute_name(hid_t, const char *name, const H5A_info_t *, void *data) {
    static_cast<std::vector<std::string> *>(data)->push_back(name);
    return 0;
}

} // namespace

void Checkpoint::read_root_attributes() {
    std::vector<std::string> names;
    hsize_t idx = 0;
    if (H5Aiterate2(h_.get(), H5_INDEX_NAME, H5_ITER_INC, &idx, collect_attribute_name, &names) < 0)
        throw error("/", "cannot list attributes: " + hdf5_message());
    for (const std::string &name : names) {
        MetadataWatchdog::progress();
        Handle a(H5Aopen(h_.get(), name.c_str(), H5P_DEFAULT), H5Aclose);
        if (!a.valid()) throw error("/", "cannot open attribute " + name + ": " + hdf5_message());
        try {
            attributes_.push_back(read_attribute(a.get(), name));
        } catch (const Error &e) {
            throw error("/", "attribute " + name + ": " + e.what());
        }
    }
}

void Checkpoint::require_format() const {
    const Attribute *f = attribute("format");
    const Attribute *v = attribute("format_version");
    if (f == nullptr || f->kind != Attribute::Kind::String)
        throw Error(file_ + ": not a libdsm checkpoint (no string attribute 'format')");
    if (f->s != "dsm-checkpoint")
        throw Error(file_ + ": not a libdsm checkpoint (format is \"" + f->s + "\", expected \"dsm-checkpoint\")");
    if (v == nullptr || v->kind != Attribute::Kind::Int)
        throw Error(file_ + ": no integer attribute 'format_version'");
    if (v->i < 1 || v->i > dsm::ckpt::kFormatVersion)
        throw Error(file_ + ": format_version " + v->text() + " is not supported (this dsm-ckpt reads versions 1 to " +
                    std::to_string(dsm::ckpt::kFormatVersion) + ")");
}

int64_t Checkpoint::format_version() const {
    const Attribute *v = attribute("format_version");
    return v != nullptr && v->kind == Attribute::Kind::Int ? v->i : 1;
}

// The root attributes as JSON of the types the library reads them as
// (integers, doubles, strings, arrays), checksummed as the library does.
uint64_t Checkpoint::root_attributes_checksum() const {
    nlohmann::json all = nlohmann::json::object(); // keys in byte order, as the library dumps them
    for (const Attribute &a : attributes_) {
        switch (a.kind) {
        case Attribute::Kind::Int:
            all[a.name] = a.is_unsigned ? nlohmann::json(static_cast<uint64_t>(a.i)) : nlohmann::json(a.i);
            break;
        case Attribute::Kind::Float: all[a.name] = a.f; break;
        case Attribute::Kind::String: all[a.name] = a.s; break;
        case Attribute::Kind::IntArray: {
            nlohmann::json arr = nlohmann::json::array();
            for (int64_t x : a.ints) arr.push_back(a.is_unsigned ? nlohmann::json(static_cast<uint64_t>(x)) : nlohmann::json(x));
            all[a.name] = arr;
            break;
        }
        case Attribute::Kind::FloatArray: all[a.name] = a.floats; break;
        default: break;
        }
    }
    return dsm::ckpt::root_attributes_checksum(all);
}

void Checkpoint::check_root_attributes() {
    using K = Attribute::Kind;
    struct Expected {
        const char *name;
        K kind;
    };
    static const Expected kExpected[] = {
        {"format", K::String},
        {"format_version", K::Int},
        {"libdsm_version", K::String},
        {"tag", K::String},
        {"global_steps", K::Int},
        {"micro_steps", K::Int},
        {"skipped_steps", K::Int},
        {"global_samples", K::Int},
        {"optimizer_steps", K::Int},
        {"loss_scale", K::Float},
        {"loss_scale_cur_iter", K::Int},
        {"loss_scale_last_overflow_iter", K::Int},
        {"loss_scale_cur_hysteresis", K::Int},
        {"lr_schedule_last_step", K::Int},
        {"zero_stage", K::Int},
        {"data_parallel_size", K::Int},
        {"sequence_parallel_size", K::Int},
        {"mesh_shape", K::IntArray},
        {"mesh_names", K::String},
        {"compute_dtype", K::String},
        {"optimizer", K::String},
        {"config", K::String},
    };
    static const char *const kKindName[] = {"an integer", "a float", "a string", "an integer array",
                                            "a float array", "other"};
    for (const Expected &e : kExpected) {
        const Attribute *a = attribute(e.name);
        if (a == nullptr) {
            problem("/", std::string("missing attribute '") + e.name + "'");
        } else if (a->kind != e.kind) {
            problem("/", std::string("attribute '") + e.name + "' is " + a->type + ", expected " +
                             kKindName[static_cast<int>(e.kind)]);
        } else if ((e.kind == K::Int || e.kind == K::IntArray) && (a->bits != 64 || a->is_unsigned)) {
            warning("/", std::string("attribute '") + e.name + "' is " + a->type + "; the format says int64");
        } else if (e.kind == K::Float && a->bits != 64) {
            warning("/", std::string("attribute '") + e.name + "' is " + a->type + "; the format says float64");
        }
    }
    // The values the format constrains. A wrong kind was reported above.
    auto int_attr = [&](const char *name) -> const Attribute * {
        const Attribute *a = attribute(name);
        return a != nullptr && a->kind == K::Int ? a : nullptr;
    };
    auto str_attr = [&](const char *name) -> const Attribute * {
        const Attribute *a = attribute(name);
        return a != nullptr && a->kind == K::String ? a : nullptr;
    };
    auto at_least = [&](const char *name, int64_t min) {
        const Attribute *a = int_attr(name);
        if (a != nullptr && a->i < min)
            problem("/", std::string("attribute '") + name + "' is " + a->text() + ", expected >= " +
                             std::to_string(min));
    };
    for (const char *name : {"global_steps", "micro_steps", "skipped_steps", "global_samples", "optimizer_steps",
                             "loss_scale_cur_iter", "loss_scale_cur_hysteresis"})
        at_least(name, 0);
    at_least("loss_scale_last_overflow_iter", -1);
    at_least("lr_schedule_last_step", -1);
    at_least("data_parallel_size", 1);
    at_least("sequence_parallel_size", 1);
    if (const Attribute *a = int_attr("zero_stage"); a != nullptr && (a->i < 0 || a->i > 3))
        problem("/", "attribute 'zero_stage' is " + a->text() + ", expected 0..3");
    if (const Attribute *a = attribute("loss_scale");
        a != nullptr && a->kind == K::Float && !(a->f > 0 && std::isfinite(a->f)))
        problem("/", "attribute 'loss_scale' is " + a->text() + ", expected a positive finite number");
    auto one_of = [&](const char *name, std::initializer_list<const char *> allowed) {
        const Attribute *a = str_attr(name);
        if (a == nullptr) return;
        for (const char *v : allowed)
            if (a->s == v) return;
        std::string list;
        for (const char *v : allowed) list += std::string(list.empty() ? "" : ", ") + v;
        problem("/", std::string("attribute '") + name + "' is " + a->text() + ", expected one of " + list);
    };
    one_of("compute_dtype", {"float32", "float16", "bfloat16"});
    one_of("optimizer", {"adam", "adamw", "sgd", "lamb", "lion", "adagrad"});
    if (const Attribute *a = str_attr("config"); a != nullptr && !Json::accept(a->s))
        problem("/", "attribute 'config' is not valid JSON");
    if (const Attribute *a = str_attr("tag"); a != nullptr) {
        if (!valid_tag(a->s)) {
            problem("/", "attribute 'tag' is " + a->text() + ", not a valid tag");
        } else {
            // A renamed file still loads by its new name; say so, do not fail.
            const size_t slash = file_.find_last_of('/');
            const std::string base = slash == std::string::npos ? file_ : file_.substr(slash + 1);
            if (base != a->s + ".h5")
                warning("/", "attribute 'tag' is " + a->text() + " but the file is named " + base);
        }
    }
    const Attribute *shape = attribute("mesh_shape");
    const Attribute *names = str_attr("mesh_names");
    if (shape != nullptr && shape->kind == K::IntArray && names != nullptr) {
        const size_t count = names->s.empty() ? 0 : std::count(names->s.begin(), names->s.end(), ',') + size_t(1);
        if (count != shape->ints.size())
            problem("/", "attribute 'mesh_names' has " + std::to_string(count) + " names for " +
                             std::to_string(shape->ints.size()) + " dimensions of 'mesh_shape'");
        for (int64_t s : shape->ints)
            if (s < 1) problem("/", "attribute 'mesh_shape' has a size " + std::to_string(s) + " < 1");
    }
    // Format version 2: the checksum over the root attributes.
    if (format_version() >= 2) {
        const Attribute *sum = attribute("attrs_checksum");
        if (sum == nullptr) problem("/", "missing attribute 'attrs_checksum'");
        else if (sum->kind != K::Int || sum->bits != 64 || !sum->is_unsigned)
            problem("/", "attribute 'attrs_checksum' is " + sum->type + ", expected uint64");
        else if (static_cast<uint64_t>(sum->i) != root_attributes_checksum())
            problem("/", "checksum mismatch in the root attributes (the file is corrupt)");
    }
}

void Checkpoint::read_objects() {
    std::vector<std::string> names;
    try {
        names = link_names(h_.get());
    } catch (const Error &e) {
        throw error("/", e.what());
    }
    bool have_params = false;
    for (const std::string &name : names) {
        const std::string path = "/" + name;
        Handle obj(H5Oopen(h_.get(), name.c_str(), H5P_DEFAULT), H5Oclose);
        if (!obj.valid()) {
            problem(path, "cannot open: " + hdf5_message());
            continue;
        }
        const H5I_type_t type = H5Iget_type(obj.get());
        if (name == "params" || name == "optimizer") {
            if (type != H5I_GROUP) {
                problem(path, "is not a group");
                continue;
            }
            if (name == "params") {
                have_params = true;
                read_tensor_group(obj.get(), path, "");
            }
        } else if (name == "client_state") {
            if (type != H5I_DATASET) problem(path, "is not a dataset");
            else read_client_state_info();
        } else {
            warning(path, "not part of the format (ignored)");
        }
    }
    if (!have_params) problem("/params", "missing");
    else if (std::none_of(tensors_.begin(), tensors_.end(), [](const Tensor &t) { return t.param(); }))
        warning("/params", "holds no parameter");
    // Optimizer states after the parameters, whatever the link order.
    if (std::find(names.begin(), names.end(), "optimizer") != names.end()) {
        Handle opt(H5Gopen2(h_.get(), "optimizer", H5P_DEFAULT), H5Gclose);
        if (!opt.valid()) {
            hdf5_message();
            return;
        }
        std::vector<std::string> states;
        try {
            states = link_names(opt.get());
        } catch (const Error &e) {
            throw error("/optimizer", e.what());
        }
        for (const std::string &state : states) {
            const std::string path = "/optimizer/" + state;
            Handle g(H5Oopen(opt.get(), state.c_str(), H5P_DEFAULT), H5Oclose);
            if (!g.valid()) problem(path, "cannot open: " + hdf5_message());
            else if (H5Iget_type(g.get()) != H5I_GROUP) problem(path, "is not a group");
            else read_tensor_group(g.get(), path, state);
        }
    }
}

void Checkpoint::read_tensor_group(hid_t group, const std::string &prefix, const std::string &state) {
    std::vector<std::string> links;
    try {
        links = link_names(group);
    } catch (const Error &e) {
        throw error(prefix, e.what());
    }
    for (const std::string &link : links) {
        MetadataWatchdog::progress();
        Tensor t;
        t.path = prefix + "/" + link;
        t.link = link;
        t.state = state;
        Handle ds(H5Oopen(group, link.c_str(), H5P_DEFAULT), H5Oclose);
        if (!ds.valid()) {
            problem(t.path, "cannot open: " + hdf5_message());
            continue;
        }
        if (H5Iget_type(ds.get()) != H5I_DATASET) {
            problem(t.path, "is not a dataset");
            continue;
        }
        Handle type(H5Dget_type(ds.get()), H5Tclose), space(H5Dget_space(ds.get()), H5Sclose);
        if (!type.valid() || !space.valid()) {
            problem(t.path, "cannot read its type: " + hdf5_message());
            continue;
        }
        t.dtype = type_name(type.get());
        bool shape_ok = true;
        switch (H5Sget_simple_extent_type(space.get())) {
        case H5S_SCALAR:
            t.elements = 1;
            break;
        case H5S_SIMPLE: {
            const int rank = H5Sget_simple_extent_ndims(space.get());
            std::vector<hsize_t> dims(static_cast<size_t>(std::max(rank, 0)));
            if (rank < 0 || H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr) < 0) {
                problem(t.path, "cannot read its shape: " + hdf5_message());
                shape_ok = false;
                break;
            }
            t.shape.assign(dims.begin(), dims.end());
            if (!checked_product(t.shape, t.elements)) {
                problem(t.path, "has an impossible shape " + shape_text(t.shape));
                shape_ok = false;
            }
            break;
        }
        default:
            problem(t.path, "has no dataspace (H5S_NULL)");
            shape_ok = false;
        }
        if (H5Tget_class(type.get()) == H5T_FLOAT && H5Tget_size(type.get()) == 4) {
            t.dtype = "float32";
            t.float32 = shape_ok;
            if (!shape_ok) t.unreadable = "has no valid shape";
            if (H5Tget_order(type.get()) != H5T_ORDER_LE)
                warning(t.path, "is big-endian float32; the format says H5T_IEEE_F32LE");
        } else {
            problem(t.path, "is " + t.dtype + ", expected float32");
            t.unreadable = "is " + t.dtype + ", not float32";
        }
        Handle dcpl(H5Dget_create_plist(ds.get()), H5Pclose);
        const H5D_layout_t layout = dcpl.valid() ? H5Pget_layout(dcpl.get()) : H5D_LAYOUT_ERROR;
        if (!dcpl.valid()) hdf5_message();
        if (layout != H5D_CONTIGUOUS)
            warning(t.path, "is not stored contiguously (the format says contiguous)");
        // Unlike a chunked one, a contiguous or compact dataset stores exactly
        // its logical bytes. Less means unwritten data, which HDF5 would return
        // as fill values, or a damaged shape claiming more than the file holds.
        if (t.float32 && (layout == H5D_CONTIGUOUS || layout == H5D_COMPACT)) {
            const hsize_t stored = H5Dget_storage_size(ds.get());
            if (stored != t.bytes()) {
                hdf5_message();
                t.unreadable = "stores " + std::to_string(stored) + " bytes of data, its shape " +
                               shape_text(t.shape) + " needs " + std::to_string(t.bytes());
                problem(t.path, t.unreadable);
                t.float32 = false;
            }
        }
        try {
            const std::optional<Attribute> name = find_attribute(ds.get(), "name");
            const std::optional<Attribute> trainable = find_attribute(ds.get(), "trainable");
            const std::optional<Attribute> checksum = find_attribute(ds.get(), "checksum");
            if (format_version() >= 2) {
                const std::string want = state.empty() ? std::string("params") : "optimizer/" + state;
                const std::optional<Attribute> group = find_attribute(ds.get(), "group");
                if (!group) problem(t.path, "missing attribute 'group'");
                else if (group->kind != Attribute::Kind::String || group->s != want)
                    problem(t.path, "attribute 'group' is " + group->text() + ", expected \"" + want +
                                        "\" (a tensor moved or swapped)");
            }
            if (!name) problem(t.path, "missing attribute 'name'");
            else if (name->kind != Attribute::Kind::String) problem(t.path, "attribute 'name' is " + name->type + ", expected a string");
            else {
                t.name = name->s;
                if (escape_name(name->s) != link)
                    problem(t.path, "attribute 'name' is \"" + name->s + "\", whose link name is \"" +
                                        escape_name(name->s) + "\", not \"" + link + "\"");
            }
            if (!trainable) problem(t.path, "missing attribute 'trainable'");
            else if (trainable->kind != Attribute::Kind::Int)
                problem(t.path, "attribute 'trainable' is " + trainable->type + ", expected int64");
            else if (trainable->i != 0 && trainable->i != 1)
                problem(t.path, "attribute 'trainable' is " + trainable->text() + ", expected 0 or 1");
            else t.trainable = trainable->i;
            if (!checksum) problem(t.path, "missing attribute 'checksum'");
            else if (checksum->kind != Attribute::Kind::Int || checksum->bits != 64)
                problem(t.path, "attribute 'checksum' is " + checksum->type + ", expected uint64");
            else {
                if (!checksum->is_unsigned) warning(t.path, "attribute 'checksum' is int64; the format says uint64");
                t.checksum = static_cast<uint64_t>(checksum->i);
            }
        } catch (const Error &e) {
            problem(t.path, e.what());
        }
        tensors_.push_back(std::move(t));
    }
}

void Checkpoint::read_client_state_info() {
    ClientState &c = client_state_;
    c.present = true;
    Handle ds(H5Dopen2(h_.get(), "client_state", H5P_DEFAULT), H5Dclose);
    if (!ds.valid()) {
        problem("/client_state", "cannot open: " + hdf5_message());
        return;
    }
    Handle type(H5Dget_type(ds.get()), H5Tclose), space(H5Dget_space(ds.get()), H5Sclose);
    if (!type.valid() || !space.valid()) {
        problem("/client_state", "cannot read its type: " + hdf5_message());
        return;
    }
    hsize_t n = 0;
    if (H5Tget_class(type.get()) != H5T_INTEGER || H5Tget_size(type.get()) != 1) {
        problem("/client_state", "is " + type_name(type.get()) + ", expected uint8");
    } else if (H5Sget_simple_extent_type(space.get()) != H5S_SIMPLE || H5Sget_simple_extent_ndims(space.get()) != 1 ||
               H5Sget_simple_extent_dims(space.get(), &n, nullptr) < 0) {
        problem("/client_state", "is not 1-D");
        hdf5_message();
    } else {
        c.bytes = n;
        c.readable = true;
        if (H5Tget_sign(type.get()) != H5T_SGN_NONE) warning("/client_state", "is int8; the format says uint8");
    }
    try {
        const std::optional<Attribute> checksum = find_attribute(ds.get(), "checksum");
        if (!checksum) problem("/client_state", "missing attribute 'checksum'");
        else if (checksum->kind != Attribute::Kind::Int || checksum->bits != 64)
            problem("/client_state", "attribute 'checksum' is " + checksum->type + ", expected uint64");
        else c.checksum = static_cast<uint64_t>(checksum->i);
    } catch (const Error &e) {
        problem("/client_state", e.what());
    }
}

// Each optimizer state of each trainable parameter, and nothing else: a state
// of a missing or frozen parameter, or of another shape, cannot be loaded.
void Checkpoint::check_optimizer_states() {
    std::map<std::string, const Tensor *> params;
    for (const Tensor &t : tensors_)
        if (t.param()) params[t.link] = &t;
    std::map<std::string, std::set<std::string>> states; // state -> links
    for (const Tensor &t : tensors_) {
        if (t.param()) continue;
        states[t.state].insert(t.link);
        const auto p = params.find(t.link);
        if (p == params.end()) {
            problem(t.path, "has no parameter /params/" + t.link);
            continue;
        }
        if (p->second->float32 && t.float32 && p->second->shape != t.shape)
            problem(t.path, "has shape " + shape_text(t.shape) + ", its parameter " + shape_text(p->second->shape));
        if (p->second->trainable && *p->second->trainable == 0)
            problem(t.path, "is a state of a frozen parameter (trainable 0)");
        if (t.name && p->second->name && *t.name != *p->second->name)
            problem(t.path, "attribute 'name' is \"" + *t.name + "\", its parameter's \"" + *p->second->name + "\"");
    }
    // Every state kept for some parameter is kept for every trainable one.
    for (const auto &s : states)
        for (const auto &p : params)
            if (p.second->trainable && *p.second->trainable == 1 && !s.second.count(p.first))
                problem("/optimizer/" + s.first + "/" + p.first, "missing (trainable parameter " + p.second->path + ")");

    const Attribute *opt = attribute("optimizer");
    if (opt == nullptr || opt->kind != Attribute::Kind::String) return;
    static const std::map<std::string, std::set<std::string>> kStates = {
        {"adam", {"exp_avg", "exp_avg_sq"}}, {"adamw", {"exp_avg", "exp_avg_sq"}},
        {"lamb", {"exp_avg", "exp_avg_sq"}}, {"lion", {"exp_avg"}},
        {"sgd", {"momentum_buffer"}},        {"adagrad", {"sum"}},
    };
    const auto expected = kStates.find(opt->s);
    if (expected == kStates.end()) return;
    for (const auto &s : states)
        if (!expected->second.count(s.first))
            warning("/optimizer/" + s.first, "is not a state of optimizer \"" + opt->s + "\"");
    const bool any_trainable = std::any_of(params.begin(), params.end(), [](const auto &p) {
        return p.second->trainable && *p.second->trainable == 1;
    });
    // SGD keeps a momentum buffer only with momentum: its absence is normal.
    if (any_trainable && opt->s != "sgd")
        for (const std::string &s : expected->second)
            if (!states.count(s))
                warning("/optimizer/" + s, "missing (optimizer \"" + opt->s + "\" keeps it)");
}

void Checkpoint::read_rows(const Tensor &t, uint64_t row0, uint64_t rows, float *out) const {
    if (!t.float32) throw error(t.path, t.unreadable);
    if (t.elements == 0 || rows == 0) return;
    crash_context(file_);
    Handle ds(H5Dopen2(h_.get(), t.path.c_str(), H5P_DEFAULT), H5Dclose);
    if (!ds.valid()) throw error(t.path, "cannot open: " + hdf5_message());
    if (t.shape.empty()) {
        if (H5Dread(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out) < 0)
            throw error(t.path, "cannot read: " + hdf5_message());
        return;
    }
    // The file's dataspace, not the shape read at open: a file changed since
    // then must fail here rather than read out of bounds.
    Handle fspace(H5Dget_space(ds.get()), H5Sclose);
    if (!fspace.valid() || H5Sget_simple_extent_ndims(fspace.get()) != static_cast<int>(t.shape.size()))
        throw error(t.path, "cannot read its shape: " + hdf5_message());
    std::vector<hsize_t> start(t.shape.size(), 0), count(t.shape.begin(), t.shape.end());
    start[0] = row0;
    count[0] = rows;
    const hsize_t n = rows * (t.elements / t.shape[0]);
    Handle mspace(H5Screate_simple(1, &n, nullptr), H5Sclose);
    if (!mspace.valid() ||
        H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr) < 0 ||
        H5Dread(ds.get(), H5T_NATIVE_FLOAT, mspace.get(), fspace.get(), H5P_DEFAULT, out) < 0)
        throw error(t.path, "cannot read: " + hdf5_message());
}

void Checkpoint::read_blocks(const Tensor &t, const std::function<void(const Block &)> &fn,
                             uint64_t block_elements) const {
    if (!t.float32) throw error(t.path, t.unreadable);
    if (t.elements == 0) return;
    if (t.shape.empty()) {
        float x = 0;
        read_rows(t, 0, 1, &x);
        fn(Block{0, 1, 0, &x, 1});
        return;
    }
    // Whole rows of the first dimension: a hyperslab of consecutive rows is a
    // consecutive range of elements in row-major order, which the checksum needs.
    const uint64_t row = t.elements / t.shape[0];
    const uint64_t rows_per_block = std::max<uint64_t>(1, block_elements / std::max<uint64_t>(row, 1));
    // A row above the block size is read whole: this buffer, and diff's for
    // the other side, and the HDF5 conversion buffer of the same size.
    allow_memory(4 * 4 * std::min(rows_per_block, t.shape[0]) * row);
    std::vector<float> buf(static_cast<size_t>(std::min(rows_per_block, t.shape[0]) * row));
    for (uint64_t r0 = 0; r0 < t.shape[0]; r0 += rows_per_block) {
        const uint64_t nr = std::min(rows_per_block, t.shape[0] - r0);
        read_rows(t, r0, nr, buf.data());
        fn(Block{r0, nr, r0 * row, buf.data(), static_cast<size_t>(nr * row)});
    }
}

uint64_t Checkpoint::compute_checksum(const Tensor &t) const {
    Checksum sum;
    read_blocks(t, [&](const Block &b) { sum.add_floats(b.data, b.n); });
    return sum.value();
}

uint64_t Checkpoint::compute_checksum(const Tensor &t, NonFinite &nf) const {
    Checksum sum;
    nf = NonFinite{};
    read_blocks(t, [&](const Block &b) {
        sum.add_floats(b.data, b.n);
        for (size_t i = 0; i < b.n; ++i) {
            const float x = b.data[i];
            if (std::isfinite(x)) continue;
            if (nf.count() == 0) nf.first = b.offset + i;
            (std::isnan(x) ? nf.nan : nf.inf) += 1;
        }
    });
    return sum.value();
}

std::vector<uint8_t> Checkpoint::read_client_state() const {
    const ClientState &c = client_state_;
    if (!c.present) return {};
    if (!c.readable) throw error("/client_state", "is not a 1-D uint8 dataset");
    std::vector<uint8_t> bytes(static_cast<size_t>(c.bytes));
    if (bytes.empty()) return bytes;
    crash_context(file_);
    Handle ds(H5Dopen2(h_.get(), "client_state", H5P_DEFAULT), H5Dclose);
    if (!ds.valid() || H5Dread(ds.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes.data()) < 0)
        throw error("/client_state", "cannot read: " + hdf5_message());
    return bytes;
}

uint64_t Checkpoint::compute_client_checksum() const {
    const std::vector<uint8_t> bytes = read_client_state();
    Checksum sum;
    sum.add_bytes(bytes.data(), bytes.size());
    return sum.value();
}

static_assert(sizeof(float) == 4, "IEEE single precision floats");

} // namespace ckpt_tool
} // namespace dsm
