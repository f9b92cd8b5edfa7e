// The shm backend's alltoall_direct (see ShmBackend in shm_backend.hpp):
// the window of tables, the probe of cross-memory attach, and the copies.
#include "dsm_config.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>
#ifdef __linux__
#include <sys/uio.h>
#endif

#include "comm/memops.hpp"
#include "comm/shm_backend.hpp"
#include "core/agree.hpp"
#include "core/error.hpp"
#include "core/log.hpp"

namespace dsm {
namespace comm {

namespace {

// alltoall_direct's window, per member: the probe record, then two halves
// that successive calls use in turn. A half holds a header, the bytes this
// member got from each peer, where its push requests to each peer lie, the
// table of its exposed buffers (`cap` entries: address, size, and the
// allocation and offset where the buffer lies in node-shared memory) and the
// push requests (`req_cap` bytes).
struct ProbeRecord {
    int64_t pid;
    uint64_t addr;  // of a value in the member's private memory
    uint64_t value; // that value
};
struct DirectHeader {
    uint64_t count;        // exposed buffers
    uint64_t need;         // bytes of push requests
    int32_t status_before; // a failure before any copy (empty plan, NULL buffer, a throwing plan)
    int32_t status_after;  // the outcome of this member's copies
    // Without cross-memory attach the plans follow the first sync: the bytes
    // of their requests and their outcome, published apart from the first
    // ones, which a peer may still be reading.
    uint64_t late_need;
    int32_t late_status;
    int32_t unused;
};
struct DirectEntry {
    uint64_t addr, bytes;
    int64_t seg; // the alloc_shared allocation holding the buffer, kNone (private memory) or kEmpty
    uint64_t off; // its offset in this member's segment of the allocation
};
struct RequestRun {
    uint64_t first, count; // this member's requests to one peer, in its request list
};
// A piece of this member's plan that the peer holding its source writes
// (push), with the destination's address in this process and, when it lies
// in node-shared memory, its allocation and offset there (seg kNone if not).
struct Request {
    int64_t buffer;
    uint64_t from, to, bytes;
    int64_t seg;
    uint64_t off;
};
constexpr size_t kProbeBytes = 64;
constexpr size_t kDirectCap = 16;                // exposed buffers a half holds at first
constexpr size_t kRequestCap = size_t(64) << 10; // request bytes a half holds at first
// A pair whose source side takes at least this many runs, and more than
// twice its destination side, is pushed (written by the source's owner)
// rather than pulled. With cross-memory attach: the kernel pins the pages of
// each remote iovec separately, while local iovecs cost little, so the
// fragmented side should be the local one (measured: 16 MiB in 1 KiB pieces
// took 9.4 ms with the sources scattered remotely, 5.4 ms pushed, 2.4 ms
// contiguous). In node-shared memory: the owner copies the pieces of all its
// peers and its own in turn, so that it reads its input from start to end
// (Ulysses' seq_to_head: each peer wants a slice of every row); reading
// slices with gaps defeats the hardware prefetchers (measured: 64 MiB in
// 8 KiB slices of 16 KiB rows, 7 GB/s one slice after the other, 13 GB/s
// row by row).
constexpr size_t kPushMin = 64;
size_t round64(size_t b) { return (b + 63) & ~size_t(63); }

// alltoall_direct's memcpy of the pieces: a call that brings a member at
// least this many bytes writes them with streaming (non-temporal) stores.
// Such outputs exceed the caches anyway, and skipping the read-for-ownership
// of every destination line saves a third of the memory traffic.
constexpr size_t kStreamBytes = size_t(8) << 20;

// Copies the pieces of one alltoall_direct call: memcpy, or streaming
// stores (see kStreamBytes; pieces under 256 bytes, which are mostly partial
// lines, still with memcpy) followed by a fence before the call's last sync.
class PieceCopier {
public:
    explicit PieceCopier(bool stream) noexcept : k_(stream ? &memops::active() : nullptr) {}
    void operator()(void *to, const void *from, size_t bytes) const noexcept {
        if (k_ && bytes >= 256)
            k_->stream_copy(to, from, bytes);
        else
            std::memcpy(to, from, bytes);
    }
    // Orders the streaming stores before what follows (the sync).
    void fence() const noexcept {
        if (k_) k_->stream_fence();
    }

private:
    const memops::Kernels *k_; // streaming copies (memops.hpp), or none
};

#ifdef __linux__
// Copies between this process and one peer with process_vm_readv (pull:
// local = destinations here, remote = sources there) or process_vm_writev
// (push: local = sources here, remote = destinations there). Pieces are
// appended to a local and a remote iovec list, each merged where it
// continues the previous element (the two lists are independent: the call
// moves the bytes of one list, in order, to the other's), and moved in
// batches of at most kIovMax elements per list, looping on partial moves.
class CmaCopier {
public:
    static constexpr size_t kIovMax = 1024; // IOV_MAX, the kernel's UIO_MAXIOV

    void start(pid_t pid, int member, bool write) {
        pid_ = pid;
        member_ = member;
        write_ = write;
        local_.clear();
        remote_.clear();
    }

    void add(void *local, uintptr_t remote, size_t bytes) {
        const bool join_local =
            !local_.empty() && static_cast<char *>(local_.back().iov_base) + local_.back().iov_len == local;
        const bool join_remote =
            !remote_.empty() && reinterpret_cast<uintptr_t>(remote_.back().iov_base) + remote_.back().iov_len == remote;
        if ((!join_local && local_.size() == kIovMax) || (!join_remote && remote_.size() == kIovMax)) {
            flush();
            add(local, remote, bytes);
            return;
        }
        if (join_local)
            local_.back().iov_len += bytes;
        else
            local_.push_back(iovec{local, bytes});
        if (join_remote)
            remote_.back().iov_len += bytes;
        else
            remote_.push_back(iovec{reinterpret_cast<void *>(remote), bytes});
    }

    void flush() {
        size_t li = 0, ri = 0;
        while (li < local_.size()) {
            const ssize_t got =
                write_ ? process_vm_writev(pid_, local_.data() + li, local_.size() - li, remote_.data() + ri,
                                           remote_.size() - ri, 0)
                       : process_vm_readv(pid_, local_.data() + li, local_.size() - li, remote_.data() + ri,
                                          remote_.size() - ri, 0);
            if (got < 0 && errno == EINTR) continue;
            if (got <= 0) {
                const int err = got < 0 ? errno : 0;
                DSM_FAIL(err == EFAULT ? DSM_ERR_INVALID_ARGUMENT : DSM_ERR_NOT_SUPPORTED, "alltoall_direct: ",
                         write_ ? "process_vm_writev to" : "process_vm_readv from", " member ", member_, " (pid ",
                         pid_, ") failed: ", err ? std::strerror(err) : "no progress",
                         err == EFAULT ? " (an exposed buffer or a destination is not mapped)" : "");
            }
            advance(local_, &li, static_cast<size_t>(got));
            advance(remote_, &ri, static_cast<size_t>(got));
        }
        local_.clear();
        remote_.clear();
    }

private:
    static void advance(std::vector<iovec> &v, size_t *i, size_t bytes) {
        while (bytes && *i < v.size()) {
            iovec &e = v[*i];
            if (e.iov_len <= bytes) {
                bytes -= e.iov_len;
                ++*i;
            } else {
                e.iov_base = static_cast<char *>(e.iov_base) + bytes;
                e.iov_len -= bytes;
                bytes = 0;
            }
        }
    }

    pid_t pid_ = 0;
    int member_ = 0;
    bool write_ = false;
    std::vector<iovec> local_, remote_;
};
#endif

} // namespace

// alltoall_direct's state between calls (see ShmBackend).
struct ShmBackend::Direct {
    SharedWindow win; // the probe record and two halves per member (none for a group of one)
    size_t members = 0, cap = 0, req_cap = 0;
    size_t half = 0; // bytes of a half
    uint64_t calls = 0;
    std::vector<int64_t> pids; // per local rank
    uint64_t magic = 0;        // the probe value the peers read from this process
    std::vector<std::vector<Piece>> pieces; // this call's plan, per peer
    std::vector<char> push;                 // per peer: whether it writes this member's pieces
    std::vector<char> push_shared;          // ... and whether it can in node-shared memory
    std::vector<Request> requests;
    std::vector<DirectEntry> entries;  // this call's exposed buffers, as published
    std::vector<const char *> sources; // a peer's exposed buffers in its node-shared memory
#ifdef __linux__
    CmaCopier copier;
#endif

    void layout(size_t n, size_t c, size_t r) {
        members = n;
        cap = c;
        req_cap = r;
        half = round64(fixed() + req_cap);
    }
    size_t fixed() const {
        return round64(sizeof(DirectHeader) + members * (sizeof(uint64_t) + sizeof(RequestRun)) +
                       cap * sizeof(DirectEntry));
    }
    char *half_of(int p, uint64_t call) const { return win.base(p) + kProbeBytes + (call & 1) * half; }
    static DirectHeader *header(char *h) { return reinterpret_cast<DirectHeader *>(h); }
    uint64_t *got(char *h) const { return reinterpret_cast<uint64_t *>(h + sizeof(DirectHeader)); }
    RequestRun *runs(char *h) const {
        return reinterpret_cast<RequestRun *>(h + sizeof(DirectHeader) + members * sizeof(uint64_t));
    }
    DirectEntry *table(char *h) const {
        return reinterpret_cast<DirectEntry *>(h + sizeof(DirectHeader) +
                                               members * (sizeof(uint64_t) + sizeof(RequestRun)));
    }
    Request *reqs(char *h) const { return reinterpret_cast<Request *>(h + fixed()); }
};

void ShmBackend::DirectDelete::operator()(Direct *d) const noexcept { std::default_delete<Direct>()(d); }

ShmBackend::DirectPtr ShmBackend::make_direct() { return DirectPtr(std::make_unique<Direct>().release()); }

void ShmBackend::direct_sync() const noexcept {
    if (direct_) direct_->win.sync();
}

void ShmBackend::direct_abandon() noexcept {
    if (direct_) direct_->win.abandon();
}

// ---------------------------------------------------------------- alltoall_direct

void ShmBackend::direct_setup() {
    if (direct_state_ >= 0) return;
    DirectPtr d = make_direct();
    const size_t n = static_cast<size_t>(local_size_);
    d->pids.assign(n, 0);
    d->layout(n, kDirectCap, kRequestCap);
    d->win = SharedWindow(node_.get(), kProbeBytes + 2 * d->half);
    direct_ = std::move(d); // node_sync() now syncs its window
    if (refuse_cma_) {
        direct_state_ = 0; // (the tests, on every member alike)
        return;
    }
#ifdef __linux__
    const uint64_t now = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    direct_->magic = (now * 0x9e3779b97f4a7c15ull) ^ (static_cast<uint64_t>(getpid()) << 32) ^
                     reinterpret_cast<uintptr_t>(direct_.get()) ^ 0x64736d636d61ull; // "dsmcma"
    *reinterpret_cast<ProbeRecord *>(direct_->win.base(local_rank_)) =
        ProbeRecord{static_cast<int64_t>(getpid()), reinterpret_cast<uintptr_t>(&direct_->magic), direct_->magic};
    node_sync();
    // Read each peer's value, and write it back unchanged (pushes use
    // process_vm_writev).
    int ok = 1;
    std::string why;
    for (int p = 0; p < local_size_; ++p) {
        const ProbeRecord rec = *reinterpret_cast<const ProbeRecord *>(direct_->win.base(p));
        direct_->pids[static_cast<size_t>(p)] = rec.pid;
        if (p == local_rank_ || !ok) continue;
        uint64_t got = ~rec.value;
        iovec local{&got, sizeof got};
        iovec remote{reinterpret_cast<void *>(static_cast<uintptr_t>(rec.addr)), sizeof got};
        const pid_t pid = static_cast<pid_t>(rec.pid);
        ssize_t moved = process_vm_readv(pid, &local, 1, &remote, 1, 0);
        if (moved == static_cast<ssize_t>(sizeof got) && got == rec.value)
            moved = process_vm_writev(pid, &local, 1, &remote, 1, 0);
        else if (moved >= 0)
            moved = -2;
        if (moved != static_cast<ssize_t>(sizeof got)) {
            ok = 0;
            why = moved == -2 ? dsm::cat("process_vm_readv from local rank ", p, " read the wrong value")
                              : dsm::cat("cross-memory attach to local rank ", p, ": ",
                                         moved < 0 ? std::strerror(errno) : "a short transfer");
        }
    }
    int all = 0;
    DSM_CHECK_MPI(MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, node_.get()));
    direct_state_ = all;
    if (all)
        DSM_INFO(COMM, "alltoall_direct: single-copy all-to-all over %d local ranks: cross-memory attach works",
                 local_size_);
    else
        DSM_INFO(COMM,
                 "alltoall_direct: cross-memory attach is not available (%s): single copy only for inputs in "
                 "node-shared memory, packing for the others",
                 why.empty() ? "refused on another local rank" : why.c_str());
#else
    direct_state_ = 0; // every member alike
    DSM_INFO(COMM, "alltoall_direct: no cross-memory attach on this OS: single copy only for inputs in node-shared "
                   "memory, packing for the others");
#endif
}

namespace {

// The checks every member makes before anything moves: a plan, and no NULL
// buffer that has bytes. DSM_SUCCESS or the status, with the message in *why.
dsm_status_t check_direct(const std::vector<Backend::Exposed> &exposed, const Backend::PlanFn &plan,
                          std::string *why) {
    if (!plan) {
        *why = "alltoall_direct: plan is empty";
        return DSM_ERR_NULL_POINTER;
    }
    for (size_t b = 0; b < exposed.size(); ++b)
        if (exposed[b].data == nullptr && exposed[b].bytes) {
            *why = dsm::cat("alltoall_direct: exposed buffer ", b, " is NULL but has ", exposed[b].bytes, " bytes");
            return DSM_ERR_NULL_POINTER;
        }
    return DSM_SUCCESS;
}

// Whether piece pc (of a nonzero size) lies inside its source's exposed
// buffers (`count` of them; sizes via bytes_of) and has a destination.
template <typename Bytes> bool piece_ok(int64_t buffer, size_t from, size_t bytes, const void *to, size_t count,
                                        const Bytes &bytes_of) {
    if (buffer < 0 || static_cast<uint64_t>(buffer) >= count || to == nullptr) return false;
    const size_t size = bytes_of(static_cast<size_t>(buffer));
    return from <= size && bytes <= size - from;
}

// Throws DSM_ERR_INVALID_ARGUMENT (DSM_ERR_NULL_POINTER without a
// destination) unless piece i from member q is valid (see piece_ok).
template <typename Bytes>
void check_piece(const Backend::Piece &pc, size_t i, int q, size_t count, const Bytes &bytes_of) {
    DSM_REQUIRE(pc.buffer >= 0 && static_cast<size_t>(pc.buffer) < count, DSM_ERR_INVALID_ARGUMENT,
                "alltoall_direct: piece ", i, " from member ", q, " names buffer ", pc.buffer, " of ", count);
    const size_t size = bytes_of(static_cast<size_t>(pc.buffer));
    DSM_REQUIRE(pc.from <= size && pc.bytes <= size - pc.from, DSM_ERR_INVALID_ARGUMENT, "alltoall_direct: piece ",
                i, " from member ", q, " reads ", pc.bytes, " bytes at offset ", pc.from, " of buffer ", pc.buffer,
                ", which has ", size);
    DSM_REQUIRE(pc.to != nullptr, DSM_ERR_NULL_POINTER, "alltoall_direct: piece ", i, " from member ", q,
                " has no destination");
}

// Whether the peer should write these pieces (push) rather than this member
// read them (pull): see kPushMin.
bool should_push(const std::vector<Backend::Piece> &pieces) {
    size_t src_runs = 0, dst_runs = 0, from_end = 0;
    int buffer = -1;
    const char *to_end = nullptr;
    for (const Backend::Piece &pc : pieces) {
        if (pc.bytes == 0) continue;
        if (pc.buffer != buffer || pc.from != from_end) ++src_runs;
        if (static_cast<const char *>(pc.to) != to_end) ++dst_runs;
        buffer = pc.buffer;
        from_end = pc.from + pc.bytes;
        to_end = static_cast<const char *>(pc.to) + pc.bytes;
    }
    return src_runs >= kPushMin && src_runs > 2 * dst_runs;
}

} // namespace

bool ShmBackend::alltoall_direct(const std::vector<Exposed> &exposed, const PlanFn &plan, Queue queue) {
    const watchdog::WaitScope wait("alltoall_direct", &watch_);
    drain(queue);
    if (nodes_ > 1) return false;
    std::string why;
    dsm_status_t before = check_direct(exposed, plan, &why);
    const size_t count = exposed.size();
    auto exposed_bytes = [&](size_t b) { return exposed[b].bytes; };
    auto self_piece = [&](const Piece &pc, size_t i, const PieceCopier &copy) {
        check_piece(pc, i, local_rank_, count, exposed_bytes);
        copy(pc.to, static_cast<const char *>(exposed[static_cast<size_t>(pc.buffer)].data) + pc.from, pc.bytes);
    };
    auto self_copy = [&](const std::vector<Piece> &pieces, const PieceCopier &copy) {
        uint64_t total = 0;
        for (size_t i = 0; i < pieces.size(); ++i) {
            if (pieces[i].bytes == 0) continue;
            self_piece(pieces[i], i, copy);
            total += pieces[i].bytes;
        }
        return total;
    };
    // Whether the pieces bring this member enough bytes to stream them.
    auto large = [](const std::vector<std::vector<Piece>> &all) {
        size_t total = 0;
        for (const std::vector<Piece> &pieces : all)
            for (const Piece &pc : pieces) {
                total += pc.bytes;
                if (total >= kStreamBytes) return true;
            }
        return false;
    };

    if (local_size_ == 1) { // a group of one: its own pieces, with memcpy
        ++stats_.calls;
        if (before != DSM_SUCCESS) DSM_FAIL(before, why);
        if (!direct_) direct_ = make_direct();
        direct_->pieces.resize(1);
        std::vector<Piece> &pieces = direct_->pieces[0];
        pieces.clear();
        plan(0, pieces);
        const PieceCopier copy(large(direct_->pieces));
        self_copy(pieces, copy);
        copy.fence();
        return true;
    }

    direct_setup();
    Direct &d = *direct_;
    const size_t n = static_cast<size_t>(local_size_), me = static_cast<size_t>(local_rank_);
    const uint64_t call = d.calls++;
    // With cross-memory attach every call runs: the plans are made before the
    // first sync, whose headers then carry a failing plan to every member
    // before anything moves. Without it, a call whose buffers are not all in
    // node-shared memory returns false, having called no plan, so the plans
    // wait until the tables have told (and one more sync carries a failure).
    const bool cma = direct_state_ == 1;
    if (cma) ++stats_.calls;

    // Where [p, p + bytes) lies in node-shared memory (seg kNone: it does
    // not), the allocation found last tried first.
    Where hit{kNone, 0};
    uintptr_t hit_base = 0, hit_size = 0;
    auto shared_at = [&](const void *p, size_t bytes) {
        const uintptr_t u = reinterpret_cast<uintptr_t>(p);
        if (hit.seg >= 0 && u >= hit_base && u - hit_base <= hit_size && bytes <= hit_size - (u - hit_base))
            return Where{hit.seg, u - hit_base};
        const Where w = locate(p, bytes);
        if (w.seg >= 0) {
            const SharedWindow &a = allocs_.at(w.seg);
            hit = w;
            hit_base = reinterpret_cast<uintptr_t>(a.base(local_rank_));
            hit_size = a.bytes();
        }
        return w;
    };

    // Plan every peer's pieces and choose, per peer, pull or push (see
    // kPushMin); a pushed peer's pieces become requests it reads after the
    // next sync. Without cross-memory attach only pieces whose destinations
    // all lie in node-shared memory can be pushed.
    d.pieces.resize(n);
    d.push.assign(n, 0);
    d.push_shared.assign(n, 0);
    d.requests.clear();
    std::vector<RequestRun> runs(n, RequestRun{0, 0});
    Deferred planned;
    auto plan_all = [&] {
        planned.run([&] {
            for (size_t k = 0; k < n; ++k) {
                const size_t q = (me + k) % n;
                std::vector<Piece> &pieces = d.pieces[q];
                pieces.clear();
                plan(static_cast<int>(q), pieces);
                if (q == me || !should_push(pieces)) continue;
                const size_t first = d.requests.size();
                bool in_shared = true;
                for (const Piece &pc : pieces) {
                    if (pc.bytes == 0) continue;
                    const Where w = in_shared ? shared_at(pc.to, pc.bytes) : Where{kNone, 0};
                    in_shared = w.seg >= 0;
                    d.requests.push_back(
                        Request{pc.buffer, pc.from, reinterpret_cast<uintptr_t>(pc.to), pc.bytes, w.seg, w.off});
                }
                if (!cma && !in_shared) {
                    d.requests.resize(first);
                    continue;
                }
                d.push[q] = 1;
                d.push_shared[q] = in_shared;
                runs[q] = RequestRun{first, d.requests.size() - first};
            }
        });
        if (planned.failed()) {
            before = planned.status();
            d.requests.clear();
            runs.assign(n, RequestRun{0, 0});
            d.push.assign(n, 0);
            d.push_shared.assign(n, 0);
        }
    };
    if (cma && before == DSM_SUCCESS) plan_all();

    // The table: each buffer's address and size, and where it lies in
    // node-shared memory (an allocation of this backend and the offset in
    // this member's segment of it), if it does.
    d.entries.resize(count);
    for (size_t b = 0; b < count; ++b) {
        const Where w = exposed[b].bytes == 0 ? Where{kEmpty, 0} : shared_at(exposed[b].data, exposed[b].bytes);
        d.entries[b] = DirectEntry{reinterpret_cast<uintptr_t>(exposed[b].data), exposed[b].bytes, w.seg, w.off};
    }
    // late: the plans were made after the first sync (no cross-memory attach).
    // full: the whole header and the table, else only what the late plans
    // change (which no peer reads before the next sync).
    bool late = false;
    auto publish = [&](bool full) {
        const size_t need = d.requests.size() * sizeof(Request);
        char *h = d.half_of(local_rank_, call);
        DirectHeader *head = Direct::header(h);
        if (full)
            *head = DirectHeader{count, late ? 0 : need, late ? DSM_SUCCESS : before, DSM_SUCCESS, need, before, 0};
        head->late_need = need;
        head->late_status = before;
        std::copy(runs.begin(), runs.end(), d.runs(h));
        if (full && count <= d.cap) std::copy(d.entries.begin(), d.entries.end(), d.table(h));
        if (need <= d.req_cap && need) std::memcpy(d.reqs(h), d.requests.data(), need);
    };
    publish(true);
    node_sync();

    // Every member reads the same headers, so all of them throw here alike.
    // (The next call writes the other half, so a member still reading these
    // is not overwritten.) most: the largest request list.
    size_t most = 0;
    auto agree = [&] {
        const uint64_t count0 = Direct::header(d.half_of(0, call))->count;
        most = 0;
        for (int p = 0; p < local_size_; ++p) {
            const DirectHeader *h = Direct::header(d.half_of(p, call));
            DSM_REQUIRE(h->count == count0, DSM_ERR_MISMATCH, "alltoall_direct: member ", p, " exposes ", h->count,
                        " buffers and member 0 ", count0);
            most = std::max<size_t>(most, late ? h->late_need : h->need);
        }
        for (int p = 0; p < local_size_; ++p) {
            const DirectHeader *h = Direct::header(d.half_of(p, call));
            const int32_t st = late ? h->late_status : h->status_before;
            if (st == DSM_SUCCESS) continue;
            planned.rethrow_if_failed();
            if (before != DSM_SUCCESS) DSM_FAIL(before, why);
            DSM_FAIL(static_cast<dsm_status_t>(st), "alltoall_direct: member ", p, " failed before copying (",
                     status_text(static_cast<dsm_status_t>(st)), "); no data was moved");
        }
    };
    agree();
    // When the tables or requests do not fit: every member saw the same
    // headers, so all grow the window (collectively) and publish again.
    auto grown = [](size_t need, size_t cap) { return need > cap ? std::max(need, 2 * cap) : cap; };
    auto grow = [&] {
        node_sync(); // the headers are read
        d.layout(n, grown(count, d.cap), grown(most, d.req_cap));
        d.win.reset();
        try {
            d.win = SharedWindow(node_.get(), kProbeBytes + 2 * d.half);
        } catch (...) {
            direct_.reset(); // no window: the next call probes again
            direct_state_ = -1;
            throw;
        }
        publish(true);
        node_sync();
    };
    if (count > d.cap || most > d.req_cap) grow();
    // Whether every exposed buffer of every member lies in node-shared
    // memory: every member reads the same tables, so all decide alike.
    bool shared = true;
    for (int p = 0; p < local_size_ && shared; ++p) {
        const DirectEntry *tab = d.table(d.half_of(p, call));
        for (size_t b = 0; b < count && shared; ++b) shared = tab[b].seg >= 0 || tab[b].seg == kEmpty;
    }
    // Private memory somewhere and no cross-memory attach: every member
    // returns false here, nothing moved and no plan called.
    if (!shared && !cma) return false;
    if (!cma) {
        ++stats_.calls;
        late = true;
        plan_all(); // (before is DSM_SUCCESS on every member: agree() did not throw)
        publish(false);
        node_sync();
        agree();
        if (most > d.req_cap) grow();
    }

    char *mine = d.half_of(local_rank_, call);
    uint64_t *got = d.got(mine);
    std::fill(got, got + n, uint64_t(0));
    size_t reads = 0, writes = 0, pulls = 0, pushes = 0;
    const PieceCopier copy(large(d.pieces));

    // Inputs in node-shared memory. First this member's own pieces and those
    // its peers asked it to push, in turn, one of each at a time: in
    // Ulysses' seq_to_head it so reads its input row by row. Then, from each
    // peer ((me+k) % n), this member's pieces that the peer did not push,
    // read from the peer's segments.
    auto copy_shared = [&] {
        struct Job {
            const Request *rq;
            size_t count;
            int peer;
            int64_t seg; // the allocation of the destination looked up last, and where it lies
            char *base;
            size_t size;
        };
        std::vector<Job> jobs;
        auto target = [&](Job &job, const Request &r) {
            if (r.seg != job.seg) {
                const auto it = allocs_.find(r.seg);
                job.seg = r.seg;
                job.base = it == allocs_.end() ? nullptr : it->second.base(job.peer);
                job.size = it == allocs_.end() ? 0 : it->second.bytes(job.peer);
            }
            return job.base;
        };
        for (size_t k = 1; k < n; ++k) {
            const int p = static_cast<int>((me + k) % n);
            char *hp = d.half_of(p, call);
            const RequestRun run = d.runs(hp)[me];
            if (run.count == 0) continue;
            // A run is skipped whole when one of its pieces is invalid (the
            // peer fails on it) or has a destination outside node-shared
            // memory (the peer reads those pieces itself).
            Job job{d.reqs(hp) + run.first, run.count, p, kNone, nullptr, 0};
            bool valid = true;
            for (size_t i = 0; i < run.count && valid; ++i) {
                const Request &r = job.rq[i];
                valid = r.seg >= 0 && piece_ok(r.buffer, r.from, r.bytes,
                                               reinterpret_cast<const void *>(static_cast<uintptr_t>(r.to)), count,
                                               exposed_bytes);
                if (!valid) break;
                DSM_REQUIRE(target(job, r) != nullptr && r.off <= job.size && r.bytes <= job.size - r.off,
                            DSM_ERR_INTERNAL, "alltoall_direct: member ", p, " asks for ", r.bytes,
                            " bytes at offset ", r.off, " of node-shared allocation ", r.seg, ", which holds ",
                            job.size, " bytes of it here (alloc_shared and free_shared called alike?)");
            }
            if (valid) jobs.push_back(job);
        }
        // One piece of each list (this member's own pieces, each job) at a
        // time, the lists in the order of their first sources, so that in
        // Ulysses' seq_to_head this member reads each row of its input from
        // start to end (backwards within a row halves the speed).
        const std::vector<Piece> &own = d.pieces[me];
        const auto own_first = std::find_if(own.begin(), own.end(), [](const Piece &pc) { return pc.bytes != 0; });
        using Source = std::pair<int64_t, uint64_t>;
        std::vector<std::pair<Source, int>> order; // (first source, list: -1 own, else the job's index)
        if (own_first != own.end()) order.push_back({Source{own_first->buffer, own_first->from}, -1});
        for (size_t i = 0; i < jobs.size(); ++i)
            order.push_back({Source{jobs[i].rq[0].buffer, jobs[i].rq[0].from}, static_cast<int>(i)});
        std::sort(order.begin(), order.end());
        size_t longest = own.size();
        for (const Job &job : jobs) longest = std::max(longest, job.count);
        for (size_t j = 0; j < longest; ++j)
            for (const auto &o : order) {
                if (o.second < 0) {
                    if (j < own.size() && own[j].bytes) {
                        self_piece(own[j], j, copy);
                        got[me] += own[j].bytes;
                    }
                    continue;
                }
                Job &job = jobs[static_cast<size_t>(o.second)];
                if (j >= job.count) continue;
                const Request &r = job.rq[j];
                copy(target(job, r) + r.off,
                     static_cast<const char *>(exposed[static_cast<size_t>(r.buffer)].data) + r.from, r.bytes);
            }
        writes += jobs.size();
        for (size_t k = 1; k < n; ++k) {
            const size_t q = (me + k) % n;
            const int qi = static_cast<int>(q);
            const DirectEntry *tab = d.table(d.half_of(qi, call));
            auto peer_bytes = [&](size_t b) { return static_cast<size_t>(tab[b].bytes); };
            const bool pull = !d.push_shared[q];
            if (pull) {
                // q's buffers in this process's mappings of its segments.
                d.sources.assign(count, nullptr);
                for (size_t b = 0; b < count; ++b) {
                    const DirectEntry &e = tab[b];
                    if (e.seg == kEmpty) continue;
                    const auto it = allocs_.find(e.seg);
                    const size_t held = it == allocs_.end() ? 0 : it->second.bytes(qi);
                    DSM_REQUIRE(it != allocs_.end() && e.off <= held && e.bytes <= held - e.off, DSM_ERR_INTERNAL,
                                "alltoall_direct: member ", q, " exposes ", e.bytes, " bytes at offset ", e.off,
                                " of node-shared allocation ", e.seg, ", which holds ", held,
                                " bytes of it here (alloc_shared and free_shared called alike?)");
                    d.sources[b] = it->second.base(qi) + e.off;
                }
                ++reads;
            }
            const std::vector<Piece> &pieces = d.pieces[q];
            for (size_t i = 0; i < pieces.size(); ++i) {
                const Piece &pc = pieces[i];
                if (pc.bytes == 0) continue;
                check_piece(pc, i, qi, count, peer_bytes);
                if (pull) copy(pc.to, d.sources[static_cast<size_t>(pc.buffer)] + pc.from, pc.bytes);
                got[q] += pc.bytes;
            }
        }
    };

#ifdef __linux__
    // Cross-memory attach, itself first, then upwards, so that the members
    // work with different peers at a time. With each peer q: this member's
    // pieces from q (memcpy, a pull, or nothing when q pushes them), then the
    // pieces q asked this member to push.
    auto copy_cma = [&] {
        for (size_t k = 0; k < n; ++k) {
            const size_t q = (me + k) % n;
            const int qi = static_cast<int>(q);
            const std::vector<Piece> &pieces = d.pieces[q];
            if (q == me) {
                got[q] = self_copy(pieces, copy);
                continue;
            }
            char *hq = d.half_of(qi, call);
            const DirectEntry *tab = d.table(hq);
            auto peer_bytes = [&](size_t b) { return static_cast<size_t>(tab[b].bytes); };
            const bool pull = !d.push[q];
            if (pull) {
                d.copier.start(static_cast<pid_t>(d.pids[q]), qi, false);
                ++pulls;
            }
            uint64_t total = 0;
            for (size_t i = 0; i < pieces.size(); ++i) {
                const Piece &pc = pieces[i];
                if (pc.bytes == 0) continue;
                check_piece(pc, i, qi, count, peer_bytes);
                if (pull) d.copier.add(pc.to, static_cast<uintptr_t>(tab[pc.buffer].addr) + pc.from, pc.bytes);
                total += pc.bytes;
            }
            if (pull) d.copier.flush();
            got[q] = total;

            // q's requests: skipped whole when one is invalid (q fails on it).
            const RequestRun run = d.runs(hq)[me];
            if (run.count == 0) continue;
            const Request *rq = d.reqs(hq) + run.first;
            bool valid = true;
            for (size_t i = 0; i < run.count && valid; ++i)
                valid = piece_ok(rq[i].buffer, rq[i].from, rq[i].bytes,
                                 reinterpret_cast<const void *>(static_cast<uintptr_t>(rq[i].to)), count,
                                 exposed_bytes);
            if (!valid) continue;
            d.copier.start(static_cast<pid_t>(d.pids[q]), qi, true);
            for (size_t i = 0; i < run.count; ++i) {
                const char *from = static_cast<const char *>(exposed[static_cast<size_t>(rq[i].buffer)].data);
                d.copier.add(const_cast<char *>(from) + rq[i].from, static_cast<uintptr_t>(rq[i].to), rq[i].bytes);
            }
            d.copier.flush();
            ++pushes;
        }
    };
#endif

    Deferred failed;
    failed.run([&] {
        if (shared) {
            copy_shared();
            return;
        }
#ifdef __linux__
        copy_cma();
#endif
    });
    copy.fence();
    Direct::header(mine)->status_after = failed.status();
    node_sync(); // every member is done with the others' buffers
    direct_reads_ += reads;
    direct_writes_ += writes;
    direct_pulls_ += pulls;
    direct_pushes_ += pushes;

    int failing = -1;
    dsm_status_t status = DSM_SUCCESS;
    for (int p = 0; p < local_size_; ++p) {
        char *h = d.half_of(p, call);
        if (p != local_rank_) stats_.bytes_sent += d.got(h)[me];
        const int32_t st = Direct::header(h)->status_after;
        if (st != DSM_SUCCESS && failing < 0) {
            failing = p;
            status = static_cast<dsm_status_t>(st);
        }
    }
    if (failing >= 0) {
        failed.rethrow_if_failed();
        DSM_FAIL(status, "alltoall_direct: copying failed on member ", failing, " (", status_text(status),
                 "); the outputs are incomplete");
    }
    return true;
}

} // namespace comm
} // namespace dsm
