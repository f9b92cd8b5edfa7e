// See format.hpp and doc/checkpoint.md.
#include "dsm_config.h"

#include "ckpt/format.hpp"

#include <cstring>

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

// The checksum loop is 64-bit multiplies and shifts: AVX-512 (8 lanes with
// vpmullq) is about 4.5 times the scalar loop, which is what bounds a save
// otherwise. GCC and Clang build one clone per target and pick at load time.
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__INTEL_COMPILER)
#define DSM_CKSUM_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define DSM_CKSUM_CLONES
#endif

namespace {
DSM_CKSUM_CLONES
uint64_t checksum_range(const float *data, uint64_t first, size_t count) noexcept {
    uint64_t sum = 0;
#pragma omp simd reduction(+ : sum)
    for (size_t i = 0; i < count; ++i) {
        uint32_t b;
        std::memcpy(&b, data + i, sizeof b);
        sum += splitmix64((first + i) * 0x9E3779B97F4A7C15ull + b);
    }
    return sum;
}
} // namespace

uint64_t checksum(const float *data, size_t offset, size_t count) noexcept {
    constexpr size_t kBlock = 1 << 16; // floats per OpenMP chunk
    if (count <= kBlock) return checksum_range(data, offset, count);
    const long blocks = static_cast<long>((count + kBlock - 1) / kBlock);
    uint64_t sum = 0;
#pragma omp parallel for reduction(+ : sum) schedule(static)
    for (long k = 0; k < blocks; ++k) {
        const size_t b = static_cast<size_t>(k) * kBlock;
        sum += checksum_range(data + b, offset + b, count - b < kBlock ? count - b : kBlock);
    }
    return sum;
}

uint64_t checksum_bytes(const unsigned char *data, size_t offset, size_t size) noexcept {
    uint64_t sum = 0;
    for (size_t i = 0; i < size; ++i)
        sum += splitmix64(static_cast<uint64_t>(offset + i) * 0x9E3779B97F4A7C15ull + data[i]);
    return sum;
}

} // namespace ckpt
} // namespace dsm
