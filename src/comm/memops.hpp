// The comm layer's memory kernels, one table per SIMD instruction set
// (core/simd.hpp's pattern): the elementwise reductions of node-local
// sources (reduce.hpp's reduce_sources) and the streaming copies of large
// outputs (the shm backend's alltoall_direct). memops_body.hpp writes them
// once; memops_generic.cc, memops_avx2.cc and memops_avx512.cc compile them
// per set. Every set gives the same bits: the reductions do the same
// operations in the same order (no multiply to contract), the copies copy.
#pragma once

#include <cstddef>

#include "core/simd.hpp"

namespace dsm {
namespace comm {
namespace memops {

// dst = srcs[0] op ... op srcs[nsrc - 1] over count elements (reduce_sources()).
using ReduceFn = void (*)(void *dst, const void *const *srcs, size_t nsrc, size_t count) noexcept;

struct Kernels {
    const char *name;
    // [float32, float64, float16, bfloat16][sum, max, min]
    ReduceFn reduce[4][3];
    // n bytes from src to dst, the aligned middle of dst with streaming
    // (non-temporal) stores; stream_fence() orders them before what follows.
    void (*stream_copy)(void *dst, const void *src, size_t n) noexcept;
    void (*stream_fence)() noexcept;
};

// One instruction set's table, or nullptr where the build lacks the set.
template <simd::Isa> const Kernels *kernels() noexcept;

// The table of simd::isa() (reduce.cc).
const Kernels &active() noexcept;

} // namespace memops
} // namespace comm
} // namespace dsm
