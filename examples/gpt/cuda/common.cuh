/*
 * What every kernel file of the CUDA path shares: the context, the error
 * checks, bf16 <-> fp32 helpers and warp reductions.
 */
#ifndef GPT_COMMON_CUH
#define GPT_COMMON_CUH

#include "gpt_kernels.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdarg>
#include <cstdio>

typedef __nv_bfloat16 bf16;

struct gpt_cuda_s {
    cudaStream_t stream;
    cublasHandle_t blas;
    cublasLtHandle_t lt;
    void *lt_workspace;          /* cuBLASLt's workspace (device) */
    size_t lt_workspace_bytes;
    int *enc_scratch;            /* encoder_backward's token grouping (device) */
    size_t enc_scratch_ints;
    int *enc_host;               /* its host staging (page-locked) */
    size_t enc_host_ints;
    cudaEvent_t enc_copied;      /* the staging's last copy to the device */
    bool enc_pending;            /* enc_copied was recorded */
    float *red;                  /* partial column sums (device) */
    size_t red_floats;
    char err[512];
};

/* Sets the context's message; returns -1 for `return gpt_fail(...)`. */
int gpt_fail(gpt_cuda_t ctx, const char *fmt, ...);

#define GPT_CUDA(ctx, call)                                                              \
    do {                                                                                 \
        cudaError_t e_ = (call);                                                         \
        if (e_ != cudaSuccess)                                                           \
            return gpt_fail(ctx, "%s:%d: %s: %s", __FILE__, __LINE__, #call,             \
                            cudaGetErrorString(e_));                                     \
    } while (0)
#define GPT_BLAS(ctx, call)                                                              \
    do {                                                                                 \
        cublasStatus_t s_ = (call);                                                      \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                 \
            return gpt_fail(ctx, "%s:%d: %s: %s", __FILE__, __LINE__, #call,             \
                            cublasGetStatusString(s_));                                  \
    } while (0)
/* After a launch: a bad configuration shows here, a fault at a later sync. */
#define GPT_LAUNCHED(ctx) GPT_CUDA(ctx, cudaGetLastError())
#define GPT_CHECK_CTX(ctx)                                                               \
    do {                                                                                 \
        if (!(ctx)) return -1;                                                           \
    } while (0)

__device__ __forceinline__ float to_f(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(float x) { return x; }
template <typename T> __device__ __forceinline__ T from_f(float x);
/* fp32 -> bf16 rounded to nearest even, with the host's bits (libdsm's
 * dsm_convert, core/half.hpp) for every input: a NaN keeps its sign and the
 * top of its payload and is made quiet, where __float2bfloat16_rn alone
 * turns every NaN into 0x7FFF. */
template <> __device__ __forceinline__ bf16 from_f<bf16>(float x) {
    const unsigned u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return __ushort_as_bfloat16((unsigned short)((u >> 16) | 0x0040u));
    return __float2bfloat16_rn(x);
}
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Row-major C(M,N) = alpha op(A) op(B) + beta C, batched with strides, bf16
 * in, ctype out, fp32 compute (cuBLAS is column-major: it computes C^T =
 * op(B)^T op(A)^T). A is (M,K) row-major, or (K,M) when ta; B is (K,N), or
 * (N,K) when tb. */
int gpt_gemm_batched(gpt_cuda_t ctx, bool ta, bool tb, int M, int N, int K, float alpha,
                     const void *A, long long sA, const void *B, long long sB, float beta,
                     void *C, cudaDataType_t ctype, long long sC, int batch);

/* The context's fp32 scratch for partial column sums, grown to n floats
 * (growing synchronizes the device: it happens on the first calls only). */
int gpt_red_scratch(gpt_cuda_t ctx, size_t n, float **out);

/* Column sums in fixed order: each of the `chunks` row chunks wrote its
 * partial sums of `nvec` vectors of cols (partial[(chunk * nvec + v) * cols
 * + c]); adds their total into grad[v] (gdt). */
int gpt_colsum_finish(gpt_cuda_t ctx, void *const *grads, int nvec, gpt_grad_dtype_t gdt,
                      const float *partial, int chunks, int cols);

/* Row chunks of a column reduction over `rows` rows: enough blocks to fill
 * the GPU, each a few rows deep (kernel blocks of 32 x COL_ROWS threads). */
#define GPT_COL_ROWS 8
static inline int gpt_col_chunks(int rows) {
    int c = (rows + GPT_COL_ROWS * 8 - 1) / (GPT_COL_ROWS * 8);
    return c < 1 ? 1 : (c > 128 ? 128 : c);
}

/* Blocks of 256 threads for a grid-stride loop over n elements. */
unsigned gpt_elementwise_blocks(size_t n);

#endif
