/* fp32 <-> bf16 on the device: for an fp32 engine, whose parameters the
 * kernels need as bf16 working copies (its gradients they take as they
 * are: GPT_GRAD_F32). */
#include "common.cuh"

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
