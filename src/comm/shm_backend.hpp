// The "shm" backend: node-shared MPI-3 windows inside a node, MPI lanes
// between nodes. shm_window.cc: the node communicator and SharedWindow;
// shm_backend.cc: construction, the collectives and allocations;
// shm_direct.cc: alltoall_direct.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <mpi.h>

#include "comm/backend.hpp"
#include "comm/common.hpp"
#include "comm/net.hpp"
#include "core/comm.hpp"

namespace dsm {
namespace comm {

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
// node's rank count) serves lane v on the lane's communicator (one rank per
// node, in node order): a reduce-scatter that leaves each block, reduced over
// every node, at its owner, and for an allreduce or allgather an allgather
// that gives every node all the lane's blocks, which the node's ranks then
// copy from the server. Every rank drives the inter-node traffic of its own
// blocks, so the links of all local ranks are used, and unequal nodes still
// work (a rank serves several lanes). The lane's stage is NetLane (net.hpp):
// a pipelined ring or recursive halving/doubling over point-to-point MPI in
// chunks, which reads the node's reduction of a chunk from the peers' inputs
// just before that chunk leaves (DSM_COMM_NET_ALGO, DSM_COMM_NET_CHUNK, read
// at construction; mpi: MPI's collectives on a reduced copy of the lane).
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
// Over several nodes alltoall_packed is the default's MPI_Alltoallv, and
// alltoall_pieces lets MPI read and write the buffers in place.
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
// one node): for the collectives the volume of a bandwidth-optimal exchange
// (each node sends the other nodes' shares of its lanes, twice for an
// allreduce), whichever algorithm moves them (a ring also forwards blocks
// through nodes that hold no member of a lane; rhd's fold sends more). alltoallv and bcast are plain MPI on the group. alloc_shared, free_shared
// and the destructor are collective over the node (window allocation).
class ShmBackend final : public Backend {
public:
    ShmBackend(MPI_Comm comm, int node_color);
    ~ShmBackend() override;

    const char *name() const noexcept override { return "shm"; }
    int size() const noexcept override { return size_; }
    int rank() const noexcept override { return rank_; }
    MPI_Comm comm() const noexcept override { return comm_.get(); }
    // Host memory; complete before returning (a device queue: after its earlier work).
    Capabilities capabilities() const noexcept override { return capabilities_of(Kind::SHM); }
    int nodes() const noexcept { return nodes_; }
    int local_size() const noexcept { return local_size_; }
    // The between-node algorithm the parameters asked for (DSM_COMM_NET_ALGO,
    // read at construction) and the one the last collective over several
    // nodes ran (AUTO before any); for the tests and the benchmark.
    NetAlgo net_algo() const noexcept { return net_algo_; }
    NetAlgo last_net_algo() const noexcept { return last_algo_; }
    size_t net_chunk() const noexcept { return net_chunk_; }
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
    bool alltoall_direct(const std::vector<Exposed> &exposed, const PlanFn &plan, Queue queue = {}) override;
    // Over several nodes: MPI reads and writes the buffers in place
    // (Backend::alltoall_pieces); on one node false (alltoall_direct is the
    // single copy there).
    bool alltoall_pieces(const std::vector<Exposed> &exposed, const PlanFn &send_plan, const PlanFn &recv_plan,
                         Queue queue = {}) override;
    void bcast(void *buf, size_t count, dsm_dtype_t dtype, int root, Queue queue = {}) override;
    void barrier(Queue queue = {}) override;
    void *alloc_shared(size_t bytes) override;
    void free_shared(void *ptr) override;
    void abandon() noexcept override;

    // Where a buffer is for the node's ranks: an allocation (its id), the
    // scratch window, or (local_size 1 only) this process's own address.
    struct Where {
        int64_t seg;
        uint64_t off;
    };
    // Where::seg besides an allocation id (>= 0).
    static constexpr int64_t kScratch = -1; // the rank's scratch window
    static constexpr int64_t kNone = -2;    // not in node-shared memory
    static constexpr int64_t kDirect = -3;  // this process's own address (a node of one rank)
    static constexpr int64_t kEmpty = -4;   // alltoall_direct: a buffer of zero bytes (read by no piece)
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
    static_assert(sizeof(Slot) <= 64, "the arrival counter follows the slot in its window");

private:
    struct Lane {
        int v;
        Comm comm;
    };

    // The control window: each rank's Slot, then (its own cache line) its
    // arrival counter: how many node_sync() it has entered.
    static constexpr size_t kArrivalOffset = 64;
    static constexpr size_t kControlBytes = 128;
    uint64_t *arrival(int p) const noexcept {
        return reinterpret_cast<uint64_t *>(control_.base(p) + kArrivalOffset);
    }
    // The watchdog's view of the wait in node_sync() (watchdog::Group::arrivals).
    bool arrivals(std::vector<int> *missing, std::string *note) const;
    Where locate(const void *p, size_t bytes) const;
    char *peer_ptr(int p, Where w) const;
    void node_sync();
    void begin(Where src, Where dst, size_t scratch, const void *copy_from, size_t copy_bytes);
    // The end of allreduce and allgatherv: node_sync(), then every member's
    // block (offs/counts, indexed by group rank) copied into out from the
    // peer of this node that served its lane, then node_sync() again.
    void gather_blocks(char *out, const std::vector<size_t> &offs, const std::vector<size_t> &counts, size_t esize);
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
    // The node's contribution to the lanes: peers_' inputs reduced in
    // ascending local rank (net.hpp); `direct` when this rank is alone on
    // the node and its input does not overlap the output.
    NodeInput node_input(dsm_dtype_t dtype, Op op, size_t esize, bool direct_ok) const;
    // The between-node algorithm for a lane of these blocks (the same on every member).
    NetAlgo lane_algo(const std::vector<size_t> &lc, size_t esize, bool allreduce) const;
    // alltoall_direct: on the first call (collective), the window and, on
    // Linux, the probe of cross-memory attach between every pair of the
    // node's members (direct_state_); the state it keeps between calls.
    void direct_setup();
    struct Direct; // defined in shm_direct.cc
    struct DirectDelete {
        void operator()(Direct *d) const noexcept; // shm_direct.cc, where Direct is complete
    };
    using DirectPtr = std::unique_ptr<Direct, DirectDelete>;
    static DirectPtr make_direct();
    // MPI_Win_sync / abandon of alltoall_direct's window, when there is one.
    void direct_sync() const noexcept;
    void direct_abandon() noexcept;

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
    uint64_t arrivals_ = 0; // node_sync() calls so far
    std::vector<Slot> peers_; // the slots read at the start of the current call
    ScratchBuffer partial_, net_b_, net_c_;
    NetAlgo net_algo_ = NetAlgo::AUTO, last_algo_ = NetAlgo::AUTO;
    size_t net_chunk_ = 0;
    DirectPtr direct_; // holds a window: after the communicators
    int direct_state_ = -1;          // alltoall_direct: -1 not set up, 0 no cross-memory attach, 1 works
    bool refuse_cma_ = false;
    uint64_t direct_reads_ = 0, direct_writes_ = 0, direct_pulls_ = 0, direct_pushes_ = 0;
};

} // namespace comm
} // namespace dsm
