// The portable checksum kernel (checksum.hpp), compiled with the default
// flags (SSE2 on x86-64). Always available.
#include "ckpt/checksum_body.hpp"

namespace dsm {
namespace ckpt {
namespace cksum {
template <> const Kernels *kernels<simd::Isa::generic>() noexcept { return table("generic"); }
} // namespace cksum
} // namespace ckpt
} // namespace dsm
