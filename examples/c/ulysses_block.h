/*
 * ulysses_block.h: the layers of ulysses_attention (ulysses_block.c).
 */
#ifndef ULYSSES_BLOCK_H
#define ULYSSES_BLOCK_H

#include <stddef.h>
#include <stdint.h>

#include "dsm.h"

/* nn.Linear: y[i][o] = bias[o] + sum_k x[i][k] w[o][k]; w is [out][in], bias may be NULL. */
void linear(int64_t n, int in, int out, const float *x, const float *w, const float *bias, float *y);
/* The gradient of the input: dx = dy w (overwrites dx, or adds with accumulate). */
void linear_dx(int64_t n, int in, int out, const float *dy, const float *w, float *dx, int accumulate);
/* The gradients of the parameters, added: dw += dy^T x, db += column sums of dy. */
void linear_dw(int64_t n, int in, int out, const float *x, const float *dy, float *dw, float *db);

/*
 * Causal multi-head attention over the tokens of one sequence-parallel rank.
 * Shapes: b sequences of s tokens (the whole, padded sequence), H query heads
 * and Hkv key/value heads of d elements; query head h uses key/value head
 * h / (H / Hkv). This rank holds n = s / P tokens of each sequence before and
 * after attention, and query heads [qf, qf + qc), key/value heads [kf, kf + kc)
 * in between. With sp NULL it is the single-rank computation (P = 1).
 */
struct attn {
    dsm_sp_t sp;
    int P, H, Hkv, d;
    int64_t b, s, n;
    int64_t qf, qc, kf, kc;
    dsm_sp_tensor_t tq, tkv; /* global shapes for the all-to-alls */
    const float *x;          /* the input [b, n, H*d], kept for backward */
    float *q, *k, *v, *o;    /* sequence-sharded [b, n, heads*d] */
    float *qh, *kh, *vh, *oh; /* head-sharded [b, s, count, d] */
    float *probs;            /* softmax(q k^T / sqrt(d)) [b, qc, s, s], kept for backward */
    float *dq, *dk, *dv, *dqh, *dkh, *dvh, *doh, *row; /* backward scratch */
};

/* The buffers for b sequences of s tokens, H query and Hkv key/value heads
 * of d elements (collective over sp's group; sp NULL: one rank). A head
 * split that leaves a rank without the key/value head of one of its query
 * heads is DSM_ERR_INVALID_ARGUMENT with the reason in msg. */
dsm_status_t attn_init(struct attn *a, dsm_sp_t sp, int64_t b, int64_t s, int H, int Hkv, int d, char *msg,
                       size_t msg_len);
void attn_free(struct attn *a);
/* Use the first b sequences of the buffers (a short last micro-batch). */
void attn_set_batch(struct attn *a, int64_t b);
/* x [b, n, D] -> y [b, n, D], D = H d; collective over the group. */
dsm_status_t attn_forward(struct attn *a, const float *x, const float *wq, const float *wk, const float *wv,
                          const float *wo, float *y);
/* From dy: dx (overwritten) and the weight gradients, added into dwq..dwo. */
dsm_status_t attn_backward(struct attn *a, const float *wq, const float *wk, const float *wv, const float *wo,
                           const float *dy, float *dx, float *dwq, float *dwk, float *dwv, float *dwo);

#endif /* ULYSSES_BLOCK_H */
