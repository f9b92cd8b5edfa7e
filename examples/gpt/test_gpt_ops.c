/*
 * test_gpt_ops: every operation's backward (gpt_ops.c) against central finite
 * differences of its forward.
 *
 * For each operation: random inputs, a random weighting r of its outputs,
 * the scalar f = sum(r * out) (for the classifier, its loss sum); the
 * backward with dout = r gives df/dx for every input x, compared with
 * (f(x + h) - f(x - h)) / 2h at up to 64 elements of each input. The check
 * passes when the relative error ||fd - analytic|| / ||analytic|| is below
 * 1e-2 for every input (fp32 forward, h = 1e-2 scaled to the element).
 * Exit status 0 when every check passes, 1 otherwise.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt.h"

static uint64_t state = 42;
static float rnd(void) { /* uniform in [-1, 1) */
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(state >> 11) * 0x1p-53 * 2.0 - 1.0);
}
static float *rand_vec(size_t n, float scale) {
    float *p = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; ++i) p[i] = scale * rnd();
    return p;
}
static float *zeros(size_t n) { return calloc(n, sizeof(float)); }

/* The problem sizes. */
enum { B = 2, T = 5, C = 8, NH = 2, OC = 6, V = 7, VP = 8, N = B * T };

static double dot(const float *a, const float *b, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; ++i) s += (double)a[i] * b[i];
    return s;
}

typedef double (*scalar_fn)(void);
static int failures = 0;

/* Compare g with central differences of f over x (n elements). */
static void check(const char *op, const char *input, float *x, size_t n, const float *g, scalar_fn f) {
    double num = 0.0, den = 0.0;
    const size_t stride = n > 64 ? n / 64 : 1;
    for (size_t i = 0; i < n; i += stride) {
        const float keep = x[i], h = 1e-2f * fmaxf(1.0f, fabsf(keep));
        x[i] = keep + h;
        const double fp = f();
        x[i] = keep - h;
        const double fm = f();
        x[i] = keep;
        const double fd = (fp - fm) / (2.0 * h);
        num += (fd - g[i]) * (fd - g[i]), den += (double)g[i] * g[i];
    }
    const double rel = sqrt(num) / (sqrt(den) + 1e-12);
    const int ok = rel < 1e-2;
    printf("%-11s d%-6s relative error %.2e  %s\n", op, input, rel, ok ? "ok" : "FAILED");
    failures += !ok;
}

/* ---- the operations, as scalars of their inputs */

static float *X, *W, *Bv, *R, *OUT, *MEAN, *RSTD, *WPE, *ATT, *QKV, *WTE;
static int64_t TOK[N], POS[N], LAB[N];

static double f_encoder(void) {
    encoder_forward(OUT, TOK, POS, WTE, WPE, N, C);
    return dot(OUT, R, N * C);
}
static double f_layernorm(void) {
    layernorm_forward(OUT, MEAN, RSTD, X, W, Bv, N, C);
    return dot(OUT, R, N * C);
}
static double f_matmul(void) {
    matmul_forward(OUT, X, W, Bv, N, C, OC);
    return dot(OUT, R, N * OC);
}
static double f_attention(void) {
    attention_forward(OUT, C, ATT, QKV, QKV + C, QKV + 2 * C, 3 * C, B, T, NH, C / NH);
    return dot(OUT, R, N * C);
}
/* attention over more tokens than one block of query rows (70 = 64 + 6) */
enum { T2 = 70, B2 = 1, NH2 = 2, C2 = 8 };
static double f_attention_long(void) {
    attention_forward(OUT, C2, ATT, QKV, QKV + C2, QKV + 2 * C2, 3 * C2, B2, T2, NH2, C2 / NH2);
    return dot(OUT, R, B2 * T2 * C2);
}
static double f_gelu(void) {
    gelu_forward(OUT, X, N * C);
    return dot(OUT, R, N * C);
}
static double f_residual(void) {
    residual_forward(OUT, X, W, N * C);
    return dot(OUT, R, N * C);
}
static double f_classifier(void) {
    int64_t count;
    return classifier_forward(OUT, X, WTE, LAB, N, C, V, VP, &count);
}

int main(void) {
    for (int n = 0; n < N; ++n) TOK[n] = (n * 5 + 1) % VP, POS[n] = n % T, LAB[n] = n % 4 == 3 ? -100 : (n * 3) % V;
    OUT = zeros(N * VP > N * 4 * C ? N * VP : N * 4 * C), MEAN = zeros(N), RSTD = zeros(N);

    { /* encoder: the gradients of wte and wpe */
        WTE = rand_vec(VP * C, 1.0f), WPE = rand_vec(T * C, 1.0f), R = rand_vec(N * C, 1.0f);
        float *dwte = zeros(VP * C), *dwpe = zeros(T * C);
        encoder_backward(dwte, dwpe, R, TOK, POS, N, C);
        check("encoder", "wte", WTE, VP * C, dwte, f_encoder);
        check("encoder", "wpe", WPE, T * C, dwpe, f_encoder);
        free(dwte), free(dwpe), free(WTE), free(WPE), free(R);
    }
    { /* layernorm */
        X = rand_vec(N * C, 2.0f), W = rand_vec(C, 1.0f), Bv = rand_vec(C, 1.0f), R = rand_vec(N * C, 1.0f);
        float *dx = zeros(N * C), *dw = zeros(C), *db = zeros(C);
        f_layernorm();
        layernorm_backward(dx, dw, db, R, X, W, MEAN, RSTD, N, C);
        check("layernorm", "inp", X, N * C, dx, f_layernorm);
        check("layernorm", "weight", W, C, dw, f_layernorm);
        check("layernorm", "bias", Bv, C, db, f_layernorm);
        free(dx), free(dw), free(db), free(X), free(W), free(Bv), free(R);
    }
    { /* matmul */
        X = rand_vec(N * C, 1.0f), W = rand_vec(C * OC, 1.0f), Bv = rand_vec(OC, 1.0f), R = rand_vec(N * OC, 1.0f);
        float *dx = zeros(N * C), *dw = zeros(C * OC), *db = zeros(OC);
        matmul_backward(dx, dw, db, R, X, W, N, C, OC);
        check("matmul", "inp", X, N * C, dx, f_matmul);
        check("matmul", "weight", W, C * OC, dw, f_matmul);
        check("matmul", "bias", Bv, OC, db, f_matmul);
        free(dx), free(dw), free(db), free(X), free(W), free(Bv), free(R);
    }
    { /* attention on a fused qkv [N, 3C] */
        QKV = rand_vec(N * 3 * C, 1.0f), ATT = zeros(B * NH * T * T), R = rand_vec(N * C, 1.0f);
        float *dqkv = zeros(N * 3 * C);
        f_attention();
        attention_backward(dqkv, dqkv + C, dqkv + 2 * C, 3 * C, R, C, ATT, QKV, QKV + C, QKV + 2 * C, B, T, NH, C / NH);
        check("attention", "qkv", QKV, N * 3 * C, dqkv, f_attention);
        free(dqkv), free(QKV), free(ATT), free(R);
    }
    { /* attention over two blocks of query rows, the second partial */
        float *keep = OUT;
        OUT = zeros(B2 * T2 * C2);
        QKV = rand_vec(B2 * T2 * 3 * C2, 1.0f), ATT = zeros(B2 * NH2 * T2 * T2), R = rand_vec(B2 * T2 * C2, 1.0f);
        float *dqkv = zeros(B2 * T2 * 3 * C2);
        f_attention_long();
        attention_backward(dqkv, dqkv + C2, dqkv + 2 * C2, 3 * C2, R, C2, ATT, QKV, QKV + C2, QKV + 2 * C2, B2, T2,
                           NH2, C2 / NH2);
        check("attention", "qkv T70", QKV, B2 * T2 * 3 * C2, dqkv, f_attention_long);
        free(dqkv), free(QKV), free(ATT), free(R), free(OUT);
        OUT = keep;
    }
    { /* gelu */
        X = rand_vec(N * C, 3.0f), R = rand_vec(N * C, 1.0f);
        float *dx = zeros(N * C);
        gelu_backward(dx, X, R, N * C);
        check("gelu", "inp", X, N * C, dx, f_gelu);
        free(dx), free(X), free(R);
    }
    { /* residual */
        X = rand_vec(N * C, 1.0f), W = rand_vec(N * C, 1.0f), R = rand_vec(N * C, 1.0f);
        float *da = zeros(N * C), *db = zeros(N * C);
        residual_backward(da, db, R, N * C);
        check("residual", "a", X, N * C, da, f_residual);
        check("residual", "b", W, N * C, db, f_residual);
        free(da), free(db), free(X), free(W), free(R);
    }
    { /* classifier: the LM head tied to wte, softmax over V of VP columns, cross-entropy */
        X = rand_vec(N * C, 1.0f), WTE = rand_vec(VP * C, 1.0f);
        float *dx = zeros(N * C), *dwte = zeros(VP * C);
        f_classifier();
        classifier_backward(dx, dwte, OUT, X, WTE, LAB, 1.0f, N, C, V, VP);
        check("classifier", "x", X, N * C, dx, f_classifier);
        check("classifier", "wte", WTE, VP * C, dwte, f_classifier);
        free(dx), free(dwte), free(X), free(WTE);
    }
    { /* no counted token (every label -100, as in a micro-batch of T = 1)
       * and dloss 0: the loss is 0 of 0 tokens, dx is zero and wte's
       * gradient keeps its bits; with counted tokens and dloss 0 as well */
        X = rand_vec(N * C, 1.0f), WTE = rand_vec(VP * C, 1.0f);
        float *dx = rand_vec(N * C, 1.0f), *dwte = rand_vec(VP * C, 1.0f), *keep = malloc(VP * C * sizeof(float));
        memcpy(keep, dwte, VP * C * sizeof(float));
        int64_t none[N], count = -1;
        for (int n = 0; n < N; ++n) none[n] = -100;
        for (int pass = 0; pass < 2; ++pass) {
            const int64_t *labels = pass == 0 ? none : LAB;
            const double loss = classifier_forward(OUT, X, WTE, labels, N, C, V, VP, &count);
            classifier_backward(dx, dwte, OUT, X, WTE, labels, 0.0f, N, C, V, VP);
            int zero = 1;
            for (int i = 0; i < N * C; ++i) zero &= dx[i] == 0.0f;
            const int same = memcmp(keep, dwte, VP * C * sizeof(float)) == 0;
            const int ok = zero && same && (pass == 1 || (loss == 0.0 && count == 0));
            printf("%-11s %-26s %s\n", "classifier", pass == 0 ? "no counted token, dloss 0" : "dloss 0",
                   ok ? "ok" : "FAILED (a gradient where there is none)");
            failures += !ok;
        }
        free(dx), free(dwte), free(keep), free(X), free(WTE);
    }
    free(OUT), free(MEAN), free(RSTD);
    printf("%s\n", failures ? "test_gpt_ops: FAILED" : "test_gpt_ops: every backward matches finite differences");
    return failures ? 1 : 0;
}
