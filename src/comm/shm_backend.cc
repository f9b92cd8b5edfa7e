// The "shm" backend: node-shared MPI-3 windows inside a node, MPI lanes
// between nodes (see ShmBackend in backends.hpp for the scheme).
#include "dsm_config.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <sys/mman.h>
#include <sys/statvfs.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/uio.h>
#endif
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "comm/backends.hpp"
#include "comm/reduce.hpp"
#include "core/agree.hpp"
#include "core/error.hpp"
#include "core/log.hpp"

namespace dsm {
namespace comm {

namespace {

constexpr int64_t kScratch = -1; // the rank's scratch window
constexpr int64_t kNone = -2;    // not in node-shared memory
constexpr int64_t kDirect = -3;  // this process's own address (a node of one rank)
constexpr int64_t kEmpty = -4;   // alltoall_direct: a buffer of zero bytes (read by no piece)
constexpr uintptr_t kAlign = 64;
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

#if defined(__x86_64__)
// n bytes from src to dst, the 32-byte aligned middle of dst with streaming stores.
__attribute__((target("avx2"))) void stream_copy_avx2(char *d, const char *s, size_t n) noexcept {
    const size_t head = std::min(n, (32 - (reinterpret_cast<uintptr_t>(d) & 31)) & 31);
    std::memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
    for (; n >= 64; n -= 64, d += 64, s += 64) {
        const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(s));
        const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(s + 32));
        _mm256_stream_si256(reinterpret_cast<__m256i *>(d), a);
        _mm256_stream_si256(reinterpret_cast<__m256i *>(d + 32), b);
    }
    std::memcpy(d, s, n);
}

// The same with 16-byte stores (every x86-64 has SSE2).
void stream_copy_sse2(char *d, const char *s, size_t n) noexcept {
    const size_t head = std::min(n, (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15);
    std::memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
    for (; n >= 64; n -= 64, d += 64, s += 64) {
        const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i *>(s));
        const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i *>(s + 16));
        const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i *>(s + 32));
        const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i *>(s + 48));
        _mm_stream_si128(reinterpret_cast<__m128i *>(d), a);
        _mm_stream_si128(reinterpret_cast<__m128i *>(d + 16), b);
        _mm_stream_si128(reinterpret_cast<__m128i *>(d + 32), c);
        _mm_stream_si128(reinterpret_cast<__m128i *>(d + 48), e);
    }
    std::memcpy(d, s, n);
}
#endif

// Copies the pieces of one alltoall_direct call: memcpy, or streaming
// stores (see kStreamBytes; pieces under 256 bytes, which are mostly partial
// lines, still with memcpy) followed by a fence before the call's last sync.
class PieceCopier {
public:
    explicit PieceCopier(bool stream) noexcept {
#if defined(__x86_64__)
        static const bool avx2 = __builtin_cpu_supports("avx2");
        fn_ = !stream ? nullptr : avx2 ? stream_copy_avx2 : stream_copy_sse2;
#else
        (void)stream;
#endif
    }
    void operator()(void *to, const void *from, size_t bytes) const noexcept {
        if (fn_ && bytes >= 256)
            fn_(static_cast<char *>(to), static_cast<const char *>(from), bytes);
        else
            std::memcpy(to, from, bytes);
    }
    // Orders the streaming stores before what follows (the sync).
    void fence() const noexcept {
#if defined(__x86_64__)
        if (fn_) _mm_sfence();
#endif
    }

private:
    void (*fn_)(char *, const char *, size_t) noexcept = nullptr;
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

bool finalized() noexcept {
    int fini = 0;
    MPI_Finalized(&fini);
    return fini != 0;
}

char *align_up(void *p) {
    return reinterpret_cast<char *>((reinterpret_cast<uintptr_t>(p) + kAlign - 1) & ~(kAlign - 1));
}

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

// ---------------------------------------------------------------- node communicator and windows

Comm node_comm(MPI_Comm group, int node_color) {
    int rank = 0;
    DSM_CHECK_MPI(MPI_Comm_rank(group, &rank));
    Comm by_color;
    MPI_Comm base = group;
    if (node_color >= 0) {
        by_color = Comm::split(group, node_color, rank);
        base = by_color.get();
    }
    MPI_Comm c = MPI_COMM_NULL;
    DSM_CHECK_MPI(MPI_Comm_split_type(base, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &c));
    Comm node(c);
    DSM_CHECK_MPI(MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN));
    return node;
}

namespace {

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 // Linux 5.14
#endif

// Where the MPI library keeps the files behind shared windows: Open MPI's
// control variable osc_sm_backing_directory (default /dev/shm on Linux),
// read through the MPI tool interface so that --mca, OMPI_MCA_ variables and
// parameter files all count (not an environment variable of libdsm's);
// MPICH and others use POSIX shared memory, which is /dev/shm too.
std::string read_backing_directory() {
    std::string dir = "/dev/shm";
#if MPI_VERSION > 3 || (MPI_VERSION == 3 && MPI_SUBVERSION >= 1)
    int provided = 0;
    if (MPI_T_init_thread(MPI_THREAD_SINGLE, &provided) != MPI_SUCCESS) return dir;
    int index = -1;
    if (MPI_T_cvar_get_index("osc_sm_backing_directory", &index) == MPI_SUCCESS && index >= 0) {
        char name[256];
        char desc[8];
        int name_len = sizeof name, desc_len = sizeof desc, verbosity = 0, bind = 0, scope = 0;
        MPI_Datatype type = MPI_DATATYPE_NULL;
        MPI_T_enum enumtype = MPI_T_ENUM_NULL;
        MPI_T_cvar_handle handle = MPI_T_CVAR_HANDLE_NULL;
        int count = 0;
        if (MPI_T_cvar_get_info(index, name, &name_len, &verbosity, &type, &enumtype, desc, &desc_len, &bind,
                                &scope) == MPI_SUCCESS &&
            type == MPI_CHAR && MPI_T_cvar_handle_alloc(index, nullptr, &handle, &count) == MPI_SUCCESS) {
            std::vector<char> buf(static_cast<size_t>(std::max(count, 0)) + 1, '\0');
            if (count > 0 && MPI_T_cvar_read(handle, buf.data()) == MPI_SUCCESS && buf[0] != '\0')
                dir.assign(buf.data());
            MPI_T_cvar_handle_free(&handle);
        }
    }
    MPI_T_finalize();
#endif
    return dir;
}

const std::string &backing_directory() {
    static const std::string dir = read_backing_directory();
    return dir;
}

size_t page_bytes() {
    const long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? static_cast<size_t>(p) : 4096;
}

// Free and total bytes of the filesystem holding `dir`; false when unknown.
bool space_of(const std::string &dir, size_t *avail, size_t *total) {
    struct statvfs v {};
    if (statvfs(dir.c_str(), &v) != 0) return false;
    *avail = static_cast<size_t>(v.f_bavail) * static_cast<size_t>(v.f_frsize);
    *total = static_cast<size_t>(v.f_blocks) * static_cast<size_t>(v.f_frsize);
    return true;
}

[[noreturn]] void fail_no_room(const std::string &dir, size_t node_bytes, size_t mine, size_t most,
                               const char *what) {
    size_t avail = 0, total = 0;
    const bool known = space_of(dir, &avail, &total);
    DSM_FAIL(DSM_ERR_OUT_OF_MEMORY, "shared memory: ", what, ": the ranks of this node need ", node_bytes,
             " bytes in ", dir, " for a shared window (this rank asks for ", mine, " bytes, the most any asks for is ",
             most, "), and ", dir, " has ",
             known ? std::to_string(avail) : std::string("an unknown number of"), " bytes available",
             known ? " of " + std::to_string(total) : std::string(),
             ": enlarge ", dir, " (docker run --shm-size, or a larger tmpfs)");
}

} // namespace

SharedWindow::SharedWindow(MPI_Comm node, size_t bytes, MPI_Comm group) {
    if (group == MPI_COMM_NULL) group = node;
    int local = 1, me = 0;
    DSM_CHECK_MPI(MPI_Comm_size(node, &local));
    DSM_CHECK_MPI(MPI_Comm_rank(node, &me));
    // The MPI library backs the window with a file of the node's total size
    // (each noncontig segment rounded to pages, plus its own state) that it
    // sizes without reserving: Open MPI's rank 0 fails alone when the
    // filesystem is too small (and the others then wait for it forever), and
    // pages it cannot find later kill the process with SIGBUS on first
    // touch. So the node checks the room first and agrees, then each rank
    // makes its pages exist before anything touches them and all agree again.
    const size_t page = page_bytes();
    const std::string dir = backing_directory();
    DSM_REQUIRE(bytes <= SIZE_MAX / 2, DSM_ERR_OUT_OF_MEMORY, "shared memory: a window of ", bytes,
                " bytes is too large");
    const size_t mine = (bytes + kAlign + page - 1) / page * page;
    unsigned long long node_total = 0, most = 0;
    const unsigned long long want = mine, asked = bytes;
    DSM_CHECK_MPI(MPI_Allreduce(&want, &node_total, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, node));
    DSM_CHECK_MPI(MPI_Allreduce(&asked, &most, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, node));
    agree(group, [&] {
        size_t avail = 0, total = 0;
        const size_t slack = (static_cast<size_t>(local) + 4) * page; // the library's state
        if (space_of(dir, &avail, &total) && node_total + slack > avail)
            fail_no_room(dir, static_cast<size_t>(node_total), bytes, static_cast<size_t>(most), "not enough room");
    });

    // Each segment on its own pages, first touched by its owner (NUMA-local),
    // with room to align its start to 64 bytes.
    MPI_Info info = MPI_INFO_NULL;
    DSM_CHECK_MPI(MPI_Info_create(&info));
    MPI_Info_set(info, "alloc_shared_noncontig", "true");
    void *first = nullptr;
    const int rc = MPI_Win_allocate_shared(static_cast<MPI_Aint>(bytes + kAlign), 1, info, node, &first, &win_);
    MPI_Info_free(&info);
    int ok = rc == MPI_SUCCESS ? 1 : 0, all_ok = 0;
    DSM_CHECK_MPI(MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, node));
    if (all_ok == 0) win_ = MPI_WIN_NULL; // freeing is collective: leave a partial window alone
    agree(group, [&] {
        DSM_CHECK_MPI(rc);
        DSM_REQUIRE(all_ok == 1, DSM_ERR_MPI, "MPI_Win_allocate_shared failed on another rank of this node");
    });
    try {
        agree(group, [&] {
            DSM_CHECK_MPI(MPI_Win_set_errhandler(win_, MPI_ERRORS_RETURN));
            DSM_CHECK_MPI(MPI_Win_lock_all(MPI_MODE_NOCHECK, win_));
            bases_.resize(static_cast<size_t>(local));
            sizes_.resize(static_cast<size_t>(local));
            for (int p = 0; p < local; ++p) {
                MPI_Aint size = 0;
                int unit = 0;
                void *b = nullptr;
                DSM_CHECK_MPI(MPI_Win_shared_query(win_, p, &size, &unit, &b));
                // Mappings are page-aligned, so every process aligns to the same
                // byte. Each rank asked for its own bytes + kAlign (no segment is
                // empty, even for zero bytes), of which the alignment skips fewer
                // than kAlign.
                const size_t got = static_cast<size_t>(size);
                DSM_REQUIRE(b != nullptr && got >= kAlign, DSM_ERR_MPI, "MPI_Win_shared_query gave local rank ",
                            p, " a segment of ", got, " bytes at ", b);
                bases_[static_cast<size_t>(p)] = align_up(b);
                sizes_[static_cast<size_t>(p)] = got - kAlign;
                if (p != me) continue;
                // Allocate this rank's pages now: MADV_POPULATE_WRITE reports
                // a full filesystem as an error where a store would raise
                // SIGBUS. Older kernels (EINVAL) rely on the check above.
                const uintptr_t lo = reinterpret_cast<uintptr_t>(b) / page * page;
                const uintptr_t hi = (reinterpret_cast<uintptr_t>(b) + got + page - 1) / page * page;
                if (madvise(reinterpret_cast<void *>(lo), hi - lo, MADV_POPULATE_WRITE) != 0 && errno != EINVAL &&
                    errno != ENOSYS)
                    fail_no_room(dir, static_cast<size_t>(node_total), bytes, static_cast<size_t>(most),
                                 "the pages could not be allocated");
            }
        });
    } catch (...) {
        reset();
        throw;
    }
    bytes_ = bytes;
}

SharedWindow::SharedWindow(SharedWindow &&o) noexcept
    : win_(std::exchange(o.win_, MPI_WIN_NULL)), bases_(std::move(o.bases_)), sizes_(std::move(o.sizes_)),
      bytes_(std::exchange(o.bytes_, 0)) {}

SharedWindow &SharedWindow::operator=(SharedWindow &&o) noexcept {
    if (this != &o) {
        reset();
        win_ = std::exchange(o.win_, MPI_WIN_NULL);
        bases_ = std::move(o.bases_);
        sizes_ = std::move(o.sizes_);
        bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
}

void SharedWindow::sync() const noexcept {
    if (win_ != MPI_WIN_NULL) MPI_Win_sync(win_);
}

void SharedWindow::reset() noexcept {
    if (win_ != MPI_WIN_NULL && !finalized()) {
        MPI_Win_unlock_all(win_);
        MPI_Win_free(&win_);
    }
    win_ = MPI_WIN_NULL;
    bases_.clear();
    sizes_.clear();
    bytes_ = 0;
}

// ---------------------------------------------------------------- construction

ShmBackend::ShmBackend(MPI_Comm comm, int node_color) : comm_(Comm::dup(comm)) {
    const MPI_Comm g = comm_.get();
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
        control_ = SharedWindow(node_.get(), sizeof(Slot));
    } catch (const Error &e) {
        failure = e.message();
    }
    int ok = failure.empty() ? 1 : 0, all_ok = 0;
    DSM_CHECK_MPI(MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, g));
    DSM_REQUIRE(all_ok == 1, DSM_ERR_NOT_SUPPORTED, "MPI_Win_allocate_shared failed",
                failure.empty() ? std::string(" on another rank") : ": " + failure);
    peers_.resize(static_cast<size_t>(local_size_));
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
    // Make this rank's stores visible before the barrier and see the peers'
    // after it (the MPI-3 shared-memory model: sync, barrier, sync).
    control_.sync();
    scratch_.sync();
    if (direct_) direct_->win.sync();
    for (const auto &a : allocs_) a.second.sync();
    DSM_CHECK_MPI(MPI_Barrier(node_.get()));
    control_.sync();
    scratch_.sync();
    if (direct_) direct_->win.sync();
    for (const auto &a : allocs_) a.second.sync();
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

// ---------------------------------------------------------------- collectives

void ShmBackend::allreduce(const void *send, void *recv, size_t count, dsm_dtype_t dtype, Op op) {
    check_reduce(dtype, op);
    const size_t esize = dtype_size(dtype);
    const size_t bytes = checked_bytes(count, esize, "allreduce count");
    require_buffer(send, bytes, "send");
    require_buffer(recv, bytes, "recv");
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
            const char *part = lane_partial(lane.v, offs, counts, &lc, &ld, dtype, op, esize, direct_ok);
            if (part == nullptr) continue; // every lane member has an empty slice
            mpi_reduce_scatterv(lane.comm.get(), part, w + offs[me] * esize, lc, type, mop, esize);
            mpi_allgatherv_in_place(lane.comm.get(), w, lc, ld, type, esize);
            stats_.bytes_off_node += 2 * (sum(lc) - lc[static_cast<size_t>(node_index_)]) * esize;
        }
    }
    node_sync();
    // Every slice from the rank on this node that serves its lane.
    char *out = static_cast<char *>(recv);
    for (size_t r = 0; r < n; ++r) {
        if (counts[r] == 0) continue;
        const int p = local_of_[r] % local_size_;
        const char *from = peer_ptr(p, peers_[static_cast<size_t>(p)].dst) + offs[r] * esize;
        if (from != out + offs[r] * esize) std::memcpy(out + offs[r] * esize, from, counts[r] * esize);
    }
    node_sync();
}

void ShmBackend::reduce_scatterv(const void *send, void *recv, const std::vector<size_t> &counts,
                                 dsm_dtype_t dtype, Op op) {
    check_reduce(dtype, op);
    const size_t esize = dtype_size(dtype);
    size_t total = 0;
    const std::vector<size_t> offs = block_offsets(counts, size_, esize, "counts", &total);
    const size_t me = static_cast<size_t>(rank_), mine = counts[me];
    require_buffer(send, total * esize, "send");
    require_buffer(recv, mine * esize, "recv");
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
            const char *part = lane_partial(lane.v, offs, counts, &lc, &ld, dtype, op, esize, direct_ok);
            if (part == nullptr) continue;
            mpi_reduce_scatterv(lane.comm.get(), part, recv, lc, type, mop, esize);
            stats_.bytes_off_node += (sum(lc) - lc[static_cast<size_t>(node_index_)]) * esize;
        }
    }
    node_sync(); // the peers are done reading this rank's input
}

void ShmBackend::allgatherv(const void *send, void *recv, const std::vector<size_t> &counts, dsm_dtype_t dtype) {
    const size_t esize = dtype_size(dtype);
    size_t total = 0;
    const std::vector<size_t> offs = block_offsets(counts, size_, esize, "counts", &total);
    const size_t n = static_cast<size_t>(size_), me = static_cast<size_t>(rank_), mine = counts[me];
    require_buffer(send, mine * esize, "send");
    require_buffer(recv, total * esize, "recv");
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
            mpi_allgatherv_in_place(lane.comm.get(), w, lc, ld, type, esize);
            stats_.bytes_off_node += (sum(lc) - lc[static_cast<size_t>(node_index_)]) * esize;
        }
    }
    node_sync();
    for (size_t r = 0; r < n; ++r) {
        if (counts[r] == 0) continue;
        const int p = local_of_[r] % local_size_;
        const char *from = peer_ptr(p, peers_[static_cast<size_t>(p)].dst) + offs[r] * esize;
        if (from != out + offs[r] * esize) std::memcpy(out + offs[r] * esize, from, counts[r] * esize);
    }
    node_sync();
}

// All-to-all and broadcast move each byte once whatever the transport: MPI.
void ShmBackend::alltoallv(const void *send, const std::vector<size_t> &send_counts,
                           const std::vector<size_t> &send_displs, void *recv, const std::vector<size_t> &recv_counts,
                           const std::vector<size_t> &recv_displs, dsm_dtype_t dtype) {
    const size_t esize = dtype_size(dtype);
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
                                 const PackFn &pack, const UnpackFn &unpack) {
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

// ---------------------------------------------------------------- alltoall_direct

void ShmBackend::direct_setup() {
    if (direct_state_ >= 0) return;
    auto d = std::make_unique<Direct>();
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

bool ShmBackend::alltoall_direct(const std::vector<Exposed> &exposed, const PlanFn &plan) {
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
        if (!direct_) direct_ = std::make_unique<Direct>();
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

void ShmBackend::bcast(void *buf, size_t count, dsm_dtype_t dtype, int root) {
    const size_t esize = dtype_size(dtype);
    check_bcast(size_, buf, count, esize, root);
    ++stats_.calls;
    if (rank_ == root && size_ > 1) stats_.bytes_sent += count * esize;
    if (rank_ == root && nodes_ > 1) stats_.bytes_off_node += count * esize;
    mpi_bcast(comm_.get(), buf, count, types_.type(dtype), root, esize);
}

void ShmBackend::barrier() {
    ++stats_.calls;
    DSM_CHECK_MPI(MPI_Barrier(comm_.get()));
}

// ---------------------------------------------------------------- allocations

void *ShmBackend::alloc_shared(size_t bytes) {
    // Agreed over the group: a node without room fails every rank.
    SharedWindow w(node_.get(), bytes, comm_.get());
    char *mine = w.base(local_rank_);
    std::memset(mine, 0, bytes); // zeroed, and first touched by its owner
    allocs_.emplace(next_id_++, std::move(w));
    return mine;
}

void ShmBackend::free_shared(void *ptr) {
    if (ptr == nullptr) return;
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
    if (direct_) direct_->win.abandon();
    for (auto &a : allocs_) a.second.abandon();
    for (Lane &lane : lanes_) (void)lane.comm.release();
    (void)node_.release();
    (void)comm_.release();
}

} // namespace comm
} // namespace dsm
