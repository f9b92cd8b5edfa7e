// The "mpi" backend (mpi_backend.hpp): plain MPI collectives on a duplicate
// of the group's communicator, through the helpers of common.hpp.
#include "dsm_config.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <new>

#include "comm/mpi_backend.hpp"
#include "comm/reduce.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "cuda/device.hpp"

namespace dsm {
namespace comm {

// ---------------------------------------------------------------- MpiBackend

// ---------------------------------------------------------------- device memory

DeviceStaging::DeviceStaging() {
    gpus_ = cuda::device_count().count > 0;
    cuda_aware_ = gpus_ && cuda::cuda_aware_mpi();
}

bool DeviceStaging::on_device(const void *a, const void *b) const noexcept {
    return gpus_ && (cuda::is_device_pointer(a) || cuda::is_device_pointer(b));
}

void *DeviceStaging::grow(cuda::PinnedBuffer &b, size_t bytes) {
    if (b.bytes() < bytes || !b.get()) b = cuda::PinnedBuffer(std::max<size_t>(bytes, 1));
    return b.get();
}

void DeviceStaging::copy(void *dst, const void *src, size_t bytes) const {
    if (bytes == 0 || dst == src) return;
    if (on_device(dst, src))
        cuda::copy_bytes(dst, src, bytes);
    else
        std::memmove(dst, src, bytes);
}

// The extent in elements of an alltoallv buffer: the end of its last block.
static size_t extent(const std::vector<size_t> &counts, const std::vector<size_t> &displs) {
    size_t end = 0;
    for (size_t r = 0; r < counts.size() && r < displs.size(); ++r)
        if (counts[r]) end = std::max(end, displs[r] + counts[r]);
    return end;
}

MpiBackend::MpiBackend(MPI_Comm comm) : comm_(Comm::dup(comm)) {
    DSM_CHECK_MPI(MPI_Comm_rank(comm_.get(), &rank_));
    DSM_CHECK_MPI(MPI_Comm_size(comm_.get(), &size_));
}

void MpiBackend::allreduce(const void *send, void *recv, size_t count, dsm_dtype_t dtype, Op op, Queue queue) {
    const watchdog::WaitScope wait("allreduce", &watch_);
    drain(queue);
    const size_t bytes = check_allreduce(send, recv, count, dtype, op);
    const size_t esize = require_dtype_size(dtype);
    if (device_.on_device(send, recv) && (!device_.cuda_aware() || (dtype != DSM_FLOAT32 && dtype != DSM_FLOAT64))) {
        void *hs = device_.send(bytes), *hr = device_.recv(bytes);
        device_.copy(hs, send, bytes);
        allreduce(hs, hr, count, dtype, op);
        device_.copy(recv, hr, bytes);
        return;
    }
    ++stats_.calls;
    count_sent(ring_share(2 * bytes, size_));
    mpi_allreduce(comm_.get(), send, recv, count, types_.type(dtype), types_.op(dtype, op), esize);
}

void MpiBackend::reduce_scatterv(const void *send, void *recv, const std::vector<size_t> &counts,
                                 dsm_dtype_t dtype, Op op, Queue queue) {
    const watchdog::WaitScope wait("reduce_scatterv", &watch_);
    drain(queue);
    size_t total = 0, mine = 0;
    const std::vector<size_t> offs = check_reduce_scatterv(size_, rank_, send, recv, counts, dtype, op, &total, &mine);
    const size_t esize = require_dtype_size(dtype);
    if (device_.on_device(send, recv) && (!device_.cuda_aware() || (dtype != DSM_FLOAT32 && dtype != DSM_FLOAT64))) {
        void *hs = device_.send(total * esize), *hr = device_.recv(mine * esize);
        device_.copy(hs, send, total * esize);
        reduce_scatterv(hs, hr, counts, dtype, op);
        device_.copy(recv, hr, mine * esize);
        return;
    }
    ++stats_.calls;
    count_sent((total - mine) * esize);
    const MPI_Datatype type = types_.type(dtype);
    const MPI_Op mop = types_.op(dtype, op);
    const char *own = static_cast<const char *>(send) + offs[static_cast<size_t>(rank_)] * esize;
    if (recv == own && mine > 0 && size_ > 1) {
        // In place: MPI forbids overlapping buffers (and MPI_IN_PLACE would
        // put the result at the start of send), so go through a temporary.
        void *tmp = tmp_.get(mine * esize);
        mpi_reduce_scatterv(comm_.get(), send, tmp, counts, type, mop, esize);
        device_.copy(recv, tmp, mine * esize);
        return;
    }
    if (size_ == 1) {
        if (mine && recv != own) device_.copy(recv, own, mine * esize);
        return;
    }
    mpi_reduce_scatterv(comm_.get(), send, recv, counts, type, mop, esize);
}

void MpiBackend::allgatherv(const void *send, void *recv, const std::vector<size_t> &counts, dsm_dtype_t dtype,
                            Queue queue) {
    const watchdog::WaitScope wait("allgatherv", &watch_);
    drain(queue);
    size_t total = 0, mine = 0;
    const std::vector<size_t> offs = check_allgatherv(size_, rank_, send, recv, counts, dtype, &total, &mine);
    const size_t esize = require_dtype_size(dtype);
    if (device_.on_device(send, recv) && !device_.cuda_aware()) {
        void *hs = device_.send(mine * esize), *hr = device_.recv(total * esize);
        device_.copy(hs, send, mine * esize);
        allgatherv(hs, hr, counts, dtype);
        device_.copy(recv, hr, total * esize);
        return;
    }
    ++stats_.calls;
    count_sent((total - mine) * esize);
    char *own = static_cast<char *>(recv) + offs[static_cast<size_t>(rank_)] * esize;
    if (mine && own != send) device_.copy(own, send, mine * esize);
    if (size_ == 1) return;
    mpi_allgatherv_in_place(comm_.get(), recv, counts, offs, types_.type(dtype), esize);
}

void MpiBackend::alltoallv(const void *send, const std::vector<size_t> &send_counts,
                           const std::vector<size_t> &send_displs, void *recv, const std::vector<size_t> &recv_counts,
                           const std::vector<size_t> &recv_displs, dsm_dtype_t dtype, Queue queue) {
    const watchdog::WaitScope wait("alltoallv", &watch_);
    drain(queue);
    const size_t esize = require_dtype_size(dtype);
    check_alltoallv(size_, send, send_counts, send_displs, recv, recv_counts, recv_displs, esize);
    if (device_.on_device(send, recv) && !device_.cuda_aware()) {
        const size_t sb = extent(send_counts, send_displs) * esize, rb = extent(recv_counts, recv_displs) * esize;
        void *hs = device_.send(sb), *hr = device_.recv(rb);
        device_.copy(hs, send, sb);
        alltoallv(hs, send_counts, send_displs, hr, recv_counts, recv_displs, dtype);
        device_.copy(recv, hr, rb);
        return;
    }
    ++stats_.calls;
    for (int r = 0; r < size_; ++r)
        if (r != rank_) count_sent(send_counts[static_cast<size_t>(r)] * esize);
    mpi_alltoallv(comm_.get(), send, send_counts, send_displs, recv, recv_counts, recv_displs, types_.type(dtype),
                  esize);
}

void MpiBackend::bcast(void *buf, size_t count, dsm_dtype_t dtype, int root, Queue queue) {
    const watchdog::WaitScope wait("bcast", &watch_);
    drain(queue);
    const size_t esize = require_dtype_size(dtype);
    check_bcast(size_, buf, count, esize, root);
    if (device_.on_device(buf) && !device_.cuda_aware()) {
        void *h = device_.send(count * esize);
        if (rank_ == root) device_.copy(h, buf, count * esize);
        bcast(h, count, dtype, root);
        device_.copy(buf, h, count * esize);
        return;
    }
    ++stats_.calls;
    if (rank_ == root && size_ > 1) count_sent(count * esize);
    mpi_bcast(comm_.get(), buf, count, types_.type(dtype), root, esize);
}

void MpiBackend::barrier(Queue queue) { barrier_mpi(queue); }

void *MpiBackend::alloc_shared(size_t bytes) {
    AlignedPtr p = aligned_bytes(bytes, true);
    void *raw = p.get();
    allocs_.emplace(raw, std::move(p));
    return raw;
}

void MpiBackend::free_shared(void *ptr) {
    if (ptr == nullptr) return;
    auto it = allocs_.find(ptr);
    DSM_REQUIRE(it != allocs_.end(), DSM_ERR_INVALID_ARGUMENT, "pointer ", ptr,
                " was not returned by alloc_shared of this backend");
    allocs_.erase(it);
}

// Private memory and a duplicated communicator: only the communicator is
// released collectively.
void MpiBackend::abandon() noexcept { (void)comm_.release(); }

bool MpiBackend::alltoall_pieces(const std::vector<Exposed> &exposed, const PlanFn &send_plan,
                                 const PlanFn &recv_plan, Queue queue) {
    const watchdog::WaitScope wait("alltoall_pieces", &watch_);
    drain(queue);
    if (size_ == 1) return false; // the caller's packed path copies once
    return alltoall_pieces_mpi(exposed, send_plan, recv_plan, [](int) { return true; });
}

} // namespace comm
} // namespace dsm
