/*
 * The classifier's loss in one pass over the logits: per row the softmax
 * over the V real columns (online max and sum), the cross-entropy loss of
 * the target, and the logits overwritten by their gradient
 * dloss (p - onehot(target)), zero in the padded columns V..Vp-1 (and
 * everywhere when dloss is 0).
 */
#include "common.cuh"

#include <cmath>

static const int CLS_THREADS = 512;

/* (m, s) merged with (m2, s2): s = sum exp(x - m) over both. */
__device__ __forceinline__ void online_merge(float &m, float &s, float m2, float s2) {
    float mm = fmaxf(m, m2);
    if (mm == -INFINITY) return; /* both empty */
    s = s * __expf(m - mm) + s2 * __expf(m2 - mm);
    m = mm;
}

__global__ void __launch_bounds__(CLS_THREADS)
    fused_classifier_kernel(bf16 *logits, float *losses, const int64_t *targets, float dloss, int V,
                            int Vp) {
    __shared__ float shm[CLS_THREADS / 32], shs[CLS_THREADS / 32];
    __shared__ float sh_xt;
    int row = blockIdx.x;
    bf16 *x = logits + (size_t)row * Vp;
    int64_t tgt = targets[row];
    float m = -INFINITY, s = 0.f;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float v = to_f(x[j]);
        if (v > m) {
            s = s * __expf(m - v) + 1.f;
            m = v;
        } else {
            s += __expf(v - m);
        }
    }
    if (threadIdx.x == 0) sh_xt = (tgt >= 0 && tgt < V) ? to_f(x[tgt]) : 0.f;
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        online_merge(m, s, m2, s2);
    }
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) {
        shm[warp] = m;
        shs[warp] = s;
    }
    __syncthreads(); /* also: sh_xt read before any thread writes the row */
    m = -INFINITY;
    s = 0.f;
    for (int w = 0; w < (int)(blockDim.x / 32); ++w) online_merge(m, s, shm[w], shs[w]);
    float inv = 1.f / s;
    if (threadIdx.x == 0) {
        float loss;
        if (tgt < 0) loss = 0.f;
        else if (tgt >= V) loss = NAN;
        else loss = m + logf(s) - sh_xt;
        losses[row] = loss;
    }
    /* dloss 0 (a micro-batch without a counted token) writes zeros too:
     * the backward reads this buffer as dlogits whatever dloss was. */
    bool use = tgt >= 0 && tgt < V && dloss != 0.f;
    for (int j = threadIdx.x; j < Vp; j += blockDim.x) {
        float g = 0.f;
        if (use && j < V) g = dloss * (__expf(to_f(x[j]) - m) * inv - (j == tgt ? 1.f : 0.f));
        x[j] = from_f<bf16>(g);
    }
}

int gpt_fused_classifier(gpt_cuda_t ctx, void *logits, float *losses, const int64_t *targets,
                         float dloss, int N, int V, int Vp) {
    GPT_CHECK_CTX(ctx);
    if (N <= 0 || V <= 0 || Vp < V)
        return gpt_fail(ctx, "gpt_fused_classifier: bad sizes N %d V %d Vp %d (need 0 < V <= Vp)",
                        N, V, Vp);
    if (!logits || !losses || !targets)
        return gpt_fail(ctx, "gpt_fused_classifier: logits, losses or targets is NULL");
    fused_classifier_kernel<<<N, CLS_THREADS, 0, ctx->stream>>>((bf16 *)logits, losses, targets,
                                                                dloss, V, Vp);
    GPT_LAUNCHED(ctx);
    return 0;
}
