// The CUDA conversions between fp32, fp16 and bf16 (core/half.hpp's bits)
// and the copies of the device space (linear and 2-D).
#include "optim/kernels_cuda_common.cuh"

namespace dsm {
namespace cuda {
namespace {

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

} // namespace

// ---------------------------------------------------------------- launchers

namespace detail {

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

} // namespace detail
} // namespace cuda
} // namespace dsm
