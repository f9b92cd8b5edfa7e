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

namespace avx512 {
const Kernels *kernels() noexcept { return KernelSet<Avx512>::table("avx512"); }
} // namespace avx512
} // namespace quant
} // namespace comm
} // namespace dsm

#else // the compiler cannot target AVX-512 here

namespace dsm {
namespace comm {
namespace quant {
namespace avx512 {
const Kernels *kernels() noexcept { return nullptr; }
} // namespace avx512
} // namespace quant
} // namespace comm
} // namespace dsm

#endif
