// The portable kernels, compiled with the default flags: on x86-64 four
// SSE2 lanes (part of the base instruction set, so always safe; the compiler
// does not vectorize the plain loop itself because sqrtf may set errno),
// elsewhere one element at a time. Always available.
#define DSM_OPTIM_KERNEL_BODIES
#include "optim/kernels.hpp"

#if defined(__SSE2__)
#include <emmintrin.h>

namespace dsm {
namespace optim {
namespace {

// No FMA in SSE2: fma(a, b, c) rounds twice; fused() rounds once, lane by
// lane through fmaf (PyTorch's order only).
struct Sse2 {
    using R = __m128;
    static constexpr size_t W = 4;
    static R load(const float *p) { return _mm_loadu_ps(p); }
    static void store(float *p, R x) { _mm_storeu_ps(p, x); }
    static R set(float x) { return _mm_set1_ps(x); }
    static R add(R a, R b) { return _mm_add_ps(a, b); }
    static R mul(R a, R b) { return _mm_mul_ps(a, b); }
    static R div(R a, R b) { return _mm_div_ps(a, b); }
    static R sqrt(R a) { return _mm_sqrt_ps(a); }
    static R fma(R a, R b, R c) { return _mm_add_ps(_mm_mul_ps(a, b), c); }
    static R fused(R a, R b, R c) {
        float x[4], y[4], z[4];
        _mm_storeu_ps(x, a);
        _mm_storeu_ps(y, b);
        _mm_storeu_ps(z, c);
        for (int l = 0; l < 4; ++l) x[l] = __builtin_fmaf(x[l], y[l], z[l]);
        return _mm_loadu_ps(x);
    }
    static R apart(R x) {
        __asm__("" : "+x"(x)); // no FMA in SSE2, but the flags may add one
        return x;
    }
    static R sign(R x) {
        const R zero = _mm_setzero_ps(), one = _mm_set1_ps(1.0f);
        return _mm_sub_ps(_mm_and_ps(_mm_cmpgt_ps(x, zero), one), _mm_and_ps(_mm_cmplt_ps(x, zero), one));
    }
    struct D {
        __m128d lo, hi;
    };
    static D dzero() { return {_mm_setzero_pd(), _mm_setzero_pd()}; }
    static D dacc(D acc, R x) {
        const __m128d lo = _mm_cvtps_pd(x), hi = _mm_cvtps_pd(_mm_movehl_ps(x, x));
        return {_mm_add_pd(acc.lo, _mm_mul_pd(lo, lo)), _mm_add_pd(acc.hi, _mm_mul_pd(hi, hi))};
    }
    static double dsum(D acc) {
        double l[2];
        _mm_storeu_pd(l, _mm_add_pd(acc.lo, acc.hi));
        return l[0] + l[1];
    }
    static R bload(const uint16_t *h) {
        const __m128i w = _mm_loadl_epi64(reinterpret_cast<const __m128i *>(h));
        return _mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), w)); // h << 16 in each lane
    }
    static void bstore(uint16_t *h, R x) {
        const __m128i u = _mm_castps_si128(x);
        const __m128i hi = _mm_srli_epi32(u, 16);
        const __m128i rounded =
            _mm_srli_epi32(_mm_add_epi32(_mm_add_epi32(u, _mm_set1_epi32(0x7fff)), _mm_and_si128(hi, _mm_set1_epi32(1))), 16);
        const __m128i nan = _mm_cmpgt_epi32(_mm_and_si128(u, _mm_set1_epi32(0x7fffffff)), _mm_set1_epi32(0x7f800000));
        const __m128i quiet = _mm_or_si128(hi, _mm_set1_epi32(0x0040));
        const __m128i r = _mm_or_si128(_mm_and_si128(nan, quiet), _mm_andnot_si128(nan, rounded));
        // Lanes below 2^16, sign-extended from 16 bits so that the signed pack keeps their bits.
        const __m128i s = _mm_srai_epi32(_mm_slli_epi32(r, 16), 16);
        _mm_storel_epi64(reinterpret_cast<__m128i *>(h), _mm_packs_epi32(s, s));
    }
};
using Generic = Sse2;

} // namespace
} // namespace optim
} // namespace dsm

#else

namespace dsm {
namespace optim {
namespace {
using Generic = Scalar;
} // namespace
} // namespace optim
} // namespace dsm

#endif

namespace dsm {
namespace optim {
template <> const Kernels *kernels<simd::Isa::generic>() noexcept { return KernelSet<Generic>::table("generic"); }
} // namespace optim
} // namespace dsm
