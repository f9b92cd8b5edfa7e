// The bodies of bounds.hpp's kernels, included by bounds_generic.cc,
// bounds_avx2.cc and bounds_avx512.cc only, each compiled for its
// instruction set. In an unnamed namespace so that each file keeps its own
// copies (a function shared by name between files compiled with different
// flags could be merged by the linker into the widest copy). The loops ask
// for vectors with OpenMP's simd directive (the build uses -O2).
#pragma once

#include <algorithm>
#include <cstring>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "bounds.hpp"

namespace dsm {
namespace bench {
namespace {

// ---- dsm-bench optimizer: Adam's memory traffic with almost none of its
// arithmetic.
void adam(float *__restrict p, const float *__restrict g, float *__restrict m, float *__restrict v, size_t b,
          size_t e) noexcept {
#pragma omp simd
    for (size_t i = b; i < e; ++i) {
        const float gi = g[i];
        p[i] += 1e-6f * gi;
        m[i] = 0.9f * m[i] + gi;
        v[i] = 0.9f * v[i] + gi * gi;
    }
}

// ---- dsm-bench optimizer --model: the step's two passes (the norm, then
// the update).
float sum_chunk32(const float *__restrict g, size_t b, size_t e) noexcept {
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (size_t i = b; i < e; ++i) s += g[i] * g[i];
    return s;
}

float sum_chunk16(const uint16_t *__restrict g, size_t b, size_t e) noexcept {
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (size_t i = b; i < e; ++i) {
        uint32_t u = static_cast<uint32_t>(g[i]) << 16;
        float f;
        std::memcpy(&f, &u, 4);
        s += f * f;
    }
    return s;
}

void update_chunk32(float *__restrict g, float *__restrict p, float *__restrict m, float *__restrict v, size_t b,
                    size_t e) noexcept {
#pragma omp simd
    for (size_t i = b; i < e; ++i) {
        const float gi = g[i];
        p[i] += 1e-6f * gi;
        m[i] = 0.9f * m[i] + gi;
        v[i] = 0.9f * v[i] + gi * gi;
        g[i] = 0.0f;
    }
}

void update_chunk16(uint16_t *__restrict g, float *__restrict p, float *__restrict m, float *__restrict v,
                    uint16_t *__restrict p16, size_t b, size_t e) noexcept {
#pragma omp simd
    for (size_t i = b; i < e; ++i) {
        uint32_t u = static_cast<uint32_t>(g[i]) << 16;
        float gi;
        std::memcpy(&gi, &u, 4);
        const float pi = p[i] + 1e-6f * gi;
        p[i] = pi;
        m[i] = 0.9f * m[i] + gi;
        v[i] = 0.9f * v[i] + gi * gi;
        uint32_t w;
        std::memcpy(&w, &pi, 4);
        p16[i] = static_cast<uint16_t>(w >> 16);
        g[i] = 0;
    }
}

// The same two passes with a software prefetch `ahead` elements ahead of
// every array, one cache line per array per 16 elements (the library's
// kernels prefetch the same way): what the out-of-order window alone does
// not reach on some machines.
float sum_chunk32_pf(const float *__restrict g, size_t b, size_t e, size_t ahead) noexcept {
    float s = 0;
    for (size_t i = b; i < e; i += 16) {
        __builtin_prefetch(g + i + ahead, 0, 3);
        const size_t end = std::min(e, i + 16);
#pragma omp simd reduction(+ : s)
        for (size_t j = i; j < end; ++j) s += g[j] * g[j];
    }
    return s;
}

void update_chunk32_pf(float *__restrict g, float *__restrict p, float *__restrict m, float *__restrict v, size_t b,
                       size_t e, size_t ahead) noexcept {
    for (size_t i = b; i < e; i += 16) {
        __builtin_prefetch(g + i + ahead, 1, 3);
        __builtin_prefetch(p + i + ahead, 1, 3);
        __builtin_prefetch(m + i + ahead, 1, 3);
        __builtin_prefetch(v + i + ahead, 1, 3);
        const size_t end = std::min(e, i + 16);
#pragma omp simd
        for (size_t j = i; j < end; ++j) {
            const float gj = g[j];
            p[j] += 1e-6f * gj;
            m[j] = 0.9f * m[j] + gj;
            v[j] = 0.9f * v[j] + gj * gj;
            g[j] = 0.0f;
        }
    }
}

float sum_chunk16_pf(const uint16_t *__restrict g, size_t b, size_t e, size_t ahead) noexcept {
    float s = 0;
    for (size_t i = b; i < e; i += 32) {
        __builtin_prefetch(g + i + ahead, 0, 3);
        const size_t end = std::min(e, i + 32);
#pragma omp simd reduction(+ : s)
        for (size_t j = i; j < end; ++j) {
            uint32_t u = static_cast<uint32_t>(g[j]) << 16;
            float f;
            std::memcpy(&f, &u, 4);
            s += f * f;
        }
    }
    return s;
}

void update_chunk16_pf(uint16_t *__restrict g, float *__restrict p, float *__restrict m, float *__restrict v,
                       uint16_t *__restrict p16, size_t b, size_t e, size_t ahead) noexcept {
    for (size_t i = b; i < e; i += 16) {
        __builtin_prefetch(g + i + ahead, 1, 3);
        __builtin_prefetch(p + i + ahead, 1, 3);
        __builtin_prefetch(m + i + ahead, 1, 3);
        __builtin_prefetch(v + i + ahead, 1, 3);
        __builtin_prefetch(p16 + i + ahead, 1, 3);
        const size_t end = std::min(e, i + 16);
#pragma omp simd
        for (size_t j = i; j < end; ++j) {
            uint32_t u = static_cast<uint32_t>(g[j]) << 16;
            float gj;
            std::memcpy(&gj, &u, 4);
            const float pj = p[j] + 1e-6f * gj;
            p[j] = pj;
            m[j] = 0.9f * m[j] + gj;
            v[j] = 0.9f * v[j] + gj * gj;
            uint32_t w;
            std::memcpy(&w, &pj, 4);
            p16[j] = static_cast<uint16_t>(w >> 16);
            g[j] = 0;
        }
    }
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
// ---- dsm-bench quantize: the kernels' traffic with no arithmetic but an
// xor, with full-width loads and stores.
// GCC 12's AVX-512 intrinsics fill "undefined" operands with `__Y = __Y`,
// which -Wmaybe-uninitialized reports at every inlined call (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
void quant_in(const float *x, uint8_t *o, size_t n, int bits) noexcept {
    // 64 values: 256 bytes in, 64 (int8) or 32 (int4) bytes out.
    for (size_t i = 0; i < n; i += 64) {
        __m512i a = _mm512_xor_si512(_mm512_loadu_si512(x + i), _mm512_loadu_si512(x + i + 16));
        a = _mm512_xor_si512(a, _mm512_xor_si512(_mm512_loadu_si512(x + i + 32), _mm512_loadu_si512(x + i + 48)));
        if (bits == 8) _mm512_storeu_si512(o + i, a);
        else _mm256_storeu_si256(reinterpret_cast<__m256i *>(o + i / 2), _mm512_castsi512_si256(a));
    }
}
void quant_out(const uint8_t *q, float *o, size_t n, int bits, bool accumulate) noexcept {
    // 64 values: 64 (int8) or 32 (int4) bytes in (and 256 with accumulate), 256 bytes out.
    for (size_t i = 0; i < n; i += 64) {
        const __m512i a = bits == 8 ? _mm512_loadu_si512(q + i)
                                    : _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(q + i / 2)));
        for (int k = 0; k < 4; ++k) {
            __m512i v = a;
            if (accumulate) v = _mm512_xor_si512(v, _mm512_loadu_si512(o + i + 16 * k));
            _mm512_storeu_si512(o + i + 16 * k, v);
        }
    }
}
constexpr auto kQuantIn = quant_in;
constexpr auto kQuantOut = quant_out;
#else
constexpr void (*kQuantIn)(const float *, uint8_t *, size_t, int) noexcept = nullptr;
constexpr void (*kQuantOut)(const uint8_t *, float *, size_t, int, bool) noexcept = nullptr;
#endif

const BoundKernels *table(const char *name) noexcept {
    static const BoundKernels t{name,     adam,        sum_chunk32,    sum_chunk16,       update_chunk32,
                                update_chunk16, sum_chunk32_pf, sum_chunk16_pf, update_chunk32_pf, update_chunk16_pf,
                                kQuantIn, kQuantOut};
    return &t;
}

} // namespace
} // namespace bench
} // namespace dsm
