// The device space's small CUDA kernels, off the optimizer's path: the
// scale of 16- and 32-bit data in fp32 (amp::scale_inplace), dst += a * src
// into fp32 (amp::accumulate), per tensor and over a table of tensors, and
// a constant fill.
#include "optim/kernels_cuda_common.cuh"

namespace dsm {
namespace cuda {
namespace {

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

} // namespace

// ---------------------------------------------------------------- launchers

namespace detail {

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
