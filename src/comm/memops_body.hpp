// The bodies of memops.hpp's kernels, included by memops_generic.cc,
// memops_avx2.cc and memops_avx512.cc only, each compiled for its
// instruction set. Everything is in an unnamed namespace so that each file
// keeps its own copies (a function shared by name between files compiled
// with different flags could be merged by the linker into the widest copy).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "comm/memops.hpp"
#include "core/half.hpp"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__AVX2__)
#include <immintrin.h>
#endif

// Each loop must vectorize although the build uses -O2 (where GCC hardly
// vectorizes): OpenMP's simd directive asks for it explicitly, no threads.
#if defined(_OPENMP)
#define DSM_SIMD _Pragma("omp simd")
#else
#define DSM_SIMD
#endif

namespace dsm {
namespace comm {
namespace memops {
namespace {

// How an element is widened for combining and narrowed when stored.
template <typename T> struct Plain {
    using Elem = T;
    using Acc = T;
    static Acc load(Elem x) noexcept { return x; }
    static Elem store(Acc a) noexcept { return a; }
};
struct Fp16 {
    using Elem = uint16_t;
    using Acc = float;
    static Acc load(Elem x) noexcept { return fp16_to_fp32(x); }
    static Elem store(Acc a) noexcept { return fp32_to_fp16(a); }
};
struct Bf16 {
    using Elem = uint16_t;
    using Acc = float;
    static Acc load(Elem x) noexcept { return bf16_to_fp32(x); }
    static Elem store(Acc a) noexcept { return fp32_to_bf16(a); }
};

// acc op x. MAX/MIN keep acc unless x compares greater/smaller, which is
// what the vector max/min instructions do (a NaN in x is skipped).
struct Sum {
    template <typename A> static A apply(A acc, A x) noexcept { return acc + x; }
};
struct Max {
    template <typename A> static A apply(A acc, A x) noexcept { return x > acc ? x : acc; }
};
struct Min {
    template <typename A> static A apply(A acc, A x) noexcept { return x < acc ? x : acc; }
};

// Blocks small enough for L1: all sources of a block are combined into acc
// before the block is stored, so dst may be one of the sources.
constexpr size_t kBlock = 1024;

// Outputs at least this large are written with streaming (non-temporal)
// stores: they exceed the caches anyway, and skipping the read-for-ownership
// of every destination line saves a third of the memory traffic of a
// two-source reduction.
constexpr size_t kStreamBytes = size_t(8) << 20;

// n bytes from src to dst, the aligned middle of dst with streaming stores:
// 32-byte stores where the file is compiled for AVX2, else 16-byte ones
// (every x86-64 has SSE2), else memcpy.
void stream_copy(void *dst, const void *src, size_t n) noexcept {
    char *d = static_cast<char *>(dst);
    const char *s = static_cast<const char *>(src);
#if defined(__AVX2__)
    const size_t head = std::min(n, (32 - (reinterpret_cast<uintptr_t>(d) & 31)) & 31);
    std::memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
    for (; n >= 64; n -= 64, d += 64, s += 64) {
        const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(s));
        const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(s + 32));
        _mm256_stream_si256(reinterpret_cast<__m256i *>(d), a);
        _mm256_stream_si256(reinterpret_cast<__m256i *>(d + 32), b);
    }
#elif defined(__SSE2__)
    const size_t head = std::min(n, (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15);
    std::memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
    for (; n >= 64; n -= 64, d += 64, s += 64) {
        const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i *>(s));
        const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i *>(s + 16));
        const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i *>(s + 32));
        const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i *>(s + 48));
        _mm_stream_si128(reinterpret_cast<__m128i *>(d), a);
        _mm_stream_si128(reinterpret_cast<__m128i *>(d + 16), b);
        _mm_stream_si128(reinterpret_cast<__m128i *>(d + 32), c);
        _mm_stream_si128(reinterpret_cast<__m128i *>(d + 48), e);
    }
#endif
    std::memcpy(d, s, n);
}

void stream_fence() noexcept {
#if defined(__SSE2__)
    _mm_sfence();
#endif
}

template <typename Tr, typename F> void reduce_loop(void *dst_v, const void *const *srcs_v, size_t nsrc,
                                                    size_t count) noexcept {
    using Elem = typename Tr::Elem;
    using Acc = typename Tr::Acc;
    alignas(64) Acc acc[kBlock];
    alignas(64) Elem out[kBlock];
    Elem *dst = static_cast<Elem *>(dst_v);
    const bool stream = count * sizeof(Elem) >= kStreamBytes;
    for (size_t base = 0; base < count; base += kBlock) {
        const size_t m = std::min(kBlock, count - base);
        const Elem *s0 = static_cast<const Elem *>(srcs_v[0]) + base;
        DSM_SIMD
        for (size_t i = 0; i < m; ++i) acc[i] = Tr::load(s0[i]);
        for (size_t k = 1; k < nsrc; ++k) {
            const Elem *s = static_cast<const Elem *>(srcs_v[k]) + base;
            DSM_SIMD
            for (size_t i = 0; i < m; ++i) acc[i] = F::apply(acc[i], Tr::load(s[i]));
        }
        Elem *d = stream ? out : dst + base;
        DSM_SIMD
        for (size_t i = 0; i < m; ++i) d[i] = Tr::store(acc[i]);
        if (stream) stream_copy(dst + base, out, m * sizeof(Elem));
    }
    if (stream) stream_fence();
}

// The table of this file's instruction set.
const Kernels *table(const char *name) noexcept {
    static const Kernels k{name,
                           {{reduce_loop<Plain<float>, Sum>, reduce_loop<Plain<float>, Max>, reduce_loop<Plain<float>, Min>},
                            {reduce_loop<Plain<double>, Sum>, reduce_loop<Plain<double>, Max>,
                             reduce_loop<Plain<double>, Min>},
                            {reduce_loop<Fp16, Sum>, reduce_loop<Fp16, Max>, reduce_loop<Fp16, Min>},
                            {reduce_loop<Bf16, Sum>, reduce_loop<Bf16, Max>, reduce_loop<Bf16, Min>}},
                           stream_copy,
                           stream_fence};
    return &k;
}

} // namespace
} // namespace memops
} // namespace comm
} // namespace dsm
