// dsm-bench: benchmarks of the layers, each reported next to a baseline
// measured in the same run (memory bandwidth, raw MPI, PyTorch), as text or
// JSON (--json). The harness is what every subcommand shares: MPI start-up
// (after the command line is read) and shutdown (main), the command line (getopt_long: --help, --json and the
// subcommand's options, every value checked), the memory check, the time of
// the slowest rank and its median, the JSON output and the handling of
// errors.
#pragma once

#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <mpi.h>
#include <nlohmann/json.hpp>

#include "../common/cli.hpp"
#include "mesh/mesh.hpp"

namespace dsm {
namespace bench {

// JSON results, their keys in the order they were set.
using Json = nlohmann::ordered_json;

// Each subcommand gets its arguments with its own name as argv[0] and
// returns the exit status (0 ok, 2 usage error, 1 failure).
int run_optimizer(int argc, char **argv);   // dsm-bench optimizer
int run_collectives(int argc, char **argv); // dsm-bench collectives
int run_zero(int argc, char **argv);        // dsm-bench zero
int run_checkpoint(int argc, char **argv);  // dsm-bench checkpoint
int run_alltoall(int argc, char **argv);    // dsm-bench alltoall
int run_overlap(int argc, char **argv);     // dsm-bench overlap
int run_quantize(int argc, char **argv);    // dsm-bench quantize
int run_watchdog(int argc, char **argv);    // dsm-bench watchdog

// The Python that runs the PyTorch baselines: $DSM_BENCH_PYTHON, else
// "python3" from PATH.
std::string python_command();

// The median of `v` (the mean of the two middle values for an even count);
// 0 for none.
double median(std::vector<double> v);

double now_seconds();

// The mesh the engine benchmarks train on: one "data_parallel" dimension of
// every rank of `comm`. Collective over `comm`.
std::unique_ptr<Mesh> data_parallel_mesh(MPI_Comm comm);

// One subcommand's run on MPI_COMM_WORLD. The command line is read before
// MPI starts: a bad value costs no MPI start-up, and every rank refuses it
// alike, so none waits for the others. Messages about it go to stderr from
// one process ("loud"): the one the launcher numbers 0 (OMPI_COMM_WORLD_RANK,
// PMIX_RANK, PMI_RANK or SLURM_PROCID; every process where none is set).
// parse() starts MPI once the command line is good; rank() and size() are
// MPI_COMM_WORLD's from then on.
class Harness {
public:
    using Usage = void (*)(FILE *);

    // `sub`: the subcommand's name, the prefix of every message; `usage`
    // prints its help.
    Harness(const char *sub, Usage usage);

    int rank() const { return rank_; } // after parse() returned 0
    int size() const { return size_; }
    bool json() const { return json_; } // --json was given

    // ---- options: --NAME and what it does; --help and --json are built in.
    void flag(const char *name, std::function<void()> set);
    // Read by parse_integer, then set(value).
    void integer(const char *name, long long min, long long max, std::function<void(long long)> set);
    // One of `values`, else "--NAME 'TEXT' is not A, B or C".
    void choice(const char *name, std::vector<std::string> values, std::function<void(const std::string &)> set);
    // Any text: check returns false after refuse() has said why.
    void text(const char *name, std::function<bool(const char *)> check);

    // 0: run (MPI started); 1: --help printed (exit 0); 2: usage error
    // printed. MPI is started only for 0.
    int parse(int argc, char **argv);

    // Prints "dsm-bench SUB: MESSAGE" where loud; returns false.
    bool refuse(const char *fmt, ...) const __attribute__((format(printf, 2, 3)));

    // Decimal digits with an optional leading '-', nothing else (no spaces,
    // no suffix, no hex), no overflow, within [min, max]; otherwise refuses
    // "OPT 'TEXT' is not an integer from MIN to MAX".
    bool parse_integer(const std::string &opt, const char *text, long long min, long long max, long long *out) const;

    // Whether the memory a run needs fits: `bytes_per_rank` (computed in
    // double by the caller, so that no size overflows) times the ranks of
    // `comm` on this node at most the node's physical memory. Collective over
    // `comm` (MPI_COMM_SELF for a one-process benchmark): every rank gets the
    // same answer. Refused "WHAT needs N bytes per rank (R ranks on this
    // node), more than the M bytes of memory of this node".
    bool fits_memory(const std::string &what, double bytes_per_rank, MPI_Comm comm = MPI_COMM_WORLD) const;

    // The slowest rank's value of `seconds` (collective on MPI_COMM_WORLD).
    double slowest(double seconds) const;
    // One call of f on every rank, started together: the slowest rank's time.
    double time_once(const std::function<void()> &f) const;
    // The median over `iters` calls of f, after one warm-up call, of the
    // slowest rank's time; the ranks start each call together.
    double time_median(int iters, const std::function<void()> &f) const;

    // Runs the measurement: an error thrown on one rank (dsm::Error) is
    // printed as "dsm-bench SUB: rank R: MESSAGE" and gives 1; any other
    // exception aborts the job, since the other ranks may wait in a
    // collective for this one.
    int guard(const std::function<int()> &body) const;

    // A JSON result: "format" ("dsm-bench-SUB") and "format_version" first,
    // then `fields` (an object) in their order.
    Json result(const Json &fields = Json::object()) const;
    // Rank 0 prints `out` on one line.
    void print(const Json &out) const;

private:
    const char *sub_;
    Usage usage_;
    int rank_ = 0, size_ = 1;
    bool loud_ = true, json_ = false;
    std::vector<tools::CliOption> options_;
};

// dsm-bench's main: the subcommand (whose Harness::parse starts MPI, with
// MPI_THREAD_MULTIPLE for the subcommands that call MPI from a second
// thread), then MPI_Finalize where MPI was started.
int main(int argc, char **argv);

} // namespace bench
} // namespace dsm
