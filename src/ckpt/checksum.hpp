// The checkpoint checksum's kernel (format.hpp's checksum), one table per
// SIMD instruction set (core/simd.hpp's pattern). checksum_body.hpp writes
// it once; checksum_generic.cc, checksum_avx2.cc and checksum_avx512.cc
// compile it per set. The loop is 64-bit multiplies and shifts: AVX-512 (8
// lanes with vpmullq) is about 4.5 times the scalar loop, which is what
// bounds a save otherwise. Every set gives the same value: a sum of 64-bit
// integers modulo 2^64 does not depend on the order of its terms.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/simd.hpp"

namespace dsm {
namespace ckpt {
namespace cksum {

struct Kernels {
    const char *name;
    // sum of splitmix64((first + i) * 0x9E3779B97F4A7C15 + bits(data[i]))
    // over i in [0, count), mod 2^64 (format.hpp's checksum, one thread).
    uint64_t (*range)(const float *data, uint64_t first, size_t count) noexcept;
};

// One instruction set's table, or nullptr where the build lacks the set.
template <simd::Isa> const Kernels *kernels() noexcept;

// The table of simd::isa() (format.cc).
const Kernels &active() noexcept;

} // namespace cksum
} // namespace ckpt
} // namespace dsm
