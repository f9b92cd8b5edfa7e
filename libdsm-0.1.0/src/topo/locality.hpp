// Where each rank runs: host, node, NUMA domain, the GPUs of its node.
// Real nodes come from MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) and hwloc;
// DSM_SIM_NODES / DSM_SIM_NUMA / DSM_SIM_GPUS simulate them for tests.
#pragma once

#include <string>
#include <vector>

#include <mpi.h>

namespace dsm::topo {

struct RankInfo {
    int rank = 0;        // rank in the communicator that was examined
    std::string host;    // host name (the simulated node name under DSM_SIM_NODES)
    int node = 0;        // node index, nodes numbered by their lowest rank
    int local_rank = 0;  // index among the ranks of the node, by rank
    int local_size = 1;  // ranks on the node
    int numa = -1;       // NUMA domain the rank is bound to, -1 if unknown or several
    int node_gpus = 0;   // GPUs on the node
};

// Collective over `comm` (which must have MPI_ERRORS_RETURN): every rank's
// information, indexed by rank. A bad DSM_SIM_* value fails on every rank.
std::vector<RankInfo> discover(MPI_Comm comm);

// This process's NUMA domain (-1 if unknown or several) and its host's GPU
// count, from one hwloc topology load (-1 and 0 without hwloc).
struct SelfProbe {
    int numa = -1;
    int gpus = 0;
};
SelfProbe probe_self();

} // namespace dsm::topo
