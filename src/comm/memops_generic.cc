// The portable memops kernels (memops.hpp), compiled with the default flags
// (SSE2 on x86-64). Always available.
#include "comm/memops_body.hpp"

namespace dsm {
namespace comm {
namespace memops {
template <> const Kernels *kernels<simd::Isa::generic>() noexcept { return table("generic"); }
} // namespace memops
} // namespace comm
} // namespace dsm
