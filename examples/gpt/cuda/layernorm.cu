/*
 * LayerNorm over the last dimension (eps 1e-5): one warp per row, fp32
 * statistics saved for the backward; the weight and bias gradients are
 * fixed-order column sums.
 */
#include "common.cuh"

static const float LN_EPS = 1e-5f;

__global__ void layernorm_forward_kernel(bf16 *out, float *mean, float *rstd, const bf16 *inp,
                                         const bf16 *w, const bf16 *b, int N, int C) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= N) return;
    const bf16 *x = inp + (size_t)row * C;
    float s = 0.f;
    for (int i = lane; i < C; i += 32) s += to_f(x[i]);
    float m = warp_sum(s) / C;
    float v = 0.f;
    for (int i = lane; i < C; i += 32) {
        float d = to_f(x[i]) - m;
        v += d * d;
    }
    float r = rsqrtf(warp_sum(v) / C + LN_EPS);
    bf16 *o = out + (size_t)row * C;
    for (int i = lane; i < C; i += 32)
        o[i] = from_f<bf16>((to_f(x[i]) - m) * r * to_f(w[i]) + to_f(b[i]));
    if (lane == 0) {
        if (mean) mean[row] = m;
        if (rstd) rstd[row] = r;
    }
}

int gpt_layernorm_forward(gpt_cuda_t ctx, void *out, float *mean, float *rstd, const void *inp,
                          const void *weight, const void *bias, int N, int C) {
    GPT_CHECK_CTX(ctx);
    if (N <= 0 || C <= 0) return gpt_fail(ctx, "gpt_layernorm_forward: bad sizes N %d C %d", N, C);
    if (!out || !inp || !weight || !bias)
        return gpt_fail(ctx, "gpt_layernorm_forward: out, inp, weight or bias is NULL");
    const int warps = 8;
    layernorm_forward_kernel<<<(N + warps - 1) / warps, warps * 32, 0, ctx->stream>>>(
        (bf16 *)out, mean, rstd, (const bf16 *)inp, (const bf16 *)weight, (const bf16 *)bias, N, C);
    GPT_LAUNCHED(ctx);
    return 0;
}

/* dinp += rstd (dnorm - mean(dnorm) - xhat mean(dnorm xhat)), dnorm = dout w. */
__global__ void layernorm_dinp_kernel(bf16 *dinp, const bf16 *dout, const bf16 *inp,
                                      const bf16 *w, const float *mean, const float *rstd, int N,
                                      int C) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= N) return;
    size_t off = (size_t)row * C;
    float m = mean[row], r = rstd[row];
    float s1 = 0.f, s2 = 0.f;
    for (int i = lane; i < C; i += 32) {
        float dn = to_f(dout[off + i]) * to_f(w[i]);
        s1 += dn;
        s2 += dn * (to_f(inp[off + i]) - m) * r;
    }
    s1 = warp_sum(s1) / C;
    s2 = warp_sum(s2) / C;
    for (int i = lane; i < C; i += 32) {
        float xhat = (to_f(inp[off + i]) - m) * r;
        float dn = to_f(dout[off + i]) * to_f(w[i]);
        dinp[off + i] = from_f<bf16>(to_f(dinp[off + i]) + (dn - s1 - xhat * s2) * r);
    }
}

/* Partial sums over a chunk of rows of dout * xhat (vector 0) and dout
 * (vector 1): block (32, GPT_COL_ROWS), blockIdx.x a 32-column tile. */
__global__ void layernorm_wgrad_partial_kernel(float *partial, const bf16 *dout, const bf16 *inp,
                                               const float *mean, const float *rstd, int N,
                                               int C) {
    __shared__ float shw[GPT_COL_ROWS][33], shb[GPT_COL_ROWS][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    float sw = 0.f, sb = 0.f;
    if (c < C)
        for (int r = blockIdx.y * GPT_COL_ROWS + threadIdx.y; r < N; r += gridDim.y * GPT_COL_ROWS) {
            float d = to_f(dout[(size_t)r * C + c]);
            sw += d * (to_f(inp[(size_t)r * C + c]) - mean[r]) * rstd[r];
            sb += d;
        }
    shw[threadIdx.y][threadIdx.x] = sw;
    shb[threadIdx.y][threadIdx.x] = sb;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        for (int y = 1; y < GPT_COL_ROWS; ++y) {
            sw += shw[y][threadIdx.x];
            sb += shb[y][threadIdx.x];
        }
        partial[((size_t)blockIdx.y * 2 + 0) * C + c] = sw;
        partial[((size_t)blockIdx.y * 2 + 1) * C + c] = sb;
    }
}

int gpt_layernorm_backward(gpt_cuda_t ctx, void *dinp, void *dweight, void *dbias,
                           gpt_grad_dtype_t gdt, const void *dout, const void *inp,
                           const void *weight, const float *mean, const float *rstd, int N, int C) {
    GPT_CHECK_CTX(ctx);
    if (N <= 0 || C <= 0)
        return gpt_fail(ctx, "gpt_layernorm_backward: bad sizes N %d C %d", N, C);
    if (!mean || !rstd) return gpt_fail(ctx, "gpt_layernorm_backward: mean or rstd is NULL");
    if (!dout || !inp || !weight)
        return gpt_fail(ctx, "gpt_layernorm_backward: dout, inp or weight is NULL");
    if (dinp) {
        const int warps = 8;
        layernorm_dinp_kernel<<<(N + warps - 1) / warps, warps * 32, 0, ctx->stream>>>(
            (bf16 *)dinp, (const bf16 *)dout, (const bf16 *)inp, (const bf16 *)weight, mean, rstd,
            N, C);
        GPT_LAUNCHED(ctx);
    }
    if (dweight || dbias) {
        int chunks = gpt_col_chunks(N);
        float *partial;
        if (gpt_red_scratch(ctx, (size_t)chunks * 2 * C, &partial)) return -1;
        dim3 grid((C + 31) / 32, chunks), block(32, GPT_COL_ROWS);
        layernorm_wgrad_partial_kernel<<<grid, block, 0, ctx->stream>>>(
            partial, (const bf16 *)dout, (const bf16 *)inp, mean, rstd, N, C);
        GPT_LAUNCHED(ctx);
        void *g[2] = {dweight, dbias};
        return gpt_colsum_finish(ctx, g, 2, gdt, partial, chunks, C);
    }
    return 0;
}
