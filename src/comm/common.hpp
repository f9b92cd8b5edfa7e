// Internal helpers every backend shares: aligned buffers, argument checks,
// MPI datatypes and reduction ops per dtype, MPI collectives that take size_t
// counts, and the pieces of alltoall_packed (common.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <memory>
#include <vector>

#include <mpi.h>

#include "comm/backend.hpp"

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
// The checks of allreduce in the host backends: a reducible (dtype, op)
// (check_reduce()), a count whose bytes fit in size_t, and both buffers set
// when there are bytes; the bytes.
size_t check_allreduce(const void *send, const void *recv, size_t count, dsm_dtype_t dtype, Op op);
// The checks of reduce_scatterv in the host backends: a reducible (dtype,
// op), counts of `size` blocks whose bytes fit (block_offsets()), send
// holding every block and recv this member's block. The block offsets, the
// total in *total, this member's count in *mine.
std::vector<size_t> check_reduce_scatterv(int size, int rank, const void *send, const void *recv,
                                          const std::vector<size_t> &counts, dsm_dtype_t dtype, Op op,
                                          size_t *total, size_t *mine);
// The same for allgatherv (no op): send holds this member's block, recv
// every block.
std::vector<size_t> check_allgatherv(int size, int rank, const void *send, const void *recv,
                                     const std::vector<size_t> &counts, dsm_dtype_t dtype, size_t *total,
                                     size_t *mine);

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

} // namespace comm
} // namespace dsm
