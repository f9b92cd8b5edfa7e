// CUDA kernels of blockwise quantization (quantize_cuda.hpp).
#include "comm/quantize_cuda.hpp"

#include <cstdint>

#include <cuda_runtime.h>

#include "core/half.hpp"

namespace dsm {
namespace comm {
namespace quant {
namespace cuda {
namespace {

constexpr unsigned kThreads = 256;

// The values' formats (quantize_cuda.hpp: kF32, kF16, kBF16): 16-bit values
// are read and written through core/half.hpp's conversions, the host's.
template <int F> __device__ float load(const void *p, size_t i) {
    if (F == kF32) return static_cast<const float *>(p)[i];
    const uint16_t h = static_cast<const uint16_t *>(p)[i];
    return F == kF16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
}
template <int F> __device__ void store(void *p, size_t i, float v) {
    if (F == kF32) static_cast<float *>(p)[i] = v;
    else static_cast<uint16_t *>(p)[i] = F == kF16 ? fp32_to_fp16(v) : fp32_to_bf16(v);
}

// The block's largest magnitude and whether it holds an Inf or a NaN.
template <int F> __device__ void block_amax(const void *x, size_t b0, size_t m, float *amax, bool *bad) {
    __shared__ float smax[kThreads / 32];
    __shared__ int sbad[kThreads / 32];
    float v = 0.0f;
    int b = 0;
    for (size_t i = threadIdx.x; i < m; i += blockDim.x) {
        const float xi = load<F>(x, b0 + i);
        const float a = fabsf(xi);
        b |= !isfinite(xi);
        v = a > v ? a : v;
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float w = __shfl_down_sync(0xffffffffu, v, o);
        v = w > v ? w : v;
        b |= __shfl_down_sync(0xffffffffu, b, o);
    }
    if ((threadIdx.x & 31) == 0) {
        smax[threadIdx.x / 32] = v;
        sbad[threadIdx.x / 32] = b;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float m0 = 0.0f;
        int b0 = 0;
        for (unsigned w = 0; w < blockDim.x / 32; ++w) {
            m0 = smax[w] > m0 ? smax[w] : m0;
            b0 |= sbad[w];
        }
        smax[0] = m0;
        sbad[0] = b0;
    }
    __syncthreads();
    *amax = smax[0];
    *bad = sbad[0] != 0;
}

__device__ int q1(float x, float inv, float qmax) {
    float v = __fmul_rn(x, inv);
    v = v > -qmax ? v : -qmax;
    v = v < qmax ? v : qmax;
    return static_cast<int>(rintf(v));
}

template <int F>
__global__ void __launch_bounds__(kThreads)
quantize_kernel(const void *x, size_t n, int bits, size_t block, float *scales, uint8_t *data) {
    const size_t b0 = static_cast<size_t>(blockIdx.x) * block;
    const size_t m = n - b0 < block ? n - b0 : block;
    float amax;
    bool bad;
    block_amax<F>(x, b0, m, &amax, &bad);
    const float qmax = bits == 8 ? 127.0f : 7.0f;
    float s = 0.0f, inv = 0.0f;
    if (bad) s = __int_as_float(0x7fc00000);
    else if (amax > 0.0f) {
        s = __fdiv_rn(amax, qmax);
        inv = __fdiv_rn(qmax, amax);
    }
    if (threadIdx.x == 0) scales[blockIdx.x] = s;
    if (bits == 8) {
        int8_t *q = reinterpret_cast<int8_t *>(data) + b0;
        for (size_t i = threadIdx.x; i < m; i += blockDim.x) q[i] = bad ? 0 : static_cast<int8_t>(q1(load<F>(x, b0 + i), inv, qmax));
    } else {
        uint8_t *q = data + b0 / 2;
        for (size_t j = threadIdx.x; 2 * j < m; j += blockDim.x) {
            const int lo = bad ? 0 : q1(load<F>(x, b0 + 2 * j), inv, qmax);
            const int hi = bad || 2 * j + 1 >= m ? 0 : q1(load<F>(x, b0 + 2 * j + 1), inv, qmax);
            q[j] = static_cast<uint8_t>((lo & 0x0F) | ((hi & 0x0F) << 4));
        }
    }
}

__device__ float nibble(unsigned v) { return static_cast<float>(static_cast<int>(v ^ 8u) - 8); }

template <int F>
__global__ void __launch_bounds__(kThreads)
dequantize_kernel(const float *scales, const uint8_t *data, size_t n, int bits, size_t block, void *out,
                  bool accumulate) {
    const size_t b0 = static_cast<size_t>(blockIdx.x) * block;
    const size_t m = n - b0 < block ? n - b0 : block;
    const float s = scales[blockIdx.x];
    for (size_t i = threadIdx.x; i < m; i += blockDim.x) {
        float q;
        if (bits == 8) q = static_cast<float>(reinterpret_cast<const int8_t *>(data)[b0 + i]);
        else {
            const uint8_t byte = data[(b0 + i) / 2];
            q = nibble(i % 2 ? byte >> 4 : byte & 0x0Fu);
        }
        const float v = __fmul_rn(q, s);
        if (F == kF32 && accumulate) static_cast<float *>(out)[b0 + i] = __fadd_rn(static_cast<float *>(out)[b0 + i], v);
        else store<F>(out, b0 + i, v);
    }
}

template <int F> __global__ void widen_kernel(const void *x, size_t n, float *out) {
    for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<size_t>(gridDim.x) * blockDim.x)
        out[i] = load<F>(x, i);
}

} // namespace

int launch_quantize(const float *x, size_t n, int bits, size_t block, void *dst, cudaStream_t stream) {
    return launch_quantize_as(x, kF32, n, bits, block, dst, stream);
}

int launch_dequantize(const void *src, size_t n, int bits, size_t block, float *out, bool accumulate,
                      cudaStream_t stream) {
    return launch_dequantize_as(src, n, bits, block, out, kF32, accumulate, stream);
}

int launch_quantize_as(const void *x, int format, size_t n, int bits, size_t block, void *dst, cudaStream_t stream) {
    if (n == 0) return 0;
    const size_t blocks = (n + block - 1) / block;
    float *scales = static_cast<float *>(dst);
    uint8_t *data = static_cast<uint8_t *>(dst) + blocks * sizeof(float);
    const unsigned g = static_cast<unsigned>(blocks);
    if (format == kF16) quantize_kernel<kF16><<<g, kThreads, 0, stream>>>(x, n, bits, block, scales, data);
    else if (format == kBF16) quantize_kernel<kBF16><<<g, kThreads, 0, stream>>>(x, n, bits, block, scales, data);
    else quantize_kernel<kF32><<<g, kThreads, 0, stream>>>(x, n, bits, block, scales, data);
    return static_cast<int>(cudaGetLastError());
}

int launch_dequantize_as(const void *src, size_t n, int bits, size_t block, void *out, int format, bool accumulate,
                         cudaStream_t stream) {
    if (n == 0) return 0;
    const size_t blocks = (n + block - 1) / block;
    const float *scales = static_cast<const float *>(src);
    const uint8_t *data = static_cast<const uint8_t *>(src) + blocks * sizeof(float);
    const unsigned g = static_cast<unsigned>(blocks);
    if (format == kF16)
        dequantize_kernel<kF16><<<g, kThreads, 0, stream>>>(scales, data, n, bits, block, out, false);
    else if (format == kBF16)
        dequantize_kernel<kBF16><<<g, kThreads, 0, stream>>>(scales, data, n, bits, block, out, false);
    else
        dequantize_kernel<kF32><<<g, kThreads, 0, stream>>>(scales, data, n, bits, block, out, accumulate);
    return static_cast<int>(cudaGetLastError());
}

int launch_widen(const void *x, int format, size_t n, float *out, cudaStream_t stream) {
    if (n == 0) return 0;
    const size_t want = (n + kThreads - 1) / kThreads;
    const unsigned g = static_cast<unsigned>(want < 65535 ? want : 65535);
    if (format == kF16) widen_kernel<kF16><<<g, kThreads, 0, stream>>>(x, n, out);
    else if (format == kBF16) widen_kernel<kBF16><<<g, kThreads, 0, stream>>>(x, n, out);
    else return static_cast<int>(cudaMemcpyAsync(out, x, n * sizeof(float), cudaMemcpyDeviceToDevice, stream));
    return static_cast<int>(cudaGetLastError());
}

const char *error_string(int error) { return cudaGetErrorString(static_cast<cudaError_t>(error)); }

} // namespace cuda
} // namespace quant
} // namespace comm
} // namespace dsm
