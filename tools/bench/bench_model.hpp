// dsm-bench zero --model and optimizer --model (bench_model.cc): the
// engine's step on a real model's parameter list, the bound on the bytes it
// moves, and PyTorch's clip_grad_norm_ + AdamW on the same tensors.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <memory>
#include <string>

#include <mpi.h>

#include "harness.hpp"
#include "model_list.hpp"

namespace dsm {
namespace bench {

struct ModelStage {
    int stage = 0;
    double step = 0;   // seconds: the releases and dsm_step, slowest rank, median
    double update = 0; // of which the update (less the reduction and gather timers)
    double bound = -1; // seconds: the bound's kernel on this rank's elements (host; -1: not measured)
    double bytes_per_element = 36.0;
    std::string bound_kernel; // the bound's fastest variant (host)
    size_t elements = 0; // elements this rank's optimizer updates
    size_t outside = 0;  // gradient elements the step zeroes but does not update (ZeRO-1)
    size_t peak_host = 0, peak_device = 0; // high-water marks (dsm_engine_describe): host + shared, device
    int threads = 1;
};

struct TorchModel {
    std::string version, what;
    int threads = 0;
    double step = -1, step_zero_grad = -1; // seconds per step; -1: not measured
};

// The bound on the host: the bytes a step with gradient clipping and AdamW
// must move over n elements, moved by a streaming kernel with `threads`
// threads (work items as the optimizer's): a pass that reads the gradient
// (the norm), then one that reads gradient, fp32 master and both moments and
// writes master and moments back, zeroes the gradient and (half) writes the
// 16-bit parameter. 36 bytes per element with fp32 gradients, 32 with 16-bit
// ones. Where the stage keeps every gradient whole but updates a partition
// (ZeRO-1), the step also zeroes the `outside` gradient elements it does not
// update: a third pass writes zeros over that many. run(): seconds of the
// passes, every rank of `comm` at once, the slowest rank's time (run in turn
// with the measured step, so that a noisy neighbour hits both alike).
class HostBound {
public:
    HostBound(size_t n, bool half, int threads, size_t outside = 0);
    // The fastest of the kernel's variants (kAhead: software prefetch
    // distance in elements, 0 for none), each timed in turn.
    double run(MPI_Comm comm);
    static constexpr int kVariants = 4;
    static const size_t kAhead[kVariants];
    // The variant that was fastest in the most rounds.
    int best_variant() const noexcept;
    static double bytes_per_element(bool half) { return half ? 32.0 : 36.0; }
    size_t outside() const noexcept { return outside_; }

private:
    struct Free {
        void operator()(void *p) const noexcept { std::free(p); }
    };
    size_t n_, outside_;
    bool half_;
    int threads_;
    std::unique_ptr<void, Free> g_, p_, m_, v_, p16_, z_;
    float sink_ = 0;
    int wins_[kVariants] = {0, 0, 0, 0};
    double run_variant(int k);
    void zero_outside();
};

// `t` as JSON (version, what, threads, step_seconds, step_zero_grad_seconds),
// null where PyTorch was not measured.
Json torch_json(const TorchModel &t);

// Declares --model on `h`: a name or file model_list() reads into `list`
// (its text into `name`), else refused with model_list()'s message.
void model_option(Harness &h, ModelList &list, std::string &name);

// Collective over `world`.
ModelStage run_model_stage(MPI_Comm world, int stage, const std::string &dtype, const std::string &device,
                           const ModelList &list, int steps);
// Rank 0 runs PyTorch with `threads` threads; every rank gets the figures.
void model_torch(const ModelList &list, int threads, int steps, const std::string &device, TorchModel &out,
                 MPI_Comm comm);

} // namespace bench
} // namespace dsm
