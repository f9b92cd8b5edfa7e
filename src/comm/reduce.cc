#include "dsm_config.h"

#include "comm/reduce.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "core/cpu.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/half.hpp"

#if defined(__SSE2__)
#include <emmintrin.h>
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

const char *op_label(Op op) noexcept {
    switch (op) {
    case Op::SUM: return "sum";
    case Op::MAX: return "max";
    case Op::MIN: return "min";
    }
    return "invalid";
}

void check_reduce(dsm_dtype_t dtype, Op op) {
    require_dtype_size(dtype); // names an unknown value
    DSM_REQUIRE(dtype == DSM_FLOAT32 || dtype == DSM_FLOAT64 || dtype == DSM_FLOAT16 || dtype == DSM_BFLOAT16,
                DSM_ERR_INVALID_ARGUMENT, "reductions of dtype ", dtype_name(dtype), " (",
                static_cast<int>(dtype), ") are not supported: use float32, float64, float16 or bfloat16");
    DSM_REQUIRE(op == Op::SUM || op == Op::MAX || op == Op::MIN, DSM_ERR_INVALID_ARGUMENT, "reduction op ",
                static_cast<int>(op), " is not SUM, MAX or MIN");
}

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

// n bytes from src (in L1) to dst, streaming the 16-byte aligned middle.
void stream_copy(void *dst, const void *src, size_t n) noexcept {
#if defined(__SSE2__)
    char *d = static_cast<char *>(dst);
    const char *s = static_cast<const char *>(src);
    const size_t head = std::min(n, (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15);
    std::memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
    for (; n >= 16; n -= 16, d += 16, s += 16)
        _mm_stream_si128(reinterpret_cast<__m128i *>(d), _mm_loadu_si128(reinterpret_cast<const __m128i *>(s)));
    std::memcpy(d, s, n);
#else
    std::memcpy(dst, src, n);
#endif
}

void stream_fence() noexcept {
#if defined(__SSE2__)
    _mm_sfence(); // order the streaming stores before what follows (a barrier)
#endif
}

// One copy of the loop per instruction set, picked at run time (the best
// this CPU runs, or the one set_reduce_isa() names: the tests run each): the
// build's baseline (SSE2) makes the 16-bit conversions two to four times
// slower than AVX2 or AVX-512. The same operations in the same order in
// every copy (no multiply to contract), so the same bits.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DSM_REDUCE_ISAS 1
#else
#define DSM_REDUCE_ISAS 0
#endif

template <typename Tr, typename F>
[[gnu::always_inline]] inline void reduce_loop(void *dst_v, const void *const *srcs_v, size_t nsrc,
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

using ReduceFn = void (*)(void *, const void *const *, size_t, size_t) noexcept;

// One instruction set's loops: [float32, float64, float16, bfloat16][sum, max, min].
struct Kernels {
    const char *name;
    ReduceFn fn[4][3];
};

template <template <typename, typename> class Run> Kernels table(const char *name) noexcept {
    return {name,
            {{Run<Plain<float>, Sum>::f, Run<Plain<float>, Max>::f, Run<Plain<float>, Min>::f},
             {Run<Plain<double>, Sum>::f, Run<Plain<double>, Max>::f, Run<Plain<double>, Min>::f},
             {Run<Fp16, Sum>::f, Run<Fp16, Max>::f, Run<Fp16, Min>::f},
             {Run<Bf16, Sum>::f, Run<Bf16, Max>::f, Run<Bf16, Min>::f}}};
}

template <typename Tr, typename F> struct Generic {
    static void f(void *d, const void *const *s, size_t n, size_t c) noexcept { reduce_loop<Tr, F>(d, s, n, c); }
};
const Kernels *generic_kernels() noexcept {
    static const Kernels k = table<Generic>("generic");
    return &k;
}
#if DSM_REDUCE_ISAS
template <typename Tr, typename F> struct Avx2 {
    __attribute__((target("avx2"))) static void f(void *d, const void *const *s, size_t n, size_t c) noexcept {
        reduce_loop<Tr, F>(d, s, n, c);
    }
};
template <typename Tr, typename F> struct Avx512 {
    __attribute__((target("avx512f"))) static void f(void *d, const void *const *s, size_t n, size_t c) noexcept {
        reduce_loop<Tr, F>(d, s, n, c);
    }
};
const Kernels *avx2_kernels() noexcept {
    static const Kernels k = table<Avx2>("avx2");
    return &k;
}
const Kernels *avx512_kernels() noexcept {
    static const Kernels k = table<Avx512>("avx512");
    return &k;
}
#else
const Kernels *avx2_kernels() noexcept { return nullptr; }
const Kernels *avx512_kernels() noexcept { return nullptr; }
#endif

IsaChoice<Kernels> g_isa{generic_kernels, avx2_kernels, avx512_kernels};

int op_index(Op op) noexcept { return op == Op::SUM ? 0 : op == Op::MAX ? 1 : 2; }

} // namespace

void reduce_sources(void *dst, const void *const *srcs, size_t nsrc, size_t count, dsm_dtype_t dtype,
                    Op op) noexcept {
    if (count == 0 || nsrc == 0) return;
    if (nsrc == 1) {
        // One member: its values, bit for bit.
        if (dst != srcs[0]) std::memcpy(dst, srcs[0], count * (dtype == DSM_FLOAT64 ? 8 : dtype == DSM_FLOAT32 ? 4 : 2));
        return;
    }
    int t;
    switch (dtype) {
    case DSM_FLOAT32: t = 0; break;
    case DSM_FLOAT64: t = 1; break;
    case DSM_FLOAT16: t = 2; break;
    case DSM_BFLOAT16: t = 3; break;
    default: return; // excluded by check_reduce()
    }
    g_isa.active().fn[t][op_index(op)](dst, srcs, nsrc, count);
}

const char *reduce_isa() noexcept { return g_isa.active().name; }

std::vector<std::string> reduce_isas() { return g_isa.available(); }

void set_reduce_isa(const std::string &name) { g_isa.set(name); }

void reduce_into(void *inout, const void *in, size_t count, dsm_dtype_t dtype, Op op) noexcept {
    const void *srcs[2] = {in, inout};
    reduce_sources(inout, srcs, 2, count, dtype, op);
}

} // namespace comm
} // namespace dsm
