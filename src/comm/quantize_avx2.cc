// The AVX2 quantization kernels (this file is compiled with -mavx2 -mfma; run
// only when the CPU has both, see quantize.cc): sixteen values as two
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
    // int4, 32 values per step: one 16-byte load unpacked into 32 signed
    // bytes in order (the even-indexed value from the low nibble), then four
    // widenings; the arithmetic is d8r's (q * s, then the add).
    template <bool kAdd> static size_t d4_run(const uint8_t *q, size_t m, float s, float *out, const float *add) {
        const __m256 vs = _mm256_set1_ps(s);
        const __m128i mask = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
        size_t i = 0;
        for (; i + 32 <= m; i += 32) {
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

namespace avx2 {
const Kernels *kernels() noexcept { return KernelSet<Avx2>::table("avx2"); }
} // namespace avx2
} // namespace quant
} // namespace comm
} // namespace dsm

#else // the compiler cannot target AVX2 here

namespace dsm {
namespace comm {
namespace quant {
namespace avx2 {
const Kernels *kernels() noexcept { return nullptr; }
} // namespace avx2
} // namespace quant
} // namespace comm
} // namespace dsm

#endif
