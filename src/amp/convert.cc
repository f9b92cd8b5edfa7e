// Bulk precision helpers (convert.hpp). The per-element work is written
// without branches so that the compiler vectorizes it: GCC keeps a branch
// around a floating-point operation (it might trap), and a loop with a branch
// is not vectorized. Inner loops over a full chunk of kChunk elements have a
// constant trip count, which GCC vectorizes even at -O2. fp16 data goes
// through the F16C instructions when the CPU has them (checked at run time).
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

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define DSM_AMP_F16C 1
#endif

#include "core/cpu.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"

namespace dsm {
namespace amp {
namespace {

constexpr size_t kChunk = 1024;      // elements per vectorized inner loop
constexpr size_t kBlock = 32 * 1024; // elements per OpenMP work item and per partial norm

// ---------------------------------------------------------------- elements

// (c ? a : b) as bit masks: no branch for the compiler to keep.
inline uint32_t select(bool c, uint32_t a, uint32_t b) {
    const uint32_t m = 0u - static_cast<uint32_t>(c);
    return (a & m) | (b & ~m);
}

// fp32_to_fp16 with every case computed and the right one selected.
inline uint16_t to_fp16(float x) {
    const uint32_t u = float_bits(x);
    const uint32_t sign = (u >> 16) & 0x8000u;
    const uint32_t a = u & 0x7fffffffu;
    const uint32_t normal = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13;
    const uint32_t sub = float_bits(bits_float(a) + 0.5f) - 0x3f000000u;
    uint32_t r = select(a < 0x38800000u, sub, normal);
    r = select(a >= 0x477ff000u, 0x7c00u, r);
    r = select(a > 0x7f800000u, 0x7e00u, r);
    return static_cast<uint16_t>(sign | r);
}

inline float from_fp16(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    const uint32_t mant = h & 0x3ffu;
    const uint32_t normal = ((exp + 112u) << 23) | (mant << 13);
    const uint32_t special = 0x7f800000u | (mant << 13);
    const uint32_t sub = float_bits(static_cast<float>(static_cast<int32_t>(mant)) * 5.9604644775390625e-08f);
    uint32_t r = select(exp == 0, sub, normal);
    r = select(exp == 0x1fu, special, r);
    return bits_float(sign | r);
}

inline uint16_t to_bf16(float x) {
    const uint32_t u = float_bits(x);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return static_cast<uint16_t>(select((u & 0x7fffffffu) > 0x7f800000u, (u >> 16) | 0x0040u, rounded));
}

// Element formats: storage type, widening to fp32 and rounding from fp32.
// FLOAT64 goes through fp32 too (double -> fp16 rounds twice, as PyTorch's
// Half(float) constructor does); only FLOAT64 -> FLOAT64 is a plain copy.
struct F32 {
    using T = float;
    static float load(T x) { return x; }
    static T store(float x) { return x; }
};
struct F16 {
    using T = uint16_t;
    static float load(T x) { return from_fp16(x); }
    static T store(float x) { return to_fp16(x); }
};
struct BF16 {
    using T = uint16_t;
    static float load(T x) { return bf16_to_fp32(x); }
    static T store(float x) { return to_bf16(x); }
};
struct F64 {
    using T = double;
    static float load(T x) { return static_cast<float>(x); }
    static T store(float x) { return x; }
};

// The bf16 conversions' instruction set: 2 AVX-512, 1 AVX2, 0 the portable
// loops (set_bf16_isa() for tests).
#ifdef DSM_AMP_F16C
std::atomic<int> bf16_isa{cpu_has_avx512() ? 2 : cpu_has_avx2() ? 1 : 0};
#else
std::atomic<int> bf16_isa{0};
#endif

// ---------------------------------------------------------------- F16C

// fp32 <-> fp16 with the F16C instructions, 8 at a time. The hardware rounds
// like fp32_to_fp16 and widens like fp16_to_fp32 except for NaNs: narrowing
// keeps payload bits where core/half.hpp makes 0x7e00, and widening makes
// signalling NaNs quiet where core/half.hpp keeps every bit. NaN lanes are
// patched to the scalar results.
#ifdef DSM_AMP_F16C
__attribute__((target("f16c,avx2"))) void f32_to_f16_f16c(const float *s, uint16_t *d, size_t n) {
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    const __m128i qnan = _mm_set1_epi16(0x7e00), sign16 = _mm_set1_epi16(static_cast<short>(0x8000));
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(s + i);
        __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
        const __m256i a = _mm256_and_si256(_mm256_castps_si256(v), abs_mask);
        const __m256i nan32 = _mm256_cmpgt_epi32(a, inf);
        if (!_mm256_testz_si256(nan32, nan32)) {
            const __m128i nan16 = _mm_packs_epi32(_mm256_castsi256_si128(nan32), _mm256_extracti128_si256(nan32, 1));
            const __m128i fixed = _mm_or_si128(_mm_and_si128(h, sign16), qnan);
            h = _mm_blendv_epi8(h, fixed, nan16);
        }
        _mm_storeu_si128(reinterpret_cast<__m128i *>(d + i), h);
    }
    for (; i < n; ++i) d[i] = to_fp16(s[i]);
}

__attribute__((target("f16c,avx2"))) void f16_to_f32_f16c(const uint16_t *s, float *d, size_t n) {
    const __m256i exp_mask = _mm256_set1_epi32(0x7c00), mant_mask = _mm256_set1_epi32(0x3ff);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i *>(s + i));
        __m256 v = _mm256_cvtph_ps(h);
        const __m256i w = _mm256_cvtepu16_epi32(h);
        const __m256i is_special = _mm256_cmpeq_epi32(_mm256_and_si256(w, exp_mask), exp_mask);
        const __m256i has_mant = _mm256_xor_si256(
            _mm256_cmpeq_epi32(_mm256_and_si256(w, mant_mask), _mm256_setzero_si256()), _mm256_set1_epi32(-1));
        const __m256i nan = _mm256_and_si256(is_special, has_mant);
        if (!_mm256_testz_si256(nan, nan)) {
            // sign | 0x7f800000 | mant << 13, as the scalar conversion.
            const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x8000)), 16);
            const __m256i bits = _mm256_or_si256(_mm256_or_si256(sign, _mm256_set1_epi32(0x7f800000)),
                                                 _mm256_slli_epi32(_mm256_and_si256(w, mant_mask), 13));
            v = _mm256_blendv_ps(v, _mm256_castsi256_ps(bits), _mm256_castsi256_ps(nan));
        }
        _mm256_storeu_ps(d + i, v);
    }
    for (; i < n; ++i) d[i] = from_fp16(s[i]);
}

// fp32 <-> bf16, 16 (AVX-512) or 16 per two registers (AVX2) at a time, with
// to_bf16's rounding and NaN rule and bf16_to_fp32's widening (a shift):
// the same bits as the scalar loops, which are not vectorized at -O2.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized" // GCC bug 105593, as below
__attribute__((target("avx512f,avx512bw"))) void f32_to_bf16_avx512(const float *s, uint16_t *d, size_t n) {
    const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1), quiet = _mm512_set1_epi32(0x40);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512i u = _mm512_loadu_si512(s + i);
        const __m512i hi = _mm512_srli_epi32(u, 16);
        __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, bias), _mm512_and_si512(hi, one)), 16);
        const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs_mask), inf);
        r = _mm512_mask_or_epi32(r, nan, hi, quiet);
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(d + i), _mm512_cvtepi32_epi16(r));
    }
    for (; i < n; ++i) d[i] = to_bf16(s[i]);
}

__attribute__((target("avx512f,avx512bw"))) void bf16_to_f32_avx512(const uint16_t *s, float *d, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(s + i));
        _mm512_storeu_si512(d + i, _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    for (; i < n; ++i) d[i] = bf16_to_fp32(s[i]);
}

#pragma GCC diagnostic pop

// Eight fp32 at p rounded to bf16, one per 32-bit lane.
__attribute__((target("avx2"))) inline __m256i round8_bf16_avx2(const float *p) {
    const __m256i u = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p));
    const __m256i hi = _mm256_srli_epi32(u, 16);
    const __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), _mm256_and_si256(hi, _mm256_set1_epi32(1))),
        16);
    // Signed compare of |u| (< 2^31) against Inf's bits: the NaN lanes.
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                           _mm256_set1_epi32(0x7f800000));
    return _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
}

__attribute__((target("avx2"))) void f32_to_bf16_avx2(const float *s, uint16_t *d, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        // Each lane is at most 0xffff, so the unsigned saturating pack is exact;
        // it interleaves 128-bit halves, which the permute puts back in order.
        const __m256i p = _mm256_packus_epi32(round8_bf16_avx2(s + i), round8_bf16_avx2(s + i + 8));
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(d + i), _mm256_permute4x64_epi64(p, 0xd8));
    }
    for (; i < n; ++i) d[i] = to_bf16(s[i]);
}

__attribute__((target("avx2"))) void bf16_to_f32_avx2(const uint16_t *s, float *d, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i *>(s + i));
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(d + i), _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    for (; i < n; ++i) d[i] = bf16_to_fp32(s[i]);
}


bool have_f16c() {
    static const bool yes = [] {
        // Not every compiler's __builtin_cpu_supports knows "f16c" (clang 14
        // does not), so that bit comes from CPUID leaf 1 directly; "avx2"
        // also checks that the OS saves the AVX registers.
        unsigned a = 0, b = 0, c = 0, d = 0;
        return __builtin_cpu_supports("avx2") && __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
    }();
    return yes;
}
#endif

// ---------------------------------------------------------------- chunks

// Data that is not fp32 is widened a chunk at a time into an fp32 buffer on
// the stack (it stays in L1), worked on there and rounded back, so that the
// F16C path serves every fp16 operation. Each helper takes m <= kChunk
// elements; a full chunk runs the constant-trip loop that GCC vectorizes.

template <typename S> void widen_portable(const typename S::T *__restrict s, float *__restrict t, size_t m) {
    if (m == kChunk)
        for (size_t j = 0; j < kChunk; ++j) t[j] = S::load(s[j]);
    else
        for (size_t j = 0; j < m; ++j) t[j] = S::load(s[j]);
}
template <typename D> void narrow_portable(const float *__restrict t, typename D::T *__restrict d, size_t m) {
    if (m == kChunk)
        for (size_t j = 0; j < kChunk; ++j) d[j] = D::store(t[j]);
    else
        for (size_t j = 0; j < m; ++j) d[j] = D::store(t[j]);
}
template <typename S> void widen(const typename S::T *s, float *t, size_t m) { widen_portable<S>(s, t, m); }
template <typename D> void narrow(const float *t, typename D::T *d, size_t m) { narrow_portable<D>(t, d, m); }
#ifdef DSM_AMP_F16C
template <> void widen<F16>(const uint16_t *s, float *t, size_t m) {
    if (have_f16c()) return f16_to_f32_f16c(s, t, m);
    widen_portable<F16>(s, t, m);
}
template <> void narrow<F16>(const float *t, uint16_t *d, size_t m) {
    if (have_f16c()) return f32_to_f16_f16c(t, d, m);
    narrow_portable<F16>(t, d, m);
}
template <> void widen<BF16>(const uint16_t *s, float *t, size_t m) {
    const int isa = bf16_isa.load(std::memory_order_relaxed);
    if (isa == 2) return bf16_to_f32_avx512(s, t, m);
    if (isa == 1) return bf16_to_f32_avx2(s, t, m);
    widen_portable<BF16>(s, t, m);
}
template <> void narrow<BF16>(const float *t, uint16_t *d, size_t m) {
    const int isa = bf16_isa.load(std::memory_order_relaxed);
    if (isa == 2) return f32_to_bf16_avx512(t, d, m);
    if (isa == 1) return f32_to_bf16_avx2(t, d, m);
    narrow_portable<BF16>(t, d, m);
}
#endif

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

// Sum of (scale * widen(x[i]))^2 over one block: sixteen fp64 lanes in a
// fixed order (vector registers, with enough independent sums to hide the
// add latency), then a fixed pairwise combination. The fp64 product of two
// floats is exact. Inlined into each instruction set's clone below.
template <class T, class Widen>
__attribute__((always_inline)) inline double sumsq_lanes(const T *x, size_t n, double scale, Widen widen) {
    constexpr size_t L = 16;
    double lane[L] = {};
    size_t i = 0;
    for (; i + L <= n; i += L) {
        for (size_t j = 0; j < L; ++j) {
            const double v = static_cast<double>(widen(x[i + j])) * scale;
            lane[j] += v * v;
        }
    }
    for (size_t j = 0; i < n; ++i, ++j) {
        const double v = static_cast<double>(widen(x[i])) * scale;
        lane[j] += v * v;
    }
    for (size_t w = L / 2; w >= 1; w /= 2)
        for (size_t j = 0; j < w; ++j) lane[j] += lane[j + w];
    return lane[0];
}

// sumsq_lanes() of n fp32 values.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
double sumsq_block(const float *x, size_t n, double scale) {
    return sumsq_lanes(x, n, scale, [](float v) { return v; });
}

// sumsq_block() of the fp32 widening of n bf16 values, read in place: the
// same products and additions in the same order (the widening is exact), so
// the same bits, without a buffer to write and read again.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
double sumsq_block_bf16(const uint16_t *x, size_t n, double scale) {
    return sumsq_lanes(x, n, scale, [](uint16_t v) { return bits_float(static_cast<uint32_t>(v) << 16); });
}

// The same two sums with AVX-512 (the CPU checked by the caller): lanes 0-7
// and 8-15 of the sixteen in two registers, a product and a sum per lane
// (no FMA: avx512f alone does not let the compiler contract them), the tail
// and the pairwise combination as above. Same bits.
#if defined(__x86_64__) && defined(__GNUC__)
// GCC 12's AVX-512 intrinsics fill "undefined" operands with `__m512 __Y = __Y`,
// which -Wmaybe-uninitialized reports at every inlined call (GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
__attribute__((target("avx512f"))) double sumsq_avx512(const float *x, const uint16_t *h, size_t n,
                                                       double scale) {
    __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
    const __m512d s = _mm512_set1_pd(scale);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 f =
            h != nullptr
                ? _mm512_castsi512_ps(_mm512_slli_epi32(
                      _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(h + i))), 16))
                : _mm512_loadu_ps(x + i);
        const __m512d lo = _mm512_mul_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(f)), s);
        const __m512d hi =
            _mm512_mul_pd(_mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f), 1))), s);
        a0 = _mm512_add_pd(a0, _mm512_mul_pd(lo, lo));
        a1 = _mm512_add_pd(a1, _mm512_mul_pd(hi, hi));
    }
    double lane[16];
    _mm512_storeu_pd(lane, a0);
    _mm512_storeu_pd(lane + 8, a1);
    for (size_t j = 0; i < n; ++i, ++j) {
        const float f = h != nullptr ? bits_float(static_cast<uint32_t>(h[i]) << 16) : x[i];
        const double v = static_cast<double>(f) * scale;
        lane[j] += v * v;
    }
    for (size_t w = 8; w >= 1; w /= 2)
        for (size_t j = 0; j < w; ++j) lane[j] += lane[j + w];
    return lane[0];
}
#pragma GCC diagnostic pop
const bool kSumsqAvx512 = cpu_has_avx512();
#define DSM_AMP_SUMSQ_AVX512 1
#endif

double sumsq_of(const float *x, size_t n, double scale) {
#ifdef DSM_AMP_SUMSQ_AVX512
    if (kSumsqAvx512) return sumsq_avx512(x, nullptr, n, scale);
#endif
    return sumsq_block(x, n, scale);
}

double sumsq_of_bf16(const uint16_t *h, size_t n, double scale) {
#ifdef DSM_AMP_SUMSQ_AVX512
    if (kSumsqAvx512) return sumsq_avx512(nullptr, h, n, scale);
#endif
    return sumsq_block_bf16(h, n, scale);
}

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

bool set_bf16_isa(const char *name) {
    const std::string n = name != nullptr ? name : "";
    const int isa = n == "avx512" ? 2 : n == "avx2" ? 1 : n == "generic" ? 0 : -1;
    if (isa < 0 || (isa == 2 && !cpu_has_avx512()) || (isa == 1 && !cpu_has_avx2())) return false;
#ifndef DSM_AMP_F16C
    if (isa > 0) return false; // no vector kernels in this build
#endif
    bf16_isa.store(isa);
    return true;
}

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
