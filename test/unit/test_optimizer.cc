// CPU optimizers against plain double-precision references written here
// from the formulas (PyTorch/DeepSpeed, see optimizer.hpp), over several
// steps with changing lr, beta1 and grad_scale, awkward sizes, segments with
// and without decay and padding between them; on every instruction set this
// CPU has, where 1, 2 and 3 threads must give bit-identical results.
#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "config/config.hpp"
#include "config/settings.hpp"
#include "core/error.hpp"
#include "core/simd.hpp"
#include "core/half.hpp"
#include "dsm.h"
#include "optim/optimizer.hpp"

#include "cxx_test.h" // last: CMocka's fail() macro would break the C++ headers

using dsm::config::OptimizerType;
using dsm::optim::Hyper;
using dsm::optim::Optimizer;
using dsm::optim::Segment;
using dsm::optim::StepArgs;

namespace {

// ---------------------------------------------------------------- data

// Deterministic uniform floats in [-1, 1).
struct Rng {
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
    float next() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        return static_cast<float>(static_cast<double>(s >> 40) / 8388608.0 - 1.0);
    }
};

std::vector<float> random_vec(size_t n, uint64_t seed, float scale = 1.0f) {
    Rng r(seed);
    std::vector<float> v(n);
    for (auto &x : v) x = scale * r.next();
    return v;
}

Segment seg(size_t offset, size_t count, int param, bool decay) {
    Segment s;
    s.offset = offset;
    s.count = count;
    s.param = param;
    s.decay = decay;
    return s;
}

// Segments with gaps (padding) and both decay settings; the large one crosses
// many 16K chunks and ends inside a SIMD vector.
std::vector<Segment> segments_for(size_t n) {
    switch (n) {
    case 1: return {seg(0, 1, 0, true)};
    case 7: return {seg(0, 3, 0, true), seg(4, 3, 1, false)};
    case 17: return {seg(1, 8, 0, true), seg(9, 7, 1, false)};
    default: return {seg(0, n / 2, 0, true), seg(n / 2 + 16, n - n / 2 - 16, 1, false)};
    }
}

const size_t kSizes[] = {1, 7, 17, 1000003};

// Three steps with changing lr, betas (OneCycle: the second step sets beta2
// as DeepSpeed's OneCycle does) and grad_scale.
std::vector<StepArgs> three_steps(double lr = 1e-2) {
    std::vector<StepArgs> v(3);
    const double lrs[] = {lr, 0.8 * lr, 0.6 * lr}, b1[] = {0.9, 0.85, 0.9};
    const float scale[] = {1.0f, 0.5f, 0.25f};
    for (int i = 0; i < 3; ++i) {
        v[i].step = i + 1;
        v[i].lr = lrs[i];
        v[i].beta1 = b1[i];
        v[i].grad_scale = scale[i];
    }
    v[1].beta2 = 0.99;
    return v;
}

// ---------------------------------------------------------------- references

// StepArgs::beta2 overrides Hyper::beta2 when set (OneCycle).
double b2(const Hyper &h, const StepArgs &a) { return a.beta2 >= 0 ? a.beta2 : h.beta2; }

struct RefState {
    std::vector<double> p, s0, s1;
    std::vector<char> skip;     // Lion: p not compared where fp32 may round sign(c) differently
    std::vector<double> ratio;  // Lamb: last step's trust ratio per parameter
    std::vector<double> sums;   // Lamb: last step's [sum p^2, sum u^2] per parameter
};

using RefStep = void (*)(const Hyper &, const StepArgs &, const std::vector<Segment> &,
                         const std::vector<float> &, RefState &);

double bias(double beta, int64_t step, bool on) { return on ? 1.0 - std::pow(beta, (double)step) : 1.0; }

double grad(const std::vector<float> &g, size_t i, const StepArgs &a) { return (double)g[i] * a.grad_scale; }

void ref_adam(const Hyper &h, const StepArgs &a, const std::vector<Segment> &segs, const std::vector<float> &g,
              RefState &r) {
    const double bc1 = bias(a.beta1, a.step, h.bias_correction), bc2 = bias(b2(h, a), a.step, h.bias_correction);
    for (const Segment &s : segs)
        for (size_t i = s.offset; i < s.offset + s.count; ++i) {
            const double wd = s.decay ? h.weight_decay : 0.0;
            double &p = r.p[i], &m = r.s0[i], &v = r.s1[i];
            double gi = grad(g, i, a);
            if (!h.adam_w_mode) gi += wd * p;
            m = a.beta1 * m + (1 - a.beta1) * gi;
            v = b2(h, a) * v + (1 - b2(h, a)) * gi * gi;
            const double u = (m / bc1) / (std::sqrt(v / bc2) + h.eps);
            p -= a.lr * (u + (h.adam_w_mode ? wd * p : 0.0));
        }
}

void ref_sgd(const Hyper &h, const StepArgs &a, const std::vector<Segment> &segs, const std::vector<float> &g,
             RefState &r) {
    for (const Segment &s : segs)
        for (size_t i = s.offset; i < s.offset + s.count; ++i) {
            double &p = r.p[i], &buf = r.s0[i];
            double gi = grad(g, i, a) + (s.decay ? h.weight_decay : 0.0) * p;
            if (h.momentum != 0.0) {
                buf = a.step == 1 ? gi : h.momentum * buf + (1 - h.dampening) * gi;
                gi = h.nesterov ? gi + h.momentum * buf : buf;
            }
            p -= a.lr * gi;
        }
}

void ref_lamb(const Hyper &h, const StepArgs &a, const std::vector<Segment> &segs, const std::vector<float> &g,
              RefState &r) {
    auto u_at = [&](const Segment &s, size_t i) {
        return r.s0[i] / (std::sqrt(r.s1[i]) + h.eps) + (s.decay ? h.weight_decay : 0.0) * r.p[i];
    };
    std::map<int, std::pair<double, double>> norms;
    for (const Segment &s : segs)
        for (size_t i = s.offset; i < s.offset + s.count; ++i) {
            const double gi = grad(g, i, a);
            r.s0[i] = a.beta1 * r.s0[i] + (1 - a.beta1) * gi;
            r.s1[i] = b2(h, a) * r.s1[i] + (1 - b2(h, a)) * gi * gi;
            const double u = u_at(s, i);
            norms[s.param].first += r.p[i] * r.p[i];
            norms[s.param].second += u * u;
        }
    const double step_size = h.bias_correction
                                 ? a.lr * std::sqrt(bias(b2(h, a), a.step, true)) / bias(a.beta1, a.step, true)
                                 : a.lr;
    r.ratio.assign(norms.empty() ? 0 : (size_t)norms.rbegin()->first + 1, 0.0);
    r.sums.assign(2 * r.ratio.size(), 0.0);
    for (const auto &[param, n2] : norms) {
        const double w = std::sqrt(n2.first), u = std::sqrt(n2.second);
        double ratio = 1.0;
        if (w > 0 && u > 0) ratio = std::min(std::max(w / u, h.min_coeff), h.max_coeff);
        r.ratio[(size_t)param] = ratio;
        r.sums[2 * (size_t)param] = n2.first;
        r.sums[2 * (size_t)param + 1] = n2.second;
    }
    for (const Segment &s : segs)
        for (size_t i = s.offset; i < s.offset + s.count; ++i)
            r.p[i] -= step_size * r.ratio[(size_t)s.param] * u_at(s, i);
}

void ref_lion(const Hyper &h, const StepArgs &a, const std::vector<Segment> &segs, const std::vector<float> &g,
              RefState &r) {
    for (const Segment &s : segs)
        for (size_t i = s.offset; i < s.offset + s.count; ++i) {
            double &p = r.p[i], &m = r.s0[i];
            const double gi = grad(g, i, a);
            const double c = a.beta1 * m + (1 - a.beta1) * gi;
            if (c != 0.0 && std::fabs(c) < 1e-5) r.skip[i] = 1;
            const double sign = (c > 0) - (c < 0);
            p -= a.lr * (sign + (s.decay ? h.weight_decay : 0.0) * p);
            m = b2(h, a) * m + (1 - b2(h, a)) * gi;
        }
}

void ref_adagrad(const Hyper &h, const StepArgs &a, const std::vector<Segment> &segs,
                 const std::vector<float> &g, RefState &r) {
    const double clr = a.lr / (1 + (double)(a.step - 1) * h.lr_decay);
    for (const Segment &s : segs)
        for (size_t i = s.offset; i < s.offset + s.count; ++i) {
            double &p = r.p[i], &sum = r.s0[i];
            const double gi = grad(g, i, a) + (s.decay ? h.weight_decay : 0.0) * p;
            sum += gi * gi;
            p -= clr * gi / (std::sqrt(sum) + h.eps);
        }
}

// ---------------------------------------------------------------- harness

struct Case {
    Hyper h;
    size_t n = 0;
    std::vector<Segment> segs;
    std::vector<StepArgs> steps;
    RefStep ref = nullptr;
    // Optional: reshape the random start values and gradients.
    std::function<void(std::vector<float> &p0, std::vector<std::vector<float>> &grads)> tweak;
};

struct Inputs {
    std::vector<float> p0;
    std::vector<std::vector<float>> grads;
};

struct Result {
    std::vector<float> p;
    std::vector<std::vector<float>> states;
    std::vector<double> sums; // Lamb: what the last step passed to `sum`
};

Inputs inputs_for(const Case &c) {
    Inputs in;
    in.p0 = random_vec(c.n, 1000 + c.n);
    for (size_t s = 0; s < c.steps.size(); ++s) in.grads.push_back(random_vec(c.n, 7 * s + c.n, 0.5f));
    if (c.tweak) c.tweak(in.p0, in.grads);
    return in;
}

float initial_state(const Hyper &h) {
    return h.type == OptimizerType::ADAGRAD ? (float)h.initial_accumulator_value : 0.0f;
}

Result run_opt(const Case &c, const Inputs &in) {
    Optimizer opt(c.h, c.n);
    Result r;
    r.p = in.p0;
    dsm::optim::SumFn keep = [&r](std::vector<double> &v) { r.sums = v; };
    for (size_t s = 0; s < c.steps.size(); ++s) opt.step(r.p.data(), in.grads[s].data(), c.segs, c.steps[s], keep);
    for (int i = 0; i < opt.num_states(); ++i)
        r.states.emplace_back(opt.state(i), opt.state(i) + c.n);
    return r;
}

RefState run_ref(const Case &c, const Inputs &in) {
    RefState r;
    r.p.assign(in.p0.begin(), in.p0.end());
    r.s0.assign(c.n, initial_state(c.h));
    r.s1.assign(c.n, 0.0);
    r.skip.assign(c.n, 0);
    for (size_t s = 0; s < c.steps.size(); ++s) c.ref(c.h, c.steps[s], c.segs, in.grads[s], r);
    return r;
}

// |got - want| <= 2e-5 |want| + 1e-7 everywhere (fp32 against fp64 over a few steps).
void expect_close(const char *what, const std::vector<float> &got, const std::vector<double> &want,
                  const std::vector<char> *skip, const std::string &ctx) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        if (skip && (*skip)[i]) continue;
        if (!(std::fabs((double)got[i] - want[i]) <= 2e-5 * std::fabs(want[i]) + 1e-7)) {
            if (bad++ == 0) first = i;
        }
    }
    if (bad)
        fail_msg("%s: %s: %zu of %zu differ, first [%zu] got %.9g want %.9g", ctx.c_str(), what, bad, got.size(),
                 first, (double)got[first], want[first]);
}

std::vector<double> widen(const std::vector<float> &v) { return std::vector<double>(v.begin(), v.end()); }

bool same_bits(const std::vector<float> &a, const std::vector<float> &b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<std::string> available_isas() {
    std::vector<std::string> out;
    for (const char *name : {"generic", "avx2", "avx512"}) {
        try {
            dsm::simd::force(name);
            out.push_back(name);
        } catch (const dsm::Error &e) {
            assert_int_equal(e.status(), DSM_ERR_NOT_SUPPORTED);
        }
    }
    dsm::simd::force("auto");
    return out;
}

// Every ISA x threads 1, 2, 3 against the reference; threads bit-identical;
// padding untouched; ISAs close to the generic result.
void check_case(const Case &c, const char *name) {
    const Inputs in = inputs_for(c);
    const RefState ref = run_ref(c, in);
    std::vector<char> covered(c.n, 0);
    for (const Segment &s : c.segs) std::fill(covered.begin() + s.offset, covered.begin() + s.offset + s.count, 1);
    Result generic;
    for (const std::string &isa : available_isas()) {
        dsm::simd::force(isa);
        Result first;
        for (int threads : {1, 2, 3}) {
            dsm::optim::set_num_threads(threads);
            const std::string ctx = std::string(name) + " n=" + std::to_string(c.n) + " isa=" + isa +
                                    " threads=" + std::to_string(threads);
            Result r = run_opt(c, in);
            if (threads == 1) {
                expect_close("p", r.p, ref.p, &ref.skip, ctx);
                // SGD without momentum keeps no state at all.
                assert_int_equal(r.states.size(), dsm::optim::state_count(c.h));
                if (!r.states.empty()) expect_close("state 0", r.states[0], ref.s0, nullptr, ctx);
                if (r.states.size() > 1) expect_close("state 1", r.states[1], ref.s1, nullptr, ctx);
                for (size_t i = 0; i < c.n; ++i) {
                    if (covered[i]) continue;
                    if (std::memcmp(&r.p[i], &in.p0[i], sizeof(float)) != 0)
                        fail_msg("%s: padding p[%zu] changed", ctx.c_str(), i);
                    for (const auto &s : r.states)
                        if (s[i] != initial_state(c.h)) fail_msg("%s: padding state[%zu] changed", ctx.c_str(), i);
                }
                if (isa == "generic") {
                    generic = r;
                } else {
                    expect_close("p vs generic", r.p, widen(generic.p), &ref.skip, ctx);
                    for (size_t s = 0; s < r.states.size(); ++s)
                        expect_close("state vs generic", r.states[s], widen(generic.states[s]), nullptr, ctx);
                }
                first = std::move(r);
                continue;
            }
            if (!same_bits(r.p, first.p)) fail_msg("%s: p differs from 1 thread", ctx.c_str());
            for (size_t s = 0; s < r.states.size(); ++s)
                if (!same_bits(r.states[s], first.states[s]))
                    fail_msg("%s: state %zu differs from 1 thread", ctx.c_str(), s);
        }
    }
    dsm::simd::force("auto");
    dsm::optim::set_num_threads(0);
}

Hyper hyper(OptimizerType type) {
    Hyper h;
    h.type = type;
    h.beta2 = type == OptimizerType::LION ? 0.99 : 0.999;
    h.weight_decay = 0.01;
    return h;
}

void check_all_sizes(const Hyper &h, RefStep ref, const char *name, double lr = 1e-2) {
    for (size_t n : kSizes) {
        Case c;
        c.h = h;
        c.n = n;
        c.segs = segments_for(n);
        c.steps = three_steps(lr);
        c.ref = ref;
        check_case(c, name);
    }
}

} // namespace

// ---------------------------------------------------------------- Adam

static void test_adam_l2(void **) {
    Hyper h = hyper(OptimizerType::ADAM);
    h.adam_w_mode = false;
    check_all_sizes(h, ref_adam, "adam L2");
}

static void test_adamw(void **) { check_all_sizes(hyper(OptimizerType::ADAMW), ref_adam, "adamw"); }

static void test_adamw_no_bias_correction(void **) {
    Hyper h = hyper(OptimizerType::ADAMW);
    h.bias_correction = false;
    h.eps = 1e-6;
    check_all_sizes(h, ref_adam, "adamw no bias correction");
}

// The free adam_update() is the same kernel as a one-segment step.
static void test_adam_update_matches_step(void **) {
    const size_t n = 40000;
    const Hyper h = hyper(OptimizerType::ADAMW);
    const std::vector<float> p0 = random_vec(n, 1), g = random_vec(n, 2);
    std::vector<float> p1 = p0, p2 = p0, m(n, 0.0f), v(n, 0.0f);
    StepArgs a;
    a.lr = 1e-2;
    a.grad_scale = 0.5f;
    Optimizer opt(h, n);
    for (int s = 1; s <= 2; ++s) {
        a.step = s;
        dsm::optim::adam_update(p1.data(), g.data(), m.data(), v.data(), n, h, a, true);
        opt.step(p2.data(), g.data(), {seg(0, n, 0, true)}, a);
    }
    assert_true(same_bits(p1, p2));
    assert_memory_equal(m.data(), opt.state(0), n * sizeof(float));
    assert_memory_equal(v.data(), opt.state(1), n * sizeof(float));
}

// torch_adam: torch.optim.Adam/AdamW's order of operations and roundings,
// the bits of this scalar reference written in that order (PyTorch 1.13's
// single-tensor path on the CPU; F is one rounding, as its AVX2 kernels):
//   AdamW: p.mul_(1 - lr wd); Adam: g = g.add(p, alpha=wd)    (F)
//   m.mul_(b1).add_(g, alpha=1-b1)                            (F)
//   v.mul_(b2).addcmul_(g, g, value=1-b2)                     (F: ((1-b2) g) g + b2 v)
//   den = (v.sqrt() / sqrt(bc2)).add_(eps)
//   p.addcdiv_(m, den, value=-lr/bc1)                         p + ((-lr/bc1) m) / den
float apart(float x) {
    volatile float y = x; // never fused into the add that follows
    return y;
}

void ref_adam_torch(const Hyper &h, const StepArgs &a, const std::vector<Segment> &segs,
                    const std::vector<float> &g, std::vector<float> &p, std::vector<float> &m, std::vector<float> &v) {
    const double bc1 = bias(a.beta1, a.step, h.bias_correction), bc2 = bias(b2(h, a), a.step, h.bias_correction);
    const float b1f = (float)a.beta1, omb1 = (float)(1 - a.beta1), b2f = (float)b2(h, a), omb2 = (float)(1 - b2(h, a));
    const float step_size = (float)(-(a.lr / bc1)), bc2s = (float)std::sqrt(bc2), eps = (float)h.eps;
    for (const Segment &s : segs) {
        const double wd = s.decay ? h.weight_decay : 0.0;
        const float keep = h.adam_w_mode ? (float)(1 - a.lr * wd) : 1.0f, l2 = h.adam_w_mode ? 0.0f : (float)wd;
        for (size_t i = s.offset; i < s.offset + s.count; ++i) {
            float gi = g[i] * a.grad_scale;
            gi = std::fma(p[i], l2, gi);
            const float pk = apart(p[i] * keep);
            m[i] = std::fma(omb1, gi, b1f * m[i]);
            v[i] = std::fma(omb2 * gi, gi, b2f * v[i]);
            const float den = std::sqrt(v[i]) / bc2s + eps;
            p[i] = pk + (step_size * m[i]) / den;
        }
    }
}

// Adam and AdamW with torch_adam against ref_adam_torch, bit for bit, on
// every ISA with 1 and 2 threads: the plain step, the fused fp32 step
// (zeroing g) and the fused bf16 step; three steps with changing lr, betas
// and grad_scale, segments with and without decay, tails of every vector
// width. DeepSpeed's order (the default) gives other bits.
static void test_adam_torch_order(void **) {
    const size_t n = 2 * Optimizer::grain() + 16 * 7 + 13;
    const std::vector<Segment> segs = {seg(0, 20011, 0, true), seg(20016, n - 20016 - 3, 1, false)};
    const std::vector<StepArgs> steps = three_steps();
    std::vector<std::vector<float>> grads;
    std::vector<std::vector<uint16_t>> grads16;
    for (size_t s = 0; s < steps.size(); ++s) {
        std::vector<float> gs = random_vec(n, 11 + s, 0.5f);
        grads16.emplace_back(n);
        for (size_t i = 0; i < n; ++i) {
            grads16[s][i] = dsm::fp32_to_bf16(gs[i]);
            gs[i] = dsm::bf16_to_fp32(grads16[s][i]); // bf16 values: the bf16 pass sees the same gradients
        }
        grads.push_back(std::move(gs));
    }
    const std::vector<float> p0 = random_vec(n, 5);
    for (bool w_mode : {false, true}) {
        Hyper h = hyper(w_mode ? OptimizerType::ADAMW : OptimizerType::ADAM);
        h.adam_w_mode = w_mode;
        h.torch_adam = true;
        std::vector<float> rp = p0, rm(n, 0.0f), rv(n, 0.0f);
        for (size_t s = 0; s < steps.size(); ++s) ref_adam_torch(h, steps[s], segs, grads[s], rp, rm, rv);
        for (const std::string &isa : available_isas()) {
            dsm::simd::force(isa);
            for (int threads : {1, 2}) {
                dsm::optim::set_num_threads(threads);
                const std::string ctx = std::string(w_mode ? "adamw" : "adam L2") + " torch_adam isa=" + isa +
                                        " threads=" + std::to_string(threads);
                Optimizer plain(h, n), f32(h, n), bf(h, n), deepspeed(hyper(h.type), n);
                std::vector<float> pp = p0, pf = p0, pb = p0, pd = p0;
                for (size_t s = 0; s < steps.size(); ++s) {
                    plain.step(pp.data(), grads[s].data(), segs, steps[s]);
                    std::vector<float> gf = grads[s];
                    dsm::optim::Fused ff;
                    ff.zero_grads = true;
                    f32.step(pf.data(), gf.data(), segs, steps[s], {}, &ff);
                    std::vector<uint16_t> gb = grads16[s], pb16(n);
                    dsm::optim::Fused fb;
                    fb.grad16 = gb.data();
                    fb.param16 = pb16.data();
                    fb.dtype = DSM_BFLOAT16;
                    fb.zero_grads = true;
                    bf.step(pb.data(), nullptr, segs, steps[s], {}, &fb);
                    deepspeed.step(pd.data(), grads[s].data(), segs, steps[s]);
                }
                const std::pair<const char *, const Optimizer *> opts[] = {{"plain", &plain}, {"fp32", &f32}, {"bf16", &bf}};
                const std::vector<float> *ps[] = {&pp, &pf, &pb};
                for (int o = 0; o < 3; ++o) {
                    for (size_t i = 0; i < n; ++i) {
                        const float got[3] = {(*ps[o])[i], opts[o].second->state(0)[i], opts[o].second->state(1)[i]};
                        const float want[3] = {rp[i], rm[i], rv[i]};
                        for (int k = 0; k < 3; ++k)
                            if (std::memcmp(&got[k], &want[k], 4) != 0)
                                fail_msg("%s %s: %s[%zu] = %.9g, PyTorch's order gives %.9g", ctx.c_str(), opts[o].first,
                                         k == 0 ? "p" : k == 1 ? "exp_avg" : "exp_avg_sq", i, (double)got[k],
                                         (double)want[k]);
                    }
                }
                if (same_bits(pd, rp)) fail_msg("%s: DeepSpeed's order gives PyTorch's bits", ctx.c_str());
            }
        }
    }
    dsm::simd::force("auto");
    dsm::optim::set_num_threads(0);
}

// ---------------------------------------------------------------- SGD

static void test_sgd_plain(void **) {
    Hyper h = hyper(OptimizerType::SGD);
    h.weight_decay = 0.0;
    check_all_sizes(h, ref_sgd, "sgd plain", 0.1);
    // No momentum: no momentum_buffer (torch.optim.SGD keeps none either).
    assert_true(h.momentum == 0.0);
    assert_int_equal(Optimizer(h, 100).num_states(), 0);
    h.momentum = 0.5;
    assert_int_equal(Optimizer(h, 100).num_states(), 1);
}

static void test_sgd_momentum_dampening(void **) {
    Hyper h = hyper(OptimizerType::SGD);
    h.momentum = 0.9;
    h.dampening = 0.1;
    check_all_sizes(h, ref_sgd, "sgd momentum dampening", 0.1);
}

static void test_sgd_nesterov(void **) {
    Hyper h = hyper(OptimizerType::SGD);
    h.momentum = 0.9;
    h.nesterov = true;
    h.weight_decay = 0.05;
    check_all_sizes(h, ref_sgd, "sgd nesterov", 0.1);
}

// ---------------------------------------------------------------- Lamb

static void test_lamb(void **) { check_all_sizes(hyper(OptimizerType::LAMB), ref_lamb, "lamb"); }

static void test_lamb_no_bias_correction(void **) {
    Hyper h = hyper(OptimizerType::LAMB);
    h.bias_correction = false;
    check_all_sizes(h, ref_lamb, "lamb no bias correction");
}

// Five parameters, each over several 16K chunks: a plain one, one whose
// ratio clamps to max_coeff, one to min_coeff, one with p = 0 and one with
// u = 0 (g = 0 and no decay): ratio 1 for the last two.
static void test_lamb_clamps_and_zero_norms(void **) {
    const size_t len = 40000, gap = 16;
    Case c;
    c.h = hyper(OptimizerType::LAMB);
    c.h.max_coeff = 5.0;
    c.h.min_coeff = 0.05;
    c.n = 5 * (len + gap);
    for (int q = 0; q < 5; ++q) c.segs.push_back(seg((size_t)q * (len + gap), len, q, q != 4));
    c.steps = three_steps();
    c.ref = ref_lamb;
    c.tweak = [&](std::vector<float> &p0, std::vector<std::vector<float>> &grads) {
        for (size_t i = 0; i < len; ++i) {
            p0[1 * (len + gap) + i] *= 100.0f;  // ||p|| / ||u|| ~ 18 -> 5
            p0[2 * (len + gap) + i] *= 0.001f;  // ~ 2e-4 -> 0.05
            p0[3 * (len + gap) + i] = 0.0f;     // ||p|| = 0 -> 1
            for (auto &g : grads) g[4 * (len + gap) + i] = 0.0f; // ||u|| = 0 -> 1
        }
    };
    check_case(c, "lamb clamps");

    // The ratios of the first step (p = 0 holds only until then).
    c.steps.resize(1);
    const Inputs in = inputs_for(c);
    const RefState ref = run_ref(c, in);
    ALL_NEAR(std::vector<double>(ref.ratio.begin() + 1, ref.ratio.end()), {5.0, 0.05, 1.0, 1.0});
    assert_true(ref.ratio[0] > 0.05 && ref.ratio[0] < 5.0);
    // `sum` saw [sum p^2, sum u^2] per parameter, indexed by parameter.
    const Result r = run_opt(c, in);
    assert_int_equal(r.sums.size(), 10);
    for (size_t i = 0; i < 10; ++i)
        if (!(std::fabs(r.sums[i] - ref.sums[i]) <= 1e-5 * ref.sums[i]))
            fail_msg("sums[%zu] = %.9g, expected %.9g", i, r.sums[i], ref.sums[i]);
}

// Parameter 0 split over two "ranks" (two optimizers on two threads whose
// `sum` adds their vectors), parameter 1 only on the second: the same
// result as one optimizer holding everything.
static void test_lamb_two_ranks(void **) {
    const size_t n0 = 50001, n1 = 777, cut = 20000, gap = 15;
    const Hyper h = hyper(OptimizerType::LAMB);
    const std::vector<StepArgs> steps = three_steps();
    // The unsplit layout: [param 0][gap][param 1].
    const size_t n = n0 + gap + n1;
    const std::vector<Segment> whole = {seg(0, n0, 0, true), seg(n0 + gap, n1, 1, false)};
    std::vector<float> p = random_vec(n, 11);
    std::vector<std::vector<float>> grads;
    for (int s = 0; s < 3; ++s) grads.push_back(random_vec(n, 20 + s, 0.5f));
    // Rank A: [0, cut) of param 0. Rank B: [cut, n) of the same flat space.
    std::vector<float> pa(p.begin(), p.begin() + cut), pb(p.begin() + cut, p.end());
    const std::vector<Segment> segs_a = {seg(0, cut, 0, true)};
    const std::vector<Segment> segs_b = {seg(0, n0 - cut, 0, true), seg(n0 - cut + gap, n1, 1, false)};

    Optimizer whole_opt(h, n);
    for (int s = 0; s < 3; ++s) whole_opt.step(p.data(), grads[s].data(), whole, steps[s]);

    // A rendezvous of two threads: both deposit, both take the sum.
    std::mutex mu;
    std::condition_variable cv;
    std::vector<double> acc;
    int arrived = 0, left = 0;
    long generation = 0;
    auto allreduce = [&](std::vector<double> &v) {
        v.resize(4, 0.0); // two parameters: the size common to both ranks
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return left == 0; }); // the previous round has been read
        const long gen = generation;
        if (arrived == 0) acc.assign(4, 0.0);
        for (size_t i = 0; i < 4; ++i) acc[i] += v[i];
        if (++arrived == 2) {
            arrived = 0;
            left = 2;
            ++generation;
            cv.notify_all();
        } else {
            cv.wait(lock, [&] { return generation != gen; });
        }
        v = acc;
        if (--left == 0) cv.notify_all();
    };
    auto rank = [&](std::vector<float> *pr, const std::vector<Segment> *segs, size_t begin) {
        Optimizer opt(h, pr->size());
        for (int s = 0; s < 3; ++s) opt.step(pr->data(), grads[s].data() + begin, *segs, steps[s], allreduce);
    };
    std::thread ta(rank, &pa, &segs_a, (size_t)0), tb(rank, &pb, &segs_b, cut);
    ta.join();
    tb.join();

    std::vector<float> joined(pa);
    joined.insert(joined.end(), pb.begin(), pb.end());
    expect_close("two ranks vs one", joined, widen(p), nullptr, "lamb two ranks");
}

// ---------------------------------------------------------------- Lion, Adagrad

static void test_lion(void **) { check_all_sizes(hyper(OptimizerType::LION), ref_lion, "lion", 1e-3); }

// sign(0) = 0: where g and m are 0, p only decays.
static void test_lion_zero_gradient(void **) {
    Case c;
    c.h = hyper(OptimizerType::LION);
    c.n = 100;
    c.segs = {seg(0, 50, 0, true), seg(50, 50, 1, false)};
    c.steps = three_steps(1e-3);
    c.ref = ref_lion;
    c.tweak = [](std::vector<float> &, std::vector<std::vector<float>> &grads) {
        for (auto &g : grads)
            for (size_t i = 0; i < 100; i += 3) g[i] = 0.0f;
    };
    check_case(c, "lion zero gradient");
    const Inputs in = inputs_for(c);
    const Result r = run_opt(c, in);
    assert_true(r.p[51] == in.p0[51]); // no decay, g = 0 three times: unchanged
}

static void test_adagrad(void **) {
    Hyper h = hyper(OptimizerType::ADAGRAD);
    h.eps = 1e-10;
    check_all_sizes(h, ref_adagrad, "adagrad", 0.1);
}

static void test_adagrad_lr_decay_initial_accumulator(void **) {
    Hyper h = hyper(OptimizerType::ADAGRAD);
    h.eps = 1e-10;
    h.lr_decay = 0.3;
    h.initial_accumulator_value = 0.5;
    Optimizer opt(h, 3);
    for (int i = 0; i < 3; ++i) assert_true(opt.state(0)[i] == 0.5f);
    check_all_sizes(h, ref_adagrad, "adagrad lr_decay", 0.1);
}

// ---------------------------------------------------------------- the rest

static void test_states_and_alignment(void **) {
    assert_int_equal(dsm::optim::state_count(OptimizerType::ADAMW, 0.0), 2);
    assert_int_equal(dsm::optim::state_count(OptimizerType::LAMB, 0.0), 2);
    assert_int_equal(dsm::optim::state_count(OptimizerType::SGD, 0.9), 1);
    assert_int_equal(dsm::optim::state_count(OptimizerType::SGD, 0.0), 0); /* no momentum: no buffer */
    assert_int_equal(dsm::optim::state_count(OptimizerType::NONE, 0.0), 0);
    assert_string_equal(dsm::optim::state_name(OptimizerType::ADAM, 0), "exp_avg");
    assert_string_equal(dsm::optim::state_name(OptimizerType::ADAM, 1), "exp_avg_sq");
    assert_string_equal(dsm::optim::state_name(OptimizerType::SGD, 0), "momentum_buffer");
    assert_string_equal(dsm::optim::state_name(OptimizerType::LION, 0), "exp_avg");
    assert_string_equal(dsm::optim::state_name(OptimizerType::ADAGRAD, 0), "sum");
    expect_error_at([] { dsm::optim::state_name(OptimizerType::SGD, 1); }, DSM_ERR_INVALID_ARGUMENT,
                    {"state index 1", "sgd"}, __LINE__);
    for (size_t n : {(size_t)0, (size_t)1, (size_t)1000}) {
        Optimizer opt(hyper(OptimizerType::ADAM), n);
        assert_int_equal(opt.num_states(), 2);
        for (int s = 0; s < 2; ++s) {
            assert_int_equal(reinterpret_cast<uintptr_t>(opt.state(s)) % 64, 0);
            for (size_t i = 0; i < n; ++i) assert_true(opt.state(s)[i] == 0.0f);
        }
    }
}

static void test_optimizer_hyper(void **) {
    dsm::config::OptimizerConfig cfg;
    expect_error_at([&] { dsm::config::optimizer_hyper(cfg); }, DSM_ERR_CONFIG, {"optimizer.type"}, __LINE__);
    cfg.type = OptimizerType::ADAMW;
    cfg.adam_w_mode = false; // AdamW is decoupled whatever the flag says
    cfg.lr = 3e-4;
    cfg.beta1 = 0.8;
    cfg.beta2 = 0.95;
    cfg.eps = 1e-6;
    cfg.weight_decay = 0.1;
    cfg.bias_correction = false;
    Hyper h = dsm::config::optimizer_hyper(cfg);
    assert_true(h.type == OptimizerType::ADAMW && h.adam_w_mode && !h.bias_correction);
    ALL_NEAR((std::vector<double>{h.lr, h.beta1, h.beta2, h.eps, h.weight_decay}), {3e-4, 0.8, 0.95, 1e-6, 0.1});
    assert_false(h.torch_adam); // DeepSpeed's order unless torch_adam
    cfg.type = OptimizerType::ADAM;
    assert_false(dsm::config::optimizer_hyper(cfg).adam_w_mode);
    cfg.torch_adam = true;
    assert_true(dsm::config::optimizer_hyper(cfg).torch_adam);
    cfg.type = OptimizerType::SGD;
    cfg.momentum = 0.9;
    cfg.dampening = 0.1;
    cfg.nesterov = true;
    h = dsm::config::optimizer_hyper(cfg);
    assert_true(h.nesterov);
    ALL_NEAR((std::vector<double>{h.momentum, h.dampening}), {0.9, 0.1});
    cfg.type = OptimizerType::LAMB;
    cfg.max_coeff = 3.0;
    cfg.min_coeff = 0.1;
    h = dsm::config::optimizer_hyper(cfg);
    ALL_NEAR((std::vector<double>{h.max_coeff, h.min_coeff}), {3.0, 0.1});
    cfg.type = OptimizerType::ADAGRAD;
    cfg.lr_decay = 0.2;
    cfg.initial_accumulator_value = 0.4;
    h = dsm::config::optimizer_hyper(cfg);
    ALL_NEAR((std::vector<double>{h.lr_decay, h.initial_accumulator_value}), {0.2, 0.4});
}

static void test_isa_and_threads(void **) {
    expect_error_at([] { dsm::simd::force("bogus"); }, DSM_ERR_INVALID_ARGUMENT, {"\"bogus\""}, __LINE__);
    const std::vector<std::string> isas = available_isas();
    print_message("[          ] instruction sets here:");
    for (const auto &i : isas) print_message(" %s", i.c_str());
    print_message(" (auto: %s)\n", dsm::optim::active_isa());
    assert_string_equal(dsm::optim::active_isa(), isas.back().c_str()); // auto picks the widest
    for (const char *name : {"avx2", "avx512"}) {
        if (std::find(isas.begin(), isas.end(), name) != isas.end()) continue;
        expect_error_at([&] { dsm::simd::force(name); }, DSM_ERR_NOT_SUPPORTED, {name}, __LINE__);
    }
    for (const auto &i : isas) {
        dsm::simd::force(i);
        assert_string_equal(dsm::optim::active_isa(), i.c_str());
    }
    dsm::simd::force("auto");

    expect_error_at([] { dsm::optim::set_num_threads(-1); }, DSM_ERR_INVALID_ARGUMENT, {"-1"}, __LINE__);
    dsm::optim::set_num_threads(3);
    assert_int_equal(dsm::optim::num_threads(), 3);
    dsm::optim::set_num_threads(0);
    assert_true(dsm::optim::num_threads() >= 1);
}

// An update in pieces (what publish() runs under overlap_comm): step_upto()
// with ends off the grain gives the bits of one step over all segments, on
// every instruction set, for the element-wise optimizers; Lamb refuses;
// within() clips and keeps order and flags.
static void test_piecewise(void **) {
    const size_t G = Optimizer::grain(), n = 3 * G + 4099;
    const std::vector<Segment> segs = {seg(5, G + 17, 0, true), seg(G + 30, 9, 1, false), seg(G + 40, 2 * G, 2, true),
                                       seg(3 * G + 50, 4000, 3, false)};
    const std::vector<Segment> cut = dsm::optim::within(segs, G + 25, 2 * G);
    assert_int_equal(cut.size(), 2);
    assert_int_equal(cut[0].offset, G + 30);
    assert_int_equal(cut[0].count, 9);
    assert_false(cut[0].decay);
    assert_int_equal(cut[1].param, 2);
    assert_int_equal(cut[1].offset, G + 40);
    assert_int_equal(cut[1].count, G - 40);
    assert_true(dsm::optim::within(segs, 0, 5).empty());
    for (const OptimizerType t : {OptimizerType::ADAMW, OptimizerType::SGD, OptimizerType::LION, OptimizerType::ADAGRAD}) {
        for (const auto &isa : available_isas()) {
            dsm::simd::force(isa);
            Optimizer whole(hyper(t), n), parts(hyper(t), n);
            assert_true(whole.piecewise());
            std::vector<float> p1 = random_vec(n, 1), p2 = p1;
            for (int step = 1; step <= 3; ++step) {
                const std::vector<float> g = random_vec(n, 10 + static_cast<uint64_t>(step));
                StepArgs a;
                a.step = step;
                whole.step(p1.data(), g.data(), segs, a);
                // Asked ends off the grain are rounded up to it; an end already reached does nothing.
                size_t done = 0;
                for (const size_t upto : {size_t(1), G + 5, G + 7, 2 * G, n}) {
                    parts.step_upto(p2.data(), g.data(), segs, a, &done, upto);
                    assert_int_equal(done, std::min(n, (upto + G - 1) / G * G));
                }
            }
            if (std::memcmp(p1.data(), p2.data(), n * sizeof(float)) != 0)
                fail_msg("optimizer %d on %s: an update in pieces differs from the whole", static_cast<int>(t), isa.c_str());
        }
    }
    dsm::simd::force("auto");
    Optimizer lamb(hyper(OptimizerType::LAMB), 10);
    assert_false(lamb.piecewise());
    std::vector<float> p(10), g(10);
    size_t done = 0;
    expect_error_at([&] { lamb.step_upto(p.data(), g.data(), {seg(0, 10, 0, true)}, StepArgs(), &done, 10); },
                    DSM_ERR_INTERNAL, {"pieces"}, __LINE__);
}

static void test_step_errors(void **) {
    Optimizer opt(hyper(OptimizerType::ADAMW), 100);
    std::vector<float> p(100), g(100);
    StepArgs a;
    expect_error_at([&] { opt.step(p.data(), g.data(), {seg(90, 11, 0, true)}, a); }, DSM_ERR_INVALID_ARGUMENT,
                    {"[90, 101)", "100 elements"}, __LINE__);
    expect_error_at([&] { opt.step(p.data(), g.data(), {seg(0, 10, 0, true), seg(9, 5, 1, true)}, a); },
                    DSM_ERR_INVALID_ARGUMENT, {"[0, 10)", "[9, 14)", "overlap"}, __LINE__);
    expect_error_at([&] { opt.step(p.data(), g.data(), {seg(0, 10, -2, true)}, a); }, DSM_ERR_INVALID_ARGUMENT,
                    {"-2"}, __LINE__);
    a.step = 0;
    expect_error_at([&] { opt.step(p.data(), g.data(), {seg(0, 10, 0, true)}, a); }, DSM_ERR_INVALID_ARGUMENT,
                    {"step 0"}, __LINE__);
    a.step = 1;
    expect_error_at([&] { opt.step(nullptr, g.data(), {seg(0, 10, 0, true)}, a); }, DSM_ERR_NULL_POINTER, {"p"},
                    __LINE__);
    opt.step(nullptr, nullptr, {}, a); // nothing to update

    Hyper none;
    none.type = OptimizerType::NONE;
    expect_error_at([&] { Optimizer bad(none, 10); }, DSM_ERR_INVALID_ARGUMENT, {"none"}, __LINE__);

    // Lamb's `sum` must leave room for every parameter of this rank.
    Optimizer lamb(hyper(OptimizerType::LAMB), 100);
    expect_error_at(
        [&] { lamb.step(p.data(), g.data(), {seg(0, 10, 3, true)}, a, [](std::vector<double> &v) { v.clear(); }); },
        DSM_ERR_INTERNAL, {"parameters up to 3"}, __LINE__);
}

// The host step's fused pass (optim::Fused) against the plain step: with
// bf16 gradients (read, widened and zeroed by the kernel, the bf16
// parameters written by it) the bits of a plain step on the widened
// gradients and the bf16 rounding of its parameters; with fp32 gradients
// zeroed by the kernel, the plain step's bits. Every ISA, 1 and 2 threads,
// items of several work items with tails, padding between segments left
// alone, NaN and Inf among the gradients and parameters.
static void test_fused_host_step(void **) {
    const size_t n = 2 * Optimizer::grain() + 16 * 7 + 5;
    const std::vector<Segment> segs = {seg(0, 20011, 0, true), seg(20016, n - 20016 - 3, 1, false)};
    std::vector<char> covered(n, 0);
    for (const Segment &s : segs) std::fill(covered.begin() + s.offset, covered.begin() + s.offset + s.count, 1);
    Rng rng(77);
    std::vector<float> p0(n), g32(n);
    std::vector<uint16_t> g16(n);
    for (size_t i = 0; i < n; ++i) {
        p0[i] = rng.next();
        g16[i] = dsm::fp32_to_bf16(rng.next() * 1e-2f);
    }
    g16[5] = 0x7fc1;           // NaN gradient: p becomes NaN, its bf16 stays a quiet NaN
    g16[20000] = 0x7f80;       // +Inf
    const uint32_t snan = 0x7f800001u; // a signalling NaN
    std::memcpy(&p0[33], &snan, 4);
    // Without decay and with zero gradients p stays as it is: its bf16 is
    // written from values halfway between two bf16 (ties to even, both ways,
    // both signs) and the largest finite value's rounding to Inf.
    const uint32_t ties[] = {0x3f808000u, 0x3f818000u, 0xbf808000u, 0xbf818000u, 0x7f7fffffu, 0x00008000u};
    for (size_t k = 0; k < 6 * 5; ++k) {
        g16[20100 + k] = 0;
        std::memcpy(&p0[20100 + k], &ties[k % 6], 4);
    }
    for (size_t i = 0; i < n; ++i) g32[i] = dsm::bf16_to_fp32(g16[i]);
    const Hyper h = hyper(OptimizerType::ADAMW);
    for (const std::string &isa : available_isas()) {
        dsm::simd::force(isa);
        for (int threads : {1, 2}) {
            dsm::optim::set_num_threads(threads);
            const std::string ctx = "fused isa=" + isa + " threads=" + std::to_string(threads);
            Optimizer ref(h, n), bf(h, n), f32(h, n);
            std::vector<float> pr = p0, pb = p0, pf = p0;
            for (int64_t step = 1; step <= 2; ++step) {
                StepArgs a;
                a.step = step;
                a.lr = 1e-2 * static_cast<double>(step);
                a.grad_scale = 0.75f;
                std::vector<uint16_t> gb = g16, pb16(n, 0xabcd);
                std::vector<float> gf = g32;
                ref.step(pr.data(), g32.data(), segs, a);
                dsm::optim::Fused fb;
                fb.grad16 = gb.data();
                fb.param16 = pb16.data();
                fb.dtype = DSM_BFLOAT16;
                fb.zero_grads = true;
                bf.step(pb.data(), nullptr, segs, a, {}, &fb);
                dsm::optim::Fused ff;
                ff.zero_grads = true;
                f32.step(pf.data(), gf.data(), segs, a, {}, &ff);
                if (!same_bits(pb, pr)) fail_msg("%s step %lld: bf16 p differs from the plain step", ctx.c_str(), (long long)step);
                if (!same_bits(pf, pr)) fail_msg("%s step %lld: fp32 p differs from the plain step", ctx.c_str(), (long long)step);
                for (int s = 0; s < 2; ++s)
                    for (size_t i = 0; i < n; ++i)
                        if (std::memcmp(bf.state(s) + i, ref.state(s) + i, 4) != 0 ||
                            std::memcmp(f32.state(s) + i, ref.state(s) + i, 4) != 0)
                            fail_msg("%s: state %d [%zu] differs", ctx.c_str(), s, i);
                for (size_t i = 0; i < n; ++i) {
                    const uint16_t want16 = covered[i] ? dsm::fp32_to_bf16(pr[i]) : 0xabcd;
                    if (pb16[i] != want16) fail_msg("%s: p16[%zu] = %#x, expected %#x", ctx.c_str(), i, pb16[i], want16);
                    const uint16_t wantg = covered[i] ? 0 : g16[i];
                    if (gb[i] != wantg) fail_msg("%s: bf16 g[%zu] = %#x, expected %#x", ctx.c_str(), i, gb[i], wantg);
                    const float wantf = covered[i] ? 0.0f : g32[i];
                    if (std::memcmp(&gf[i], &wantf, 4) != 0) fail_msg("%s: fp32 g[%zu] not as expected", ctx.c_str(), i);
                }
            }
            assert_true(std::isnan(pr[5]) && std::isnan(pr[33]));
        }
    }
    dsm::simd::force("auto");
    dsm::optim::set_num_threads(0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adam_l2),
        cmocka_unit_test(test_adamw),
        cmocka_unit_test(test_adamw_no_bias_correction),
        cmocka_unit_test(test_adam_update_matches_step),
        cmocka_unit_test(test_adam_torch_order),
        cmocka_unit_test(test_sgd_plain),
        cmocka_unit_test(test_sgd_momentum_dampening),
        cmocka_unit_test(test_sgd_nesterov),
        cmocka_unit_test(test_lamb),
        cmocka_unit_test(test_lamb_no_bias_correction),
        cmocka_unit_test(test_lamb_clamps_and_zero_norms),
        cmocka_unit_test(test_lamb_two_ranks),
        cmocka_unit_test(test_lion),
        cmocka_unit_test(test_lion_zero_gradient),
        cmocka_unit_test(test_adagrad),
        cmocka_unit_test(test_adagrad_lr_decay_initial_accumulator),
        cmocka_unit_test(test_states_and_alignment),
        cmocka_unit_test(test_optimizer_hyper),
        cmocka_unit_test(test_isa_and_threads),
        cmocka_unit_test(test_piecewise),
        cmocka_unit_test(test_step_errors),
        cmocka_unit_test(test_fused_host_step),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
