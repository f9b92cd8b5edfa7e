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
#include "cuda/device.hpp"
#include "cuda/device.hpp" // CUstream_st (NcclBackend::stream())

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
    DeviceStaging device_;
};

// RAII owner of an MPI_Win_allocate_shared window on a node communicator,
// each rank its own segment (page-aligned, "noncontig") of the bytes it asked
// for, which may differ between the ranks and may be zero, kept in a
// passive-target epoch (lock_all) for MPI_Win_sync. Freeing is collective
// over the node.
//
// Creation is collective over `group` (the node when MPI_COMM_NULL), which
// must contain the node, and safe when the filesystem behind the window
// (/dev/shm, or Open MPI's osc_sm_backing_directory) is too small: the node
// compares its total with the room there before asking MPI (whose own check
// fails on one rank and leaves the others waiting), and each rank allocates
// its pages with MADV_POPULATE_WRITE before they are touched (a store to a
// page a full tmpfs cannot give is SIGBUS). Every rank of `group` then
// throws the same DSM_ERR_OUT_OF_MEMORY naming the directory, the bytes
// needed and the bytes available.
class SharedWindow {
public:
    SharedWindow() = default;
    SharedWindow(MPI_Comm node, size_t bytes, MPI_Comm group = MPI_COMM_NULL);
    ~SharedWindow() { reset(); }
    SharedWindow(SharedWindow &&o) noexcept;
    SharedWindow &operator=(SharedWindow &&o) noexcept;
    SharedWindow(const SharedWindow &) = delete;
    SharedWindow &operator=(const SharedWindow &) = delete;

    // The 64-byte aligned start of local rank p's segment, in this process,
    // and the bytes that rank asked for; bytes(): this rank's.
    char *base(int p) const noexcept { return bases_[static_cast<size_t>(p)]; }
    size_t bytes(int p) const noexcept { return sizes_[static_cast<size_t>(p)]; }
    size_t bytes() const noexcept { return bytes_; }
    void sync() const noexcept;
    void reset() noexcept;
    // Forget the window without freeing it (Backend::abandon()).
    void abandon() noexcept {
        win_ = MPI_WIN_NULL;
        bases_.clear();
        sizes_.clear();
        bytes_ = 0;
    }

private:
    MPI_Win win_ = MPI_WIN_NULL;
    std::vector<char *> bases_;
    std::vector<size_t> sizes_; // per local rank
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
// alltoall_direct on one node: the first call makes a small node window and,
// on Linux, probes cross-memory attach (each member reads, with
// process_vm_readv, a value in every peer's private memory that the peer
// also published in shared memory; the members agree on the answer with an
// allreduce MIN over the node), kept for the backend's lifetime. Each call
// publishes, in the window, the address and size of each exposed buffer and
// where it lies in node-shared memory: the alloc_shared allocation (ids are
// the same on every member, which allocate in the same order) and the offset
// in the member's own segment, when the buffer lies wholly inside it. After
// one node_sync() every member reads every table, so all take the same path:
// - inputs in node-shared memory (every nonempty buffer of every member in an
//   allocation): each member copies its pieces with memcpy straight from its
//   mappings of the peers' segments (one pass in user space, no kernel, no
//   probe needed: any OS). A peer's pieces that are much more fragmented at
//   the source than at the destination (as below) and land in node-shared
//   memory are published as requests and written by the source's owner,
//   which copies its own pieces and those of all such peers one of each at
//   a time, so that it reads its input from start to end (Ulysses'
//   seq_to_head, where every peer wants a slice of every row). Calls that
//   bring a member 8 MiB or more are written with streaming stores;
// - else, with cross-memory attach, from each peer's private memory with
//   process_vm_readv, the permutation in the iovec lists (merged where
//   contiguous, at most IOV_MAX a call). The kernel pins the pages of each
//   remote iovec separately, so small pieces scattered over the source cost
//   far more than scattered destinations: when a peer's pieces are much more
//   fragmented at the source than at the destination (at least 64 source
//   runs, more than twice the destination's), the member publishes them with
//   the tables instead, and the peer pushes them with process_vm_writev (its
//   sources local, the destinations remote);
// - else false on every member (refused by ptrace rules or a container's
//   seccomp, or another OS), and the caller packs.
// Either way each member copies from itself first with memcpy, then from
// (me+k) % n. Where cross-memory attach works the plans are made before the
// first node_sync(), which carries a failing plan to every member; without
// it they are made once the tables have shown that the call runs, and one
// more node_sync() carries their outcome, so that a false return has called
// no plan. A last node_sync() lets the buffers change, and carries each
// member's outcome and the bytes it got from each peer (bytes_sent). The
// window has two halves used in turn by successive calls, so a member still
// reading one call's outcome is never overwritten by the next call; it grows
// (collectively) when the tables or push requests outgrow it. A group of one
// copies with memcpy.
//
// alloc_shared: each member may ask for its own number of bytes (zero
// included: every segment gets 64 bytes more, so none is empty); the
// pointers are 64-byte aligned.
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
    // alltoall_direct: the peers this member has, so far, read from and
    // written to in node-shared memory (inputs there), pulled from and
    // pushed to with cross-memory attach (one per peer and call; for the
    // tests and the benchmark).
    uint64_t direct_reads() const noexcept { return direct_reads_; }
    uint64_t direct_writes() const noexcept { return direct_writes_; }
    uint64_t direct_pulls() const noexcept { return direct_pulls_; }
    uint64_t direct_pushes() const noexcept { return direct_pushes_; }
    // For the tests: behave as where cross-memory attach is refused. Call on
    // every member before the first alltoall_direct.
    void refuse_cma() noexcept { refuse_cma_ = true; }

    void allreduce(const void *send, void *recv, size_t count, dsm_dtype_t dtype, Op op) override;
    void reduce_scatterv(const void *send, void *recv, const std::vector<size_t> &counts, dsm_dtype_t dtype,
                         Op op) override;
    void allgatherv(const void *send, void *recv, const std::vector<size_t> &counts, dsm_dtype_t dtype) override;
    void alltoallv(const void *send, const std::vector<size_t> &send_counts, const std::vector<size_t> &send_displs,
                   void *recv, const std::vector<size_t> &recv_counts, const std::vector<size_t> &recv_displs,
                   dsm_dtype_t dtype) override;
    void alltoall_packed(const std::vector<size_t> &send_bytes, const std::vector<size_t> &recv_bytes,
                         const PackFn &pack, const UnpackFn &unpack) override;
    bool alltoall_direct(const std::vector<Exposed> &exposed, const PlanFn &plan) override;
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
    // alltoall_direct: on the first call (collective), the window and, on
    // Linux, the probe of cross-memory attach between every pair of the
    // node's members (direct_state_); the state it keeps between calls.
    void direct_setup();
    struct Direct;

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
    std::unique_ptr<Direct> direct_; // holds a window: after the communicators
    int direct_state_ = -1;          // alltoall_direct: -1 not set up, 0 no cross-memory attach, 1 works
    bool refuse_cma_ = false;
    uint64_t direct_reads_ = 0, direct_writes_ = 0, direct_pulls_ = 0, direct_pushes_ = 0;
};

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
// Buffers: every pointer is CUDA device or managed memory, checked per call
// (DSM_ERR_INVALID_ARGUMENT naming the argument); alloc_shared() returns
// zeroed cudaMalloc memory and is local. In-place forms as in Backend.
//
// Synchronous, like every backend: a call enqueues its NCCL operations on the
// backend's stream (stream(): a blocking stream, so work the caller put on
// the legacy default stream is ordered before the call; work on other streams
// must be complete) and returns once the stream has run them. An asynchronous
// variant would return once the operations are enqueued (see Impl::wait()).
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
// has run what the unpacks enqueued. Failures behave as in Backend (pack
// failures agreed over MPI before any data moves). alltoall_direct: the
// default (false: the caller packs).
//
// Failures: every wait polls ncclCommGetAsyncError and the stream; after an
// NCCL or CUDA error, or when an operation has not completed within
// DSM_NCCL_TIMEOUT seconds, the member aborts its NCCL communicator
// (ncclCommAbort, so nothing of it waits on the peers any more; the peers
// fail by their own error or timeout) and throws DSM_ERR_NCCL (NCCL's error
// string and last error) or DSM_ERR_CUDA; later calls throw DSM_ERR_STATE.
// Argument errors are thrown before anything is enqueued, and the backend
// stays usable. The destructor finalizes the communicator (collective, with
// the same timeout, then an abort); abandon() aborts it.
//
// Stats as the mpi backend (every byte counted as off the node).
class NcclBackend final : public Backend {
public:
    NcclBackend(MPI_Comm comm, int node_color);
    ~NcclBackend() override;

    const char *name() const noexcept override { return "nccl"; }
    int size() const noexcept override { return size_; }
    int rank() const noexcept override { return rank_; }
    MPI_Comm comm() const noexcept override { return comm_.get(); }
    // This member's CUDA device and the backend's stream (a cudaStream_t).
    int device() const noexcept { return device_; }
    CUstream_st *stream() const noexcept;

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

private:
    struct Impl; // the NCCL communicator, the stream and the device memory
    Comm comm_;
    int rank_ = 0, size_ = 1, device_ = -1;
    std::unique_ptr<Impl> impl_; // after comm_: released first
};

} // namespace comm
} // namespace dsm
