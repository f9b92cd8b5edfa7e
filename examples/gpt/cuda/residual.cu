/* The residual addition out = a + b (its backward is the identity: the
 * gradient goes to both branches). Elementwise, fp32 inside. */
#include "common.cuh"

__global__ void residual_forward_kernel(bf16 *out, const bf16 *a, const bf16 *b, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = from_f<bf16>(to_f(a[i]) + to_f(b[i]));
}

int gpt_residual_forward(gpt_cuda_t ctx, void *out, const void *a, const void *b, size_t n) {
    GPT_CHECK_CTX(ctx);
    if (!n) return 0;
    residual_forward_kernel<<<gpt_elementwise_blocks(n), 256, 0, ctx->stream>>>(
        (bf16 *)out, (const bf16 *)a, (const bf16 *)b, n);
    GPT_LAUNCHED(ctx);
    return 0;
}
