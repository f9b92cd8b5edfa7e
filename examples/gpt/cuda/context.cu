/*
 * The context of the CUDA path: stream, cuBLAS and cuBLASLt handles, the
 * cuBLASLt workspace, error messages; the row-major batched GEMM that
 * attention uses, the fixed-order column sums of the bias gradients, and
 * the fp32 <-> bf16 cast.
 */
#include "common.cuh"

#include <cstdlib>
#include <cstring>

static char create_err[512];

int gpt_fail(gpt_cuda_t ctx, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx ? ctx->err : create_err, sizeof create_err, fmt, ap);
    va_end(ap);
    return -1;
}

const char *gpt_cuda_error(gpt_cuda_t ctx) { return ctx ? ctx->err : create_err; }

/* 32 MiB: what cuBLASLt's heuristics ask for at most on Hopper. */
static const size_t LT_WORKSPACE = (size_t)32 << 20;

int gpt_cuda_create(void *stream, gpt_cuda_t *out) {
    if (!out) return gpt_fail(nullptr, "gpt_cuda_create: ctx is NULL");
    *out = nullptr;
    gpt_cuda_t ctx = (gpt_cuda_t)calloc(1, sizeof(struct gpt_cuda_s));
    if (!ctx) return gpt_fail(nullptr, "gpt_cuda_create: out of host memory");
    ctx->stream = (cudaStream_t)stream;
    cublasStatus_t s = cublasCreate(&ctx->blas);
    if (s != CUBLAS_STATUS_SUCCESS) {
        free(ctx);
        return gpt_fail(nullptr, "cublasCreate: %s", cublasGetStatusString(s));
    }
    s = cublasLtCreate(&ctx->lt);
    if (s != CUBLAS_STATUS_SUCCESS) {
        cublasDestroy(ctx->blas);
        free(ctx);
        return gpt_fail(nullptr, "cublasLtCreate: %s", cublasGetStatusString(s));
    }
    cudaError_t e = cudaMalloc(&ctx->lt_workspace, LT_WORKSPACE);
    if (e != cudaSuccess) {
        cublasLtDestroy(ctx->lt);
        cublasDestroy(ctx->blas);
        free(ctx);
        return gpt_fail(nullptr, "cudaMalloc(%zu) of the cuBLASLt workspace: %s", LT_WORKSPACE,
                        cudaGetErrorString(e));
    }
    ctx->lt_workspace_bytes = LT_WORKSPACE;
    if (cudaEventCreateWithFlags(&ctx->enc_copied, cudaEventDisableTiming) != cudaSuccess) {
        ctx->enc_copied = nullptr;
        gpt_cuda_free(&ctx);
        return gpt_fail(nullptr, "cudaEventCreateWithFlags failed");
    }
    if (cublasSetStream(ctx->blas, ctx->stream) != CUBLAS_STATUS_SUCCESS ||
        cublasSetWorkspace(ctx->blas, ctx->lt_workspace, ctx->lt_workspace_bytes) !=
            CUBLAS_STATUS_SUCCESS) {
        gpt_cuda_free(&ctx);
        return gpt_fail(nullptr, "cublasSetStream/cublasSetWorkspace failed");
    }
    *out = ctx;
    return 0;
}

void gpt_cuda_free(gpt_cuda_t *pctx) {
    if (!pctx || !*pctx) return;
    gpt_cuda_t ctx = *pctx;
    cudaStreamSynchronize(ctx->stream);
    cudaFree(ctx->lt_workspace);
    cudaFree(ctx->enc_scratch);
    cudaFree(ctx->red);
    cudaFreeHost(ctx->enc_host);
    if (ctx->enc_copied) cudaEventDestroy(ctx->enc_copied);
    cublasLtDestroy(ctx->lt);
    cublasDestroy(ctx->blas);
    free(ctx);
    *pctx = nullptr;
}

int gpt_cuda_set_stream(gpt_cuda_t ctx, void *stream) {
    GPT_CHECK_CTX(ctx);
    ctx->stream = (cudaStream_t)stream;
    GPT_BLAS(ctx, cublasSetStream(ctx->blas, ctx->stream));
    /* cublasSetStream resets the workspace to cuBLAS's own. */
    GPT_BLAS(ctx, cublasSetWorkspace(ctx->blas, ctx->lt_workspace, ctx->lt_workspace_bytes));
    return 0;
}

int gpt_gemm_batched(gpt_cuda_t ctx, bool ta, bool tb, int M, int N, int K, float alpha,
                     const void *A, long long sA, const void *B, long long sB, float beta,
                     void *C, cudaDataType_t ctype, long long sC, int batch) {
    GPT_BLAS(ctx, cublasGemmStridedBatchedEx(
                      ctx->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                      N, M, K, &alpha, B, CUDA_R_16BF, tb ? K : N, sB, A, CUDA_R_16BF,
                      ta ? M : K, sA, &beta, C, ctype, N, sC, batch, CUBLAS_COMPUTE_32F,
                      CUBLAS_GEMM_DEFAULT));
    return 0;
}

int gpt_red_scratch(gpt_cuda_t ctx, size_t n, float **out) {
    if (ctx->red_floats < n) {
        GPT_CUDA(ctx, cudaFree(ctx->red));
        ctx->red = nullptr;
        ctx->red_floats = 0;
        GPT_CUDA(ctx, cudaMalloc(&ctx->red, n * sizeof(float)));
        ctx->red_floats = n;
    }
    *out = ctx->red;
    return 0;
}

template <typename G>
__global__ void colsum_finish_kernel(G *g0, G *g1, const float *partial, int nvec, int chunks,
                                     int cols) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    int v = blockIdx.y;
    if (c >= cols) return;
    float s = 0.f;
    for (int k = 0; k < chunks; ++k) s += partial[((size_t)k * nvec + v) * cols + c];
    G *g = v == 0 ? g0 : g1;
    if (!g) return;
    g[c] = from_f<G>(to_f(g[c]) + s);
}

int gpt_colsum_finish(gpt_cuda_t ctx, void *const *grads, int nvec, gpt_grad_dtype_t gdt,
                      const float *partial, int chunks, int cols) {
    if (nvec < 1 || nvec > 2) return gpt_fail(ctx, "gpt_colsum_finish: nvec %d", nvec);
    dim3 grid((cols + 255) / 256, nvec);
    if (gdt == GPT_GRAD_BF16)
        colsum_finish_kernel<bf16><<<grid, 256, 0, ctx->stream>>>(
            (bf16 *)grads[0], (bf16 *)grads[nvec - 1], partial, nvec, chunks, cols);
    else
        colsum_finish_kernel<float><<<grid, 256, 0, ctx->stream>>>(
            (float *)grads[0], (float *)grads[nvec - 1], partial, nvec, chunks, cols);
    GPT_LAUNCHED(ctx);
    return 0;
}

/* fp32 <-> bf16 on the device: for an fp32 engine, whose parameters the
 * kernels need as bf16 working copies (its gradients they take as they
 * are: GPT_GRAD_F32). */
template <typename D, typename S>
__global__ void cast_kernel(D *dst, const S *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = from_f<D>(to_f(src[i]));
}

int gpt_cast(gpt_cuda_t ctx, void *dst, int dst_f32, const void *src, int src_f32, size_t n) {
    GPT_CHECK_CTX(ctx);
    if (!n) return 0;
    if (!dst || !src) return gpt_fail(ctx, "gpt_cast: dst or src is NULL");
    unsigned blocks = gpt_elementwise_blocks(n);
    if (dst_f32 && !src_f32)
        cast_kernel<float, bf16><<<blocks, 256, 0, ctx->stream>>>((float *)dst, (const bf16 *)src, n);
    else if (!dst_f32 && src_f32)
        cast_kernel<bf16, float><<<blocks, 256, 0, ctx->stream>>>((bf16 *)dst, (const float *)src, n);
    else if (dst != src)
        GPT_CUDA(ctx, cudaMemcpyAsync(dst, src, n * (dst_f32 ? 4 : 2), cudaMemcpyDeviceToDevice,
                                      ctx->stream));
    GPT_LAUNCHED(ctx);
    return 0;
}
