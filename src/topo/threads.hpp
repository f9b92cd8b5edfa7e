// How many threads a rank's CPU kernels use (the optimizer, conversions,
// checksums: OpenMP). Unset, every rank of a node would start one thread per
// core of the node, and ranks x cores threads fight for the cores.
#pragma once

#include <string>

namespace dsm::topo {

// What a rank sees of its cores (probe_cores()).
struct CoreProbe {
    int node_cores = 1;   // cores of this host the process may use (hwloc; else online CPUs)
    int bound_cores = 1;  // cores in the process's CPU binding
    bool bound = false;   // the binding is narrower than the host
};
CoreProbe probe_cores();

struct ThreadChoice {
    int threads = 1;
    std::string source; // "DSM_NUM_THREADS", "OMP_NUM_THREADS", "binding" or "node share"
};

// The choice, as a pure function (tests call it): `dsm_threads` (> 0: set by
// DSM_NUM_THREADS) first, then `omp_threads` (> 0: OMP_NUM_THREADS is set,
// OpenMP's count), then the cores of the binding when the rank is bound,
// else the node's cores shared by its `local_size` ranks (at least one).
ThreadChoice choose_threads(int dsm_threads, int omp_threads, const CoreProbe &cores, int local_size);

// Choose for this rank (DSM_NUM_THREADS, OMP_NUM_THREADS, the binding, the
// `local_size` ranks of its node); the caller applies it (OpenMP and the
// kernels that keep their own count). Logs the choice at
// INFO; `warn` (one rank of each node): warns once per process when
// local_size x threads exceed the node's cores. A bad DSM_NUM_THREADS is
// DSM_ERR_INVALID_ARGUMENT naming it.
ThreadChoice decide_threads(int local_size, bool warn);

} // namespace dsm::topo
