// The CUDA kernels of blockwise quantization (quantize_cuda.cu): the same
// packed form and the same bits as the host kernels of comm/quantize.hpp
// (scales first, then the values; q = round-to-nearest-even(clamp(x *
// (qmax / max|x|))), x' = q * s with every multiply and add rounded
// separately, never contracted into an FMA), for fp32 values in device
// memory. One CUDA block per quantization block. Each call enqueues its work
// on `stream` and returns; the arguments are checked on the host first (as
// comm::quant::quantize checks them), and a failed launch throws
// DSM_ERR_CUDA. Built only where nvcc works (DSM_HAVE_CUDA_KERNELS); no
// GPU has run them in this tree's tests yet where none was present (the
// device round trip of test_quantize skips without one).
#pragma once

#include <cstddef>

struct CUstream_st;
typedef struct CUstream_st *cudaStream_t;

namespace dsm {
namespace comm {
namespace quant {
namespace cuda {

// Checked (quantize.cc): n fp32 values at `x` into the packed form at `dst`
// (packed_bytes() bytes); the packed form at `src` into n fp32 values at
// `out` (or added into them).
void quantize(const float *x, size_t n, int bits, size_t block, void *dst, cudaStream_t stream);
void dequantize(const void *src, size_t n, int bits, size_t block, float *out, bool accumulate, cudaStream_t stream);

// The values' formats of the *_as launchers.
constexpr int kF32 = 0, kF16 = 1, kBF16 = 2;

// The launchers (quantize_cuda.cu), unchecked: the launch's cudaError_t
// (0: launched), and its description. The *_as forms read or write fp32,
// fp16 or bf16 values (`format`), converted as core/half.hpp does on the
// host (so a 16-bit round trip has the host's bits); dequantization adds
// into fp32 values only. launch_widen: out (fp32) = x, converted.
int launch_quantize(const float *x, size_t n, int bits, size_t block, void *dst, cudaStream_t stream);
int launch_dequantize(const void *src, size_t n, int bits, size_t block, float *out, bool accumulate,
                      cudaStream_t stream);
int launch_quantize_as(const void *x, int format, size_t n, int bits, size_t block, void *dst, cudaStream_t stream);
int launch_dequantize_as(const void *src, size_t n, int bits, size_t block, void *out, int format, bool accumulate,
                         cudaStream_t stream);
int launch_widen(const void *x, int format, size_t n, float *out, cudaStream_t stream);
const char *error_string(int error);

} // namespace cuda
} // namespace quant
} // namespace comm
} // namespace dsm
