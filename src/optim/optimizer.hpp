// The CPU optimizers: Adam/AdamW (DeepSpeed's adam_w_mode), SGD (momentum,
// dampening, nesterov, weight decay), Lamb (trust ratio clamped to
// [min_coeff, max_coeff]), Lion and Adagrad, applied to one flat fp32
// partition of master weights in a single fused pass over p, g and the state
// arrays.
//
// Kernels: AVX-512 or AVX2 (chosen at run time from the CPU) with a portable
// fallback; threaded with OpenMP, one parallel region per step over fixed-size
// chunks, so results never depend on the thread count (reductions, for Lamb,
// combine fixed blocks in a fixed order).
//
// Formulas follow PyTorch/DeepSpeed:
//   Adam (bias_correction): m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
//     adam_w_mode: p -= lr * (m/bc1 / (sqrt(v/bc2) + eps) + wd p)  (decoupled)
//     else: g += wd p first (L2), then the same without the wd term.
//   SGD: g += wd p; buf = momentum buf + (1-dampening) g (buf = g on the first
//     step); nesterov: g += momentum buf, else g = buf; p -= lr g.
//   Lamb: Adam's update u (with wd p added), ratio = ||p|| / ||u|| over the
//     whole parameter, clamped to [min_coeff, max_coeff] (1 when either norm
//     is 0); p -= lr * ratio * u.
//   Lion: c = b1 m + (1-b1) g; p -= lr (sign(c) + wd p); m = b2 m + (1-b2) g.
//   Adagrad: g += wd p; clr = lr / (1 + (step-1) lr_decay); sum += g^2;
//     p -= clr g / (sqrt(sum) + eps).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "config/config.hpp"

namespace dsm {
namespace optim {

struct Hyper {
    config::OptimizerType type = config::OptimizerType::ADAMW;
    double lr = 1e-3;
    double beta1 = 0.9, beta2 = 0.999;
    double eps = 1e-8;
    double weight_decay = 0.0;
    bool adam_w_mode = true;
    bool bias_correction = true;
    double momentum = 0.0, dampening = 0.0;  // SGD
    bool nesterov = false;
    double max_coeff = 10.0, min_coeff = 0.01; // Lamb
    double lr_decay = 0.0;                     // Adagrad
    double initial_accumulator_value = 0.0;    // Adagrad
};

// The configured optimizer's hyperparameters (type NONE: DSM_ERR_CONFIG).
Hyper hyper_from_config(const config::OptimizerConfig &cfg);

// Number of fp32 state arrays per element and their names (PyTorch's state
// names: "exp_avg", "exp_avg_sq", "momentum_buffer", "sum").
int state_count(config::OptimizerType type);
const char *state_name(config::OptimizerType type, int index);

// A piece of one parameter inside the partition: elements
// [offset, offset + count) of the partition belong to parameter `param`.
// Elements of the partition that no segment covers (padding) are left alone.
struct Segment {
    size_t offset = 0;
    size_t count = 0;
    int param = 0;          // parameter index (Lamb computes one trust ratio per parameter)
    bool decay = true;      // false: weight decay excluded (biases, norms)
};

// Per-step values that may change from step to step.
struct StepArgs {
    int64_t step = 1;        // 1-based count of this parameter's updates (bias correction, SGD's first step)
    double lr = 1e-3;        // from the LR schedule
    double beta1 = 0.9;      // from the schedule when OneCycle cycles momentum, else Hyper::beta1
    float grad_scale = 1.0f; // g is multiplied by this first (unscale * clip * 1/accumulation)
};

// Lamb's per-parameter norms are sums over the ranks that share the
// parameter: the engine passes a function that sums a vector of doubles over
// its data-parallel group (identity on one rank).
using SumFn = std::function<void(std::vector<double> &)>;

// Which kernel runs: "avx512", "avx2" or "generic".
const char *active_isa() noexcept;
// Force a kernel set (benchmarks, tests): "avx512", "avx2", "generic" or
// "auto"; DSM_ERR_NOT_SUPPORTED when the CPU lacks it, INVALID_ARGUMENT for
// another name.
void set_isa(const std::string &name);

class Optimizer {
public:
    // States for `n` elements, zeroed (Adagrad: initial_accumulator_value), 64-byte aligned.
    Optimizer(const Hyper &hyper, size_t n);
    ~Optimizer();
    Optimizer(const Optimizer &) = delete;
    Optimizer &operator=(const Optimizer &) = delete;

    const Hyper &hyper() const noexcept { return hyper_; }
    size_t size() const noexcept { return n_; }
    int num_states() const noexcept { return static_cast<int>(states_.size()); }
    float *state(int i) noexcept { return states_[static_cast<size_t>(i)]; }
    const float *state(int i) const noexcept { return states_[static_cast<size_t>(i)]; }

    // One update of p[0..n) from g[0..n) * args.grad_scale over `segments`.
    // `sum` is used by Lamb only (may be empty: one rank).
    void step(float *p, const float *g, const std::vector<Segment> &segments, const StepArgs &args,
              const SumFn &sum = {});

private:
    Hyper hyper_;
    size_t n_ = 0;
    std::vector<float *> states_;
};

// The fused kernels, for benchmarks and tests: one update of n elements, all
// with the same weight decay (threaded, ISA as set).
void adam_update(float *p, const float *g, float *m, float *v, size_t n, const Hyper &h,
                 const StepArgs &a, bool decay = true);

} // namespace optim
} // namespace dsm
