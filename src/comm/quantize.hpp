// Blockwise symmetric quantization of what travels (ZeRO++: qwZ's int8
// weight gathers, qgZ's int4 gradient reduction).
//
// A segment of n values is cut into blocks of `block` values (the last one
// may be shorter); each block keeps one fp32 scale s = max|x| / qmax
// (qmax = 127 for 8 bits, 7 for 4 bits) and the values q = round(x / s),
// rounded to nearest even, in [-qmax, qmax]; dequantized, x' = q * s, so
// |x - x'| <= s / 2 (plus the rounding of x / s, a few ulps of max|x|).
// A block holding an infinity or a NaN gets a NaN scale: every value of it
// dequantizes to NaN, so an overflow reaches the loss scaler.
//
// The packed form of a segment, packed_bytes(n, bits, block) bytes: the
// scales (4 bytes each), then the values (one byte each, or two per byte,
// the even-indexed one in the low nibble), padded to a multiple of 4 bytes
// so that segments laid end to end keep their scales aligned.
//
// The host kernels are written once over a vector-traits type and compiled
// per instruction set (quantize_generic.cc, quantize_avx2.cc,
// quantize_avx512.cc), the one of simd::isa() chosen at run time
// (core/simd.hpp); they give the same bits on every instruction set.
// Dequantization adds into its output where asked (the reduction's
// accumulate), so that no separate pass copies the values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/simd.hpp"
#include "dsm.h"

namespace dsm {
namespace comm {
namespace quant {

// Block sizes: a multiple of kBlockMultiple from kMinBlock to kMaxBlock.
constexpr size_t kBlockMultiple = 16;
constexpr size_t kMinBlock = 16;
constexpr size_t kMaxBlock = size_t(1) << 20;

// DeepSpeed's choices: qwZ quantizes the weights in int8 blocks its
// quantizer sizes below 8000 values (4096 is the optimum it names); qgZ
// sends int4 blocks of one row of a 2-D gradient (max(rows, cols, world)
// blocks per tensor). libdsm reduces flat buckets without shapes, so both
// take a fixed block: DSM_QWZ_BLOCK and DSM_QGZ_BLOCK.
constexpr size_t kWeightBlock = 4096;
constexpr size_t kGradientBlock = 1024;
constexpr int kWeightBits = 8, kGradientBits = 4;

// DSM_ERR_INVALID_ARGUMENT naming `what` and the value unless `block` is a
// valid block size; likewise for bits other than 4 or 8.
void check_block(size_t block, const char *what);
void check_bits(int bits);
// The checks of every entry point on n values of `dtype` between the
// buffers a and b: bits, block, dtype (FLOAT32, FLOAT16 or BFLOAT16) and
// DSM_ERR_NULL_POINTER for a NULL buffer when n > 0.
void check_args(dsm_dtype_t dtype, size_t n, int bits, size_t block, const void *a, const void *b);

// The environment's block sizes (DSM_QWZ_BLOCK, DSM_QGZ_BLOCK), checked.
size_t weight_block();
size_t gradient_block();

// Bytes of the packed form of n values.
size_t packed_bytes(size_t n, int bits, size_t block) noexcept;

// Quantize n values of `src` (FLOAT32, FLOAT16 or BFLOAT16) into `dst`
// (packed_bytes() bytes). Host memory.
void quantize(const void *src, dsm_dtype_t dtype, size_t n, int bits, size_t block, void *dst);
// Dequantize n values of the packed `src` into `dst` (FLOAT32, FLOAT16 or
// BFLOAT16): dst = x' or, with `accumulate` (FLOAT32 only), dst += x'.
void dequantize(const void *src, size_t n, int bits, size_t block, void *dst, dsm_dtype_t dtype, bool accumulate);
// Values [from, from + count) of the packed segment of n values at `src`
// into `dst` (dst[0] is value `from`; from a multiple of `block`), as
// dequantize() without accumulate: so a caller can dequantize a long
// segment a cache-sized part at a time and use each part while it is hot.
void dequantize_part(const void *src, size_t n, int bits, size_t block, size_t from, size_t count, void *dst,
                     dsm_dtype_t dtype);
// fp32 only: dst = add + x' in one pass (add may be dst: the accumulate;
// else the arrays must not overlap). The same bits as copying `add` into
// dst and accumulating.
void dequantize_add(const void *src, size_t n, int bits, size_t block, const float *add, float *dst);

// The largest error a block whose largest magnitude is `amax` may show
// after a round trip (s / 2 and the rounding of x / s).
float error_bound(float amax, int bits) noexcept;

// The instruction set in use ("avx512", "avx2", "generic"; simd::force()
// forces it).
const char *active_isa() noexcept;

// One instruction set's kernels over fp32 segments (quantize_body.hpp).
struct Kernels {
    const char *name;
    void (*quantize)(const float *x, size_t n, int bits, size_t block, float *scales, uint8_t *data);
    // out = q * s; with `add`, out = add + q * s (add == out: accumulate).
    void (*dequantize)(const float *scales, const uint8_t *data, size_t n, int bits, size_t block, float *out,
                       const float *add);
};

// One instruction set's table, or nullptr where the build lacks the set.
template <simd::Isa> const Kernels *kernels() noexcept;

} // namespace quant
} // namespace comm
} // namespace dsm
