// dsm-bench's portable bound kernels (bounds.hpp), compiled with the default
// flags (SSE2 on x86-64). Always available.
#include "bounds_body.hpp"

namespace dsm {
namespace bench {
template <> const BoundKernels *bound_kernels<simd::Isa::generic>() noexcept { return table("generic"); }
} // namespace bench
} // namespace dsm
