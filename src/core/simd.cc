// The instruction set of the CPU kernels (simd.hpp).
#include "dsm_config.h"

#include "core/simd.hpp"

#include "core/error.hpp"
#include "core/log.hpp"
#include "core/param.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace dsm {
namespace simd {

DSM_PARAM(topo, SIMD, param::Choice({"auto", "avx512", "avx2", "generic"}), "auto",
          "The widest SIMD instruction set of libdsm's CPU kernels (optimizers, conversions, norms, "
          "reductions, quantization, copies, checkpoint checksums): auto (the widest this CPU runs), avx512, "
          "avx2 or generic. A set wider than the CPU runs gives the CPU's widest. Conversions, norms, "
          "reductions, quantization and checksums give the same bits on every set; the optimizer updates "
          "differ by rounding (the wide sets fuse multiply-adds). Read once, at the first kernel call; checked at "
          "each engine creation, which fails for any other value.");

namespace {

constexpr const char *kNames[kIsaCount] = {"generic", "avx2", "avx512"};

// -1: not forced.
std::atomic<int> g_forced{-1};

int parse(const std::string &n) noexcept {
    for (int i = 0; i < kIsaCount; ++i)
        if (n == kNames[i]) return i;
    return -1;
}

// The narrower of cpu() and DSM_SIMD's, read once.
Isa from_environment() noexcept {
    static const Isa chosen = [] {
        const int widest = static_cast<int>(cpu());
        int want = widest;
        try {
            const std::string v = param_SIMD().value();
            if (v != "auto") want = parse(v);
        } catch (const std::exception &e) {
            DSM_WARN(TOPO, e.what(), ": using the CPU's widest set, ", kNames[widest]);
        }
        return static_cast<Isa>(want < widest ? want : widest);
    }();
    return chosen;
}

} // namespace

const char *name(Isa isa) noexcept { return kNames[static_cast<int>(isa)]; }

Isa cpu() noexcept {
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
    static const Isa best = [] {
        // F16C through CPUID (leaf 1, ECX): clang's __builtin_cpu_supports
        // does not know "f16c" (GCC's does).
        unsigned a = 0, b = 0, c = 0, d = 0;
        const bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
        const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
        const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                            __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
        return avx512 ? Isa::avx512 : avx2 ? Isa::avx2 : Isa::generic;
    }();
    return best;
#else
    return Isa::generic;
#endif
}

Isa isa() noexcept {
    const int f = g_forced.load(std::memory_order_acquire);
    return f >= 0 ? static_cast<Isa>(f) : from_environment();
}

void force(const std::string &n) {
    if (n == "auto") {
        g_forced.store(-1, std::memory_order_release);
        return;
    }
    const int i = parse(n);
    DSM_REQUIRE(i >= 0, DSM_ERR_INVALID_ARGUMENT, "instruction set \"", n,
                "\" is not one of avx512, avx2, generic, auto");
    DSM_REQUIRE(i <= static_cast<int>(cpu()), DSM_ERR_NOT_SUPPORTED, "instruction set \"", n,
                "\" is not supported by this CPU (widest here: ", name(cpu()), ")");
    g_forced.store(i, std::memory_order_release);
}

void check_environment() { (void)param_SIMD().value(); }

std::vector<std::string> available() {
    std::vector<std::string> v;
    for (int i = static_cast<int>(cpu()); i >= 0; --i) v.emplace_back(kNames[i]);
    return v;
}

} // namespace simd
} // namespace dsm

DSM_PARAM_LINK(core_simd)
