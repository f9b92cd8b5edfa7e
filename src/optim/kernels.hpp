// The fused optimizer kernels, written once over a SIMD "vector traits" type
// and compiled three times: kernels_generic.cc (default flags),
// kernels_avx2.cc and kernels_avx512.cc (core/simd.hpp's pattern: each
// defines kernels<Isa>(), a Kernels table; optimizer.cc's simd::Dispatch
// picks the one of simd::isa()).
//
// A kernel updates n consecutive elements in one pass over its arrays, all in
// fp32 (DeepSpeed's order of operations; Adam also in PyTorch's, see
// adam_torch_at), with constants prepared in double by optimizer.cc and
// rounded once to float. Weight decay is switched off
// per call by zero coefficients: x + 0 * p is x exactly, and the extra
// multiply-add costs nothing next to the memory traffic.
//
// A vector traits type V provides:
//   R                      the register type; W lanes of fp32
//   load(const float *), store(float *, R)  unaligned
//   set(float), add, mul, div, sqrt, fma(a, b, c) = a * b + c
//   fused(a, b, c)         a * b + c rounded once (a true FMA on every set)
//   apart(x)               x, opaque to the compiler: a product passed
//                          through it is never contracted into an FMA
//   sign(x)                -1, 0 or +1 per lane
//   D, dzero(), dacc(D, R) (adds x^2 in fp64), dsum(D)  Lamb's norms
//   bload(const uint16_t *)  W bf16 values widened to fp32 (exact)
//   bstore(uint16_t *, R)    W values rounded to bf16 as core/half.hpp's
//                            fp32_to_bf16 (nearest even; a NaN stays a quiet NaN)
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/simd.hpp"

namespace dsm {
namespace optim {

// Per-call constants (optimizer.cc: adam_k() and friends).
struct AdamK {
    float b1, omb1, b2, omb2; // betas and 1 - betas
    float eps;
    float step;               // -lr / bc1
    float ibc2;               // 1 / sqrt(bc2)
    float l2;                 // wd when L2 mode (g += wd p), else 0
    float decay;              // -lr wd when adam_w_mode (p += decay p), else 0
    float scale;              // grad_scale
    // PyTorch's order (Hyper::torch_adam): torch != 0 selects it; keep is
    // 1 - lr wd (AdamW's p.mul_) or 1, bc2s = sqrt(bc2); step, l2 and the
    // rest as above, decay and ibc2 unused.
    int torch;
    float keep;
    float bc2s;
};

struct SgdK {
    float wd;                 // g += wd p
    float mom;                // buf = mom buf + damp g (0 on the first step)
    float damp;               // 1 - dampening (1 on the first step)
    float nesterov;           // momentum: g += nesterov buf
    float neg_lr;
    float scale;
    int mode;                 // 0: no momentum, 1: momentum, 2: nesterov
};

struct LionK {
    float b1, omb1, b2, omb2;
    float neg_lr;
    float keep;               // 1 - lr wd: p = keep p - lr sign(c)
    float scale;
};

struct AdagradK {
    float wd;
    float eps;
    float neg_clr;            // -lr / (1 + (step - 1) lr_decay)
    float scale;
};

struct LambK {
    float b1, omb1, b2, omb2;
    float eps;
    float wd;                 // u = m / (sqrt(v) + eps) + wd p
    float scale;
};

// One instruction set's kernels. Pointers are unaligned-safe; n may be any
// count (a vector body and a scalar tail).
struct Kernels {
    const char *name;
    void (*adam)(const AdamK &k, float *p, const float *g, float *m, float *v, size_t n);
    // adam() that also zeroes g (the host step's fused zeroing).
    void (*adam_zero)(const AdamK &k, float *p, float *g, float *m, float *v, size_t n);
    // Adam from bf16 gradients g, the bits of adam() on their fp32 widening,
    // which also writes the bf16 rounding of the updated p to p16 and, with
    // zero_g, zeroes g: the host step's 16-bit pass (optim::Fused) without
    // a conversion buffer.
    void (*adam_bf16)(const AdamK &k, float *p, uint16_t *g, float *m, float *v, uint16_t *p16, size_t n,
                      bool zero_g);
    void (*sgd)(const SgdK &k, float *p, const float *g, float *buf, size_t n);
    void (*lion)(const LionK &k, float *p, const float *g, float *m, size_t n);
    void (*adagrad)(const AdagradK &k, float *p, const float *g, float *sum, size_t n);
    // Lamb pass 1: m, v updated; sums[0] += sum p^2, sums[1] += sum u^2 (fp64).
    void (*lamb1)(const LambK &k, const float *p, const float *g, float *m, float *v, size_t n,
                  double *sums);
    // Lamb pass 2: p += neg_coef * u, u recomputed from m, v exactly as in pass 1.
    void (*lamb2)(const LambK &k, float neg_coef, float *p, const float *m, const float *v, size_t n);
    // The 16-bit pass's conversions: bf16 widened to fp32 (exact), fp32
    // rounded to bf16 as core/half.hpp's fp32_to_bf16.
    void (*bf16_to_f32)(const uint16_t *h, float *f, size_t n);
    void (*f32_to_bf16)(const float *f, uint16_t *h, size_t n);
};

// One instruction set's table, or nullptr when the compiler could not build
// that set (a non-x86 target).
template <simd::Isa> const Kernels *kernels() noexcept;

} // namespace optim
} // namespace dsm

// ---------------------------------------------------------------- bodies
// Only the kernel files define DSM_OPTIM_KERNEL_BODIES. Everything below is
// in an unnamed namespace, so each file gets its own copy: an inline or
// template function shared by name between files compiled with different
// -m flags could be merged by the linker into the AVX-512 copy and then run
// on a CPU without AVX-512. For the same reason these bodies call builtins,
// not std:: functions.
#ifdef DSM_OPTIM_KERNEL_BODIES
namespace dsm {
namespace optim {
namespace {

// One lane: the scalar tail of every kernel (and the whole generic kernel,
// left to the compiler's auto-vectorization).
struct Scalar {
    using R = float;
    using D = double;
    static constexpr size_t W = 1;
    static R load(const float *p) { return *p; }
    static void store(float *p, R x) { *p = x; }
    static R set(float x) { return x; }
    static R add(R a, R b) { return a + b; }
    static R mul(R a, R b) { return a * b; }
    static R div(R a, R b) { return a / b; }
    static R sqrt(R a) { return __builtin_sqrtf(a); }
    static R fma(R a, R b, R c) { return a * b + c; }
    static R fused(R a, R b, R c) { return __builtin_fmaf(a, b, c); }
    static R apart(R x) {
#if defined(__x86_64__) || defined(__i386__)
        __asm__("" : "+x"(x));
#elif defined(__aarch64__)
        __asm__("" : "+w"(x));
#else
        volatile float y = x;
        x = y;
#endif
        return x;
    }
    static R sign(R x) { return static_cast<float>((x > 0.0f) - (x < 0.0f)); }
    static D dzero() { return 0.0; }
    static D dacc(D acc, R x) { return acc + static_cast<double>(x) * static_cast<double>(x); }
    static double dsum(D acc) { return acc; }
    static R bload(const uint16_t *h) {
        const uint32_t u = static_cast<uint32_t>(*h) << 16;
        float x;
        __builtin_memcpy(&x, &u, 4);
        return x;
    }
    static void bstore(uint16_t *h, R x) {
        uint32_t u;
        __builtin_memcpy(&u, &x, 4);
        const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
        *h = static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x0040u : rounded);
    }
};

// body.at<V>(i) for each whole vector of V in [0, n), then body.at<Scalar>(i)
// for the tail.
template <class V, class Body> inline void sweep(size_t n, const Body &body) {
    size_t i = 0;
    if (V::W > 1)
        for (; i + V::W <= n; i += V::W) body.template at<V>(i);
    for (; i < n; ++i) body.template at<Scalar>(i);
}

// Adam on one vector at element i from the gradient's fp32 value `graw`:
// stores m and v, returns the new p (stored by the caller).
template <class V>
inline typename V::R adam_at(const AdamK &k, float *p, typename V::R graw, float *m, float *v, size_t i) {
    using R = typename V::R;
    R pr = V::load(p + i);
    R gr = V::mul(graw, V::set(k.scale));
    gr = V::fma(V::set(k.l2), pr, gr);
    const R mr = V::fma(V::set(k.omb1), gr, V::mul(V::set(k.b1), V::load(m + i)));
    const R vr = V::fma(V::set(k.omb2), V::mul(gr, gr), V::mul(V::set(k.b2), V::load(v + i)));
    const R den = V::fma(V::sqrt(vr), V::set(k.ibc2), V::set(k.eps));
    pr = V::fma(V::set(k.decay), pr, pr);
    pr = V::fma(V::set(k.step), V::div(mr, den), pr);
    V::store(m + i, mr);
    V::store(v + i, vr);
    return pr;
}

// Adam in the order of torch.optim.Adam/AdamW (the single-tensor path that
// PyTorch takes on the CPU, 1.13, whose AVX2 kernels fuse the multiply-adds
// marked F):
//   AdamW: p.mul_(1 - lr wd)                       p = p * keep
//   Adam:  grad = grad.add(p, alpha=wd)            g = F(p, wd, g)
//   exp_avg.mul_(b1).add_(g, alpha=1-b1)           m = F(1-b1, g, b1 m)
//   exp_avg_sq.mul_(b2).addcmul_(g, g, value=1-b2) v = F((1-b2) g, g, b2 v)
//   denom = (v.sqrt() / sqrt(bc2)).add_(eps)       den = sqrt(v) / bc2s + eps
//   p.addcdiv_(m, denom, value=-lr/bc1)            p = p + (step m) / den
// Every other operation is rounded on its own; apart() keeps the compiler
// from fusing p * keep into the last add.
template <class V>
inline typename V::R adam_torch_at(const AdamK &k, float *p, typename V::R graw, float *m, float *v, size_t i) {
    using R = typename V::R;
    const R p0 = V::load(p + i);
    R gr = V::mul(graw, V::set(k.scale));
    gr = V::fused(p0, V::set(k.l2), gr);
    const R mr = V::fused(V::set(k.omb1), gr, V::mul(V::set(k.b1), V::load(m + i)));
    const R vr = V::fused(V::mul(V::set(k.omb2), gr), gr, V::mul(V::set(k.b2), V::load(v + i)));
    const R den = V::add(V::div(V::sqrt(vr), V::set(k.bc2s)), V::set(k.eps));
    const R pk = V::apart(V::mul(p0, V::set(k.keep)));
    V::store(m + i, mr);
    V::store(v + i, vr);
    return V::add(pk, V::div(V::mul(V::set(k.step), mr), den));
}

// The bodies hold copies of the constants: stores through p, m, v cannot
// alias a local copy, so the compiler keeps them in registers.
// Adam's division and square root keep the core busy long enough that the
// out-of-order window no longer reaches far ahead in memory: the vector
// bodies prefetch kAhead elements ahead (a prefetch never faults, past the
// end included), so that memory keeps streaming while they compute.
constexpr size_t kAhead = 1024;
template <class V> inline void ahead(const void *x, size_t bytes_per_elem, size_t i) {
    if (V::W > 1) __builtin_prefetch(static_cast<const char *>(x) + (i + kAhead) * bytes_per_elem, 1, 3);
}

template <bool ZeroG, bool Torch> struct AdamBody {
    const AdamK k;
    float *p;
    const float *g;
    float *m, *v;
    template <class V> void at(size_t i) const {
        ahead<V>(p, 4, i);
        ahead<V>(g, 4, i);
        ahead<V>(m, 4, i);
        ahead<V>(v, 4, i);
        V::store(p + i, Torch ? adam_torch_at<V>(k, p, V::load(g + i), m, v, i)
                              : adam_at<V>(k, p, V::load(g + i), m, v, i));
        if (ZeroG) V::store(const_cast<float *>(g) + i, V::set(0.0f));
    }
};

template <bool ZeroG, bool Torch> struct AdamBf16Body {
    const AdamK k;
    float *p;
    uint16_t *g;
    float *m, *v;
    uint16_t *p16;
    template <class V> void at(size_t i) const {
        ahead<V>(p, 4, i);
        ahead<V>(g, 2, i);
        ahead<V>(m, 4, i);
        ahead<V>(v, 4, i);
        ahead<V>(p16, 2, i);
        const auto pr = Torch ? adam_torch_at<V>(k, p, V::bload(g + i), m, v, i)
                              : adam_at<V>(k, p, V::bload(g + i), m, v, i);
        V::store(p + i, pr);
        V::bstore(p16 + i, pr);
        if (ZeroG) V::bstore(g + i, V::set(0.0f));
    }
};

template <int Mode> struct SgdBody {
    const SgdK k;
    float *p;
    const float *g;
    float *buf;
    template <class V> void at(size_t i) const {
        using R = typename V::R;
        R pr = V::load(p + i);
        R gr = V::fma(V::set(k.wd), pr, V::mul(V::load(g + i), V::set(k.scale)));
        if (Mode > 0) {
            const R br = V::fma(V::set(k.damp), gr, V::mul(V::set(k.mom), V::load(buf + i)));
            V::store(buf + i, br);
            gr = Mode == 2 ? V::fma(V::set(k.nesterov), br, gr) : br;
        }
        V::store(p + i, V::fma(V::set(k.neg_lr), gr, pr));
    }
};

struct LionBody {
    const LionK k;
    float *p;
    const float *g;
    float *m;
    template <class V> void at(size_t i) const {
        using R = typename V::R;
        const R gr = V::mul(V::load(g + i), V::set(k.scale));
        const R mr = V::load(m + i);
        const R c = V::fma(V::set(k.omb1), gr, V::mul(V::set(k.b1), mr));
        const R pr = V::fma(V::load(p + i), V::set(k.keep), V::mul(V::set(k.neg_lr), V::sign(c)));
        V::store(p + i, pr);
        V::store(m + i, V::fma(V::set(k.omb2), gr, V::mul(V::set(k.b2), mr)));
    }
};

struct AdagradBody {
    const AdagradK k;
    float *p;
    const float *g;
    float *sum;
    template <class V> void at(size_t i) const {
        using R = typename V::R;
        const R pr = V::load(p + i);
        const R gr = V::fma(V::set(k.wd), pr, V::mul(V::load(g + i), V::set(k.scale)));
        const R sr = V::fma(gr, gr, V::load(sum + i));
        const R den = V::add(V::sqrt(sr), V::set(k.eps));
        V::store(p + i, V::fma(V::set(k.neg_clr), V::div(gr, den), pr));
        V::store(sum + i, sr);
    }
};

// Lamb's u, shared by both passes so that pass 2 applies exactly the u whose
// norm pass 1 measured.
template <class V>
inline typename V::R lamb_u(const LambK &k, typename V::R pr, typename V::R mr, typename V::R vr) {
    const auto den = V::add(V::sqrt(vr), V::set(k.eps));
    return V::fma(V::set(k.wd), pr, V::div(mr, den));
}

// Pass 1 keeps one fp64 accumulator pair per lane width: the tail's pair is
// separate and added last, so the order of additions is fixed by n alone.
template <class V>
inline void lamb1_run(const LambK &k, const float *p, const float *g, float *m, float *v, size_t n,
                      double *sums) {
    typename V::D w2 = V::dzero(), u2 = V::dzero();
    size_t i = 0;
    for (; i + V::W <= n; i += V::W) {
        const auto pr = V::load(p + i);
        const auto gr = V::mul(V::load(g + i), V::set(k.scale));
        const auto mr = V::fma(V::set(k.omb1), gr, V::mul(V::set(k.b1), V::load(m + i)));
        const auto vr = V::fma(V::set(k.omb2), V::mul(gr, gr), V::mul(V::set(k.b2), V::load(v + i)));
        V::store(m + i, mr);
        V::store(v + i, vr);
        w2 = V::dacc(w2, pr);
        u2 = V::dacc(u2, lamb_u<V>(k, pr, mr, vr));
    }
    double w = V::dsum(w2), u = V::dsum(u2);
    if (V::W > 1) {
        double tw = 0.0, tu = 0.0;
        for (; i < n; ++i) {
            double s[2] = {0.0, 0.0};
            lamb1_run<Scalar>(k, p + i, g + i, m + i, v + i, 1, s);
            tw += s[0];
            tu += s[1];
        }
        w += tw;
        u += tu;
    }
    sums[0] += w;
    sums[1] += u;
}

struct Lamb2Body {
    const LambK k;
    float neg_coef;
    float *p;
    const float *m, *v;
    template <class V> void at(size_t i) const {
        const auto pr = V::load(p + i);
        const auto u = lamb_u<V>(k, pr, V::load(m + i), V::load(v + i));
        V::store(p + i, V::fma(V::set(neg_coef), u, pr));
    }
};

struct WidenBody {
    const uint16_t *h;
    float *f;
    template <class V> void at(size_t i) const { V::store(f + i, V::bload(h + i)); }
};

struct NarrowBody {
    const float *f;
    uint16_t *h;
    template <class V> void at(size_t i) const { V::bstore(h + i, V::load(f + i)); }
};

// The Kernels table of the traits type V.
template <class V> struct KernelSet {
    static void adam(const AdamK &k, float *p, const float *g, float *m, float *v, size_t n) {
        if (k.torch) sweep<V>(n, AdamBody<false, true>{k, p, g, m, v});
        else sweep<V>(n, AdamBody<false, false>{k, p, g, m, v});
    }
    static void adam_zero(const AdamK &k, float *p, float *g, float *m, float *v, size_t n) {
        if (k.torch) sweep<V>(n, AdamBody<true, true>{k, p, g, m, v});
        else sweep<V>(n, AdamBody<true, false>{k, p, g, m, v});
    }
    static void adam_bf16(const AdamK &k, float *p, uint16_t *g, float *m, float *v, uint16_t *p16, size_t n,
                          bool zero_g) {
        if (k.torch && zero_g) sweep<V>(n, AdamBf16Body<true, true>{k, p, g, m, v, p16});
        else if (k.torch) sweep<V>(n, AdamBf16Body<false, true>{k, p, g, m, v, p16});
        else if (zero_g) sweep<V>(n, AdamBf16Body<true, false>{k, p, g, m, v, p16});
        else sweep<V>(n, AdamBf16Body<false, false>{k, p, g, m, v, p16});
    }
    static void sgd(const SgdK &k, float *p, const float *g, float *buf, size_t n) {
        if (k.mode == 0)
            sweep<V>(n, SgdBody<0>{k, p, g, buf});
        else if (k.mode == 1)
            sweep<V>(n, SgdBody<1>{k, p, g, buf});
        else
            sweep<V>(n, SgdBody<2>{k, p, g, buf});
    }
    static void lion(const LionK &k, float *p, const float *g, float *m, size_t n) {
        sweep<V>(n, LionBody{k, p, g, m});
    }
    static void adagrad(const AdagradK &k, float *p, const float *g, float *sum, size_t n) {
        sweep<V>(n, AdagradBody{k, p, g, sum});
    }
    static void lamb1(const LambK &k, const float *p, const float *g, float *m, float *v, size_t n,
                      double *sums) {
        lamb1_run<V>(k, p, g, m, v, n, sums);
    }
    static void lamb2(const LambK &k, float neg_coef, float *p, const float *m, const float *v,
                      size_t n) {
        sweep<V>(n, Lamb2Body{k, neg_coef, p, m, v});
    }
    static void bf16_to_f32(const uint16_t *h, float *f, size_t n) { sweep<V>(n, WidenBody{h, f}); }
    static void f32_to_bf16(const float *f, uint16_t *h, size_t n) { sweep<V>(n, NarrowBody{f, h}); }
    static const Kernels *table(const char *name) noexcept {
        static const Kernels t{name, adam, adam_zero, adam_bf16, sgd, lion, adagrad, lamb1, lamb2, bf16_to_f32,
                               f32_to_bf16};
        return &t;
    }
};

} // namespace
} // namespace optim
} // namespace dsm
#endif // DSM_OPTIM_KERNEL_BODIES
