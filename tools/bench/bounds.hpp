// The kernels of dsm-bench's bounds, one table per SIMD instruction set
// (core/simd.hpp's pattern, as libdsm's kernel families): bounds_body.hpp
// writes them once; bounds_generic.cc, bounds_avx2.cc and bounds_avx512.cc
// compile them per set (Makefile.am: SIMD_AVX2_FLAGS, SIMD_AVX512_FLAGS).
// Each moves a kernel's bytes with next to none of its arithmetic. A bound
// is the fastest kernel this machine runs, so bounds() is the widest table
// of the CPU (simd::cpu()), whatever DSM_SIMD or --isa choose for libdsm.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/simd.hpp"

namespace dsm {
namespace bench {

struct BoundKernels {
    const char *name;
    // dsm-bench optimizer: Adam's traffic over elements [b, e) (reads g, p,
    // m, v; writes p, m, v).
    void (*adam)(float *p, const float *g, float *m, float *v, size_t b, size_t e) noexcept;
    // dsm-bench optimizer --model: the step's two passes over [b, e): the
    // norm's read of the gradient (fp32 or bf16 bits), then the update's
    // traffic (the gradient zeroed; with 16 bits the 16-bit parameter
    // written). The _pf forms prefetch `ahead` elements ahead.
    float (*sum32)(const float *g, size_t b, size_t e) noexcept;
    float (*sum16)(const uint16_t *g, size_t b, size_t e) noexcept;
    void (*update32)(float *g, float *p, float *m, float *v, size_t b, size_t e) noexcept;
    void (*update16)(uint16_t *g, float *p, float *m, float *v, uint16_t *p16, size_t b, size_t e) noexcept;
    float (*sum32_pf)(const float *g, size_t b, size_t e, size_t ahead) noexcept;
    float (*sum16_pf)(const uint16_t *g, size_t b, size_t e, size_t ahead) noexcept;
    void (*update32_pf)(float *g, float *p, float *m, float *v, size_t b, size_t e, size_t ahead) noexcept;
    void (*update16_pf)(uint16_t *g, float *p, float *m, float *v, uint16_t *p16, size_t b, size_t e,
                        size_t ahead) noexcept;
    // dsm-bench quantize (n a multiple of 64): 4 bytes per value in, one (8
    // bits) or half (4 bits) out; and back, reading the output too with
    // `accumulate`. AVX-512 only (full-width loads and stores): NULL in the
    // narrower tables.
    void (*quant_in)(const float *x, uint8_t *o, size_t n, int bits) noexcept;
    void (*quant_out)(const uint8_t *q, float *o, size_t n, int bits, bool accumulate) noexcept;
};

// One instruction set's table, or nullptr where the build lacks the set.
template <simd::Isa> const BoundKernels *bound_kernels() noexcept;

// The table of simd::cpu(): the widest this CPU runs.
const BoundKernels &bounds() noexcept;

} // namespace bench
} // namespace dsm
