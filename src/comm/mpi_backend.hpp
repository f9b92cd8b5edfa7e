// The "mpi" backend (mpi_backend.cc): plain MPI collectives, device memory
// staged through page-locked host buffers where MPI is not CUDA-aware.
#pragma once

#include <map>
#include <vector>

#include <mpi.h>

#include "comm/backend.hpp"
#include "comm/common.hpp"
#include "core/comm.hpp"
#include "cuda/device.hpp"

namespace dsm {
namespace comm {

// Device memory in the "mpi" backend. Buffers in CUDA device memory are
// given to MPI directly when the MPI library is CUDA-aware
// (cuda::cuda_aware_mpi(), asked once per backend) and the operation needs
// no reduction code of libdsm's own (fp16/bf16 reductions run a user-defined
// MPI_Op on the host); otherwise they go through page-locked host buffers:
// device -> host, the host operation, host -> device. Without a usable
// device nothing is checked: host pointers cost nothing extra.
class DeviceStaging {
public:
    DeviceStaging();
    bool active() const noexcept { return gpus_; }
    bool cuda_aware() const noexcept { return cuda_aware_; }
    // Whether any of the pointers is device memory (false without a device).
    bool on_device(const void *a, const void *b = nullptr) const noexcept;
    // Page-locked buffers of at least `bytes`, kept for the next call.
    void *send(size_t bytes) { return grow(send_, bytes); }
    void *recv(size_t bytes) { return grow(recv_, bytes); }
    // memmove, or a CUDA copy when either side is device memory.
    void copy(void *dst, const void *src, size_t bytes) const;

private:
    static void *grow(cuda::PinnedBuffer &b, size_t bytes);
    bool gpus_ = false, cuda_aware_ = false;
    cuda::PinnedBuffer send_, recv_;
};

// Plain MPI collectives on a duplicate of the group's communicator. In-place
// reduce_scatterv goes through a private temporary (MPI forbids overlapping
// buffers), leaving the other blocks of send as they were. Stats
// count the volume of the usual algorithms: a reduce-scatter or allgather
// sends the other members' share, an allreduce twice that ((n-1)/n of the
// buffer each way), bcast the buffer from the root.
class MpiBackend final : public Backend {
public:
    explicit MpiBackend(MPI_Comm comm);

    const char *name() const noexcept override { return "mpi"; }
    int size() const noexcept override { return size_; }
    int rank() const noexcept override { return rank_; }
    MPI_Comm comm() const noexcept override { return comm_.get(); }
    // Host and device memory; complete before returning (a device queue: after its earlier work).
    Capabilities capabilities() const noexcept override { return capabilities_of(Kind::MPI); }

    void allreduce(const void *send, void *recv, size_t count, dsm_dtype_t dtype, Op op, Queue queue = {}) override;
    void reduce_scatterv(const void *send, void *recv, const std::vector<size_t> &counts, dsm_dtype_t dtype,
                         Op op, Queue queue = {}) override;
    void allgatherv(const void *send, void *recv, const std::vector<size_t> &counts, dsm_dtype_t dtype,
                    Queue queue = {}) override;
    void alltoallv(const void *send, const std::vector<size_t> &send_counts, const std::vector<size_t> &send_displs,
                   void *recv, const std::vector<size_t> &recv_counts, const std::vector<size_t> &recv_displs,
                   dsm_dtype_t dtype, Queue queue = {}) override;
    // MPI reads and writes the buffers in place (Backend::alltoall_pieces):
    // every byte off the node.
    bool alltoall_pieces(const std::vector<Exposed> &exposed, const PlanFn &send_plan, const PlanFn &recv_plan,
                         Queue queue = {}) override;
    void bcast(void *buf, size_t count, dsm_dtype_t dtype, int root, Queue queue = {}) override;
    void barrier(Queue queue = {}) override;
    void *alloc_shared(size_t bytes) override;
    void free_shared(void *ptr) override;
    void abandon() noexcept override;

private:
    Comm comm_;
    int rank_ = 0, size_ = 1;
    MpiTypes types_;
    ScratchBuffer tmp_; // in-place reduce_scatterv
    std::map<void *, AlignedPtr> allocs_;
    DeviceStaging device_;
};

} // namespace comm
} // namespace dsm
