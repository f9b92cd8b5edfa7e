// The portable quantization kernels, compiled with the default flags (the
// compiler vectorizes the loops of sixteen where it can). Always available.
#include "comm/quantize_body.hpp"

namespace dsm {
namespace comm {
namespace quant {
template <> const Kernels *kernels<simd::Isa::generic>() noexcept { return KernelSet<Scalar16>::table("generic"); }
} // namespace quant
} // namespace comm
} // namespace dsm
