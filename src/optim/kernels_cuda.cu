// The CUDA kernels (see kernels_cuda.hpp for what each computes and why the
// results are the CPU's bits).
//
// Element-wise kernels (optimizers, conversions) run a grid-stride loop over
// groups of 4 elements with 16-byte (fp32) or 8-byte (fp16, bf16) vector
// loads and stores, after a scalar head that brings p to a 16-byte boundary,
// when every array is then aligned for its vector width; otherwise (arrays
// whose misalignments differ) every element goes through the scalar loop. An
// element's arithmetic is the same in both loops, so the split never changes
// a result.
//
// Reductions (inspect, Lamb pass 1) use a fixed grid (kReduceBlocks blocks of
// kReduceThreads threads); thread t takes the groups of 4 elements
// t, t + T, t + 2T, ... (T = all threads) in order, vector loads only when
// the arrays are aligned at element 0, and adds its terms in element order;
// each block adds its threads' sums in a fixed tree; a second kernel of one
// block adds the block sums in block order. No atomics, and the same bits for
// the same input on every run, device and address.
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

// ---------------------------------------------------------------- optimizer steps
// One element: p, the gradient g (already widened to fp32, not yet scaled)
// and up to two states. Each mirrors the body of the same name in
// optim/kernels.hpp operation for operation.

struct AdamOp {
    static constexpr bool kGrad = true, kWriteStates = true;
    static constexpr int kStates = 2;
    optim::AdamK k;
    __device__ void operator()(float &p, float g, float &m, float &v) const {
        float gr = mul(g, k.scale);
        gr = mad(k.l2, p, gr);
        const float mr = mad(k.omb1, gr, mul(k.b1, m));
        const float vr = mad(k.omb2, mul(gr, gr), mul(k.b2, v));
        const float den = mad(root(vr), k.ibc2, k.eps);
        float pr = mad(k.decay, p, p);
        pr = mad(k.step, div(mr, den), pr);
        p = pr;
        m = mr;
        v = vr;
    }
};

template <int Mode> struct SgdOp {
    static constexpr bool kGrad = true, kWriteStates = true;
    static constexpr int kStates = Mode > 0 ? 1 : 0;
    optim::SgdK k;
    __device__ void operator()(float &p, float g, float &buf, float &) const {
        float gr = mad(k.wd, p, mul(g, k.scale));
        if constexpr (Mode > 0) {
            const float br = mad(k.damp, gr, mul(k.mom, buf));
            buf = br;
            gr = Mode == 2 ? mad(k.nesterov, br, gr) : br;
        }
        p = mad(k.neg_lr, gr, p);
    }
};

struct LionOp {
    static constexpr bool kGrad = true, kWriteStates = true;
    static constexpr int kStates = 1;
    optim::LionK k;
    __device__ void operator()(float &p, float g, float &m, float &) const {
        const float gr = mul(g, k.scale);
        const float mr = m;
        const float c = mad(k.omb1, gr, mul(k.b1, mr));
        p = mad(p, k.keep, mul(k.neg_lr, signum(c)));
        m = mad(k.omb2, gr, mul(k.b2, mr));
    }
};

struct AdagradOp {
    static constexpr bool kGrad = true, kWriteStates = true;
    static constexpr int kStates = 1;
    optim::AdagradK k;
    __device__ void operator()(float &p, float g, float &sum, float &) const {
        const float gr = mad(k.wd, p, mul(g, k.scale));
        const float sr = mad(gr, gr, sum);
        const float den = add(root(sr), k.eps);
        p = mad(k.neg_clr, div(gr, den), p);
        sum = sr;
    }
};

// Lamb's u, as lamb_u() of optim/kernels.hpp.
__device__ __forceinline__ float lamb_u(const optim::LambK &k, float p, float m, float v) {
    const float den = add(root(v), k.eps);
    return mad(k.wd, p, div(m, den));
}

struct Lamb2Op {
    static constexpr bool kGrad = false, kWriteStates = false; // reads m and v
    static constexpr int kStates = 2;
    optim::LambK k;
    float neg_coef;
    __device__ void operator()(float &p, float, float &m, float &v) const {
        p = mad(neg_coef, lamb_u(k, p, m, v), p);
    }
};

template <class Op, class G, class C>
__global__ void __launch_bounds__(kThreads)
    update_kernel(const Op op, float *__restrict__ p, const typename G::T *__restrict__ g, float *__restrict__ s0,
                  float *__restrict__ s1, typename C::T *__restrict__ c, size_t n, size_t head, size_t nvec) {
    const size_t tid = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
    const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
    for (size_t q = tid; q < nvec; q += stride) {
        const size_t i = head + 4 * q;
        float pv[4], gv[4] = {0.0f, 0.0f, 0.0f, 0.0f}, a[4] = {0.0f, 0.0f, 0.0f, 0.0f},
                     b[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        F32::load4(p, i, pv);
        if constexpr (Op::kGrad) G::load4(g, i, gv);
        if constexpr (Op::kStates > 0) F32::load4(s0, i, a);
        if constexpr (Op::kStates > 1) F32::load4(s1, i, b);
#pragma unroll
        for (int j = 0; j < 4; ++j) op(pv[j], gv[j], a[j], b[j]);
        F32::store4(p, i, pv);
        if constexpr (Op::kWriteStates && Op::kStates > 0) F32::store4(s0, i, a);
        if constexpr (Op::kWriteStates && Op::kStates > 1) F32::store4(s1, i, b);
        C::store4(c, i, pv);
    }
    // The scalar head [0, head) and tail [head + 4 nvec, n).
    const size_t rest = n - 4 * nvec;
    for (size_t t = tid; t < rest; t += stride) {
        const size_t i = t < head ? t : t + 4 * nvec;
        float pv = p[i], gv = 0.0f, a = 0.0f, b = 0.0f;
        if constexpr (Op::kGrad) gv = G::load(g, i);
        if constexpr (Op::kStates > 0) a = s0[i];
        if constexpr (Op::kStates > 1) b = s1[i];
        op(pv, gv, a, b);
        p[i] = pv;
        if constexpr (Op::kWriteStates && Op::kStates > 0) s0[i] = a;
        if constexpr (Op::kWriteStates && Op::kStates > 1) s1[i] = b;
        C::store(c, i, pv);
    }
}

// ---------------------------------------------------------------- multi-tensor
// One launch over a table of segments (optim/multi_tensor.hpp): block b
// takes chunks b, b + grid, ... of kMtChunk elements, finds each chunk's
// segment (the per-chunk index, else a binary search), and runs
// update_kernel's loops on the chunk
// with the chunk's own split into scalar head, vector groups and scalar tail
// (the arithmetic of an element is the same in every loop, so the bits are
// the per-tensor kernel's).

__device__ __forceinline__ const MtSeg &mt_find(const MtSeg *__restrict__ segs, unsigned nsegs, uint64_t c) {
    unsigned lo = 0, hi = nsegs - 1;
    while (lo < hi) {
        const unsigned mid = (lo + hi + 1) / 2;
        if (segs[mid].first_chunk <= c) lo = mid;
        else hi = mid - 1;
    }
    return segs[lo];
}

// The split of plan_for() on the device, for arrays at element `b`.
__device__ __forceinline__ bool mt_vec_ok(const void *x, size_t es, size_t i) {
    return x == nullptr || (reinterpret_cast<uintptr_t>(x) + i * es) % (4 * es) == 0;
}

template <class Op, class G, class C>
__global__ void __launch_bounds__(kThreads)
    mt_update_kernel(const Op on, const Op off, const MtSeg *__restrict__ segs,
                     const uint32_t *__restrict__ chunk_seg, unsigned nsegs, uint64_t chunks, float *__restrict__ p,
                     typename G::T *__restrict__ g, float *__restrict__ s0, float *__restrict__ s1,
                     typename C::T *__restrict__ c, bool zero) {
    const float zeros[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (uint64_t ch = blockIdx.x; ch < chunks; ch += gridDim.x) {
        const MtSeg sg = chunk_seg != nullptr ? segs[chunk_seg[ch]] : mt_find(segs, nsegs, ch);
        const uint64_t local = (ch - sg.first_chunk) * kMtChunk;
        const size_t b = sg.offset + local;
        const size_t n = sg.count - local < kMtChunk ? sg.count - local : kMtChunk;
        const Op op = (sg.aux & kMtDecay) != 0 ? on : off;
        float *pp = p + b;
        typename G::T *gg = Op::kGrad ? g + b : nullptr;
        float *a0 = Op::kStates > 0 ? s0 + b : nullptr;
        float *a1 = Op::kStates > 1 ? s1 + b : nullptr;
        typename C::T *cc = c != nullptr ? c + b : nullptr;
        size_t head = ((16 - reinterpret_cast<uintptr_t>(pp) % 16) % 16) / 4, nvec = 0;
        if (head < n && mt_vec_ok(gg, G::kSize, head) && mt_vec_ok(a0, 4, head) && mt_vec_ok(a1, 4, head) &&
            mt_vec_ok(cc, C::kSize, head))
            nvec = (n - head) / 4;
        else
            head = 0;
        for (size_t q = threadIdx.x; q < nvec; q += blockDim.x) {
            const size_t i = head + 4 * q;
            float pv[4], gv[4] = {0.0f, 0.0f, 0.0f, 0.0f}, x[4] = {0.0f, 0.0f, 0.0f, 0.0f},
                         y[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            F32::load4(pp, i, pv);
            if constexpr (Op::kGrad) G::load4(gg, i, gv);
            if constexpr (Op::kStates > 0) F32::load4(a0, i, x);
            if constexpr (Op::kStates > 1) F32::load4(a1, i, y);
#pragma unroll
            for (int j = 0; j < 4; ++j) op(pv[j], gv[j], x[j], y[j]);
            F32::store4(pp, i, pv);
            if constexpr (Op::kWriteStates && Op::kStates > 0) F32::store4(a0, i, x);
            if constexpr (Op::kWriteStates && Op::kStates > 1) F32::store4(a1, i, y);
            C::store4(cc, i, pv);
            if constexpr (Op::kGrad)
                if (zero) G::store4(gg, i, zeros);
        }
        const size_t rest = n - 4 * nvec;
        for (size_t t = threadIdx.x; t < rest; t += blockDim.x) {
            const size_t i = t < head ? t : t + 4 * nvec;
            float pv = pp[i], gv = 0.0f, x = 0.0f, y = 0.0f;
            if constexpr (Op::kGrad) gv = G::load(gg, i);
            if constexpr (Op::kStates > 0) x = a0[i];
            if constexpr (Op::kStates > 1) y = a1[i];
            op(pv, gv, x, y);
            pp[i] = pv;
            if constexpr (Op::kWriteStates && Op::kStates > 0) a0[i] = x;
            if constexpr (Op::kWriteStates && Op::kStates > 1) a1[i] = y;
            C::store(cc, i, pv);
            if constexpr (Op::kGrad)
                if (zero) G::store(gg, i, 0.0f);
        }
    }
}

// dst += a * src per segment (src at the segment's aux), each element as
// axpy_kernel (fp32 dst) or convert, axpy, convert (16-bit dst) compute it.
struct MtParamTable {
    MtSeg segs[detail::kMtParamSegs];
    unsigned nsegs;
    uint64_t chunks;
};

template <class S, class D>
__global__ void __launch_bounds__(kThreads)
    mt_axpy_kernel(const MtParamTable t, typename D::T *__restrict__ dst, float a) {
    for (uint64_t ch = blockIdx.x; ch < t.chunks; ch += gridDim.x) {
        const MtSeg &sg = mt_find(t.segs, t.nsegs, ch);
        const uint64_t local = (ch - sg.first_chunk) * kMtChunk;
        const size_t n = sg.count - local < kMtChunk ? sg.count - local : kMtChunk;
        const auto *src = reinterpret_cast<const typename S::T *>(static_cast<uintptr_t>(sg.aux)) + local;
        typename D::T *d = dst + sg.offset + local;
        for (size_t i = threadIdx.x; i < n; i += blockDim.x) D::store(d, i, add(D::load(d, i), mul(a, S::load(src, i))));
    }
}

// ---------------------------------------------------------------- the bound
// Streaming kernels that move the bytes of an update with clipping (see
// launch_bound): vector loads and stores of 4 elements, grid-stride.

template <class G>
__global__ void __launch_bounds__(kThreads) bound_norm_kernel(const typename G::T *__restrict__ g, size_t n,
                                                              float *__restrict__ partial) {
    __shared__ float sh[kThreads];
    const size_t tid = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
    const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
    float acc = 0.0f;
    for (size_t q = tid; q < n / 4; q += stride) {
        float x[4];
        G::load4(g, 4 * q, x);
        acc += x[0] * x[0] + x[1] * x[1] + x[2] * x[2] + x[3] * x[3];
    }
    for (size_t i = 4 * (n / 4) + tid; i < n; i += stride) {
        const float x = G::load(g, i);
        acc += x * x;
    }
    sh[threadIdx.x] = acc;
    __syncthreads();
    for (unsigned s = kThreads / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[blockIdx.x] = sh[0];
}

template <class G, class C>
__global__ void __launch_bounds__(kThreads)
    bound_update_kernel(typename G::T *__restrict__ g, float *__restrict__ p, float *__restrict__ m,
                        float *__restrict__ v, typename C::T *__restrict__ c, size_t n) {
    const size_t tid = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
    const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
    const float zeros[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (size_t q = tid; q < n / 4; q += stride) {
        const size_t i = 4 * q;
        float gv[4], pv[4], mv[4], vv[4];
        G::load4(g, i, gv);
        F32::load4(p, i, pv);
        F32::load4(m, i, mv);
        F32::load4(v, i, vv);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            pv[j] += 1e-6f * gv[j];
            mv[j] = 0.9f * mv[j] + gv[j];
            vv[j] = 0.9f * vv[j] + gv[j] * gv[j];
        }
        F32::store4(p, i, pv);
        F32::store4(m, i, mv);
        F32::store4(v, i, vv);
        C::store4(c, i, pv);
        G::store4(g, i, zeros);
    }
    for (size_t i = 4 * (n / 4) + tid; i < n; i += stride) {
        const float gi = G::load(g, i);
        p[i] += 1e-6f * gi;
        m[i] = 0.9f * m[i] + gi;
        v[i] = 0.9f * v[i] + gi * gi;
        C::store(c, i, p[i]);
        G::store(g, i, 0.0f);
    }
}

// ---------------------------------------------------------------- conversions

template <class S, class D>
__global__ void __launch_bounds__(kThreads)
    convert_kernel(const typename S::T *__restrict__ src, typename D::T *__restrict__ dst, size_t n, size_t head,
                   size_t nvec) {
    const size_t tid = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
    const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
    for (size_t q = tid; q < nvec; q += stride) {
        const size_t i = head + 4 * q;
        float x[4];
        S::load4(src, i, x);
        D::store4(dst, i, x);
    }
    const size_t rest = n - 4 * nvec;
    for (size_t t = tid; t < rest; t += stride) {
        const size_t i = t < head ? t : t + 4 * nvec;
        D::store(dst, i, S::load(src, i));
    }
}

// ---------------------------------------------------------------- reductions

// The sum of x over the block's threads, in a fixed tree; every thread gets it.
__device__ double block_sum(double x, double *sh) {
    const unsigned t = threadIdx.x;
    sh[t] = x;
    __syncthreads();
    for (unsigned s = kReduceThreads / 2; s > 0; s >>= 1) {
        if (t < s) sh[t] = __dadd_rn(sh[t], sh[t + s]);
        __syncthreads();
    }
    const double r = sh[0];
    __syncthreads(); // sh is reused by the next call
    return r;
}

constexpr size_t kReduceStride = static_cast<size_t>(kReduceBlocks) * kReduceThreads;

__device__ __forceinline__ size_t groups_of(size_t n) { return n / 4 + (n % 4 != 0 ? 1 : 0); }

template <class G>
__global__ void __launch_bounds__(kReduceThreads)
    inspect_kernel(const typename G::T *__restrict__ x, size_t n, double scale, bool vec, Reduction *__restrict__ r) {
    __shared__ double sh[kReduceThreads];
    const size_t tid = blockIdx.x * static_cast<size_t>(kReduceThreads) + threadIdx.x;
    double acc = 0.0;
    unsigned bad = 0;
    const size_t groups = groups_of(n);
    for (size_t q = tid; q < groups; q += kReduceStride) {
        const size_t i = 4 * q, cnt = n - i < 4 ? n - i : 4;
        float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (vec && cnt == 4)
            G::load4(x, i, v);
        else
            for (size_t j = 0; j < cnt; ++j) v[j] = G::load(x, i + j);
        for (size_t j = 0; j < cnt; ++j) {
            bad |= (__float_as_uint(v[j]) & 0x7f800000u) == 0x7f800000u ? 1u : 0u;
            const double d = __dmul_rn(static_cast<double>(v[j]), scale); // exact: 24 x 24 bits
            acc = __dadd_rn(acc, __dmul_rn(d, d));
        }
    }
    acc = block_sum(acc, sh);
    bad = __syncthreads_or(bad != 0) ? 1u : 0u;
    if (threadIdx.x == 0) {
        r->block_sum[0][blockIdx.x] = acc;
        r->block_sum[1][blockIdx.x] = 0.0;
        r->block_nonfinite[blockIdx.x] = bad;
    }
}

// Lamb pass 1, as lamb1_run() of optim/kernels.hpp element by element.
template <class G>
__global__ void __launch_bounds__(kReduceThreads)
    lamb1_kernel(const optim::LambK k, const float *__restrict__ p, const typename G::T *__restrict__ g,
                 float *__restrict__ m, float *__restrict__ v, size_t n, bool vec, Reduction *__restrict__ r) {
    __shared__ double sh[kReduceThreads];
    const size_t tid = blockIdx.x * static_cast<size_t>(kReduceThreads) + threadIdx.x;
    double w2 = 0.0, u2 = 0.0;
    const size_t groups = groups_of(n);
    for (size_t q = tid; q < groups; q += kReduceStride) {
        const size_t i = 4 * q, cnt = n - i < 4 ? n - i : 4;
        const bool whole = vec && cnt == 4;
        float pv[4] = {0.0f, 0.0f, 0.0f, 0.0f}, gv[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        float mv[4] = {0.0f, 0.0f, 0.0f, 0.0f}, vv[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (whole) {
            F32::load4(p, i, pv);
            G::load4(g, i, gv);
            F32::load4(m, i, mv);
            F32::load4(v, i, vv);
        } else {
            for (size_t j = 0; j < cnt; ++j) {
                pv[j] = p[i + j];
                gv[j] = G::load(g, i + j);
                mv[j] = m[i + j];
                vv[j] = v[i + j];
            }
        }
        for (size_t j = 0; j < cnt; ++j) {
            const float gr = mul(gv[j], k.scale);
            mv[j] = mad(k.omb1, gr, mul(k.b1, mv[j]));
            vv[j] = mad(k.omb2, mul(gr, gr), mul(k.b2, vv[j]));
            const double pd = static_cast<double>(pv[j]);
            const double ud = static_cast<double>(lamb_u(k, pv[j], mv[j], vv[j]));
            w2 = __dadd_rn(w2, __dmul_rn(pd, pd));
            u2 = __dadd_rn(u2, __dmul_rn(ud, ud));
        }
        if (whole) {
            F32::store4(m, i, mv);
            F32::store4(v, i, vv);
        } else {
            for (size_t j = 0; j < cnt; ++j) {
                m[i + j] = mv[j];
                v[i + j] = vv[j];
            }
        }
    }
    w2 = block_sum(w2, sh);
    u2 = block_sum(u2, sh);
    if (threadIdx.x == 0) {
        r->block_sum[0][blockIdx.x] = w2;
        r->block_sum[1][blockIdx.x] = u2;
        r->block_nonfinite[blockIdx.x] = 0;
    }
}

// The block sums in block order (each thread a fixed stride of blocks, then
// the tree), into r->result.
__global__ void __launch_bounds__(kReduceThreads) finish_kernel(Reduction *__restrict__ r) {
    __shared__ double sh[kReduceThreads];
    for (int s = 0; s < 2; ++s) {
        double acc = 0.0;
        for (unsigned b = threadIdx.x; b < kReduceBlocks; b += kReduceThreads) acc = __dadd_rn(acc, r->block_sum[s][b]);
        acc = block_sum(acc, sh);
        if (threadIdx.x == 0) r->result.sum[s] = acc;
    }
    unsigned bad = 0;
    for (unsigned b = threadIdx.x; b < kReduceBlocks; b += kReduceThreads) bad |= r->block_nonfinite[b];
    bad = __syncthreads_or(bad != 0) ? 1u : 0u;
    if (threadIdx.x == 0) {
        r->result.nonfinite = bad;
        r->result.reserved = 0;
    }
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

template <class Op, class G, class C>
const char *run_update(const Op &op, const Arrays &a, float *s0, float *s1, cudaStream_t stream) noexcept {
    const Plan pl = plan_for(a.n, {Span{a.p, 4}, Span{Op::kGrad ? a.g : nullptr, G::kSize}, Span{s0, 4},
                                   Span{s1, 4}, Span{a.p16, C::kSize}});
    update_kernel<Op, G, C><<<blocks_for(pl, a.n), kThreads, 0, stream>>>(
        op, a.p, static_cast<const typename G::T *>(a.g), s0, s1, static_cast<typename C::T *>(a.p16), a.n, pl.head,
        pl.nvec);
    return launched();
}

// The kernel for a's 16-bit copy, then for its gradient format.
template <class Op, class G>
const char *with_copy(const Op &op, const Arrays &a, float *s0, float *s1, cudaStream_t stream) noexcept {
    switch (a.p16_fmt) {
    case Fmt::NONE: return run_update<Op, G, NoCopy>(op, a, s0, s1, stream);
    case Fmt::F16: return run_update<Op, G, F16>(op, a, s0, s1, stream);
    case Fmt::BF16: return run_update<Op, G, BF16>(op, a, s0, s1, stream);
    default: return kBadFormat;
    }
}

template <class Op>
const char *update(const Op &op, const Arrays &a, float *s0, float *s1, cudaStream_t stream) noexcept {
    if (a.n == 0) return nullptr;
    switch (a.g_fmt) {
    case Fmt::F32: return with_copy<Op, F32>(op, a, s0, s1, stream);
    case Fmt::F16: return with_copy<Op, F16>(op, a, s0, s1, stream);
    case Fmt::BF16: return with_copy<Op, BF16>(op, a, s0, s1, stream);
    default: return kBadFormat;
    }
}

template <class Op, class G, class C>
const char *run_mt(const Op &on, const Op &off, const detail::MtArrays &a, cudaStream_t stream) noexcept {
    mt_update_kernel<Op, G, C><<<mt_blocks(a.chunks), kThreads, 0, stream>>>(
        on, off, a.segs, a.chunk_seg, a.nsegs, a.chunks, a.p, static_cast<typename G::T *>(const_cast<void *>(a.g)), a.s0, a.s1,
        static_cast<typename C::T *>(a.p16), a.zero_grads);
    return launched();
}

template <class Op, class G>
const char *mt_with_copy(const Op &on, const Op &off, const detail::MtArrays &a, cudaStream_t stream) noexcept {
    switch (a.p16_fmt) {
    case Fmt::NONE: return run_mt<Op, G, NoCopy>(on, off, a, stream);
    case Fmt::F16: return run_mt<Op, G, F16>(on, off, a, stream);
    case Fmt::BF16: return run_mt<Op, G, BF16>(on, off, a, stream);
    default: return kBadFormat;
    }
}

template <class Op>
const char *mt_update(const Op &on, const Op &off, const detail::MtArrays &a, cudaStream_t stream) noexcept {
    if (a.chunks == 0 || a.nsegs == 0) return nullptr;
    switch (a.g_fmt) {
    case Fmt::F32: return mt_with_copy<Op, F32>(on, off, a, stream);
    case Fmt::F16: return mt_with_copy<Op, F16>(on, off, a, stream);
    case Fmt::BF16: return mt_with_copy<Op, BF16>(on, off, a, stream);
    default: return kBadFormat;
    }
}

template <class S>
const char *mt_axpy_from(void *dst, Fmt df, const MtParamTable &t, float a, cudaStream_t s) noexcept {
    const unsigned blocks = mt_blocks(t.chunks);
    switch (df) {
    case Fmt::F32: mt_axpy_kernel<S, F32><<<blocks, kThreads, 0, s>>>(t, static_cast<float *>(dst), a); break;
    case Fmt::F16: mt_axpy_kernel<S, F16><<<blocks, kThreads, 0, s>>>(t, static_cast<uint16_t *>(dst), a); break;
    case Fmt::BF16: mt_axpy_kernel<S, BF16><<<blocks, kThreads, 0, s>>>(t, static_cast<uint16_t *>(dst), a); break;
    default: return kBadFormat;
    }
    return launched();
}

template <class S, class D>
const char *run_convert(const void *src, void *dst, size_t n, cudaStream_t stream) noexcept {
    const Plan pl = plan_for(n, {Span{src, S::kSize}, Span{dst, D::kSize}});
    convert_kernel<S, D><<<blocks_for(pl, n), kThreads, 0, stream>>>(
        static_cast<const typename S::T *>(src), static_cast<typename D::T *>(dst), n, pl.head, pl.nvec);
    return launched();
}

template <class S> const char *convert_from(const void *src, void *dst, Fmt df, size_t n, cudaStream_t stream) noexcept {
    switch (df) {
    case Fmt::F32: return run_convert<S, F32>(src, dst, n, stream);
    case Fmt::F16: return run_convert<S, F16>(src, dst, n, stream);
    case Fmt::BF16: return run_convert<S, BF16>(src, dst, n, stream);
    default: return kBadFormat;
    }
}

template <class G>
const char *run_inspect(const void *x, size_t n, float inv_scale, Reduction *out, cudaStream_t stream) noexcept {
    const bool vec = x != nullptr && aligned_at(Span{x, G::kSize}, 0);
    inspect_kernel<G><<<kReduceBlocks, kReduceThreads, 0, stream>>>(static_cast<const typename G::T *>(x), n,
                                                                    static_cast<double>(inv_scale), vec, out);
    if (const char *err = launched()) return err;
    finish_kernel<<<1, kReduceThreads, 0, stream>>>(out);
    return launched();
}

template <class G>
const char *run_lamb1(const optim::LambK &k, const Arrays &a, float *m, float *v, Reduction *out,
                      cudaStream_t stream) noexcept {
    const bool vec = a.n > 0 && aligned_at(Span{a.p, 4}, 0) && aligned_at(Span{a.g, G::kSize}, 0) &&
                     aligned_at(Span{m, 4}, 0) && aligned_at(Span{v, 4}, 0);
    lamb1_kernel<G><<<kReduceBlocks, kReduceThreads, 0, stream>>>(k, a.p, static_cast<const typename G::T *>(a.g), m,
                                                                  v, a.n, vec, out);
    if (const char *err = launched()) return err;
    finish_kernel<<<1, kReduceThreads, 0, stream>>>(out);
    return launched();
}


// ---------------------------------------------------------------- the device space's small kernels
// Scalar grid-stride loops (memory-bound and off the optimizer's path): the
// scale of 16- and 32-bit data in fp32, as amp::scale_inplace; dst += a * src
// into fp32, as amp::accumulate; a constant fill.

template <class X> __global__ void __launch_bounds__(kThreads) scale_kernel(typename X::T *x, size_t n, float f) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
        X::store(x, i, mul(X::load(x, i), f));
}

template <class S>
__global__ void __launch_bounds__(kThreads) axpy_kernel(const typename S::T *src, float *dst, size_t n, float a) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
        dst[i] = add(dst[i], mul(a, S::load(src, i)));
}

__global__ void __launch_bounds__(kThreads) fill_kernel(float *x, size_t n, float v) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
        x[i] = v;
}

unsigned scalar_blocks(size_t n) noexcept {
    const size_t b = (n + kThreads - 1) / kThreads;
    return static_cast<unsigned>(b < kMaxBlocks ? b : kMaxBlocks);
}

} // namespace

// ---------------------------------------------------------------- launchers

namespace detail {

const char *launch_adam(const optim::AdamK &k, const Arrays &a, float *m, float *v, cudaStream_t s) noexcept {
    return update(AdamOp{k}, a, m, v, s);
}

const char *launch_sgd(const optim::SgdK &k, const Arrays &a, float *buf, cudaStream_t s) noexcept {
    switch (k.mode) {
    case 0: return update(SgdOp<0>{k}, a, nullptr, nullptr, s);
    case 1: return update(SgdOp<1>{k}, a, buf, nullptr, s);
    case 2: return update(SgdOp<2>{k}, a, buf, nullptr, s);
    default: return "invalid SGD mode";
    }
}

const char *launch_mt_adam(const optim::AdamK &on, const optim::AdamK &off, const MtArrays &a, cudaStream_t s) noexcept {
    return mt_update(AdamOp{on}, AdamOp{off}, a, s);
}

const char *launch_mt_sgd(const optim::SgdK &on, const optim::SgdK &off, const MtArrays &a, cudaStream_t s) noexcept {
    switch (on.mode) {
    case 0: return mt_update(SgdOp<0>{on}, SgdOp<0>{off}, a, s);
    case 1: return mt_update(SgdOp<1>{on}, SgdOp<1>{off}, a, s);
    case 2: return mt_update(SgdOp<2>{on}, SgdOp<2>{off}, a, s);
    default: return "invalid SGD mode";
    }
}

const char *launch_mt_lion(const optim::LionK &on, const optim::LionK &off, const MtArrays &a, cudaStream_t s) noexcept {
    return mt_update(LionOp{on}, LionOp{off}, a, s);
}

const char *launch_mt_adagrad(const optim::AdagradK &on, const optim::AdagradK &off, const MtArrays &a,
                              cudaStream_t s) noexcept {
    return mt_update(AdagradOp{on}, AdagradOp{off}, a, s);
}

const char *launch_mt_axpy(Fmt sf, void *dst, Fmt df, const MtSeg *segs, unsigned nsegs, float a,
                           cudaStream_t s) noexcept {
    if (nsegs == 0) return nullptr;
    if (nsegs > kMtParamSegs) return "internal error: too many segments for one launch";
    MtParamTable t;
    for (unsigned i = 0; i < nsegs; ++i) t.segs[i] = segs[i];
    t.nsegs = nsegs;
    t.chunks = segs[nsegs - 1].first_chunk + mt_chunks_of(segs[nsegs - 1].count);
    switch (sf) {
    case Fmt::F32: return mt_axpy_from<F32>(dst, df, t, a, s);
    case Fmt::F16: return mt_axpy_from<F16>(dst, df, t, a, s);
    case Fmt::BF16: return mt_axpy_from<BF16>(dst, df, t, a, s);
    default: return kBadFormat;
    }
}

const char *launch_bound(int pass, void *g, Fmt g_fmt, float *p, float *m, float *v, void *p16, size_t n,
                         float *partial, cudaStream_t s) noexcept {
    if (n == 0) return nullptr;
    size_t blocks = (n / 4 + kThreads - 1) / kThreads;
    blocks = blocks < 1 ? 1 : blocks > kBoundBlocks ? kBoundBlocks : blocks;
    const unsigned b = static_cast<unsigned>(blocks);
    auto *g16 = static_cast<uint16_t *>(g);
    auto *c16 = static_cast<uint16_t *>(p16);
    if (pass == 0) {
        switch (g_fmt) {
        case Fmt::F32: bound_norm_kernel<F32><<<b, kThreads, 0, s>>>(static_cast<float *>(g), n, partial); break;
        case Fmt::F16: bound_norm_kernel<F16><<<b, kThreads, 0, s>>>(g16, n, partial); break;
        case Fmt::BF16: bound_norm_kernel<BF16><<<b, kThreads, 0, s>>>(g16, n, partial); break;
        default: return kBadFormat;
        }
    } else {
        switch (g_fmt) {
        case Fmt::F32: bound_update_kernel<F32, NoCopy><<<b, kThreads, 0, s>>>(static_cast<float *>(g), p, m, v, nullptr, n); break;
        case Fmt::F16: bound_update_kernel<F16, F16><<<b, kThreads, 0, s>>>(g16, p, m, v, c16, n); break;
        case Fmt::BF16: bound_update_kernel<BF16, BF16><<<b, kThreads, 0, s>>>(g16, p, m, v, c16, n); break;
        default: return kBadFormat;
        }
    }
    return launched();
}

const char *launch_lion(const optim::LionK &k, const Arrays &a, float *m, cudaStream_t s) noexcept {
    return update(LionOp{k}, a, m, nullptr, s);
}

const char *launch_adagrad(const optim::AdagradK &k, const Arrays &a, float *sum, cudaStream_t s) noexcept {
    return update(AdagradOp{k}, a, sum, nullptr, s);
}

const char *launch_lamb1(const optim::LambK &k, const Arrays &a, float *m, float *v, Reduction *out,
                         cudaStream_t s) noexcept {
    switch (a.g_fmt) {
    case Fmt::F32: return run_lamb1<F32>(k, a, m, v, out, s);
    case Fmt::F16: return run_lamb1<F16>(k, a, m, v, out, s);
    case Fmt::BF16: return run_lamb1<BF16>(k, a, m, v, out, s);
    default: return kBadFormat;
    }
}

const char *launch_lamb2(const optim::LambK &k, float neg_coef, const Arrays &a, const float *m, const float *v,
                         cudaStream_t s) noexcept {
    Arrays b = a;
    b.g = nullptr;
    b.g_fmt = Fmt::F32;
    // Lamb2Op reads m and v and never writes them (kWriteStates is false).
    return update(Lamb2Op{k, neg_coef}, b, const_cast<float *>(m), const_cast<float *>(v), s);
}

const char *launch_inspect(const void *x, Fmt fmt, size_t n, float inv_scale, Reduction *out,
                           cudaStream_t s) noexcept {
    switch (fmt) {
    case Fmt::F32: return run_inspect<F32>(x, n, inv_scale, out, s);
    case Fmt::F16: return run_inspect<F16>(x, n, inv_scale, out, s);
    case Fmt::BF16: return run_inspect<BF16>(x, n, inv_scale, out, s);
    default: return kBadFormat;
    }
}

const char *launch_convert(const void *src, Fmt sf, void *dst, Fmt df, size_t n, cudaStream_t s) noexcept {
    if (n == 0) return nullptr;
    if (sf == df && sf != Fmt::NONE)
        return status(cudaMemcpyAsync(dst, src, n * (sf == Fmt::F32 ? 4 : 2), cudaMemcpyDefault, s));
    switch (sf) {
    case Fmt::F32: return convert_from<F32>(src, dst, df, n, s);
    case Fmt::F16: return convert_from<F16>(src, dst, df, n, s);
    case Fmt::BF16: return convert_from<BF16>(src, dst, df, n, s);
    default: return kBadFormat;
    }
}

const char *launch_copy_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                           cudaStream_t s) noexcept {
    if (width == 0 || height == 0) return nullptr;
    // One row, or rows that touch on both sides: one linear copy (no pitch limit).
    if (height == 1 || (dpitch == width && spitch == width))
        return status(cudaMemcpyAsync(dst, src, width * height, cudaMemcpyDefault, s));
    return status(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, cudaMemcpyDefault, s));
}

const char *launch_scale(void *x, Fmt f, size_t n, float factor, cudaStream_t s) noexcept {
    if (n == 0) return nullptr;
    switch (f) {
    case Fmt::F32: scale_kernel<F32><<<scalar_blocks(n), kThreads, 0, s>>>(static_cast<float *>(x), n, factor); break;
    case Fmt::F16: scale_kernel<F16><<<scalar_blocks(n), kThreads, 0, s>>>(static_cast<uint16_t *>(x), n, factor); break;
    case Fmt::BF16: scale_kernel<BF16><<<scalar_blocks(n), kThreads, 0, s>>>(static_cast<uint16_t *>(x), n, factor); break;
    default: return kBadFormat;
    }
    return launched();
}

const char *launch_axpy(const void *src, Fmt f, float *dst, size_t n, float a, cudaStream_t s) noexcept {
    if (n == 0) return nullptr;
    switch (f) {
    case Fmt::F32: axpy_kernel<F32><<<scalar_blocks(n), kThreads, 0, s>>>(static_cast<const float *>(src), dst, n, a); break;
    case Fmt::F16: axpy_kernel<F16><<<scalar_blocks(n), kThreads, 0, s>>>(static_cast<const uint16_t *>(src), dst, n, a); break;
    case Fmt::BF16: axpy_kernel<BF16><<<scalar_blocks(n), kThreads, 0, s>>>(static_cast<const uint16_t *>(src), dst, n, a); break;
    default: return kBadFormat;
    }
    return launched();
}

const char *launch_fill(float *x, size_t n, float v, cudaStream_t s) noexcept {
    if (n == 0) return nullptr;
    fill_kernel<<<scalar_blocks(n), kThreads, 0, s>>>(x, n, v);
    return launched();
}

} // namespace detail
} // namespace cuda
} // namespace dsm
