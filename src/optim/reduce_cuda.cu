// The CUDA reductions: the inspection of a gradient (sum of squares and
// non-finite values) and Lamb's first pass (its two norms).
//
// Reductions (inspect, Lamb pass 1) use a fixed grid (kReduceBlocks blocks of
// kReduceThreads threads); thread t takes the groups of 4 elements
// t, t + T, t + 2T, ... (T = all threads) in order, vector loads only when
// the arrays are aligned at element 0, and adds its terms in element order;
// each block adds its threads' sums in a fixed tree; a second kernel of one
// block adds the block sums in block order. No atomics, and the same bits for
// the same input on every run, device and address.
#include "optim/optimizer_ops_cuda.cuh"

namespace dsm {
namespace cuda {
namespace {

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


} // namespace

// ---------------------------------------------------------------- launchers

namespace detail {

const char *launch_lamb1(const optim::LambK &k, const Arrays &a, float *m, float *v, Reduction *out,
                         cudaStream_t s) noexcept {
    switch (a.g_fmt) {
    case Fmt::F32: return run_lamb1<F32>(k, a, m, v, out, s);
    case Fmt::F16: return run_lamb1<F16>(k, a, m, v, out, s);
    case Fmt::BF16: return run_lamb1<BF16>(k, a, m, v, out, s);
    default: return kBadFormat;
    }
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

} // namespace detail
} // namespace cuda
} // namespace dsm
