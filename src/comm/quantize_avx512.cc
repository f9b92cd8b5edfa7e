// The AVX-512 quantization kernels (this file is compiled with -mavx512f
// -mavx512vl -mavx512bw -mavx512dq; run only when the CPU has them, see
// quantize.cc): sixteen values per register.
#include "comm/quantize_body.hpp"

#if defined(__AVX512F__) && defined(__AVX512BW__)
// GCC 12 at -O2 warns that the intrinsics' internal "undefined" operands may
// be used uninitialized (a false positive of its headers, not of this code).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
namespace dsm {
namespace comm {
namespace quant {
namespace {

struct Avx512 {
    struct Acc {
        __m512 m, z;
    };
    static Acc acc0() { return {_mm512_setzero_ps(), _mm512_setzero_ps()}; }
    static Acc acc(Acc a, const float *x) {
        const __m512 v = _mm512_loadu_ps(x);
        a.m = _mm512_max_ps(a.m, _mm512_abs_ps(v));
        a.z = _mm512_add_ps(a.z, _mm512_mul_ps(v, _mm512_setzero_ps()));
        return a;
    }
    static void fin(const Acc &a, float *amax, bool *bad) {
        *amax = _mm512_reduce_max_ps(a.m);
        *bad = !(_mm512_reduce_add_ps(a.z) == 0.0f);
    }
    static __m128i q8r(const float *x, float inv, float qmax) {
        __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x), _mm512_set1_ps(inv));
        v = _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(-qmax)), _mm512_set1_ps(qmax));
        return _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(v));
    }
    static void q8(const float *x, float inv, float qmax, int8_t *out) {
        _mm_storeu_si128(reinterpret_cast<__m128i *>(out), q8r(x, inv, qmax));
    }
    static void d8r(__m128i b, float s, float *out, const float *add) {
        __m512 r = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)), _mm512_set1_ps(s));
        if (add) r = _mm512_add_ps(_mm512_loadu_ps(add), r);
        _mm512_storeu_ps(out, r);
    }
    static void d8(const int8_t *q, float s, float *out, const float *add) {
        d8r(_mm_loadu_si128(reinterpret_cast<const __m128i *>(q)), s, out, add);
    }
    // The int4 runs of quantize_body.hpp's HasRuns, 64 values per step. The
    // magnitudes' maximum as integers: an and and a max per sixteen values,
    // on four registers, with one reduction per block.
    struct Max4 {
        __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
        void add(const float *y) {
            const __m512i abs = _mm512_set1_epi32(0x7FFFFFFF);
            a0 = _mm512_max_epu32(a0, _mm512_and_si512(_mm512_loadu_si512(y), abs));
            a1 = _mm512_max_epu32(a1, _mm512_and_si512(_mm512_loadu_si512(y + 16), abs));
            a2 = _mm512_max_epu32(a2, _mm512_and_si512(_mm512_loadu_si512(y + 32), abs));
            a3 = _mm512_max_epu32(a3, _mm512_and_si512(_mm512_loadu_si512(y + 48), abs));
        }
        void fin(uint32_t *bits) const {
            const uint32_t r =
                _mm512_reduce_max_epu32(_mm512_max_epu32(_mm512_max_epu32(a0, a1), _mm512_max_epu32(a2, a3)));
            *bits = r > *bits ? r : *bits;
        }
    };
    static size_t amax_run(const float *x, size_t m, uint32_t *bits) {
        Max4 a;
        size_t i = 0;
        for (; i + 64 <= m; i += 64) a.add(x + i);
        for (; i + 16 <= m; i += 16)
            a.a0 = _mm512_max_epu32(a.a0, _mm512_and_si512(_mm512_loadu_si512(x + i), _mm512_set1_epi32(0x7FFFFFFF)));
        a.fin(bits);
        return i;
    }
    // q8r's integers of 64 values, as bytes in order: the two saturating
    // packs (no-ops on values already clamped) leave each 128-bit lane
    // holding four values of each register, which one permutation puts back.
    static __m512i q16(const float *x, __m512 vi, __m512 lo, __m512 hi) {
        return _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(_mm512_loadu_ps(x), vi), lo), hi));
    }
    static __m512i q64(const float *x, __m512 vi, __m512 lo, __m512 hi) {
        const __m512i r0 = q16(x, vi, lo, hi), r1 = q16(x + 16, vi, lo, hi), r2 = q16(x + 32, vi, lo, hi),
                      r3 = q16(x + 48, vi, lo, hi);
        const __m512i p = _mm512_packs_epi16(_mm512_packs_epi32(r0, r1), _mm512_packs_epi32(r2, r3));
        return _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), p);
    }
    static constexpr size_t kAhead = 4096; // values (16 KiB; 8 and 4 measured a little slower)
    // The 32 bytes of 64 values go out as two 16-byte stores (one 32-byte
    // store measured no faster; a segment's bytes may start anywhere).
    template <bool kY>
    static size_t q_loop(const float *x, size_t m, float inv, float qmax, uint8_t *q, const float *y, uint32_t *ybits) {
        const __m512 vi = _mm512_set1_ps(inv), lo = _mm512_set1_ps(-qmax), hi = _mm512_set1_ps(qmax);
        Max4 a;
        size_t i = 0;
        for (; i + 64 <= m; i += 64) {
            if (kY) {
                // The next block from memory: fetched into L2 a few blocks
                // ahead (no hardware prefetcher was seen to stream it in time).
                prefetch_l2<4>(y + i + kAhead);
                a.add(y + i);
            }
            // Each 16-bit pair's low nibbles into its low byte (the
            // even-indexed value low), then the low bytes.
            const __m512i b = q64(x + i, vi, lo, hi);
            const __m512i w = _mm512_ternarylogic_epi32(b, _mm512_srli_epi16(b, 4), _mm512_set1_epi8(0x0F), 0xE4);
            const __m256i c = _mm512_cvtepi16_epi8(w);
            _mm_storeu_si128(reinterpret_cast<__m128i *>(q + i / 2), _mm256_castsi256_si128(c));
            _mm_storeu_si128(reinterpret_cast<__m128i *>(q + i / 2 + 16), _mm256_extracti128_si256(c, 1));
        }
        if (kY) a.fin(ybits);
        return i;
    }
    static size_t q4_run(const float *x, size_t m, float inv, float qmax, uint8_t *q, const float *y, uint32_t *ybits) {
        return y ? q_loop<true>(x, m, inv, qmax, q, y, ybits) : q_loop<false>(x, m, inv, qmax, q, nullptr, nullptr);
    }
    // int4: the sixteen possible values times the scale in one register,
    // looked up by nibble (vpermps reads an index's low 4 bits only, so the
    // nibbles need no masking and no sign extension): per 32 values one
    // 16-byte load, a shift, two unpacks, two widenings and two lookups. The
    // products are those of d8r (q * s, rounded once), so the bits are too.
    template <bool kAdd> static size_t d4_run(const uint8_t *q, size_t m, float s, float *out, const float *add) {
        const __m512 t = _mm512_mul_ps(_mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, -8, -7, -6, -5, -4, -3, -2, -1),
                                       _mm512_set1_ps(s));
        size_t i = 0;
        for (; i + 32 <= m; i += 32) {
            if (kAdd) {
                // The sum's stream into L2 ahead, as the quantization's.
                prefetch_l2<2>(add + i + kAhead);
            }
            const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i *>(q + i / 2));
            const __m128i h = _mm_srli_epi16(b, 4); // each byte's high nibble in its low bits
            __m512 r0 = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(b, h)), t);
            __m512 r1 = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi8(b, h)), t);
            if (kAdd) {
                r0 = _mm512_add_ps(_mm512_loadu_ps(add + i), r0);
                r1 = _mm512_add_ps(_mm512_loadu_ps(add + i + 16), r1);
            }
            _mm512_storeu_ps(out + i, r0);
            _mm512_storeu_ps(out + i + 16, r1);
        }
        return i;
    }
    static size_t d4(const uint8_t *q, size_t m, float s, float *out, const float *add) {
        return add ? d4_run<true>(q, m, s, out, add) : d4_run<false>(q, m, s, out, nullptr);
    }
};

} // namespace

template <> const Kernels *kernels<simd::Isa::avx512>() noexcept { return KernelSet<Avx512>::table("avx512"); }
} // namespace quant
} // namespace comm
} // namespace dsm

#else // the compiler cannot target AVX-512 here

namespace dsm {
namespace comm {
namespace quant {
template <> const Kernels *kernels<simd::Isa::avx512>() noexcept { return nullptr; }
} // namespace quant
} // namespace comm
} // namespace dsm

#endif
