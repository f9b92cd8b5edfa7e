// dsm-bench's AVX2 bound kernels (bounds.hpp; this file is compiled with
// SIMD_AVX2_FLAGS, run only where the CPU has the set).
#include "bounds_body.hpp"

namespace dsm {
namespace bench {
#if defined(__AVX2__)
template <> const BoundKernels *bound_kernels<simd::Isa::avx2>() noexcept { return table("avx2"); }
#else // the compiler cannot target this set here
template <> const BoundKernels *bound_kernels<simd::Isa::avx2>() noexcept { return nullptr; }
#endif
} // namespace bench
} // namespace dsm
