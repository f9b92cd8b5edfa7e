// Blockwise quantization (comm/quantize.hpp) on the memory of a space
// (device/space.hpp), one table per space, as amp/math.hpp's: the
// host-addressable table runs the host kernels through the space's run()
// (at once on the host, deferred on the simulated device), the CUDA table
// runs quantize_cuda.cu's kernels on the space's stream (the host's bits,
// 16-bit values converted as core/half.hpp converts them). Every call is
// checked on the host first (bits, block size, dtype, null buffers) and
// enqueued in the space's order.
//
// settle(): where a host backend is about to read or reuse memory that an
// enqueued call writes or reads (the staging buffers of alltoall_packed),
// the simulated device runs its queue; the host and CUDA (whose backend
// orders its sends on the same stream) have nothing to do.
#pragma once

#include <cstddef>
#include <memory>

#include "device/space.hpp"
#include "dsm.h"

namespace dsm {
namespace comm {
namespace quant {

class SpaceKernels {
public:
    virtual ~SpaceKernels() = default;
    // quantize()/dequantize() of quantize.hpp on the space's memory.
    virtual void quantize(const void *src, dsm_dtype_t dtype, size_t n, int bits, size_t block, void *dst) = 0;
    virtual void dequantize(const void *src, size_t n, int bits, size_t block, void *dst, dsm_dtype_t dtype,
                            bool accumulate) = 0;
    // dst (fp32) = src (FLOAT32, FLOAT16 or BFLOAT16), converted exactly.
    virtual void widen(const void *src, dsm_dtype_t dtype, size_t n, float *dst) = 0;
    virtual void settle() = 0;
    // "host", "simulated" or "cuda" (for the engine's report).
    virtual const char *where() const noexcept = 0;
};

// The table of `space` (kept by reference: the space outlives it).
// DSM_ERR_NOT_SUPPORTED for a CUDA space in a build without the CUDA kernels.
std::unique_ptr<SpaceKernels> make_space_kernels(device::Space &space);

} // namespace quant
} // namespace comm
} // namespace dsm
