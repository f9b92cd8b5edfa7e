// The CUDA resources of one dsm-bench measurement on a device (a stream,
// buffers and events), released however it ends, and the check that turns
// a CUDA error into DSM_ERR_CUDA. For the files that have the CUDA runtime's
// header (bench_optimizer.cc, bench_quantize_cuda.cc).
#pragma once

#include <cstddef>
#include <vector>

#include <cuda_runtime_api.h>

#include "core/error.hpp"

namespace dsm {
namespace bench {

inline void cuda_check(cudaError_t e, const char *what) {
    if (e != cudaSuccess) DSM_FAIL(DSM_ERR_CUDA, what, ": ", cudaGetErrorString(e));
}

struct CudaRun {
    std::vector<void *> buffers;
    std::vector<cudaEvent_t> events;
    cudaStream_t stream = nullptr;
    CudaRun() { cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate"); }
    ~CudaRun() {
        for (void *b : buffers) cudaFree(b);
        for (cudaEvent_t e : events) cudaEventDestroy(e);
        cudaStreamDestroy(stream);
    }
    CudaRun(const CudaRun &) = delete;
    CudaRun &operator=(const CudaRun &) = delete;
    void *alloc(size_t bytes) {
        void *p = nullptr;
        cuda_check(cudaMalloc(&p, bytes), "cudaMalloc");
        buffers.push_back(p);
        return p;
    }
    cudaEvent_t event() {
        cudaEvent_t e = nullptr;
        cuda_check(cudaEventCreate(&e), "cudaEventCreate");
        events.push_back(e);
        return e;
    }
};

} // namespace bench
} // namespace dsm
