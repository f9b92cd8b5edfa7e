// The one place that picks the SIMD instruction set of every CPU kernel
// family (optim's fused optimizers, comm's quantization and reductions, the
// shm backend's streaming copies, amp's conversions and norms, ckpt's
// checksum; dsm-bench's bounds too, at the CPU's widest set).
//
// The pattern, the same for every family:
//   - the family's kernels are a table (a struct of function pointers with a
//     `name`), declared once in the family's header as
//         template <simd::Isa> const Kernels *kernels() noexcept;
//   - each instruction set's table is defined in a file of its own,
//     <family>_generic.cc / _avx2.cc / _avx512.cc (or the generic one in the
//     family's main file), compiled with that set's flags (Makefile.am:
//     SIMD_AVX2_FLAGS, SIMD_AVX512_FLAGS); a file the compiler cannot build
//     for its set returns NULL;
//   - the family holds a simd::Dispatch<Kernels> and calls
//     dispatch.active(), which follows simd::isa().
// simd::isa() is the widest set that the CPU runs and DSM_SIMD allows;
// simd::force() is the one hook that tests and benchmarks use to run every
// family on one set. Every family but the optimizer updates gives the same
// bits on every set (the updates' wide sets fuse multiply-adds).
#pragma once

#include <atomic>
#include <string>
#include <vector>

namespace dsm {
namespace simd {

// Ordered: each set includes the ones before it.
//   generic  the build's baseline (SSE2 on x86-64)
//   avx2     AVX2, FMA and F16C
//   avx512   AVX-512 F, VL, BW and DQ, and avx2
enum class Isa : int { generic = 0, avx2 = 1, avx512 = 2 };
constexpr int kIsaCount = 3;

const char *name(Isa isa) noexcept;

// The widest set this CPU runs (libgcc checks that the OS saves the YMM/ZMM
// state before it reports AVX2 or AVX-512).
Isa cpu() noexcept;

// The set in use: force()'s, else the narrower of cpu() and DSM_SIMD's (a
// set wider than the CPU runs gives the CPU's widest: DSM_SIMD caps the
// choice). A DSM_SIMD value that is not a set's name is reported (logged)
// once here and ignored; check_environment() makes it an error.
Isa isa() noexcept;

// DSM_ERR_INVALID_ARGUMENT when DSM_SIMD is not one of auto, avx512, avx2,
// generic (case-insensitive), naming the value and those accepted. Engine
// creation calls it, agreed over the engine's ranks.
void check_environment();

// Run every family on `name` ("auto": drop the forcing, back to isa()'s
// rule). DSM_ERR_INVALID_ARGUMENT for a name that is not avx512, avx2,
// generic or auto; DSM_ERR_NOT_SUPPORTED for a set this CPU cannot run.
void force(const std::string &name);

// The sets this CPU runs, widest first (generic last).
std::vector<std::string> available();

// A family's tables, one per set, and the one in use: that of isa(), or
// the widest narrower one the build has.
template <class Table> class Dispatch {
public:
    using Getter = const Table *(*)() noexcept;

    constexpr Dispatch(Getter generic, Getter avx2, Getter avx512) noexcept : get_{generic, avx2, avx512} {}

    const Table &active() noexcept { return at(isa()); }

    // The table of `set`, or of the widest narrower set the build has (a
    // benchmark's bound: at(cpu()), whatever DSM_SIMD says).
    const Table &at(Isa set) noexcept {
        const int i = static_cast<int>(set);
        const Table *t = cache_[i].load(std::memory_order_acquire);
        if (t == nullptr) {
            for (int j = i; j >= 0 && t == nullptr; --j) t = get_[j]();
            cache_[i].store(t, std::memory_order_release);
        }
        return *t;
    }

private:
    Getter get_[kIsaCount];
    std::atomic<const Table *> cache_[kIsaCount]{};
};

} // namespace simd
} // namespace dsm
