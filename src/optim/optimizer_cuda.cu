// The CUDA optimizer kernels: Adam, SGD, Lion, Adagrad and Lamb's second
// pass per tensor and over a table of tensors (multi-tensor), and the
// streaming bound of an update (see kernels_cuda.hpp for what each computes
// and why the results are the CPU's bits).
#include "optim/optimizer_ops_cuda.cuh"

namespace dsm {
namespace cuda {
namespace {

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

const char *launch_lamb2(const optim::LambK &k, float neg_coef, const Arrays &a, const float *m, const float *v,
                         cudaStream_t s) noexcept {
    Arrays b = a;
    b.g = nullptr;
    b.g_fmt = Fmt::F32;
    // Lamb2Op reads m and v and never writes them (kWriteStates is false).
    return update(Lamb2Op{k, neg_coef}, b, const_cast<float *>(m), const_cast<float *>(v), s);
}

} // namespace detail
} // namespace cuda
} // namespace dsm
