/*
 * Causal multi-head self-attention, written plainly: q, k, v rearranged
 * into heads, the scores q k^T and the products with v as cuBLAS strided-
 * batched GEMMs (one batch entry per (b, head)), and our own causal
 * softmax and its backward, one warp per row, in fp32.
 *
 * Scratch (gpt_attention_scratch_bytes): forward: scores fp32 (B,NH,T,T),
 * q k v y bf16 (B,NH,T,hs); backward: datt fp32 (B,NH,T,T), its softmax
 * gradient bf16 (B,NH,T,T), q k v dy dq dk dv bf16 (B,NH,T,hs): q, k, v
 * are rearranged again from the caller's tensors rather than kept.
 */
#include "common.cuh"

#include <cmath>

/* Between a token-major tensor x[(b T + t) stride + h hs + e] (the fused qkv
 * or the attention output) and the head-major h(B,NH,T,hs)[b,h,t,e] the
 * GEMMs take: to_heads copies x into h, else h back into x. */
template <bool to_heads>
__global__ void heads_kernel(bf16 *dst, const bf16 *src, int B, int T, int NH, int hs, int stride) {
    size_t n = (size_t)B * NH * T * hs;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int e = (int)(i % hs);
        size_t r = i / hs;
        int t = (int)(r % T);
        r /= T;
        int h = (int)(r % NH);
        int b = (int)(r / NH);
        const size_t x = ((size_t)b * T + t) * stride + h * hs + e;
        if (to_heads) dst[i] = src[x];
        else dst[x] = src[i];
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

size_t gpt_attention_scratch_bytes(int B, int T, int NH, int hs) {
    size_t btt = (size_t)B * NH * T * T, bth = up256((size_t)B * NH * T * hs * sizeof(bf16));
    size_t fwd = up256(btt * sizeof(float)) + 4 * bth;                           /* pre, q k v y */
    size_t bwd = up256(btt * sizeof(float)) + up256(btt * sizeof(bf16)) + 7 * bth; /* + dy dq dk dv */
    return fwd > bwd ? fwd : bwd;
}

static int check_sizes(gpt_cuda_t ctx, const char *fn, int B, int T, int NH, int hs, int stride,
                       int ostride) {
    if (B <= 0 || T <= 0 || NH <= 0 || hs <= 0 || stride < NH * hs || ostride < NH * hs)
        return gpt_fail(ctx,
                        "%s: bad sizes B %d T %d NH %d hs %d stride %d ostride %d (strides must "
                        "be at least NH hs)",
                        fn, B, T, NH, hs, stride, ostride);
    return 0;
}

/* The scratch's pieces: the scores (fp32, then their bf16 gradient in the
 * backward) and n head-layout tensors of B NH T hs. */
struct Pieces {
    float *s;
    bf16 *ds;
    bf16 *h[7];
};
static Pieces cut(void *scratch, int B, int T, int NH, int hs, bool backward) {
    size_t btt = (size_t)B * NH * T * T, bth = up256((size_t)B * NH * T * hs * sizeof(bf16));
    char *p = (char *)scratch;
    Pieces r{};
    r.s = (float *)p;
    p += up256(btt * sizeof(float));
    if (backward) {
        r.ds = (bf16 *)p;
        p += up256(btt * sizeof(bf16));
    }
    for (int i = 0; i < (backward ? 7 : 4); ++i) r.h[i] = (bf16 *)(p + i * bth);
    return r;
}

int gpt_attention_forward(gpt_cuda_t ctx, void *out, int ostride, void *att, const void *q,
                          const void *k, const void *v, int stride, int B, int T, int NH, int hs,
                          void *scratch) {
    GPT_CHECK_CTX(ctx);
    if (check_sizes(ctx, "gpt_attention_forward", B, T, NH, hs, stride, ostride)) return -1;
    if (!out || !att || !q || !k || !v || !scratch)
        return gpt_fail(ctx, "gpt_attention_forward: out, att, q, k, v or scratch is NULL");
    size_t tt = (size_t)T * T;
    long long sh = (long long)T * hs;
    Pieces p = cut(scratch, B, T, NH, hs, false);
    bf16 *qh = p.h[0], *kh = p.h[1], *vh = p.h[2], *y = p.h[3];
    unsigned blocks = gpt_elementwise_blocks((size_t)B * NH * T * hs);
    const void *src[3] = {q, k, v};
    for (int i = 0; i < 3; ++i)
        heads_kernel<true><<<blocks, 256, 0, ctx->stream>>>(p.h[i], (const bf16 *)src[i], B, T, NH, hs,
                                                         stride);
    GPT_LAUNCHED(ctx);
    /* s(T,T) = q(T,hs) k(T,hs)^T per (b, h) */
    if (gpt_gemm_batched(ctx, false, true, T, T, hs, 1.f, qh, sh, kh, sh, 0.f, p.s, CUDA_R_32F,
                         (long long)tt, B * NH))
        return -1;
    int rows = B * NH * T;
    causal_softmax_kernel<<<(rows + 7) / 8, 256, 0, ctx->stream>>>(
        (bf16 *)att, p.s, 1.f / sqrtf((float)hs), rows, T);
    GPT_LAUNCHED(ctx);
    /* y(T,hs) = att(T,T) v(T,hs) */
    if (gpt_gemm_batched(ctx, false, false, T, hs, T, 1.f, att, (long long)tt, vh, sh, 0.f, y,
                         CUDA_R_16BF, sh, B * NH))
        return -1;
    heads_kernel<false><<<blocks, 256, 0, ctx->stream>>>((bf16 *)out, y, B, T, NH, hs, ostride);
    GPT_LAUNCHED(ctx);
    return 0;
}

int gpt_attention_backward(gpt_cuda_t ctx, void *dq, void *dk, void *dv, int stride,
                           const void *dout, int ostride, const void *att, const void *q,
                           const void *k, const void *v, int B, int T, int NH, int hs,
                           void *scratch) {
    GPT_CHECK_CTX(ctx);
    if (check_sizes(ctx, "gpt_attention_backward", B, T, NH, hs, stride, ostride)) return -1;
    if (!dq || !dk || !dv || !dout || !att || !q || !k || !v || !scratch)
        return gpt_fail(ctx, "gpt_attention_backward: a tensor or the scratch is NULL");
    size_t tt = (size_t)T * T;
    long long sh = (long long)T * hs;
    Pieces p = cut(scratch, B, T, NH, hs, true);
    bf16 *qh = p.h[0], *kh = p.h[1], *vh = p.h[2], *dy = p.h[3];
    bf16 *dqh = p.h[4], *dkh = p.h[5], *dvh = p.h[6];
    unsigned blocks = gpt_elementwise_blocks((size_t)B * NH * T * hs);
    const void *src[3] = {q, k, v};
    for (int i = 0; i < 3; ++i)
        heads_kernel<true><<<blocks, 256, 0, ctx->stream>>>(p.h[i], (const bf16 *)src[i], B, T, NH, hs,
                                                         stride);
    heads_kernel<true><<<blocks, 256, 0, ctx->stream>>>(dy, (const bf16 *)dout, B, T, NH, hs, ostride);
    GPT_LAUNCHED(ctx);
    /* datt(T,T) = dy(T,hs) v^T; dv(T,hs) = att^T dy */
    if (gpt_gemm_batched(ctx, false, true, T, T, hs, 1.f, dy, sh, vh, sh, 0.f, p.s, CUDA_R_32F,
                         (long long)tt, B * NH) ||
        gpt_gemm_batched(ctx, true, false, T, hs, T, 1.f, att, (long long)tt, dy, sh, 0.f, dvh,
                         CUDA_R_16BF, sh, B * NH))
        return -1;
    int rows = B * NH * T;
    causal_softmax_backward_kernel<<<(rows + 7) / 8, 256, 0, ctx->stream>>>(
        p.ds, p.s, (const bf16 *)att, 1.f / sqrtf((float)hs), rows, T);
    GPT_LAUNCHED(ctx);
    /* dq(T,hs) = ds k; dk(T,hs) = ds^T q */
    if (gpt_gemm_batched(ctx, false, false, T, hs, T, 1.f, p.ds, (long long)tt, kh, sh, 0.f, dqh,
                         CUDA_R_16BF, sh, B * NH) ||
        gpt_gemm_batched(ctx, true, false, T, hs, T, 1.f, p.ds, (long long)tt, qh, sh, 0.f, dkh,
                         CUDA_R_16BF, sh, B * NH))
        return -1;
    void *dst[3] = {dq, dk, dv};
    const bf16 *dh[3] = {dqh, dkh, dvh};
    for (int i = 0; i < 3; ++i)
        heads_kernel<false><<<blocks, 256, 0, ctx->stream>>>((bf16 *)dst[i], dh[i], B, T, NH, hs,
                                                           stride);
    GPT_LAUNCHED(ctx);
    return 0;
}
