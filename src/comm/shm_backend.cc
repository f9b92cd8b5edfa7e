// The "shm" backend: node-shared MPI-3 windows inside a node, MPI lanes
// between nodes (see ShmBackend in shm_backend.hpp for the scheme):
// construction, the collectives and allocations.
#include "dsm_config.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "comm/shm_backend.hpp"
#include "comm/net.hpp"
#include "comm/reduce.hpp"
#include "core/agree.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"

namespace dsm {
namespace comm {

namespace {

// The scratch window grows in steps of this, so that slowly growing calls do
// not reallocate (collectively) every time.
constexpr size_t kScratchStep = size_t(2) << 20;

// alltoall_packed: the states of a member's blocks (Slot::packed), and the
// table at the start of its scratch segment: per peer, where the block for
// that peer starts in the segment and its bytes.
constexpr int32_t kPacked = 0;
constexpr int32_t kPackLater = 1;
constexpr int32_t kPackFailed = 2;
struct PackedEntry {
    uint64_t off, bytes;
};

size_t scratch_steps(size_t bytes) { return (bytes + kScratchStep - 1) / kScratchStep * kScratchStep; }

bool overlap(const void *a, size_t an, const void *b, size_t bn) {
    const uintptr_t x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
    return an && bn && x < y + bn && y < x + an;
}

// MPI_Comm_split where ranks may stay out (color MPI_UNDEFINED: MPI_COMM_NULL).
Comm split_or_null(MPI_Comm parent, int color, int key) {
    MPI_Comm c = MPI_COMM_NULL;
    DSM_CHECK_MPI(MPI_Comm_split(parent, color, key, &c));
    Comm owned(c);
    if (c != MPI_COMM_NULL) DSM_CHECK_MPI(MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN));
    return owned;
}

} // namespace

// ---------------------------------------------------------------- construction

ShmBackend::ShmBackend(MPI_Comm comm, int node_color) : comm_(Comm::dup(comm)) {
    const MPI_Comm g = comm_.get();
    // The between-node stage's parameters, read once; a malformed value
    // fails every rank with the message of the lowest rank that has it.
    agree(g, [&] {
        net_algo_ = net_algo_param();
        net_chunk_ = net_chunk_param();
    });
    DSM_CHECK_MPI(MPI_Comm_rank(g, &rank_));
    DSM_CHECK_MPI(MPI_Comm_size(g, &size_));
    node_ = node_comm(g, node_color);
    DSM_CHECK_MPI(MPI_Comm_rank(node_.get(), &local_rank_));
    DSM_CHECK_MPI(MPI_Comm_size(node_.get(), &local_size_));

    // Nodes are numbered in the order of their lowest group rank (local rank 0).
    const Comm leaders = split_or_null(g, local_rank_ == 0 ? 0 : MPI_UNDEFINED, rank_);
    int where[2] = {0, 1};
    if (local_rank_ == 0) {
        DSM_CHECK_MPI(MPI_Comm_rank(leaders.get(), &where[0]));
        DSM_CHECK_MPI(MPI_Comm_size(leaders.get(), &where[1]));
    }
    DSM_CHECK_MPI(MPI_Bcast(where, 2, MPI_INT, 0, node_.get()));
    node_index_ = where[0];
    nodes_ = where[1];

    const int mine[3] = {node_index_, local_rank_, local_size_};
    std::vector<int> all(3 * static_cast<size_t>(size_));
    DSM_CHECK_MPI(MPI_Allgather(mine, 3, MPI_INT, all.data(), 3, MPI_INT, g));
    node_of_.resize(static_cast<size_t>(size_));
    local_of_.resize(static_cast<size_t>(size_));
    node_size_.assign(static_cast<size_t>(nodes_), 0);
    members_.assign(static_cast<size_t>(nodes_), {});
    for (size_t r = 0; r < static_cast<size_t>(size_); ++r) {
        node_of_[r] = all[3 * r];
        local_of_[r] = all[3 * r + 1];
        node_size_[static_cast<size_t>(node_of_[r])] = all[3 * r + 2];
    }
    for (int k = 0; k < nodes_; ++k) members_[static_cast<size_t>(k)].assign(static_cast<size_t>(node_size_[static_cast<size_t>(k)]), -1);
    for (size_t r = 0; r < static_cast<size_t>(size_); ++r)
        members_[static_cast<size_t>(node_of_[r])][static_cast<size_t>(local_of_[r])] = static_cast<int>(r);

    if (nodes_ > 1) {
        const int lanes = *std::max_element(node_size_.begin(), node_size_.end());
        for (int v = 0; v < lanes; ++v) {
            const bool serve = v % local_size_ == local_rank_;
            Comm c = split_or_null(g, serve ? 0 : MPI_UNDEFINED, node_index_);
            if (serve) lanes_.push_back(Lane{v, std::move(c)});
        }
    }

    // Every rank learns whether windows work anywhere, so that AUTO falls back
    // to "mpi" everywhere or nowhere.
    std::string failure;
    try {
        control_ = SharedWindow(node_.get(), kControlBytes);
    } catch (const Error &e) {
        failure = e.message();
    }
    int ok = failure.empty() ? 1 : 0, all_ok = 0;
    DSM_CHECK_MPI(MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, g));
    DSM_REQUIRE(all_ok == 1, DSM_ERR_NOT_SUPPORTED, "MPI_Win_allocate_shared failed",
                failure.empty() ? std::string(" on another rank") : ": " + failure);
    peers_.resize(static_cast<size_t>(local_size_));
    watch_.arrivals = [this](std::vector<int> *missing, std::string *note) { return arrivals(missing, note); };
}

ShmBackend::~ShmBackend() = default;

// ---------------------------------------------------------------- locations and synchronization

ShmBackend::Where ShmBackend::locate(const void *p, size_t bytes) const {
    const uintptr_t u = reinterpret_cast<uintptr_t>(p);
    if (local_size_ == 1) return Where{kDirect, u};
    for (const auto &a : allocs_) {
        const uintptr_t b = reinterpret_cast<uintptr_t>(a.second.base(local_rank_));
        if (u >= b && u - b <= a.second.bytes() && bytes <= a.second.bytes() - (u - b))
            return Where{a.first, u - b};
    }
    return Where{kNone, 0};
}

char *ShmBackend::peer_ptr(int p, Where w) const {
    switch (w.seg) {
    case kDirect: return reinterpret_cast<char *>(static_cast<uintptr_t>(w.off));
    case kScratch: return scratch_.base(p) + w.off;
    default: break;
    }
    const auto it = allocs_.find(w.seg);
    DSM_REQUIRE(it != allocs_.end(), DSM_ERR_INTERNAL, "local rank ", p, " published unknown allocation ", w.seg);
    return it->second.base(p) + w.off;
}

void ShmBackend::node_sync() {
    if (local_size_ == 1) return;
    // The arrival counter (for the watchdog's message: a plain store into
    // this rank's own cache line of the control window) and a mark of
    // progress for the watchdog (a store into this thread's record).
    __atomic_store_n(arrival(local_rank_), ++arrivals_, __ATOMIC_RELAXED);
    watchdog::WaitScope::progress();
    // Make this rank's stores visible before the barrier and see the peers'
    // after it (the MPI-3 shared-memory model: sync, barrier, sync).
    control_.sync();
    scratch_.sync();
    direct_sync();
    for (const auto &a : allocs_) a.second.sync();
    DSM_CHECK_MPI(MPI_Barrier(node_.get()));
    control_.sync();
    scratch_.sync();
    direct_sync();
    for (const auto &a : allocs_) a.second.sync();
}

// On the watchdog thread, while this rank's thread waits in node_sync():
// the node's ranks whose counter is behind this rank's have not arrived.
bool ShmBackend::arrivals(std::vector<int> *missing, std::string *note) const {
    const char *across = nodes_ > 1 ? "; the ranks of the other nodes are waited for over MPI, which does not say "
                                      "which did not arrive"
                                    : "";
    if (local_size_ == 1 || control_.bytes() < kControlBytes) {
        *note = std::string("this rank is alone on its node in this group") + across;
        return false;
    }
    const uint64_t mine = __atomic_load_n(arrival(local_rank_), __ATOMIC_RELAXED);
    for (int p = 0; p < local_size_; ++p)
        if (__atomic_load_n(arrival(p), __ATOMIC_RELAXED) < mine)
            missing->push_back(members_[static_cast<size_t>(node_index_)][static_cast<size_t>(p)]);
    if (missing->empty()) {
        *note = std::string("every rank of this node reached the node's synchronization (a rank may have stopped "
                            "inside it, or the wait is between nodes)") + across;
        return false;
    }
    *note = std::string("known from the shm backend's arrival counters in node-shared memory") + across;
    return true;
}

void ShmBackend::ensure_scratch(size_t bytes) {
    if (bytes == 0 || bytes <= scratch_.bytes()) return;
    scratch_.reset(); // collective, like the allocation: every rank saw the same need
    scratch_ = SharedWindow(node_.get(), scratch_steps(bytes));
}

void ShmBackend::begin(Where src, Where dst, size_t scratch, const void *copy_from, size_t copy_bytes) {
    if (local_size_ == 1) {
        peers_[0] = Slot{src, dst, 0, 0, kPacked, 0};
        return;
    }
    *reinterpret_cast<Slot *>(control_.base(local_rank_)) = Slot{src, dst, scratch, copy_from != nullptr, kPacked, 0};
    node_sync();
    size_t most = 0;
    bool copies = false;
    for (int p = 0; p < local_size_; ++p) {
        const Slot s = *reinterpret_cast<const Slot *>(control_.base(p));
        peers_[static_cast<size_t>(p)] = s;
        most = std::max<size_t>(most, s.scratch);
        copies = copies || s.copied;
    }
    ensure_scratch(most);
    if (copy_from != nullptr) std::memcpy(scratch_.base(local_rank_), copy_from, copy_bytes);
    if (copies) node_sync();
}

namespace {

// The blocks of lane v (one per node, the member with local rank v; none on
// nodes with fewer ranks), as counts and displacements in node order.
void lane_blocks(int v, const std::vector<int> &node_size, const std::vector<std::vector<int>> &members,
                 const std::vector<size_t> &offs, const std::vector<size_t> &counts, std::vector<size_t> *lc,
                 std::vector<size_t> *ld) {
    const size_t k = node_size.size();
    lc->assign(k, 0);
    ld->assign(k, 0);
    for (size_t j = 0; j < k; ++j) {
        if (v >= node_size[j]) continue;
        const size_t r = static_cast<size_t>(members[j][static_cast<size_t>(v)]);
        (*lc)[j] = counts[r];
        (*ld)[j] = offs[r];
    }
}

size_t sum(const std::vector<size_t> &v) {
    size_t s = 0;
    for (size_t x : v) s += x;
    return s;
}

} // namespace

const char *ShmBackend::lane_partial(int v, const std::vector<size_t> &offs, const std::vector<size_t> &counts,
                                     std::vector<size_t> *lc, std::vector<size_t> *ld, dsm_dtype_t dtype, Op op,
                                     size_t esize, bool direct_ok) {
    lane_blocks(v, node_size_, members_, offs, counts, lc, ld);
    const size_t total = sum(*lc);
    if (total == 0) return nullptr;
    if (local_size_ == 1 && direct_ok) {
        // One rank on this node: the partial is its own input, used in place
        // when the lane's blocks follow each other in node order.
        bool contiguous = true;
        size_t next = SIZE_MAX;
        for (size_t j = 0; j < lc->size(); ++j) {
            if ((*lc)[j] == 0) continue;
            contiguous = contiguous && (next == SIZE_MAX || (*ld)[j] == next);
            next = (*ld)[j] + (*lc)[j];
        }
        if (contiguous) {
            size_t first = 0;
            while ((*lc)[first] == 0) ++first;
            return peer_ptr(0, peers_[0].src) + (*ld)[first] * esize;
        }
    }
    char *buf = static_cast<char *>(partial_.get(total * esize));
    std::vector<const void *> srcs(static_cast<size_t>(local_size_));
    size_t pos = 0;
    for (size_t j = 0; j < lc->size(); ++j) {
        if ((*lc)[j] == 0) continue;
        for (int p = 0; p < local_size_; ++p)
            srcs[static_cast<size_t>(p)] = peer_ptr(p, peers_[static_cast<size_t>(p)].src) + (*ld)[j] * esize;
        reduce_sources(buf + pos * esize, srcs.data(), srcs.size(), (*lc)[j], dtype, op);
        pos += (*lc)[j];
    }
    return buf;
}

NodeInput ShmBackend::node_input(dsm_dtype_t dtype, Op op, size_t esize, bool direct_ok) const {
    std::vector<const char *> bases(static_cast<size_t>(local_size_));
    for (int p = 0; p < local_size_; ++p)
        bases[static_cast<size_t>(p)] = peer_ptr(p, peers_[static_cast<size_t>(p)].src);
    NodeInput in;
    if (local_size_ == 1 && direct_ok) in.direct = bases[0];
    in.reduce = [bases, dtype, op, esize](char *dst, const char *extra, size_t at, size_t n) {
        std::vector<const void *> srcs;
        srcs.reserve(bases.size() + 1);
        if (extra != nullptr) srcs.push_back(extra);
        for (const char *b : bases) srcs.push_back(b + at * esize);
        reduce_sources(dst, srcs.data(), srcs.size(), n, dtype, op);
    };
    return in;
}

void ShmBackend::gather_blocks(char *out, const std::vector<size_t> &offs, const std::vector<size_t> &counts,
                               size_t esize) {
    node_sync();
    for (size_t r = 0; r < counts.size(); ++r) {
        if (counts[r] == 0) continue;
        const int p = local_of_[r] % local_size_;
        const char *from = peer_ptr(p, peers_[static_cast<size_t>(p)].dst) + offs[r] * esize;
        if (from != out + offs[r] * esize) std::memcpy(out + offs[r] * esize, from, counts[r] * esize);
    }
    node_sync();
}

NetAlgo ShmBackend::lane_algo(const std::vector<size_t> &lc, size_t esize, bool allreduce) const {
    size_t total = 0;
    for (size_t c : lc) total += c;
    return net_resolve(net_algo_, nodes_, total * esize, allreduce);
}

// ---------------------------------------------------------------- collectives

void ShmBackend::allreduce(const void *send, void *recv, size_t count, dsm_dtype_t dtype, Op op, Queue queue) {
    const watchdog::WaitScope wait("allreduce", &watch_);
    drain(queue);
    const size_t bytes = check_allreduce(send, recv, count, dtype, op);
    const size_t esize = require_dtype_size(dtype);
    ++stats_.calls;
    stats_.bytes_sent += ring_share(2 * bytes, size_);
    if (count == 0) return;
    if (size_ == 1) {
        if (send != recv) std::memcpy(recv, send, bytes);
        return;
    }
    // One slice per member; the slices of each lane are reduced by its server.
    const size_t n = static_cast<size_t>(size_), me = static_cast<size_t>(rank_);
    std::vector<size_t> counts(n), offs(n);
    for (size_t r = 0, at = 0; r < n; ++r) {
        counts[r] = count / n + (r < count % n ? 1 : 0);
        offs[r] = at;
        at += counts[r];
    }
    // Inputs outside the node-shared windows are copied into scratch; results
    // go where the peers can read them: recv when shared, else scratch (in
    // place over the copy of the input, which is safe because each slice is
    // read and written by one rank only).
    Where src = locate(send, bytes), dst = locate(recv, bytes);
    const void *copy_from = nullptr;
    if (src.seg == kNone) {
        src = Where{kScratch, 0};
        copy_from = send;
    }
    if (dst.seg == kNone) dst = Where{kScratch, 0};
    begin(src, dst, copy_from != nullptr || dst.seg == kScratch ? bytes : 0, copy_from, bytes);
    char *w = peer_ptr(local_rank_, dst);
    if (nodes_ == 1) {
        std::vector<const void *> srcs(static_cast<size_t>(local_size_));
        for (int p = 0; p < local_size_; ++p)
            srcs[static_cast<size_t>(p)] = peer_ptr(p, peers_[static_cast<size_t>(p)].src) + offs[me] * esize;
        reduce_sources(w + offs[me] * esize, srcs.data(), srcs.size(), counts[me], dtype, op);
    } else {
        const MPI_Datatype type = types_.type(dtype);
        const MPI_Op mop = types_.op(dtype, op);
        const bool direct_ok = !overlap(peer_ptr(local_rank_, src), bytes, w, bytes);
        std::vector<size_t> lc, ld;
        for (const Lane &lane : lanes_) {
            lane_blocks(lane.v, node_size_, members_, offs, counts, &lc, &ld);
            if (sum(lc) == 0) continue; // every lane member has an empty slice
            const NetAlgo algo = lane_algo(lc, esize, true);
            last_algo_ = algo;
            if (algo == NetAlgo::MPI) {
                const char *part = lane_partial(lane.v, offs, counts, &lc, &ld, dtype, op, esize, direct_ok);
                mpi_reduce_scatterv(lane.comm.get(), part, w + offs[me] * esize, lc, type, mop, esize);
                mpi_allgatherv_in_place(lane.comm.get(), w, lc, ld, type, esize);
                stats_.bytes_off_node += 2 * (sum(lc) - lc[static_cast<size_t>(node_index_)]) * esize;
                continue;
            }
            NetLane net(lane.comm.get(), esize, net_chunk_, algo, dtype, op, &partial_, &net_b_, &net_c_);
            net.allreduce(node_input(dtype, op, esize, direct_ok), w, lc, ld);
            stats_.bytes_off_node += 2 * (sum(lc) - lc[static_cast<size_t>(node_index_)]) * esize;
        }
    }
    // Every slice from the rank on this node that serves its lane.
    gather_blocks(static_cast<char *>(recv), offs, counts, esize);
}

void ShmBackend::reduce_scatterv(const void *send, void *recv, const std::vector<size_t> &counts,
                                 dsm_dtype_t dtype, Op op, Queue queue) {
    const watchdog::WaitScope wait("reduce_scatterv", &watch_);
    drain(queue);
    size_t total = 0, mine = 0;
    const std::vector<size_t> offs = check_reduce_scatterv(size_, rank_, send, recv, counts, dtype, op, &total, &mine);
    const size_t esize = require_dtype_size(dtype), me = static_cast<size_t>(rank_);
    ++stats_.calls;
    stats_.bytes_sent += (total - mine) * esize;
    if (total == 0) return;
    if (size_ == 1) {
        if (mine && recv != send) std::memmove(recv, send, mine * esize);
        return;
    }
    Where src = locate(send, total * esize);
    const void *copy_from = nullptr;
    if (src.seg == kNone) {
        src = Where{kScratch, 0};
        copy_from = send;
    }
    begin(src, Where{kNone, 0}, copy_from != nullptr ? total * esize : 0, copy_from, total * esize);
    if (nodes_ == 1) {
        if (mine) {
            // recv may be this rank's own block of send (in place): the
            // reduction reads a block of every source before storing it.
            std::vector<const void *> srcs(static_cast<size_t>(local_size_));
            for (int p = 0; p < local_size_; ++p)
                srcs[static_cast<size_t>(p)] = peer_ptr(p, peers_[static_cast<size_t>(p)].src) + offs[me] * esize;
            reduce_sources(recv, srcs.data(), srcs.size(), mine, dtype, op);
        }
    } else {
        const MPI_Datatype type = types_.type(dtype);
        const MPI_Op mop = types_.op(dtype, op);
        const bool direct_ok = !overlap(peer_ptr(local_rank_, src), total * esize, recv, mine * esize);
        std::vector<size_t> lc, ld;
        for (const Lane &lane : lanes_) {
            lane_blocks(lane.v, node_size_, members_, offs, counts, &lc, &ld);
            if (sum(lc) == 0) continue;
            const NetAlgo algo = lane_algo(lc, esize, false);
            last_algo_ = algo;
            if (algo == NetAlgo::MPI) {
                const char *part = lane_partial(lane.v, offs, counts, &lc, &ld, dtype, op, esize, direct_ok);
                mpi_reduce_scatterv(lane.comm.get(), part, recv, lc, type, mop, esize);
                stats_.bytes_off_node += (sum(lc) - lc[static_cast<size_t>(node_index_)]) * esize;
                continue;
            }
            // This rank's block of the lane is its own (empty on lanes it
            // serves for absent members).
            NetLane net(lane.comm.get(), esize, net_chunk_, algo, dtype, op, &partial_, &net_b_, &net_c_);
            net.reduce_scatter(node_input(dtype, op, esize, direct_ok), lc, ld, static_cast<char *>(recv));
            stats_.bytes_off_node += (sum(lc) - lc[static_cast<size_t>(node_index_)]) * esize;
        }
    }
    node_sync(); // the peers are done reading this rank's input
}

void ShmBackend::allgatherv(const void *send, void *recv, const std::vector<size_t> &counts, dsm_dtype_t dtype,
                            Queue queue) {
    const watchdog::WaitScope wait("allgatherv", &watch_);
    drain(queue);
    size_t total = 0, mine = 0;
    const std::vector<size_t> offs = check_allgatherv(size_, rank_, send, recv, counts, dtype, &total, &mine);
    const size_t esize = require_dtype_size(dtype), me = static_cast<size_t>(rank_);
    ++stats_.calls;
    stats_.bytes_sent += (total - mine) * esize;
    if (total == 0) return;
    char *out = static_cast<char *>(recv);
    if (size_ == 1) {
        if (mine && out != send) std::memmove(out, send, mine * esize);
        return;
    }
    // The gathered buffer the peers read: recv when node-shared, else a
    // scratch copy with the same layout.
    Where dst = locate(recv, total * esize);
    size_t need = 0;
    if (dst.seg == kNone) {
        dst = Where{kScratch, 0};
        need = total * esize;
    }
    begin(Where{kNone, 0}, dst, need, nullptr, 0);
    char *w = peer_ptr(local_rank_, dst);
    if (mine && w + offs[me] * esize != send) std::memcpy(w + offs[me] * esize, send, mine * esize);
    if (nodes_ > 1) {
        const MPI_Datatype type = types_.type(dtype);
        std::vector<size_t> lc, ld;
        for (const Lane &lane : lanes_) {
            lane_blocks(lane.v, node_size_, members_, offs, counts, &lc, &ld);
            if (sum(lc) == 0) continue;
            const NetAlgo algo = lane_algo(lc, esize, false);
            last_algo_ = algo;
            if (algo == NetAlgo::MPI) {
                mpi_allgatherv_in_place(lane.comm.get(), w, lc, ld, type, esize);
                stats_.bytes_off_node += (sum(lc) - lc[static_cast<size_t>(node_index_)]) * esize;
                continue;
            }
            NetLane net(lane.comm.get(), esize, net_chunk_, algo, dtype, Op::SUM, &partial_, &net_b_, &net_c_);
            net.allgather(w, lc, ld);
            stats_.bytes_off_node += (sum(lc) - lc[static_cast<size_t>(node_index_)]) * esize;
        }
    }
    gather_blocks(out, offs, counts, esize);
}

// All-to-all and broadcast move each byte once whatever the transport: MPI.
void ShmBackend::alltoallv(const void *send, const std::vector<size_t> &send_counts,
                           const std::vector<size_t> &send_displs, void *recv, const std::vector<size_t> &recv_counts,
                           const std::vector<size_t> &recv_displs, dsm_dtype_t dtype, Queue queue) {
    const watchdog::WaitScope wait("alltoallv", &watch_);
    drain(queue);
    const size_t esize = require_dtype_size(dtype);
    check_alltoallv(size_, send, send_counts, send_displs, recv, recv_counts, recv_displs, esize);
    ++stats_.calls;
    for (int r = 0; r < size_; ++r) {
        const uint64_t b = send_counts[static_cast<size_t>(r)] * esize;
        if (r != rank_) stats_.bytes_sent += b;
        if (node_of_[static_cast<size_t>(r)] != node_index_) stats_.bytes_off_node += b;
    }
    mpi_alltoallv(comm_.get(), send, send_counts, send_displs, recv, recv_counts, recv_displs, types_.type(dtype),
                  esize);
}

void ShmBackend::alltoall_packed(const std::vector<size_t> &send_bytes, const std::vector<size_t> &recv_bytes,
                                 const PackFn &pack, const UnpackFn &unpack, Queue queue) {
    const watchdog::WaitScope wait("alltoall_packed", &watch_);
    drain(queue);
    check_packed(size_, rank_, send_bytes, recv_bytes, pack, unpack);
    ++stats_.calls;
    for (int r = 0; r < size_; ++r) {
        const uint64_t b = send_bytes[static_cast<size_t>(r)];
        if (r != rank_) stats_.bytes_sent += b;
        if (node_of_[static_cast<size_t>(r)] != node_index_) stats_.bytes_off_node += b;
    }
    if (nodes_ > 1 || local_size_ == 1) {
        alltoall_packed_mpi(send_bytes, recv_bytes, pack, unpack);
        return;
    }
    alltoall_packed_node(send_bytes, recv_bytes, pack, unpack);
}

void ShmBackend::alltoall_packed_node(const std::vector<size_t> &send_bytes, const std::vector<size_t> &recv_bytes,
                                      const PackFn &pack, const UnpackFn &unpack) {
    // One node: local ranks are the group ranks.
    const size_t n = static_cast<size_t>(local_size_), me = static_cast<size_t>(local_rank_);
    size_t need = 0;
    const std::vector<size_t> offs = packed_layout(send_bytes, n * sizeof(PackedEntry), "send_bytes", &need);
    Deferred failed;
    int32_t state = kPackLater;
    auto pack_into = [&](char *seg) {
        PackedEntry *table = reinterpret_cast<PackedEntry *>(seg);
        for (size_t q = 0; q < n; ++q) table[q] = PackedEntry{offs[q], send_bytes[q]};
        // This member's own block last: unpacked first, it may still be in
        // cache when it is small.
        failed.run([&] {
            for (size_t k = 1; k <= n; ++k) {
                const size_t q = (me + k) % n;
                if (send_bytes[q]) pack(static_cast<int>(q), seg + offs[q]);
            }
        });
        state = failed.failed() ? kPackFailed : kPacked;
    };
    auto publish = [&] {
        *reinterpret_cast<Slot *>(control_.base(local_rank_)) =
            Slot{Where{kScratch, 0}, Where{kNone, 0}, need, 0, state, static_cast<int32_t>(failed.status())};
    };
    // What the slots say: the largest need, whether some member waits for a
    // larger window, and the lowest member that failed to pack.
    size_t most = 0;
    bool later = false;
    int failing = -1;
    dsm_status_t status = DSM_SUCCESS;
    auto survey = [&] {
        most = 0;
        later = false;
        failing = -1;
        for (int p = 0; p < local_size_; ++p) {
            const Slot s = *reinterpret_cast<const Slot *>(control_.base(p));
            most = std::max<size_t>(most, s.scratch);
            later = later || s.packed == kPackLater;
            if (s.packed == kPackFailed && failing < 0) {
                failing = p;
                status = static_cast<dsm_status_t>(s.status);
            }
        }
    };

    if (need <= scratch_.bytes()) pack_into(scratch_.base(local_rank_));
    publish();
    node_sync();
    survey();
    if (failing < 0 && later) {
        // Grow the window to the largest need: the members that packed carry
        // their segments over, the others pack now.
        node_sync(); // every member has read the slots, which change below
        SharedWindow grown(node_.get(), scratch_steps(most));
        if (state == kPacked) std::memcpy(grown.base(local_rank_), scratch_.base(local_rank_), need);
        scratch_ = std::move(grown);
        if (state == kPackLater) pack_into(scratch_.base(local_rank_));
        publish();
        node_sync();
        survey();
    }
    if (failing >= 0) {
        node_sync(); // the slots are read before the next call rewrites them
        packed_failure(failed, failing, status);
    }
    // Every block for this member from its sender's segment, its own first,
    // then upwards, so that the members read different segments at a time.
    Deferred unpacked;
    unpacked.run([&] {
        for (size_t k = 0; k < n; ++k) {
            const size_t q = (me + k) % n;
            const char *seg = scratch_.base(static_cast<int>(q));
            const PackedEntry e = reinterpret_cast<const PackedEntry *>(seg)[me];
            DSM_REQUIRE(e.bytes == recv_bytes[q], DSM_ERR_MISMATCH, "alltoall_packed: member ", q, " sends ", e.bytes,
                        " bytes to member ", me, ", which expects ", recv_bytes[q]);
            if (recv_bytes[q]) unpack(static_cast<int>(q), seg + e.off);
        }
    });
    node_sync(); // the peers are done reading this member's segment
    unpacked.rethrow_if_failed();
}

bool ShmBackend::alltoall_pieces(const std::vector<Exposed> &exposed, const PlanFn &send_plan,
                                 const PlanFn &recv_plan, Queue queue) {
    const watchdog::WaitScope wait("alltoall_pieces", &watch_);
    drain(queue);
    if (nodes_ == 1) return false;
    return alltoall_pieces_mpi(exposed, send_plan, recv_plan,
                               [this](int q) { return node_of_[static_cast<size_t>(q)] != node_index_; });
}

void ShmBackend::bcast(void *buf, size_t count, dsm_dtype_t dtype, int root, Queue queue) {
    const watchdog::WaitScope wait("bcast", &watch_);
    drain(queue);
    const size_t esize = require_dtype_size(dtype);
    check_bcast(size_, buf, count, esize, root);
    ++stats_.calls;
    if (rank_ == root && size_ > 1) stats_.bytes_sent += count * esize;
    if (rank_ == root && nodes_ > 1) stats_.bytes_off_node += count * esize;
    mpi_bcast(comm_.get(), buf, count, types_.type(dtype), root, esize);
}

void ShmBackend::barrier(Queue queue) { barrier_mpi(queue); }

// ---------------------------------------------------------------- allocations

void *ShmBackend::alloc_shared(size_t bytes) {
    const watchdog::WaitScope wait("alloc_shared (window allocation)", &watch_);
    // Agreed over the group: a node without room fails every rank.
    SharedWindow w(node_.get(), bytes, comm_.get());
    char *mine = w.base(local_rank_);
    std::memset(mine, 0, bytes); // zeroed, and first touched by its owner
    allocs_.emplace(next_id_++, std::move(w));
    return mine;
}

void ShmBackend::free_shared(void *ptr) {
    if (ptr == nullptr) return;
    const watchdog::WaitScope wait("free_shared (window release)", &watch_);
    for (auto it = allocs_.begin(); it != allocs_.end(); ++it)
        if (it->second.base(local_rank_) == ptr) {
            allocs_.erase(it); // collective over the node, like the allocation
            return;
        }
    DSM_FAIL(DSM_ERR_INVALID_ARGUMENT, "pointer ", ptr, " was not returned by alloc_shared of this backend");
}

void ShmBackend::abandon() noexcept {
    control_.abandon();
    scratch_.abandon();
    direct_abandon();
    for (auto &a : allocs_) a.second.abandon();
    for (Lane &lane : lanes_) (void)lane.comm.release();
    (void)node_.release();
    (void)comm_.release();
}

} // namespace comm
} // namespace dsm
