// dsm-bench: benchmarks of the layers, each reported next to a baseline
// measured in the same run (memory bandwidth, raw MPI, PyTorch), as text or
// JSON (--json). MPI is initialized by main() for every subcommand.
#pragma once

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <unistd.h>
#include <vector>

#include <mpi.h>

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
int run_overlap(int argc, char **argv);     // dsm-bench overlap

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

// Option values. Every numeric option of every subcommand is read by
// parse_integer: decimal digits with an optional leading '-', nothing else
// (no spaces, no suffix, no hex), no overflow, within [min, max]. Otherwise
// it prints, where `loud` (rank 0), "dsm-bench SUB: OPT 'TEXT' is not an
// integer from MIN to MAX" and returns false. Every rank parses the same
// arguments, so every rank refuses them alike and none waits for the others.
inline bool parse_integer(const char *sub, const std::string &opt, const char *text, long long min, long long max,
                          bool loud, long long *out) {
    const char *p = text;
    bool ok = *p != '\0';
    if (*p == '-') ++p;
    if (*p == '\0') ok = false;
    for (const char *c = p; ok && *c != '\0'; ++c) ok = *c >= '0' && *c <= '9';
    long long v = 0;
    if (ok) {
        char *end = nullptr;
        errno = 0;
        v = std::strtoll(text, &end, 10);
        ok = errno == 0 && end != text && *end == '\0' && v >= min && v <= max;
    }
    if (!ok) {
        if (loud) std::fprintf(stderr, "dsm-bench %s: %s '%s' is not an integer from %lld to %lld\n", sub, opt.c_str(), text, min, max);
        return false;
    }
    *out = v;
    return true;
}

// The machine's physical memory in bytes (0 when unknown).
inline double physical_memory_bytes() {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0.0;
}

// Whether the memory a run needs fits: `bytes_per_rank` (computed in double by
// the caller, so that no size overflows) times the ranks of `comm` on this
// node at most the node's physical memory. Collective over `comm` (pass
// MPI_COMM_SELF for a one-process benchmark): every rank gets the same answer.
// Refused where loud: "dsm-bench SUB: WHAT needs N bytes per rank (R ranks on
// this node), more than the M bytes of memory of this node".
inline bool fits_memory(const char *sub, const std::string &what, double bytes_per_rank, MPI_Comm comm, bool loud) {
    MPI_Comm node = MPI_COMM_NULL;
    int local = 1;
    if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) == MPI_SUCCESS &&
        node != MPI_COMM_NULL) {
        MPI_Comm_size(node, &local);
        MPI_Comm_free(&node);
    }
    const double have = physical_memory_bytes();
    const double need = bytes_per_rank * local;
    int ok = have <= 0 || need <= have ? 1 : 0;
    const int mine = ok;
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, comm);
    if (!ok && loud) {
        if (mine)
            std::fprintf(stderr, "dsm-bench %s: %s needs too much memory on another node\n", sub, what.c_str());
        else
            std::fprintf(stderr,
                         "dsm-bench %s: %s needs %.0f bytes per rank (%d rank%s on this node), more than the %.0f "
                         "bytes of memory of this node\n",
                         sub, what.c_str(), bytes_per_rank, local, local == 1 ? "" : "s", have);
    }
    return ok != 0;
}

inline double now_seconds() {
    using clock = std::chrono::steady_clock;
    return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

} // namespace bench
} // namespace dsm
