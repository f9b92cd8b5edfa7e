// The AVX-512 memops kernels (memops.hpp; this file is compiled with
// SIMD_AVX512_FLAGS, run only when simd::isa() allows).
#include "comm/memops_body.hpp"

namespace dsm {
namespace comm {
namespace memops {
#if defined(__AVX512F__)
template <> const Kernels *kernels<simd::Isa::avx512>() noexcept { return table("avx512"); }
#else // the compiler cannot target this set here
template <> const Kernels *kernels<simd::Isa::avx512>() noexcept { return nullptr; }
#endif
} // namespace memops
} // namespace comm
} // namespace dsm
