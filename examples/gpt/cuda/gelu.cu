/* GELU with GPT-2's tanh approximation, forward and backward.
 * Elementwise, fp32 inside, grid-stride loops. */
#include "common.cuh"

#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */

__global__ void gelu_forward_kernel(bf16 *out, const bf16 *inp, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float x = to_f(inp[i]);
        out[i] = from_f<bf16>(0.5f * x * (1.f + tanhf(GELU_K * (x + 0.044715f * x * x * x))));
    }
}

__global__ void gelu_backward_kernel(bf16 *dinp, const bf16 *inp, const bf16 *dout, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float x = to_f(inp[i]);
        float u = GELU_K * (x + 0.044715f * x * x * x);
        float t = tanhf(u);
        float du = GELU_K * (1.f + 3.f * 0.044715f * x * x);
        float g = 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * du;
        dinp[i] = from_f<bf16>(to_f(dinp[i]) + g * to_f(dout[i]));
    }
}

unsigned gpt_elementwise_blocks(size_t n) {
    size_t b = (n + 255) / 256;
    return (unsigned)(b < 65536 ? (b ? b : 1) : 65536);
}

int gpt_gelu_forward(gpt_cuda_t ctx, void *out, const void *inp, size_t n) {
    GPT_CHECK_CTX(ctx);
    if (!n) return 0;
    if (!out || !inp) return gpt_fail(ctx, "gpt_gelu_forward: out or inp is NULL");
    gelu_forward_kernel<<<gpt_elementwise_blocks(n), 256, 0, ctx->stream>>>((bf16 *)out,
                                                                        (const bf16 *)inp, n);
    GPT_LAUNCHED(ctx);
    return 0;
}

int gpt_gelu_backward(gpt_cuda_t ctx, void *dinp, const void *inp, const void *dout, size_t n) {
    GPT_CHECK_CTX(ctx);
    if (!n) return 0;
    if (!dinp || !inp || !dout) return gpt_fail(ctx, "gpt_gelu_backward: dinp, inp or dout is NULL");
    if (dinp == dout) return gpt_fail(ctx, "gpt_gelu_backward: dinp aliases dout (it adds into dinp)");
    gelu_backward_kernel<<<gpt_elementwise_blocks(n), 256, 0, ctx->stream>>>(
        (bf16 *)dinp, (const bf16 *)inp, (const bf16 *)dout, n);
    GPT_LAUNCHED(ctx);
    return 0;
}
