// What the CUDA kernel files share (optimizer_cuda.cu, reduce_cuda.cu,
// convert_cuda.cu, space_cuda.cu; each holds one concern, kernels_cuda.hpp
// declares their launchers): the element formats, the arithmetic that
// rounds as the CPU kernels do, and the launch helpers.
//
// Element-wise kernels (optimizers, conversions) run a grid-stride loop over
// groups of 4 elements with 16-byte (fp32) or 8-byte (fp16, bf16) vector
// loads and stores, after a scalar head that brings p to a 16-byte boundary,
// when every array is then aligned for its vector width; otherwise (arrays
// whose misalignments differ) every element goes through the scalar loop. An
// element's arithmetic is the same in both loops, so the split never changes
// a result.
//
// Everything is in an unnamed namespace: each .cu file keeps its own copies.
#pragma once

#include "optim/kernels_cuda.hpp"

#include "core/half.hpp"

#include <cstdint>
#include <initializer_list>

#include <cuda_runtime.h>

namespace dsm {
namespace cuda {
namespace {

using detail::Arrays;
using detail::Fmt;

constexpr unsigned kThreads = 256;  // threads per block of the element-wise kernels
constexpr size_t kMaxBlocks = 8192; // beyond this, threads loop (grid stride)

// ---------------------------------------------------------------- arithmetic
// The CPU kernels' operations (optim/kernels.hpp, portable set), each rounded
// once: __fmul_rn and __fadd_rn are never contracted into an FMA.

__device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }
// V::fma of the portable kernels: a * b + c with two roundings.
__device__ __forceinline__ float mad(float a, float b, float c) { return __fadd_rn(__fmul_rn(a, b), c); }
// V::fused: a * b + c rounded once (PyTorch's order, AdamOp with k.torch).
__device__ __forceinline__ float fused(float a, float b, float c) { return __fmaf_rn(a, b, c); }
__device__ __forceinline__ float div(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ float root(float a) { return __fsqrt_rn(a); }
// -1, 0 or +1; 0 for NaN (as the CPU's compare-and-mask).
__device__ __forceinline__ float signum(float x) { return static_cast<float>((x > 0.0f) - (x < 0.0f)); }

// ---------------------------------------------------------------- 16-bit formats
// core/half.hpp's conversions, the same functions on the device.

// Element formats: load/store one element at i, or the 4 at i (aligned for
// a vector of 4).
struct F32 {
    using T = float;
    static constexpr size_t kSize = 4;
    __device__ static float load(const T *p, size_t i) { return p[i]; }
    __device__ static void store(T *p, size_t i, float x) { p[i] = x; }
    __device__ static void load4(const T *p, size_t i, float (&x)[4]) {
        const float4 q = *reinterpret_cast<const float4 *>(p + i);
        x[0] = q.x;
        x[1] = q.y;
        x[2] = q.z;
        x[3] = q.w;
    }
    __device__ static void store4(T *p, size_t i, const float (&x)[4]) {
        *reinterpret_cast<float4 *>(p + i) = make_float4(x[0], x[1], x[2], x[3]);
    }
};

// The two 16-bit formats' conversions.
struct Fp16Bits {
    __device__ static float widen(uint16_t h) { return fp16_to_fp32(h); }
    __device__ static uint16_t narrow(float x) { return fp32_to_fp16(x); }
};
struct Bf16Bits {
    __device__ static float widen(uint16_t h) { return bf16_to_fp32(h); }
    __device__ static uint16_t narrow(float x) { return fp32_to_bf16(x); }
};

// fp16 or bf16 (B: its conversions); 4 elements are one 8-byte uint2,
// element i in the low half of the first word (the GPU is little-endian).
template <class B> struct Half {
    using T = uint16_t;
    static constexpr size_t kSize = 2;
    __device__ static float load(const T *p, size_t i) { return B::widen(p[i]); }
    __device__ static void store(T *p, size_t i, float x) { p[i] = B::narrow(x); }
    __device__ static void load4(const T *p, size_t i, float (&x)[4]) {
        const uint2 q = *reinterpret_cast<const uint2 *>(p + i);
        x[0] = B::widen(static_cast<uint16_t>(q.x & 0xffffu));
        x[1] = B::widen(static_cast<uint16_t>(q.x >> 16));
        x[2] = B::widen(static_cast<uint16_t>(q.y & 0xffffu));
        x[3] = B::widen(static_cast<uint16_t>(q.y >> 16));
    }
    __device__ static void store4(T *p, size_t i, const float (&x)[4]) {
        uint2 q;
        q.x = static_cast<uint32_t>(B::narrow(x[0])) | (static_cast<uint32_t>(B::narrow(x[1])) << 16);
        q.y = static_cast<uint32_t>(B::narrow(x[2])) | (static_cast<uint32_t>(B::narrow(x[3])) << 16);
        *reinterpret_cast<uint2 *>(p + i) = q;
    }
};
using F16 = Half<Fp16Bits>;
using BF16 = Half<Bf16Bits>;

// No 16-bit copy of p.
struct NoCopy {
    using T = uint16_t;
    static constexpr size_t kSize = 2;
    __device__ static void store(T *, size_t, float) {}
    __device__ static void store4(T *, size_t, const float (&)[4]) {}
};

// ---------------------------------------------------------------- multi-tensor
// One launch over a table of segments (optim/multi_tensor.hpp): block b

__device__ __forceinline__ const MtSeg &mt_find(const MtSeg *__restrict__ segs, unsigned nsegs, uint64_t c) {
    unsigned lo = 0, hi = nsegs - 1;
    while (lo < hi) {
        const unsigned mid = (lo + hi + 1) / 2;
        if (segs[mid].first_chunk <= c) lo = mid;
        else hi = mid - 1;
    }
    return segs[lo];
}


// ---------------------------------------------------------------- launch helpers

const char *launched() noexcept {
    const cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

const char *status(cudaError_t e) noexcept { return e == cudaSuccess ? nullptr : cudaGetErrorString(e); }

const char *const kBadFormat = "internal error: unknown element format";

// One array of an element-wise kernel: its address and element size (null:
// not used).
struct Span {
    const void *p;
    size_t es;
};

bool aligned_at(const Span &s, size_t i) noexcept {
    return (reinterpret_cast<uintptr_t>(s.p) + i * s.es) % (4 * s.es) == 0;
}

// The split into scalar head, vector groups and scalar tail: head elements
// bring the first array to its vector boundary; every other array must then
// be on its own, else no vector groups at all. Every pointer is aligned to
// its element size (checked by the callers).
struct Plan {
    size_t head = 0, nvec = 0;
};
Plan plan_for(size_t n, std::initializer_list<Span> spans) noexcept {
    Plan out;
    const Span *first = nullptr;
    for (const Span &s : spans)
        if (s.p != nullptr) {
            first = &s;
            break;
        }
    if (first == nullptr) return out;
    const size_t vb = 4 * first->es;
    const size_t head = ((vb - reinterpret_cast<uintptr_t>(first->p) % vb) % vb) / first->es;
    if (head >= n) return out;
    for (const Span &s : spans)
        if (s.p != nullptr && !aligned_at(s, head)) return out;
    out.head = head;
    out.nvec = (n - head) / 4;
    return out;
}

unsigned blocks_for(const Plan &pl, size_t n) noexcept {
    const size_t work = pl.nvec > n - 4 * pl.nvec ? pl.nvec : n - 4 * pl.nvec;
    size_t b = (work + kThreads - 1) / kThreads;
    if (b < 1) b = 1;
    if (b > kMaxBlocks) b = kMaxBlocks;
    return static_cast<unsigned>(b);
}

unsigned scalar_blocks(size_t n) noexcept {
    const size_t b = (n + kThreads - 1) / kThreads;
    return static_cast<unsigned>(b < kMaxBlocks ? b : kMaxBlocks);
}

} // namespace
} // namespace cuda
} // namespace dsm
