/*
 * The embeddings: out[n] = wte[tok[n]] + wpe[pos[n]]; the backward adds
 * each row's gradient into its token's wte row and its position's wpe row
 * in a fixed order (rows grouped by id on the host), in fp32, rounding once.
 */
#include "common.cuh"

#include <algorithm>
#include <cstdlib>
#include <utility>
#include <vector>

__global__ void encoder_forward_kernel(bf16 *out, const int64_t *tok, const int64_t *pos,
                                       const bf16 *wte, const bf16 *wpe, int N, int C) {
    size_t n = (size_t)N * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / C;
        int c = (int)(i % C);
        out[i] = from_f<bf16>(to_f(wte[tok[r] * C + c]) + to_f(wpe[pos[r] * C + c]));
    }
}

int gpt_encoder_forward(gpt_cuda_t ctx, void *out, const int64_t *tok, const int64_t *pos,
                        const void *wte, const void *wpe, int N, int C) {
    GPT_CHECK_CTX(ctx);
    if (N <= 0 || C <= 0) return gpt_fail(ctx, "gpt_encoder_forward: bad sizes N %d C %d", N, C);
    if (!out || !tok || !pos || !wte || !wpe)
        return gpt_fail(ctx, "gpt_encoder_forward: out, tok, pos, wte or wpe is NULL");
    encoder_forward_kernel<<<gpt_elementwise_blocks((size_t)N * C), 256, 0, ctx->stream>>>(
        (bf16 *)out, tok, pos, (const bf16 *)wte, (const bf16 *)wpe, N, C);
    GPT_LAUNCHED(ctx);
    return 0;
}

/* One block per group u: g[key[u]] += the rows row[off[u] .. off[u+1]) of
 * dout, summed in that order. */
template <typename G>
__global__ void grouped_rows_kernel(G *g, const bf16 *dout, const int *key, const int *off,
                                    const int *row, int C) {
    int u = blockIdx.x;
    int lo = off[u], hi = off[u + 1];
    G *gr = g + (size_t)key[u] * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float s = 0.f;
        for (int k = lo; k < hi; ++k) s += to_f(dout[(size_t)row[k] * C + c]);
        gr[c] = from_f<G>(to_f(gr[c]) + s);
    }
}

/* Groups the N rows by id into h: key[U] | off[U+1] | row[N] (at most 2N + 1
 * ints); returns U, or -1 when an id is outside [0, limit). */
static int group_rows(gpt_cuda_t ctx, int *h, const int64_t *ids, int N, int limit,
                      const char *what) {
    std::vector<std::pair<int64_t, int>> r((size_t)N);
    for (int i = 0; i < N; ++i) {
        if (ids[i] < 0 || ids[i] >= limit)
            return gpt_fail(ctx, "gpt_encoder_backward: %s %lld at row %d is outside [0, %d)", what,
                            (long long)ids[i], i, limit);
        r[(size_t)i] = {ids[i], i};
    }
    std::sort(r.begin(), r.end()); /* by id, then by row: a fixed order */
    int U = 0;
    for (int i = 0; i < N; ++i)
        if (i == 0 || r[(size_t)i].first != r[(size_t)i - 1].first) ++U;
    int *key = h, *off = h + U, *row = off + U + 1;
    int u = 0;
    for (int i = 0; i < N; ++i) {
        if (i == 0 || r[(size_t)i].first != r[(size_t)i - 1].first) {
            key[u] = (int)r[(size_t)i].first;
            off[u++] = i;
        }
        row[i] = r[(size_t)i].second;
    }
    off[U] = N;
    return U;
}

template <typename G>
static void launch_grouped(gpt_cuda_t ctx, void *g, const bf16 *dout, const int *d, int U, int C) {
    grouped_rows_kernel<G><<<U, 256, 0, ctx->stream>>>((G *)g, dout, d, d + U, d + 2 * U + 1, C);
}

int gpt_encoder_backward(gpt_cuda_t ctx, void *dwte, void *dwpe, gpt_grad_dtype_t gdt,
                         const void *dout, const int64_t *tok_host, const int64_t *pos_host,
                         int N, int C, int Vp, int maxT) {
    GPT_CHECK_CTX(ctx);
    if (N <= 0 || C <= 0 || Vp <= 0 || maxT <= 0)
        return gpt_fail(ctx, "gpt_encoder_backward: bad sizes N %d C %d Vp %d maxT %d", N, C, Vp,
                        maxT);
    if (!dout) return gpt_fail(ctx, "gpt_encoder_backward: dout is NULL");
    if ((dwte && !tok_host) || (dwpe && !pos_host))
        return gpt_fail(ctx, "gpt_encoder_backward: tok_host or pos_host is NULL");
    if (!dwte && !dwpe) return 0;
    size_t per = 2 * (size_t)N + 1, need = 2 * per; /* room for both groupings */
    /* The staging is rewritten below: its previous copy must be done (it
     * was enqueued a whole step ago: no wait in practice). */
    if (ctx->enc_pending) GPT_CUDA(ctx, cudaEventSynchronize(ctx->enc_copied));
    ctx->enc_pending = false;
    if (ctx->enc_host_ints < need) {
        GPT_CUDA(ctx, cudaFreeHost(ctx->enc_host));
        ctx->enc_host = nullptr;
        ctx->enc_host_ints = 0;
        GPT_CUDA(ctx, cudaMallocHost(&ctx->enc_host, need * sizeof(int)));
        ctx->enc_host_ints = need;
    }
    int Ut = 0, Up = 0;
    if (dwte && (Ut = group_rows(ctx, ctx->enc_host, tok_host, N, Vp, "token")) < 0) return -1;
    if (dwpe && (Up = group_rows(ctx, ctx->enc_host + per, pos_host, N, maxT, "position")) < 0)
        return -1;
    if (ctx->enc_scratch_ints < need) {
        GPT_CUDA(ctx, cudaFree(ctx->enc_scratch));
        ctx->enc_scratch = nullptr;
        ctx->enc_scratch_ints = 0;
        GPT_CUDA(ctx, cudaMalloc(&ctx->enc_scratch, need * sizeof(int)));
        ctx->enc_scratch_ints = need;
    }
    GPT_CUDA(ctx, cudaMemcpyAsync(ctx->enc_scratch, ctx->enc_host, need * sizeof(int),
                                  cudaMemcpyHostToDevice, ctx->stream));
    GPT_CUDA(ctx, cudaEventRecord(ctx->enc_copied, ctx->stream));
    ctx->enc_pending = true;
    const bf16 *d = (const bf16 *)dout;
    bool f32 = gdt == GPT_GRAD_F32;
    if (dwte) {
        if (f32) launch_grouped<float>(ctx, dwte, d, ctx->enc_scratch, Ut, C);
        else launch_grouped<bf16>(ctx, dwte, d, ctx->enc_scratch, Ut, C);
        GPT_LAUNCHED(ctx);
    }
    if (dwpe) {
        if (f32) launch_grouped<float>(ctx, dwpe, d, ctx->enc_scratch + per, Up, C);
        else launch_grouped<bf16>(ctx, dwpe, d, ctx->enc_scratch + per, Up, C);
        GPT_LAUNCHED(ctx);
    }
    return 0;
}
