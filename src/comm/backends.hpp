// Internal declarations of the backends (create_backend() picks one) and the
// helpers they share: aligned buffers, MPI datatypes and reduction ops per
// dtype, and MPI collectives that take size_t counts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <map>
#include <memory>
#include <vector>

#include <mpi.h>

#include "comm/backend.hpp"
#include "core/comm.hpp"

namespace dsm {
namespace comm {

// ---------------------------------------------------------------- buffers

struct FreeDeleter {
    void operator()(void *p) const noexcept { std::free(p); }
};
using AlignedPtr = std::unique_ptr<void, FreeDeleter>;

// `bytes` (at least 1) aligned to 64 bytes, zeroed when asked;
// DSM_ERR_OUT_OF_MEMORY naming the size.
AlignedPtr aligned_bytes(size_t bytes, bool zero);

// Private working memory that only grows; its contents are not kept.
class ScratchBuffer {
public:
    void *get(size_t bytes);

private:
    AlignedPtr ptr_;
    size_t bytes_ = 0;
};

// ---------------------------------------------------------------- checks

// count * esize, or DSM_ERR_INVALID_ARGUMENT naming `what` when it overflows.
size_t checked_bytes(size_t count, size_t esize, const char *what);

// Exclusive prefix sums of counts (the block offsets) and their total in
// `total`; DSM_ERR_INVALID_ARGUMENT unless counts.size() == group_size and
// the total fits when multiplied by esize.
std::vector<size_t> block_offsets(const std::vector<size_t> &counts, int group_size, size_t esize,
                                  const char *what, size_t *total);

// DSM_ERR_NULL_POINTER when `p` is NULL but `bytes` are to be read or written.
void require_buffer(const void *p, size_t bytes, const char *what);

// ---------------------------------------------------------------- MPI

// The MPI datatype and reduction op of each dsm dtype. FLOAT16 and BFLOAT16
// travel as a 2-byte contiguous type with user ops that widen to fp32,
// combine, and round once per combination; created on first use, freed by
// the destructor (unless MPI is finalized). Not thread safe.
class MpiTypes {
public:
    MpiTypes() = default;
    ~MpiTypes();
    MpiTypes(const MpiTypes &) = delete;
    MpiTypes &operator=(const MpiTypes &) = delete;

    MPI_Datatype type(dsm_dtype_t dtype);
    // The op of a reducible (dtype, op): see check_reduce().
    MPI_Op op(dsm_dtype_t dtype, Op op);

private:
    MPI_Datatype half_ = MPI_DATATYPE_NULL;
    MPI_Op ops_[2][3] = {{MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL}, {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL}};
};

namespace detail {
// The largest count or displacement passed to one MPI call (INT_MAX). Larger
// collectives are chunked: allreduce and bcast into several calls,
// reduce_scatterv into one MPI_Reduce per member and chunk, allgatherv into
// MPI_Bcast per member and chunk, alltoallv into point-to-point messages.
// Tests lower the limit to exercise the chunked paths on small buffers.
size_t mpi_count_limit() noexcept;
void set_mpi_count_limit(size_t limit) noexcept; // 0 restores INT_MAX
} // namespace detail

// MPI collectives over `comm` with element counts in size_t (esize: bytes of
// one element of `type`). send == recv: in place.
void mpi_allreduce(MPI_Comm comm, const void *send, void *recv, size_t count, MPI_Datatype type, MPI_Op op,
                   size_t esize);
// send holds the blocks of all members in rank order; recv (counts[rank]
// elements) must not overlap send.
void mpi_reduce_scatterv(MPI_Comm comm, const void *send, void *recv, const std::vector<size_t> &counts,
                         MPI_Datatype type, MPI_Op op, size_t esize);
// Each member's block already lies in recv at displs[rank]; afterwards every
// member has every block at its displacement.
void mpi_allgatherv_in_place(MPI_Comm comm, void *recv, const std::vector<size_t> &counts,
                             const std::vector<size_t> &displs, MPI_Datatype type, size_t esize);
void mpi_alltoallv(MPI_Comm comm, const void *send, const std::vector<size_t> &send_counts,
                   const std::vector<size_t> &send_displs, void *recv, const std::vector<size_t> &recv_counts,
                   const std::vector<size_t> &recv_displs, MPI_Datatype type, size_t esize);
// mpi_alltoallv once the members agree on `widest`, the largest count or
// displacement any of them passes (an allreduce of their extents, which the
// caller may combine with one of its own).
void mpi_alltoallv_agreed(MPI_Comm comm, unsigned long long widest, const void *send,
                          const std::vector<size_t> &send_counts, const std::vector<size_t> &send_displs,
                          void *recv, const std::vector<size_t> &recv_counts, const std::vector<size_t> &recv_displs,
                          MPI_Datatype type, size_t esize);
void mpi_bcast(MPI_Comm comm, void *buf, size_t count, MPI_Datatype type, int root, size_t esize);

// Checks and Stats of alltoallv and bcast, the same in both backends.
void check_alltoallv(int size, const void *send, const std::vector<size_t> &send_counts,
                     const std::vector<size_t> &send_displs, const void *recv,
                     const std::vector<size_t> &recv_counts, const std::vector<size_t> &recv_displs,
                     size_t esize);
void check_bcast(int size, const void *buf, size_t count, size_t esize, int root);

// ---------------------------------------------------------------- alltoall_packed

// The checks of alltoall_packed(), the same in every backend: both size
// vectors have `size` entries and agree on this member's block to itself
// (DSM_ERR_INVALID_ARGUMENT naming the values), and both callbacks are set
// (DSM_ERR_NULL_POINTER).
void check_packed(int size, int rank, const std::vector<size_t> &send_bytes, const std::vector<size_t> &recv_bytes,
                  const Backend::PackFn &pack, const Backend::UnpackFn &unpack);

// The nonzero blocks of `bytes` laid out one after the other from `start`,
// each at a 64-byte boundary (zero-byte blocks get offset 0); *end: the end
// of the layout. DSM_ERR_INVALID_ARGUMENT naming `what` when it overflows.
std::vector<size_t> packed_layout(const std::vector<size_t> &bytes, size_t start, const char *what, size_t *end);

// An exception from a pack or unpack callback, held until the members have
// reached the call's next synchronization point, so that a throw on one
// member does not leave the others waiting there.
class Deferred {
public:
    // Run f(); true when it returned, false when it threw (the exception is kept).
    template <typename F> bool run(F &&f) noexcept {
        try {
            f();
            return true;
        } catch (...) {
            keep(std::current_exception());
            return false;
        }
    }
    bool failed() const noexcept { return error_ != nullptr; }
    // The status the peers report: the Error's own, DSM_ERR_OUT_OF_MEMORY for
    // std::bad_alloc, DSM_ERR_INTERNAL for anything else; DSM_SUCCESS when none.
    dsm_status_t status() const noexcept { return status_; }
    void rethrow_if_failed() const {
        if (error_) std::rethrow_exception(error_);
    }

private:
    void keep(std::exception_ptr e) noexcept;
    std::exception_ptr error_;
    dsm_status_t status_ = DSM_SUCCESS;
};

// After the members agreed that some pack failed: this member's own
// exception when it failed, else a dsm::Error with the status of the lowest
// failing member `member`.
[[noreturn]] void packed_failure(const Deferred &mine, int member, dsm_status_t status);

// ---------------------------------------------------------------- backends

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

    void allreduce(const void *send, void *recv, size_t count, dsm_dtype_t dtype, Op op) override;
    void reduce_scatterv(const void *send, void *recv, const std::vector<size_t> &counts, dsm_dtype_t dtype,
                         Op op) override;
    void allgatherv(const void *send, void *recv, const std::vector<size_t> &counts, dsm_dtype_t dtype) override;
    void alltoallv(const void *send, const std::vector<size_t> &send_counts, const std::vector<size_t> &send_displs,
                   void *recv, const std::vector<size_t> &recv_counts, const std::vector<size_t> &recv_displs,
                   dsm_dtype_t dtype) override;
    void bcast(void *buf, size_t count, dsm_dtype_t dtype, int root) override;
    void barrier() override;
    void *alloc_shared(size_t bytes) override;
    void free_shared(void *ptr) override;
    void abandon() noexcept override;

private:
    Comm comm_;
    int rank_ = 0, size_ = 1;
    MpiTypes types_;
    ScratchBuffer tmp_; // in-place reduce_scatterv
    std::map<void *, AlignedPtr> allocs_;
};

// RAII owner of an MPI_Win_allocate_shared window on a node communicator,
// each rank its own segment of equal size (page-aligned, "noncontig"), kept
// in a passive-target epoch (lock_all) for MPI_Win_sync. Freeing is
// collective over the node.
class SharedWindow {
public:
    SharedWindow() = default;
    SharedWindow(MPI_Comm node, size_t bytes);
    ~SharedWindow() { reset(); }
    SharedWindow(SharedWindow &&o) noexcept;
    SharedWindow &operator=(SharedWindow &&o) noexcept;
    SharedWindow(const SharedWindow &) = delete;
    SharedWindow &operator=(const SharedWindow &) = delete;

    // The 64-byte aligned start of local rank p's segment, in this process.
    char *base(int p) const noexcept { return bases_[static_cast<size_t>(p)]; }
    size_t bytes() const noexcept { return bytes_; }
    void sync() const noexcept;
    void reset() noexcept;
    // Forget the window without freeing it (Backend::abandon()).
    void abandon() noexcept {
        win_ = MPI_WIN_NULL;
        bases_.clear();
        bytes_ = 0;
    }

private:
    MPI_Win win_ = MPI_WIN_NULL;
    std::vector<char *> bases_;
    size_t bytes_ = 0;
};

// The node communicator of `group`: ranks with equal node_color (all of
// them when negative), further split by MPI_COMM_TYPE_SHARED; local ranks in
// group order; MPI_ERRORS_RETURN.
Comm node_comm(MPI_Comm group, int node_color);

// Shared memory inside each node, MPI between nodes.
//
// Inside a node every rank publishes where its buffers are (a window
// allocation and offset, or a copy in its scratch window) and reads its
// peers' data in place: a reduction of a block sums the node's ranks in
// ascending local rank, so every rank computes identical bits.
//
// Between nodes the buffer is cut into "lanes": lane v holds the blocks of
// the members whose local rank is v. On each node, local rank v % L (L the
// node's rank count) serves lane v: it reduces the lane's blocks over its
// node, then runs MPI on the lane's communicator (one rank per node, in node
// order): a reduce-scatter that leaves each block at its owner, and for an
// allreduce or allgather an allgather that gives every node all the lane's
// blocks, which the node's ranks then copy from the server. Every rank
// drives the inter-node traffic of its own blocks, so the links of all local
// ranks are used, and unequal nodes still work (a rank serves several lanes).
//
// Buffers: a pointer inside an alloc_shared allocation (any allocation, any
// offset, which may differ between ranks) is read by the peers in place;
// any other input is first copied into this rank's segment of a scratch
// window, and results that peers must read go there too. The scratch window
// grows collectively to the largest need on the node (in 2 MiB steps) and is
// kept. In place: allreduce send == recv; reduce_scatterv recv == this
// rank's block of send (the other blocks are left as they were); allgatherv
// send == this rank's block of recv.
//
// Synchronization: MPI_Win_sync + MPI_Barrier on the node communicator at the
// start (data ready, locations published), between the phases, and at the
// end (peers done reading, so the caller may reuse its buffers). A flag-based
// barrier would spin, which starves oversubscribed ranks; MPI's barrier
// yields when asked to, and costs microseconds next to the data.
//
// alltoall_packed on one node: each member packs its blocks into its
// segment of the scratch window, behind a table of (offset, bytes) per peer;
// after one node_sync() every member unpacks its blocks from the peers'
// segments, and a second node_sync() lets the segments be reused. A member
// whose segment is too small packs nothing and says so in its control slot;
// then the window grows (collectively, to the largest need on the node), the
// members that had packed copy their segments over, and the others pack.
// Over several nodes alltoall_packed is the default's MPI_Alltoallv.
//
// Stats: bytes_off_node counts the bytes sent over MPI between nodes (0 on
// one node). alltoallv and bcast are plain MPI on the group. alloc_shared, free_shared
// and the destructor are collective over the node (window allocation).
class ShmBackend final : public Backend {
public:
    ShmBackend(MPI_Comm comm, int node_color);
    ~ShmBackend() override;

    const char *name() const noexcept override { return "shm"; }
    int size() const noexcept override { return size_; }
    int rank() const noexcept override { return rank_; }
    MPI_Comm comm() const noexcept override { return comm_.get(); }
    int nodes() const noexcept { return nodes_; }
    int local_size() const noexcept { return local_size_; }

    void allreduce(const void *send, void *recv, size_t count, dsm_dtype_t dtype, Op op) override;
    void reduce_scatterv(const void *send, void *recv, const std::vector<size_t> &counts, dsm_dtype_t dtype,
                         Op op) override;
    void allgatherv(const void *send, void *recv, const std::vector<size_t> &counts, dsm_dtype_t dtype) override;
    void alltoallv(const void *send, const std::vector<size_t> &send_counts, const std::vector<size_t> &send_displs,
                   void *recv, const std::vector<size_t> &recv_counts, const std::vector<size_t> &recv_displs,
                   dsm_dtype_t dtype) override;
    void alltoall_packed(const std::vector<size_t> &send_bytes, const std::vector<size_t> &recv_bytes,
                         const PackFn &pack, const UnpackFn &unpack) override;
    void bcast(void *buf, size_t count, dsm_dtype_t dtype, int root) override;
    void barrier() override;
    void *alloc_shared(size_t bytes) override;
    void free_shared(void *ptr) override;
    void abandon() noexcept override;

    // Where a buffer is for the node's ranks: an allocation (its id), the
    // scratch window, or (local_size 1 only) this process's own address.
    struct Where {
        int64_t seg;
        uint64_t off;
    };
    // What each rank publishes in the control window at the start of a call.
    struct Slot {
        Where src, dst;
        uint64_t scratch; // bytes of scratch this rank needs
        uint64_t copied;  // whether it copies its input into scratch
        // alltoall_packed: whether the blocks are packed (kPacked), wait for
        // a larger window (kPackLater) or failed to pack (kPackFailed, with
        // the status).
        int32_t packed;
        int32_t status;
    };

private:
    struct Lane {
        int v;
        Comm comm;
    };

    Where locate(const void *p, size_t bytes) const;
    char *peer_ptr(int p, Where w) const;
    void node_sync();
    void begin(Where src, Where dst, size_t scratch, const void *copy_from, size_t copy_bytes);
    void ensure_scratch(size_t bytes);
    void alltoall_packed_node(const std::vector<size_t> &send_bytes, const std::vector<size_t> &recv_bytes,
                              const PackFn &pack, const UnpackFn &unpack);
    // The lane's blocks (offs/counts, indexed by group rank) reduced over
    // this node's ranks' inputs, in node order, into private memory (or, on a
    // node of one rank and when direct_ok, the input itself); NULL when the
    // lane's blocks are all empty. lane_counts/lane_displs: per node.
    const char *lane_partial(int v, const std::vector<size_t> &offs, const std::vector<size_t> &counts,
                             std::vector<size_t> *lane_counts, std::vector<size_t> *lane_displs,
                             dsm_dtype_t dtype, Op op, size_t esize, bool direct_ok);

    // Communicators first: the windows are freed before them.
    Comm comm_, node_;
    std::vector<Lane> lanes_; // the lanes this rank serves (several nodes only)
    int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1, node_index_ = 0, nodes_ = 1;
    std::vector<int> node_of_, local_of_, node_size_;
    std::vector<std::vector<int>> members_; // group ranks per node, in local-rank order
    MpiTypes types_;
    SharedWindow control_, scratch_;
    std::map<int64_t, SharedWindow> allocs_;
    int64_t next_id_ = 0;
    std::vector<Slot> peers_; // the slots read at the start of the current call
    ScratchBuffer partial_;
};

} // namespace comm
} // namespace dsm
