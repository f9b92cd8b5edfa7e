// The AVX2 checksum kernel (checksum.hpp; this file is compiled with
// SIMD_AVX2_FLAGS, run only when simd::isa() allows).
#include "ckpt/checksum_body.hpp"

namespace dsm {
namespace ckpt {
namespace cksum {
#if defined(__AVX2__)
template <> const Kernels *kernels<simd::Isa::avx2>() noexcept { return table("avx2"); }
#else // the compiler cannot target this set here
template <> const Kernels *kernels<simd::Isa::avx2>() noexcept { return nullptr; }
#endif
} // namespace cksum
} // namespace ckpt
} // namespace dsm
