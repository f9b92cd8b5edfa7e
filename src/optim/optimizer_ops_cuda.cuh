// The optimizers' element operations on the device (optimizer_cuda.cu's
// update kernels, reduce_cuda.cu's Lamb pass 1), each the body of the same
// name in optim/kernels.hpp operation for operation.
#pragma once

#include "optim/kernels_cuda_common.cuh"

namespace dsm {
namespace cuda {
namespace {

// One element: p, the gradient g (already widened to fp32, not yet scaled)
// and up to two states. Each mirrors the body of the same name in
// optim/kernels.hpp operation for operation.

struct AdamOp {
    static constexpr bool kGrad = true, kWriteStates = true;
    static constexpr int kStates = 2;
    optim::AdamK k;
    __device__ void operator()(float &p, float g, float &m, float &v) const {
        if (k.torch) {
            torch_order(p, g, m, v);
            return;
        }
        float gr = mul(g, k.scale);
        gr = mad(k.l2, p, gr);
        const float mr = mad(k.omb1, gr, mul(k.b1, m));
        const float vr = mad(k.omb2, mul(gr, gr), mul(k.b2, v));
        const float den = mad(root(vr), k.ibc2, k.eps);
        float pr = mad(k.decay, p, p);
        pr = mad(k.step, div(mr, den), pr);
        p = pr;
        m = mr;
        v = vr;
    }
    // adam_torch_at: PyTorch's order (the intrinsics are never contracted,
    // so p * keep is rounded before the add without more ado).
    __device__ void torch_order(float &p, float g, float &m, float &v) const {
        float gr = mul(g, k.scale);
        gr = fused(p, k.l2, gr);
        const float mr = fused(k.omb1, gr, mul(k.b1, m));
        const float vr = fused(mul(k.omb2, gr), gr, mul(k.b2, v));
        const float den = add(div(root(vr), k.bc2s), k.eps);
        p = add(mul(p, k.keep), div(mul(k.step, mr), den));
        m = mr;
        v = vr;
    }
};

template <int Mode> struct SgdOp {
    static constexpr bool kGrad = true, kWriteStates = true;
    static constexpr int kStates = Mode > 0 ? 1 : 0;
    optim::SgdK k;
    __device__ void operator()(float &p, float g, float &buf, float &) const {
        float gr = mad(k.wd, p, mul(g, k.scale));
        if constexpr (Mode > 0) {
            const float br = mad(k.damp, gr, mul(k.mom, buf));
            buf = br;
            gr = Mode == 2 ? mad(k.nesterov, br, gr) : br;
        }
        p = mad(k.neg_lr, gr, p);
    }
};

struct LionOp {
    static constexpr bool kGrad = true, kWriteStates = true;
    static constexpr int kStates = 1;
    optim::LionK k;
    __device__ void operator()(float &p, float g, float &m, float &) const {
        const float gr = mul(g, k.scale);
        const float mr = m;
        const float c = mad(k.omb1, gr, mul(k.b1, mr));
        p = mad(p, k.keep, mul(k.neg_lr, signum(c)));
        m = mad(k.omb2, gr, mul(k.b2, mr));
    }
};

struct AdagradOp {
    static constexpr bool kGrad = true, kWriteStates = true;
    static constexpr int kStates = 1;
    optim::AdagradK k;
    __device__ void operator()(float &p, float g, float &sum, float &) const {
        const float gr = mad(k.wd, p, mul(g, k.scale));
        const float sr = mad(gr, gr, sum);
        const float den = add(root(sr), k.eps);
        p = mad(k.neg_clr, div(gr, den), p);
        sum = sr;
    }
};

// Lamb's u, as lamb_u() of optim/kernels.hpp.
__device__ __forceinline__ float lamb_u(const optim::LambK &k, float p, float m, float v) {
    const float den = add(root(v), k.eps);
    return mad(k.wd, p, div(m, den));
}

struct Lamb2Op {
    static constexpr bool kGrad = false, kWriteStates = false; // reads m and v
    static constexpr int kStates = 2;
    optim::LambK k;
    float neg_coef;
    __device__ void operator()(float &p, float, float &m, float &v) const {
        p = mad(neg_coef, lamb_u(k, p, m, v), p);
    }
};


} // namespace
} // namespace cuda
} // namespace dsm
