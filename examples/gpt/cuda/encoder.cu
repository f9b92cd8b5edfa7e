/*
 * The embeddings: out = wte[token] + wpe[position]; the backward adds each
 * row's gradient into the token's wte row and the position's wpe row, in a
 * fixed order (rows grouped by token on the host), in fp32.
 */
#include "common.cuh"

#include <algorithm>
#include <cstdlib>
#include <utility>
#include <vector>

__global__ void encoder_forward_kernel(bf16 *out, const int *inp, const bf16 *wte,
                                       const bf16 *wpe, int B, int T, int C) {
    size_t n = (size_t)B * T * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t bt = i / C;
        int c = (int)(i % C), t = (int)(bt % T);
        out[i] = from_f<bf16>(to_f(wte[(size_t)inp[bt] * C + c]) + to_f(wpe[(size_t)t * C + c]));
    }
}

int gpt_encoder_forward(gpt_cuda_t ctx, void *out, const int *inp, const void *wte,
                        const void *wpe, int B, int T, int C) {
    GPT_CHECK_CTX(ctx);
    if (B <= 0 || T <= 0 || C <= 0)
        return gpt_fail(ctx, "gpt_encoder_forward: bad sizes B %d T %d C %d", B, T, C);
    encoder_forward_kernel<<<gpt_elementwise_blocks((size_t)B * T * C), 256, 0, ctx->stream>>>(
        (bf16 *)out, inp, (const bf16 *)wte, (const bf16 *)wpe, B, T, C);
    GPT_LAUNCHED(ctx);
    return 0;
}

/* dwpe[t] += sum_b dout[b, t]: one thread per (t, c). */
template <typename G>
__global__ void wpe_backward_kernel(G *dwpe, const bf16 *dout, int B, int T, int C) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)T * C) return;
    float s = 0.f;
    for (int b = 0; b < B; ++b) s += to_f(dout[(size_t)b * T * C + i]);
    dwpe[i] = from_f<G>(to_f(dwpe[i]) + s);
}

/* One block per distinct token u: dwte[tok[u]] += the rows pos[off[u] ..
 * off[u+1]) of dout, summed in that order. */
template <typename G>
__global__ void wte_backward_kernel(G *dwte, const bf16 *dout, const int *tok, const int *off,
                                    const int *pos, int C) {
    int u = blockIdx.x;
    int lo = off[u], hi = off[u + 1];
    G *g = dwte + (size_t)tok[u] * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float s = 0.f;
        for (int k = lo; k < hi; ++k) s += to_f(dout[(size_t)pos[k] * C + c]);
        g[c] = from_f<G>(to_f(g[c]) + s);
    }
}

int gpt_encoder_backward(gpt_cuda_t ctx, void *dwte, void *dwpe, gpt_grad_dtype_t gdt,
                         const void *dout, const int *inp_host, int B, int T, int C, int Vp) {
    GPT_CHECK_CTX(ctx);
    if (B <= 0 || T <= 0 || C <= 0 || Vp <= 0)
        return gpt_fail(ctx, "gpt_encoder_backward: bad sizes B %d T %d C %d Vp %d", B, T, C, Vp);
    const bf16 *d = (const bf16 *)dout;
    if (dwpe) {
        size_t n = (size_t)T * C;
        unsigned blocks = (unsigned)((n + 255) / 256);
        if (gdt == GPT_GRAD_BF16)
            wpe_backward_kernel<bf16><<<blocks, 256, 0, ctx->stream>>>((bf16 *)dwpe, d, B, T, C);
        else
            wpe_backward_kernel<float><<<blocks, 256, 0, ctx->stream>>>((float *)dwpe, d, B, T, C);
        GPT_LAUNCHED(ctx);
    }
    if (!dwte) return 0;
    if (!inp_host) return gpt_fail(ctx, "gpt_encoder_backward: inp_host is NULL");
    int n = B * T;
    /* (token, position) sorted: positions of one token in increasing order. */
    std::vector<std::pair<int, int>> rows((size_t)n);
    for (int i = 0; i < n; ++i) {
        if (inp_host[i] < 0 || inp_host[i] >= Vp)
            return gpt_fail(ctx, "gpt_encoder_backward: token %d at position %d is outside [0, %d)",
                            inp_host[i], i, Vp);
        rows[(size_t)i] = {inp_host[i], i};
    }
    std::sort(rows.begin(), rows.end());
    /* Host staging: tok[U] | off[U+1] | pos[n], at most 3n + 1 ints. */
    size_t need = 3 * (size_t)n + 1;
    if (ctx->enc_host_ints < need) {
        int *h = (int *)realloc(ctx->enc_host, need * sizeof(int));
        if (!h) return gpt_fail(ctx, "gpt_encoder_backward: out of host memory (%zu ints)", need);
        ctx->enc_host = h;
        ctx->enc_host_ints = need;
    }
    if (ctx->enc_scratch_ints < need) {
        GPT_CUDA(ctx, cudaFree(ctx->enc_scratch));
        ctx->enc_scratch = nullptr;
        ctx->enc_scratch_ints = 0;
        GPT_CUDA(ctx, cudaMalloc(&ctx->enc_scratch, need * sizeof(int)));
        ctx->enc_scratch_ints = need;
    }
    int U = 0;
    for (int i = 0; i < n; ++i)
        if (i == 0 || rows[(size_t)i].first != rows[(size_t)i - 1].first) ++U;
    int *tok = ctx->enc_host, *off = tok + U, *pos = off + U + 1;
    int u = 0;
    for (int i = 0; i < n; ++i) {
        if (i == 0 || rows[(size_t)i].first != rows[(size_t)i - 1].first) {
            tok[u] = rows[(size_t)i].first;
            off[u] = i;
            ++u;
        }
        pos[i] = rows[(size_t)i].second;
    }
    off[U] = n;
    size_t used = (size_t)U + U + 1 + n;
    /* Pageable source: returns once the bytes are staged, so the next call
     * may rewrite enc_host. */
    GPT_CUDA(ctx, cudaMemcpyAsync(ctx->enc_scratch, ctx->enc_host, used * sizeof(int),
                                  cudaMemcpyHostToDevice, ctx->stream));
    const int *dtok = ctx->enc_scratch, *doff = dtok + U, *dpos = doff + U + 1;
    if (gdt == GPT_GRAD_BF16)
        wte_backward_kernel<bf16><<<U, 256, 0, ctx->stream>>>((bf16 *)dwte, d, dtok, doff, dpos, C);
    else
        wte_backward_kernel<float><<<U, 256, 0, ctx->stream>>>((float *)dwte, d, dtok, doff, dpos,
                                                               C);
    GPT_LAUNCHED(ctx);
    return 0;
}
