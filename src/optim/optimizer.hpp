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
// Formulas follow DeepSpeed's kernels (PyTorch's where DeepSpeed has none);
// g is the gradient times StepArgs::grad_scale, wd is 0 in segments without
// decay, bc1 = 1 - b1^step and bc2 = 1 - b2^step (both 1 without
// bias_correction):
//   Adam (DeepSpeed cpu_adam): m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
//     adam_w_mode: p -= lr * (m/bc1 / (sqrt(v/bc2) + eps) + wd p)  (decoupled)
//     else: g += wd p first (L2), then the same without the wd term.
//   Adam with torch_adam (torch.optim.Adam/AdamW, PyTorch's order and
//     roundings, optim/kernels.hpp adam_torch_at): AdamW p *= 1 - lr wd
//     first; m and v as above; p += -lr/bc1 m / (sqrt(v)/sqrt(bc2) + eps).
//   SGD (torch.optim.SGD): g += wd p; buf = momentum buf + (1-dampening) g
//     (buf = g on the first step); nesterov: g += momentum buf, else g = buf;
//     p -= lr g. No momentum: no buffer update, p -= lr g.
//   Lamb (DeepSpeed FusedLamb, eps outside the sqrt): m and v as Adam's;
//     u = m / (sqrt(v) + eps) + wd p (no bias correction inside u);
//     ratio = ||p|| / ||u|| over the whole parameter (all ranks), clamped to
//     [min_coeff, max_coeff], and 1 when either norm is 0;
//     p -= lr * sqrt(bc2) / bc1 * ratio * u.
//   Lion (DeepSpeed cpu_lion): c = b1 m + (1-b1) g; p -= lr (sign(c) + wd p);
//     m = b2 m + (1-b2) g. sign(0) = 0 as torch.sign (DeepSpeed's kernels
//     move by lr even there: copysign on CPU, c > 0 ? -lr : lr on GPU).
//   Adagrad (torch.optim.Adagrad: DeepSpeed's CPU Adagrad has neither
//     lr_decay nor initial_accumulator_value): g += wd p;
//     clr = lr / (1 + (step-1) lr_decay); sum += g^2; p -= clr g / (sqrt(sum) + eps).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "optim/optimizer_type.hpp"
#include "device/space.hpp"

namespace dsm {
namespace optim {

struct Hyper {
    OptimizerType type = OptimizerType::ADAMW;
    double lr = 1e-3;
    double beta1 = 0.9, beta2 = 0.999;
    double eps = 1e-8;
    double weight_decay = 0.0;
    bool adam_w_mode = true;
    bool torch_adam = false;  // Adam/AdamW in PyTorch's order of operations
    bool bias_correction = true;
    double momentum = 0.0, dampening = 0.0;  // SGD
    bool nesterov = false;
    double max_coeff = 10.0, min_coeff = 0.01; // Lamb
    double lr_decay = 0.0;                     // Adagrad
    double initial_accumulator_value = 0.0;    // Adagrad
};

// Number of fp32 state arrays per element and their names (PyTorch's state
// names: "exp_avg", "exp_avg_sq", "momentum_buffer", "sum"). SGD keeps its
// momentum_buffer only with momentum != 0, as torch.optim.SGD does; state_name
// names the states a type can have.
int state_count(OptimizerType type, double momentum);
int state_count(const Hyper &hyper);
const char *state_name(OptimizerType type, int index);

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
                             // (Adam, Lamb, Lion; SGD and Adagrad have no betas, so OneCycle never
                             // cycles them and SGD's momentum is Hyper::momentum)
    double beta2 = -1.0;     // < 0: Hyper::beta2; LrSchedule::kOneCycleBeta2 while OneCycle
                             // cycles momentum (DeepSpeed then sets betas = (momentum, 0.99))
    float grad_scale = 1.0f; // g is multiplied by this first (unscale * clip * 1/accumulation)
};

// Lamb's per-parameter norms are sums over the ranks that share the
// parameter: the engine passes a function that sums a vector of doubles over
// its data-parallel group (identity on one rank). The vector is indexed by
// parameter: [2 param] = sum of p^2 and [2 param + 1] = sum of u^2 over this
// rank's segments of `param`, zero for parameters it does not hold; its size
// is 2 (largest param here + 1), which differs between ranks, so the function
// may grow it (zeros) to a size common to the group, e.g. 2 * number of
// parameters, before summing. Sizes below 2 (largest param + 1) afterwards
// are an error.
using SumFn = std::function<void(std::vector<double> &)>;

// The step's fused pass (Optimizer::step's `fused`): what each work item
// does besides the update, while its elements are in the cache, so the step
// makes one pass over memory instead of one per operation. Offsets are the
// partition's, as p's and g's. On a CUDA device the multi-tensor kernel does
// the same element by element (16-bit gradients widened in registers).
struct Fused {
    // 16-bit gradients (bf16 or fp16, `dtype`) read in place of g: each work
    // item converts its own into a buffer of the thread (exact) and updates
    // from that, with the bits of an update from their fp32 conversion.
    const void *grad16 = nullptr;
    // 16-bit parameters (`dtype`) written from the updated fp32 p, rounded to
    // nearest even as amp's conversion (the partition of the compute dtype).
    void *param16 = nullptr;
    int dtype = 0; // dsm_dtype_t of grad16 and param16
    // The gradients the items read (g, or grad16) are zeroed after their
    // item: the next window starts from zero.
    bool zero_grads = false;
};

// Which kernel runs: "avx512", "avx2" or "generic" (core/simd.hpp picks it;
// simd::force() forces it).
const char *active_isa() noexcept;

// Threads of the kernels: n > 0 threads, 0 (the initial value) OpenMP's
// default (omp_get_max_threads()); negative: INVALID_ARGUMENT. Results do not
// depend on it.
void set_num_threads(int n);
int num_threads() noexcept; // the count a step uses now (>= 1)

// The update runs where the memory is (device/space.hpp): on a
// host-addressable space the CPU kernels above, in the space's queue order
// (the simulated device defers them, and computes the same bits); on a CUDA
// space the fused kernels of optim/kernels_cuda.hpp on its stream: one
// multi-tensor launch over a table of the segments (optim/multi_tensor.hpp),
// which also takes a Fused (16-bit gradients read, 16-bit parameters
// written, gradients zeroed in the same pass); Lamb one launch per segment
// and pass, with its per-parameter sums brought back in one small copy.
class Optimizer {
public:
    // States for `n` elements in `space`, zeroed (Adagrad:
    // initial_accumulator_value), 64-byte aligned.
    Optimizer(const Hyper &hyper, size_t n, device::Space &space = device::host());
    ~Optimizer();
    Optimizer(const Optimizer &) = delete;
    Optimizer &operator=(const Optimizer &) = delete;

    const Hyper &hyper() const noexcept { return hyper_; }
    size_t size() const noexcept { return n_; }
    int num_states() const noexcept { return static_cast<int>(states_.size()); }
    float *state(int i) noexcept { return static_cast<float *>(states_[static_cast<size_t>(i)].data()); }
    const float *state(int i) const noexcept { return static_cast<const float *>(states_[static_cast<size_t>(i)].data()); }
    device::Space &space() const noexcept { return *space_; }

    // Whether an update may run in pieces (step_upto), one step per range of
    // elements: all but Lamb, whose trust ratios need each parameter whole.
    bool piecewise() const noexcept { return hyper_.type != OptimizerType::LAMB; }
    // The pieces' unit: steps over the segments cut at multiples of grain()
    // elements (within()) give the bits of one step over them all.
    static size_t grain() noexcept;

    // One update of p[0..n) from g[0..n) * args.grad_scale over `segments`.
    // `sum` is used by Lamb only (may be empty: one rank). Segments must lie
    // inside [0, n) and not overlap; step >= 1.
    // `fused` (host space, not Lamb): the pass of each work item also reads
    // 16-bit gradients, writes 16-bit parameters and zeroes the gradients
    // (Fused); g may then be null when grad16 is set.
    void step(float *p, const float *g, const std::vector<Segment> &segments, const StepArgs &args,
              const SumFn &sum = {}, const Fused *fused = nullptr);
    // Whether step() takes a Fused here (host memory or a CUDA device, an
    // optimizer that updates element by element: not Lamb).
    bool fuses() const noexcept;
    // One piece of an update that runs in pieces (piecewise()): the step
    // over the parts of `segments` in [*done, upto rounded up to grain()),
    // then *done is that end (at most n). Called with *done = 0 first and
    // increasing `upto`, the pieces give the bits of one step().
    void step_upto(float *p, const float *g, const std::vector<Segment> &segments, const StepArgs &args,
                   size_t *done, size_t upto, const Fused *fused = nullptr);

private:
    void host_step(float *p, const float *g, const std::vector<Segment> &segments, const StepArgs &args,
                   const SumFn &sum, const Fused *fused = nullptr);
    void cuda_step(float *p, const float *g, const std::vector<Segment> &segments, const StepArgs &args,
                   const SumFn &sum, const Fused *fused = nullptr);

    Hyper hyper_;
    size_t n_ = 0;
    device::Space *space_;
    std::vector<device::Buffer> states_;
    std::shared_ptr<void> mt_; // a CUDA space's segment tables (cuda::MtTables), made at the first step
};

// The parts of `segments` that lie in elements [lo, hi), in the same order.
std::vector<Segment> within(const std::vector<Segment> &segments, size_t lo, size_t hi);

// The fused kernels, for benchmarks and tests: one update of n elements, all
// with the same weight decay (threaded, ISA as set).
void adam_update(float *p, const float *g, float *m, float *v, size_t n, const Hyper &h,
                 const StepArgs &a, bool decay = true);

} // namespace optim
} // namespace dsm
