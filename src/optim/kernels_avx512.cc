// The AVX-512 kernels (this file is compiled with -mavx512f -mavx512vl
// -mavx512bw -mavx512dq -mfma; run only when the CPU has them, see
// optimizer.cc). Sixteen fp32 lanes; Lamb's norms accumulate in two
// eight-lane fp64 registers.
#define DSM_OPTIM_KERNEL_BODIES
#include "optim/kernels.hpp"

#if defined(__AVX512F__) && defined(__AVX512DQ__)
// GCC 12's AVX-512 intrinsics fill "undefined" operands with `__m512 __Y = __Y`,
// which -Wmaybe-uninitialized reports at every inlined call (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

namespace dsm {
namespace optim {
namespace {

struct Avx512 {
    using R = __m512;
    static constexpr size_t W = 16;
    static R load(const float *p) { return _mm512_loadu_ps(p); }
    static void store(float *p, R x) { _mm512_storeu_ps(p, x); }
    static R set(float x) { return _mm512_set1_ps(x); }
    static R add(R a, R b) { return _mm512_add_ps(a, b); }
    static R mul(R a, R b) { return _mm512_mul_ps(a, b); }
    static R div(R a, R b) { return _mm512_div_ps(a, b); }
    static R sqrt(R a) { return _mm512_sqrt_ps(a); }
    static R fma(R a, R b, R c) { return _mm512_fmadd_ps(a, b, c); }
    static R fused(R a, R b, R c) { return _mm512_fmadd_ps(a, b, c); }
    static R apart(R x) {
        __asm__("" : "+v"(x));
        return x;
    }
    static R sign(R x) {
        const R zero = _mm512_setzero_ps(), one = _mm512_set1_ps(1.0f);
        const R pos = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, zero, _CMP_GT_OQ), one);
        const R neg = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, zero, _CMP_LT_OQ), one);
        return _mm512_sub_ps(pos, neg);
    }
    struct D {
        __m512d lo, hi;
    };
    static D dzero() { return {_mm512_setzero_pd(), _mm512_setzero_pd()}; }
    static D dacc(D acc, R x) {
        const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
        const __m512d hi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(x, 1));
        return {_mm512_fmadd_pd(lo, lo, acc.lo), _mm512_fmadd_pd(hi, hi, acc.hi)};
    }
    static double dsum(D acc) {
        alignas(64) double l[8];
        _mm512_store_pd(l, _mm512_add_pd(acc.lo, acc.hi));
        return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
    }
    static R bload(const uint16_t *h) {
        const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(h)));
        return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
    }
    static void bstore(uint16_t *h, R x) {
        const __m512i u = _mm512_castps_si512(x);
        const __m512i hi = _mm512_srli_epi32(u, 16);
        const __m512i rounded = _mm512_srli_epi32(
            _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), _mm512_and_si512(hi, _mm512_set1_epi32(1))), 16);
        const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                      _mm512_set1_epi32(0x7f800000));
        const __m512i r = _mm512_mask_mov_epi32(rounded, nan, _mm512_or_si512(hi, _mm512_set1_epi32(0x0040)));
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(h), _mm512_cvtepi32_epi16(r));
    }
};

} // namespace

template <> const Kernels *kernels<simd::Isa::avx512>() noexcept { return KernelSet<Avx512>::table("avx512"); }
} // namespace optim
} // namespace dsm

#else // the compiler cannot target AVX-512 here

namespace dsm {
namespace optim {
template <> const Kernels *kernels<simd::Isa::avx512>() noexcept { return nullptr; }
} // namespace optim
} // namespace dsm

#endif
