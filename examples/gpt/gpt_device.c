/*
 * gpt_device.c: the CUDA path of train_gpt (--device cuda): the same model
 * and the same libdsm calls as the host path, on a device-resident engine.
 *
 * The engine keeps parameters, gradients, master weights and optimizer state
 * in the GPU's memory (DSM_DEVICE_CUDA) and orders its work on this path's
 * stream (dsm_engine_set_stream). Activations and parameters are bf16 (the
 * configuration must enable bf16); the kernels of examples/gpt/cuda
 * (gpt_kernels.h) do the math in fp32 and add the parameter gradients
 * straight into the engine's bf16 buffers. The operations fill the table
 * that the model walk takes (gpt_walk.h): the same acquires and releases as
 * on the host, so ZeRO-3 gathers block by block on the GPU.
 * Sequence parallelism is not supported on this path (P = 1).
 */
#include "gpt_device.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>
#include <mpi.h>

#include "cuda/gpt_kernels.h"
#include "dsm/cuda.h"

struct device_layer {
    void *ln1, *qkv, *att, *atty, *res2, *ln2, *fch, *fch_gelu, *res3;
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd;
};

struct gpt_device_s {
    GPTConfig c;
    gpt_walk *walk; /* the engine, its parameters while held, the time in libdsm */
    int B, T, N;
    cudaStream_t stream;
    gpt_cuda_t ctx;
    int64_t *tok_dev, *pos_dev, *lab_dev;
    const int64_t *tok_host, *pos_host;
    void *encoded, *lnf, *logits, *scratch;
    float *lnf_mean, *lnf_rstd, *losses_dev, *losses_host;
    float dloss; /* of this forward: the logits' gradient is kept times it */
    void *dres, *dln, *dqkv, *datty, *dfch, *dfch_gelu, *dlnf;
    struct device_layer *la;
    char *msg;
    size_t msg_len;
};

/* A kernel launcher's failure: its message, and DSM_ERR_CUDA. */
#define KERNEL(d, call)                                                                      \
    do {                                                                                     \
        if ((call) != 0) {                                                                   \
            snprintf((d)->msg, (d)->msg_len, "%s", gpt_cuda_error((d)->ctx));               \
            return DSM_ERR_CUDA;                                                             \
        }                                                                                    \
    } while (0)

static dsm_status_t cuda_fail(struct gpt_device_s *d, cudaError_t e, const char *what) {
    snprintf(d->msg, d->msg_len, "%s: %s", what, cudaGetErrorString(e));
    return DSM_ERR_CUDA;
}

/* Zeroed device memory. The zeros are written on the example's stream:
 * it is non-blocking, so a cudaMemset on the legacy default stream would
 * be ordered with nothing the stream does, and could land after the first
 * forward's writes. */
static void *dev_alloc(cudaStream_t stream, size_t bytes, int *ok) {
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) *ok = 0, p = NULL;
    else if (cudaMemsetAsync(p, 0, bytes ? bytes : 1, stream) != cudaSuccess) *ok = 0;
    return p;
}

dsm_status_t gpt_device_available(char *msg, size_t msg_len) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n < 1) {
        snprintf(msg, msg_len, "no CUDA device (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return DSM_ERR_NOT_SUPPORTED;
    }
    return DSM_SUCCESS;
}

static const struct gpt_ops device_ops;

dsm_status_t gpt_device_create(gpt_walk *walk, int B, int T, char *msg, size_t msg_len, gpt_device_t *out) {
    *out = NULL;
    if (walk->dtype != DSM_BFLOAT16) {
        snprintf(msg, msg_len, "--device cuda computes in bf16: enable \"bf16\" in the configuration (the engine "
                 "computes in %s)", dsm_dtype_name(walk->dtype));
        return DSM_ERR_INVALID_ARGUMENT;
    }
    struct gpt_device_s *d = calloc(1, sizeof *d);
    if (!d) return DSM_ERR_OUT_OF_MEMORY;
    const GPTConfig *c = &walk->c;
    d->c = *c, d->walk = walk, d->B = B, d->T = T, d->N = B * T;
    d->msg = msg, d->msg_len = msg_len;
    *out = d;
    walk->ops = &device_ops, walk->ctx = d;
    cudaError_t e = cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) return cuda_fail(d, e, "cudaStreamCreate");
    dsm_status_t st = dsm_engine_set_stream(walk->engine, d->stream);
    if (st != DSM_SUCCESS) return st;
    if (gpt_cuda_create(d->stream, &d->ctx) != 0) {
        snprintf(msg, msg_len, "%s", gpt_cuda_error(NULL));
        return DSM_ERR_CUDA;
    }
    const size_t N = (size_t)d->N, C = (size_t)c->channels, Vp = (size_t)c->padded_vocab_size, H = 2;
    int ok = 1;
#define DEV(bytes) dev_alloc(d->stream, (bytes), &ok)
    d->la = calloc((size_t)c->num_layers, sizeof *d->la);
    d->losses_host = calloc(N, sizeof(float));
    if (!d->la || !d->losses_host) return DSM_ERR_OUT_OF_MEMORY;
    d->tok_dev = DEV(N * sizeof(int64_t)), d->lab_dev = DEV(N * sizeof(int64_t));
    d->pos_dev = DEV(N * sizeof(int64_t));
    d->encoded = DEV(N * C * H), d->lnf = DEV(N * C * H);
    d->logits = DEV(N * Vp * H), d->losses_dev = DEV(N * sizeof(float));
    d->lnf_mean = DEV(N * sizeof(float)), d->lnf_rstd = DEV(N * sizeof(float));
    d->scratch = DEV(gpt_attention_scratch_bytes(B, T, c->num_heads, c->channels / c->num_heads));
    d->dres = DEV(N * C * H), d->dln = DEV(N * C * H), d->dqkv = DEV(N * 3 * C * H);
    d->datty = DEV(N * C * H), d->dfch = DEV(N * 4 * C * H), d->dlnf = DEV(N * C * H);
    d->dfch_gelu = DEV(N * 4 * C * H);
    for (int l = 0; l < c->num_layers; ++l) {
        struct device_layer *a = &d->la[l];
        a->ln1 = DEV(N * C * H), a->qkv = DEV(N * 3 * C * H);
        a->att = DEV((size_t)B * c->num_heads * T * T * H);
        a->atty = DEV(N * C * H), a->res2 = DEV(N * C * H), a->ln2 = DEV(N * C * H);
        a->fch = DEV(N * 4 * C * H), a->fch_gelu = DEV(N * 4 * C * H);
        a->res3 = DEV(N * C * H);
        a->ln1_mean = DEV(N * sizeof(float)), a->ln1_rstd = DEV(N * sizeof(float));
        a->ln2_mean = DEV(N * sizeof(float)), a->ln2_rstd = DEV(N * sizeof(float));
    }
#undef DEV
    if (!ok) {
        snprintf(msg, msg_len, "cudaMalloc of the activations failed (batch %d x %d tokens)", B, T);
        return DSM_ERR_OUT_OF_MEMORY;
    }
    return DSM_SUCCESS;
}

void gpt_device_free(gpt_device_t *dp) {
    struct gpt_device_s *d = *dp;
    if (!d) return;
    if (d->stream) cudaStreamSynchronize(d->stream);
    for (int l = 0; d->la && l < d->c.num_layers; ++l) {
        struct device_layer *a = &d->la[l];
        void *p[] = {a->ln1, a->qkv, a->att, a->atty, a->res2, a->ln2, a->fch, a->fch_gelu, a->res3,
                     a->ln1_mean, a->ln1_rstd, a->ln2_mean, a->ln2_rstd};
        for (size_t i = 0; i < sizeof p / sizeof p[0]; ++i) cudaFree(p[i]);
    }
    void *p[] = {d->tok_dev, d->pos_dev, d->lab_dev, d->dfch_gelu, d->encoded, d->lnf, d->logits, d->losses_dev, d->lnf_mean, d->lnf_rstd,
                 d->scratch, d->dres, d->dln, d->dqkv, d->datty, d->dfch, d->dlnf};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; ++i) cudaFree(p[i]);
    gpt_cuda_free(&d->ctx);
    if (d->walk->engine && d->stream) dsm_engine_set_stream(d->walk->engine, NULL);
    if (d->stream) cudaStreamDestroy(d->stream);
    d->walk->ops = NULL, d->walk->ctx = NULL;
    free(d->la), free(d->losses_host);
    free(d);
    *dp = NULL;
}

/* ------------------------------------------------------------ the operations */

/* The device's operations, in the walk's order: bf16 activations, the
 * parameters and gradients the engine's (bf16, device memory). */
static const void *block_input(const struct gpt_device_s *d, int l) {
    return l > 0 ? d->la[l - 1].res3 : d->encoded;
}

static dsm_status_t device_encoder_forward(void *ctx, const void *const *w) {
    struct gpt_device_s *d = ctx;
    KERNEL(d, gpt_encoder_forward(d->ctx, d->encoded, d->tok_dev, d->pos_dev, w[gpt_wte()], w[gpt_wpe()], d->N,
                                  d->c.channels));
    return DSM_SUCCESS;
}

static dsm_status_t device_block_forward(void *ctx, int l, const void *const *wall) {
    struct gpt_device_s *d = ctx;
    const int N = d->N, C = d->c.channels, NH = d->c.num_heads, hs = C / NH;
    const void *const *w = wall + gpt_layer_param(l, 0);
    struct device_layer *a = &d->la[l];
    const void *x = block_input(d, l);
    KERNEL(d, gpt_layernorm_forward(d->ctx, a->ln1, a->ln1_mean, a->ln1_rstd, x, w[LN1_W], w[LN1_B], N, C));
    KERNEL(d, gpt_matmul_forward(d->ctx, a->qkv, a->ln1, w[QKV_W], GPT_W_IN_OUT, w[QKV_B], N, C, 3 * C));
    const char *qkv = a->qkv; /* q | k | v of each token, bf16 */
    KERNEL(d, gpt_attention_forward(d->ctx, a->atty, C, a->att, qkv, qkv + 2 * C, qkv + 4 * C, 3 * C, d->B, d->T,
                                    NH, hs, d->scratch));
    /* c_proj into ln2's buffer, then the residual; ln2 is written after */
    KERNEL(d, gpt_matmul_forward(d->ctx, a->ln2, a->atty, w[ATTPROJ_W], GPT_W_IN_OUT, w[ATTPROJ_B], N, C, C));
    KERNEL(d, gpt_residual_forward(d->ctx, a->res2, x, a->ln2, (size_t)N * C));
    KERNEL(d, gpt_layernorm_forward(d->ctx, a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, w[LN2_W], w[LN2_B], N, C));
    KERNEL(d, gpt_matmul_forward(d->ctx, a->fch, a->ln2, w[FC_W], GPT_W_IN_OUT, w[FC_B], N, C, 4 * C));
    KERNEL(d, gpt_gelu_forward(d->ctx, a->fch_gelu, a->fch, (size_t)N * 4 * C));
    KERNEL(d, gpt_matmul_forward(d->ctx, a->res3, a->fch_gelu, w[FCPROJ_W], GPT_W_IN_OUT, w[FCPROJ_B], N, 4 * C, C));
    KERNEL(d, gpt_residual_forward(d->ctx, a->res3, a->res2, a->res3, (size_t)N * C));
    return DSM_SUCCESS;
}

/* The LM head: the losses and, in place of the logits, their gradient times
 * dloss; the losses are read back after the walk releases the head. */
static dsm_status_t device_head_forward(void *ctx, const void *const *w) {
    struct gpt_device_s *d = ctx;
    const GPTConfig *c = &d->c;
    const int N = d->N, C = c->channels;
    KERNEL(d, gpt_layernorm_forward(d->ctx, d->lnf, d->lnf_mean, d->lnf_rstd, block_input(d, c->num_layers),
                                    w[gpt_lnf_w(c)], w[gpt_lnf_b(c)], N, C));
    KERNEL(d, gpt_matmul_forward(d->ctx, d->logits, d->lnf, w[gpt_wte()], GPT_W_OUT_IN, NULL, N, C,
                                 c->padded_vocab_size));
    KERNEL(d, gpt_fused_classifier(d->ctx, d->logits, d->losses_dev, d->lab_dev, d->dloss, N, c->vocab_size,
                                   c->padded_vocab_size));
    return DSM_SUCCESS;
}

/* Zeroes n bf16 on the stream (the backwards add into what they are given). */
static dsm_status_t zero(struct gpt_device_s *d, void *p, size_t n) {
    cudaError_t e = cudaMemsetAsync(p, 0, n * 2, d->stream);
    return e == cudaSuccess ? DSM_SUCCESS : cuda_fail(d, e, "cudaMemsetAsync");
}

static dsm_status_t device_head_backward(void *ctx, const void *const *w, void *const *g) {
    struct gpt_device_s *d = ctx;
    const GPTConfig *c = &d->c;
    const int N = d->N, C = c->channels;
    const gpt_grad_dtype_t gdt = GPT_GRAD_BF16;
    dsm_status_t st;
    if ((st = zero(d, d->dlnf, (size_t)N * C))) return st;
    KERNEL(d, gpt_matmul_backward(d->ctx, d->dlnf, g[gpt_wte()], NULL, gdt, d->logits, d->lnf, w[gpt_wte()],
                                  GPT_W_OUT_IN, N, C, c->padded_vocab_size));
    if ((st = zero(d, d->dres, (size_t)N * C))) return st;
    KERNEL(d, gpt_layernorm_backward(d->ctx, d->dres, g[gpt_lnf_w(c)], g[gpt_lnf_b(c)], gdt, d->dlnf,
                                     block_input(d, c->num_layers), w[gpt_lnf_w(c)], d->lnf_mean, d->lnf_rstd, N, C));
    return DSM_SUCCESS;
}

static dsm_status_t device_block_backward(void *ctx, int l, const void *const *wall, void *const *gall) {
    struct gpt_device_s *d = ctx;
    const int N = d->N, C = d->c.channels, NH = d->c.num_heads, hs = C / NH;
    const gpt_grad_dtype_t gdt = GPT_GRAD_BF16;
    const void *const *w = wall + gpt_layer_param(l, 0);
    void *const *g = gall + gpt_layer_param(l, 0);
    struct device_layer *a = &d->la[l];
    dsm_status_t st;
    /* the backwards add into the activations' gradients: zero them first */
    if ((st = zero(d, d->dfch_gelu, (size_t)N * 4 * C)) || (st = zero(d, d->dfch, (size_t)N * 4 * C)) ||
        (st = zero(d, d->dln, (size_t)N * C)) || (st = zero(d, d->datty, (size_t)N * C)))
        return st;
    KERNEL(d, gpt_matmul_backward(d->ctx, d->dfch_gelu, g[FCPROJ_W], g[FCPROJ_B], gdt, d->dres, a->fch_gelu,
                                  w[FCPROJ_W], GPT_W_IN_OUT, N, 4 * C, C));
    KERNEL(d, gpt_gelu_backward(d->ctx, d->dfch, a->fch, d->dfch_gelu, (size_t)N * 4 * C));
    KERNEL(d, gpt_matmul_backward(d->ctx, d->dln, g[FC_W], g[FC_B], gdt, d->dfch, a->ln2, w[FC_W], GPT_W_IN_OUT, N,
                                  C, 4 * C));
    KERNEL(d, gpt_layernorm_backward(d->ctx, d->dres, g[LN2_W], g[LN2_B], gdt, d->dln, a->res2, w[LN2_W],
                                     a->ln2_mean, a->ln2_rstd, N, C));
    KERNEL(d, gpt_matmul_backward(d->ctx, d->datty, g[ATTPROJ_W], g[ATTPROJ_B], gdt, d->dres, a->atty, w[ATTPROJ_W],
                                  GPT_W_IN_OUT, N, C, C));
    char *dqkv = d->dqkv;
    const char *qkv = a->qkv;
    KERNEL(d, gpt_attention_backward(d->ctx, dqkv, dqkv + 2 * C, dqkv + 4 * C, 3 * C, d->datty, C, a->att, qkv,
                                     qkv + 2 * C, qkv + 4 * C, d->B, d->T, NH, hs, d->scratch));
    if ((st = zero(d, d->dln, (size_t)N * C))) return st;
    KERNEL(d, gpt_matmul_backward(d->ctx, d->dln, g[QKV_W], g[QKV_B], gdt, d->dqkv, a->ln1, w[QKV_W], GPT_W_IN_OUT,
                                  N, C, 3 * C));
    KERNEL(d, gpt_layernorm_backward(d->ctx, d->dres, g[LN1_W], g[LN1_B], gdt, d->dln, block_input(d, l), w[LN1_W],
                                     a->ln1_mean, a->ln1_rstd, N, C));
    return DSM_SUCCESS;
}

static dsm_status_t device_encoder_backward(void *ctx, void *const *g) {
    struct gpt_device_s *d = ctx;
    const GPTConfig *c = &d->c;
    KERNEL(d, gpt_encoder_backward(d->ctx, g[gpt_wte()], g[gpt_wpe()], GPT_GRAD_BF16, d->dres, d->tok_host,
                                   d->pos_host, d->N, c->channels, c->padded_vocab_size, c->max_seq_len));
    return DSM_SUCCESS;
}

static const struct gpt_ops device_ops = {
    device_encoder_forward, device_block_forward, device_head_forward,
    device_head_backward,   device_block_backward, device_encoder_backward,
};

/* ------------------------------------------------------------ the passes */

dsm_status_t gpt_device_forward(gpt_device_t d, const int64_t *tok, const int64_t *pos, const int64_t *lab,
                                float dloss, double *loss_sum, int64_t *count) {
    const int N = d->N;
    int64_t counted = 0;
    for (int n = 0; n < N; ++n) counted += lab[n] >= 0;
    d->tok_host = tok, d->pos_host = pos; /* for the embedding's backward */
    d->dloss = dloss;
    const size_t bytes = (size_t)N * sizeof(int64_t);
    cudaError_t e;
    if ((e = cudaMemcpyAsync(d->tok_dev, tok, bytes, cudaMemcpyHostToDevice, d->stream)) ||
        (e = cudaMemcpyAsync(d->pos_dev, pos, bytes, cudaMemcpyHostToDevice, d->stream)) ||
        (e = cudaMemcpyAsync(d->lab_dev, lab, bytes, cudaMemcpyHostToDevice, d->stream)))
        return cuda_fail(d, e, "copying the batch");
    dsm_status_t st = gpt_walk_forward(d->walk);
    if (st != DSM_SUCCESS) return st;
    if ((e = cudaMemcpyAsync(d->losses_host, d->losses_dev, (size_t)N * sizeof(float), cudaMemcpyDeviceToHost,
                             d->stream)) || (e = cudaStreamSynchronize(d->stream)))
        return cuda_fail(d, e, "reading the losses");
    double sum = 0.0;
    for (int n = 0; n < N; ++n) sum += d->losses_host[n];
    *loss_sum = sum, *count = counted;
    return DSM_SUCCESS;
}

dsm_status_t gpt_device_backward(gpt_device_t d) { return gpt_walk_backward(d->walk); }
