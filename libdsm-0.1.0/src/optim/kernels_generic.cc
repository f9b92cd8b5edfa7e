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

// No FMA in SSE2: fma(a, b, c) rounds twice.
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
namespace generic {

const Kernels *kernels() noexcept { return KernelSet<Generic>::table("generic"); }

} // namespace generic
} // namespace optim
} // namespace dsm
