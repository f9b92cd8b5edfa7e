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
    static void d8r(__m128i b, float s, float *out, bool accumulate) {
        __m512 r = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)), _mm512_set1_ps(s));
        if (accumulate) r = _mm512_add_ps(_mm512_loadu_ps(out), r);
        _mm512_storeu_ps(out, r);
    }
    static void d8(const int8_t *q, float s, float *out, bool accumulate) {
        d8r(_mm_loadu_si128(reinterpret_cast<const __m128i *>(q)), s, out, accumulate);
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
