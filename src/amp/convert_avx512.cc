// amp's AVX-512 kernels (convert_kernels.hpp; this file is compiled with
// SIMD_AVX512_FLAGS, run only when simd::isa() allows): bf16 and the norms
// in AVX-512 registers, fp16 through F16C as in convert_avx2.cc.
#include "amp/convert_body.hpp"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__F16C__)
namespace dsm {
namespace amp {
namespace {

// fp32 <-> bf16, 16 (AVX-512) or 16 per two registers (AVX2) at a time, with
// to_bf16's rounding and NaN rule and bf16_to_fp32's widening (a shift):
// the same bits as the scalar loops, which are not vectorized at -O2.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized" // GCC bug 105593, as below for the norms
void f32_to_bf16_avx512(const float *s, uint16_t *d, size_t n) {
    const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1), quiet = _mm512_set1_epi32(0x40);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512i u = _mm512_loadu_si512(s + i);
        const __m512i hi = _mm512_srli_epi32(u, 16);
        __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, bias), _mm512_and_si512(hi, one)), 16);
        const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs_mask), inf);
        r = _mm512_mask_or_epi32(r, nan, hi, quiet);
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(d + i), _mm512_cvtepi32_epi16(r));
    }
    for (; i < n; ++i) d[i] = to_bf16(s[i]);
}

void bf16_to_f32_avx512(const uint16_t *s, float *d, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(s + i));
        _mm512_storeu_si512(d + i, _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    for (; i < n; ++i) d[i] = bf16_to_fp32(s[i]);
}

#pragma GCC diagnostic pop


// The same two sums with AVX-512 (the CPU checked by the caller): lanes 0-7
// and 8-15 of the sixteen in two registers, a product and a sum per lane
// (no FMA: avx512f alone does not let the compiler contract them), the tail
// and the pairwise combination as above. Same bits.
// GCC 12's AVX-512 intrinsics fill "undefined" operands with `__m512 __Y = __Y`,
// which -Wmaybe-uninitialized reports at every inlined call (GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
double sumsq_avx512(const float *x, const uint16_t *h, size_t n,
                                                       double scale) {
    __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
    const __m512d s = _mm512_set1_pd(scale);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 f =
            h != nullptr
                ? _mm512_castsi512_ps(_mm512_slli_epi32(
                      _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(h + i))), 16))
                : _mm512_loadu_ps(x + i);
        const __m512d lo = _mm512_mul_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(f)), s);
        const __m512d hi =
            _mm512_mul_pd(_mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f), 1))), s);
        a0 = _mm512_add_pd(a0, _mm512_mul_pd(lo, lo));
        a1 = _mm512_add_pd(a1, _mm512_mul_pd(hi, hi));
    }
    double lane[16];
    _mm512_storeu_pd(lane, a0);
    _mm512_storeu_pd(lane + 8, a1);
    for (size_t j = 0; i < n; ++i, ++j) {
        const float f = h != nullptr ? bits_float(static_cast<uint32_t>(h[i]) << 16) : x[i];
        const double v = static_cast<double>(f) * scale;
        lane[j] += v * v;
    }
    for (size_t w = 8; w >= 1; w /= 2)
        for (size_t j = 0; j < w; ++j) lane[j] += lane[j + w];
    return lane[0];
}
#pragma GCC diagnostic pop

double sumsq_f32_avx512(const float *x, size_t n, double scale) { return sumsq_avx512(x, nullptr, n, scale); }
double sumsq_bf16_avx512(const uint16_t *h, size_t n, double scale) { return sumsq_avx512(nullptr, h, n, scale); }

} // namespace

namespace kernels {
template <> const Table *table<simd::Isa::avx512>() noexcept {
    static const Table t{"avx512",           f32_to_f16_f16c,  f16_to_f32_f16c,  f32_to_bf16_avx512,
                         bf16_to_f32_avx512, sumsq_f32_avx512, sumsq_bf16_avx512};
    return &t;
}
} // namespace kernels
} // namespace amp
} // namespace dsm

#else // the compiler cannot target AVX-512 here

namespace dsm {
namespace amp {
namespace kernels {
template <> const Table *table<simd::Isa::avx512>() noexcept { return nullptr; }
} // namespace kernels
} // namespace amp
} // namespace dsm

#endif
