// dsm-bench zero --model (bench_model.cc): the engine's step on a real
// model's parameter list, the bound on the bytes it moves, and PyTorch's
// clip_grad_norm_ + AdamW on the same tensors.
#pragma once

#include <cstddef>
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
    size_t elements = 0; // elements this rank's optimizer updates
    size_t peak_host = 0, peak_device = 0; // high-water marks (dsm_engine_describe): host + shared, device
    int threads = 1;
};

struct TorchModel {
    std::string version, what;
    int threads = 0;
    double step = -1, step_zero_grad = -1; // seconds per step; -1: not measured
};

// Collective over `world`.
ModelStage run_model_stage(MPI_Comm world, int stage, const std::string &dtype, const std::string &device,
                           const ModelList &list, int steps);
// Rank 0 runs PyTorch with `threads` threads; every rank gets the figures.
void model_torch(const ModelList &list, int threads, int steps, const std::string &device, TorchModel &out,
                 MPI_Comm comm);

} // namespace bench
} // namespace dsm
