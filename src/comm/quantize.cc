// Blockwise quantization (quantize.hpp): the checks, the packed layout, the
// 16-bit forms and the choice of the kernels' instruction set.
#include "dsm_config.h"

#include "comm/quantize.hpp"
#include "comm/quantize_cuda.hpp"

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/simd.hpp"
#include "core/error.hpp"
#include "core/half.hpp"
#include "core/param.hpp"

namespace dsm {
namespace comm {
namespace quant {

DSM_PARAM(comm, QWZ_BLOCK, param::Int(0, int64_t(1) << 40, "a block size in values"), "4096",
          "Values per int8 block (one fp32 scale each) of ZeRO++ quantized weight gathers "
          "(zero_quantized_weights): a multiple of 16 from 16 to 1048576. DeepSpeed's quantizer sizes its "
          "blocks below 8000 values and names 4096 the optimum. Read when an engine is created; it must be "
          "the same on every rank.");
DSM_PARAM(comm, QGZ_BLOCK, param::Int(0, int64_t(1) << 40, "a block size in values"), "1024",
          "Values per int4 block (one fp32 scale each) of ZeRO++ quantized gradient reductions "
          "(zero_quantized_gradients): a multiple of 16 from 16 to 1048576. DeepSpeed quantizes one row of a "
          "2-D gradient per block; libdsm reduces flat buckets, so the block is fixed. Read when an engine is "
          "created; it must be the same on every rank.");

void check_block(size_t block, const char *what) {
    DSM_REQUIRE(block >= kMinBlock && block <= kMaxBlock && block % kBlockMultiple == 0, DSM_ERR_INVALID_ARGUMENT,
                what, ": block size ", block, " is not a multiple of ", kBlockMultiple, " from ", kMinBlock, " to ",
                kMaxBlock);
}

void check_bits(int bits) {
    DSM_REQUIRE(bits == 4 || bits == 8, DSM_ERR_INVALID_ARGUMENT, "quantization to ", bits,
                " bits (expected 4 or 8)");
}

size_t weight_block() {
    const size_t b = static_cast<size_t>(param_QWZ_BLOCK().value());
    check_block(b, "environment DSM_QWZ_BLOCK");
    return b;
}

size_t gradient_block() {
    const size_t b = static_cast<size_t>(param_QGZ_BLOCK().value());
    check_block(b, "environment DSM_QGZ_BLOCK");
    return b;
}

size_t packed_bytes(size_t n, int bits, size_t block) noexcept {
    if (n == 0 || block == 0) return 0;
    const size_t blocks = (n + block - 1) / block;
    const size_t data = bits == 8 ? n : (n + 1) / 2;
    return blocks * sizeof(float) + (data + 3) / 4 * 4;
}

float error_bound(float amax, int bits) noexcept {
    const float qmax = bits == 8 ? 127.0f : 7.0f;
    // s / 2, plus the rounding of x * (qmax / amax) and of q * s: a few ulps of amax.
    return amax / qmax * 0.5f + amax * 8.0f * std::numeric_limits<float>::epsilon();
}

void check_args(dsm_dtype_t dtype, size_t n, int bits, size_t block, const void *a, const void *b) {
    check_bits(bits);
    check_block(block, "quantization");
    DSM_REQUIRE(dtype == DSM_FLOAT32 || dtype == DSM_FLOAT16 || dtype == DSM_BFLOAT16, DSM_ERR_INVALID_ARGUMENT,
                "quantization of dtype ", static_cast<int>(dtype), " (expected FLOAT32, FLOAT16 or BFLOAT16)");
    DSM_REQUIRE(n == 0 || (a != nullptr && b != nullptr), DSM_ERR_NULL_POINTER, "quantization of ", n,
                " values with a NULL buffer");
}

namespace {

simd::Dispatch<Kernels> g_isa{kernels<simd::Isa::generic>, kernels<simd::Isa::avx2>, kernels<simd::Isa::avx512>};

const Kernels &active() noexcept { return g_isa.active(); }

// One block of 16-bit values in fp32 (the kernels work in fp32).
float *scratch(size_t n) {
    thread_local std::vector<float> s;
    if (s.size() < n) s.resize(n);
    return s.data();
}

} // namespace

void quantize(const void *src, dsm_dtype_t dtype, size_t n, int bits, size_t block, void *dst) {
    check_args(dtype, n, bits, block, src, dst);
    if (n == 0) return;
    const Kernels &k = active();
    const size_t blocks = (n + block - 1) / block;
    float *scales = static_cast<float *>(dst);
    uint8_t *data = static_cast<uint8_t *>(dst) + blocks * sizeof(float);
    if (dtype == DSM_FLOAT32) {
        k.quantize(static_cast<const float *>(src), n, bits, block, scales, data);
        return;
    }
    const uint16_t *h = static_cast<const uint16_t *>(src);
    float *t = scratch(block);
    for (size_t b = 0; b < blocks; ++b) {
        const size_t b0 = b * block, m = std::min(block, n - b0);
        if (dtype == DSM_FLOAT16)
            for (size_t i = 0; i < m; ++i) t[i] = fp16_to_fp32(h[b0 + i]);
        else
            for (size_t i = 0; i < m; ++i) t[i] = bf16_to_fp32(h[b0 + i]);
        k.quantize(t, m, bits, block, scales + b, data + (bits == 8 ? b0 : b0 / 2));
    }
}

void dequantize(const void *src, size_t n, int bits, size_t block, void *dst, dsm_dtype_t dtype, bool accumulate) {
    check_args(dtype, n, bits, block, src, dst);
    DSM_REQUIRE(!accumulate || dtype == DSM_FLOAT32, DSM_ERR_INVALID_ARGUMENT,
                "dequantization adds into FLOAT32 values only");
    if (n == 0) return;
    const Kernels &k = active();
    const size_t blocks = (n + block - 1) / block;
    const float *scales = static_cast<const float *>(src);
    const uint8_t *data = static_cast<const uint8_t *>(src) + blocks * sizeof(float);
    if (dtype == DSM_FLOAT32) {
        k.dequantize(scales, data, n, bits, block, static_cast<float *>(dst),
                     accumulate ? static_cast<const float *>(dst) : nullptr);
        return;
    }
    uint16_t *h = static_cast<uint16_t *>(dst);
    float *t = scratch(block);
    for (size_t b = 0; b < blocks; ++b) {
        const size_t b0 = b * block, m = std::min(block, n - b0);
        k.dequantize(scales + b, data + (bits == 8 ? b0 : b0 / 2), m, bits, block, t, nullptr);
        if (dtype == DSM_FLOAT16)
            for (size_t i = 0; i < m; ++i) h[b0 + i] = fp32_to_fp16(t[i]);
        else
            for (size_t i = 0; i < m; ++i) h[b0 + i] = fp32_to_bf16(t[i]);
    }
}

void dequantize_part(const void *src, size_t n, int bits, size_t block, size_t from, size_t count, void *dst,
                     dsm_dtype_t dtype) {
    check_args(dtype, n, bits, block, src, dst);
    DSM_REQUIRE(from % block == 0 && from <= n && count <= n - from, DSM_ERR_INVALID_ARGUMENT, "dequantization of values ",
                from, " to ", from + count, " of ", n, " in blocks of ", block);
    if (count == 0) return;
    const size_t blocks = (n + block - 1) / block, b = from / block;
    const float *scales = static_cast<const float *>(src) + b;
    const uint8_t *data = static_cast<const uint8_t *>(src) + blocks * sizeof(float) + (bits == 8 ? from : from / 2);
    if (dtype == DSM_FLOAT32) {
        active().dequantize(scales, data, count, bits, block, static_cast<float *>(dst), nullptr);
        return;
    }
    // The 16-bit forms a block at a time, as in dequantize().
    uint16_t *h = static_cast<uint16_t *>(dst);
    float *t = scratch(block);
    for (size_t k = 0; k * block < count; ++k) {
        const size_t b0 = k * block, m = std::min(block, count - b0);
        active().dequantize(scales + k, data + (bits == 8 ? b0 : b0 / 2), m, bits, block, t, nullptr);
        if (dtype == DSM_FLOAT16)
            for (size_t i = 0; i < m; ++i) h[b0 + i] = fp32_to_fp16(t[i]);
        else
            for (size_t i = 0; i < m; ++i) h[b0 + i] = fp32_to_bf16(t[i]);
    }
}

void dequantize_add(const void *src, size_t n, int bits, size_t block, const float *add, float *dst) {
    check_args(DSM_FLOAT32, n, bits, block, src, dst);
    DSM_REQUIRE(n == 0 || add != nullptr, DSM_ERR_NULL_POINTER, "dequantization adding a NULL buffer");
    if (n == 0) return;
    const size_t blocks = (n + block - 1) / block;
    active().dequantize(static_cast<const float *>(src), static_cast<const uint8_t *>(src) + blocks * sizeof(float),
                         n, bits, block, dst, add);
}

const char *active_isa() noexcept { return active().name; }

#if DSM_HAVE_CUDA_KERNELS
namespace cuda {

void quantize(const float *x, size_t n, int bits, size_t block, void *dst, cudaStream_t stream) {
    check_args(DSM_FLOAT32, n, bits, block, x, dst);
    const int e = launch_quantize(x, n, bits, block, dst, stream);
    DSM_REQUIRE(e == 0, DSM_ERR_CUDA, "quantize kernel: ", error_string(e));
}

void dequantize(const void *src, size_t n, int bits, size_t block, float *out, bool accumulate, cudaStream_t stream) {
    check_args(DSM_FLOAT32, n, bits, block, src, out);
    const int e = launch_dequantize(src, n, bits, block, out, accumulate, stream);
    DSM_REQUIRE(e == 0, DSM_ERR_CUDA, "dequantize kernel: ", error_string(e));
}

} // namespace cuda
#endif

} // namespace quant
} // namespace comm
} // namespace dsm
