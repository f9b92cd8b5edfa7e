// The AVX2 quantization kernels (this file is compiled with -mavx2 -mfma; run
// only when the CPU has both, see core/simd.hpp): sixteen values as two
// registers of eight.
#include "comm/quantize_body.hpp"

#if defined(__AVX2__)
#include <immintrin.h>

namespace dsm {
namespace comm {
namespace quant {
namespace {

struct Avx2 {
    struct Acc {
        __m256 m, z;
    };
    static __m256 abs(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }
    static Acc acc0() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
    static Acc acc(Acc a, const float *x) {
        const __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8), zero = _mm256_setzero_ps();
        a.m = _mm256_max_ps(a.m, _mm256_max_ps(abs(v0), abs(v1)));
        a.z = _mm256_add_ps(a.z, _mm256_add_ps(_mm256_mul_ps(v0, zero), _mm256_mul_ps(v1, zero)));
        return a;
    }
    static float hmax(__m256 v) {
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
        return _mm_cvtss_f32(h);
    }
    static float hsum(__m256 v) {
        __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        h = _mm_add_ps(h, _mm_movehl_ps(h, h));
        h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
        return _mm_cvtss_f32(h);
    }
    static void fin(const Acc &a, float *amax, bool *bad) {
        *amax = hmax(a.m);
        *bad = !(hsum(a.z) == 0.0f);
    }
    static __m256i q(__m256 v, __m256 inv, __m256 lo, __m256 hi) {
        return _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(v, inv), lo), hi));
    }
    static __m128i q8r(const float *x, float inv, float qmax) {
        const __m256 vi = _mm256_set1_ps(inv), lo = _mm256_set1_ps(-qmax), hi = _mm256_set1_ps(qmax);
        const __m256i i0 = q(_mm256_loadu_ps(x), vi, lo, hi), i1 = q(_mm256_loadu_ps(x + 8), vi, lo, hi);
        const __m256i p = _mm256_permute4x64_epi64(_mm256_packs_epi32(i0, i1), 0xD8);
        return _mm_packs_epi16(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
    }
    static void q8(const float *x, float inv, float qmax, int8_t *out) {
        _mm_storeu_si128(reinterpret_cast<__m128i *>(out), q8r(x, inv, qmax));
    }
    static void d8(const int8_t *qv, float s, float *out, const float *add) {
        d8r(_mm_loadu_si128(reinterpret_cast<const __m128i *>(qv)), s, out, add);
    }
    static void d8r(__m128i b, float s, float *out, const float *add) {
        const __m256 vs = _mm256_set1_ps(s);
        __m256 r0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), vs);
        __m256 r1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8))), vs);
        if (add) {
            r0 = _mm256_add_ps(_mm256_loadu_ps(add), r0);
            r1 = _mm256_add_ps(_mm256_loadu_ps(add + 8), r1);
        }
        _mm256_storeu_ps(out, r0);
        _mm256_storeu_ps(out + 8, r1);
    }
    // The int4 runs of quantize_body.hpp's HasRuns, 64 values per step (as the
    // AVX-512 kernels'). The magnitudes' maximum as integers: an and and a
    // max per eight values, on four registers, one reduction per block.
    struct Max4 {
        __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
        static __m256i abs_bits(const float *y) {
            return _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(y)),
                                    _mm256_set1_epi32(0x7FFFFFFF));
        }
        void add32(const float *y) {
            a0 = _mm256_max_epu32(a0, abs_bits(y));
            a1 = _mm256_max_epu32(a1, abs_bits(y + 8));
            a2 = _mm256_max_epu32(a2, abs_bits(y + 16));
            a3 = _mm256_max_epu32(a3, abs_bits(y + 24));
        }
        void fin(uint32_t *bits) const {
            const __m256i v = _mm256_max_epu32(_mm256_max_epu32(a0, a1), _mm256_max_epu32(a2, a3));
            __m128i h = _mm_max_epu32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
            h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0x4E));
            h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0xB1));
            const uint32_t r = static_cast<uint32_t>(_mm_cvtsi128_si32(h));
            *bits = r > *bits ? r : *bits;
        }
    };
    static size_t amax_run(const float *x, size_t m, uint32_t *bits) {
        Max4 a;
        size_t i = 0;
        for (; i + 32 <= m; i += 32) a.add32(x + i);
        for (; i + 16 <= m; i += 16) {
            a.a0 = _mm256_max_epu32(a.a0, Max4::abs_bits(x + i));
            a.a1 = _mm256_max_epu32(a.a1, Max4::abs_bits(x + i + 8));
        }
        a.fin(bits);
        return i;
    }
    // q8r's integers of 32 values as bytes in order: the saturating packs
    // (no-ops on values already clamped) leave each 128-bit lane holding
    // four values of each register, which one permutation puts back.
    static __m256i q32(const float *x, __m256 vi, __m256 lo, __m256 hi) {
        const __m256i i0 = q(_mm256_loadu_ps(x), vi, lo, hi), i1 = q(_mm256_loadu_ps(x + 8), vi, lo, hi),
                      i2 = q(_mm256_loadu_ps(x + 16), vi, lo, hi), i3 = q(_mm256_loadu_ps(x + 24), vi, lo, hi);
        const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
        return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    }
    // Each 16-bit pair's low nibbles into its low byte (the even-indexed
    // value low), the high byte zero, then the sixteen bytes.
    static void put32(__m256i b, uint8_t *q) {
        const __m256i w = _mm256_or_si256(_mm256_and_si256(b, _mm256_set1_epi16(0x000F)),
                                          _mm256_and_si256(_mm256_srli_epi16(b, 4), _mm256_set1_epi16(0x00F0)));
        _mm_storeu_si128(reinterpret_cast<__m128i *>(q),
                         _mm_packus_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1)));
    }
    static constexpr size_t kAhead = 3072; // values (12 KiB; 8 and 16 measured a little slower)
    template <bool kY>
    static size_t q_loop(const float *x, size_t m, float inv, float qmax, uint8_t *qb, const float *y, uint32_t *ybits) {
        const __m256 vi = _mm256_set1_ps(inv), lo = _mm256_set1_ps(-qmax), hi = _mm256_set1_ps(qmax);
        Max4 a;
        size_t i = 0;
        for (; i + 64 <= m; i += 64) {
            if (kY) {
                // The next block from memory, fetched into L2 ahead.
                prefetch_l2<4>(y + i + kAhead);
                a.add32(y + i);
                a.add32(y + i + 32);
            }
            put32(q32(x + i, vi, lo, hi), qb + i / 2);
            put32(q32(x + i + 32, vi, lo, hi), qb + (i + 32) / 2);
        }
        if (kY) a.fin(ybits);
        return i;
    }
    static size_t q4_run(const float *x, size_t m, float inv, float qmax, uint8_t *q, const float *y, uint32_t *ybits) {
        return y ? q_loop<true>(x, m, inv, qmax, q, y, ybits) : q_loop<false>(x, m, inv, qmax, q, nullptr, nullptr);
    }
    // int4, 32 values per step: one 16-byte load unpacked into 32 signed
    // bytes in order (the even-indexed value from the low nibble), then four
    // widenings; the arithmetic is d8r's (q * s, then the add).
    template <bool kAdd> static size_t d4_run(const uint8_t *q, size_t m, float s, float *out, const float *add) {
        const __m256 vs = _mm256_set1_ps(s);
        const __m128i mask = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
        size_t i = 0;
        for (; i + 32 <= m; i += 32) {
            if (kAdd) {
                // The sum's stream into L2 ahead, as the quantization's (the
                // hardware prefetchers alone leave the memory idle here).
                prefetch_l2<2>(add + i + kAhead);
            }
            const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i *>(q + i / 2));
            const __m128i lo = _mm_and_si128(b, mask), hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
            const __m128i v0 = _mm_sub_epi8(_mm_xor_si128(_mm_unpacklo_epi8(lo, hi), eight), eight);
            const __m128i v1 = _mm_sub_epi8(_mm_xor_si128(_mm_unpackhi_epi8(lo, hi), eight), eight);
            __m256 r0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v0)), vs);
            __m256 r1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v0, 8))), vs);
            __m256 r2 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v1)), vs);
            __m256 r3 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v1, 8))), vs);
            if (kAdd) {
                r0 = _mm256_add_ps(_mm256_loadu_ps(add + i), r0);
                r1 = _mm256_add_ps(_mm256_loadu_ps(add + i + 8), r1);
                r2 = _mm256_add_ps(_mm256_loadu_ps(add + i + 16), r2);
                r3 = _mm256_add_ps(_mm256_loadu_ps(add + i + 24), r3);
            }
            _mm256_storeu_ps(out + i, r0);
            _mm256_storeu_ps(out + i + 8, r1);
            _mm256_storeu_ps(out + i + 16, r2);
            _mm256_storeu_ps(out + i + 24, r3);
        }
        return i;
    }
    static size_t d4(const uint8_t *q, size_t m, float s, float *out, const float *add) {
        return add ? d4_run<true>(q, m, s, out, add) : d4_run<false>(q, m, s, out, nullptr);
    }
};

} // namespace

template <> const Kernels *kernels<simd::Isa::avx2>() noexcept { return KernelSet<Avx2>::table("avx2"); }
} // namespace quant
} // namespace comm
} // namespace dsm

#else // the compiler cannot target AVX2 here

namespace dsm {
namespace comm {
namespace quant {
template <> const Kernels *kernels<simd::Isa::avx2>() noexcept { return nullptr; }
} // namespace quant
} // namespace comm
} // namespace dsm

#endif
