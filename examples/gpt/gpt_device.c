/*
 * gpt_device.c: the CUDA path of train_gpt (--device cuda): the same model
 * and the same libdsm calls as the host path, on a device-resident engine.
 *
 * The engine keeps parameters, gradients, master weights and optimizer state
 * in the GPU's memory (DSM_DEVICE_CUDA) and orders its work on this path's
 * stream (dsm_engine_set_stream). Activations and parameters are bf16 (the
 * configuration must enable bf16); the kernels of examples/gpt/cuda
 * (gpt_kernels.h) do the math in fp32 and add the parameter gradients
 * straight into the engine's bf16 buffers. Blocks are acquired and released
 * in turn as on the host, so ZeRO-3 gathers block by block on the GPU.
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
    dsm_engine_t engine;
    int B, T, N, np;
    cudaStream_t stream;
    gpt_cuda_t ctx;
    const void **w; /* parameters while acquired (bf16, device) */
    void **g;       /* gradient buffers while acquired (bf16, device) */
    int64_t *tok_dev, *pos_dev, *lab_dev;
    const int64_t *tok_host, *pos_host;
    void *encoded, *lnf, *logits, *scratch;
    float *lnf_mean, *lnf_rstd, *losses_dev, *losses_host;
    void *dres, *dln, *dqkv, *datty, *dfch, *dfch_gelu, *dlnf;
    struct device_layer *la;
    double *t_dsm;
    char *msg;
    size_t msg_len;
};

/* Every libdsm call adds its time to *t_dsm, as on the host path. */
static double t0_;
static dsm_status_t st_;
#define DSM(d, call) (t0_ = MPI_Wtime(), st_ = (call), *(d)->t_dsm += MPI_Wtime() - t0_, st_)

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

dsm_status_t gpt_device_create(dsm_engine_t engine, const GPTConfig *c, int B, int T, double *t_dsm, char *msg,
                               size_t msg_len, gpt_device_t *out) {
    *out = NULL;
    dsm_dtype_t dtype;
    dsm_status_t st = dsm_engine_dtype(engine, &dtype);
    if (st != DSM_SUCCESS) return st;
    if (dtype != DSM_BFLOAT16) {
        snprintf(msg, msg_len, "--device cuda computes in bf16: enable \"bf16\" in the configuration (the engine "
                 "computes in %s)", dsm_dtype_name(dtype));
        return DSM_ERR_INVALID_ARGUMENT;
    }
    struct gpt_device_s *d = calloc(1, sizeof *d);
    if (!d) return DSM_ERR_OUT_OF_MEMORY;
    d->c = *c, d->engine = engine, d->B = B, d->T = T, d->N = B * T, d->np = gpt_num_params(c);
    d->t_dsm = t_dsm, d->msg = msg, d->msg_len = msg_len;
    *out = d;
    cudaError_t e = cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) return cuda_fail(d, e, "cudaStreamCreate");
    if ((st = dsm_engine_set_stream(engine, d->stream)) != DSM_SUCCESS) return st;
    if (gpt_cuda_create(d->stream, &d->ctx) != 0) {
        snprintf(msg, msg_len, "%s", gpt_cuda_error(NULL));
        return DSM_ERR_CUDA;
    }
    const size_t N = (size_t)d->N, C = (size_t)c->channels, Vp = (size_t)c->padded_vocab_size, H = 2;
    int ok = 1;
#define DEV(bytes) dev_alloc(d->stream, (bytes), &ok)
    d->w = calloc((size_t)d->np, sizeof *d->w), d->g = calloc((size_t)d->np, sizeof *d->g);
    d->la = calloc((size_t)c->num_layers, sizeof *d->la);
    d->losses_host = calloc(N, sizeof(float));
    if (!d->w || !d->g || !d->la || !d->losses_host) return DSM_ERR_OUT_OF_MEMORY;
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
    if (d->engine && d->stream) dsm_engine_set_stream(d->engine, NULL);
    if (d->stream) cudaStreamDestroy(d->stream);
    free(d->w), free(d->g), free(d->la), free(d->losses_host);
    free(d);
    *dp = NULL;
}

static dsm_status_t acquire(struct gpt_device_s *d, const int *idx, int n) {
    for (int i = 0; i < n; ++i) {
        dsm_status_t st = DSM(d, dsm_engine_param_acquire(d->engine, idx[i], &d->w[idx[i]]));
        if (st != DSM_SUCCESS) return st;
    }
    return DSM_SUCCESS;
}
static dsm_status_t release(struct gpt_device_s *d, const int *idx, int n) {
    for (int i = 0; i < n; ++i) {
        dsm_status_t st = DSM(d, dsm_engine_param_release(d->engine, idx[i]));
        if (st != DSM_SUCCESS) return st;
    }
    return DSM_SUCCESS;
}
static dsm_status_t grads_open(struct gpt_device_s *d, const int *idx, int n) {
    for (int i = 0; i < n; ++i) {
        dsm_status_t st = DSM(d, dsm_engine_grad_acquire(d->engine, idx[i], &d->g[idx[i]]));
        if (st != DSM_SUCCESS) return st;
    }
    return DSM_SUCCESS;
}
static dsm_status_t grads_close(struct gpt_device_s *d, const int *idx, int n) {
    for (int i = 0; i < n; ++i) {
        dsm_status_t st = DSM(d, dsm_engine_grad_release(d->engine, idx[i]));
        if (st != DSM_SUCCESS) return st;
    }
    return DSM_SUCCESS;
}

dsm_status_t gpt_device_forward(gpt_device_t d, const int64_t *tok, const int64_t *pos, const int64_t *lab,
                                float dloss, double *loss_sum, int64_t *count) {
    const GPTConfig *c = &d->c;
    const int N = d->N, C = c->channels, B = d->B, T = d->T, NH = c->num_heads, hs = C / NH;
    int64_t counted = 0;
    for (int n = 0; n < N; ++n) counted += lab[n] >= 0;
    d->tok_host = tok, d->pos_host = pos; /* for the embedding's backward */
    const size_t bytes = (size_t)N * sizeof(int64_t);
    cudaError_t e;
    if ((e = cudaMemcpyAsync(d->tok_dev, tok, bytes, cudaMemcpyHostToDevice, d->stream)) ||
        (e = cudaMemcpyAsync(d->pos_dev, pos, bytes, cudaMemcpyHostToDevice, d->stream)) ||
        (e = cudaMemcpyAsync(d->lab_dev, lab, bytes, cudaMemcpyHostToDevice, d->stream)))
        return cuda_fail(d, e, "copying the batch");
    dsm_status_t st;
    const int emb[2] = {gpt_wte(), gpt_wpe()};
    if ((st = acquire(d, emb, 2))) return st;
    KERNEL(d, gpt_encoder_forward(d->ctx, d->encoded, d->tok_dev, d->pos_dev, d->w[gpt_wte()], d->w[gpt_wpe()], N, C));
    if ((st = release(d, emb, 2))) return st;
    const void *x = d->encoded;
    for (int l = 0; l < c->num_layers; ++l) {
        int idx[NUM_LAYER_PARAMS];
        for (int k = 0; k < NUM_LAYER_PARAMS; ++k) idx[k] = gpt_layer_param(l, k);
        if ((st = acquire(d, idx, NUM_LAYER_PARAMS))) return st;
        const void **w = d->w + gpt_layer_param(l, 0);
        struct device_layer *a = &d->la[l];
        KERNEL(d, gpt_layernorm_forward(d->ctx, a->ln1, a->ln1_mean, a->ln1_rstd, x, w[LN1_W], w[LN1_B], N, C));
        KERNEL(d, gpt_matmul_forward(d->ctx, a->qkv, a->ln1, w[QKV_W], GPT_W_IN_OUT, w[QKV_B], N, C, 3 * C));
        const char *qkv = a->qkv; /* q | k | v of each token, bf16 */
        KERNEL(d, gpt_attention_forward(d->ctx, a->atty, C, a->att, qkv, qkv + 2 * C, qkv + 4 * C, 3 * C, B, T, NH,
                                        hs, d->scratch));
        /* c_proj into ln2's buffer, then the residual; ln2 is written after */
        KERNEL(d, gpt_matmul_forward(d->ctx, a->ln2, a->atty, w[ATTPROJ_W], GPT_W_IN_OUT, w[ATTPROJ_B], N, C, C));
        KERNEL(d, gpt_residual_forward(d->ctx, a->res2, x, a->ln2, (size_t)N * C));
        KERNEL(d, gpt_layernorm_forward(d->ctx, a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, w[LN2_W], w[LN2_B], N, C));
        KERNEL(d, gpt_matmul_forward(d->ctx, a->fch, a->ln2, w[FC_W], GPT_W_IN_OUT, w[FC_B], N, C, 4 * C));
        KERNEL(d, gpt_gelu_forward(d->ctx, a->fch_gelu, a->fch, (size_t)N * 4 * C));
        KERNEL(d, gpt_matmul_forward(d->ctx, a->res3, a->fch_gelu, w[FCPROJ_W], GPT_W_IN_OUT, w[FCPROJ_B], N, 4 * C, C));
        KERNEL(d, gpt_residual_forward(d->ctx, a->res3, a->res2, a->res3, (size_t)N * C));
        if ((st = release(d, idx, NUM_LAYER_PARAMS))) return st;
        x = a->res3;
    }
    const int head[3] = {gpt_lnf_w(c), gpt_lnf_b(c), gpt_wte()};
    if ((st = acquire(d, head, 3))) return st;
    KERNEL(d, gpt_layernorm_forward(d->ctx, d->lnf, d->lnf_mean, d->lnf_rstd, x, d->w[head[0]], d->w[head[1]], N, C));
    KERNEL(d, gpt_matmul_forward(d->ctx, d->logits, d->lnf, d->w[gpt_wte()], GPT_W_OUT_IN, NULL, N, C,
                                 c->padded_vocab_size));
    /* the losses and, in place of the logits, their gradient times dloss */
    KERNEL(d, gpt_fused_classifier(d->ctx, d->logits, d->losses_dev, d->lab_dev, dloss, N, c->vocab_size,
                                   c->padded_vocab_size));
    if ((st = release(d, head, 3))) return st;
    if ((e = cudaMemcpyAsync(d->losses_host, d->losses_dev, (size_t)N * sizeof(float), cudaMemcpyDeviceToHost,
                             d->stream)) || (e = cudaStreamSynchronize(d->stream)))
        return cuda_fail(d, e, "reading the losses");
    double sum = 0.0;
    for (int n = 0; n < N; ++n) sum += d->losses_host[n];
    *loss_sum = sum, *count = counted;
    return DSM_SUCCESS;
}

dsm_status_t gpt_device_backward(gpt_device_t d) {
    const GPTConfig *c = &d->c;
    const int N = d->N, C = c->channels, B = d->B, T = d->T, NH = c->num_heads, L = c->num_layers, hs = C / NH;
    const size_t H = 2; /* bytes of a bf16 */
    const gpt_grad_dtype_t gdt = GPT_GRAD_BF16;
    dsm_status_t st;
    /* wte's gradient collects the LM head's and the embedding's: held open
     * over the whole backward, with wpe's. */
    const int emb[2] = {gpt_wte(), gpt_wpe()};
    const int head[3] = {gpt_lnf_w(c), gpt_lnf_b(c), gpt_wte()};
    const void *x_last = L > 0 ? d->la[L - 1].res3 : d->encoded;
    if ((st = grads_open(d, emb, 2)) || (st = acquire(d, head, 3)) || (st = grads_open(d, head, 2))) return st;
    if (cudaMemsetAsync(d->dlnf, 0, (size_t)N * C * H, d->stream) != cudaSuccess)
        return cuda_fail(d, cudaGetLastError(), "cudaMemsetAsync");
    KERNEL(d, gpt_matmul_backward(d->ctx, d->dlnf, d->g[gpt_wte()], NULL, gdt, d->logits, d->lnf, d->w[gpt_wte()],
                                  GPT_W_OUT_IN, N, C, c->padded_vocab_size));
    if (cudaMemsetAsync(d->dres, 0, (size_t)N * C * H, d->stream) != cudaSuccess)
        return cuda_fail(d, cudaGetLastError(), "cudaMemsetAsync");
    KERNEL(d, gpt_layernorm_backward(d->ctx, d->dres, d->g[head[0]], d->g[head[1]], gdt, d->dlnf, x_last,
                                     d->w[head[0]], d->lnf_mean, d->lnf_rstd, N, C));
    if ((st = release(d, head, 3)) || (st = grads_close(d, head, 2))) return st;
    for (int l = L - 1; l >= 0; --l) {
        int idx[NUM_LAYER_PARAMS];
        for (int k = 0; k < NUM_LAYER_PARAMS; ++k) idx[k] = gpt_layer_param(l, k);
        if ((st = acquire(d, idx, NUM_LAYER_PARAMS)) || (st = grads_open(d, idx, NUM_LAYER_PARAMS))) return st;
        const void **w = d->w + gpt_layer_param(l, 0);
        void **g = d->g + gpt_layer_param(l, 0);
        struct device_layer *a = &d->la[l];
        const void *x = l > 0 ? d->la[l - 1].res3 : d->encoded;
        /* the backwards add into the activations' gradients: zero them first */
        void *zero[] = {d->dfch_gelu, d->dfch, d->dln, d->datty};
        const size_t zero_n[] = {(size_t)N * 4 * C, (size_t)N * 4 * C, (size_t)N * C, (size_t)N * C};
        for (int i = 0; i < 4; ++i)
            if (cudaMemsetAsync(zero[i], 0, zero_n[i] * H, d->stream) != cudaSuccess)
                return cuda_fail(d, cudaGetLastError(), "cudaMemsetAsync");
        KERNEL(d, gpt_matmul_backward(d->ctx, d->dfch_gelu, g[FCPROJ_W], g[FCPROJ_B], gdt, d->dres, a->fch_gelu,
                                      w[FCPROJ_W], GPT_W_IN_OUT, N, 4 * C, C));
        KERNEL(d, gpt_gelu_backward(d->ctx, d->dfch, a->fch, d->dfch_gelu, (size_t)N * 4 * C));
        KERNEL(d, gpt_matmul_backward(d->ctx, d->dln, g[FC_W], g[FC_B], gdt, d->dfch, a->ln2, w[FC_W],
                                      GPT_W_IN_OUT, N, C, 4 * C));
        KERNEL(d, gpt_layernorm_backward(d->ctx, d->dres, g[LN2_W], g[LN2_B], gdt, d->dln, a->res2, w[LN2_W],
                                         a->ln2_mean, a->ln2_rstd, N, C));
        KERNEL(d, gpt_matmul_backward(d->ctx, d->datty, g[ATTPROJ_W], g[ATTPROJ_B], gdt, d->dres, a->atty,
                                      w[ATTPROJ_W], GPT_W_IN_OUT, N, C, C));
        char *dqkv = d->dqkv;
        const char *qkv = a->qkv;
        KERNEL(d, gpt_attention_backward(d->ctx, dqkv, dqkv + 2 * C, dqkv + 4 * C, 3 * C, d->datty, C, a->att, qkv,
                                         qkv + 2 * C, qkv + 4 * C, B, T, NH, hs, d->scratch));
        if (cudaMemsetAsync(d->dln, 0, (size_t)N * C * H, d->stream) != cudaSuccess)
            return cuda_fail(d, cudaGetLastError(), "cudaMemsetAsync");
        KERNEL(d, gpt_matmul_backward(d->ctx, d->dln, g[QKV_W], g[QKV_B], gdt, d->dqkv, a->ln1, w[QKV_W],
                                      GPT_W_IN_OUT, N, C, 3 * C));
        KERNEL(d, gpt_layernorm_backward(d->ctx, d->dres, g[LN1_W], g[LN1_B], gdt, d->dln, x, w[LN1_W],
                                         a->ln1_mean, a->ln1_rstd, N, C));
        if ((st = release(d, idx, NUM_LAYER_PARAMS)) || (st = grads_close(d, idx, NUM_LAYER_PARAMS))) return st;
    }
    KERNEL(d, gpt_encoder_backward(d->ctx, d->g[gpt_wte()], d->g[gpt_wpe()], gdt, d->dres, d->tok_host, d->pos_host,
                                   N, C, c->padded_vocab_size, c->max_seq_len));
    return grads_close(d, emb, 2);
}
