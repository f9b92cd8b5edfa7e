// The AVX2 memops kernels (memops.hpp; this file is compiled with
// SIMD_AVX2_FLAGS, run only when simd::isa() allows).
#include "comm/memops_body.hpp"

namespace dsm {
namespace comm {
namespace memops {
#if defined(__AVX2__)
template <> const Kernels *kernels<simd::Isa::avx2>() noexcept { return table("avx2"); }
#else // the compiler cannot target this set here
template <> const Kernels *kernels<simd::Isa::avx2>() noexcept { return nullptr; }
#endif
} // namespace memops
} // namespace comm
} // namespace dsm
