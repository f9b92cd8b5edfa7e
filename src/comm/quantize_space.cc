// Blockwise quantization on a space's memory (quantize_space.hpp): the
// host-addressable table, the CUDA one, and the choice.
#include "dsm_config.h"

#include "comm/quantize_space.hpp"

#include <cstring>

#include "comm/quantize.hpp"
#include "core/error.hpp"
#include "core/half.hpp"

#if DSM_HAVE_CUDA_KERNELS
#include <cuda_runtime.h>

#include "comm/quantize_cuda.hpp"
#endif

namespace dsm {
namespace comm {
namespace quant {

namespace {

void widen_host(const void *src, dsm_dtype_t dtype, size_t n, float *dst) {
    if (dtype == DSM_FLOAT32) {
        std::memcpy(dst, src, n * sizeof(float));
        return;
    }
    const uint16_t *h = static_cast<const uint16_t *>(src);
    if (dtype == DSM_FLOAT16)
        for (size_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(h[i]);
    else
        for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(h[i]);
}

class HostKernels final : public SpaceKernels {
public:
    explicit HostKernels(device::Space &space) : space_(space) {}
    void quantize(const void *src, dsm_dtype_t dtype, size_t n, int bits, size_t block, void *dst) override {
        check_args(dtype, n, bits, block, src, dst);
        if (n > 0) space_.run([=] { quant::quantize(src, dtype, n, bits, block, dst); });
    }
    void dequantize(const void *src, size_t n, int bits, size_t block, void *dst, dsm_dtype_t dtype,
                    bool accumulate) override {
        check_args(dtype, n, bits, block, src, dst);
        DSM_REQUIRE(!accumulate || dtype == DSM_FLOAT32, DSM_ERR_INVALID_ARGUMENT,
                    "dequantization adds into FLOAT32 values only");
        if (n > 0) space_.run([=] { quant::dequantize(src, n, bits, block, dst, dtype, accumulate); });
    }
    void widen(const void *src, dsm_dtype_t dtype, size_t n, float *dst) override {
        check_args(dtype, n, 8, kMinBlock, src, dst);
        if (n > 0) space_.run([=] { widen_host(src, dtype, n, dst); });
    }
    void settle() override {
        if (space_.kind() != device::Kind::HOST) space_.synchronize();
    }
    const char *where() const noexcept override {
        return space_.kind() == device::Kind::HOST ? "host" : "simulated";
    }

private:
    device::Space &space_;
};

#if DSM_HAVE_CUDA_KERNELS
int format_of(dsm_dtype_t dtype) {
    return dtype == DSM_FLOAT16 ? cuda::kF16 : dtype == DSM_BFLOAT16 ? cuda::kBF16 : cuda::kF32;
}

class CudaKernels final : public SpaceKernels {
public:
    explicit CudaKernels(device::Space &space) : space_(space) {}
    void quantize(const void *src, dsm_dtype_t dtype, size_t n, int bits, size_t block, void *dst) override {
        check_args(dtype, n, bits, block, src, dst);
        check(cuda::launch_quantize_as(src, format_of(dtype), n, bits, block, dst, stream()), "quantize");
    }
    void dequantize(const void *src, size_t n, int bits, size_t block, void *dst, dsm_dtype_t dtype,
                    bool accumulate) override {
        check_args(dtype, n, bits, block, src, dst);
        DSM_REQUIRE(!accumulate || dtype == DSM_FLOAT32, DSM_ERR_INVALID_ARGUMENT,
                    "dequantization adds into FLOAT32 values only");
        check(cuda::launch_dequantize_as(src, n, bits, block, dst, format_of(dtype), accumulate, stream()),
              "dequantize");
    }
    void widen(const void *src, dsm_dtype_t dtype, size_t n, float *dst) override {
        check_args(dtype, n, 8, kMinBlock, src, dst);
        check(cuda::launch_widen(src, format_of(dtype), n, dst, stream()), "widen");
    }
    void settle() override {}
    const char *where() const noexcept override { return "cuda"; }

private:
    cudaStream_t stream() const noexcept { return static_cast<cudaStream_t>(space_.queue().handle()); }
    static void check(int e, const char *what) {
        DSM_REQUIRE(e == 0, DSM_ERR_CUDA, what, " kernel on the device: ", cuda::error_string(e));
    }
    device::Space &space_;
};
#endif

} // namespace

std::unique_ptr<SpaceKernels> make_space_kernels(device::Space &space) {
    if (space.host_addressable()) return std::make_unique<HostKernels>(space);
#if DSM_HAVE_CUDA_KERNELS
    return std::make_unique<CudaKernels>(space);
#else
    DSM_FAIL(DSM_ERR_NOT_SUPPORTED, "quantization on ", space.name(),
             " memory needs the CUDA kernels, which this build lacks");
#endif
}

} // namespace quant
} // namespace comm
} // namespace dsm
