// The blockwise quantization kernels (quantize.hpp), written once over a
// vector-traits type V that works on 16 values at a time and compiled per
// instruction set: quantize_generic.cc (default flags), quantize_avx2.cc
// (-mavx2 -mfma) and quantize_avx512.cc (-mavx512*). As with the optimizer's
// kernels (optim/kernels.hpp), everything here is in an unnamed namespace and
// calls builtins, so that no function compiled for one instruction set is
// shared by name with another file.
//
// V provides:
//   Acc, acc0(), acc(Acc, const float *x16), fin(Acc, float *amax, bool *bad)
//       the block's largest magnitude, and whether it holds an inf or a NaN
//   q8(const float *x16, float inv, float qmax, int8_t *q16)
//       q = round-to-nearest-even(clamp(x * inv, -qmax, qmax))
//   d8(const int8_t *q16, float s, float *out16, const float *add16)
//       out = q * s, or with `add` out = add + q * s (add == out: the
//       accumulate; a multiply, then an add: no FMA, so that every
//       instruction set gives the same bits)
// The 4-bit forms pack and unpack two values per byte around q8 and d8.
//
// A V may also quantize into int4 in one pass over memory (HasRuns):
//   amax_run(x, m, &bits)   *bits = max(*bits, the bits of |x[i]|) over the
//       first r values; returns r (a multiple of 16). A magnitude's bits order
//       as the magnitudes do, and an inf or a NaN gives 0x7F800000 or more.
//   q4_run(x, m, inv, qmax, q, y, &ybits)   q8's values of the first r values
//       of x (r: m rounded down to a multiple of 64), two per byte as pack4
//       lays them out; with y, amax_run's maximum of y's first r values
//       alongside (y: the next block, read from memory while this one is
//       quantized from the cache).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "comm/quantize.hpp"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace dsm {
namespace comm {
namespace quant {
namespace {

// Sixteen 8-bit values (in [-7, 7]) into eight bytes, the even-indexed one in
// the low nibble; and back, sign-extended.
inline void pack4(const int8_t *t, uint8_t *out) {
#if defined(__SSE2__)
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i *>(t));
    const __m128i lo = _mm_and_si128(v, _mm_set1_epi16(0x000F));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi16(0x00F0));
    const __m128i w = _mm_or_si128(lo, hi);
    _mm_storel_epi64(reinterpret_cast<__m128i *>(out), _mm_packus_epi16(w, w));
#else
    for (int j = 0; j < 8; ++j)
        out[j] = static_cast<uint8_t>((t[2 * j] & 0x0F) | ((t[2 * j + 1] & 0x0F) << 4));
#endif
}

inline int8_t nibble(unsigned v) { return static_cast<int8_t>(static_cast<int>(v ^ 8u) - 8); }

#if defined(__SSE2__)
// The same in registers: sixteen int8 values in, eight bytes out; and back.
inline void pack4r(__m128i v, uint8_t *out) {
    const __m128i lo = _mm_and_si128(v, _mm_set1_epi16(0x000F));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi16(0x00F0));
    const __m128i w = _mm_or_si128(lo, hi);
    _mm_storel_epi64(reinterpret_cast<__m128i *>(out), _mm_packus_epi16(w, w));
}
inline __m128i unpack4r(const uint8_t *in) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i *>(in));
    const __m128i m = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
    const __m128i v = _mm_unpacklo_epi8(_mm_and_si128(b, m), _mm_and_si128(_mm_srli_epi16(b, 4), m));
    return _mm_sub_epi8(_mm_xor_si128(v, eight), eight);
}
#endif

inline void unpack4(const uint8_t *in, int8_t *t) {
#if defined(__SSE2__)
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i *>(in));
    const __m128i m = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
    const __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
    const __m128i v = _mm_unpacklo_epi8(lo, hi);
    _mm_storeu_si128(reinterpret_cast<__m128i *>(t), _mm_sub_epi8(_mm_xor_si128(v, eight), eight));
#else
    for (int j = 0; j < 8; ++j) {
        t[2 * j] = nibble(in[j] & 0x0Fu);
        t[2 * j + 1] = nibble(in[j] >> 4);
    }
#endif
}

// One value, for the tails (and the whole generic kernel).
inline int8_t q1(float x, float inv, float qmax) {
    float v = x * inv;
    v = v > -qmax ? v : -qmax;
    v = v < qmax ? v : qmax;
    return static_cast<int8_t>(static_cast<int>(__builtin_nearbyintf(v)));
}

// Sixteen values one at a time: the generic kernel, left to the compiler.
struct Scalar16 {
    struct Acc {
        float m[16];
        float z[16];
    };
    static Acc acc0() {
        Acc a;
        for (int j = 0; j < 16; ++j) a.m[j] = a.z[j] = 0.0f;
        return a;
    }
    static Acc acc(Acc a, const float *x) {
        for (int j = 0; j < 16; ++j) {
            const float v = __builtin_fabsf(x[j]);
            a.m[j] = v > a.m[j] ? v : a.m[j];
            a.z[j] += x[j] * 0.0f;
        }
        return a;
    }
    static void fin(const Acc &a, float *amax, bool *bad) {
        float m = 0.0f, z = 0.0f;
        for (int j = 0; j < 16; ++j) {
            m = a.m[j] > m ? a.m[j] : m;
            z += a.z[j];
        }
        *amax = m;
        *bad = !(z == 0.0f);
    }
    static void q8(const float *x, float inv, float qmax, int8_t *q) {
        for (int j = 0; j < 16; ++j) q[j] = q1(x[j], inv, qmax);
    }
    static void d8(const int8_t *q, float s, float *out, const float *add) {
        if (add)
            for (int j = 0; j < 16; ++j) out[j] = add[j] + static_cast<float>(q[j]) * s;
        else
            for (int j = 0; j < 16; ++j) out[j] = static_cast<float>(q[j]) * s;
    }
#if defined(__SSE2__)
    static __m128i q8r(const float *x, float inv, float qmax) {
        alignas(16) int8_t t[16];
        q8(x, inv, qmax, t);
        return _mm_load_si128(reinterpret_cast<const __m128i *>(t));
    }
    static void d8r(__m128i q, float s, float *out, const float *add) {
        alignas(16) int8_t t[16];
        _mm_store_si128(reinterpret_cast<__m128i *>(t), q);
        d8(t, s, out, add);
    }
#endif
};

// Whether V has its own int4 dequantization of a block's whole vector part,
// V::d4(q, m, s, out, add), returning how many values it did (a
// multiple of 16; the body finishes the rest); else the body unpacks sixteen
// values at a time around d8r.
template <class V, class = void> struct HasD4 : std::false_type {};
template <class V> struct HasD4<V, std::void_t<decltype(&V::d4)>> : std::true_type {};

template <class V, class = void> struct HasRuns : std::false_type {};
template <class V> struct HasRuns<V, std::void_t<decltype(&V::amax_run)>> : std::true_type {};

// `Lines` cache lines of fp32 from p on into L2, ahead of the loop that
// reads them (the vector kernels' streams: the hardware prefetchers alone
// were seen to leave memory idle).
// Unrolled: a loop here measured slower in the kernels' hot loops.
template <int Lines> inline void prefetch_l2(const float *p) {
    if constexpr (Lines > 0) {
        __builtin_prefetch(p, 0, 2);
        prefetch_l2<Lines - 1>(p + 16);
    }
}

// A block's scale and its inverse from its largest magnitude: NaN where the
// block holds an inf or a NaN, 0 for an all-zero block.
inline void block_scale(float amax, bool bad, float qmax, float *s, float *inv) {
    *s = 0.0f;
    *inv = 0.0f;
    if (bad) *s = __builtin_nanf("");
    else if (amax > 0.0f) {
        *s = amax / qmax;
        *inv = qmax / amax;
    }
}

// A value's magnitude as the bits of an fp32.
inline uint32_t abs_bits(float x) {
    uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    return u & 0x7FFFFFFFu;
}

// The int4 values [i, m) of a block, sixteen and then two at a time; with
// `ahead`, the values that far ahead fetched meanwhile.
template <class V>
void quantize4_rest(const float *xb, size_t i, size_t m, float inv, float qmax, uint8_t *q, size_t ahead = 0) {
    for (; i + 16 <= m; i += 16) {
        if (ahead) __builtin_prefetch(xb + i + ahead);
#if defined(__SSE2__)
        pack4r(V::q8r(xb + i, inv, qmax), q + i / 2);
#else
        alignas(16) int8_t t[16];
        V::q8(xb + i, inv, qmax, t);
        pack4(t, q + i / 2);
#endif
    }
    for (; i < m; i += 2) {
        const int8_t lo = q1(xb[i], inv, qmax), hi = i + 1 < m ? q1(xb[i + 1], inv, qmax) : 0;
        q[i / 2] = static_cast<uint8_t>((lo & 0x0F) | ((hi & 0x0F) << 4));
    }
}

// The int4 quantization with a V that HasRuns: one pass over memory, each
// block's largest magnitude found while the block before it is quantized.
// The same bits as quantize_segment's two passes per block: amax is the float
// maximum of the magnitudes where no value is an inf or a NaN, and q8's
// arithmetic is the same. (The int8 quantization keeps the two passes: taken
// this way it measured no faster, and slower in blocks of 4096, in dsm-bench
// quantize on the development machine.)
template <class V> void quantize4_pipelined(const float *x, size_t n, size_t block, float *scales, uint8_t *data) {
    const float qmax = 7.0f;
    const auto amax_from = [](const float *y, size_t j, size_t m, uint32_t mb) {
        if (j < m) j += V::amax_run(y + j, m - j, &mb);
        for (; j < m; ++j) mb = abs_bits(y[j]) > mb ? abs_bits(y[j]) : mb;
        return mb;
    };
    uint32_t mb = amax_from(x, 0, n < block ? n : block, 0);
    size_t k = 0;
    for (size_t b0 = 0; b0 < n; b0 += block, ++k) {
        const size_t m = n - b0 < block ? n - b0 : block;
        const size_t mn = n - b0 - m < block ? n - b0 - m : block; // the next block's (0: none)
        const float *xb = x + b0, *xn = xb + m;
        const bool bad = mb >= 0x7F800000u;
        float amax, s, inv;
        std::memcpy(&amax, &mb, sizeof amax);
        block_scale(amax, bad, qmax, &s, &inv);
        std::memcpy(scales + k, &s, sizeof s);
        uint32_t nb = 0;
        size_t j = 0;
        if (bad) {
            std::memset(data + b0 / 2, 0, (m + 1) / 2);
        } else {
            size_t i = V::q4_run(xb, m < mn ? m : mn, inv, qmax, data + b0 / 2, xn, &nb);
            j = i;
            if (i + 64 <= m) i += V::q4_run(xb + i, m - i, inv, qmax, data + (b0 + i) / 2, nullptr, nullptr);
            quantize4_rest<V>(xb, i, m, inv, qmax, data + b0 / 2);
        }
        if (mn) mb = amax_from(xn, j, mn, nb);
    }
}

template <class V>
void quantize_segment(const float *x, size_t n, int bits, size_t block, float *scales, uint8_t *data) {
    const float qmax = bits == 8 ? 127.0f : 7.0f;
    size_t k = 0;
    for (size_t b0 = 0; b0 < n; b0 += block, ++k) {
        const size_t m = n - b0 < block ? n - b0 : block;
        const float *xb = x + b0;
        typename V::Acc a = V::acc0();
        size_t i = 0;
        for (; i + 16 <= m; i += 16) a = V::acc(a, xb + i);
        float amax = 0.0f;
        bool bad = false;
        V::fin(a, &amax, &bad);
        for (; i < m; ++i) {
            const float v = __builtin_fabsf(xb[i]);
            amax = v > amax ? v : amax;
            bad = bad || !(xb[i] * 0.0f == 0.0f);
        }
        float s, inv;
        block_scale(amax, bad, qmax, &s, &inv);
        std::memcpy(scales + k, &s, sizeof s);
        if (bits == 8) {
            int8_t *q = reinterpret_cast<int8_t *>(data) + b0;
            if (bad) {
                std::memset(q, 0, m);
                continue;
            }
            // The second pass reads the block from the cache: fetch the next
            // block meanwhile, so that memory and arithmetic overlap.
            for (i = 0; i + 16 <= m; i += 16) {
                __builtin_prefetch(xb + i + block);
                V::q8(xb + i, inv, qmax, q + i);
            }
            for (; i < m; ++i) q[i] = q1(xb[i], inv, qmax);
        } else {
            uint8_t *q = data + b0 / 2; // blocks hold an even number of values
            if (bad) {
                std::memset(q, 0, (m + 1) / 2);
                continue;
            }
            quantize4_rest<V>(xb, 0, m, inv, qmax, q, block); // the next block fetched meanwhile
        }
    }
}

template <class V>
void dequantize_segment(const float *scales, const uint8_t *data, size_t n, int bits, size_t block, float *out,
                        const float *add) {
    size_t k = 0;
    for (size_t b0 = 0; b0 < n; b0 += block, ++k) {
        const size_t m = n - b0 < block ? n - b0 : block;
        float s;
        std::memcpy(&s, scales + k, sizeof s);
        float *ob = out + b0;
        const float *ab = add ? add + b0 : nullptr;
        size_t i = 0;
        if (bits == 8) {
            const int8_t *q = reinterpret_cast<const int8_t *>(data) + b0;
            for (; i + 16 <= m; i += 16) V::d8(q + i, s, ob + i, ab ? ab + i : nullptr);
            for (; i < m; ++i) {
                const float v = static_cast<float>(q[i]) * s;
                ob[i] = ab ? ab[i] + v : v;
            }
        } else {
            const uint8_t *q = data + b0 / 2;
            if constexpr (HasD4<V>::value) i = V::d4(q, m, s, ob, ab);
            for (; i + 16 <= m; i += 16) {
#if defined(__SSE2__)
                V::d8r(unpack4r(q + i / 2), s, ob + i, ab ? ab + i : nullptr);
#else
                alignas(16) int8_t t[16];
                unpack4(q + i / 2, t);
                V::d8(t, s, ob + i, ab ? ab + i : nullptr);
#endif
            }
            for (; i < m; ++i) {
                const uint8_t byte = q[i / 2];
                const float v = static_cast<float>(nibble(i % 2 ? byte >> 4 : byte & 0x0Fu)) * s;
                ob[i] = ab ? ab[i] + v : v;
            }
        }
    }
}

template <class V> struct KernelSet {
    static void quantize(const float *x, size_t n, int bits, size_t block, float *scales, uint8_t *data) {
        if constexpr (HasRuns<V>::value)
            if (bits == 4) return quantize4_pipelined<V>(x, n, block, scales, data);
        quantize_segment<V>(x, n, bits, block, scales, data);
    }
    static void dequantize(const float *scales, const uint8_t *data, size_t n, int bits, size_t block, float *out,
                           const float *add) {
        dequantize_segment<V>(scales, data, n, bits, block, out, add);
    }
    static const Kernels *table(const char *name) {
        static const Kernels k{name, &quantize, &dequantize};
        return &k;
    }
};

} // namespace
} // namespace quant
} // namespace comm
} // namespace dsm
