// Precision helpers: fp16/bf16 <-> fp32 conversion (round to nearest even,
// NaN and Inf kept), non-finite checks and gradient norms with fp64
// accumulation. Bulk functions are vectorized where the CPU allows and
// threaded with OpenMP; their results never depend on the thread count.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/half.hpp"
#include "dsm.h"

namespace dsm {
namespace amp {

// Scalar conversions: core/half.hpp (fp32_to_fp16, fp16_to_fp32, fp32_to_bf16, bf16_to_fp32).

// dst[i] = src[i] converted; dtypes FLOAT32, FLOAT16, BFLOAT16, FLOAT64 (else
// DSM_ERR_INVALID_ARGUMENT). src and dst must not overlap unless they are the
// same pointer with the same dtype.
void convert(const void *src, dsm_dtype_t src_type, void *dst, dsm_dtype_t dst_type, size_t n);

// dst[i] += scale * src[i] in fp32.
void accumulate(const void *src, dsm_dtype_t src_type, float *dst, size_t n, float scale);

// dst[i] += scale * src[i] where dst is float32, float16 or bfloat16: a
// 16-bit dst is widened, added in fp32 and rounded once, a chunk at a time
// (the bits of convert() to fp32, accumulate() and convert() back).
void accumulate_into(const void *src, dsm_dtype_t src_type, void *dst, dsm_dtype_t dst_type, size_t n, float scale);

// The instruction set of the 16-bit conversions and the norms in use:
// "avx512", "avx2" or "generic" (core/simd.hpp picks it, simd::force()
// forces it; every set gives the same bits).
const char *kernels_isa() noexcept;

// x[i] *= scale in place (any floating dtype).
void scale_inplace(void *x, dsm_dtype_t dtype, size_t n, double scale);

// Sum of squares of scale*x[i] accumulated in fp64 in a fixed blocking (so
// the same on every thread count), and whether any element is Inf or NaN.
struct NormPart {
    double sumsq = 0.0;
    bool nonfinite = false;
};
NormPart norm_part(const float *x, size_t n, float scale);
// The same of 16-bit (or fp32) x, converted exactly block by block: the bits
// of norm_part() of x's fp32 conversion, without a pass that writes it.
NormPart norm_part(const void *x, dsm_dtype_t type, size_t n, float scale);

// Whether any element is Inf or NaN.
bool has_nonfinite(const void *x, dsm_dtype_t dtype, size_t n);

} // namespace amp
} // namespace dsm
