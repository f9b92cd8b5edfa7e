// What every backend shares: the equal-block forms, kind names, and the
// collective choice of a backend.
#include "dsm_config.h"

#include "comm/backend.hpp"

#include "comm/backends.hpp"
#include "core/error.hpp"
#include "core/log.hpp"

namespace dsm {
namespace comm {

void Backend::reduce_scatter(const void *send, void *recv, size_t count, dsm_dtype_t dtype, Op op) {
    reduce_scatterv(send, recv, std::vector<size_t>(static_cast<size_t>(size()), count), dtype, op);
}

void Backend::allgather(const void *send, void *recv, size_t count, dsm_dtype_t dtype) {
    allgatherv(send, recv, std::vector<size_t>(static_cast<size_t>(size()), count), dtype);
}

Kind kind_from_name(const std::string &name) {
    if (name == "auto") return Kind::AUTO;
    if (name == "mpi") return Kind::MPI;
    if (name == "shm") return Kind::SHM;
    DSM_FAIL(DSM_ERR_INVALID_ARGUMENT, "communication backend \"", name,
             "\" is not known: use \"auto\", \"mpi\" or \"shm\"");
}

namespace {

// The largest number of the group's ranks on one node, the same on every rank.
int max_ranks_per_node(MPI_Comm comm, int node_color) {
    const Comm node = node_comm(comm, node_color);
    int local = 1, most = 1;
    DSM_CHECK_MPI(MPI_Comm_size(node.get(), &local));
    DSM_CHECK_MPI(MPI_Allreduce(&local, &most, 1, MPI_INT, MPI_MAX, comm));
    return most;
}

} // namespace

std::unique_ptr<Backend> create_backend(MPI_Comm comm, Kind kind, int node_color) {
    DSM_REQUIRE(comm != MPI_COMM_NULL, DSM_ERR_INVALID_ARGUMENT, "the communicator is MPI_COMM_NULL");
    switch (kind) {
    case Kind::MPI: return std::make_unique<MpiBackend>(comm);
    case Kind::SHM: return std::make_unique<ShmBackend>(comm, node_color);
    case Kind::AUTO: {
        // Every rank sees the same maximum, so all take the same branch.
        if (max_ranks_per_node(comm, node_color) < 2) return std::make_unique<MpiBackend>(comm);
        try {
            return std::make_unique<ShmBackend>(comm, node_color);
        } catch (const Error &e) {
            // ShmBackend agrees on window failures, so every rank lands here.
            if (e.status() != DSM_ERR_NOT_SUPPORTED) throw;
            DSM_WARN(INIT, "shared-memory windows are not available (%s): using the mpi backend", e.what());
            return std::make_unique<MpiBackend>(comm);
        }
    }
    }
    DSM_FAIL(DSM_ERR_INVALID_ARGUMENT, "backend kind ", static_cast<int>(kind), " is not AUTO, MPI or SHM");
}

} // namespace comm
} // namespace dsm
