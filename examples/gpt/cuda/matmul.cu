/*
 * Linear layers through cuBLASLt: out = inp W + bias with the bias fused in
 * the epilogue; the backward's two products (dinp, dweight) also through
 * cuBLASLt, dinp and dweight accumulated by beta = 1 in the gradient's dtype; dbias
 * by a fixed-order column sum.
 */
#include "common.cuh"

#include <cstdint>

/* The largest power of two up to 256 that divides the address. */
static uint32_t alignment(const void *p) {
    uintptr_t a = (uintptr_t)p;
    uint32_t r = 1;
    while (r < 256 && !(a & r)) r <<= 1;
    return r;
}

/* out[n, o] += bias[o]: where the epilogue cannot take the bias. */
__global__ void add_bias_kernel(bf16 *out, const bf16 *bias, int N, int OC) {
    size_t n = (size_t)N * OC;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = from_f<bf16>(to_f(out[i]) + to_f(bias[i % OC]));
}

/* Row-major D(M,N) = op(A) op(B) (+ D when accumulate) (+ bias[N] when
 * bias), A and B bf16, D of dtype dt, fp32 compute. A is (M,K) row-major, or
 * (K,M) when ta; B is (K,N), or (N,K) when tb. cuBLASLt is column-major:
 * it computes D^T(N,M) = op(B)^T op(A)^T, whose rows are the bias's index. */
static int lt_matmul(gpt_cuda_t ctx, void *D, cudaDataType_t dt, const void *A, bool ta,
                     const void *B, bool tb, int M, int N, int K, bool accumulate,
                     const void *bias) {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
    cublasLtMatmulPreference_t pref = nullptr;
    int rc = 0;
    cublasStatus_t s;
    cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N; /* cuBLASLt's A is our B */
    cublasOperation_t opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtEpilogue_t epi = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    cudaDataType_t bias_t = CUDA_R_16BF;
    float alpha = 1.f, beta = accumulate ? 1.f : 0.f;
    cublasLtMatmulHeuristicResult_t heur;
    int nheur = 0;
    uint32_t align_a = alignment(B), align_b = alignment(A), align_d = alignment(D);
    uint32_t reduction_mask = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
#define LT(call)                                                                          \
    do {                                                                                  \
        s = (call);                                                                       \
        if (s != CUBLAS_STATUS_SUCCESS) {                                                 \
            rc = gpt_fail(ctx, "%s:%d: %s: %s (M %d N %d K %d)", __FILE__, __LINE__, #call, \
                          cublasGetStatusString(s), M, N, K);                             \
            goto done;                                                                    \
        }                                                                                 \
    } while (0)
    LT(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    if (bias) {
        LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                          sizeof bias));
        LT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_t,
                                          sizeof bias_t));
    }
    /* Column-major shapes as stored: B is (K,N) row-major = N x K col-major. */
    LT(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, tb ? K : N, tb ? N : K, tb ? K : N));
    LT(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, ta ? M : K, ta ? K : M, ta ? M : K));
    LT(cublasLtMatrixLayoutCreate(&ld, dt, N, M, N));
    LT(cublasLtMatmulPreferenceCreate(&pref));
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                            &ctx->lt_workspace_bytes,
                                            sizeof ctx->lt_workspace_bytes));
    /* cuBLASLt assumes 256-byte aligned matrices unless told: a parameter
     * may sit anywhere in the engine's flat buffers. */
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                            &align_a, sizeof align_a));
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                            &align_b, sizeof align_b));
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                            &align_d, sizeof align_d));
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                            &align_d, sizeof align_d));
    /* One rounding per addition: a split-K plan may keep its partial sums
     * only in the compute type (fp32, then one rounding to the output);
     * in-place or output-type reductions would round them to a bf16
     * output first. NONE (no split) is always allowed. */
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                            &reduction_mask, sizeof reduction_mask));
    /* No algorithm for these alignments or shapes comes back as
     * NOT_SUPPORTED as often as success with none (PyTorch's cuBLASLt path
     * met it with mixed 2-byte and wider alignments): both mean "none". */
    s = cublasLtMatmulAlgoGetHeuristic(ctx->lt, op, la, lb, ld, ld, pref, 1, &heur, &nheur);
    if (s == CUBLAS_STATUS_NOT_SUPPORTED) {
        nheur = 0;
    } else if (s != CUBLAS_STATUS_SUCCESS) {
        rc = gpt_fail(ctx, "%s:%d: cublasLtMatmulAlgoGetHeuristic: %s (M %d N %d K %d)", __FILE__,
                      __LINE__, cublasGetStatusString(s), M, N, K);
        goto done;
    }
    if (nheur == 0) {
        /* None for these alignments or shapes: cuBLAS's GEMM takes any
         * (same arithmetic: fp32 compute, one rounding), then the bias. */
        rc = gpt_gemm_batched(ctx, ta, tb, M, N, K, 1.f, A, 0, B, 0, beta, D, dt, 0, 1);
        if (rc == 0 && bias) {
            add_bias_kernel<<<gpt_elementwise_blocks((size_t)M * N), 256, 0, ctx->stream>>>(
                (bf16 *)D, (const bf16 *)bias, M, N);
            cudaError_t e = cudaGetLastError();
            if (e != cudaSuccess) rc = gpt_fail(ctx, "add_bias_kernel: %s", cudaGetErrorString(e));
        }
        goto done;
    }
    LT(cublasLtMatmul(ctx->lt, op, &alpha, B, la, A, lb, &beta, D, ld, D, ld, &heur.algo,
                      ctx->lt_workspace, ctx->lt_workspace_bytes, ctx->stream));
#undef LT
done:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (ld) cublasLtMatrixLayoutDestroy(ld);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (op) cublasLtMatmulDescDestroy(op);
    return rc;
}

int gpt_matmul_forward(gpt_cuda_t ctx, void *out, const void *inp, const void *weight,
                       gpt_wlayout_t wl, const void *bias, int N, int IC, int OC) {
    GPT_CHECK_CTX(ctx);
    if (N <= 0 || IC <= 0 || OC <= 0)
        return gpt_fail(ctx, "gpt_matmul_forward: bad sizes N %d IC %d OC %d", N, IC, OC);
    if (!out || !inp || !weight)
        return gpt_fail(ctx, "gpt_matmul_forward: out, inp or weight is NULL");
    /* The epilogue reads the bias in 16-byte pieces (an unaligned bias, as
     * a slice of a flat buffer may be, is added by a kernel instead). */
    bool fuse = bias && alignment(bias) >= 16;
    /* out(N,OC) = inp(N,IC) W(IC,OC), or inp W^T for W stored (OC,IC). */
    if (lt_matmul(ctx, out, CUDA_R_16BF, inp, false, weight, wl == GPT_W_OUT_IN, N, OC, IC, false,
                  fuse ? bias : nullptr))
        return -1;
    if (bias && !fuse) {
        add_bias_kernel<<<gpt_elementwise_blocks((size_t)N * OC), 256, 0, ctx->stream>>>(
            (bf16 *)out, (const bf16 *)bias, N, OC);
        GPT_LAUNCHED(ctx);
    }
    return 0;
}

/* Partial column sums of dout (rows, cols): block (32, GPT_COL_ROWS),
 * blockIdx.x a 32-column tile, blockIdx.y a row chunk. */
__global__ void bias_partial_kernel(float *partial, const bf16 *dout, int rows, int cols) {
    __shared__ float sh[GPT_COL_ROWS][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    float s = 0.f;
    if (c < cols)
        for (int r = blockIdx.y * GPT_COL_ROWS + threadIdx.y; r < rows;
             r += gridDim.y * GPT_COL_ROWS)
            s += to_f(dout[(size_t)r * cols + c]);
    sh[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols) {
        for (int y = 1; y < GPT_COL_ROWS; ++y) s += sh[y][threadIdx.x];
        partial[(size_t)blockIdx.y * cols + c] = s;
    }
}

int gpt_matmul_backward(gpt_cuda_t ctx, void *dinp, void *dweight, void *dbias,
                        gpt_grad_dtype_t gdt, const void *dout, const void *inp,
                        const void *weight, gpt_wlayout_t wl, int N, int IC, int OC) {
    GPT_CHECK_CTX(ctx);
    if (N <= 0 || IC <= 0 || OC <= 0)
        return gpt_fail(ctx, "gpt_matmul_backward: bad sizes N %d IC %d OC %d", N, IC, OC);
    if (!dout || (dinp && !weight) || (dweight && !inp))
        return gpt_fail(ctx, "gpt_matmul_backward: dout, weight (for dinp) or inp (for dweight) is NULL");
    cudaDataType_t gt = gdt == GPT_GRAD_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    /* dinp(N,IC) += dout(N,OC) W^T: W^T is (OC,IC) as stored for OUT_IN. */
    if (dinp && lt_matmul(ctx, dinp, CUDA_R_16BF, dout, false, weight, wl == GPT_W_IN_OUT, N, IC,
                          OC, true, nullptr))
        return -1;
    if (dweight) {
        int rc = wl == GPT_W_OUT_IN
                     /* dW(OC,IC) += dout^T(OC,N) inp(N,IC) */
                     ? lt_matmul(ctx, dweight, gt, dout, true, inp, false, OC, IC, N, true, nullptr)
                     /* dW(IC,OC) += inp^T(IC,N) dout(N,OC) */
                     : lt_matmul(ctx, dweight, gt, inp, true, dout, false, IC, OC, N, true, nullptr);
        if (rc) return rc;
    }
    if (dbias) {
        int chunks = gpt_col_chunks(N);
        float *partial;
        if (gpt_red_scratch(ctx, (size_t)chunks * OC, &partial)) return -1;
        dim3 grid((OC + 31) / 32, chunks), block(32, GPT_COL_ROWS);
        bias_partial_kernel<<<grid, block, 0, ctx->stream>>>(partial, (const bf16 *)dout, N, OC);
        GPT_LAUNCHED(ctx);
        void *g[1] = {dbias};
        return gpt_colsum_finish(ctx, g, 1, gdt, partial, chunks, OC);
    }
    return 0;
}
