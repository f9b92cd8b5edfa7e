/*
 * ulysses_block.c: the layers of examples/c/ulysses_attention.c: nn.Linear
 * and its gradients, and causal multi-head attention sequence-parallel with
 * DeepSpeed-Ulysses' all-to-alls (ulysses_block.h).
 */
#include "ulysses_block.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ nn.Linear */

/* nn.Linear: y[i][o] = bias[o] + sum_k x[i][k] w[o][k]; w is [out][in], bias may be NULL. */
void linear(int64_t n, int in, int out, const float *x, const float *w, const float *bias,
            float *y) {
    for (int64_t i = 0; i < n; ++i)
        for (int o = 0; o < out; ++o) {
            float acc = bias ? bias[o] : 0.0f;
            for (int k = 0; k < in; ++k) acc += x[i * in + k] * w[o * in + k];
            y[i * out + o] = acc;
        }
}
/* The gradient of the input: dx = dy w (overwrites dx, or adds with accumulate). */
void linear_dx(int64_t n, int in, int out, const float *dy, const float *w, float *dx,
               int accumulate) {
    for (int64_t i = 0; i < n; ++i)
        for (int k = 0; k < in; ++k) {
            float acc = 0.0f;
            for (int o = 0; o < out; ++o) acc += dy[i * out + o] * w[o * in + k];
            dx[i * in + k] = accumulate ? dx[i * in + k] + acc : acc;
        }
}
/* The gradients of the parameters, added: dw += dy^T x, db += column sums of dy. */
void linear_dw(int64_t n, int in, int out, const float *x, const float *dy, float *dw,
               float *db) {
    for (int64_t i = 0; i < n; ++i)
        for (int o = 0; o < out; ++o) {
            const float g = dy[i * out + o];
            if (db) db[o] += g;
            for (int k = 0; k < in; ++k) dw[o * in + k] += g * x[i * in + k];
        }
}

/* ------------------------------------------------- sequence-parallel attention */


/* The tensors that go through the all-to-alls live in memory from
 * dsm_sp_alloc() (collective: every rank allocates and frees them in the same
 * order), so that inside a node each rank reads its peers' pieces in place;
 * the rest, and everything of the single-rank reference, in plain memory. */
void attn_free(struct attn *a) {
    float **shared[] = {&a->q, &a->k, &a->v, &a->o, &a->qh, &a->kh, &a->vh, &a->oh,
                        &a->dq, &a->dk, &a->dv, &a->dqh, &a->dkh, &a->dvh, &a->doh};
    for (size_t i = 0; i < sizeof shared / sizeof shared[0]; ++i) {
        if (a->sp) dsm_sp_free_memory(a->sp, (void **)shared[i]);
        else free(*shared[i]);
    }
    free(a->probs), free(a->row);
    memset(a, 0, sizeof *a);
}

/* Set up for at most b sequences of s tokens. Every rank of the group checks
 * every rank's head ranges, so a bad head count fails all of them alike. */
dsm_status_t attn_init(struct attn *a, dsm_sp_t sp, int64_t b, int64_t s, int H, int Hkv, int d,
                       char *msg, size_t msg_len) {
    memset(a, 0, sizeof *a);
    a->sp = sp, a->P = 1, a->H = H, a->Hkv = Hkv, a->d = d, a->b = b, a->s = s;
    int rank = 0;
    dsm_status_t st;
    if (sp && ((st = dsm_sp_size(sp, &a->P)) || (st = dsm_sp_rank(sp, &rank)))) return st;
    a->n = s / a->P;
    /* Grouped-query attention with fewer key/value heads than ranks: each
     * rank gets a copy of the one its query heads use. The backward
     * all-to-all then sums the copies' gradients, which is exactly the
     * gradient of the replication. */
    const unsigned kv_flags = Hkv < H && Hkv < a->P ? DSM_SP_REPLICATE : 0u;
    const dsm_sp_tensor_t tq = {b, s, H, d, DSM_SP_BATCH_FIRST, DSM_FLOAT32, 0};
    const dsm_sp_tensor_t tkv = {b, s, Hkv, d, DSM_SP_BATCH_FIRST, DSM_FLOAT32, kv_flags};
    a->tq = tq, a->tkv = tkv;
    for (int r = 0; r < a->P; ++r) {
        int64_t qf, qc, kf, kc;
        if ((st = dsm_sp_head_range(H, 0, a->P, r, &qf, &qc)) ||
            (st = dsm_sp_head_range(Hkv, kv_flags, a->P, r, &kf, &kc)))
            return st;
        for (int64_t h = qf; h < qf + qc; ++h)
            if (h / (H / Hkv) < kf || h / (H / Hkv) >= kf + kc) {
                snprintf(msg, msg_len, "%d query heads, %d key/value heads on %d ranks: rank %d holds "
                         "query head %lld but not its key/value head %lld",
                         H, Hkv, a->P, r, (long long)h, (long long)(h / (H / Hkv)));
                return DSM_ERR_INVALID_ARGUMENT;
            }
        if (r == rank) a->qf = qf, a->qc = qc, a->kf = kf, a->kc = kc;
    }
    const size_t nq = (size_t)(b * a->n * H * d), nkv = (size_t)(b * a->n * Hkv * d);
    const size_t hq = (size_t)(b * s * a->qc * d), hkv = (size_t)(b * s * a->kc * d);
    float **sized[] = {&a->q, &a->o, &a->dq, &a->k, &a->v, &a->dk, &a->dv, &a->qh, &a->oh, &a->dqh,
                       &a->doh, &a->kh, &a->vh, &a->dkh, &a->dvh};
    const size_t sizes[] = {nq, nq, nq, nkv, nkv, nkv, nkv, hq, hq, hq, hq, hkv, hkv, hkv, hkv};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; ++i) {
        if (a->sp) { /* collective and zeroed; fails on every rank alike */
            if ((st = dsm_sp_alloc(sp, sizes[i] * sizeof(float), (void **)sized[i])) != DSM_SUCCESS) return st;
        } else if (!(*sized[i] = calloc(sizes[i] ? sizes[i] : 1, sizeof(float)))) {
            return DSM_ERR_OUT_OF_MEMORY;
        }
    }
    a->probs = calloc((size_t)(b * a->qc * s * s) + 1, sizeof(float));
    a->row = calloc((size_t)s, sizeof(float));
    return a->probs && a->row ? DSM_SUCCESS : DSM_ERR_OUT_OF_MEMORY;
}

/* Use the first b sequences of the buffers (a short last micro-batch). */
void attn_set_batch(struct attn *a, int64_t b) { a->b = a->tq.batch = a->tkv.batch = b; }

/* The all-to-alls of n tensors; with one rank the two layouts are the same
 * bytes, so a copy. The counts come from dsm_sp_counts(). */
static dsm_status_t all_to_all(const struct attn *a, int to_heads, int n, const dsm_sp_tensor_t t[],
                              const void *const in[], void *const out[]) {
    size_t seq_count[3], head_count[3];
    for (int i = 0; i < n; ++i) {
        if (!a->sp) {
            memcpy(out[i], in[i], (size_t)(t[i].batch * t[i].seq * t[i].heads * t[i].head_dim) * sizeof(float));
            continue;
        }
        dsm_status_t st = dsm_sp_counts(a->sp, &t[i], &seq_count[i], &head_count[i]);
        if (st) return st;
    }
    if (!a->sp) return DSM_SUCCESS;
    return to_heads ? dsm_sp_seq_to_head_n(a->sp, n, t, in, seq_count, out, head_count)
                    : dsm_sp_head_to_seq_n(a->sp, n, t, in, head_count, out, seq_count);
}

/* The attention proper, on head-sharded tensors: every token, this rank's heads. */
static void attn_core_forward(struct attn *a) {
    const int64_t s = a->s, qc = a->qc, kc = a->kc;
    const int d = a->d, group = a->H / a->Hkv;
    const float scale = 1.0f / sqrtf((float)d);
    for (int64_t bi = 0; bi < a->b; ++bi)
        for (int64_t hl = 0; hl < qc; ++hl) {
            const int64_t kl = (a->qf + hl) / group - a->kf; /* local key/value head */
            for (int64_t i = 0; i < s; ++i) {
                const float *qi = a->qh + ((bi * s + i) * qc + hl) * d;
                float *p = a->probs + ((bi * qc + hl) * s + i) * s, mx = -INFINITY, sum = 0.0f;
                for (int64_t j = 0; j <= i; ++j) { /* causal: token i sees tokens 0..i */
                    const float *kj = a->kh + ((bi * s + j) * kc + kl) * d;
                    float dot = 0.0f;
                    for (int e = 0; e < d; ++e) dot += qi[e] * kj[e];
                    p[j] = dot * scale;
                    if (p[j] > mx) mx = p[j];
                }
                for (int64_t j = 0; j <= i; ++j) sum += (p[j] = expf(p[j] - mx));
                for (int64_t j = 0; j <= i; ++j) p[j] /= sum;
                float *oi = a->oh + ((bi * s + i) * qc + hl) * d;
                for (int e = 0; e < d; ++e) oi[e] = 0.0f;
                for (int64_t j = 0; j <= i; ++j) {
                    const float *vj = a->vh + ((bi * s + j) * kc + kl) * d;
                    for (int e = 0; e < d; ++e) oi[e] += p[j] * vj[e];
                }
            }
        }
}

/* Its backward: from doh, the gradients dqh, dkh, dvh (the latter summed over
 * the query heads of a group). Softmax: ds_j = p_j (dp_j - sum_k p_k dp_k). */
static void attn_core_backward(struct attn *a) {
    const int64_t s = a->s, qc = a->qc, kc = a->kc;
    const int d = a->d, group = a->H / a->Hkv;
    const float scale = 1.0f / sqrtf((float)d);
    memset(a->dkh, 0, (size_t)(a->b * s * kc * d) * sizeof(float));
    memset(a->dvh, 0, (size_t)(a->b * s * kc * d) * sizeof(float));
    for (int64_t bi = 0; bi < a->b; ++bi)
        for (int64_t hl = 0; hl < qc; ++hl) {
            const int64_t kl = (a->qf + hl) / group - a->kf;
            for (int64_t i = 0; i < s; ++i) {
                const float *p = a->probs + ((bi * qc + hl) * s + i) * s;
                const float *qi = a->qh + ((bi * s + i) * qc + hl) * d;
                const float *doi = a->doh + ((bi * s + i) * qc + hl) * d;
                float *dqi = a->dqh + ((bi * s + i) * qc + hl) * d, *dp = a->row, pdp = 0.0f;
                for (int64_t j = 0; j <= i; ++j) {
                    const float *vj = a->vh + ((bi * s + j) * kc + kl) * d;
                    float *dvj = a->dvh + ((bi * s + j) * kc + kl) * d, dot = 0.0f;
                    for (int e = 0; e < d; ++e) dot += doi[e] * vj[e], dvj[e] += p[j] * doi[e];
                    dp[j] = dot;
                    pdp += p[j] * dot;
                }
                for (int e = 0; e < d; ++e) dqi[e] = 0.0f;
                for (int64_t j = 0; j <= i; ++j) {
                    const float ds = p[j] * (dp[j] - pdp) * scale;
                    const float *kj = a->kh + ((bi * s + j) * kc + kl) * d;
                    float *dkj = a->dkh + ((bi * s + j) * kc + kl) * d;
                    for (int e = 0; e < d; ++e) dqi[e] += ds * kj[e], dkj[e] += ds * qi[e];
                }
            }
        }
}

/*
 * The attention block on this rank's b x n tokens: x [b, n, D] -> y [b, n, D],
 * D = H d. The projections are token by token; only the core needs the
 * whole sequence, hence the all-to-all before it (q, k and v in one) and
 * after it. Collective over the group.
 */
dsm_status_t attn_forward(struct attn *a, const float *x, const float *wq, const float *wk,
                          const float *wv, const float *wo, float *y) {
    const int D = a->H * a->d, Dkv = a->Hkv * a->d;
    const int64_t m = a->b * a->n; /* local tokens */
    a->x = x;
    linear(m, D, D, x, wq, NULL, a->q);
    linear(m, D, Dkv, x, wk, NULL, a->k);
    linear(m, D, Dkv, x, wv, NULL, a->v);
    const dsm_sp_tensor_t t[3] = {a->tq, a->tkv, a->tkv};
    const void *in[3] = {a->q, a->k, a->v};
    void *out[3] = {a->qh, a->kh, a->vh};
    dsm_status_t st = all_to_all(a, 1, 3, t, in, out);
    if (st) return st;
    attn_core_forward(a);
    const void *oin[1] = {a->oh};
    void *oout[1] = {a->o};
    if ((st = all_to_all(a, 0, 1, t, oin, oout))) return st;
    linear(m, D, D, a->o, wo, NULL, y);
    return DSM_SUCCESS;
}

/*
 * Backward of attn_forward(): from dy, dx (overwritten) and the weight
 * gradients, added into dwq..dwo. The transforms run in reverse: the
 * gradient of the attention output goes to head-sharded form like o came
 * from it, and the gradients of q, k, v come back like q, k, v went.
 */
dsm_status_t attn_backward(struct attn *a, const float *wq, const float *wk, const float *wv,
                                  const float *wo, const float *dy, float *dx, float *dwq, float *dwk,
                                  float *dwv, float *dwo) {
    const int D = a->H * a->d, Dkv = a->Hkv * a->d;
    const int64_t m = a->b * a->n;
    linear_dw(m, D, D, a->o, dy, dwo, NULL);
    linear_dx(m, D, D, dy, wo, a->o, 0); /* a->o now holds do */
    const dsm_sp_tensor_t t[3] = {a->tq, a->tkv, a->tkv};
    const void *din[1] = {a->o};
    void *dout[1] = {a->doh};
    dsm_status_t st = all_to_all(a, 1, 1, t, din, dout);
    if (st) return st;
    attn_core_backward(a);
    const void *in[3] = {a->dqh, a->dkh, a->dvh};
    void *out[3] = {a->dq, a->dk, a->dv};
    if ((st = all_to_all(a, 0, 3, t, in, out))) return st;
    linear_dw(m, D, D, a->x, a->dq, dwq, NULL);
    linear_dw(m, D, Dkv, a->x, a->dk, dwk, NULL);
    linear_dw(m, D, Dkv, a->x, a->dv, dwv, NULL);
    linear_dx(m, D, D, a->dq, wq, dx, 0);
    linear_dx(m, D, Dkv, a->dk, wk, dx, 1);
    linear_dx(m, D, Dkv, a->dv, wv, dx, 1);
    return DSM_SUCCESS;
}
