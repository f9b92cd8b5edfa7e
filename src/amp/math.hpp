// amp's math on the memory of a space (device/space.hpp), one table per
// space: the host-addressable one runs convert.hpp's loops through the
// space's run() (at once on the host, deferred on the simulated device, the
// same bits either way); the CUDA one runs src/optim/*_cuda.cu's kernels on
// the space's stream, bit for bit as the host except inspect's sum (another
// fixed order). Calls are enqueued in the space's order; inspect() and
// has_nonfinite() wait and bring one small result back to the host.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "amp/convert.hpp"
#include "device/space.hpp"
#include "dsm.h"

namespace dsm {
namespace amp {

class Math {
public:
    virtual ~Math() = default;
    virtual void convert(const void *src, dsm_dtype_t src_type, void *dst, dsm_dtype_t dst_type, size_t n) = 0;
    // x *= s (16- and 32-bit data in fp32).
    virtual void scale(void *x, dsm_dtype_t type, size_t n, double s) = 0;
    // dst (fp32) += scale * src.
    virtual void accumulate(const void *src, dsm_dtype_t src_type, float *dst, size_t n, float scale) = 0;
    // norm_part(): the fp32 x's sum of (scale * x)^2 and whether some element is Inf or NaN.
    virtual NormPart inspect(const float *x, size_t n, float scale) = 0;
    // The same of x in `type` (fp32, fp16 or bf16) read in place: 16-bit
    // gradients inspected without their fp32 conversion.
    virtual NormPart inspect(const void *x, dsm_dtype_t type, size_t n, float scale) = 0;
    virtual bool has_nonfinite(const void *x, dsm_dtype_t type, size_t n) = 0;

    // Many accumulate_into()s in one go, with their bits: dst + offset of
    // each piece (elements of dst_type) += scale * its src (src_type), the
    // pieces in order (two pieces into the same elements add in that
    // order). Returns false, having done nothing, where the space has no
    // such launch (the host: the caller adds piece by piece); the CUDA space
    // makes one multi-tensor launch per kMtParamSegs pieces.
    struct Piece {
        const void *src;
        size_t offset, count;
    };
    virtual bool accumulate_pieces(const std::vector<Piece> &, dsm_dtype_t, void *, dsm_dtype_t, float) {
        return false;
    }

    // dst (float32, float16 or bfloat16) += scale * src; a 16-bit dst is
    // widened, added in fp32 and rounded once, with no buffer of n floats
    // (the host: amp::accumulate_into, a chunk at a time on the stack; CUDA:
    // one multi-tensor launch, in registers).
    virtual void accumulate_into(const void *src, dsm_dtype_t src_type, void *dst, dsm_dtype_t dst_type, size_t n,
                                 float scale) = 0;
};

// The table of `space` (kept by reference: the space outlives it).
std::unique_ptr<Math> make_math(device::Space &space);

} // namespace amp
} // namespace dsm
