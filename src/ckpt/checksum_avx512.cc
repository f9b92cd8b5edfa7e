// The AVX-512 checksum kernel (checksum.hpp; this file is compiled with
// SIMD_AVX512_FLAGS, run only when simd::isa() allows).
#include "ckpt/checksum_body.hpp"

namespace dsm {
namespace ckpt {
namespace cksum {
#if defined(__AVX512F__)
template <> const Kernels *kernels<simd::Isa::avx512>() noexcept { return table("avx512"); }
#else // the compiler cannot target this set here
template <> const Kernels *kernels<simd::Isa::avx512>() noexcept { return nullptr; }
#endif
} // namespace cksum
} // namespace ckpt
} // namespace dsm
