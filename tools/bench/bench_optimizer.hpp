// dsm-bench optimizer's parts shared by its two files: bench_optimizer.cc
// (the fused kernel on N parameters, host and CUDA, and the command line)
// and bench_optimizer_model.cc (the step on a real model's tensors).
#pragma once

#include <cstddef>
#include <string>

#include "harness.hpp"
#include "model_list.hpp"

namespace dsm {
namespace bench {
namespace optimizer {

struct Options {
    long long params = 16777216;
    long long iters = 10;
    int threads = 0; // 0: OpenMP's default
    std::string isa = "auto";
    std::string device = "cpu";
    bool torch = true;
    std::string model;          // --model: a real model's parameter list
    std::string dtype = "fp32"; // --model: the gradients' and parameters' dtype
};

// The optimizer's work-item size: the bandwidth kernel and the first touch
// split the arrays the same way, so each thread streams the pages it placed.
constexpr size_t kChunk = 16384;
inline long long chunks_of(size_t n) { return static_cast<long long>((n + kChunk - 1) / kChunk); }

// a[0, n) = value, each chunk written by the thread that streams it later.
void first_touch(float *a, size_t n, float value, int threads);
// --threads and --isa applied to the optimizer; 0, or the exit status.
int set_threads_isa(const Options &o);
// --model (bench_optimizer_model.cc).
int run_model(const Harness &h, const Options &o, const ModelList &list);

} // namespace optimizer
} // namespace bench
} // namespace dsm
