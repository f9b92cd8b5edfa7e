/*
 * test_util.cuh: what the GPT CUDA kernels' test (test_gpt_kernels.cu) and
 * benchmark (bench_gpt_kernels.cu) share: bf16 rounding as the host does it,
 * random bf16 values, device buffers, error checks, the comparison of a
 * result with its reference.
 */
#ifndef GPT_TEST_UTIL_CUH
#define GPT_TEST_UTIL_CUH

#include "gpt_kernels.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

typedef std::vector<float> vec;
typedef std::vector<int64_t> ivec;
typedef uint16_t *bf16p; /* device bf16 pointer arithmetic */

inline int failures = 0; /* checks that failed */

/* ------------------------------------------------------------- utilities */

inline uint16_t f2bf(float f) { /* round to nearest even (no NaN input here) */
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
inline float bf2f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
inline float bfround(float f) { return bf2f(f2bf(f)); }

inline uint64_t rng = 0x9E3779B97F4A7C15ull;
inline float frand() { /* uniform in [-1, 1) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 40) * (1.0 / (1ull << 24))) * 2.f - 1.f;
}
/* Random values already rounded to bf16, so host and device agree on them. */
inline vec rnd(size_t n, float scale = 1.f) {
    vec v(n);
    for (auto &x : v) x = bfround(frand() * scale);
    return v;
}

#define CK(call)                                                                           \
    do {                                                                                   \
        cudaError_t e_ = (call);                                                           \
        if (e_ != cudaSuccess) {                                                           \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,                  \
                    cudaGetErrorString(e_));                                               \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)
#define GK(call)                                                                           \
    do {                                                                                   \
        if ((call) != 0) {                                                                 \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,                  \
                    gpt_cuda_error(ctx));                                                  \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

/* Device buffers: bf16 (from fp32 values) or fp32, freed at exit of scope. */
struct Dev {
    void *p = nullptr, *base = nullptr;
    size_t n = 0;
    bool f32 = false;
    Dev(const vec &v, bool as_f32 = false) : n(v.size()), f32(as_f32) {
        CK(cudaMalloc(&base, n * (f32 ? 4 : 2) + 16));
        p = base;
        put(v);
    }
    explicit Dev(size_t bytes) : n(bytes) {
        CK(cudaMalloc(&base, bytes + 16));
        p = base;
    }
    ~Dev() { cudaFree(base); }
    /* Moves the data k elements up (into the 16 spare bytes). */
    void shift(int k) {
        vec v = get();
        p = (char *)base + (size_t)k * (f32 ? 4 : 2);
        put(v);
    }
    Dev(const Dev &) = delete;
    Dev &operator=(const Dev &) = delete;
    void put(const vec &v) {
        if (f32) {
            CK(cudaMemcpy(p, v.data(), n * 4, cudaMemcpyHostToDevice));
        } else {
            std::vector<uint16_t> h(n);
            for (size_t i = 0; i < n; ++i) h[i] = f2bf(v[i]);
            CK(cudaMemcpy(p, h.data(), n * 2, cudaMemcpyHostToDevice));
        }
    }
    vec get() const {
        vec v(n);
        CK(cudaDeviceSynchronize());
        if (f32) {
            CK(cudaMemcpy(v.data(), p, n * 4, cudaMemcpyDeviceToHost));
        } else {
            std::vector<uint16_t> h(n);
            CK(cudaMemcpy(h.data(), p, n * 2, cudaMemcpyDeviceToHost));
            for (size_t i = 0; i < n; ++i) v[i] = bf2f(h[i]);
        }
        return v;
    }
};
inline int64_t *dev_ids(const std::vector<int64_t> &v) {
    int64_t *p;
    CK(cudaMalloc(&p, v.size() * sizeof(int64_t)));
    CK(cudaMemcpy(p, v.data(), v.size() * sizeof(int64_t), cudaMemcpyHostToDevice));
    return p;
}

inline void compare(const char *what, const vec &got, const vec &ref, float tol) {
    float scale = 1e-6f, err = 0.f;
    size_t worst = 0;
    bool finite = true;
    for (size_t i = 0; i < ref.size(); ++i) scale = fmaxf(scale, fabsf(ref[i]));
    for (size_t i = 0; i < ref.size(); ++i) {
        if (!std::isfinite(got[i])) finite = false;
        float e = fabsf(got[i] - ref[i]);
        if (e > err) {
            err = e;
            worst = i;
        }
    }
    float rel = err / scale;
    bool ok = finite && rel <= tol;
    printf("%-44s %s  max err %.3e of scale %.3e (%.2e, tol %.1e)%s\n", what, ok ? "ok  " : "FAIL",
           err, scale, rel, tol, finite ? "" : " non-finite values");
    if (!ok) {
        printf("    worst at %zu: got %g want %g\n", worst, got[worst], ref[worst]);
        ++failures;
    }
}

/* A bad size is an error whose message names the bad value. */
inline void bad(gpt_cuda_t ctx, const char *what, int rc, const char *needle) {
    bool ok = rc != 0 && strstr(gpt_cuda_error(ctx), needle);
    printf("bad argument: %-31s %s  (%s)\n", what, ok ? "ok  " : "FAIL", gpt_cuda_error(ctx));
    if (!ok) ++failures;
}

/* --bench [B T [PEAK]]: times per kernel and of a whole step's kernels at
 * GPT-2 124M sizes (bench_gpt_kernels.cu); the exit status. */
int gpt_kernels_bench(gpt_cuda_t ctx, const cudaDeviceProp &prop, int argc, char **argv);

#endif /* GPT_TEST_UTIL_CUH */
