// dsm-bench: benchmarks of the layers, each reported next to a baseline
// measured in the same run (memory bandwidth, raw MPI, PyTorch), as text or
// JSON (--json). MPI is initialized by main() for every subcommand.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

namespace dsm {
namespace bench {

// Each subcommand gets the arguments after its name and returns the exit
// status (0 ok, 2 usage error, 1 failure); usage errors print to stderr from
// rank 0.
int run_optimizer(int argc, char **argv);   // dsm-bench optimizer
int run_collectives(int argc, char **argv); // dsm-bench collectives
int run_zero(int argc, char **argv);        // dsm-bench zero
int run_checkpoint(int argc, char **argv);  // dsm-bench checkpoint
int run_alltoall(int argc, char **argv);    // dsm-bench alltoall

// The Python that runs the PyTorch baselines: $DSM_BENCH_PYTHON, else
// "python3" from PATH.
inline std::string python_command() {
    const char *p = std::getenv("DSM_BENCH_PYTHON");
    return p != nullptr && *p != '\0' ? std::string(p) : std::string("python3");
}

// The median of `v` (the mean of the two middle values for an even count);
// 0 for none.
inline double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t k = v.size();
    return k == 0 ? 0.0 : 0.5 * (v[(k - 1) / 2] + v[k / 2]);
}

inline double now_seconds() {
    using clock = std::chrono::steady_clock;
    return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

} // namespace bench
} // namespace dsm
