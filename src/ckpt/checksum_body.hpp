// The body of checksum.hpp's kernel, included by checksum_generic.cc,
// checksum_avx2.cc and checksum_avx512.cc only, each compiled for its
// instruction set. In an unnamed namespace so that each file keeps its own
// copy (a function shared by name between files compiled with different
// flags could be merged by the linker into the widest copy).
#pragma once

#include <cstring>

#include "ckpt/checksum.hpp"
#include "ckpt/format.hpp"

namespace dsm {
namespace ckpt {
namespace cksum {
namespace {

uint64_t range(const float *data, uint64_t first, size_t count) noexcept {
    uint64_t sum = 0;
    // The build uses -O2, where GCC hardly vectorizes: OpenMP's simd
    // directive asks for it (no threads).
#pragma omp simd reduction(+ : sum)
    for (size_t i = 0; i < count; ++i) {
        uint32_t b;
        std::memcpy(&b, data + i, sizeof b);
        sum += splitmix64((first + i) * 0x9E3779B97F4A7C15ull + b);
    }
    return sum;
}

const Kernels *table(const char *name) noexcept {
    static const Kernels t{name, range};
    return &t;
}

} // namespace
} // namespace cksum
} // namespace ckpt
} // namespace dsm
