/* The residual addition out = a + b and its backward, which adds the
 * gradient into both branches' gradients. Elementwise, fp32 inside. */
#include "common.cuh"

__global__ void residual_forward_kernel(bf16 *out, const bf16 *a, const bf16 *b, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = from_f<bf16>(to_f(a[i]) + to_f(b[i]));
}

int gpt_residual_forward(gpt_cuda_t ctx, void *out, const void *a, const void *b, size_t n) {
    GPT_CHECK_CTX(ctx);
    if (!n) return 0;
    if (!out || !a || !b) return gpt_fail(ctx, "gpt_residual_forward: out, a or b is NULL");
    residual_forward_kernel<<<gpt_elementwise_blocks(n), 256, 0, ctx->stream>>>(
        (bf16 *)out, (const bf16 *)a, (const bf16 *)b, n);
    GPT_LAUNCHED(ctx);
    return 0;
}

__global__ void residual_backward_kernel(bf16 *da, bf16 *db, const bf16 *dout, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float d = to_f(dout[i]);
        if (da) da[i] = from_f<bf16>(to_f(da[i]) + d);
        if (db) db[i] = from_f<bf16>(to_f(db[i]) + d);
    }
}

int gpt_residual_backward(gpt_cuda_t ctx, void *da, void *db, const void *dout, size_t n) {
    GPT_CHECK_CTX(ctx);
    if (!n || (!da && !db)) return 0;
    if (!dout) return gpt_fail(ctx, "gpt_residual_backward: dout is NULL");
    if (da == dout || db == dout)
        return gpt_fail(ctx, "gpt_residual_backward: da or db aliases dout (they add into it)");
    residual_backward_kernel<<<gpt_elementwise_blocks(n), 256, 0, ctx->stream>>>(
        (bf16 *)da, (bf16 *)db, (const bf16 *)dout, n);
    GPT_LAUNCHED(ctx);
    return 0;
}
