// Bulk precision helpers (convert.hpp). The per-element work is written
// without branches so that the compiler vectorizes it: GCC keeps a branch
// around a floating-point operation (it might trap), and a loop with a branch
// is not vectorized. Inner loops over a full chunk of kChunk elements have a
// constant trip count, which GCC vectorizes even at -O2. The 16-bit
// conversions and the norms go through the kernels of the instruction set
// that core/simd.hpp picks (convert_kernels.hpp: F16C, AVX2, AVX-512); the
// generic table, here, is the portable loops.
// Large buffers are cut into blocks of kBlock elements shared among OpenMP
// threads; every block is computed the same way whichever thread runs it, so
// results never depend on the thread count. Every path returns the same bits
// as the scalar functions of core/half.hpp for every input
// (test/unit/test_convert.cc).
#include "amp/convert.hpp"

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "amp/convert_body.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/simd.hpp"

namespace dsm {
namespace amp {

namespace kernels {
template <> const Table *table<simd::Isa::generic>() noexcept {
    static const Table t{"generic",           narrow_portable<F16>, widen_portable<F16>, narrow_portable<BF16>,
                         widen_portable<BF16>, sumsq_f32,            sumsq_bf16};
    return &t;
}
} // namespace kernels

namespace {

constexpr size_t kBlock = 32 * 1024; // elements per OpenMP work item and per partial norm

simd::Dispatch<kernels::Table> g_isa{kernels::table<simd::Isa::generic>, kernels::table<simd::Isa::avx2>,
                                     kernels::table<simd::Isa::avx512>};

const kernels::Table &active() noexcept { return g_isa.active(); }

// ---------------------------------------------------------------- chunks

// Data that is not fp32 is widened a chunk at a time into an fp32 buffer on
// the stack (it stays in L1), worked on there and rounded back, so that the
// F16C path serves every fp16 operation. Each helper takes m <= kChunk
// elements; a full chunk runs the constant-trip loop that GCC vectorizes.

template <typename S> void widen(const typename S::T *s, float *t, size_t m) { widen_portable<S>(s, t, m); }
template <typename D> void narrow(const float *t, typename D::T *d, size_t m) { narrow_portable<D>(t, d, m); }
template <> void widen<F16>(const uint16_t *s, float *t, size_t m) { active().f16_to_f32(s, t, m); }
template <> void narrow<F16>(const float *t, uint16_t *d, size_t m) { active().f32_to_f16(t, d, m); }
template <> void widen<BF16>(const uint16_t *s, float *t, size_t m) { active().bf16_to_f32(s, t, m); }
template <> void narrow<BF16>(const float *t, uint16_t *d, size_t m) { active().f32_to_bf16(t, d, m); }

void mul_chunk(float *x, size_t m, float f) {
    if (m == kChunk)
        for (size_t j = 0; j < kChunk; ++j) x[j] *= f;
    else
        for (size_t j = 0; j < m; ++j) x[j] *= f;
}
void axpy_chunk(const float *__restrict x, float *__restrict d, size_t m, float a) {
    if (m == kChunk)
        for (size_t j = 0; j < kChunk; ++j) d[j] += a * x[j];
    else
        for (size_t j = 0; j < m; ++j) d[j] += a * x[j];
}

// ---------------------------------------------------------------- ranges

template <typename S, typename D> void convert_range(const typename S::T *s, typename D::T *d, size_t n) {
    float tmp[kChunk];
    for (size_t i = 0; i < n; i += kChunk) {
        const size_t m = n - i < kChunk ? n - i : kChunk;
        if constexpr (std::is_same<S, F32>::value) {
            narrow<D>(s + i, d + i, m);
        } else if constexpr (std::is_same<D, F32>::value) {
            widen<S>(s + i, d + i, m);
        } else {
            widen<S>(s + i, tmp, m);
            narrow<D>(tmp, d + i, m);
        }
    }
}

template <typename S> void accumulate_range(const typename S::T *s, float *d, size_t n, float scale) {
    float tmp[kChunk];
    for (size_t i = 0; i < n; i += kChunk) {
        const size_t m = n - i < kChunk ? n - i : kChunk;
        if constexpr (std::is_same<S, F32>::value) {
            axpy_chunk(s + i, d + i, m, scale);
        } else {
            widen<S>(s + i, tmp, m);
            axpy_chunk(tmp, d + i, m, scale);
        }
    }
}

// d (16-bit) += scale * s, a chunk at a time in fp32 on the stack: the bits
// of widening d into fp32, accumulate_range() and narrowing it back, without
// a buffer of n floats.
template <typename S, typename D> void accumulate_narrow_range(const typename S::T *s, typename D::T *d, size_t n,
                                                               float scale) {
    float acc[kChunk], tmp[kChunk];
    for (size_t i = 0; i < n; i += kChunk) {
        const size_t m = n - i < kChunk ? n - i : kChunk;
        widen<D>(d + i, acc, m);
        if constexpr (std::is_same<S, F32>::value) {
            axpy_chunk(s + i, acc, m, scale);
        } else {
            widen<S>(s + i, tmp, m);
            axpy_chunk(tmp, acc, m, scale);
        }
        narrow<D>(acc, d + i, m);
    }
}

// 16- and 32-bit data are scaled in fp32 (PyTorch's mul_ by a Python float
// on such a tensor), fp64 data in fp64.
template <typename S> void scale_range(typename S::T *x, size_t n, double scale) {
    const float f = static_cast<float>(scale);
    float tmp[kChunk];
    for (size_t i = 0; i < n; i += kChunk) {
        const size_t m = n - i < kChunk ? n - i : kChunk;
        if constexpr (std::is_same<S, F32>::value) {
            mul_chunk(x + i, m, f);
        } else {
            widen<S>(x + i, tmp, m);
            mul_chunk(tmp, m, f);
            narrow<S>(tmp, x + i, m);
        }
    }
}
template <> void scale_range<F64>(double *x, size_t n, double scale) {
    size_t i = 0;
    for (; i + kChunk <= n; i += kChunk) {
        double *c = x + i;
        for (size_t j = 0; j < kChunk; ++j) c[j] *= scale;
    }
    for (; i < n; ++i) x[i] *= scale;
}

// Whether any element has an all-ones exponent (mask Exp). With `one` the
// lowest bit of Exp, (bits & Exp) + one reaches the top bit only when the
// exponent is all ones, so or-ing these sums and testing that bit needs no
// comparison. 16-bit data is or-ed in 32 bits (GCC does not vectorize the
// 16-bit reduction). The bits of T are read through memcpy, a plain load.
template <typename T, typename U, U Exp> bool nonfinite_range(const T *x, size_t n) {
    static_assert(sizeof(T) == sizeof(U) && sizeof(U) <= 4, "bits of the element");
    using A = uint32_t;
    constexpr A one = Exp & (~Exp + 1u), top = A{1} << (8 * sizeof(U) - 1);
    A any = 0;
    size_t i = 0;
    for (; i + kChunk <= n; i += kChunk) {
        const T *c = x + i; // an inner index from 0: GCC's -O2 cost model takes it
        for (size_t j = 0; j < kChunk; ++j) {
            U b;
            std::memcpy(&b, c + j, sizeof b);
            any |= (static_cast<A>(b) & Exp) + one;
        }
    }
    for (; i < n; ++i) {
        U b;
        std::memcpy(&b, x + i, sizeof b);
        any |= (static_cast<A>(b) & Exp) + one;
    }
    return (any & top) != 0;
}

// fp64 (GCC's -O2 cost model declines 64-bit integer vectors): x - x is 0
// for a finite x and NaN otherwise, and a NaN survives the sums to the end.
bool nonfinite_f64(const double *x, size_t n) {
    double lane[8] = {};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (size_t j = 0; j < 8; ++j) lane[j] += x[i + j] - x[i + j];
    for (; i < n; ++i) lane[0] += x[i] - x[i];
    double sum = 0.0;
    for (double l : lane) sum += l;
    return std::isnan(sum);
}

double sumsq_of(const float *x, size_t n, double scale) { return active().sumsq(x, n, scale); }

double sumsq_of_bf16(const uint16_t *h, size_t n, double scale) { return active().sumsq_bf16(h, n, scale); }


// ---------------------------------------------------------------- dispatch

void require_float(dsm_dtype_t t, const char *what) {
    DSM_REQUIRE(t == DSM_FLOAT32 || t == DSM_FLOAT16 || t == DSM_BFLOAT16 || t == DSM_FLOAT64,
                DSM_ERR_INVALID_ARGUMENT, what, ": dtype ", static_cast<int>(t), " (", dtype_name(t),
                ") is not float32, float16, bfloat16 or float64");
}

size_t elem_size(dsm_dtype_t t) { return t == DSM_FLOAT64 ? 8 : t == DSM_FLOAT32 ? 4 : 2; }

// f(offset, count) over blocks of kBlock elements, on the OpenMP threads when
// there is more than one block.
template <typename F> void blocks(size_t n, F f) {
    const size_t nb = (n + kBlock - 1) / kBlock;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (nb > 1)
#endif
    for (size_t b = 0; b < nb; ++b) {
        const size_t at = b * kBlock;
        f(at, n - at < kBlock ? n - at : kBlock);
    }
}

template <typename S, typename D> void convert_as(const void *src, void *dst, size_t n) {
    const auto *s = static_cast<const typename S::T *>(src);
    auto *d = static_cast<typename D::T *>(dst);
    blocks(n, [=](size_t at, size_t len) { convert_range<S, D>(s + at, d + at, len); });
}

template <typename S> void convert_from(const void *src, dsm_dtype_t dst_type, void *dst, size_t n) {
    switch (dst_type) {
    case DSM_FLOAT32: return convert_as<S, F32>(src, dst, n);
    case DSM_FLOAT16: return convert_as<S, F16>(src, dst, n);
    case DSM_BFLOAT16: return convert_as<S, BF16>(src, dst, n);
    default: return convert_as<S, F64>(src, dst, n);
    }
}

// check(p, len) over the blocks; blocks after the first hit are skipped (the
// answer is the same).
template <typename T, typename F> bool any_block(const void *x, size_t n, F check) {
    const auto *p = static_cast<const T *>(x);
    std::atomic<bool> found{false};
    blocks(n, [p, &found, check](size_t at, size_t len) {
        if (found.load(std::memory_order_relaxed)) return;
        if (check(p + at, len)) found.store(true, std::memory_order_relaxed);
    });
    return found.load();
}

} // namespace

void convert(const void *src, dsm_dtype_t src_type, void *dst, dsm_dtype_t dst_type, size_t n) {
    require_float(src_type, "convert source");
    require_float(dst_type, "convert destination");
    if (n == 0) return;
    DSM_ARG_NOT_NULL(src);
    DSM_ARG_NOT_NULL(dst);
    // In place is a no-op for one dtype; any other overlap would be read
    // after it is written (by another thread's block, or by memcpy).
    const uintptr_t s0 = reinterpret_cast<uintptr_t>(src), d0 = reinterpret_cast<uintptr_t>(dst);
    const size_t sbytes = n * elem_size(src_type), dbytes = n * elem_size(dst_type);
    if (src_type == dst_type && s0 == d0) return;
    DSM_REQUIRE(s0 + sbytes <= d0 || d0 + dbytes <= s0, DSM_ERR_INVALID_ARGUMENT, "src (", src, ", ", sbytes,
                " bytes of ", dtype_name(src_type), ") and dst (", dst, ", ", dbytes, " bytes of ",
                dtype_name(dst_type), ") overlap; only src == dst with the same dtype may share memory");
    if (src_type == dst_type) {
        const size_t es = elem_size(src_type);
        auto *d = static_cast<char *>(dst);
        const auto *s = static_cast<const char *>(src);
        blocks(n, [=](size_t at, size_t len) { std::memcpy(d + at * es, s + at * es, len * es); });
        return;
    }
    switch (src_type) {
    case DSM_FLOAT32: return convert_from<F32>(src, dst_type, dst, n);
    case DSM_FLOAT16: return convert_from<F16>(src, dst_type, dst, n);
    case DSM_BFLOAT16: return convert_from<BF16>(src, dst_type, dst, n);
    default: return convert_from<F64>(src, dst_type, dst, n);
    }
}

void accumulate(const void *src, dsm_dtype_t src_type, float *dst, size_t n, float scale) {
    require_float(src_type, "accumulate source");
    if (n == 0) return;
    DSM_ARG_NOT_NULL(src);
    DSM_ARG_NOT_NULL(dst);
    auto run = [&](auto fmt) {
        using S = decltype(fmt);
        const auto *s = static_cast<const typename S::T *>(src);
        blocks(n, [=](size_t at, size_t len) { accumulate_range<S>(s + at, dst + at, len, scale); });
    };
    switch (src_type) {
    case DSM_FLOAT32: return run(F32{});
    case DSM_FLOAT16: return run(F16{});
    case DSM_BFLOAT16: return run(BF16{});
    default: return run(F64{});
    }
}

void accumulate_into(const void *src, dsm_dtype_t src_type, void *dst, dsm_dtype_t dst_type, size_t n, float scale) {
    if (dst_type == DSM_FLOAT32) return accumulate(src, src_type, static_cast<float *>(dst), n, scale);
    require_float(src_type, "accumulate_into source");
    DSM_REQUIRE(dst_type == DSM_FLOAT16 || dst_type == DSM_BFLOAT16, DSM_ERR_INVALID_ARGUMENT,
                "accumulate_into destination: dtype ", static_cast<int>(dst_type), " (", dtype_name(dst_type),
                ") is not float32, float16 or bfloat16");
    if (n == 0) return;
    DSM_ARG_NOT_NULL(src);
    DSM_ARG_NOT_NULL(dst);
    auto run = [&](auto sfmt, auto dfmt) {
        using S = decltype(sfmt);
        using D = decltype(dfmt);
        const auto *s = static_cast<const typename S::T *>(src);
        auto *d = static_cast<typename D::T *>(dst);
        blocks(n, [=](size_t at, size_t len) { accumulate_narrow_range<S, D>(s + at, d + at, len, scale); });
    };
    auto to = [&](auto dfmt) {
        switch (src_type) {
        case DSM_FLOAT32: return run(F32{}, dfmt);
        case DSM_FLOAT16: return run(F16{}, dfmt);
        case DSM_BFLOAT16: return run(BF16{}, dfmt);
        default: return run(F64{}, dfmt);
        }
    };
    if (dst_type == DSM_FLOAT16) return to(F16{});
    to(BF16{});
}

const char *kernels_isa() noexcept { return active().name; }

void scale_inplace(void *x, dsm_dtype_t dtype, size_t n, double scale) {
    require_float(dtype, "scale_inplace");
    if (n == 0) return;
    DSM_ARG_NOT_NULL(x);
    auto run = [&](auto fmt) {
        using S = decltype(fmt);
        auto *p = static_cast<typename S::T *>(x);
        blocks(n, [=](size_t at, size_t len) { scale_range<S>(p + at, len, scale); });
    };
    switch (dtype) {
    case DSM_FLOAT32: return run(F32{});
    case DSM_FLOAT16: return run(F16{});
    case DSM_BFLOAT16: return run(BF16{});
    default: return run(F64{});
    }
}

NormPart norm_part(const float *x, size_t n, float scale) {
    NormPart out;
    if (n == 0) return out;
    DSM_ARG_NOT_NULL(x);
    // One partial sum per block, added in block order afterwards: the same
    // additions in the same order for any number of threads.
    const size_t nb = (n + kBlock - 1) / kBlock;
    std::vector<double> part(nb);
    double *p = part.data();
    blocks(n, [=](size_t at, size_t len) { p[at / kBlock] = sumsq_of(x + at, len, scale); });
    for (size_t b = 0; b < nb; ++b) out.sumsq += p[b];
    // With a finite scale every finite x gives a finite square, and the sum
    // of at most 2^64 squares of fp32 values stays far below the fp64 range:
    // the sum is finite exactly when every element is.
    out.nonfinite = std::isfinite(scale) ? !std::isfinite(out.sumsq) : has_nonfinite(x, DSM_FLOAT32, n);
    return out;
}

NormPart norm_part(const void *x, dsm_dtype_t type, size_t n, float scale) {
    if (type == DSM_FLOAT32) return norm_part(static_cast<const float *>(x), n, scale);
    DSM_REQUIRE(type == DSM_FLOAT16 || type == DSM_BFLOAT16, DSM_ERR_INVALID_ARGUMENT, "norm_part: dtype ",
                dtype_name(type), " is not float32, float16 or bfloat16");
    NormPart out;
    if (n == 0) return out;
    DSM_ARG_NOT_NULL(x);
    // Each block summed as norm_part() sums its fp32 widening: bf16 read in
    // place (its widening is a shift), fp16 converted into the thread's
    // buffer first (exact).
    const size_t nb = (n + kBlock - 1) / kBlock;
    std::vector<double> part(nb);
    double *p = part.data();
    const auto *h = static_cast<const uint16_t *>(x);
    blocks(n, [=](size_t at, size_t len) {
        if (type == DSM_BFLOAT16) {
            p[at / kBlock] = sumsq_of_bf16(h + at, len, scale);
            return;
        }
        thread_local std::vector<float> buf;
        if (buf.size() < kBlock) buf.resize(kBlock);
        convert_range<F16, F32>(h + at, buf.data(), len);
        p[at / kBlock] = sumsq_of(buf.data(), len, scale);
    });
    for (size_t b = 0; b < nb; ++b) out.sumsq += p[b];
    out.nonfinite = std::isfinite(scale) ? !std::isfinite(out.sumsq) : has_nonfinite(x, type, n);
    return out;
}

bool has_nonfinite(const void *x, dsm_dtype_t dtype, size_t n) {
    require_float(dtype, "has_nonfinite");
    if (n == 0) return false;
    DSM_ARG_NOT_NULL(x);
    switch (dtype) {
    case DSM_FLOAT32: return any_block<float>(x, n, nonfinite_range<float, uint32_t, 0x7f800000u>);
    case DSM_FLOAT16: return any_block<uint16_t>(x, n, nonfinite_range<uint16_t, uint16_t, 0x7c00u>);
    case DSM_BFLOAT16: return any_block<uint16_t>(x, n, nonfinite_range<uint16_t, uint16_t, 0x7f80u>);
    default: return any_block<double>(x, n, nonfinite_f64);
    }
}

} // namespace amp
} // namespace dsm
