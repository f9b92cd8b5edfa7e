// amp's conversion and norm kernels, one table per SIMD instruction set
// (core/simd.hpp's pattern): convert.cc holds the generic table (the
// portable loops), convert_avx2.cc (F16C, AVX2) and convert_avx512.cc
// (AVX-512 bf16 and norms) the others. Every table gives the bits of
// core/half.hpp's scalar conversions and of sumsq_lanes() (convert_body.hpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/simd.hpp"

namespace dsm {
namespace amp {
namespace kernels {

struct Table {
    const char *name;
    void (*f32_to_f16)(const float *s, uint16_t *d, size_t n);
    void (*f16_to_f32)(const uint16_t *s, float *d, size_t n);
    void (*f32_to_bf16)(const float *s, uint16_t *d, size_t n);
    void (*bf16_to_f32)(const uint16_t *s, float *d, size_t n);
    // Sum of (scale * x[i])^2 of n fp32 values, and of the fp32 widening of
    // n bf16 values read in place (sumsq_lanes()).
    double (*sumsq)(const float *x, size_t n, double scale);
    double (*sumsq_bf16)(const uint16_t *x, size_t n, double scale);
};

// One instruction set's table, or nullptr where the build lacks the set.
template <simd::Isa> const Table *table() noexcept;

} // namespace kernels
} // namespace amp
} // namespace dsm
