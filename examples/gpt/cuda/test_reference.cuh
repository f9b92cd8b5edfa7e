/*
 * test_reference.cuh: plain fp32 C++ references of the GPT CUDA kernels
 * (test_gpt_kernels.cu compares each kernel with them): the same math as
 * examples/gpt/gpt_ops.c, written without BLAS.
 */
#ifndef GPT_TEST_REFERENCE_CUH
#define GPT_TEST_REFERENCE_CUH

#include "test_util.cuh"

/* ------------------------------------------------------ fp32 references */


inline void ref_encoder_fwd(vec &out, const ivec &tok, const ivec &pos, const vec &wte,
                            const vec &wpe, int N, int C) {
    for (int n = 0; n < N; ++n)
        for (int c = 0; c < C; ++c)
            out[(size_t)n * C + c] = wte[tok[n] * C + c] + wpe[pos[n] * C + c];
}
inline void ref_encoder_bwd(vec &dwte, vec &dwpe, const vec &dout, const ivec &tok,
                            const ivec &pos, int N, int C) {
    for (int n = 0; n < N; ++n)
        for (int c = 0; c < C; ++c) {
            float d = dout[(size_t)n * C + c];
            dwte[tok[n] * C + c] += d;
            dwpe[pos[n] * C + c] += d;
        }
}
inline void ref_layernorm_fwd(vec &out, vec &mean, vec &rstd, const vec &x, const vec &w,
                              const vec &b, int N, int C) {
    for (int r = 0; r < N; ++r) {
        const float *xr = &x[(size_t)r * C];
        double m = 0, v = 0;
        for (int i = 0; i < C; ++i) m += xr[i];
        m /= C;
        for (int i = 0; i < C; ++i) v += (xr[i] - m) * (xr[i] - m);
        v /= C;
        float rs = (float)(1.0 / sqrt(v + 1e-5));
        for (int i = 0; i < C; ++i)
            out[(size_t)r * C + i] = (float)((xr[i] - m) * rs) * w[i] + b[i];
        mean[r] = (float)m;
        rstd[r] = rs;
    }
}
inline void ref_layernorm_bwd(vec &dx, vec &dw, vec &db, const vec &dout, const vec &x,
                              const vec &w, const vec &mean, const vec &rstd, int N, int C) {
    for (int r = 0; r < N; ++r) {
        const float *d = &dout[(size_t)r * C], *xr = &x[(size_t)r * C];
        double s1 = 0, s2 = 0;
        for (int i = 0; i < C; ++i) {
            float xh = (xr[i] - mean[r]) * rstd[r];
            s1 += d[i] * w[i];
            s2 += d[i] * w[i] * xh;
            dw[i] += d[i] * xh;
            db[i] += d[i];
        }
        s1 /= C;
        s2 /= C;
        for (int i = 0; i < C; ++i) {
            float xh = (xr[i] - mean[r]) * rstd[r];
            dx[(size_t)r * C + i] += (float)((d[i] * w[i] - s1 - xh * s2) * rstd[r]);
        }
    }
}
/* W element (i = in, o = out) in either layout */
inline float wat(const vec &W, bool in_out, int IC, int OC, int i, int o) {
    return in_out ? W[(size_t)i * OC + o] : W[(size_t)o * IC + i];
}
inline void ref_matmul_fwd(vec &out, const vec &x, const vec &W, bool in_out, const vec *bias,
                           int N, int IC, int OC) {
    for (int n = 0; n < N; ++n)
        for (int o = 0; o < OC; ++o) {
            double s = bias ? (*bias)[o] : 0.0;
            for (int i = 0; i < IC; ++i) s += x[(size_t)n * IC + i] * wat(W, in_out, IC, OC, i, o);
            out[(size_t)n * OC + o] = (float)s;
        }
}
inline void ref_matmul_bwd(vec &dx, vec &dW, vec &db, const vec &dout, const vec &x,
                           const vec &W, bool in_out, int N, int IC, int OC) {
    for (int n = 0; n < N; ++n)
        for (int i = 0; i < IC; ++i) {
            double s = 0;
            for (int o = 0; o < OC; ++o)
                s += dout[(size_t)n * OC + o] * wat(W, in_out, IC, OC, i, o);
            dx[(size_t)n * IC + i] += (float)s;
        }
    for (int i = 0; i < IC; ++i)
        for (int o = 0; o < OC; ++o) {
            double s = 0;
            for (int n = 0; n < N; ++n) s += (double)dout[(size_t)n * OC + o] * x[(size_t)n * IC + i];
            (in_out ? dW[(size_t)i * OC + o] : dW[(size_t)o * IC + i]) += (float)s;
        }
    for (int o = 0; o < OC; ++o)
        for (int n = 0; n < N; ++n) db[o] += dout[(size_t)n * OC + o];
}
/* qkv (B,T,3C) -> out (B,T,C); att (B,NH,T,T) saved */
inline void ref_attention_fwd(vec &out, vec &att, const vec &qkv, int B, int T, int C, int NH) {
    int HS = C / NH;
    float sc = 1.f / sqrtf((float)HS);
    for (int b = 0; b < B; ++b)
        for (int h = 0; h < NH; ++h)
            for (int t = 0; t < T; ++t) {
                const float *q = &qkv[((size_t)b * T + t) * 3 * C + h * HS];
                float *a = &att[(((size_t)b * NH + h) * T + t) * T];
                float m = -INFINITY;
                for (int j = 0; j <= t; ++j) {
                    const float *k = &qkv[((size_t)b * T + j) * 3 * C + C + h * HS];
                    float s = 0;
                    for (int d = 0; d < HS; ++d) s += q[d] * k[d];
                    a[j] = s * sc;
                    m = fmaxf(m, a[j]);
                }
                float z = 0;
                for (int j = 0; j <= t; ++j) z += (a[j] = expf(a[j] - m));
                for (int j = 0; j < T; ++j) a[j] = j <= t ? a[j] / z : 0.f;
                float *o = &out[((size_t)b * T + t) * C + h * HS];
                for (int d = 0; d < HS; ++d) {
                    float s = 0;
                    for (int j = 0; j <= t; ++j) s += a[j] * qkv[((size_t)b * T + j) * 3 * C + 2 * C + h * HS + d];
                    o[d] = s;
                }
            }
}
inline void ref_attention_bwd(vec &dqkv, const vec &dout, const vec &qkv, const vec &att, int B,
                              int T, int C, int NH) {
    int HS = C / NH;
    float sc = 1.f / sqrtf((float)HS);
    std::fill(dqkv.begin(), dqkv.end(), 0.f);
    vec da(T), dp(T);
    for (int b = 0; b < B; ++b)
        for (int h = 0; h < NH; ++h)
            for (int t = 0; t < T; ++t) {
                const float *a = &att[(((size_t)b * NH + h) * T + t) * T];
                const float *dy = &dout[((size_t)b * T + t) * C + h * HS];
                for (int j = 0; j <= t; ++j) {
                    const float *v = &qkv[((size_t)b * T + j) * 3 * C + 2 * C + h * HS];
                    float *dv = &dqkv[((size_t)b * T + j) * 3 * C + 2 * C + h * HS];
                    float s = 0;
                    for (int d = 0; d < HS; ++d) {
                        s += dy[d] * v[d];
                        dv[d] += a[j] * dy[d];
                    }
                    da[j] = s;
                }
                float dot = 0;
                for (int j = 0; j <= t; ++j) dot += a[j] * da[j];
                for (int j = 0; j <= t; ++j) dp[j] = a[j] * (da[j] - dot) * sc;
                const float *q = &qkv[((size_t)b * T + t) * 3 * C + h * HS];
                float *dq = &dqkv[((size_t)b * T + t) * 3 * C + h * HS];
                for (int j = 0; j <= t; ++j) {
                    const float *k = &qkv[((size_t)b * T + j) * 3 * C + C + h * HS];
                    float *dk = &dqkv[((size_t)b * T + j) * 3 * C + C + h * HS];
                    for (int d = 0; d < HS; ++d) {
                        dq[d] += dp[j] * k[d];
                        dk[d] += dp[j] * q[d];
                    }
                }
            }
}
inline float gelu(float x) {
    return 0.5f * x * (1.f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x)));
}
inline float gelu_grad(float x) {
    float u = 0.7978845608f * (x + 0.044715f * x * x * x), t = tanhf(u);
    return 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * 0.7978845608f * (1.f + 3.f * 0.044715f * x * x);
}
inline void ref_classifier(vec &dlogits, vec &losses, const vec &logits, const ivec &tg, float dloss, int N, int V, int Vp) {
    for (int r = 0; r < N; ++r) {
        const float *x = &logits[(size_t)r * Vp];
        double m = -INFINITY, z = 0;
        for (int j = 0; j < V; ++j) m = fmax(m, x[j]);
        for (int j = 0; j < V; ++j) z += exp(x[j] - m);
        losses[r] = tg[r] < 0 ? 0.f : (float)(m + log(z) - x[tg[r]]);
        for (int j = 0; j < Vp; ++j)
            dlogits[(size_t)r * Vp + j] =
                (tg[r] < 0 || j >= V) ? 0.f
                                      : dloss * (float)(exp(x[j] - m) / z - (j == tg[r] ? 1 : 0));
    }
}

#endif /* GPT_TEST_REFERENCE_CUH */
