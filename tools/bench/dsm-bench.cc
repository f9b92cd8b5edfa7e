// dsm-bench: see bench.hpp and doc/dsm-bench.md.
#include <cstdio>
#include <cstring>

#include <mpi.h>

#include "bench.hpp"

namespace {

void usage(FILE *out) {
    std::fprintf(out,
                 "usage: dsm-bench SUBCOMMAND [options] [--json]\n"
                 "  optimizer     optimizer throughput (CPU, or --device cuda) next to the memory-bandwidth bound\n"
                 "                and PyTorch's torch.optim.Adam (when python3 has torch)\n"
                 "  collectives   each backend collective next to the raw MPI call on the same bytes\n"
                 "  zero          a ZeRO step split into reduce, optimizer and gather; bytes and memory\n"
                 "  checkpoint    checkpoint save and load next to plain write()/read() of the same bytes\n"
                 "  alltoall      the sequence-parallel (Ulysses) all-to-alls next to a raw MPI_Alltoall\n"
                 "                of the same bytes\n"
                 "  overlap       overlap_comm on a synthetic model: the step with overlap on and off next to\n"
                 "                the ideal max(compute, communication)\n"
                 "Run 'dsm-bench SUBCOMMAND --help' for its options; run the MPI ones under mpiexec.\n");
}

} // namespace

int main(int argc, char **argv) {
    // Line by line even into a pipe or a file (a job's output): each result
    // shows as it is measured, not when the run ends.
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    int provided = 0;
    const char *sub = argv[1];
    // overlap_comm's progress thread and the asynchronous checkpoint save's
    // thread call MPI beside the main thread.
    const bool threads = !std::strcmp(sub, "overlap") || !std::strcmp(sub, "checkpoint");
    MPI_Init_thread(&argc, &argv, threads ? MPI_THREAD_MULTIPLE : MPI_THREAD_FUNNELED, &provided);
    int rc;
    if (!std::strcmp(sub, "optimizer"))
        rc = dsm::bench::run_optimizer(argc - 2, argv + 2);
    else if (!std::strcmp(sub, "collectives"))
        rc = dsm::bench::run_collectives(argc - 2, argv + 2);
    else if (!std::strcmp(sub, "zero"))
        rc = dsm::bench::run_zero(argc - 2, argv + 2);
    else if (!std::strcmp(sub, "checkpoint"))
        rc = dsm::bench::run_checkpoint(argc - 2, argv + 2);
    else if (!std::strcmp(sub, "alltoall"))
        rc = dsm::bench::run_alltoall(argc - 2, argv + 2);
    else if (!std::strcmp(sub, "overlap"))
        rc = dsm::bench::run_overlap(argc - 2, argv + 2);
    else {
        std::fprintf(stderr, "dsm-bench: unknown subcommand '%s'\n", sub);
        usage(stderr);
        rc = 2;
    }
    MPI_Finalize();
    return rc;
}
