// The AVX2 + FMA kernels (this file is compiled with -mavx2 -mfma; run only
// when the CPU has both, see core/simd.hpp). Eight fp32 lanes; Lamb's norms
// accumulate in two four-lane fp64 registers.
#define DSM_OPTIM_KERNEL_BODIES
#include "optim/kernels.hpp"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

namespace dsm {
namespace optim {
namespace {

struct Avx2 {
    using R = __m256;
    static constexpr size_t W = 8;
    static R load(const float *p) { return _mm256_loadu_ps(p); }
    static void store(float *p, R x) { _mm256_storeu_ps(p, x); }
    static R set(float x) { return _mm256_set1_ps(x); }
    static R add(R a, R b) { return _mm256_add_ps(a, b); }
    static R mul(R a, R b) { return _mm256_mul_ps(a, b); }
    static R div(R a, R b) { return _mm256_div_ps(a, b); }
    static R sqrt(R a) { return _mm256_sqrt_ps(a); }
    static R fma(R a, R b, R c) { return _mm256_fmadd_ps(a, b, c); }
    static R fused(R a, R b, R c) { return _mm256_fmadd_ps(a, b, c); }
    static R apart(R x) {
        __asm__("" : "+x"(x));
        return x;
    }
    static R sign(R x) {
        const R zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.0f);
        const R pos = _mm256_and_ps(_mm256_cmp_ps(x, zero, _CMP_GT_OQ), one);
        const R neg = _mm256_and_ps(_mm256_cmp_ps(x, zero, _CMP_LT_OQ), one);
        return _mm256_sub_ps(pos, neg);
    }
    struct D {
        __m256d lo, hi;
    };
    static D dzero() { return {_mm256_setzero_pd(), _mm256_setzero_pd()}; }
    static D dacc(D acc, R x) {
        const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
        const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
        return {_mm256_fmadd_pd(lo, lo, acc.lo), _mm256_fmadd_pd(hi, hi, acc.hi)};
    }
    static double dsum(D acc) {
        alignas(32) double l[4];
        _mm256_store_pd(l, _mm256_add_pd(acc.lo, acc.hi));
        return (l[0] + l[1]) + (l[2] + l[3]);
    }
    static R bload(const uint16_t *h) {
        const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(h)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
    }
    static void bstore(uint16_t *h, R x) {
        const __m256i u = _mm256_castps_si256(x);
        const __m256i hi = _mm256_srli_epi32(u, 16);
        const __m256i rounded = _mm256_srli_epi32(
            _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), _mm256_and_si256(hi, _mm256_set1_epi32(1))), 16);
        // |u| and 0x7f800000 are below 2^31: the signed compare is the unsigned one.
        const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                               _mm256_set1_epi32(0x7f800000));
        const __m256i r = _mm256_blendv_epi8(rounded, _mm256_or_si256(hi, _mm256_set1_epi32(0x0040)), nan);
        // Every lane is below 2^16: the unsigned saturating pack keeps it.
        const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
        _mm_storeu_si128(reinterpret_cast<__m128i *>(h), packed);
    }
};

} // namespace

template <> const Kernels *kernels<simd::Isa::avx2>() noexcept { return KernelSet<Avx2>::table("avx2"); }
} // namespace optim
} // namespace dsm

#else // the compiler cannot target AVX2 here

namespace dsm {
namespace optim {
template <> const Kernels *kernels<simd::Isa::avx2>() noexcept { return nullptr; }
} // namespace optim
} // namespace dsm

#endif
