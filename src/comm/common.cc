// The helpers every backend shares (common.hpp): buffers and checks,
// datatypes and ops per dtype, and MPI collectives with size_t counts.
#include "dsm_config.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <new>

#include "comm/common.hpp"
#include "comm/reduce.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"

namespace dsm {
namespace comm {

// ---------------------------------------------------------------- buffers and checks

AlignedPtr aligned_bytes(size_t bytes, bool zero) {
    void *p = nullptr;
    const size_t n = std::max<size_t>(bytes, 1);
    DSM_REQUIRE(posix_memalign(&p, 64, n) == 0 && p != nullptr, DSM_ERR_OUT_OF_MEMORY, "cannot allocate ", bytes,
                " bytes");
    if (zero) std::memset(p, 0, n);
    return AlignedPtr(p);
}

void *ScratchBuffer::get(size_t bytes) {
    if (bytes > bytes_ || !ptr_) {
        ptr_.reset();
        bytes_ = 0;
        ptr_ = aligned_bytes(bytes, false);
        bytes_ = bytes;
    }
    return ptr_.get();
}

size_t checked_bytes(size_t count, size_t esize, const char *what) {
    DSM_REQUIRE(esize == 0 || count <= SIZE_MAX / esize, DSM_ERR_INVALID_ARGUMENT, what, " of ", count,
                " elements of ", esize, " bytes overflows size_t");
    return count * esize;
}

std::vector<size_t> block_offsets(const std::vector<size_t> &counts, int group_size, size_t esize,
                                  const char *what, size_t *total) {
    DSM_REQUIRE(counts.size() == static_cast<size_t>(group_size), DSM_ERR_INVALID_ARGUMENT, what, " has ",
                counts.size(), " entries, expected ", group_size, " (the group size)");
    std::vector<size_t> offs(counts.size());
    size_t sum = 0;
    for (size_t r = 0; r < counts.size(); ++r) {
        offs[r] = sum;
        DSM_REQUIRE(counts[r] <= SIZE_MAX - sum, DSM_ERR_INVALID_ARGUMENT, "the sum of ", what,
                    " overflows size_t at entry ", r, " (", counts[r], ")");
        sum += counts[r];
    }
    checked_bytes(sum, esize, what);
    *total = sum;
    return offs;
}

void require_buffer(const void *p, size_t bytes, const char *what) {
    DSM_REQUIRE(p != nullptr || bytes == 0, DSM_ERR_NULL_POINTER, what, " is NULL with ", bytes,
                " bytes to move");
}

void check_alltoallv(int size, const void *send, const std::vector<size_t> &send_counts,
                     const std::vector<size_t> &send_displs, const void *recv,
                     const std::vector<size_t> &recv_counts, const std::vector<size_t> &recv_displs,
                     size_t esize) {
    const size_t n = static_cast<size_t>(size);
    const std::vector<size_t> *vs[4] = {&send_counts, &send_displs, &recv_counts, &recv_displs};
    const char *names[4] = {"send_counts", "send_displs", "recv_counts", "recv_displs"};
    for (int i = 0; i < 4; ++i)
        DSM_REQUIRE(vs[i]->size() == n, DSM_ERR_INVALID_ARGUMENT, names[i], " has ", vs[i]->size(),
                    " entries, expected ", size, " (the group size)");
    size_t send_end = 0, recv_end = 0;
    for (size_t r = 0; r < n; ++r) {
        DSM_REQUIRE(send_counts[r] <= SIZE_MAX - send_displs[r] && recv_counts[r] <= SIZE_MAX - recv_displs[r],
                    DSM_ERR_INVALID_ARGUMENT, "alltoallv block ", r, " overflows size_t");
        if (send_counts[r]) send_end = std::max(send_end, send_displs[r] + send_counts[r]);
        if (recv_counts[r]) recv_end = std::max(recv_end, recv_displs[r] + recv_counts[r]);
    }
    require_buffer(send, checked_bytes(send_end, esize, "alltoallv send"), "send");
    require_buffer(recv, checked_bytes(recv_end, esize, "alltoallv recv"), "recv");
}

void check_bcast(int size, const void *buf, size_t count, size_t esize, int root) {
    DSM_REQUIRE(root >= 0 && root < size, DSM_ERR_INVALID_ARGUMENT, "bcast root ", root,
                " is outside the group of ", size);
    require_buffer(buf, checked_bytes(count, esize, "bcast count"), "buf");
}

size_t check_allreduce(const void *send, const void *recv, size_t count, dsm_dtype_t dtype, Op op) {
    check_reduce(dtype, op);
    const size_t bytes = checked_bytes(count, require_dtype_size(dtype), "allreduce count");
    require_buffer(send, bytes, "send");
    require_buffer(recv, bytes, "recv");
    return bytes;
}

namespace {

// The blocks of counts, checked; the buffer that holds every block and the
// one that holds this member's must be set when they hold bytes.
std::vector<size_t> check_blocks(int size, int rank, const void *send, const void *recv,
                                 const std::vector<size_t> &counts, dsm_dtype_t dtype, bool send_holds_all,
                                 size_t *total, size_t *mine) {
    const size_t esize = require_dtype_size(dtype);
    std::vector<size_t> offs = block_offsets(counts, size, esize, "counts", total);
    *mine = counts[static_cast<size_t>(rank)];
    require_buffer(send, (send_holds_all ? *total : *mine) * esize, "send");
    require_buffer(recv, (send_holds_all ? *mine : *total) * esize, "recv");
    return offs;
}

} // namespace

std::vector<size_t> check_reduce_scatterv(int size, int rank, const void *send, const void *recv,
                                          const std::vector<size_t> &counts, dsm_dtype_t dtype, Op op,
                                          size_t *total, size_t *mine) {
    check_reduce(dtype, op);
    return check_blocks(size, rank, send, recv, counts, dtype, true, total, mine);
}

std::vector<size_t> check_allgatherv(int size, int rank, const void *send, const void *recv,
                                     const std::vector<size_t> &counts, dsm_dtype_t dtype, size_t *total,
                                     size_t *mine) {
    return check_blocks(size, rank, send, recv, counts, dtype, false, total, mine);
}

void check_packed(int size, int rank, const std::vector<size_t> &send_bytes, const std::vector<size_t> &recv_bytes,
                  const Backend::PackFn &pack, const Backend::UnpackFn &unpack) {
    DSM_REQUIRE(send_bytes.size() == static_cast<size_t>(size) && recv_bytes.size() == static_cast<size_t>(size),
                DSM_ERR_INVALID_ARGUMENT, "alltoall_packed: send_bytes has ", send_bytes.size(),
                " entries and recv_bytes ", recv_bytes.size(), ", expected ", size, " (the group size)");
    const size_t me = static_cast<size_t>(rank);
    DSM_REQUIRE(send_bytes[me] == recv_bytes[me], DSM_ERR_INVALID_ARGUMENT, "alltoall_packed: member ", rank,
                " sends itself ", send_bytes[me], " bytes but expects ", recv_bytes[me]);
    DSM_REQUIRE(pack, DSM_ERR_NULL_POINTER, "alltoall_packed: pack is empty");
    DSM_REQUIRE(unpack, DSM_ERR_NULL_POINTER, "alltoall_packed: unpack is empty");
}

std::vector<size_t> packed_layout(const std::vector<size_t> &bytes, size_t start, const char *what, size_t *end) {
    std::vector<size_t> offs(bytes.size(), 0);
    size_t at = start;
    for (size_t r = 0; r < bytes.size(); ++r) {
        if (bytes[r] == 0) continue;
        DSM_REQUIRE(at <= SIZE_MAX - 63 && bytes[r] <= SIZE_MAX - 63 - at, DSM_ERR_INVALID_ARGUMENT, "alltoall_packed: ",
                    what, " overflows size_t at entry ", r, " (", bytes[r], ")");
        at = (at + 63) & ~size_t(63);
        offs[r] = at;
        at += bytes[r];
    }
    *end = at;
    return offs;
}

void Deferred::keep(std::exception_ptr e) noexcept {
    error_ = e;
    try {
        std::rethrow_exception(e);
    } catch (const Error &x) {
        status_ = x.status() == DSM_SUCCESS ? DSM_ERR_INTERNAL : x.status();
    } catch (const std::bad_alloc &) {
        status_ = DSM_ERR_OUT_OF_MEMORY;
    } catch (...) {
        status_ = DSM_ERR_INTERNAL;
    }
}

void packed_failure(const Deferred &mine, int member, dsm_status_t status) {
    mine.rethrow_if_failed();
    DSM_FAIL(status, "alltoall_packed: packing failed on member ", member, " (", status_text(status),
             "); no data was moved");
}

// ---------------------------------------------------------------- datatypes and ops

namespace {

template <dsm_dtype_t D, Op O> void half_op(void *in, void *inout, int *len, MPI_Datatype *) {
    reduce_into(inout, in, static_cast<size_t>(*len), D, O);
}

template <dsm_dtype_t D> MPI_User_function *half_fn(Op op) {
    switch (op) {
    case Op::SUM: return &half_op<D, Op::SUM>;
    case Op::MAX: return &half_op<D, Op::MAX>;
    case Op::MIN: return &half_op<D, Op::MIN>;
    }
    return nullptr;
}

bool finalized() noexcept {
    int fini = 0;
    MPI_Finalized(&fini);
    return fini != 0;
}

} // namespace

MpiTypes::~MpiTypes() {
    if (finalized()) return;
    for (auto &row : ops_)
        for (MPI_Op &o : row)
            if (o != MPI_OP_NULL) MPI_Op_free(&o);
    if (half_ != MPI_DATATYPE_NULL) MPI_Type_free(&half_);
}

MPI_Datatype MpiTypes::type(dsm_dtype_t dtype) {
    switch (dtype) {
    case DSM_FLOAT32: return MPI_FLOAT;
    case DSM_FLOAT64: return MPI_DOUBLE;
    case DSM_INT8: return MPI_INT8_T;
    case DSM_UINT8: return MPI_UINT8_T;
    case DSM_INT32: return MPI_INT32_T;
    case DSM_INT64: return MPI_INT64_T;
    case DSM_FLOAT16:
    case DSM_BFLOAT16:
        if (half_ == MPI_DATATYPE_NULL) {
            MPI_Datatype t = MPI_DATATYPE_NULL;
            DSM_CHECK_MPI(MPI_Type_contiguous(2, MPI_BYTE, &t));
            half_ = t;
            DSM_CHECK_MPI(MPI_Type_commit(&half_));
        }
        return half_;
    }
    DSM_FAIL(DSM_ERR_INVALID_ARGUMENT, "dtype ", static_cast<int>(dtype), " is not a dsm_dtype_t");
}

MPI_Op MpiTypes::op(dsm_dtype_t dtype, Op op) {
    check_reduce(dtype, op);
    if (dtype == DSM_FLOAT32 || dtype == DSM_FLOAT64) return op == Op::SUM ? MPI_SUM : op == Op::MAX ? MPI_MAX : MPI_MIN;
    const int t = dtype == DSM_FLOAT16 ? 0 : 1;
    MPI_Op &o = ops_[t][static_cast<int>(op)];
    if (o == MPI_OP_NULL) {
        MPI_User_function *fn = t == 0 ? half_fn<DSM_FLOAT16>(op) : half_fn<DSM_BFLOAT16>(op);
        // Commutative: a op b has the same bits as b op a for sum, max and min.
        DSM_CHECK_MPI(MPI_Op_create(fn, 1, &o));
    }
    return o;
}

// ---------------------------------------------------------------- size_t collectives

namespace detail {
namespace {
size_t g_count_limit = INT_MAX;
}
size_t mpi_count_limit() noexcept { return g_count_limit; }
void set_mpi_count_limit(size_t limit) noexcept {
    g_count_limit = limit == 0 || limit > static_cast<size_t>(INT_MAX) ? static_cast<size_t>(INT_MAX) : limit;
}
} // namespace detail

namespace {

// A valid address for zero-length blocks (some MPIs reject NULL buffers).
char g_dummy[64];

char *at(const void *base, size_t elems, size_t esize) {
    return static_cast<char *>(const_cast<void *>(base)) + elems * esize;
}

std::vector<int> to_int(const std::vector<size_t> &v) {
    std::vector<int> out(v.size());
    for (size_t i = 0; i < v.size(); ++i) out[i] = static_cast<int>(v[i]);
    return out;
}

int comm_rank(MPI_Comm comm) {
    int r = 0;
    DSM_CHECK_MPI(MPI_Comm_rank(comm, &r));
    return r;
}

} // namespace

void mpi_allreduce(MPI_Comm comm, const void *send, void *recv, size_t count, MPI_Datatype type, MPI_Op op,
                   size_t esize) {
    const size_t lim = detail::mpi_count_limit();
    const bool in_place = send == recv;
    for (size_t done = 0; done < count; done += lim) {
        const size_t n = std::min(lim, count - done);
        DSM_CHECK_MPI(MPI_Allreduce(in_place ? MPI_IN_PLACE : at(send, done, esize), at(recv, done, esize),
                                    static_cast<int>(n), type, op, comm));
    }
}

void mpi_reduce_scatterv(MPI_Comm comm, const void *send, void *recv, const std::vector<size_t> &counts,
                         MPI_Datatype type, MPI_Op op, size_t esize) {
    const int me = comm_rank(comm);
    size_t total = 0;
    for (size_t c : counts) total += c;
    if (total == 0) return;
    const size_t lim = detail::mpi_count_limit();
    void *out = counts[static_cast<size_t>(me)] ? recv : g_dummy;
    if (total <= lim) {
        // Equal blocks: Open MPI's reduce_scatter_block algorithms are faster.
        if (std::all_of(counts.begin(), counts.end(), [&](size_t c) { return c == counts[0]; })) {
            DSM_CHECK_MPI(MPI_Reduce_scatter_block(send, out, static_cast<int>(counts[0]), type, op, comm));
            return;
        }
        const std::vector<int> icounts = to_int(counts);
        DSM_CHECK_MPI(MPI_Reduce_scatter(send, out, icounts.data(), type, op, comm));
        return;
    }
    // Too large for int counts: one reduction per member and chunk, rooted
    // at the block's owner.
    size_t off = 0;
    for (size_t j = 0; j < counts.size(); ++j) {
        for (size_t done = 0; done < counts[j]; done += lim) {
            const size_t n = std::min(lim, counts[j] - done);
            void *dst = static_cast<int>(j) == me ? at(recv, done, esize) : nullptr;
            DSM_CHECK_MPI(MPI_Reduce(at(send, off + done, esize), dst, static_cast<int>(n), type, op,
                                     static_cast<int>(j), comm));
        }
        off += counts[j];
    }
}

void mpi_allgatherv_in_place(MPI_Comm comm, void *recv, const std::vector<size_t> &counts,
                             const std::vector<size_t> &displs, MPI_Datatype type, size_t esize) {
    size_t end = 0, total = 0;
    for (size_t j = 0; j < counts.size(); ++j) {
        total += counts[j];
        if (counts[j]) end = std::max(end, displs[j] + counts[j]);
    }
    if (total == 0) return;
    const size_t lim = detail::mpi_count_limit();
    if (end <= lim) {
        const std::vector<int> icounts = to_int(counts), idispls = to_int(displs);
        DSM_CHECK_MPI(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, icounts.data(), idispls.data(),
                                     type, comm));
        return;
    }
    // Displacements beyond int: each member broadcasts its block in chunks.
    for (size_t j = 0; j < counts.size(); ++j)
        for (size_t done = 0; done < counts[j]; done += lim) {
            const size_t n = std::min(lim, counts[j] - done);
            DSM_CHECK_MPI(MPI_Bcast(at(recv, displs[j] + done, esize), static_cast<int>(n), type,
                                    static_cast<int>(j), comm));
        }
}

void mpi_alltoallv(MPI_Comm comm, const void *send, const std::vector<size_t> &send_counts,
                   const std::vector<size_t> &send_displs, void *recv, const std::vector<size_t> &recv_counts,
                   const std::vector<size_t> &recv_displs, MPI_Datatype type, size_t esize) {
    // Counts differ between members: agree on the path (one small allreduce).
    unsigned long long extent = 0, widest = 0;
    for (size_t r = 0; r < send_counts.size(); ++r)
        extent = std::max<unsigned long long>({extent, send_displs[r] + send_counts[r], recv_displs[r] + recv_counts[r]});
    DSM_CHECK_MPI(MPI_Allreduce(&extent, &widest, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, comm));
    mpi_alltoallv_agreed(comm, widest, send, send_counts, send_displs, recv, recv_counts, recv_displs, type, esize);
}

void mpi_alltoallv_agreed(MPI_Comm comm, unsigned long long widest, const void *send,
                          const std::vector<size_t> &send_counts, const std::vector<size_t> &send_displs,
                          void *recv, const std::vector<size_t> &recv_counts, const std::vector<size_t> &recv_displs,
                          MPI_Datatype type, size_t esize) {
    const size_t lim = detail::mpi_count_limit();
    const size_t n = send_counts.size();
    const int me = comm_rank(comm);
    if (widest <= lim) {
        const std::vector<int> sc = to_int(send_counts), sd = to_int(send_displs), rc = to_int(recv_counts),
                               rd = to_int(recv_displs);
        DSM_CHECK_MPI(MPI_Alltoallv(send ? send : g_dummy, sc.data(), sd.data(), type, recv ? recv : g_dummy,
                                    rc.data(), rd.data(), type, comm));
        return;
    }
    // Beyond int: every block travels as chunks of at most `lim` elements;
    // messages between a pair keep their order, so one tag suffices.
    const size_t self = static_cast<size_t>(me);
    DSM_REQUIRE(send_counts[self] == recv_counts[self], DSM_ERR_INVALID_ARGUMENT, "alltoallv sends ",
                send_counts[self], " elements to this rank itself but expects ", recv_counts[self]);
    std::vector<MPI_Request> reqs;
    for (size_t r = 0; r < n; ++r) {
        if (r == self) continue;
        for (size_t done = 0; done < recv_counts[r]; done += lim) {
            reqs.emplace_back();
            DSM_CHECK_MPI(MPI_Irecv(at(recv, recv_displs[r] + done, esize),
                                    static_cast<int>(std::min(lim, recv_counts[r] - done)), type, static_cast<int>(r),
                                    0, comm, &reqs.back()));
        }
    }
    for (size_t r = 0; r < n; ++r) {
        if (r == self) continue;
        for (size_t done = 0; done < send_counts[r]; done += lim) {
            reqs.emplace_back();
            DSM_CHECK_MPI(MPI_Isend(at(send, send_displs[r] + done, esize),
                                    static_cast<int>(std::min(lim, send_counts[r] - done)), type, static_cast<int>(r),
                                    0, comm, &reqs.back()));
        }
    }
    if (send_counts[self])
        std::memmove(at(recv, recv_displs[self], esize), at(send, send_displs[self], esize),
                     send_counts[self] * esize);
    DSM_CHECK_MPI(MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE));
}

void mpi_bcast(MPI_Comm comm, void *buf, size_t count, MPI_Datatype type, int root, size_t esize) {
    const size_t lim = detail::mpi_count_limit();
    for (size_t done = 0; done < count; done += lim)
        DSM_CHECK_MPI(MPI_Bcast(at(buf, done, esize), static_cast<int>(std::min(lim, count - done)), type, root, comm));
}

} // namespace comm
} // namespace dsm
