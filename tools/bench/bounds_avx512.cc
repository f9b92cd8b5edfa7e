// dsm-bench's AVX-512 bound kernels (bounds.hpp; this file is compiled with
// SIMD_AVX512_FLAGS, run only where the CPU has the set).
#include "bounds_body.hpp"

namespace dsm {
namespace bench {
#if defined(__AVX512F__)
template <> const BoundKernels *bound_kernels<simd::Isa::avx512>() noexcept { return table("avx512"); }
#else // the compiler cannot target this set here
template <> const BoundKernels *bound_kernels<simd::Isa::avx512>() noexcept { return nullptr; }
#endif
} // namespace bench
} // namespace dsm
