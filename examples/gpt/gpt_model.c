/*
 * gpt_model.c: the host path of train_gpt (gpt_model.h): gpt.h's operations
 * (OpenMP + CBLAS, fp32 math on the compute dtype's values) in the table the
 * walk of gpt_walk.c takes, with Ulysses sequence parallelism around
 * attention at P > 1.
 */
#include "gpt_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "counter_rng.h"

/* ------------------------------------------------------------ attention, sequence-parallel */

/* The attention of one block on this rank's tokens: at P = 1 straight on the
 * fused qkv; at P > 1 q, k and v go to "all tokens, my heads" in one
 * all-to-all, and the output comes back to "my tokens, all heads". */
static dsm_status_t attention_block_forward(struct gpt_model *m, struct layer_acts *a) {
    const int C = m->c.channels, NH = m->c.num_heads, hs = C / NH;
    if (m->P == 1) {
        attention_forward(a->atty, C, a->att, a->qkv, a->qkv + C, a->qkv + 2 * C, 3 * C, m->B, m->T, NH, hs);
        return DSM_SUCCESS;
    }
    for (int n = 0; n < m->N; ++n) { /* split the fused qkv: [N, 3C] -> 3 x [N, C] */
        memcpy(m->qs + (size_t)n * C, a->qkv + (size_t)n * 3 * C, (size_t)C * sizeof(float));
        memcpy(m->ks + (size_t)n * C, a->qkv + (size_t)n * 3 * C + C, (size_t)C * sizeof(float));
        memcpy(m->vs + (size_t)n * C, a->qkv + (size_t)n * 3 * C + 2 * C, (size_t)C * sizeof(float));
    }
    const dsm_sp_tensor_t t = {m->B, m->T, NH, hs, DSM_SP_BATCH_FIRST, DSM_FLOAT32, 0};
    const dsm_sp_tensor_t t3[3] = {t, t, t};
    const size_t seq_n = (size_t)m->N * C, head_n = (size_t)m->B * m->T * m->Hp * hs;
    const size_t seq3[3] = {seq_n, seq_n, seq_n}, head3[3] = {head_n, head_n, head_n};
    const void *in[3] = {m->qs, m->ks, m->vs};
    void *out[3] = {a->qh, a->kh, a->vh};
    dsm_status_t st = DSM_TIMED(&m->walk.dsm, dsm_sp_seq_to_head_n(m->sp, 3, t3, in, seq3, out, head3));
    if (st != DSM_SUCCESS) return st;
    attention_forward(m->oh, m->Hp * hs, a->att, a->qh, a->kh, a->vh, m->Hp * hs, m->B, m->T, m->Hp, hs);
    return DSM_TIMED(&m->walk.dsm, dsm_sp_head_to_seq(m->sp, &t, m->oh, head_n, a->atty, seq_n));
}

/* Its backward: from datty (the gradient of the output, [N, C]) the
 * gradient of the fused qkv in m->dqkv (overwritten). */
static dsm_status_t attention_block_backward(struct gpt_model *m, struct layer_acts *a, const float *datty) {
    const int C = m->c.channels, NH = m->c.num_heads, hs = C / NH;
    if (m->P == 1) {
        attention_backward(m->dqkv, m->dqkv + C, m->dqkv + 2 * C, 3 * C, datty, C, a->att, a->qkv, a->qkv + C,
                           a->qkv + 2 * C, m->B, m->T, NH, hs);
        return DSM_SUCCESS;
    }
    const dsm_sp_tensor_t t = {m->B, m->T, NH, hs, DSM_SP_BATCH_FIRST, DSM_FLOAT32, 0};
    const dsm_sp_tensor_t t3[3] = {t, t, t};
    const size_t seq_n = (size_t)m->N * C, head_n = (size_t)m->B * m->T * m->Hp * hs;
    const size_t seq3[3] = {seq_n, seq_n, seq_n}, head3[3] = {head_n, head_n, head_n};
    /* the output's gradient goes the way the output came: to head-sharded */
    dsm_status_t st = DSM_TIMED(&m->walk.dsm, dsm_sp_seq_to_head(m->sp, &t, datty, seq_n, m->doh, head_n));
    if (st != DSM_SUCCESS) return st;
    attention_backward(m->dqh, m->dkh, m->dvh, m->Hp * hs, m->doh, m->Hp * hs, a->att, a->qh, a->kh, a->vh,
                       m->B, m->T, m->Hp, hs);
    const void *in[3] = {m->dqh, m->dkh, m->dvh};
    void *out[3] = {m->dqs, m->dks, m->dvs};
    if ((st = DSM_TIMED(&m->walk.dsm, dsm_sp_head_to_seq_n(m->sp, 3, t3, in, head3, out, seq3))) != DSM_SUCCESS) return st;
    for (int n = 0; n < m->N; ++n) { /* and back into the fused layout */
        memcpy(m->dqkv + (size_t)n * 3 * C, m->dqs + (size_t)n * C, (size_t)C * sizeof(float));
        memcpy(m->dqkv + (size_t)n * 3 * C + C, m->dks + (size_t)n * C, (size_t)C * sizeof(float));
        memcpy(m->dqkv + (size_t)n * 3 * C + 2 * C, m->dvs + (size_t)n * C, (size_t)C * sizeof(float));
    }
    return DSM_SUCCESS;
}

/* ------------------------------------------------------------ the operations */

/* The host's operations, in the walk's order. w and g hold fp32 (the
 * engine's own memory at fp32 compute, staged copies otherwise). */
#define F(p) ((const float *)(p))
#define G(p) ((float *)(p))

static dsm_status_t host_encoder_forward(void *ctx, const void *const *w) {
    struct gpt_model *m = ctx;
    encoder_forward(m->encoded, m->tok, m->pos, F(w[gpt_wte()]), F(w[gpt_wpe()]), m->N, m->c.channels);
    return DSM_SUCCESS;
}

static dsm_status_t host_block_forward(void *ctx, int l, const void *const *wall) {
    struct gpt_model *m = ctx;
    const int N = m->N, C = m->c.channels;
    const void *const *w = wall + gpt_layer_param(l, 0);
    struct layer_acts *a = &m->la[l];
    const float *x = l > 0 ? m->la[l - 1].res3 : m->encoded;
    layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, x, F(w[LN1_W]), F(w[LN1_B]), N, C);
    matmul_forward(a->qkv, a->ln1, F(w[QKV_W]), F(w[QKV_B]), N, C, 3 * C);
    dsm_status_t st = attention_block_forward(m, a);
    if (st != DSM_SUCCESS) return st;
    matmul_forward(a->attproj, a->atty, F(w[ATTPROJ_W]), F(w[ATTPROJ_B]), N, C, C);
    residual_forward(a->res2, x, a->attproj, N * C);
    layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, F(w[LN2_W]), F(w[LN2_B]), N, C);
    matmul_forward(a->fch, a->ln2, F(w[FC_W]), F(w[FC_B]), N, C, 4 * C);
    gelu_forward(a->fch_gelu, a->fch, N * 4 * C);
    matmul_forward(a->fcproj, a->fch_gelu, F(w[FCPROJ_W]), F(w[FCPROJ_B]), N, 4 * C, C);
    residual_forward(a->res3, a->res2, a->fcproj, N * C);
    return DSM_SUCCESS;
}

static const float *last_block_output(const struct gpt_model *m) {
    return m->c.num_layers > 0 ? m->la[m->c.num_layers - 1].res3 : m->encoded;
}

static dsm_status_t host_head_forward(void *ctx, const void *const *w) {
    struct gpt_model *m = ctx;
    const GPTConfig *c = &m->c;
    layernorm_forward(m->lnf, m->lnf_mean, m->lnf_rstd, last_block_output(m), F(w[gpt_lnf_w(c)]),
                      F(w[gpt_lnf_b(c)]), m->N, c->channels);
    m->loss_sum = classifier_forward(m->logits, m->lnf, F(w[gpt_wte()]), m->lab, m->N, c->channels,
                                     c->vocab_size, c->padded_vocab_size, &m->count);
    return DSM_SUCCESS;
}

static dsm_status_t host_head_backward(void *ctx, const void *const *w, void *const *g) {
    struct gpt_model *m = ctx;
    const GPTConfig *c = &m->c;
    const int N = m->N, C = c->channels;
    classifier_backward(m->dlnf, G(g[gpt_wte()]), m->logits, m->lnf, F(w[gpt_wte()]), m->lab, m->dloss, N, C,
                        c->vocab_size, c->padded_vocab_size);
    memset(m->dres, 0, (size_t)N * C * sizeof(float));
    layernorm_backward(m->dres, G(g[gpt_lnf_w(c)]), G(g[gpt_lnf_b(c)]), m->dlnf, last_block_output(m),
                       F(w[gpt_lnf_w(c)]), m->lnf_mean, m->lnf_rstd, N, C);
    return DSM_SUCCESS;
}

static dsm_status_t host_block_backward(void *ctx, int l, const void *const *wall, void *const *gall) {
    struct gpt_model *m = ctx;
    const int N = m->N, C = m->c.channels;
    const void *const *w = wall + gpt_layer_param(l, 0);
    void *const *g = gall + gpt_layer_param(l, 0);
    struct layer_acts *a = &m->la[l];
    const float *x = l > 0 ? m->la[l - 1].res3 : m->encoded;
    /* m->dres: the gradient of res3 on entry, of x on exit */
    memset(m->dfch_gelu, 0, (size_t)N * 4 * C * sizeof(float));
    matmul_backward(m->dfch_gelu, G(g[FCPROJ_W]), G(g[FCPROJ_B]), m->dres, a->fch_gelu, F(w[FCPROJ_W]), N, 4 * C, C);
    memset(m->dfch, 0, (size_t)N * 4 * C * sizeof(float));
    gelu_backward(m->dfch, a->fch, m->dfch_gelu, N * 4 * C);
    memset(m->dln, 0, (size_t)N * C * sizeof(float));
    matmul_backward(m->dln, G(g[FC_W]), G(g[FC_B]), m->dfch, a->ln2, F(w[FC_W]), N, C, 4 * C);
    layernorm_backward(m->dres, G(g[LN2_W]), G(g[LN2_B]), m->dln, a->res2, F(w[LN2_W]), a->ln2_mean, a->ln2_rstd,
                       N, C);
    memset(m->datty, 0, (size_t)N * C * sizeof(float));
    matmul_backward(m->datty, G(g[ATTPROJ_W]), G(g[ATTPROJ_B]), m->dres, a->atty, F(w[ATTPROJ_W]), N, C, C);
    dsm_status_t st = attention_block_backward(m, a, m->datty);
    if (st != DSM_SUCCESS) return st;
    memset(m->dln, 0, (size_t)N * C * sizeof(float));
    matmul_backward(m->dln, G(g[QKV_W]), G(g[QKV_B]), m->dqkv, a->ln1, F(w[QKV_W]), N, C, 3 * C);
    layernorm_backward(m->dres, G(g[LN1_W]), G(g[LN1_B]), m->dln, x, F(w[LN1_W]), a->ln1_mean, a->ln1_rstd, N, C);
    return DSM_SUCCESS;
}

static dsm_status_t host_encoder_backward(void *ctx, void *const *g) {
    struct gpt_model *m = ctx;
    encoder_backward(G(g[gpt_wte()]), G(g[gpt_wpe()]), m->dres, m->tok, m->pos, m->N, m->c.channels);
    return DSM_SUCCESS;
}
#undef F
#undef G

static const struct gpt_ops host_ops = {
    host_encoder_forward, host_block_forward, host_head_forward,
    host_head_backward,   host_block_backward, host_encoder_backward,
};

dsm_status_t gpt_model_forward(struct gpt_model *m, double *loss_sum, int64_t *count) {
    dsm_status_t st = gpt_walk_forward(&m->walk);
    *loss_sum = m->loss_sum, *count = m->count;
    return st;
}

dsm_status_t gpt_model_backward(struct gpt_model *m, float dloss) {
    m->dloss = dloss;
    return gpt_walk_backward(&m->walk);
}

/* ------------------------------------------------------------ sampling */

/*
 * n tokens generated after the prompt's bytes, into out (n + 1 bytes): each
 * the model's next-token distribution at the last position of the window
 * (the last T tokens so far) sharpened by the temperature and sampled with
 * the counter-based generator, so that every rank draws the same tokens and
 * makes the same acquires (collective under ZeRO-3). One sequence of the
 * micro-batch's buffers serves (P = 1).
 */
dsm_status_t gpt_generate(struct gpt_model *m, const char *prompt, long n, double temperature, uint64_t seed,
                          char *out) {
    const GPTConfig *c = &m->c;
    const int T = m->T, V = c->vocab_size, Vp = c->padded_vocab_size, B = m->B, N = m->N;
    const size_t plen = strlen(prompt);
    int64_t *seq = malloc((plen + (size_t)n) * sizeof(int64_t));
    double *w = malloc((size_t)V * sizeof(double));
    if (!seq || !w) {
        free(seq), free(w);
        return DSM_ERR_OUT_OF_MEMORY;
    }
    for (size_t i = 0; i < plen; ++i) seq[i] = (unsigned char)prompt[i];
    size_t len = plen;
    dsm_status_t st = DSM_SUCCESS;
    m->B = 1, m->N = T;
    for (long k = 0; k < n && st == DSM_SUCCESS; ++k) {
        const size_t first = len > (size_t)T ? len - (size_t)T : 0, used = len - first;
        for (int t = 0; t < T; ++t) {
            m->tok[t] = (size_t)t < used ? seq[first + (size_t)t] : 0;
            m->pos[t] = t, m->lab[t] = -100;
        }
        double loss;
        int64_t count;
        if ((st = gpt_model_forward(m, &loss, &count)) != DSM_SUCCESS) break;
        /* classifier_forward left the probabilities in m->logits */
        const float *p = m->logits + (used - 1) * (size_t)Vp;
        double total = 0.0;
        for (int j = 0; j < V; ++j) total += (w[j] = pow((double)p[j] + 1e-30, 1.0 / temperature));
        double u = rng_uniform(seed, (uint64_t)k) * total;
        int j = 0;
        while (j < V - 1 && (u -= w[j]) > 0.0) ++j;
        seq[len++] = j;
    }
    m->B = B, m->N = N;
    for (size_t i = plen; i < len; ++i) out[i - plen] = (char)seq[i];
    out[len - plen] = '\0';
    free(seq), free(w);
    return st;
}

/* ------------------------------------------------------------ buffers */

static float *falloc(size_t n, int *ok) {
    float *p = calloc(n ? n : 1, sizeof(float));
    if (!p) *ok = 0;
    return p;
}

/* The all-to-all inputs come from dsm_sp_alloc() (collective), so that ranks
 * of a node read them in place. */
dsm_status_t gpt_model_alloc(struct gpt_model *m, int host_compute, int *ok) {
    const GPTConfig *c = &m->c;
    const size_t N = (size_t)m->N, C = (size_t)c->channels, Vp = (size_t)c->padded_vocab_size;
    const size_t hs = C / (size_t)c->num_heads, heads_n = (size_t)m->B * m->T * m->Hp * hs;
    gpt_walk *k = &m->walk;
    m->tok = calloc(N, sizeof(int64_t)), m->pos = calloc(N, sizeof(int64_t)), m->lab = calloc(N, sizeof(int64_t));
    m->seqs = calloc((size_t)m->B * m->T, sizeof(int64_t)), m->idx = calloc((size_t)m->B, sizeof(int64_t));
    m->la = calloc((size_t)c->num_layers, sizeof *m->la);
    if (!m->tok || !m->pos || !m->lab || !m->seqs || !m->idx || !m->la) {
        *ok = 0;
        return DSM_SUCCESS;
    }
    if (!host_compute) return DSM_SUCCESS; /* the device path has buffers of its own */
    k->ops = &host_ops, k->ctx = m;
    /* The embeddings' gradients collect over the whole backward in buffers of
     * their own; at 16-bit compute every parameter is staged in fp32: one
     * block's worth shared by every block, and the rest. */
    m->dwte = falloc(Vp * C, ok), m->dwpe = falloc((size_t)c->max_seq_len * C, ok);
    k->gstage[gpt_wte()] = m->dwte, k->gstage[gpt_wpe()] = m->dwpe;
    if (k->dtype != DSM_FLOAT32)
        for (int i = 0; i < k->np; ++i) {
            const int layer = i >= 2 && i < gpt_lnf_w(c), kk = (i - 2) % NUM_LAYER_PARAMS;
            if (layer && i >= 2 + NUM_LAYER_PARAMS) {
                k->wstage[i] = k->wstage[2 + kk], k->gstage[i] = k->gstage[2 + kk];
                continue;
            }
            k->wstage[i] = falloc((size_t)gpt_param_numel(c, i), ok);
            if (i >= 2) k->gstage[i] = falloc((size_t)gpt_param_numel(c, i), ok);
        }
    m->encoded = falloc(N * C, ok), m->lnf = falloc(N * C, ok), m->lnf_mean = falloc(N, ok);
    m->lnf_rstd = falloc(N, ok), m->logits = falloc(N * Vp, ok);
    for (int l = 0; l < c->num_layers; ++l) {
        struct layer_acts *a = &m->la[l];
        a->ln1 = falloc(N * C, ok), a->ln1_mean = falloc(N, ok), a->ln1_rstd = falloc(N, ok);
        a->qkv = falloc(N * 3 * C, ok), a->atty = falloc(N * C, ok);
        a->att = falloc((size_t)m->B * m->Hp * m->T * m->T, ok);
        a->attproj = falloc(N * C, ok), a->res2 = falloc(N * C, ok), a->ln2 = falloc(N * C, ok);
        a->ln2_mean = falloc(N, ok), a->ln2_rstd = falloc(N, ok), a->fch = falloc(N * 4 * C, ok);
        a->fch_gelu = falloc(N * 4 * C, ok), a->fcproj = falloc(N * C, ok), a->res3 = falloc(N * C, ok);
        if (m->P > 1) a->qh = falloc(heads_n, ok), a->kh = falloc(heads_n, ok), a->vh = falloc(heads_n, ok);
    }
    m->dres = falloc(N * C, ok), m->dln = falloc(N * C, ok), m->dqkv = falloc(N * 3 * C, ok);
    m->dfch = falloc(N * 4 * C, ok), m->dfch_gelu = falloc(N * 4 * C, ok), m->dlnf = falloc(N * C, ok);
    if (m->P == 1) {
        m->datty = falloc(N * C, ok);
        return DSM_SUCCESS;
    }
    m->doh = falloc(heads_n, ok), m->dqs = falloc(N * C, ok), m->dks = falloc(N * C, ok), m->dvs = falloc(N * C, ok);
    float **shared[] = {&m->qs, &m->ks, &m->vs, &m->datty, &m->oh, &m->dqh, &m->dkh, &m->dvh};
    const size_t sizes[] = {N * C, N * C, N * C, N * C, heads_n, heads_n, heads_n, heads_n};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; ++i) {
        dsm_status_t st = dsm_sp_alloc(m->sp, sizes[i] * sizeof(float), (void **)shared[i]);
        if (st != DSM_SUCCESS) return st; /* on every rank of the group alike */
    }
    return DSM_SUCCESS;
}

void gpt_model_free(struct gpt_model *m) {
    if (m->P > 1 && m->sp) {
        float **shared[] = {&m->qs, &m->ks, &m->vs, &m->datty, &m->oh, &m->dqh, &m->dkh, &m->dvh};
        for (size_t i = 0; i < sizeof shared / sizeof shared[0]; ++i)
            if (*shared[i] && dsm_sp_free_memory(m->sp, (void **)shared[i]) != DSM_SUCCESS)
                fprintf(stderr, "train_gpt: dsm_sp_free_memory: %s\n", dsm_last_error());
    } else {
        free(m->datty);
    }
    gpt_walk *k = &m->walk;
    if (k->ops == &host_ops && k->wstage) /* the staged copies are the model's (a block's are shared) */
        for (int i = 0; i < k->np; ++i)
            if (i < 2 + NUM_LAYER_PARAMS || i >= gpt_lnf_w(&m->c)) {
                free(k->wstage[i]);
                if (i >= 2) free(k->gstage[i]); /* wte's and wpe's are dwte, dwpe */
                k->wstage[i] = NULL, k->gstage[i] = NULL;
            }
    for (int l = 0; m->la && l < m->c.num_layers; ++l) {
        struct layer_acts *a = &m->la[l];
        float *p[] = {a->ln1, a->ln1_mean, a->ln1_rstd, a->qkv, a->atty, a->att, a->attproj, a->res2, a->ln2,
                      a->ln2_mean, a->ln2_rstd, a->fch, a->fch_gelu, a->fcproj, a->res3, a->qh, a->kh, a->vh};
        for (size_t i = 0; i < sizeof p / sizeof p[0]; ++i) free(p[i]);
    }
    float *p[] = {m->dwte, m->dwpe, m->encoded, m->lnf, m->lnf_mean, m->lnf_rstd, m->logits, m->dres, m->dln,
                  m->dqkv, m->dfch, m->dfch_gelu, m->dlnf, m->doh, m->dqs, m->dks, m->dvs};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; ++i) free(p[i]);
    free(m->la);
    free(m->tok), free(m->pos), free(m->lab), free(m->seqs), free(m->idx);
}

/* ------------------------------------------------------------ gradient dump */

/* Write every parameter's gradient (fp32) and the loss to a safetensors file:
 * the comparison with the PyTorch reference (one rank, ZeRO-0/1, where the
 * engine's buffers hold the micro-step's whole gradient). */
dsm_status_t gpt_dump_grads(struct gpt_model *m, const char *path, double loss, char *msg, size_t msg_len) {
    const GPTConfig *c = &m->c;
    size_t hcap = 256 + (size_t)m->walk.np * 160, hlen = 0, off = 4;
    char *header = malloc(hcap);
    if (!header) return DSM_ERR_OUT_OF_MEMORY;
    hlen += (size_t)snprintf(header + hlen, hcap - hlen, "{\"loss\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}");
    for (int i = 0; i < m->walk.np; ++i) {
        char name[64];
        int nd;
        int64_t shape[2];
        gpt_param_info(c, i, name, sizeof name, &nd, shape);
        const size_t bytes = (size_t)gpt_param_numel(c, i) * 4;
        if (nd == 1)
            hlen += (size_t)snprintf(header + hlen, hcap - hlen, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[%lld],"
                                     "\"data_offsets\":[%zu,%zu]}", name, (long long)shape[0], off, off + bytes);
        else
            hlen += (size_t)snprintf(header + hlen, hcap - hlen, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[%lld,%lld],"
                                     "\"data_offsets\":[%zu,%zu]}", name, (long long)shape[0], (long long)shape[1],
                                     off, off + bytes);
        off += bytes;
    }
    hlen += (size_t)snprintf(header + hlen, hcap - hlen, "}");
    while (hlen % 8) header[hlen++] = ' ';
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(header);
        snprintf(msg, msg_len, "cannot write %s", path);
        return DSM_ERR_IO;
    }
    const uint64_t len = hlen;
    const float l32 = (float)loss;
    fwrite(&len, 8, 1, f), fwrite(header, 1, hlen, f), fwrite(&l32, 4, 1, f);
    free(header);
    dsm_status_t st = DSM_SUCCESS;
    for (int i = 0; i < m->walk.np && st == DSM_SUCCESS; ++i) {
        const size_t n = (size_t)gpt_param_numel(c, i);
        float *tmp = malloc(n * sizeof(float));
        void *buf;
        if (!tmp) st = DSM_ERR_OUT_OF_MEMORY;
        if (st == DSM_SUCCESS && (st = dsm_engine_grad_acquire(m->walk.engine, i, &buf)) == DSM_SUCCESS) {
            st = dsm_convert(buf, m->walk.dtype, tmp, DSM_FLOAT32, n);
            dsm_status_t st2 = dsm_engine_grad_release(m->walk.engine, i);
            if (st == DSM_SUCCESS) st = st2;
        }
        if (st == DSM_SUCCESS && fwrite(tmp, sizeof(float), n, f) != n) {
            snprintf(msg, msg_len, "cannot write %s", path);
            st = DSM_ERR_IO;
        }
        free(tmp);
    }
    if (fclose(f) != 0 && st == DSM_SUCCESS) st = DSM_ERR_IO;
    return st;
}

