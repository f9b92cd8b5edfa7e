/*
 * Causal multi-head self-attention, written plainly: q, k, v rearranged
 * into heads, the scores q k^T and the products with v as cuBLAS strided-
 * batched GEMMs (one batch entry per (b, head)), and our own causal
 * softmax and its backward, one warp per row, in fp32.
 *
 * Scratch (gpt_attention_scratch_bytes): forward: scores fp32 (B,NH,T,T),
 * y bf16 (B,NH,T,HS); backward: datt fp32 (B,NH,T,T), dpreatt bf16
 * (B,NH,T,T), dy bf16 (B,NH,T,HS), dq dk dv bf16 (3, B,NH,T,HS).
 */
#include "common.cuh"

#include <cmath>

/* dst(B,NH,T,HS)[b,h,t,d] = src[(b T + t) stride + off + h HS + d] */
__global__ void to_heads_kernel(bf16 *dst, const bf16 *src, int B, int T, int NH, int HS,
                                int stride, int off) {
    size_t n = (size_t)B * NH * T * HS;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int d = (int)(i % HS);
        size_t r = i / HS;
        int t = (int)(r % T);
        r /= T;
        int h = (int)(r % NH);
        int b = (int)(r / NH);
        dst[i] = src[((size_t)b * T + t) * stride + off + h * HS + d];
    }
}

/* dst[(b T + t) stride + off + h HS + d] = src(B,NH,T,HS)[b,h,t,d] */
__global__ void from_heads_kernel(bf16 *dst, const bf16 *src, int B, int T, int NH, int HS,
                                  int stride, int off) {
    size_t n = (size_t)B * NH * T * HS;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int d = (int)(i % HS);
        size_t r = i / HS;
        int t = (int)(r % T);
        r /= T;
        int h = (int)(r % NH);
        int b = (int)(r / NH);
        dst[((size_t)b * T + t) * stride + off + h * HS + d] = src[i];
    }
}

/* att[row, j] = softmax_j(scale * pre[row, j]) over j <= t, 0 above the
 * diagonal; one warp per row of the (B NH T) rows of T. */
__global__ void causal_softmax_kernel(bf16 *att, const float *pre, float scale, int rows, int T) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= rows) return;
    int t = row % T;
    const float *x = pre + (size_t)row * T;
    bf16 *y = att + (size_t)row * T;
    float m = -INFINITY;
    for (int j = lane; j <= t; j += 32) m = fmaxf(m, x[j] * scale);
    m = warp_max(m);
    float s = 0.f;
    for (int j = lane; j <= t; j += 32) s += __expf(x[j] * scale - m);
    float inv = 1.f / warp_sum(s);
    for (int j = lane; j < T; j += 32)
        y[j] = from_f<bf16>(j <= t ? __expf(x[j] * scale - m) * inv : 0.f);
}

/* dpre[row, j] = scale att[j] (datt[j] - sum_k att[k] datt[k]) for j <= t,
 * else 0 (the gradient of the unscaled scores q k^T). */
__global__ void causal_softmax_backward_kernel(bf16 *dpre, const float *datt, const bf16 *att,
                                               float scale, int rows, int T) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= rows) return;
    int t = row % T;
    const float *da = datt + (size_t)row * T;
    const bf16 *a = att + (size_t)row * T;
    bf16 *dp = dpre + (size_t)row * T;
    float s = 0.f;
    for (int j = lane; j <= t; j += 32) s += to_f(a[j]) * da[j];
    s = warp_sum(s);
    for (int j = lane; j < T; j += 32)
        dp[j] = from_f<bf16>(j <= t ? scale * to_f(a[j]) * (da[j] - s) : 0.f);
}

/* Scratch pieces start at multiples of 256 bytes (cuBLAS's best alignment). */
static size_t up256(size_t bytes) { return (bytes + 255) & ~(size_t)255; }

size_t gpt_attention_scratch_bytes(int B, int T, int C, int NH) {
    size_t btt = (size_t)B * NH * T * T, btc = (size_t)B * T * C;
    size_t fwd = up256(btt * sizeof(float)) + up256(btc * sizeof(bf16));
    size_t bwd = up256(btt * sizeof(float)) + up256(btt * sizeof(bf16)) + 4 * up256(btc * sizeof(bf16));
    return fwd > bwd ? fwd : bwd;
}

static int check_sizes(gpt_cuda_t ctx, const char *fn, int B, int T, int C, int NH) {
    if (B <= 0 || T <= 0 || C <= 0 || NH <= 0 || C % NH)
        return gpt_fail(ctx, "%s: bad sizes B %d T %d C %d NH %d (C must be a multiple of NH)",
                        fn, B, T, C, NH);
    return 0;
}

int gpt_attention_forward(gpt_cuda_t ctx, void *out, void *qkvr, void *att, void *scratch,
                          const void *qkv, int B, int T, int C, int NH) {
    GPT_CHECK_CTX(ctx);
    if (check_sizes(ctx, "gpt_attention_forward", B, T, C, NH)) return -1;
    int HS = C / NH;
    size_t btc = (size_t)B * T * C, tt = (size_t)T * T;
    bf16 *q = (bf16 *)qkvr, *k = q + btc, *v = k + btc;
    float *pre = (float *)scratch;
    bf16 *y = (bf16 *)((char *)scratch + up256((size_t)B * NH * tt * sizeof(float)));
    unsigned blocks = gpt_elementwise_blocks(btc);
    for (int part = 0; part < 3; ++part)
        to_heads_kernel<<<blocks, 256, 0, ctx->stream>>>(q + part * btc, (const bf16 *)qkv, B, T,
                                                         NH, HS, 3 * C, part * C);
    GPT_LAUNCHED(ctx);
    /* pre(T,T) = q(T,HS) k(T,HS)^T per (b, h) */
    if (gpt_gemm_batched(ctx, false, true, T, T, HS, 1.f, q, (long long)T * HS, k,
                         (long long)T * HS, 0.f, pre, CUDA_R_32F, (long long)tt, B * NH))
        return -1;
    int rows = B * NH * T;
    causal_softmax_kernel<<<(rows + 7) / 8, 256, 0, ctx->stream>>>(
        (bf16 *)att, pre, 1.f / sqrtf((float)HS), rows, T);
    GPT_LAUNCHED(ctx);
    /* y(T,HS) = att(T,T) v(T,HS) */
    if (gpt_gemm_batched(ctx, false, false, T, HS, T, 1.f, att, (long long)tt, v,
                         (long long)T * HS, 0.f, y, CUDA_R_16BF, (long long)T * HS, B * NH))
        return -1;
    from_heads_kernel<<<blocks, 256, 0, ctx->stream>>>((bf16 *)out, y, B, T, NH, HS, C, 0);
    GPT_LAUNCHED(ctx);
    return 0;
}

int gpt_attention_backward(gpt_cuda_t ctx, void *dqkv, void *scratch, const void *dout,
                           const void *qkvr, const void *att, int B, int T, int C, int NH) {
    GPT_CHECK_CTX(ctx);
    if (check_sizes(ctx, "gpt_attention_backward", B, T, C, NH)) return -1;
    int HS = C / NH;
    size_t btc = (size_t)B * T * C, tt = (size_t)T * T, btt = (size_t)B * NH * tt;
    long long sh = (long long)T * HS;
    const bf16 *q = (const bf16 *)qkvr, *k = q + btc, *v = k + btc;
    char *p = (char *)scratch;
    float *datt = (float *)p;
    p += up256(btt * sizeof(float));
    bf16 *dpre = (bf16 *)p;
    p += up256(btt * sizeof(bf16));
    bf16 *dy = (bf16 *)p, *dq = (bf16 *)(p + up256(btc * sizeof(bf16)));
    bf16 *dk = (bf16 *)(p + 2 * up256(btc * sizeof(bf16))), *dv = (bf16 *)(p + 3 * up256(btc * sizeof(bf16)));
    unsigned blocks = gpt_elementwise_blocks(btc);
    to_heads_kernel<<<blocks, 256, 0, ctx->stream>>>(dy, (const bf16 *)dout, B, T, NH, HS, C, 0);
    GPT_LAUNCHED(ctx);
    /* datt(T,T) = dy(T,HS) v^T; dv(T,HS) = att^T dy */
    if (gpt_gemm_batched(ctx, false, true, T, T, HS, 1.f, dy, sh, v, sh, 0.f, datt, CUDA_R_32F,
                         (long long)tt, B * NH) ||
        gpt_gemm_batched(ctx, true, false, T, HS, T, 1.f, att, (long long)tt, dy, sh, 0.f, dv,
                         CUDA_R_16BF, sh, B * NH))
        return -1;
    int rows = B * NH * T;
    causal_softmax_backward_kernel<<<(rows + 7) / 8, 256, 0, ctx->stream>>>(
        dpre, datt, (const bf16 *)att, 1.f / sqrtf((float)HS), rows, T);
    GPT_LAUNCHED(ctx);
    /* dq(T,HS) = dpre k; dk(T,HS) = dpre^T q */
    if (gpt_gemm_batched(ctx, false, false, T, HS, T, 1.f, dpre, (long long)tt, k, sh, 0.f, dq,
                         CUDA_R_16BF, sh, B * NH) ||
        gpt_gemm_batched(ctx, true, false, T, HS, T, 1.f, dpre, (long long)tt, q, sh, 0.f, dk,
                         CUDA_R_16BF, sh, B * NH))
        return -1;
    const bf16 *dparts[3] = {dq, dk, dv};
    for (int part = 0; part < 3; ++part)
        from_heads_kernel<<<blocks, 256, 0, ctx->stream>>>((bf16 *)dqkv, dparts[part], B, T, NH,
                                                           HS, 3 * C, part * C);
    GPT_LAUNCHED(ctx);
    return 0;
}
