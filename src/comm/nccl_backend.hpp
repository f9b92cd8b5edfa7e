// The "nccl" backend (nccl_backend.cc): NCCL collectives on CUDA device memory.
#pragma once

#include <memory>
#include <vector>

#include <mpi.h>

#include "comm/backend.hpp"
#include "core/comm.hpp"
#include "cuda/device.hpp" // CUstream_st (NcclBackend::stream())

namespace dsm {
namespace comm {

// NCCL collectives on CUDA device memory (nccl_backend.cc). Built where
// configure found CUDA and NCCL (DSM_HAVE_NCCL_BACKEND); elsewhere
// create_backend(Kind::NCCL) fails with DSM_ERR_NOT_SUPPORTED on every rank.
//
// Creation (collective over the group; every member fails alike, none
// hangs): each member uses the device cuda::select_device() chose for the
// process (from the mesh placement), else one chosen here by
// cuda::use_device() from DSM_CUDA_DEVICE or its index among the group's
// ranks on its node; without a usable device every member throws
// DSM_ERR_NOT_SUPPORTED with the reason. Rank 0 makes the ncclUniqueId, MPI
// broadcasts it, and ncclCommInitRankConfig builds a non-blocking
// communicator. NCCL refuses two members on one device (DSM_ERR_NCCL).
//
// split(color, key): the communicators of a mesh's dimensions come from one
// communicator, split by ncclCommSplit (NCCL >= 2.18, which shares the
// parent's resources and needs no new unique id), rather than one
// ncclCommInitRank per group; with an older NCCL each group builds its own.
//
// Buffers: every pointer is CUDA device or managed memory, checked per call
// (DSM_ERR_INVALID_ARGUMENT naming the argument); alloc_shared() returns
// zeroed cudaMalloc memory and is local. In-place forms as in Backend.
//
// Stream-ordered: on a device queue (Queue(stream)) a call enqueues its NCCL
// operations on that stream and returns once NCCL has accepted them; the
// caller calls synchronize(queue) before it reads the results on the host or
// reuses the buffers outside the stream. On the host queue (the default) a
// call enqueues on the backend's own stream (stream(): a blocking stream, so
// work the caller put on the legacy default stream is ordered before the
// call; work on other streams must be complete) and returns once the stream
// has run them, as the host backends do.
// Collectives map onto NCCL: allreduce, bcast and equal reduce-scatter and
// allgather directly; uneven reduce_scatterv as one ncclReduce per member and
// uneven allgatherv as one ncclBroadcast per member, each in one NCCL group;
// alltoallv as grouped ncclSend/ncclRecv (this member's own block a device
// copy); barrier as a one-element allreduce. Reductions: FLOAT32, FLOAT64,
// FLOAT16, BFLOAT16 (NCCL rounds 16-bit values at each of its steps, so
// results equal the other backends' within floating-point summation order;
// they have the same bits on every member); data movement: every dtype.
//
// alltoall_packed: pack(peer, buf) and unpack(peer, buf) receive DEVICE
// pointers into the backend's staging buffers. They may copy synchronously
// (cudaMemcpy) or enqueue work on stream() (a kernel, cudaMemcpyAsync): the
// backend's sends follow on the stream, and the call returns once the stream
// has run what the unpacks enqueued, on every queue (the staging buffers are
// reused by the next call). Failures behave as in Backend (pack
// failures agreed over MPI before any data moves). alltoall_direct: the
// default (false: the caller packs).
//
// Failures: every wait polls ncclCommGetAsyncError and the stream; after an
// NCCL or CUDA error the member aborts its NCCL communicator (ncclCommAbort,
// so nothing of it waits on the peers any more; the peers fail by their own
// error or timeout) and throws DSM_ERR_NCCL (NCCL's error string and last
// error) or DSM_ERR_CUDA; later calls throw DSM_ERR_STATE. When an operation
// has not completed within DSM_COMM_TIMEOUT seconds (formerly
// DSM_NCCL_TIMEOUT, still read), the member aborts its communicator the same
// way and then ends the job as the watchdog does (core/watchdog.hpp: one
// message naming the operation, MPI_Abort with exit status 75).
// Argument errors are thrown before anything is enqueued, and the backend
// stays usable. The destructor finalizes the communicator (collective, with
// the same timeout, then an abort); abandon() aborts it.
//
// Stats as the mpi backend (every byte counted as off the node).
class NcclBackend final : public Backend {
public:
    explicit NcclBackend(MPI_Comm comm); // each member takes the GPU of its index on its host
    ~NcclBackend() override;

    const char *name() const noexcept override { return "nccl"; }
    int size() const noexcept override { return size_; }
    int rank() const noexcept override { return rank_; }
    MPI_Comm comm() const noexcept override { return comm_.get(); }
    // Device memory, stream-ordered.
    Capabilities capabilities() const noexcept override { return capabilities_of(Kind::NCCL); }
    // Waits for the work enqueued on `queue` (a host queue: nothing to wait
    // for), with the checks and the timeout of every NCCL wait.
    void synchronize(Queue queue = {}) override;
    // This member's CUDA device and the backend's stream (a cudaStream_t).
    int device() const noexcept { return device_; }
    CUstream_st *stream() const noexcept;

    // The backend of this member's group after MPI_Comm_split(comm(), color,
    // key) (a mesh dimension's group: ranks with equal color), its NCCL
    // communicator split from this one (ncclCommSplit, NCCL >= 2.18; else
    // built as by the constructor). Collective over comm(); color < 0: this
    // member joins no group and gets NULL. Every member fails alike.
    std::unique_ptr<NcclBackend> split(int color, int key);

    void allreduce(const void *send, void *recv, size_t count, dsm_dtype_t dtype, Op op, Queue queue = {}) override;
    void reduce_scatterv(const void *send, void *recv, const std::vector<size_t> &counts, dsm_dtype_t dtype,
                         Op op, Queue queue = {}) override;
    void allgatherv(const void *send, void *recv, const std::vector<size_t> &counts, dsm_dtype_t dtype,
                    Queue queue = {}) override;
    void alltoallv(const void *send, const std::vector<size_t> &send_counts, const std::vector<size_t> &send_displs,
                   void *recv, const std::vector<size_t> &recv_counts, const std::vector<size_t> &recv_displs,
                   dsm_dtype_t dtype, Queue queue = {}) override;
    void alltoall_packed(const std::vector<size_t> &send_bytes, const std::vector<size_t> &recv_bytes,
                         const PackFn &pack, const UnpackFn &unpack, Queue queue = {}) override;
    void bcast(void *buf, size_t count, dsm_dtype_t dtype, int root, Queue queue = {}) override;
    void barrier(Queue queue = {}) override;
    void *alloc_shared(size_t bytes) override;
    void free_shared(void *ptr) override;
    void abandon() noexcept override;

private:
    struct SplitTag {};

public:
    // split()'s child: `comm` (owned) and this member's device; split() sets
    // the rest. Public for make_unique; only split() can name the tag.
    NcclBackend(SplitTag, Comm comm, int device);

private:
    struct Impl; // the NCCL communicator, the stream and the device memory
    Comm comm_;
    int rank_ = 0, size_ = 1, device_ = -1;
    std::unique_ptr<Impl> impl_; // after comm_: released first
};

} // namespace comm
} // namespace dsm
