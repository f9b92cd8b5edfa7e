/*
 * ulysses_attention: DeepSpeed-Ulysses sequence parallelism with libdsm.
 *
 *   mpiexec -n 4 ./ulysses_attention [--sp P] [--heads H] [--kv-heads K] [--head-dim d]
 *       [--seq S] [--batch B] [--steps N] [--stage 0..3] [--optimizer adam|adamw]
 *       [--lr LR] [--vocab V] [--samples N] [--dump FILE]
 *
 * The ranks form a data_parallel x sequence_parallel mesh (P = --sp, default
 * all ranks). Each rank of a sequence-parallel (SP) group holds S/P
 * consecutive tokens of every sequence. Attention needs every token, so
 * around it one all-to-all turns "my tokens, all heads" into "all tokens, my
 * heads" (dsm_sp_seq_to_head) and another turns it back
 * (dsm_sp_head_to_seq); every other layer works token by token and needs no
 * communication at all.
 *
 * Part A (always): a check. Multi-head causal self-attention, forward and
 * backward, computed sequence-parallel and, on every rank, again on one rank
 * for the whole sequence; the outputs and gradients must agree to fp32
 * rounding. --heads 7 on 4 ranks splits the heads unevenly (2, 2, 2, 1);
 * --kv-heads K < H is grouped-query attention, whose K key/value heads are
 * replicated (DSM_SP_REPLICATE) when there are fewer of them than ranks.
 *
 * Part B (--steps N > 0, default 20): a tiny causal language model trained
 * with the engine (ZeRO --stage, default 2; fp32; AdamW or Adam): token and
 * position embeddings, that attention with a residual, a GELU MLP with a
 * residual, and a projection to the V-token vocabulary, on synthetic
 * sequences. The global batch B (default 8) is the same on any mesh, so the
 * parameters after N steps on any DP x SP mesh equal those of one rank up to
 * fp32 rounding; --dump FILE writes them, one value per line, to compare.
 *
 * The layers (nn.Linear, the sequence-parallel attention) are in
 * ulysses_block.c.
 *
 * Exit status: 0 on success, 1 on an error or a failed check (every rank
 * reports errors: libdsm fails collective calls on every rank together).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "counter_rng.h"
#include "dsm.h"
#include "ulysses_block.h"

/* ------------------------------------------------------------ utilities */

/* The examples' counter-based generator (examples/common): the value
 * depends only on (stream, i), so every rank computes the same data and
 * weights alone. */
static void fill_uniform(float *x, size_t n, uint64_t stream, double bound) {
    for (size_t k = 0; k < n; ++k) x[k] = (float)(bound * (2.0 * rng_uniform(stream, k) - 1.0));
}

/* The example's own error message, for errors libdsm did not report. */
static char message[256];

/* ----------------------------------------------------------- options */

struct options {
    int sp, heads, kv_heads, head_dim, seq, batch, steps, stage, vocab, samples;
    const char *optimizer, *dump;
    double lr;
};

static int parse(int argc, char **argv, struct options *o) {
    for (int a = 1; a < argc; ++a) {
        struct { const char *name; int *value; } ints[] = {
            {"--sp", &o->sp}, {"--heads", &o->heads}, {"--kv-heads", &o->kv_heads},
            {"--head-dim", &o->head_dim}, {"--seq", &o->seq}, {"--batch", &o->batch},
            {"--steps", &o->steps}, {"--stage", &o->stage}, {"--vocab", &o->vocab},
            {"--samples", &o->samples}};
        int found = 0;
        for (size_t i = 0; i < sizeof ints / sizeof ints[0] && !found; ++i)
            if (strcmp(argv[a], ints[i].name) == 0 && a + 1 < argc) {
                char *end;
                const long v = strtol(argv[++a], &end, 10);
                if (*end != '\0' || v < 0 || v > 100000) return 0;
                *ints[i].value = (int)v, found = 1;
            }
        if (found) continue;
        if (strcmp(argv[a], "--optimizer") == 0 && a + 1 < argc) o->optimizer = argv[++a];
        else if (strcmp(argv[a], "--dump") == 0 && a + 1 < argc) o->dump = argv[++a];
        else if (strcmp(argv[a], "--lr") == 0 && a + 1 < argc) o->lr = atof(argv[++a]);
        else return 0;
    }
    if (o->kv_heads == 0) o->kv_heads = o->heads;
    return o->sp >= 1 && o->heads >= 1 && o->kv_heads >= 1 && o->heads % o->kv_heads == 0 &&
           o->head_dim >= 1 && o->seq >= 2 && o->batch >= 1 && o->stage <= 3 && o->vocab >= 2 &&
           o->samples >= 1 && o->lr > 0 &&
           (strcmp(o->optimizer, "adam") == 0 || strcmp(o->optimizer, "adamw") == 0);
}

/* On failure: print the status and the message (libdsm's, else the
 * example's own), then clean up. libdsm fails collective calls on every rank
 * together, and the example's own checks give the same answer everywhere. */
#define CHECK(call)                                                                            \
    do {                                                                                       \
        const dsm_status_t st_ = (call);                                                       \
        if (st_ != DSM_SUCCESS) {                                                              \
            fprintf(stderr, "rank %d: %s: %s\n", rank, dsm_status_string(st_),                 \
                    dsm_last_error()[0] ? dsm_last_error() : message);                 \
            goto done;                                                                         \
        }                                                                                      \
    } while (0)

/* Agree on a local outcome (an allocation) before the next collective call,
 * so that a rank that fails alone does not leave the others waiting. */
#define AGREE(ok)                                                                              \
    do {                                                                                       \
        int ok_ = (ok), all_;                                                                  \
        MPI_Allreduce(&ok_, &all_, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);                       \
        if (!all_) {                                                                           \
            snprintf(message, sizeof message, "%s", ok_ ? "another rank failed" : "out of memory"); \
            CHECK(DSM_ERR_OUT_OF_MEMORY);                                                      \
        }                                                                                      \
    } while (0)

/* max |a - b| (infinite when a value is not finite), and the largest |b| into *scale. */
static double max_abs_diff(const float *a, const float *b, size_t n, double *scale) {
    double m = 0.0;
    for (size_t i = 0; i < n; ++i) {
        const double e = fabs((double)a[i] - b[i]);
        m = isfinite(e) ? fmax(m, e) : INFINITY;
        *scale = fmax(*scale, fabs((double)b[i]));
    }
    return m;
}

/* ---------------------------------------------------------------- part A */

/*
 * The tolerance of the check, relative to the largest reference value of
 * each tensor. Both computations do the same fp32 operations in the same
 * order for every element of the output and of dx: a token's projections
 * and its attention row do not depend on where the other tokens live. Only
 * sums over tokens are re-associated: the weight gradients (a partial sum
 * per rank, then MPI_Allreduce) and, with replicated key/value heads, the
 * sum of the copies' gradients. Re-associating a sum of n fp32 terms moves
 * it by about sqrt(n) * 2^-24 of its terms' size in practice (n * 2^-24 at
 * worst): around 1e-6 for the few dozen terms here. A token or a head in the
 * wrong place gives errors of order 1. 1e-5 separates the two.
 */
#define PART_A_TOLERANCE 1e-5

static int part_a(const struct options *o, dsm_sp_t sp, MPI_Comm sp_comm, int rank) {
    int P, r, ok = 0;
    struct attn ref, par;
    memset(&ref, 0, sizeof ref), memset(&par, 0, sizeof par);
    float *all = NULL;
    CHECK(dsm_sp_size(sp, &P));
    CHECK(dsm_sp_rank(sp, &r));
    const int H = o->heads, Hkv = o->kv_heads, d = o->head_dim, D = H * d, Dkv = Hkv * d;
    const int64_t b = 2, s = (o->seq + P - 1) / P * P, n = s / P; /* s: a multiple of P */
    const size_t full = (size_t)(b * s * D), loc = (size_t)(b * n * D);
    const size_t wsz[4] = {(size_t)(D * D), (size_t)(Dkv * D), (size_t)(Dkv * D), (size_t)(D * D)};
    const size_t nw = wsz[0] + wsz[1] + wsz[2] + wsz[3];

    /* One block: x, dy, the reference's y and dx, the weights, both sets of
     * weight gradients, and this rank's chunks of x, dy, y and dx. */
    all = calloc(4 * full + 3 * nw + 4 * loc, sizeof(float));
    const dsm_status_t st_ref =
        all ? attn_init(&ref, NULL, b, s, H, Hkv, d, message, sizeof message) : DSM_ERR_OUT_OF_MEMORY;
    const dsm_status_t st_par =
        all ? attn_init(&par, sp, b, s, H, Hkv, d, message, sizeof message) : DSM_ERR_OUT_OF_MEMORY;
    if (st_par == DSM_ERR_INVALID_ARGUMENT) CHECK(st_par); /* the heads: the same on every rank */
    AGREE(st_ref == DSM_SUCCESS && st_par == DSM_SUCCESS);
    float *x = all, *dy = x + full, *y_ref = dy + full, *dx_ref = y_ref + full, *w = dx_ref + full;
    float *dw_ref = w + nw, *dw = dw_ref + nw, *xl = dw + nw, *dyl = xl + loc, *yl = dyl + loc,
          *dxl = yl + loc;
    const float *wq = w, *wk = wq + wsz[0], *wv = wk + wsz[1], *wo = wv + wsz[2];
    float *dr[4] = {dw_ref, dw_ref + wsz[0], dw_ref + wsz[0] + wsz[1], dw_ref + nw - wsz[3]};
    float *dp[4] = {dw, dw + wsz[0], dw + wsz[0] + wsz[1], dw + nw - wsz[3]};
    fill_uniform(x, full, 11, 1.0);
    fill_uniform(dy, full, 12, 1.0); /* the gradient of some loss with respect to y */
    fill_uniform(w, nw, 13, 1.0 / sqrt((double)D));

    /* The reference: one rank, the whole sequence, every head. */
    CHECK(attn_forward(&ref, x, wq, wk, wv, wo, y_ref));
    CHECK(attn_backward(&ref, wq, wk, wv, wo, dy, dx_ref, dr[0], dr[1], dr[2], dr[3]));

    /* Sequence-parallel: this rank's tokens [r n, (r + 1) n) of each sequence. */
    for (int64_t bi = 0; bi < b; ++bi) {
        memcpy(xl + bi * n * D, x + (bi * s + r * n) * D, (size_t)(n * D) * sizeof(float));
        memcpy(dyl + bi * n * D, dy + (bi * s + r * n) * D, (size_t)(n * D) * sizeof(float));
    }
    CHECK(attn_forward(&par, xl, wq, wk, wv, wo, yl));
    CHECK(attn_backward(&par, wq, wk, wv, wo, dyl, dxl, dp[0], dp[1], dp[2], dp[3]));
    /* Each rank's weight gradients cover its own tokens: the whole is the sum over the group. */
    MPI_Allreduce(MPI_IN_PLACE, dw, (int)nw, MPI_FLOAT, MPI_SUM, sp_comm);

    /* Compare: output, dx (this rank's tokens), then dWq, dWk, dWv, dWo. */
    double diff[6] = {0}, scale[6] = {0};
    for (int64_t bi = 0; bi < b; ++bi) {
        const size_t g = (size_t)((bi * s + r * n) * D), l = (size_t)(bi * n * D);
        diff[0] = fmax(diff[0], max_abs_diff(yl + l, y_ref + g, (size_t)(n * D), &scale[0]));
        diff[1] = fmax(diff[1], max_abs_diff(dxl + l, dx_ref + g, (size_t)(n * D), &scale[1]));
    }
    for (int i = 0; i < 4; ++i) diff[2 + i] = max_abs_diff(dp[i], dr[i], wsz[i], &scale[2 + i]);
    MPI_Allreduce(MPI_IN_PLACE, diff, 6, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, scale, 6, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    static const char *what[6] = {"y", "dx", "dWq", "dWk", "dWv", "dWo"};
    double worst = 0.0;
    for (int i = 0; i < 6; ++i) worst = fmax(worst, diff[i] / scale[i]);
    if (rank == 0) {
        printf("part A: causal attention on %lld x %lld tokens, %d heads, %d key/value heads%s, "
               "head dim %d, %d sequence-parallel ranks (%lld tokens and %lld..%lld heads each)\n",
               (long long)b, (long long)s, H, Hkv, Hkv < H && Hkv < P ? " (replicated)" : "", d, P,
               (long long)n, (long long)(H / P), (long long)((H + P - 1) / P));
        printf("part A: max |sequence parallel - single rank|:");
        for (int i = 0; i < 6; ++i) printf(" %s %.3g", what[i], diff[i]);
        printf("; relative %.3g (tolerance %g)\n", worst, PART_A_TOLERANCE);
    }
    ok = worst <= PART_A_TOLERANCE; /* the same on every rank: allreduced */
    if (!ok && rank == 0) fprintf(stderr, "part A: FAILED: the results differ beyond fp32 rounding\n");
done:
    attn_free(&ref), attn_free(&par), free(all);
    return ok;
}

/* ---------------------------------------------------------------- part B */

/* The parameters, in the order given to the engine (names as in PyTorch). */
enum { TOK, POS, WQ, WK, WV, WO, FC1, FC1B, FC2, FC2B, HEAD, NPARAMS };
static const char *const param_names[NPARAMS] = {
    "tok_emb.weight", "pos_emb.weight", "attn.q_proj.weight", "attn.k_proj.weight",
    "attn.v_proj.weight", "attn.o_proj.weight", "mlp.fc1.weight", "mlp.fc1.bias",
    "mlp.fc2.weight", "mlp.fc2.bias", "lm_head.weight"};

/* init_fn: uniform in [-bound, bound] from a hash of the element index, so
 * that under ZeRO-3 each rank fills only its part; user_data is the bound. */
static int init_param(void *user_data, int index, const char *name, int64_t offset, int64_t count,
                      float *values) {
    (void)name;
    const double bound = *(const double *)user_data;
    for (int64_t k = 0; k < count; ++k)
        values[k] = (float)(bound * (2.0 * rng_uniform(100 + (uint64_t)index, (uint64_t)(offset + k)) - 1.0));
    return 0;
}

/* Sample i: an arithmetic sequence modulo V with a step of 1, 2 or 3. The
 * second token tells the step, so from then on every token is predictable:
 * the loss can fall from about ln V to ln 3 / (seq - 1). */
static void make_sequence(int64_t i, int seq, int V, int64_t *tok) {
    const int64_t start = (int64_t)(rng_mix64(2 * (uint64_t)i) % (uint64_t)V);
    const int64_t step = 1 + (int64_t)(rng_mix64(2 * (uint64_t)i + 1) % 3);
    for (int t = 0; t < seq; ++t) tok[t] = (start + step * t) % V;
}

/* GELU (tanh form) and its derivative. */
static float gelu(float u, float *deriv) {
    const float c = 0.7978845608f, t = tanhf(c * (u + 0.044715f * u * u * u));
    *deriv = 0.5f * (1.0f + t) + 0.5f * u * (1.0f - t * t) * c * (1.0f + 3.0f * 0.044715f * u * u);
    return 0.5f * u * (1.0f + t);
}

/* What one micro-step needs; activations are [b * n, width] for this rank's n tokens per sequence. */
struct model {
    int V, S, D, Dkv, F; /* vocabulary, positions, width, key/value width, MLP width */
    int64_t numel[NPARAMS];
    float *w[NPARAMS], *g[NPARAMS]; /* fp32 copies of the parameters, and their gradients */
    struct attn at;
    int64_t *idx, *seqs;             /* the micro-batch: sample indices, tokens [b, S] */
    int64_t *tok, *pos, *lab;        /* this rank's chunk [b, n] */
    float *e, *h1, *u, *du, *gl, *h2, *logits, *dh2, *dh1, *de, *tmp;
};

/*
 * The forward and backward pass of one micro-batch of b sequences; this
 * rank's chunk of n tokens of each is in m->tok, pos and lab, and valid of
 * its labels count. The gradients of the SP group's mean loss, times the loss
 * scale, are added to the engine's buffers. Collective over the engine's ranks.
 */
static dsm_status_t micro_step(dsm_engine_t engine, dsm_sp_t sp, struct model *m, int64_t b,
                               int64_t n, int64_t valid, double *mean) {
    const int V = m->V, D = m->D, F = m->F;
    const int64_t L = b * n; /* this rank's tokens */
    dsm_status_t st;
    /* The model is tiny: keep an fp32 copy of each parameter for the whole
     * micro-step. Under ZeRO-3 the acquire gathers it (every rank, same order);
     * a large model would release it after forward and acquire it again in
     * backward, as train_mlp.c does. */
    for (int p = 0; p < NPARAMS; ++p) {
        const void *values;
        if ((st = dsm_engine_param_acquire(engine, p, &values))) return st;
        memcpy(m->w[p], values, (size_t)m->numel[p] * sizeof(float));
        if ((st = dsm_engine_param_release(engine, p))) return st;
        memset(m->g[p], 0, (size_t)m->numel[p] * sizeof(float));
    }

    /* Forward. Padding positions past the sequence (when P does not divide
     * it) reuse the last position's row: they come after every real token,
     * so causal attention keeps them out of every real token's output, and
     * their labels are ignored, so they add exactly 0 to every gradient. */
    for (int64_t i = 0; i < L; ++i) {
        const int64_t p = m->pos[i] < m->S ? m->pos[i] : m->S - 1;
        for (int k = 0; k < D; ++k) m->e[i * D + k] = m->w[TOK][m->tok[i] * D + k] + m->w[POS][p * D + k];
    }
    attn_set_batch(&m->at, b);
    if ((st = attn_forward(&m->at, m->e, m->w[WQ], m->w[WK], m->w[WV], m->w[WO], m->h1))) return st;
    for (int64_t k = 0; k < L * D; ++k) m->h1[k] += m->e[k]; /* residual */
    linear(L, D, F, m->h1, m->w[FC1], m->w[FC1B], m->u);
    for (int64_t k = 0; k < L * F; ++k) m->gl[k] = gelu(m->u[k], &m->du[k]);
    linear(L, F, D, m->gl, m->w[FC2], m->w[FC2B], m->h2);
    for (int64_t k = 0; k < L * D; ++k) m->h2[k] += m->h1[k]; /* residual */
    linear(L, D, V, m->h2, m->w[HEAD], NULL, m->logits);

    /* Cross-entropy of the shifted labels; the logits become probabilities. */
    double loss_sum = 0.0, grad_scale, loss_scale;
    int64_t counted = 0;
    for (int64_t i = 0; i < L; ++i) {
        float *z = m->logits + i * V, mx = z[0], sum = 0.0f;
        for (int c = 1; c < V; ++c) mx = fmaxf(mx, z[c]);
        for (int c = 0; c < V; ++c) sum += (z[c] = expf(z[c] - mx));
        for (int c = 0; c < V; ++c) z[c] /= sum;
        if (m->lab[i] != DSM_IGNORE_INDEX) loss_sum -= log((double)z[m->lab[i]]), ++counted;
    }
    if (counted != valid) { /* dsm_sp_shard_batch() counted them too */
        snprintf(message, sizeof message, "%lld labels count, dsm_sp_shard_batch said %lld",
                 (long long)counted, (long long)valid);
        return DSM_ERR_INTERNAL;
    }
    /* The mean over the group's tokens, and 1 / their count: the scale that
     * turns the gradient of this rank's loss sum into its share of the
     * gradient of the whole sequences' mean loss. */
    if ((st = dsm_sp_loss(sp, loss_sum, valid, mean, &grad_scale)) ||
        (st = dsm_engine_loss_scale(engine, &loss_scale)))
        return st;

    /* Backward. d loss / d logits = p - onehot(label), for counted tokens only. */
    const float c = (float)(grad_scale * loss_scale);
    for (int64_t i = 0; i < L; ++i) {
        float *z = m->logits + i * V;
        if (m->lab[i] == DSM_IGNORE_INDEX) { memset(z, 0, (size_t)V * sizeof(float)); continue; }
        z[m->lab[i]] -= 1.0f;
        for (int k = 0; k < V; ++k) z[k] *= c;
    }
    linear_dw(L, D, V, m->h2, m->logits, m->g[HEAD], NULL);
    linear_dx(L, D, V, m->logits, m->w[HEAD], m->dh2, 0);
    linear_dw(L, F, D, m->gl, m->dh2, m->g[FC2], m->g[FC2B]); /* MLP */
    linear_dx(L, F, D, m->dh2, m->w[FC2], m->tmp, 0);
    for (int64_t k = 0; k < L * F; ++k) m->du[k] *= m->tmp[k];
    linear_dw(L, D, F, m->h1, m->du, m->g[FC1], m->g[FC1B]);
    memcpy(m->dh1, m->dh2, (size_t)(L * D) * sizeof(float)); /* residual */
    linear_dx(L, D, F, m->du, m->w[FC1], m->dh1, 1);
    if ((st = attn_backward(&m->at, m->w[WQ], m->w[WK], m->w[WV], m->w[WO], m->dh1, m->de,
                            m->g[WQ], m->g[WK], m->g[WV], m->g[WO])))
        return st;
    for (int64_t i = 0; i < L; ++i) { /* residual, then the embedding rows */
        const int64_t p = m->pos[i] < m->S ? m->pos[i] : m->S - 1;
        for (int k = 0; k < D; ++k) {
            const float g = m->de[i * D + k] + m->dh1[i * D + k];
            m->g[TOK][m->tok[i] * D + k] += g;
            m->g[POS][p * D + k] += g;
        }
    }
    /* Hand the gradients to the engine: it sums them over the SP group and
     * averages them over the DP replicas (under ZeRO-2/3 a release may reduce a
     * bucket: every rank releases the same gradients in the same order). */
    for (int p = 0; p < NPARAMS; ++p) {
        void *buf;
        if ((st = dsm_engine_grad_acquire(engine, p, &buf))) return st;
        float *acc = buf;
        for (int64_t k = 0; k < m->numel[p]; ++k) acc[k] += m->g[p][k];
        if ((st = dsm_engine_grad_release(engine, p))) return st;
    }
    return DSM_SUCCESS;
}

static void model_free(struct model *m) {
    for (int p = 0; p < NPARAMS; ++p) free(m->w[p]), free(m->g[p]);
    float *f[] = {m->e, m->h1, m->u, m->du, m->gl, m->h2, m->logits, m->dh2, m->dh1, m->de, m->tmp};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; ++i) free(f[i]);
    free(m->idx), free(m->seqs), free(m->tok), free(m->pos), free(m->lab);
    attn_free(&m->at);
}

/* Rank 0 writes every parameter, one value per line; under ZeRO-3 the
 * acquire is a gather, so every rank takes part. */
static dsm_status_t dump_params(dsm_engine_t engine, const char *path, const struct model *m, int rank) {
    FILE *f = rank == 0 ? fopen(path, "w") : NULL;
    int ok = rank != 0 || f != NULL;
    dsm_status_t st = DSM_SUCCESS;
    MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
    for (int p = 0; ok && p < NPARAMS && st == DSM_SUCCESS; ++p) {
        const void *values;
        if ((st = dsm_engine_param_acquire(engine, p, &values))) break;
        for (int64_t k = 0; f && k < m->numel[p]; ++k) fprintf(f, "%.9g\n", ((const float *)values)[k]);
        st = dsm_engine_param_release(engine, p);
    }
    if (f && fclose(f) != 0) ok = 0;
    MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (st == DSM_SUCCESS && !ok) {
        snprintf(message, sizeof message, "cannot write %s", path);
        st = DSM_ERR_IO;
    }
    return st;
}

static int part_b(const struct options *o, dsm_mesh_t mesh, dsm_sp_t sp, int rank) {
    int ok = 0, dp, P, r;
    dsm_engine_t engine = NULL;
    dsm_sampler_t sampler = NULL;
    struct model m;
    memset(&m, 0, sizeof m);
    CHECK(dsm_mesh_size(mesh, "data_parallel", &dp));
    CHECK(dsm_sp_size(sp, &P));
    CHECK(dsm_sp_rank(sp, &r));
    if (o->batch % dp != 0) {
        snprintf(message, sizeof message, "--batch %d is not a multiple of the %d data-parallel ranks",
                 o->batch, dp);
        CHECK(DSM_ERR_INVALID_ARGUMENT);
    }
    /* The global batch is the same on any mesh: each DP replica takes 1/dp of it. */
    const int64_t mb = o->batch / dp, chunk = (o->seq + P - 1) / P;
    m.V = o->vocab, m.S = o->seq, m.D = o->heads * o->head_dim, m.Dkv = o->kv_heads * o->head_dim;
    m.F = 4 * m.D;

    /* The model's parameters: embeddings uniform in +-1, weights in
     * +-1/sqrt(fan_in) (nn.Linear's default), biases zero and not decayed. */
    int64_t shapes[NPARAMS][2] = {{m.V, m.D}, {m.S, m.D}, {m.D, m.D}, {m.Dkv, m.D}, {m.Dkv, m.D},
                                  {m.D, m.D}, {m.F, m.D}, {m.F, 0},   {m.D, m.F},   {m.D, 0},
                                  {m.V, m.D}};
    double bounds[NPARAMS];
    dsm_param_desc_t params[NPARAMS];
    memset(params, 0, sizeof params);
    for (int p = 0; p < NPARAMS; ++p) {
        const int bias = p == FC1B || p == FC2B;
        bounds[p] = p == TOK || p == POS ? 1.0 : 1.0 / sqrt((double)shapes[p][1]);
        params[p].name = param_names[p];
        params[p].ndims = bias ? 1 : 2;
        params[p].shape = shapes[p];
        params[p].dtype = DSM_FLOAT32;
        params[p].trainable = 1;
        params[p].no_weight_decay = bias;
        params[p].init_fn = bias ? NULL : init_param; /* NULL and no values: zeros */
        params[p].init_user_data = &bounds[p];
        m.numel[p] = shapes[p][0] * (bias ? 1 : shapes[p][1]);
    }

    /* The configuration, inline. Adam with adam_w_mode false is Adam with L2
     * weight decay (true, DeepSpeed's default, would make it AdamW).
     * stage3_param_persistence_threshold 0
     * partitions even these small parameters under ZeRO-3, and a small
     * reduce_bucket_size makes ZeRO-2/3 reduce in several buckets. */
    const int adam = strcmp(o->optimizer, "adam") == 0;
    char config[1024];
    snprintf(config, sizeof config,
             "{\"train_batch_size\": %d, \"train_micro_batch_size_per_gpu\": %lld,"
             " \"gradient_accumulation_steps\": 1, \"sequence_parallel_size\": %d,"
             " \"gradient_clipping\": 1.0,"
             " \"optimizer\": {\"type\": \"%s\", \"params\": {\"lr\": %g, \"betas\": [0.9, 0.999],"
             " \"eps\": 1e-8, \"weight_decay\": 0.01, \"adam_w_mode\": %s}},"
             " \"zero_optimization\": {\"stage\": %d, \"reduce_bucket_size\": 2000,"
             " \"stage3_param_persistence_threshold\": 0}}",
             o->batch, (long long)mb, P, adam ? "Adam" : "AdamW", o->lr, adam ? "false" : "true",
             o->stage);
    /* The attention runs on the CPU: a host engine, GPUs or not. */
    dsm_engine_options_t options = DSM_ENGINE_OPTIONS_INITIALIZER;
    options.device = DSM_DEVICE_HOST;
    CHECK(dsm_engine_init_with_options(mesh, config, params, NPARAMS, &options, &engine));
    dsm_dtype_t dtype;
    CHECK(dsm_engine_dtype(engine, &dtype));
    if (dtype != DSM_FLOAT32) { /* the configuration asks for fp32 */
        snprintf(message, sizeof message, "the engine computes in %s, not float32", dsm_dtype_name(dtype));
        CHECK(DSM_ERR_INTERNAL);
    }

    /* The data: every DP replica's sampler takes its share of one shuffled
     * order (the same seed on every rank); the ranks of an SP group get the
     * same sequences and each keeps its chunk. */
    dsm_sampler_options_t sopt = DSM_SAMPLER_OPTIONS_INITIALIZER;
    sopt.seed = 2024;
    CHECK(dsm_sampler_create_for_engine(engine, o->samples, &sopt, &sampler));

    int alloc_ok = 1;
    for (int p = 0; p < NPARAMS; ++p)
        alloc_ok &= (m.w[p] = malloc((size_t)m.numel[p] * sizeof(float))) != NULL &&
                    (m.g[p] = malloc((size_t)m.numel[p] * sizeof(float))) != NULL;
    const size_t L = (size_t)(mb * chunk), widest = (size_t)(m.F > m.V ? m.F : m.V);
    float **acts[] = {&m.e, &m.h1, &m.u, &m.du, &m.gl, &m.h2, &m.logits, &m.dh2, &m.dh1, &m.de, &m.tmp};
    for (size_t i = 0; i < sizeof acts / sizeof acts[0]; ++i)
        alloc_ok &= (*acts[i] = malloc(L * widest * sizeof(float))) != NULL;
    alloc_ok &= (m.idx = malloc((size_t)mb * sizeof(int64_t))) != NULL;
    alloc_ok &= (m.seqs = malloc((size_t)(mb * o->seq) * sizeof(int64_t))) && (m.tok = malloc(L * sizeof(int64_t))) &&
                (m.pos = malloc(L * sizeof(int64_t))) && (m.lab = malloc(L * sizeof(int64_t)));
    alloc_ok &= attn_init(&m.at, sp, mb, chunk * P, o->heads, o->kv_heads, o->head_dim, message, sizeof message) ==
                DSM_SUCCESS;
    AGREE(alloc_ok);
    if (rank == 0)
        printf("part B: %d data-parallel x %d sequence-parallel ranks, ZeRO-%d, %s lr %g; global batch "
               "%d = %lld per replica; %d tokens per sequence, %lld per rank\n",
               dp, P, o->stage, o->optimizer, o->lr, o->batch, (long long)mb, o->seq, (long long)chunk);

    double first = 0.0, last = 0.0;
    const int print_every = o->steps >= 10 ? o->steps / 10 : 1;
    for (int step = 0; step < o->steps; ++step) {
        /* Where the sampler is: the engine's micro-step counter. */
        dsm_step_info_t info = DSM_STEP_INFO_INITIALIZER;
        int64_t epoch, batch, count, valid, got_chunk;
        CHECK(dsm_engine_step_info(engine, &info));
        CHECK(dsm_sampler_locate(sampler, info.micro_steps, &epoch, &batch));
        CHECK(dsm_sampler_batch(sampler, epoch, batch, m.idx, (size_t)mb, &count));
        for (int64_t i = 0; i < count; ++i) make_sequence(m.idx[i], o->seq, m.V, m.seqs + i * o->seq);
        /* This rank's chunk: tokens, positions, labels shifted by one. */
        CHECK(dsm_sp_shard_batch(P, r, count, o->seq, m.seqs, NULL, NULL, 0, L,
                                 m.tok, m.pos, m.lab, &got_chunk, &valid));
        double mean;
        CHECK(micro_step(engine, sp, &m, count, got_chunk, valid, &mean));
        CHECK(dsm_step(engine, &info));
        /* The loss of the global batch: the mean over the DP replicas. The
         * ranks of a sequence-parallel group hold the same group mean, so
         * each group's is counted once (weight 1 on its first rank). */
        CHECK(dsm_engine_mean_loss(engine, mean, r == 0 ? 1.0 : 0.0, &mean));
        if (step == 0) first = mean;
        last = mean;
        if (rank == 0 && (step == 0 || (step + 1) % print_every == 0 || step == o->steps - 1))
            printf("step %4lld  loss %.6f  grad_norm %.6f\n", (long long)info.global_steps, mean,
                   info.grad_norm);
    }
    if (rank == 0) printf("part B: final loss %.6f (initial %.6f)\n", last, first);
    if (o->dump) {
        CHECK(dump_params(engine, o->dump, &m, rank));
        if (rank == 0) printf("part B: parameters written to %s\n", o->dump);
    }
    ok = 1;
done:
    if (dsm_engine_free(&engine) != DSM_SUCCESS) ok = 0;
    dsm_sampler_free(&sampler);
    model_free(&m);
    return ok;
}

/* ------------------------------------------------------------------ main */

int main(int argc, char **argv) {
    int provided, rank = 0, world = 1, exit_code = 1;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    struct options o = {world, 4, 0, 8, 16, 8, 20, 2, 16, 256, "adamw", NULL, 1e-2};
    if (!parse(argc, argv, &o)) { /* the same arguments everywhere: every rank stops */
        if (rank == 0)
            fprintf(stderr, "usage: %s [--sp P] [--heads H] [--kv-heads K] [--head-dim d] [--seq S] "
                            "[--batch B] [--steps N] [--stage 0..3] [--optimizer adam|adamw] [--lr LR] "
                            "[--vocab V] [--samples N] [--dump FILE]\n", argv[0]);
        MPI_Finalize();
        return 1;
    }
    dsm_mesh_t mesh = NULL;
    dsm_sp_t sp = NULL;
    MPI_Comm sp_comm;
    /* (data_parallel, sequence_parallel): consecutive mesh positions form an SP group. */
    CHECK(dsm_mesh_create_dp_sp(MPI_COMM_WORLD, -1, o.sp, &mesh));
    CHECK(dsm_sp_create(mesh, NULL, &sp));
    CHECK(dsm_mesh_comm(mesh, "sequence_parallel", &sp_comm));
    if (part_a(&o, sp, sp_comm, rank) && (o.steps == 0 || part_b(&o, mesh, sp, rank))) exit_code = 0;
done:
    dsm_sp_free(&sp);
    dsm_mesh_free(&mesh);
    fflush(stdout);
    MPI_Finalize();
    return exit_code;
}
