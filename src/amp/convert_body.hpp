// The element formats and loops shared by convert.cc and the instruction
// sets' files (convert_avx2.cc, convert_avx512.cc), each compiled with its
// own flags. Everything is in an unnamed namespace so that each file keeps
// its own copies (a function shared by name between files compiled with
// different flags could be merged by the linker into the widest copy).
#pragma once

#include <cstddef>
#include <cstdint>

#include "amp/convert_kernels.hpp"
#include "core/dtype.hpp"
#include "core/half.hpp"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace dsm {
namespace amp {
namespace {

constexpr size_t kChunk = 1024; // elements per vectorized inner loop

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

// ---------------------------------------------------------------- loops

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

// Sum of (scale * widen(x[i]))^2 over one block: sixteen fp64 lanes in a
// fixed order (vector registers, with enough independent sums to hide the
// add latency), then a fixed pairwise combination. The fp64 product of two
// floats is exact. Each instruction set's file compiles it for its set.
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

inline double sumsq_f32(const float *x, size_t n, double scale) {
    return sumsq_lanes(x, n, scale, [](float v) { return v; });
}

// sumsq_f32() of the fp32 widening of n bf16 values, read in place: the
// same products and additions in the same order (the widening is exact), so
// the same bits, without a buffer to write and read again.
inline double sumsq_bf16(const uint16_t *x, size_t n, double scale) {
    return sumsq_lanes(x, n, scale, [](uint16_t v) { return bits_float(static_cast<uint32_t>(v) << 16); });
}

#if defined(__AVX2__) && defined(__F16C__)

// fp32 <-> fp16 with the F16C instructions, 8 at a time. The hardware rounds
// like fp32_to_fp16 and widens like fp16_to_fp32 except for NaNs: narrowing
// keeps payload bits where core/half.hpp makes 0x7e00, and widening makes
// signalling NaNs quiet where core/half.hpp keeps every bit. NaN lanes are
// patched to the scalar results.
inline void f32_to_f16_f16c(const float *s, uint16_t *d, size_t n) {
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

inline void f16_to_f32_f16c(const uint16_t *s, float *d, size_t n) {
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


// Eight fp32 at p rounded to bf16, one per 32-bit lane.
inline __m256i round8_bf16_avx2(const float *p) {
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

inline void f32_to_bf16_avx2(const float *s, uint16_t *d, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        // Each lane is at most 0xffff, so the unsigned saturating pack is exact;
        // it interleaves 128-bit halves, which the permute puts back in order.
        const __m256i p = _mm256_packus_epi32(round8_bf16_avx2(s + i), round8_bf16_avx2(s + i + 8));
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(d + i), _mm256_permute4x64_epi64(p, 0xd8));
    }
    for (; i < n; ++i) d[i] = to_bf16(s[i]);
}

inline void bf16_to_f32_avx2(const uint16_t *s, float *d, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i *>(s + i));
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(d + i), _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    for (; i < n; ++i) d[i] = bf16_to_fp32(s[i]);
}

#endif

} // namespace
} // namespace amp
} // namespace dsm
