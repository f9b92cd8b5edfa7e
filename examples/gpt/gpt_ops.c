/*
 * gpt_ops.c: the operations of the GPT-2 model (gpt.h), each forward with its
 * backward right under it, on the host: OpenMP for the element-wise loops,
 * CBLAS sgemm for every matrix product (attention's too).
 */
#include "gpt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

/* ------------------------------------------------------------ parameters */

const char *const gpt_layer_param_names[NUM_LAYER_PARAMS] = {
    "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
    "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
    "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"};

void gpt_param_info(const GPTConfig *c, int i, char *name, size_t name_len, int *ndims, int64_t shape[2]) {
    const int64_t C = c->channels;
    if (i == gpt_wte() || i == gpt_wpe()) {
        snprintf(name, name_len, "%s", i == gpt_wte() ? "wte.weight" : "wpe.weight");
        *ndims = 2, shape[0] = i == gpt_wte() ? c->padded_vocab_size : c->max_seq_len, shape[1] = C;
        return;
    }
    if (i == gpt_lnf_w(c) || i == gpt_lnf_b(c)) {
        snprintf(name, name_len, "%s", i == gpt_lnf_w(c) ? "ln_f.weight" : "ln_f.bias");
        *ndims = 1, shape[0] = C, shape[1] = 1;
        return;
    }
    const int l = (i - 2) / NUM_LAYER_PARAMS, k = (i - 2) % NUM_LAYER_PARAMS;
    snprintf(name, name_len, "h.%d.%s", l, gpt_layer_param_names[k]);
    /* Conv1D weights are [in, out]. */
    static const int64_t in_mult[NUM_LAYER_PARAMS] = {1, 1, 1, 3, 1, 1, 1, 1, 1, 4, 4, 1};
    static const int64_t out_mult[NUM_LAYER_PARAMS] = {0, 0, 3, 0, 1, 0, 0, 0, 4, 0, 1, 0};
    if (out_mult[k] == 0) { /* vectors: LayerNorm weights and biases, linear biases */
        *ndims = 1, shape[0] = in_mult[k] * C, shape[1] = 1;
    } else {
        *ndims = 2, shape[0] = in_mult[k] * C, shape[1] = out_mult[k] * C;
    }
}

int64_t gpt_param_numel(const GPTConfig *c, int i) {
    char name[64];
    int ndims;
    int64_t shape[2];
    gpt_param_info(c, i, name, sizeof name, &ndims, shape);
    return ndims == 1 ? shape[0] : shape[0] * shape[1];
}

int64_t gpt_total_params(const GPTConfig *c) {
    int64_t n = 0;
    for (int i = 0; i < gpt_num_params(c); ++i) n += gpt_param_numel(c, i);
    return n;
}

/* ------------------------------------------------------------ encoder */

void encoder_forward(float *out, const int64_t *tok, const int64_t *pos, const float *wte,
                     const float *wpe, int N, int C) {
#pragma omp parallel for
    for (int n = 0; n < N; ++n) {
        const float *te = wte + tok[n] * C, *pe = wpe + pos[n] * C;
        float *o = out + (size_t)n * C;
        for (int i = 0; i < C; ++i) o[i] = te[i] + pe[i];
    }
}

void encoder_backward(float *dwte, float *dwpe, const float *dout, const int64_t *tok,
                      const int64_t *pos, int N, int C) {
    /* Tokens repeat: in token order, parallel over channels only. */
#pragma omp parallel for
    for (int i = 0; i < C; ++i)
        for (int n = 0; n < N; ++n) {
            const float d = dout[(size_t)n * C + i];
            dwte[tok[n] * C + i] += d;
            dwpe[pos[n] * C + i] += d;
        }
}

/* Channels per thread in the sums over tokens (rows walked contiguously). */
#define COLUMN_BLOCK 64

/* ------------------------------------------------------------ layernorm */

void layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
                       const float *b, int N, int C) {
#pragma omp parallel for
    for (int n = 0; n < N; ++n) {
        const float *x = inp + (size_t)n * C;
        float m = 0.0f, v = 0.0f;
        for (int i = 0; i < C; ++i) m += x[i];
        m /= C;
        for (int i = 0; i < C; ++i) v += (x[i] - m) * (x[i] - m);
        const float s = 1.0f / sqrtf(v / C + 1e-5f);
        float *o = out + (size_t)n * C;
        for (int i = 0; i < C; ++i) o[i] = (x[i] - m) * s * w[i] + b[i];
        mean[n] = m, rstd[n] = s;
    }
}

void layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                        const float *w, const float *mean, const float *rstd, int N, int C) {
#pragma omp parallel for
    for (int n = 0; n < N; ++n) {
        const float *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
        float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
        for (int i = 0; i < C; ++i) {
            const float norm = (x[i] - mean[n]) * rstd[n], dnorm = w[i] * d[i];
            dnorm_mean += dnorm, dnorm_norm_mean += dnorm * norm;
        }
        dnorm_mean /= C, dnorm_norm_mean /= C;
        float *dx = dinp + (size_t)n * C;
        for (int i = 0; i < C; ++i) {
            const float norm = (x[i] - mean[n]) * rstd[n];
            dx[i] += (w[i] * d[i] - dnorm_mean - norm * dnorm_norm_mean) * rstd[n];
        }
    }
    /* The parameter gradients: sums over tokens, parallel over blocks of
     * channels, each walking the rows (contiguous) in token order. */
#pragma omp parallel for
    for (int i0 = 0; i0 < C; i0 += COLUMN_BLOCK) {
        const int i1 = i0 + COLUMN_BLOCK < C ? i0 + COLUMN_BLOCK : C;
        for (int n = 0; n < N; ++n) {
            const float *x = inp + (size_t)n * C, *d = dout + (size_t)n * C, m = mean[n], r = rstd[n];
#pragma omp simd
            for (int i = i0; i < i1; ++i) dw[i] += (x[i] - m) * r * d[i], db[i] += d[i];
        }
    }
}

/* ------------------------------------------------------------ matmul */

void matmul_forward(float *out, const float *inp, const float *w, const float *b, int N, int C, int OC) {
    if (b == NULL) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, OC, C, 1.0f, inp, C, w, OC, 0.0f, out, OC);
        return;
    }
    /* The bias in the product's own pass: out starts as the bias rows and
     * sgemm adds into it (beta 1), where beta 0 would zero it first and a
     * second pass would add the bias. */
#pragma omp parallel for
    for (int n = 0; n < N; ++n) memcpy(out + (size_t)n * OC, b, (size_t)OC * sizeof(float));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, OC, C, 1.0f, inp, C, w, OC, 1.0f, out, OC);
}

void matmul_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                     const float *w, int N, int C, int OC) {
    /* dinp += dout w^T; dw += inp^T dout; db += the column sums of dout. */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, C, OC, 1.0f, dout, OC, w, OC, 1.0f, dinp, C);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, C, OC, N, 1.0f, inp, C, dout, OC, 1.0f, dw, OC);
    if (db == NULL) return;
#pragma omp parallel for
    for (int o0 = 0; o0 < OC; o0 += COLUMN_BLOCK) {
        const int o1 = o0 + COLUMN_BLOCK < OC ? o0 + COLUMN_BLOCK : OC;
        for (int n = 0; n < N; ++n) {
            const float *d = dout + (size_t)n * OC;
#pragma omp simd
            for (int o = o0; o < o1; ++o) db[o] += d[o];
        }
    }
}

/* ------------------------------------------------------------ attention */

/* The calling thread's scratch of at least n floats, kept for its next
 * call: a T x T buffer is above malloc's mmap threshold, so a fresh one per
 * call would page-fault its way in every layer. Kept until the thread ends. */
static float *thread_scratch(size_t n) {
    static _Thread_local float *buf;
    static _Thread_local size_t cap;
    if (cap < n) {
        free(buf);
        buf = malloc(n * sizeof(float));
        cap = buf ? n : 0;
    }
    return buf;
}

/* Rows of queries per block: a block's scores are taken against the keys up
 * to its last row only (the causal mask's zeros above are never computed),
 * so the products cover about half the square. */
#define ATT_ROWS 64

void attention_forward(float *out, int ostride, float *att, const float *q, const float *k,
                       const float *v, int stride, int B, int T, int NH, int hs) {
    const float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for collapse(2)
    for (int b = 0; b < B; ++b)
        for (int h = 0; h < NH; ++h) {
            const size_t base = (size_t)b * T * stride + (size_t)h * hs;
            float *P = att + ((size_t)b * NH + h) * T * T;
            for (int i0 = 0; i0 < T; i0 += ATT_ROWS) {
                const int i1 = i0 + ATT_ROWS < T ? i0 + ATT_ROWS : T;
                /* S = scale q k^T for rows i0..i1-1 and keys 0..i1-1 */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, i1 - i0, i1, hs, scale,
                            q + base + (size_t)i0 * stride, stride, k + base, stride, 0.0f, P + (size_t)i0 * T, T);
                for (int i = i0; i < i1; ++i) {
                    float *p = P + (size_t)i * T, mx = -INFINITY, sum = 0.0f;
                    for (int j = 0; j <= i; ++j) mx = p[j] > mx ? p[j] : mx;
                    for (int j = 0; j <= i; ++j) sum += (p[j] = expf(p[j] - mx));
                    const float inv = 1.0f / sum;
                    for (int j = 0; j <= i; ++j) p[j] *= inv;
                    for (int j = i + 1; j < T; ++j) p[j] = 0.0f;
                }
                /* out = P v over the same keys */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, i1 - i0, hs, i1, 1.0f, P + (size_t)i0 * T, T,
                            v + base, stride, 0.0f, out + ((size_t)b * T + i0) * ostride + (size_t)h * hs, ostride);
            }
        }
}

void attention_backward(float *dq, float *dk, float *dv, int stride, const float *dout, int ostride,
                        const float *att, const float *q, const float *k, const float *v, int B,
                        int T, int NH, int hs) {
    const float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel
    {
        float *dP = thread_scratch((size_t)T * T);
#pragma omp for collapse(2)
        for (int b = 0; b < B; ++b)
            for (int h = 0; h < NH; ++h) {
                if (dP == NULL) abort(); /* out of memory in a worker thread */
                const size_t base = (size_t)b * T * stride + (size_t)h * hs;
                const float *dO = dout + (size_t)b * T * ostride + (size_t)h * hs;
                const float *P = att + ((size_t)b * NH + h) * T * T;
                for (int i0 = 0; i0 < T; i0 += ATT_ROWS) {
                    const int i1 = i0 + ATT_ROWS < T ? i0 + ATT_ROWS : T;
                    /* dP = dout v^T, rows i0..i1-1, keys 0..i1-1 */
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, i1 - i0, i1, hs, 1.0f,
                                dO + (size_t)i0 * ostride, ostride, v + base, stride, 0.0f, dP + (size_t)i0 * T, T);
                    /* through the softmax: dS_ij = P_ij (dP_ij - sum_k P_ik dP_ik), times the scale */
                    for (int i = i0; i < i1; ++i) {
                        const float *p = P + (size_t)i * T;
                        float *d = dP + (size_t)i * T, dot = 0.0f;
                        for (int j = 0; j <= i; ++j) dot += p[j] * d[j];
                        for (int j = 0; j <= i; ++j) d[j] = p[j] * (d[j] - dot) * scale;
                        for (int j = i + 1; j < i1; ++j) d[j] = 0.0f;
                    }
                    /* dq = dS k over the same keys */
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, i1 - i0, hs, i1, 1.0f, dP + (size_t)i0 * T, T,
                                k + base, stride, 0.0f, dq + base + (size_t)i0 * stride, stride);
                }
                /* dv = P^T dout and dk = dS^T q, keys j0..j1-1 from the rows that see them (j0..T-1) */
                for (int j0 = 0; j0 < T; j0 += ATT_ROWS) {
                    const int j1 = j0 + ATT_ROWS < T ? j0 + ATT_ROWS : T;
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, j1 - j0, hs, T - j0, 1.0f,
                                P + (size_t)j0 * T + j0, T, dO + (size_t)j0 * ostride, ostride, 0.0f,
                                dv + base + (size_t)j0 * stride, stride);
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, j1 - j0, hs, T - j0, 1.0f,
                                dP + (size_t)j0 * T + j0, T, q + base + (size_t)j0 * stride, stride, 0.0f,
                                dk + base + (size_t)j0 * stride, stride);
                }
            }
    }
}

/* ------------------------------------------------------------ gelu */

#define GELU_SCALE 0.7978845608028654f /* sqrt(2 / pi) */

/* exp(x) for |x| <= 30 in plain arithmetic, so that the GELU loops vectorize
 * (libm's expf is a call per element): x = n ln2 + r, |r| <= ln2/2, e^r by
 * its degree-6 Taylor polynomial (relative error below 2e-7), 2^n put in the
 * exponent bits. */
static inline float exp_poly(float x) {
    const float n = (x * 1.44269504f + 12582912.0f) - 12582912.0f; /* nearest integer: 1.5 2^23 */
    const float r = (x - n * 0.693145752f) - n * 1.42860677e-6f; /* ln 2 in two parts */
    const float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 + r * (1.0f / 720))))));
    union { int32_t i; float f; } two_n = {.i = ((int32_t)n + 127) << 23};
    return p * two_n.f;
}

/* tanh(u) = 1 - 2 / (exp(2u) + 1), at an absolute error of a few 1e-8,
 * which is what GELU's 0.5 x (1 + tanh) sees; |u| >= 15 is +-1 in fp32. */
static inline float fast_tanhf(float u) {
    const float v = 0.5f * (fabsf(u + 15.0f) - fabsf(u - 15.0f)); /* u clamped to [-15, 15], branch-free */
    return 1.0f - 2.0f / (exp_poly(2.0f * v) + 1.0f);
}

void gelu_forward(float *out, const float *inp, int N) {
#pragma omp parallel for simd
    for (int i = 0; i < N; ++i) {
        const float x = inp[i];
        out[i] = 0.5f * x * (1.0f + fast_tanhf(GELU_SCALE * (x + 0.044715f * x * x * x)));
    }
}

void gelu_backward(float *dinp, const float *inp, const float *dout, int N) {
#pragma omp parallel for simd
    for (int i = 0; i < N; ++i) {
        const float x = inp[i], u = GELU_SCALE * (x + 0.044715f * x * x * x);
        const float t = fast_tanhf(u), sech2 = 1.0f - t * t;
        const float g = 0.5f * (1.0f + t) + 0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] += g * dout[i];
    }
}

/* ------------------------------------------------------------ residual */

void residual_forward(float *out, const float *a, const float *b, int N) {
#pragma omp parallel for
    for (int i = 0; i < N; ++i) out[i] = a[i] + b[i];
}

void residual_backward(float *da, float *db, const float *dout, int N) {
#pragma omp parallel for
    for (int i = 0; i < N; ++i) da[i] += dout[i], db[i] += dout[i];
}

/* ------------------------------------------------------------ classifier */

double classifier_forward(float *logits, const float *x, const float *wte, const int64_t *labels,
                          int N, int C, int V, int Vp, int64_t *count) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, Vp, C, 1.0f, x, C, wte, C, 0.0f, logits, Vp);
    double loss = 0.0;
    int64_t counted = 0;
#pragma omp parallel for reduction(+ : loss, counted)
    for (int n = 0; n < N; ++n) {
        float *p = logits + (size_t)n * Vp, mx = -INFINITY;
        for (int j = 0; j < V; ++j) mx = p[j] > mx ? p[j] : mx;
        const float target = labels[n] >= 0 ? p[labels[n]] : 0.0f;
        double sum = 0.0;
        for (int j = 0; j < V; ++j) sum += (p[j] = expf(p[j] - mx));
        const float inv = (float)(1.0 / sum);
        for (int j = 0; j < V; ++j) p[j] *= inv;
        for (int j = V; j < Vp; ++j) p[j] = 0.0f;
        if (labels[n] >= 0) { /* -log softmax, from the logits for accuracy */
            loss += -((double)target - mx - log(sum));
            counted += 1;
        }
    }
    *count = counted;
    return loss;
}

void classifier_backward(float *dx, float *dwte, float *probs, const float *x, const float *wte,
                         const int64_t *labels, float dloss, int N, int C, int V, int Vp) {
#pragma omp parallel for
    for (int n = 0; n < N; ++n) {
        float *d = probs + (size_t)n * Vp;
        if (labels[n] < 0) {
            memset(d, 0, (size_t)Vp * sizeof(float));
            continue;
        }
        for (int j = 0; j < V; ++j) d[j] = (d[j] - (j == labels[n] ? 1.0f : 0.0f)) * dloss;
        for (int j = V; j < Vp; ++j) d[j] = 0.0f;
    }
    /* dx = dlogits wte; dwte += dlogits^T x */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, Vp, 1.0f, probs, Vp, wte, C, 0.0f, dx, C);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, Vp, C, N, 1.0f, probs, Vp, x, C, 1.0f, dwte, C);
}
