// The instruction sets the CPU offers, and the choice among them of the
// kernels that pick theirs at run time (optim/optimizer.cc,
// comm/quantize.cc). libgcc checks that the OS saves the YMM/ZMM state
// (XGETBV) before it reports AVX2 or AVX-512.
#pragma once

#include <atomic>
#include <string>
#include <vector>

#include "core/error.hpp"

namespace dsm {

// AVX2 with FMA.
inline bool cpu_has_avx2() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return false;
#endif
}

// AVX-512 F, VL, BW and DQ, and AVX2.
inline bool cpu_has_avx512() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") && cpu_has_avx2();
#else
    return false;
#endif
}

// The kernel tables of one family (a struct with a `name`), one per
// instruction set, and the one in use: the best the build and the CPU have
// until set() picks another. Each getter returns its set's table, or NULL
// where the build lacks the set.
template <class Table>
class IsaChoice {
public:
    using Getter = const Table *(*)() noexcept;

    constexpr IsaChoice(Getter generic, Getter avx2, Getter avx512) noexcept
        : generic_(generic), avx2_(avx2), avx512_(avx512) {}

    // The kernels of one instruction set when both the build and the CPU have it.
    const Table *usable(const std::string &name) const noexcept {
        if (name == "avx512") return cpu_has_avx512() ? avx512_() : nullptr;
        if (name == "avx2") return cpu_has_avx2() ? avx2_() : nullptr;
        if (name == "generic") return generic_();
        return nullptr;
    }

    const Table *best() const noexcept {
        for (const char *name : {"avx512", "avx2"})
            if (const Table *k = usable(name)) return k;
        return generic_();
    }

    const Table &active() noexcept {
        const Table *k = active_.load(std::memory_order_acquire);
        if (k == nullptr) {
            k = best();
            active_.store(k, std::memory_order_release);
        }
        return *k;
    }

    // The names usable here, best first.
    std::vector<std::string> available() const {
        std::vector<std::string> v;
        for (const char *name : {"avx512", "avx2", "generic"})
            if (usable(name) != nullptr) v.emplace_back(name);
        return v;
    }

    // "auto" (the best) or one of avx512, avx2, generic:
    // DSM_ERR_INVALID_ARGUMENT for another name, DSM_ERR_NOT_SUPPORTED for
    // one this CPU or build cannot run.
    void set(const std::string &name) {
        if (name == "auto") {
            active_.store(best(), std::memory_order_release);
            return;
        }
        DSM_REQUIRE(name == "avx512" || name == "avx2" || name == "generic", DSM_ERR_INVALID_ARGUMENT,
                    "instruction set \"", name, "\" is not one of avx512, avx2, generic, auto");
        const Table *k = usable(name);
        DSM_REQUIRE(k != nullptr, DSM_ERR_NOT_SUPPORTED, "instruction set \"", name,
                    "\" is not supported by this CPU or build (best here: ", best()->name, ")");
        active_.store(k, std::memory_order_release);
    }

private:
    Getter generic_, avx2_, avx512_;
    std::atomic<const Table *> active_{nullptr};
};

} // namespace dsm
