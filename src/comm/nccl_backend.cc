// The "nccl" backend: NCCL collectives on device memory. The contract is in
// nccl_backend.hpp (NcclBackend); here, how each collective maps onto NCCL and
// how a call waits without waiting for ever. Built when configure found CUDA
// and NCCL (DSM_HAVE_NCCL_BACKEND); otherwise create_backend(Kind::NCCL)
// fails with DSM_ERR_NOT_SUPPORTED and this file is empty.
#include "dsm_config.h"

#include "comm/nccl_backend.hpp"
#include "comm/common.hpp"
#include "comm/shm_backend.hpp" // node_comm()

#if DSM_HAVE_NCCL_BACKEND

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime.h>
#include <nccl.h>

#include "comm/reduce.hpp"
#include "core/agree.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/watchdog.hpp"
#include "cuda/device.hpp"

namespace dsm {
namespace comm {

namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t nccl_type(dsm_dtype_t dtype) {
    switch (dtype) {
    case DSM_FLOAT32: return ncclFloat32;
    case DSM_FLOAT64: return ncclFloat64;
    case DSM_FLOAT16: return ncclFloat16;
    case DSM_BFLOAT16: return ncclBfloat16;
    case DSM_INT8: return ncclInt8;
    case DSM_UINT8: return ncclUint8;
    case DSM_INT32: return ncclInt32;
    case DSM_INT64: return ncclInt64;
    }
    DSM_FAIL(DSM_ERR_INVALID_ARGUMENT, "dtype ", static_cast<int>(dtype), " is not a dsm_dtype_t");
}

ncclRedOp_t nccl_op(Op op) {
    switch (op) {
    case Op::SUM: return ncclSum;
    case Op::MAX: return ncclMax;
    case Op::MIN: return ncclMin;
    }
    DSM_FAIL(DSM_ERR_INVALID_ARGUMENT, "reduction op ", static_cast<int>(op), " is not SUM, MAX or MIN");
}

// A call on a non-blocking communicator went well: done, or still being processed.
bool issued_ok(ncclResult_t r) { return r == ncclSuccess || r == ncclInProgress; }

// NCCL's text for `r` and its last error message.
std::string nccl_text(ncclResult_t r, ncclComm_t comm) {
    const char *last = ncclGetLastError(comm);
    return cat(ncclGetErrorString(r), last != nullptr && *last != '\0' ? cat(" (", last, ")") : std::string());
}

bool all_equal(const std::vector<size_t> &v) {
    return std::all_of(v.begin(), v.end(), [&](size_t c) { return c == v[0]; });
}

size_t sum(const std::vector<size_t> &v) {
    size_t s = 0;
    for (size_t c : v) s += c;
    return s;
}

char *at(const void *base, size_t elems, size_t esize) {
    return static_cast<char *>(const_cast<void *>(base)) + elems * esize;
}

// DSM_ERR_NULL_POINTER as require_buffer(), and DSM_ERR_INVALID_ARGUMENT when
// `p` is not device memory.
void require_device(const void *p, size_t bytes, const char *what) {
    require_buffer(p, bytes, what);
    DSM_REQUIRE(bytes == 0 || cuda::is_device_pointer(p), DSM_ERR_INVALID_ARGUMENT, what, " (", p,
                ") is not CUDA device memory: the nccl backend moves device or managed memory only");
}

// One ncclGroupStart()/ncclGroupEnd(). call() keeps the result of each NCCL
// call until one fails; end() closes the group and returns the first failure,
// else ncclGroupEnd's result. The destructor closes a group left open.
class Group {
public:
    Group() : result_(ncclGroupStart()), open_(result_ == ncclSuccess) {}
    ~Group() {
        if (open_) (void)ncclGroupEnd();
    }
    Group(const Group &) = delete;
    Group &operator=(const Group &) = delete;

    bool ok() const { return issued_ok(result_); }
    void call(ncclResult_t r) {
        if (ok()) result_ = r;
    }
    ncclResult_t end() {
        if (open_) {
            open_ = false;
            const ncclResult_t e = ncclGroupEnd();
            if (ok()) result_ = e;
        }
        return result_;
    }

private:
    ncclResult_t result_;
    bool open_;
};

} // namespace

// ---------------------------------------------------------------- the NCCL state

struct NcclBackend::Impl {
    ncclComm_t nccl = nullptr;
    cuda::Stream stream;
    cuda::DeviceBuffer one;                   // barrier's element (zero, and zero it stays)
    cuda::DeviceBuffer pack_send, pack_recv;  // alltoall_packed's staging, grown on demand
    std::map<void *, cuda::DeviceBuffer> allocs;
    int timeout_s = 0;
    std::string broken; // why the communicator is gone; empty while usable

    Impl() = default;
    ~Impl();

    ncclComm_t split_sink = nullptr; // where a split writes when this member joins no group
    const watchdog::Group *group = nullptr; // the backend's, for the watchdog's message

    void init(const ncclUniqueId &id, int size, int rank);
    // Poll this (the parent) communicator until a non-blocking split has
    // written the child through `out`; fails as wait() does.
    void wait_for_split(ncclComm_t *out);
    void require_usable() const {
        DSM_REQUIRE(nccl != nullptr, DSM_ERR_STATE, "the nccl backend is unusable: ", broken);
    }
    // Wait until NCCL has processed the calls of one operation (`issued`: the
    // result of the last) and, when `stream_too`, until the stream has run
    // them. Fails (aborting the communicator) on an NCCL or CUDA error; after
    // DSM_COMM_TIMEOUT aborts the communicator and ends the job (watchdog).
    void wait(ncclResult_t issued, const char *what, bool stream_too, cudaStream_t s);
    // The stream of `q`: the backend's own for the host queue.
    cudaStream_t on(Queue q) const noexcept {
        return q.is_host() ? stream.get() : static_cast<cudaStream_t>(q.handle());
    }
    // The end of a collective on `q`: on the host queue, once its stream has
    // run the operations; on a device queue, once NCCL has enqueued them.
    void finish(ncclResult_t issued, const char *what, Queue q) {
        wait(issued, what, q.is_host(), q.is_host() ? stream.get() : nullptr);
    }
    // A CUDA call of an operation: an error fails like NCCL's.
    void check_cuda(cudaError_t e, const char *what) {
        if (e != cudaSuccess) fail_cuda(e, what);
    }
    // `b`, grown to at least `bytes`; its contents are not kept.
    char *staging(cuda::DeviceBuffer &b, size_t bytes);
    // ncclCommAbort: local, and no member waits on this one afterwards.
    void abort() noexcept;

    [[noreturn]] void fail(dsm_status_t status, const std::string &why);
    [[noreturn]] void fail_nccl(ncclResult_t r, const char *what) {
        fail(DSM_ERR_NCCL, cat(what, " failed: ", nccl_text(r, nccl)));
    }
    [[noreturn]] void fail_cuda(cudaError_t e, const char *what) {
        (void)cudaGetLastError();
        fail(DSM_ERR_CUDA, cat(what, ": CUDA error ", cudaGetErrorString(e), " (", cudaGetErrorName(e), ")"));
    }
};

void NcclBackend::Impl::init(const ncclUniqueId &id, int size, int rank) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    // Non-blocking: every NCCL call returns at once (possibly ncclInProgress)
    // and wait() polls, so a member that never arrives costs a timeout, not a hang.
    config.blocking = 0;
    ncclComm_t c = nullptr;
    const ncclResult_t r = ncclCommInitRankConfig(&c, size, id, rank, &config);
    nccl = c;
    wait(r, "ncclCommInitRankConfig", false, nullptr);
}

void NcclBackend::Impl::wait(ncclResult_t issued, const char *what, bool stream_too, cudaStream_t s) {
    if (!issued_ok(issued)) fail_nccl(issued, what);
    // Timed here (the watchdog only steps in should this loop not end).
    const watchdog::WaitScope scope(what, group, true);
    const Clock::time_point start = Clock::now();
    for (;;) {
        // The communicator's state: ncclInProgress while the calls are being
        // processed, ncclSuccess once enqueued, an error when something failed
        // here or on a peer (ncclRemoteError).
        ncclResult_t state = ncclSuccess;
        const ncclResult_t q = ncclCommGetAsyncError(nccl, &state);
        if (q != ncclSuccess) fail_nccl(q, "ncclCommGetAsyncError");
        if (!issued_ok(state)) fail_nccl(state, what);
        if (state == ncclSuccess) {
            // Enqueued on the stream: a call on a device queue returns here,
            // and synchronize() waits for the stream with this loop's checks.
            if (!stream_too) return;
            const cudaError_t e = cudaStreamQuery(s);
            if (e == cudaSuccess) return;
            if (e != cudaErrorNotReady) fail_cuda(e, what);
        }
        if (timeout_s > 0 && Clock::now() - start >= std::chrono::seconds(timeout_s)) {
            abort();
            watchdog::expire(cat(what, " did not complete within DSM_COMM_TIMEOUT=", timeout_s,
                                 " seconds (a member did not make the same call, stalled or failed); the NCCL "
                                 "communicator is aborted"));
        }
        std::this_thread::yield();
    }
}

void NcclBackend::Impl::wait_for_split(ncclComm_t *out) {
    const watchdog::WaitScope scope("ncclCommSplit", group, true);
    const Clock::time_point start = Clock::now();
    while (__atomic_load_n(out, __ATOMIC_ACQUIRE) == nullptr) {
        ncclResult_t state = ncclSuccess;
        const ncclResult_t q = ncclCommGetAsyncError(nccl, &state);
        if (q != ncclSuccess) fail_nccl(q, "ncclCommGetAsyncError");
        if (!issued_ok(state)) fail_nccl(state, "ncclCommSplit");
        if (timeout_s > 0 && Clock::now() - start >= std::chrono::seconds(timeout_s)) {
            abort();
            watchdog::expire(cat("ncclCommSplit did not complete within DSM_COMM_TIMEOUT=", timeout_s,
                                 " seconds (a member did not make the same call, stalled or failed); the NCCL "
                                 "communicator is aborted"));
        }
        std::this_thread::yield();
    }
}

char *NcclBackend::Impl::staging(cuda::DeviceBuffer &b, size_t bytes) {
    if (b.get() == nullptr || b.bytes() < bytes) {
        b.reset();
        b = cuda::DeviceBuffer(bytes);
    }
    return static_cast<char *>(b.get());
}

void NcclBackend::Impl::abort() noexcept {
    // Non-blocking, ncclCommAbort may return ncclInProgress and finish
    // freeing in the background; the handle must not be used either way.
    if (nccl != nullptr) (void)ncclCommAbort(nccl);
    nccl = nullptr;
}

void NcclBackend::Impl::fail(dsm_status_t status, const std::string &why) {
    abort();
    broken = why;
    DSM_FAIL(status, why, "; the NCCL communicator is aborted");
}

NcclBackend::Impl::~Impl() {
    if (nccl == nullptr) return;
    // ncclCommFinalize waits for the peers' finalize (the destructor is
    // collective); then ncclCommDestroy frees locally. After an error or the
    // timeout, abort instead.
    ncclResult_t r = ncclCommFinalize(nccl);
    const Clock::time_point start = Clock::now();
    while (r == ncclInProgress || r == ncclSuccess) {
        ncclResult_t state = ncclSuccess;
        if (ncclCommGetAsyncError(nccl, &state) != ncclSuccess) state = ncclInternalError;
        if (state != ncclInProgress) {
            r = state;
            break;
        }
        if (timeout_s > 0 && Clock::now() - start >= std::chrono::seconds(timeout_s)) break; // r: in progress
        std::this_thread::yield();
    }
    if (r == ncclSuccess) {
        (void)ncclCommDestroy(nccl);
    } else {
        DSM_WARN(COMM, "nccl backend: ncclCommFinalize %s: aborting the communicator",
                 r == ncclInProgress ? "timed out" : ncclGetErrorString(r));
        (void)ncclCommAbort(nccl);
    }
    nccl = nullptr;
}

// ---------------------------------------------------------------- the backend

NcclBackend::NcclBackend(MPI_Comm comm)
    : comm_(Comm::dup(comm)), impl_(std::make_unique<Impl>()) {
    impl_->group = &watch_;
    DSM_CHECK_MPI(MPI_Comm_rank(comm_.get(), &rank_));
    DSM_CHECK_MPI(MPI_Comm_size(comm_.get(), &size_));
    // This member's index among the group's ranks on its host: its device
    // when the process has not chosen one (collective, so done by all first).
    int local_rank = 0;
    {
        const Comm node = node_comm(comm_.get(), -1); // the physical host, where the GPUs are
        DSM_CHECK_MPI(MPI_Comm_rank(node.get(), &local_rank));
    }
    // What can fail on one member alone, agreed before NCCL starts: then
    // every member throws and none waits in ncclCommInitRankConfig.
    ncclUniqueId id;
    std::memset(&id, 0, sizeof id);
    agree(comm_.get(), [&] {
        impl_->timeout_s = nccl_timeout_param();
        const cuda::DeviceCount dc = cuda::device_count();
        DSM_REQUIRE(dc.count > 0, DSM_ERR_NOT_SUPPORTED, "the nccl backend needs a CUDA device: ", dc.reason);
        cuda::DeviceHint hint;
        hint.local_rank = local_rank;
        device_ = cuda::use_device(hint);
        impl_->stream = cuda::Stream::create();
        impl_->one = cuda::DeviceBuffer(sizeof(float), true);
        if (rank_ == 0) {
            const ncclResult_t r = ncclGetUniqueId(&id);
            DSM_REQUIRE(r == ncclSuccess, DSM_ERR_NCCL, "ncclGetUniqueId failed: ", nccl_text(r, nullptr));
        }
    });
    // Two members on one GPU: a clear error here rather than NCCL's.
    require_devices_of_their_own(comm_.get(), device_);
    DSM_CHECK_MPI(MPI_Bcast(&id, static_cast<int>(sizeof id), MPI_BYTE, 0, comm_.get()));
    // NCCL's setup, agreed too: when it failed or timed out on some member,
    // every member aborts its communicator and throws.
    try {
        agree(comm_.get(), [&] { impl_->init(id, size_, rank_); });
    } catch (...) {
        impl_->abort();
        throw;
    }
    DSM_INFO(COMM, "nccl backend: member %d of %d on CUDA device %d", rank_, size_, device_);
}

NcclBackend::NcclBackend(SplitTag, Comm comm, int device)
    : comm_(std::move(comm)), device_(device), impl_(std::make_unique<Impl>()) {
    impl_->group = &watch_;
    DSM_CHECK_MPI(MPI_Comm_rank(comm_.get(), &rank_));
    DSM_CHECK_MPI(MPI_Comm_size(comm_.get(), &size_));
}

NcclBackend::~NcclBackend() = default;

std::unique_ptr<NcclBackend> NcclBackend::split(int color, int key) {
    MPI_Comm c = MPI_COMM_NULL;
    DSM_CHECK_MPI(MPI_Comm_split(comm_.get(), color < 0 ? MPI_UNDEFINED : color, key, &c));
    Comm sub(c);
    if (c != MPI_COMM_NULL) DSM_CHECK_MPI(MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN));
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
    // One split of this communicator for every group: NCCL reuses its
    // resources and needs no unique id per group. What can fail on one
    // member is agreed first, then NCCL's split, as in the constructor.
    const cuda::DeviceGuard on(device_);
    std::unique_ptr<NcclBackend> child;
    agree(comm_.get(), [&] {
        impl_->require_usable();
        if (sub.get() == MPI_COMM_NULL) return;
        child = std::make_unique<NcclBackend>(SplitTag{}, std::move(sub), device_);
        child->impl_->timeout_s = impl_->timeout_s;
        child->impl_->stream = cuda::Stream::create();
        child->impl_->one = cuda::DeviceBuffer(sizeof(float), true);
    });
    try {
        agree(comm_.get(), [&] {
            ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
            config.blocking = 0; // as the parent: wait() polls
            // Non-blocking, the split runs as a job of the parent and NCCL
            // writes the new communicator through `out` when it completes
            // (NULL until then, and for a member of no group): `out` must
            // outlive the call, and is read atomically.
            ncclComm_t *out = child ? &child->impl_->nccl : &impl_->split_sink;
            *out = nullptr;
            const ncclResult_t r = ncclCommSplit(impl_->nccl, child ? color : NCCL_SPLIT_NOCOLOR, key, out, &config);
            impl_->wait(r, "ncclCommSplit", false, nullptr); // polling the parent completes the job
            if (!child) return;
            impl_->wait_for_split(out);
            child->impl_->wait(ncclSuccess, "ncclCommSplit", false, nullptr);
        });
    } catch (...) {
        if (child) child->impl_->abort();
        throw;
    }
    if (child) DSM_INFO(COMM, "nccl backend: split member %d of %d (color %d) on CUDA device %d", child->rank_,
                        child->size_, color, device_);
    return child;
#else
    // NCCL before 2.18 has no ncclCommSplit: each group builds its own
    // communicator (collective over the group only).
    agree(comm_.get(), [&] { impl_->require_usable(); });
    if (sub.get() == MPI_COMM_NULL) return nullptr;
    return std::make_unique<NcclBackend>(sub.get());
#endif
}

CUstream_st *NcclBackend::stream() const noexcept { return impl_->stream.get(); }

void NcclBackend::synchronize(Queue queue) {
    if (queue.is_host()) return; // every call on the host queue completed before returning
    impl_->require_usable();
    const cuda::DeviceGuard on(device_);
    impl_->wait(ncclSuccess, "synchronize", true, impl_->on(queue));
}

void NcclBackend::allreduce(const void *send, void *recv, size_t count, dsm_dtype_t dtype, Op op, Queue queue) {
    check_reduce(dtype, op);
    const size_t bytes = checked_bytes(count, require_dtype_size(dtype), "allreduce count");
    impl_->require_usable();
    require_device(send, bytes, "send");
    require_device(recv, bytes, "recv");
    ++stats_.calls;
    count_sent(ring_share(2 * bytes, size_));
    if (count == 0) return;
    const cuda::DeviceGuard on(device_);
    impl_->finish(ncclAllReduce(send, recv, count, nccl_type(dtype), nccl_op(op), impl_->nccl, impl_->on(queue)),
                  "ncclAllReduce", queue);
}

void NcclBackend::reduce_scatterv(const void *send, void *recv, const std::vector<size_t> &counts,
                                  dsm_dtype_t dtype, Op op, Queue queue) {
    check_reduce(dtype, op);
    const size_t esize = require_dtype_size(dtype);
    size_t total = 0;
    const std::vector<size_t> offs = block_offsets(counts, size_, esize, "counts", &total);
    const size_t mine = counts[static_cast<size_t>(rank_)];
    impl_->require_usable();
    require_device(send, total * esize, "send");
    require_device(recv, mine * esize, "recv");
    ++stats_.calls;
    count_sent((total - mine) * esize);
    if (total == 0) return;
    const cuda::DeviceGuard on(device_);
    const ncclDataType_t type = nccl_type(dtype);
    const ncclRedOp_t rop = nccl_op(op);
    if (all_equal(counts)) {
        // In place when recv is this member's block of send, as NCCL defines it.
        impl_->finish(ncclReduceScatter(send, recv, counts[0], type, rop, impl_->nccl, impl_->on(queue)),
                      "ncclReduceScatter", queue);
        return;
    }
    // Uneven blocks: one reduction per member, rooted at the block's owner
    // (recv is written on the root only; in place there when it is the block).
    Group g;
    for (size_t j = 0; j < counts.size() && g.ok(); ++j)
        if (counts[j] > 0)
            g.call(ncclReduce(at(send, offs[j], esize), recv, counts[j], type, rop, static_cast<int>(j), impl_->nccl,
                              impl_->on(queue)));
    impl_->finish(g.end(), "ncclReduce", queue);
}

void NcclBackend::allgatherv(const void *send, void *recv, const std::vector<size_t> &counts, dsm_dtype_t dtype,
                             Queue queue) {
    const size_t esize = require_dtype_size(dtype);
    size_t total = 0;
    const std::vector<size_t> offs = block_offsets(counts, size_, esize, "counts", &total);
    const size_t mine = counts[static_cast<size_t>(rank_)];
    impl_->require_usable();
    require_device(send, mine * esize, "send");
    require_device(recv, total * esize, "recv");
    ++stats_.calls;
    count_sent((total - mine) * esize);
    if (total == 0) return;
    const cuda::DeviceGuard on(device_);
    const ncclDataType_t type = nccl_type(dtype);
    if (all_equal(counts)) {
        impl_->finish(ncclAllGather(send, recv, counts[0], type, impl_->nccl, impl_->on(queue)), "ncclAllGather",
                      queue);
        return;
    }
    // Uneven blocks: each member broadcasts its block to its place in recv
    // (from send on the member itself; in place when send is that place).
    Group g;
    for (size_t j = 0; j < counts.size() && g.ok(); ++j) {
        if (counts[j] == 0) continue;
        char *dst = at(recv, offs[j], esize);
        const void *src = static_cast<int>(j) == rank_ ? send : dst;
        g.call(ncclBroadcast(src, dst, counts[j], type, static_cast<int>(j), impl_->nccl, impl_->on(queue)));
    }
    impl_->finish(g.end(), "ncclBroadcast", queue);
}

void NcclBackend::alltoallv(const void *send, const std::vector<size_t> &send_counts,
                            const std::vector<size_t> &send_displs, void *recv,
                            const std::vector<size_t> &recv_counts, const std::vector<size_t> &recv_displs,
                            dsm_dtype_t dtype, Queue queue) {
    const size_t esize = require_dtype_size(dtype);
    check_alltoallv(size_, send, send_counts, send_displs, recv, recv_counts, recv_displs, esize);
    const size_t me = static_cast<size_t>(rank_);
    DSM_REQUIRE(send_counts[me] == recv_counts[me], DSM_ERR_INVALID_ARGUMENT, "alltoallv sends ", send_counts[me],
                " elements to this member itself but expects ", recv_counts[me]);
    impl_->require_usable();
    require_device(send, sum(send_counts) * esize, "send");
    require_device(recv, sum(recv_counts) * esize, "recv");
    ++stats_.calls;
    for (size_t r = 0; r < send_counts.size(); ++r)
        if (r != me) count_sent(send_counts[r] * esize);
    const cuda::DeviceGuard on(device_);
    const ncclDataType_t type = nccl_type(dtype);
    // This member's own block is a copy on the stream; the others travel as
    // matched sends and receives in one group (zero-element blocks are not
    // posted on either side: send_counts[q] here equals recv_counts[me] on q).
    if (send_counts[me] > 0)
        impl_->check_cuda(cudaMemcpyAsync(at(recv, recv_displs[me], esize), at(send, send_displs[me], esize),
                                          send_counts[me] * esize, cudaMemcpyDeviceToDevice, impl_->on(queue)),
                          "cudaMemcpyAsync");
    Group g;
    for (size_t q = 0; q < send_counts.size() && g.ok(); ++q) {
        if (q == me) continue;
        const int peer = static_cast<int>(q);
        if (recv_counts[q] > 0)
            g.call(ncclRecv(at(recv, recv_displs[q], esize), recv_counts[q], type, peer, impl_->nccl,
                            impl_->on(queue)));
        if (send_counts[q] > 0 && g.ok())
            g.call(ncclSend(at(send, send_displs[q], esize), send_counts[q], type, peer, impl_->nccl,
                            impl_->on(queue)));
    }
    impl_->finish(g.end(), "ncclSend/ncclRecv", queue);
}

void NcclBackend::alltoall_packed(const std::vector<size_t> &send_bytes, const std::vector<size_t> &recv_bytes,
                                  const PackFn &pack, const UnpackFn &unpack, Queue queue) {
    check_packed(size_, rank_, send_bytes, recv_bytes, pack, unpack);
    impl_->require_usable();
    ++stats_.calls;
    const size_t n = static_cast<size_t>(size_), me = static_cast<size_t>(rank_);
    for (size_t r = 0; r < n; ++r)
        if (r != me) count_sent(send_bytes[r]);
    // Every block at a 64-byte boundary of one device buffer per direction;
    // this member's own block is unpacked from the send buffer.
    std::vector<size_t> recv_counts = recv_bytes;
    recv_counts[me] = 0;
    size_t send_end = 0, recv_end = 0;
    const std::vector<size_t> send_displs = packed_layout(send_bytes, 0, "send_bytes", &send_end);
    const std::vector<size_t> recv_displs = packed_layout(recv_counts, 0, "recv_bytes", &recv_end);
    const cuda::DeviceGuard on(device_);

    // Staging and packing may fail on one member: the members agree (over
    // MPI) before any data moves, as in the default alltoall_packed.
    char *sbuf = nullptr, *rbuf = nullptr;
    Deferred failed;
    failed.run([&] {
        sbuf = impl_->staging(impl_->pack_send, send_end);
        rbuf = impl_->staging(impl_->pack_recv, recv_end);
        for (size_t k = 0; k < n; ++k) {
            const size_t q = (me + k) % n;
            if (send_bytes[q]) pack(static_cast<int>(q), sbuf + send_displs[q]);
        }
    });
    if (n > 1) {
        Agreement a(comm_.get());
        a.run(failed.status());
        if (a.failed()) packed_failure(failed, a.failed_rank(), a.failed_status());
    }
    failed.rethrow_if_failed();

    // The sends and receives go on the stream after whatever pack enqueued there.
    Group g;
    for (size_t q = 0; q < n && g.ok(); ++q) {
        if (q == me) continue;
        const int peer = static_cast<int>(q);
        if (recv_counts[q] > 0)
            g.call(ncclRecv(rbuf + recv_displs[q], recv_counts[q], ncclUint8, peer, impl_->nccl, impl_->on(queue)));
        if (send_bytes[q] > 0 && g.ok())
            g.call(ncclSend(sbuf + send_displs[q], send_bytes[q], ncclUint8, peer, impl_->nccl, impl_->on(queue)));
    }
    impl_->finish(g.end(), "ncclSend/ncclRecv (alltoall_packed)", queue);

    // Unpack; an exception from unpack is rethrown once the stream has run
    // what the earlier unpacks enqueued.
    Deferred unpacked;
    unpacked.run([&] {
        if (recv_bytes[me]) unpack(rank_, sbuf + send_displs[me]);
        for (size_t k = 1; k < n; ++k) {
            const size_t q = (me + n - k) % n;
            if (recv_bytes[q]) unpack(static_cast<int>(q), rbuf + recv_displs[q]);
        }
    });
    // On every queue: the staging buffers are reused by the next call.
    impl_->wait(ncclSuccess, "alltoall_packed (unpack)", true, impl_->on(queue));
    unpacked.rethrow_if_failed();
}

void NcclBackend::bcast(void *buf, size_t count, dsm_dtype_t dtype, int root, Queue queue) {
    const size_t esize = require_dtype_size(dtype);
    check_bcast(size_, buf, count, esize, root);
    impl_->require_usable();
    require_device(buf, count * esize, "buf");
    ++stats_.calls;
    if (rank_ == root && size_ > 1) count_sent(count * esize);
    if (count == 0) return;
    const cuda::DeviceGuard on(device_);
    impl_->finish(ncclBroadcast(buf, buf, count, nccl_type(dtype), root, impl_->nccl, impl_->on(queue)),
                  "ncclBroadcast", queue);
}

void NcclBackend::barrier(Queue queue) {
    impl_->require_usable();
    ++stats_.calls;
    const cuda::DeviceGuard on(device_);
    void *one = impl_->one.get();
    impl_->finish(ncclAllReduce(one, one, 1, ncclFloat32, ncclSum, impl_->nccl, impl_->on(queue)),
                  "ncclAllReduce (barrier)", queue);
}

void *NcclBackend::alloc_shared(size_t bytes) {
    const cuda::DeviceGuard on(device_);
    cuda::DeviceBuffer b(bytes, true);
    void *p = b.get();
    impl_->allocs.emplace(p, std::move(b));
    return p;
}

void NcclBackend::free_shared(void *ptr) {
    if (ptr == nullptr) return;
    auto it = impl_->allocs.find(ptr);
    DSM_REQUIRE(it != impl_->allocs.end(), DSM_ERR_INVALID_ARGUMENT, "pointer ", ptr,
                " was not returned by alloc_shared of this backend");
    impl_->allocs.erase(it);
}

// ncclCommAbort is local; the duplicated MPI communicator is let go of
// without MPI_Comm_free (collective). Device memory is freed locally later.
void NcclBackend::abandon() noexcept {
    if (impl_->nccl != nullptr) {
        impl_->abort();
        impl_->broken = "it was abandoned";
    }
    (void)comm_.release();
}

} // namespace comm
} // namespace dsm

#endif // DSM_HAVE_NCCL_BACKEND
