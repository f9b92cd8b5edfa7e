// The communication layer: one Backend interface for every collective the
// engine and the layers above it need, with one implementation per transport:
// "mpi" (mpi_backend.hpp), "shm" (shm_backend.hpp) and "nccl"
// (nccl_backend.hpp). make_backend() picks one from DSM_COMM_BACKEND and the
// buffers' memory space.
//
// Queues: every collective takes the Queue its work is ordered on. The host
// queue (Queue{}, the default) means "complete before returning": every
// backend honours it. A device queue carries a CUDA stream (a cudaStream_t
// as void *, so no CUDA header leaks here): a stream-ordered backend
// (Capabilities::stream_ordered, "nccl") enqueues the work on that stream
// and returns, and the caller calls synchronize(queue) where it needs the
// results on the host; host backends ("mpi", "shm") only wait for the work
// already on a device queue (which may write the call's buffers), then run
// on the host and complete before returning, so synchronize() costs them
// nothing.
//
// Semantics shared by every backend:
// - Collective over the backend's group: every member calls with the same
//   counts, dtype and op, in the same order.
// - alltoall_packed() moves bytes that callbacks pack and unpack, so that a
//   layout permutation is done in the same pass as the copy.
// - Counts are in elements. Reductions support FLOAT32, FLOAT64, FLOAT16 and
//   BFLOAT16 with SUM, MAX and MIN; gathers, all-to-all and bcast move any
//   dtype. Inside a node 16-bit values are combined in fp32 and rounded once
//   to nearest even; between nodes each MPI reduction step rounds again.
// - Deterministic: the result has the same bits on every member and in every
//   run, whatever the timing. Each output element is reduced in one fixed
//   order (the node's ranks in ascending local rank, then MPI's reduction
//   across the nodes on the element's lane, served by one rank per node; see
//   ShmBackend); it equals MPI's result within floating-point summation order.
// - Lifetime: alloc_shared(), free_shared() and the destructor are
//   collective (window allocation and release); abandon() is the local way
//   out after a failure.
// - In place: `recv == send` for allreduce; for reduce_scatter(v)/allgather(v)
//   the in-place forms are documented per call.
// - Errors throw dsm::Error (DSM_ERR_MPI with the MPI error string,
//   DSM_ERR_INVALID_ARGUMENT for a bad count/dtype, DSM_ERR_OUT_OF_MEMORY).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <mpi.h>

#include "core/watchdog.hpp"
#include "device/queue.hpp"
#include "dsm.h"

namespace dsm {
namespace cuda {
struct DeviceHint;
} // namespace cuda
namespace comm {

enum class Op { SUM, MAX, MIN };

// The queue a collective's work is ordered on (device/queue.hpp).
using Queue = device::Queue;

// Where the buffers given to a backend live (the engine's and sp's buffers:
// host memory, or CUDA device memory).
enum class Space { HOST, DEVICE };

// What a backend can do, known before one is created (capabilities_of()).
struct Capabilities {
    bool host_memory = false;    // buffers in host memory
    bool device_memory = false;  // buffers in CUDA device memory
    bool stream_ordered = false; // enqueues on a device queue and returns (else completes before returning)
    bool multi_node = false;     // a group that spans nodes
    bool accepts(Space s) const noexcept { return s == Space::HOST ? host_memory : device_memory; }
};

// What one member moved, for the benchmarks and the engine's report.
// bytes_sent: the logical volume this rank sends, the same in every backend
// (the volume of a bandwidth-optimal algorithm: (n-1)/n of the buffer for a
// reduce-scatter or an allgather over n members, twice that for an allreduce;
// the bytes addressed to other members for an all-to-all; the buffer at the
// root of a broadcast). bytes_off_node: of those, the bytes that left this
// rank's node; the shm backend counts what its leaders exchange over MPI
// (zero on one node), the mpi backend, which does not know the nodes, counts
// every byte. calls: collective calls.
struct Stats {
    uint64_t bytes_sent = 0;
    uint64_t bytes_off_node = 0;
    uint64_t calls = 0;
};

// (n-1)/n of `bytes`: what one member sends in a ring over n members.
inline uint64_t ring_share(uint64_t bytes, int n) noexcept {
    return n <= 1 ? 0 : static_cast<uint64_t>(static_cast<long double>(bytes) * (n - 1) / n);
}

class Backend {
public:
    virtual ~Backend();
    Backend();
    Backend(const Backend &) = delete;
    Backend &operator=(const Backend &) = delete;

    // "mpi" (plain MPI collectives), "shm" (shared memory inside a node,
    // MPI between nodes) or "nccl" (NCCL on device memory).
    virtual const char *name() const noexcept = 0;
    virtual int size() const noexcept = 0;
    virtual int rank() const noexcept = 0;
    // The group's communicator (MPI_ERRORS_RETURN; owned by the backend).
    virtual MPI_Comm comm() const noexcept = 0;
    // What this backend accepts and how it completes (capabilities_of(kind)).
    virtual Capabilities capabilities() const noexcept = 0;

    // Wait until the work enqueued on `queue` by this backend's calls has
    // completed (the caller's sync point). Local. Host backends: nothing to
    // wait for (their calls complete before returning); a host queue: the
    // same in every backend.
    virtual void synchronize(Queue queue = {});

    // recv[i] = op over members of send[i], i < count. send == recv: in place.
    virtual void allreduce(const void *send, void *recv, size_t count, dsm_dtype_t dtype, Op op, Queue queue = {}) = 0;

    // send holds sum(counts) elements: the block for member r starts at
    // counts[0] + ... + counts[r-1]. recv (counts[rank()] elements) = op over
    // members of their block for this member. counts.size() == size().
    // In place: recv == (char*)send + offset of this member's block.
    virtual void reduce_scatterv(const void *send, void *recv, const std::vector<size_t> &counts,
                                 dsm_dtype_t dtype, Op op, Queue queue = {}) = 0;

    // Equal blocks of `count` elements (send holds size()*count).
    virtual void reduce_scatter(const void *send, void *recv, size_t count, dsm_dtype_t dtype, Op op, Queue queue = {});

    // recv holds sum(counts) elements: member r's send_count == counts[r]
    // elements land at counts[0] + ... + counts[r-1]. In place: send == recv
    // + offset of this member's block.
    virtual void allgatherv(const void *send, void *recv, const std::vector<size_t> &counts,
                            dsm_dtype_t dtype, Queue queue = {}) = 0;

    // Equal blocks of `count` elements.
    virtual void allgather(const void *send, void *recv, size_t count, dsm_dtype_t dtype, Queue queue = {});

    // MPI_Alltoallv semantics with element counts and displacements.
    virtual void alltoallv(const void *send, const std::vector<size_t> &send_counts,
                           const std::vector<size_t> &send_displs, void *recv,
                           const std::vector<size_t> &recv_counts,
                           const std::vector<size_t> &recv_displs, dsm_dtype_t dtype, Queue queue = {}) = 0;

    // An all-to-all whose blocks the caller packs and unpacks, so that a
    // layout permutation is done in the same pass as the copy: pack(peer, buf)
    // writes the send_bytes[peer] bytes this member sends to `peer`;
    // unpack(peer, buf) reads the recv_bytes[peer] bytes `peer` sent to this
    // member. Each is called once per member (this member included) with a
    // 64-byte aligned buffer, never for a zero-byte block; the calls may come
    // in any order but never concurrently. Collective; send_bytes[q] on
    // member p must equal recv_bytes[p] on member q (the caller guarantees
    // it). Stats: bytes_sent counts the bytes addressed to other members,
    // bytes_off_node those to other nodes (every byte for the mpi backend,
    // which does not know the nodes).
    //
    // The default (the mpi backend, and shm over several nodes) packs every
    // block into one private buffer, moves them with one MPI_Alltoallv and
    // unpacks each from the receive buffer; this member's own block is
    // unpacked from the send buffer. The shm backend on one node packs into
    // its scratch window and every member unpacks its blocks from the peers'
    // windows: two memory passes and no MPI data movement.
    //
    // Errors, checked before any communication (so on every member alike
    // when all call alike): sizes of the wrong length, or a block to itself
    // whose two sizes differ, throw DSM_ERR_INVALID_ARGUMENT naming the
    // values; an empty pack or unpack throws DSM_ERR_NULL_POINTER.
    // An exception from pack is held until the members have agreed on the
    // outcome; then every member throws, the failing member its own exception
    // and the others a dsm::Error with its status (DSM_ERR_INTERNAL for a
    // non-dsm exception, DSM_ERR_OUT_OF_MEMORY for std::bad_alloc) naming the
    // lowest failing member; no data has moved. An exception from unpack is
    // rethrown on its member only, after the call's last synchronization (the
    // others return normally); the blocks after it are not unpacked. Either
    // way the backend stays usable.
    using PackFn = std::function<void(int peer, void *buf)>;
    using UnpackFn = std::function<void(int peer, const void *buf)>;
    virtual void alltoall_packed(const std::vector<size_t> &send_bytes, const std::vector<size_t> &recv_bytes,
                                 const PackFn &pack, const UnpackFn &unpack, Queue queue = {});

    // A single-copy all-to-all: every member exposes buffers (its inputs); then
    // each member copies, from each peer, the pieces plan(peer, pieces) lists,
    // straight from that peer's exposed memory into its own (one copy, no
    // intermediate buffer; the permutation is in the pieces). plan is called once
    // per member (this member included) and must not throw; pieces from this
    // member's own buffers are copied with memcpy. The exposed buffers must stay
    // unchanged until the call returns on every member (it ends with a node-wide
    // synchronization). Collective. Where every member's exposed buffers lie in
    // memory from alloc_shared() (shm backend, one node), the pieces are copied
    // with memcpy from the peers' mappings; else with cross-memory attach where
    // the OS allows it. Returns false on every member, having moved nothing and
    // called no plan, when neither works (the default, a group spanning nodes,
    // private memory somewhere and an OS that refuses cross-memory access); the
    // caller then uses alltoall_packed(). Stats as alltoall_packed().
    //
    // Zero-byte pieces are skipped (not checked). Every plan is called before
    // anything moves (in the order this member, then upwards).
    //
    // Errors make every member throw, none is left waiting: the failing member
    // its own exception, the others a dsm::Error with its status naming the
    // lowest failing member. Before anything is copied: exposed counts that
    // differ between members (DSM_ERR_MISMATCH, on every member), an empty
    // plan or an exposed buffer that is NULL with bytes (DSM_ERR_NULL_POINTER),
    // an exception from plan (DSM_ERR_INTERNAL, DSM_ERR_OUT_OF_MEMORY or the
    // dsm::Error's status). While copying: a piece outside its peer's buffer
    // (DSM_ERR_INVALID_ARGUMENT), or without a destination
    // (DSM_ERR_NULL_POINTER), or a copy the OS refuses; the outputs are then
    // incomplete. The backend stays usable.
    struct Exposed {
        const void *data;
        size_t bytes;
    };
    struct Piece {
        int buffer;  // index into the peer's exposed buffers
        size_t from; // byte offset in that buffer
        void *to;    // destination in this member's memory
        size_t bytes;
    };
    using PlanFn = std::function<void(int peer, std::vector<Piece> &pieces)>;
    virtual bool alltoall_direct(const std::vector<Exposed> &exposed, const PlanFn &plan, Queue queue = {});

    // An all-to-all over MPI point-to-point in which MPI reads every block
    // from the sender's buffers and writes it into the receiver's, however
    // they are laid out: the pieces of a peer become one message whose
    // datatype lists them at their addresses (one contiguous run: plain
    // bytes), so nothing is packed or unpacked by the caller, and each byte
    // crosses the network once, from the rank that holds it to the rank that
    // wants it. recv_plan is alltoall_direct's plan (the pieces this member
    // gets from a peer); send_plan(peer, pieces) lists what this member sends
    // to that peer (Piece::buffer and from in this member's exposed buffers;
    // `to` unused), in the order, and with the bytes, the peer's recv_plan
    // lists them (MPI matches the two byte streams). Both are called for
    // every peer before anything moves; the block to this member itself is
    // copied with memcpy. Host memory only. Collective. Returns false on
    // every member, having moved nothing, where the backend does not take
    // this path (the default; the shm backend on one node, whose
    // alltoall_direct is faster; the nccl backend) or where a piece or a
    // peer's total exceeds what one MPI message can describe (the caller then
    // packs). Errors as alltoall_direct (agreed before anything moves; a
    // piece outside its buffer: DSM_ERR_INVALID_ARGUMENT). Stats as
    // alltoall_packed().
    virtual bool alltoall_pieces(const std::vector<Exposed> &exposed, const PlanFn &send_plan,
                                 const PlanFn &recv_plan, Queue queue = {});

    virtual void bcast(void *buf, size_t count, dsm_dtype_t dtype, int root, Queue queue = {}) = 0;

    virtual void barrier(Queue queue = {}) = 0;

    // Memory for buffers that collectives read and write (the engine's flat
    // parameter and gradient buffers, the Ulysses transforms' tensors).
    // Collective: every member allocates in the same order; the byte counts
    // may differ between members. The "shm" backend places it in
    // a node-shared window so that collectives on it read the peers' data in
    // place; "mpi" returns aligned private memory. Aligned to 64 bytes, zeroed.
    // Freed by free_shared() (collective, same order) or by the destructor.
    virtual void *alloc_shared(size_t bytes) = 0;
    virtual void free_shared(void *ptr) = 0;

    // After a failed collective call, when the members may no longer make the
    // same calls: let go of every resource whose release is collective
    // (shared windows, communicators) without releasing it, so that
    // free_shared() and the destructor make no collective call and cannot
    // hang. The memory stays mapped until MPI_Finalize. Local; the backend
    // must not be used for communication afterwards.
    virtual void abandon() noexcept = 0;

    // The group as the watchdog's messages name it (core/watchdog.hpp):
    // described by create_backend() (members, backend); the caller may
    // name it (the engine: "data_parallel"). Every collective call is a
    // watchdog::WaitScope on it.
    watchdog::Group &watch() noexcept { return watch_; }
    const watchdog::Group &watch() const noexcept { return watch_; }

    const Stats &stats() const noexcept { return stats_; }
    void reset_stats() noexcept { stats_ = Stats{}; }
    // Count what a backend over some of this group's members moved on the
    // group's behalf (qgZ's exchange inside the node).
    void add_stats(const Stats &s) noexcept {
        stats_.bytes_sent += s.bytes_sent;
        stats_.bytes_off_node += s.bytes_off_node;
        stats_.calls += s.calls;
    }
    // The alltoall_pieces() calls that moved data so far (for the tests and
    // the benchmark).
    uint64_t pieces_calls() const noexcept { return pieces_calls_; }

protected:
    // Count `bytes` sent, all of them off the node (a backend that does not
    // know the nodes).
    void count_sent(uint64_t bytes) noexcept {
        stats_.bytes_sent += bytes;
        stats_.bytes_off_node += bytes;
    }

    // The start of a host backend's call on `queue`: wait for the work
    // already enqueued on a device queue (which may write the call's
    // buffers); nothing for the host queue, or without a CUDA device (no
    // work can be on the queue). DSM_ERR_CUDA for an error of that work.
    static void drain(Queue queue);

    // barrier() of a host backend: drain(queue), count the call, then
    // MPI_Barrier over comm().
    void barrier_mpi(Queue queue);

    // alltoall_pieces() over comm(); off_node(q): whether bytes to member q
    // count as sent off the node.
    bool alltoall_pieces_mpi(const std::vector<Exposed> &exposed, const PlanFn &send_plan, const PlanFn &recv_plan,
                             const std::function<bool(int)> &off_node);

    // The data movement of the default alltoall_packed() over comm(), after
    // the checks and the Stats.
    void alltoall_packed_mpi(const std::vector<size_t> &send_bytes, const std::vector<size_t> &recv_bytes,
                             const PackFn &pack, const UnpackFn &unpack);

    Stats stats_;
    uint64_t pieces_calls_ = 0;
    watchdog::Group watch_;

private:
    struct PackedBuffers; // alltoall_packed_mpi's send and receive buffers, kept between calls
    std::unique_ptr<PackedBuffers> packed_;
};

enum class Kind {
    AUTO, // create_backend(): "shm" when the group has two or more ranks on some node, else "mpi"
    MPI,
    SHM,  // shared memory inside each node + MPI between node leaders
    NCCL, // NCCL on CUDA device memory (NcclBackend); create_backend(AUTO) never picks it
};

// Kind from its name ("auto", "mpi", "shm", "nccl"); DSM_ERR_INVALID_ARGUMENT otherwise.
Kind kind_from_name(const std::string &name);
const char *kind_name(Kind kind) noexcept;

// The capabilities of a backend kind, without creating one (AUTO: none).
//   mpi:  host and device memory (device buffers staged through the host where
//         MPI is not CUDA-aware), completes before returning, any nodes;
//   shm:  host memory, completes before returning, any nodes (lanes between them);
//   nccl: device memory, stream-ordered, any nodes.
Capabilities capabilities_of(Kind kind) noexcept;

// The kind DSM_COMM_BACKEND asks for ("auto", "mpi", "shm" or "nccl",
// case-insensitive). Local; a bad value: DSM_ERR_INVALID_ARGUMENT naming the
// variable, the value and the choices.
Kind kind_from_param();

// Whether this build has the nccl backend (configured with CUDA and NCCL).
bool nccl_built() noexcept;

// DSM_COMM_TIMEOUT (or its former name DSM_NCCL_TIMEOUT): seconds an
// operation of the nccl backend may take (0: no limit; watchdog.hpp).
int nccl_timeout_param();

// Collective: whether every rank of `comm` sees a CUDA device (the same
// answer on all); *why: this rank's reason when it sees none.
bool every_rank_has_a_device(MPI_Comm comm, std::string *why);

// Collective, once every rank of `comm` has chosen `device`: fails (agreed,
// DSM_ERR_NOT_SUPPORTED) naming two ranks of a host that chose the same GPU
// (by PCI bus id). NCCL needs a GPU of its own on every rank. Hosts are the
// physical ones (MPI_COMM_TYPE_SHARED), not DSM_SIM_NODES' simulated nodes.
void require_devices_of_their_own(MPI_Comm comm, int device);

// Collective: whether every rank of `comm` has a CUDA device and no two
// ranks of a host share one (the same answer on all; *why: the reason when
// not). Each rank's device is chosen here unless the process chose it
// before (cuda::use_device: `hint`, or the rank's index on its host).
bool every_rank_has_its_own_device(MPI_Comm comm, const cuda::DeviceHint *hint, std::string *why);

// Collective over `comm` (not freed, not kept: the backend dups it).
// `node_color` names this rank's node (ranks with equal colors are on one
// node: the mesh placement's node index, so simulated nodes split a host);
// negative: discover with MPI_Comm_split_type(MPI_COMM_TYPE_SHARED). Ranks
// that share a color are further split by MPI_COMM_TYPE_SHARED so a window is
// only ever shared where memory is.
std::unique_ptr<Backend> create_backend(MPI_Comm comm, Kind kind, int node_color = -1);

// The one factory: the backend DSM_COMM_BACKEND names for buffers in `space`.
// Collective over `comm` (as create_backend()); every rank returns the same
// kind or throws the same error:
// - a bad DSM_COMM_BACKEND value on some rank: DSM_ERR_INVALID_ARGUMENT
//   naming the variable; valid values that differ between the ranks:
//   DSM_ERR_MISMATCH;
// - auto: for device memory "nccl" when NCCL is built and every rank sees a
//   CUDA device; else create_backend(AUTO) for host memory ("shm" when some
//   node holds two or more of the group's ranks and windows work, else
//   "mpi"), and "mpi" for device memory (shm reads host memory only);
// - a kind that does not accept `space` (shm or nccl for the other space), or
//   nccl without NCCL built or without a CUDA device on some rank:
//   DSM_ERR_NOT_SUPPORTED naming the reason.
// `choice`: the kind the caller asks for (dsm_engine_options_t.backend) in
// place of DSM_COMM_BACKEND; NULL reads the parameter. AUTO as above.
std::unique_ptr<Backend> make_backend(MPI_Comm comm, Space space, int node_color = -1, const Kind *choice = nullptr);

} // namespace comm
} // namespace dsm
