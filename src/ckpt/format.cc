// See format.hpp and doc/checkpoint.md.
#include "dsm_config.h"

#include "ckpt/format.hpp"

#include "ckpt/checksum.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sstream>

namespace dsm {
namespace ckpt {

bool valid_tag(const std::string &tag) noexcept {
    if (tag.empty() || tag.size() > kMaxTag || tag[0] == '.') return false;
    for (const char c : tag)
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
              c == '-'))
            return false;
    return true;
}

std::string escape_name(const std::string &name) {
    std::string out;
    out.reserve(name.size());
    for (size_t i = 0; i < name.size(); ++i) {
        const char c = name[i];
        if (c == '%') out += "%25";
        else if (c == '/') out += "%2F";
        else if (c == '.' && i == 0) out += "%2E";
        else out += c;
    }
    return out;
}

namespace cksum {
namespace {
simd::Dispatch<Kernels> g_isa{kernels<simd::Isa::generic>, kernels<simd::Isa::avx2>, kernels<simd::Isa::avx512>};
} // namespace

const Kernels &active() noexcept { return g_isa.active(); }
} // namespace cksum

uint64_t checksum(const float *data, size_t offset, size_t count) noexcept {
    constexpr size_t kBlock = 1 << 16; // floats per OpenMP chunk
    const auto range = cksum::active().range;
    if (count <= kBlock) return range(data, offset, count);
    const long blocks = static_cast<long>((count + kBlock - 1) / kBlock);
    uint64_t sum = 0;
#pragma omp parallel for reduction(+ : sum) schedule(static)
    for (long k = 0; k < blocks; ++k) {
        const size_t b = static_cast<size_t>(k) * kBlock;
        sum += range(data + b, offset + b, count - b < kBlock ? count - b : kBlock);
    }
    return sum;
}

uint64_t checksum_bytes(const unsigned char *data, size_t offset, size_t size) noexcept {
    uint64_t sum = 0;
    for (size_t i = 0; i < size; ++i)
        sum += splitmix64(static_cast<uint64_t>(offset + i) * 0x9E3779B97F4A7C15ull + data[i]);
    return sum;
}


uint64_t root_attributes_checksum(const nlohmann::json &attrs) {
    nlohmann::json copy = attrs;
    copy.erase("attrs_checksum");
    const std::string text = copy.dump();
    return checksum_bytes(reinterpret_cast<const unsigned char *>(text.data()), 0, text.size());
}

namespace {

constexpr char kMagic[8] = {'D', 'S', 'M', 'C', 'K', 'P', 'T', '1'};
constexpr size_t kHead = 32; // magic, user block, file size, count

void put64(unsigned char *p, uint64_t v) noexcept {
    for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}

uint64_t get64(const unsigned char *p) noexcept {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
    return v;
}

bool read_at(int fd, unsigned char *buf, size_t n, uint64_t at) noexcept {
    while (n > 0) {
        const ssize_t got = ::pread(fd, buf, n, static_cast<off_t>(at));
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return false;
        buf += got;
        n -= static_cast<size_t>(got);
        at += static_cast<uint64_t>(got);
    }
    return true;
}

// The checksum of the bytes of [from, size) outside `extents` (sorted,
// inside the range), read in pieces.
bool metadata_sum(int fd, uint64_t from, uint64_t size, const std::vector<Extent> &extents, uint64_t &sum) {
    std::vector<unsigned char> buf(1 << 20);
    sum = 0;
    uint64_t at = from;
    auto gap = [&](uint64_t end) {
        while (at < end) {
            const size_t n = static_cast<size_t>(std::min<uint64_t>(end - at, buf.size()));
            if (!read_at(fd, buf.data(), n, at)) return false;
            sum += checksum_bytes(buf.data(), static_cast<size_t>(at), n);
            at += n;
        }
        return true;
    };
    for (const Extent &e : extents) {
        if (!gap(e.offset)) return false;
        at = std::max(at, e.offset + e.length);
    }
    return gap(size);
}

} // namespace

uint64_t userblock_size(size_t datasets, uint64_t block) noexcept {
    const uint64_t need = kHead + 16 * static_cast<uint64_t>(datasets) + 16;
    uint64_t ub = 4096;
    while (ub < block || ub < need) ub *= 2;
    return ub;
}

std::string write_integrity(const std::string &path, uint64_t ub, const std::vector<Extent> &given) {
    std::vector<Extent> extents;
    for (const Extent &e : given)
        if (e.length > 0) extents.push_back(e);
    std::sort(extents.begin(), extents.end(), [](const Extent &a, const Extent &b) { return a.offset < b.offset; });
    const size_t bytes = kHead + 16 * extents.size() + 16;
    if (bytes > ub) return "the integrity record does not fit in the user block";
    const int fd = ::open(path.c_str(), O_RDWR);
    if (fd < 0) return std::string("cannot open it: ") + std::strerror(errno);
    struct stat st;
    uint64_t sum = 0;
    std::string why;
    if (::fstat(fd, &st) != 0) why = std::string("fstat: ") + std::strerror(errno);
    else if (!metadata_sum(fd, ub, static_cast<uint64_t>(st.st_size), extents, sum))
        why = std::string("cannot read it back: ") + std::strerror(errno);
    if (why.empty()) {
        std::vector<unsigned char> rec(bytes);
        std::memcpy(rec.data(), kMagic, 8);
        put64(&rec[8], ub);
        put64(&rec[16], static_cast<uint64_t>(st.st_size));
        put64(&rec[24], extents.size());
        for (size_t i = 0; i < extents.size(); ++i) {
            put64(&rec[kHead + 16 * i], extents[i].offset);
            put64(&rec[kHead + 16 * i + 8], extents[i].length);
        }
        put64(&rec[bytes - 16], sum);
        put64(&rec[bytes - 8], checksum_bytes(rec.data(), 0, bytes - 8));
        if (::pwrite(fd, rec.data(), bytes, 0) != static_cast<ssize_t>(bytes))
            why = std::string("cannot write the integrity record: ") + std::strerror(errno);
    }
    ::close(fd);
    return why;
}

Integrity check_integrity(const std::string &path, std::string &why) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) {
        why = std::string("cannot open it: ") + std::strerror(errno);
        return Integrity::Corrupt;
    }
    Integrity result = Integrity::Corrupt;
    unsigned char head[kHead];
    struct stat st;
    if (::fstat(fd, &st) != 0 || !read_at(fd, head, kHead, 0) || std::memcmp(head, kMagic, 8) != 0) {
        ::close(fd);
        return Integrity::Absent;
    }
    const uint64_t ub = get64(&head[8]), size = get64(&head[16]), count = get64(&head[24]);
    const uint64_t actual = static_cast<uint64_t>(st.st_size);
    if (ub < 4096 || ub > (uint64_t(1) << 32) || (ub & (ub - 1)) != 0 || count > (ub - kHead - 16) / 16) {
        why = "its integrity record is corrupt";
    } else if (size != actual) {
        why = "it has " + std::to_string(actual) + " bytes but was written with " + std::to_string(size) +
              " (truncated or extended)";
    } else {
        const size_t bytes = static_cast<size_t>(kHead + 16 * count + 16);
        std::vector<unsigned char> rec(bytes);
        std::vector<Extent> extents(static_cast<size_t>(count));
        uint64_t sum = 0;
        if (!read_at(fd, rec.data(), bytes, 0)) {
            why = "its integrity record cannot be read";
        } else if (get64(&rec[bytes - 8]) != checksum_bytes(rec.data(), 0, bytes - 8)) {
            why = "its integrity record is corrupt";
        } else {
            uint64_t prev = ub;
            for (size_t i = 0; i < extents.size() && why.empty(); ++i) {
                extents[i].offset = get64(&rec[kHead + 16 * i]);
                extents[i].length = get64(&rec[kHead + 16 * i + 8]);
                if (extents[i].offset < prev || extents[i].length > size || extents[i].offset > size - extents[i].length)
                    why = "its integrity record is corrupt";
                prev = extents[i].offset + extents[i].length;
            }
            if (why.empty() && !metadata_sum(fd, ub, size, extents, sum))
                why = std::string("cannot read it: ") + std::strerror(errno);
            else if (why.empty() && sum != get64(&rec[bytes - 16]))
                why = "checksum mismatch in its HDF5 metadata (the file is corrupt, or was changed by another program)";
            else if (why.empty())
                result = Integrity::Verified;
        }
    }
    ::close(fd);
    return result;
}

bool hdf5_signature(const std::string &path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    struct stat st;
    bool found = false;
    if (::fstat(fd, &st) == 0)
        for (off_t at = 0; !found && at + 8 <= st.st_size; at = at == 0 ? 512 : 2 * at) {
            unsigned char sig[8];
            found = ::pread(fd, sig, 8, at) == 8 && std::memcmp(sig, "\x89HDF\r\n\x1a\n", 8) == 0;
        }
    ::close(fd);
    return found;
}

std::string shape_text(const std::vector<int64_t> &shape) {
    std::ostringstream os;
    os << "[";
    for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
    os << "]";
    return os.str();
}

} // namespace ckpt
} // namespace dsm
