// What every backend shares: the equal-block forms, the MPI form of
// alltoall_packed, kind names and capabilities, and the collective choice of
// a backend (create_backend, and make_backend from DSM_COMM_BACKEND).
#include "dsm_config.h"

#include "comm/backend.hpp"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#if DSM_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include "comm/common.hpp"
#include "comm/mpi_backend.hpp"
#include "comm/nccl_backend.hpp"
#include "comm/shm_backend.hpp"
#include "core/agree.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/param.hpp"
#include "core/watchdog.hpp"
#include "cuda/device.hpp"

namespace dsm {
namespace comm {

namespace {

DSM_PARAM(comm, COMM_BACKEND, param::Choice({"auto", "mpi", "shm", "nccl"}), "auto",
          "The communication backend of the engine and sequence parallelism: auto, mpi, shm or nccl. "
          "auto: nccl for buffers in device memory when NCCL is built and every rank has a GPU of its own, else "
          "shm for a group of two or more ranks (node-shared memory inside a node, libdsm's own between-node "
          "stage over MPI point-to-point across nodes, even at one rank per node), else mpi. nccl takes device "
          "memory only, shm host memory only; a backend that cannot "
          "serve the buffers fails with DSM_ERR_NOT_SUPPORTED on every rank.");

} // namespace

void Backend::reduce_scatter(const void *send, void *recv, size_t count, dsm_dtype_t dtype, Op op, Queue queue) {
    reduce_scatterv(send, recv, std::vector<size_t>(static_cast<size_t>(size()), count), dtype, op, queue);
}

void Backend::allgather(const void *send, void *recv, size_t count, dsm_dtype_t dtype, Queue queue) {
    allgatherv(send, recv, std::vector<size_t>(static_cast<size_t>(size()), count), dtype, queue);
}

// ---------------------------------------------------------------- alltoall_packed over MPI

struct Backend::PackedBuffers {
    ScratchBuffer send, recv;
};

Backend::Backend() = default;
Backend::~Backend() = default;

// Host backends complete every call before returning: nothing to wait for.
void Backend::synchronize(Queue) {}

void Backend::drain(Queue queue) {
    if (queue.is_host()) return;
    if (queue.wait_fn() != nullptr) {
        queue.wait_fn()(queue.handle());
        return;
    }
#if DSM_HAVE_CUDA
    const cudaError_t e = cudaStreamSynchronize(static_cast<cudaStream_t>(queue.handle()));
    if (e == cudaSuccess) return;
    (void)cudaGetLastError();
    // No device or driver: nothing can have been enqueued.
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) return;
    DSM_FAIL(DSM_ERR_CUDA, "cudaStreamSynchronize of the call's queue: CUDA error ", cudaGetErrorString(e), " (",
             cudaGetErrorName(e), ")");
#endif
}

void Backend::barrier_mpi(Queue queue) {
    const watchdog::WaitScope wait("barrier", &watch_);
    drain(queue);
    ++stats_.calls;
    DSM_CHECK_MPI(MPI_Barrier(comm()));
}

void Backend::alltoall_packed(const std::vector<size_t> &send_bytes, const std::vector<size_t> &recv_bytes,
                              const PackFn &pack, const UnpackFn &unpack, Queue queue) {
    const watchdog::WaitScope wait("alltoall_packed", &watch_);
    drain(queue);
    check_packed(size(), rank(), send_bytes, recv_bytes, pack, unpack);
    ++stats_.calls;
    for (int r = 0; r < size(); ++r)
        if (r != rank()) count_sent(send_bytes[static_cast<size_t>(r)]);
    alltoall_packed_mpi(send_bytes, recv_bytes, pack, unpack);
}

void Backend::alltoall_packed_mpi(const std::vector<size_t> &send_bytes, const std::vector<size_t> &recv_bytes,
                                  const PackFn &pack, const UnpackFn &unpack) {
    if (!packed_) packed_ = std::make_unique<PackedBuffers>();
    const size_t n = static_cast<size_t>(size()), me = static_cast<size_t>(rank());
    // Every block in one buffer at 64-byte boundaries. This member's own block
    // is packed into the send buffer and unpacked from there: it does not
    // travel through MPI.
    std::vector<size_t> send_counts = send_bytes, recv_counts = recv_bytes;
    send_counts[me] = 0;
    recv_counts[me] = 0;
    size_t send_end = 0, recv_end = 0;
    const std::vector<size_t> send_displs = packed_layout(send_bytes, 0, "send_bytes", &send_end);
    const std::vector<size_t> recv_displs = packed_layout(recv_counts, 0, "recv_bytes", &recv_end);
    char *sbuf = static_cast<char *>(packed_->send.get(send_end));
    char *rbuf = static_cast<char *>(packed_->recv.get(recv_end));

    Deferred failed;
    failed.run([&] {
        for (size_t k = 0; k < n; ++k) {
            const size_t q = (me + k) % n;
            if (send_bytes[q]) pack(static_cast<int>(q), sbuf + send_displs[q]);
        }
    });
    if (n > 1) {
        // One agreement on the MPI path (mpi_alltoallv's extent) and on
        // whether some member failed to pack (the lowest one, with its status).
        Agreement a(comm());
        const size_t widest = a.add(static_cast<int64_t>(std::max(send_end, recv_end)));
        a.run(failed.status());
        if (a.failed()) packed_failure(failed, a.failed_rank(), a.failed_status());
        mpi_alltoallv_agreed(comm(), static_cast<unsigned long long>(a.max(widest)), sbuf, send_counts, send_displs,
                             rbuf, recv_counts, recv_displs, MPI_BYTE, 1);
    }
    failed.rethrow_if_failed();
    if (recv_bytes[me]) unpack(static_cast<int>(me), sbuf + send_displs[me]);
    for (size_t k = 1; k < n; ++k) {
        const size_t q = (me + n - k) % n;
        if (recv_bytes[q]) unpack(static_cast<int>(q), rbuf + recv_displs[q]);
    }
}

// No single-copy path: every member of a group has the same backend class,
// so all return false without communicating.
bool Backend::alltoall_direct(const std::vector<Exposed> &, const PlanFn &, Queue) { return false; }

bool Backend::alltoall_pieces(const std::vector<Exposed> &, const PlanFn &, const PlanFn &, Queue) { return false; }

namespace {

// One message's worth of pieces: contiguous runs (neighbours merged) at
// absolute addresses.
struct Runs {
    std::vector<MPI_Aint> at;
    std::vector<int> len;
    size_t bytes = 0;
    bool too_large = false;
    void add(const char *p, size_t n) {
        if (n == 0) return;
        bytes += n;
        MPI_Aint a = 0;
        MPI_Get_address(p, &a);
        if (!at.empty() && at.back() + len.back() == a && static_cast<size_t>(len.back()) + n <= INT_MAX) {
            len.back() += static_cast<int>(n);
            return;
        }
        if (n > INT_MAX) too_large = true;
        at.push_back(a);
        len.push_back(static_cast<int>(std::min<size_t>(n, INT_MAX)));
    }
};

// An MPI datatype freed at scope exit.
class OwnedType {
public:
    OwnedType() = default;
    ~OwnedType() {
        if (t_ != MPI_DATATYPE_NULL) MPI_Type_free(&t_);
    }
    OwnedType(OwnedType &&o) noexcept : t_(o.t_) { o.t_ = MPI_DATATYPE_NULL; }
    OwnedType(const OwnedType &) = delete;
    OwnedType &operator=(const OwnedType &) = delete;
    OwnedType &operator=(OwnedType &&) = delete;
    MPI_Datatype *out() { return &t_; }
    MPI_Datatype get() const { return t_; }

private:
    MPI_Datatype t_ = MPI_DATATYPE_NULL;
};

} // namespace

bool Backend::alltoall_pieces_mpi(const std::vector<Exposed> &exposed, const PlanFn &send_plan,
                                  const PlanFn &recv_plan, const std::function<bool(int)> &off_node) {
    const int n = size(), me = rank();
    std::vector<Runs> sends(static_cast<size_t>(n)), recvs(static_cast<size_t>(n));
    std::vector<Piece> self, pieces;
    // Every plan first, checked, before anything moves.
    Deferred failed;
    failed.run([&] {
        for (const Exposed &e : exposed)
            DSM_REQUIRE(e.data != nullptr || e.bytes == 0, DSM_ERR_NULL_POINTER,
                        "alltoall_pieces: an exposed buffer is NULL with ", e.bytes, " bytes");
        for (int k = 0; k < n; ++k) {
            const int q = (me + k) % n;
            pieces.clear();
            recv_plan(q, pieces);
            for (const Piece &p : pieces) {
                if (p.bytes == 0) continue;
                DSM_REQUIRE(p.to != nullptr, DSM_ERR_NULL_POINTER, "alltoall_pieces: a piece from member ", q,
                            " has no destination");
                if (q == me) self.push_back(p);
                else recvs[static_cast<size_t>(q)].add(static_cast<const char *>(p.to), p.bytes);
            }
            if (q == me) continue;
            pieces.clear();
            send_plan(q, pieces);
            for (const Piece &p : pieces) {
                if (p.bytes == 0) continue;
                DSM_REQUIRE(p.buffer >= 0 && static_cast<size_t>(p.buffer) < exposed.size() &&
                                p.from <= exposed[static_cast<size_t>(p.buffer)].bytes &&
                                p.bytes <= exposed[static_cast<size_t>(p.buffer)].bytes - p.from,
                            DSM_ERR_INVALID_ARGUMENT, "alltoall_pieces: a piece for member ", q, " (buffer ",
                            p.buffer, ", bytes ", p.from, " to ", p.from + p.bytes, ") lies outside this member's ",
                            exposed.size(), " exposed buffers");
                sends[static_cast<size_t>(q)].add(
                    static_cast<const char *>(exposed[static_cast<size_t>(p.buffer)].data) + p.from, p.bytes);
            }
        }
        for (const Piece &p : self)
            DSM_REQUIRE(p.buffer >= 0 && static_cast<size_t>(p.buffer) < exposed.size() &&
                            p.from <= exposed[static_cast<size_t>(p.buffer)].bytes &&
                            p.bytes <= exposed[static_cast<size_t>(p.buffer)].bytes - p.from,
                        DSM_ERR_INVALID_ARGUMENT, "alltoall_pieces: a piece of this member's own block lies outside "
                        "its exposed buffers");
    });
    // One agreement: the lowest failing member's error on every member, and
    // whether every message fits.
    int fits = 1;
    for (int q = 0; q < n; ++q) {
        const Runs &s = sends[static_cast<size_t>(q)], &r = recvs[static_cast<size_t>(q)];
        if (s.too_large || r.too_large || s.bytes > INT_MAX || r.bytes > INT_MAX) fits = 0;
    }
    Agreement a(comm());
    const size_t fit = a.add(fits);
    a.run([&] { failed.rethrow_if_failed(); });
    a.throw_if_failed();
    if (a.min(fit) == 0) return false;

    ++stats_.calls;
    ++pieces_calls_;
    std::vector<OwnedType> types;
    types.reserve(2 * static_cast<size_t>(n));
    std::vector<MPI_Request> reqs;
    auto post = [&](const Runs &r, int q, bool send) {
        if (r.bytes == 0) return;
        reqs.emplace_back();
        if (r.at.size() == 1) {
            void *p = reinterpret_cast<void *>(static_cast<uintptr_t>(r.at[0]));
            if (send) DSM_CHECK_MPI(MPI_Isend(p, r.len[0], MPI_BYTE, q, 0, comm(), &reqs.back()));
            else DSM_CHECK_MPI(MPI_Irecv(p, r.len[0], MPI_BYTE, q, 0, comm(), &reqs.back()));
            return;
        }
        types.emplace_back();
        DSM_CHECK_MPI(MPI_Type_create_hindexed(static_cast<int>(r.at.size()), r.len.data(), r.at.data(), MPI_BYTE,
                                               types.back().out()));
        DSM_CHECK_MPI(MPI_Type_commit(types.back().out()));
        if (send) DSM_CHECK_MPI(MPI_Isend(MPI_BOTTOM, 1, types.back().get(), q, 0, comm(), &reqs.back()));
        else DSM_CHECK_MPI(MPI_Irecv(MPI_BOTTOM, 1, types.back().get(), q, 0, comm(), &reqs.back()));
    };
    for (int k = 1; k < n; ++k) post(recvs[static_cast<size_t>((me + n - k) % n)], (me + n - k) % n, false);
    for (int k = 1; k < n; ++k) {
        const int q = (me + k) % n;
        post(sends[static_cast<size_t>(q)], q, true);
        stats_.bytes_sent += sends[static_cast<size_t>(q)].bytes;
        if (off_node(q)) stats_.bytes_off_node += sends[static_cast<size_t>(q)].bytes;
    }
    for (const Piece &p : self)
        std::memcpy(p.to, static_cast<const char *>(exposed[static_cast<size_t>(p.buffer)].data) + p.from, p.bytes);
    if (!reqs.empty()) DSM_CHECK_MPI(MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE));
    return true;
}

Kind kind_from_name(const std::string &name) {
    if (name == "auto") return Kind::AUTO;
    if (name == "mpi") return Kind::MPI;
    if (name == "shm") return Kind::SHM;
    if (name == "nccl") return Kind::NCCL;
    DSM_FAIL(DSM_ERR_INVALID_ARGUMENT, "communication backend \"", name,
             "\" is not known: use \"auto\", \"mpi\", \"shm\" or \"nccl\"");
}

const char *kind_name(Kind kind) noexcept {
    switch (kind) {
    case Kind::AUTO: return "auto";
    case Kind::MPI: return "mpi";
    case Kind::SHM: return "shm";
    case Kind::NCCL: return "nccl";
    }
    return "unknown";
}

Capabilities capabilities_of(Kind kind) noexcept {
    Capabilities c;
    switch (kind) {
    case Kind::MPI:
        c.host_memory = c.device_memory = c.multi_node = true;
        break;
    case Kind::SHM:
        c.host_memory = c.multi_node = true;
        break;
    case Kind::NCCL:
        c.device_memory = c.stream_ordered = c.multi_node = true;
        break;
    case Kind::AUTO: break;
    }
    return c;
}

Kind kind_from_param() { return kind_from_name(param_COMM_BACKEND().value()); }

bool nccl_built() noexcept { return DSM_HAVE_NCCL_BACKEND != 0; }

int nccl_timeout_param() { return static_cast<int>(watchdog::timeout_seconds()); }

namespace {

std::unique_ptr<Backend> create_kind(MPI_Comm comm, Kind kind, int node_color) {
    DSM_REQUIRE(comm != MPI_COMM_NULL, DSM_ERR_INVALID_ARGUMENT, "the communicator is MPI_COMM_NULL");
    switch (kind) {
    case Kind::MPI: return std::make_unique<MpiBackend>(comm);
    case Kind::SHM: return std::make_unique<ShmBackend>(comm, node_color);
    case Kind::NCCL:
#if DSM_HAVE_NCCL_BACKEND
        return std::make_unique<NcclBackend>(comm);
#else
        DSM_FAIL(DSM_ERR_NOT_SUPPORTED, "the nccl backend is not built: libdsm was configured without ",
                 DSM_HAVE_CUDA ? "NCCL" : "CUDA");
#endif
    case Kind::AUTO: {
        // Every group of two or more ranks: inside a node shared memory
        // beats MPI's copies, and across nodes (even at one rank per node)
        // the shm backend's between-node stage beats MPI's collectives over
        // TCP (performance.md, "Multi-node"). Every rank sees the same size.
        int size = 1;
        DSM_CHECK_MPI(MPI_Comm_size(comm, &size));
        if (size < 2) return std::make_unique<MpiBackend>(comm);
        try {
            return std::make_unique<ShmBackend>(comm, node_color);
        } catch (const Error &e) {
            // ShmBackend agrees on window failures, so every rank lands here.
            if (e.status() != DSM_ERR_NOT_SUPPORTED) throw;
            DSM_WARN(INIT, "shared-memory windows are not available (%s): using the mpi backend", e.what());
            return std::make_unique<MpiBackend>(comm);
        }
    }
    }
    DSM_FAIL(DSM_ERR_INVALID_ARGUMENT, "backend kind ", static_cast<int>(kind), " is not AUTO, MPI, SHM or NCCL");
}

} // namespace

std::unique_ptr<Backend> create_backend(MPI_Comm comm, Kind kind, int node_color) {
    watchdog::start();
    std::unique_ptr<Backend> b = create_kind(comm, kind, node_color);
    b->watch().describe(b->comm(), "a group of " + std::to_string(b->size()) + " ranks", b->name());
    return b;
}

namespace {

const char *space_name(Space s) noexcept { return s == Space::HOST ? "host" : "device"; }

} // namespace

// Whether every rank of `comm` sees a CUDA device (the same answer on all);
// *why: this rank's reason when it sees none.
bool every_rank_has_a_device(MPI_Comm comm, std::string *why) {
    const cuda::DeviceCount dc = cuda::device_count();
    int mine = dc.count > 0 ? 1 : 0, all = 0;
    DSM_CHECK_MPI(MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, comm));
    *why = dc.count > 0 ? std::string("another rank has no CUDA device") : dc.reason;
    return all == 1;
}

void require_devices_of_their_own(MPI_Comm comm, int device) {
    // GPUs and their bus ids belong to the physical host (no node color),
    // also where DSM_SIM_NODES makes the mesh see several nodes on it.
    const Comm node = node_comm(comm, -1);
    int n = 0, rank = 0;
    DSM_CHECK_MPI(MPI_Comm_size(node.get(), &n));
    DSM_CHECK_MPI(MPI_Comm_rank(comm, &rank));
    // Each node rank's bus id (a fixed-size record) and its rank in `comm`.
    constexpr int kId = 32;
    char mine[kId] = {0};
    std::string id;
    agree(comm, [&] { id = cuda::pci_bus_id(device); });
    std::snprintf(mine, sizeof mine, "%s", id.c_str());
    std::vector<char> ids(static_cast<size_t>(n) * kId);
    std::vector<int> ranks(static_cast<size_t>(n));
    DSM_CHECK_MPI(MPI_Allgather(mine, kId, MPI_CHAR, ids.data(), kId, MPI_CHAR, node.get()));
    DSM_CHECK_MPI(MPI_Allgather(&rank, 1, MPI_INT, ranks.data(), 1, MPI_INT, node.get()));
    std::vector<std::string> all;
    for (int i = 0; i < n; ++i) all.emplace_back(&ids[static_cast<size_t>(i) * kId]);
    const std::pair<int, int> shared = cuda::first_shared(all);
    agree(comm, [&] {
        if (shared.first < 0) return;
        DSM_FAIL(DSM_ERR_NOT_SUPPORTED, "ranks ", ranks[static_cast<size_t>(shared.first)], " and ",
                 ranks[static_cast<size_t>(shared.second)], " share the CUDA device at PCI bus id ",
                 all[static_cast<size_t>(shared.first)], " (the nccl backend needs a GPU of its own on every "
                 "rank: run at most as many ranks per node as it has GPUs)");
    });
}

bool every_rank_has_its_own_device(MPI_Comm comm, const cuda::DeviceHint *hint, std::string *why) {
    if (!every_rank_has_a_device(comm, why)) return false;
    cuda::DeviceHint local;
    if (hint == nullptr) {
        const Comm node = node_comm(comm, -1); // the physical host
        DSM_CHECK_MPI(MPI_Comm_rank(node.get(), &local.local_rank));
        hint = &local;
    }
    try {
        int device = -1;
        agree(comm, [&] { device = cuda::use_device(*hint); });
        require_devices_of_their_own(comm, device);
    } catch (const Error &e) {
        // A shared GPU is an answer; a bad DSM_CUDA_DEVICE or a CUDA failure is an error.
        if (e.status() != DSM_ERR_NOT_SUPPORTED) throw;
        *why = e.message();
        return false;
    }
    return true;
}

std::unique_ptr<Backend> make_backend(MPI_Comm comm, Space space, int node_color, const Kind *choice) {
    DSM_REQUIRE(comm != MPI_COMM_NULL, DSM_ERR_INVALID_ARGUMENT, "the communicator is MPI_COMM_NULL");
    DSM_REQUIRE(space == Space::HOST || space == Space::DEVICE, DSM_ERR_INVALID_ARGUMENT, "memory space ",
                static_cast<int>(space), " is not HOST or DEVICE");
    const Comm c = Comm::dup(comm); // MPI_ERRORS_RETURN for the agreement
    Kind kind = Kind::AUTO;
    // Where the choice came from, for the messages.
    const std::string src = choice != nullptr ? "dsm_engine_options_t.backend " : "DSM_COMM_BACKEND=";
    agree(c.get(), [&] { kind = choice != nullptr ? *choice : kind_from_param(); });
    agree_same(c.get(), choice != nullptr ? "dsm_engine_options_t.backend" : "DSM_COMM_BACKEND", kind_name(kind));
    std::string why;
    if (kind == Kind::AUTO) {
        if (space == Space::DEVICE) {
            // Collective: every rank takes the same branch.
            if (nccl_built() && every_rank_has_its_own_device(c.get(), nullptr, &why))
                return create_backend(comm, Kind::NCCL, node_color);
            DSM_INFO(INIT, "comm: device memory without the nccl backend (%s): using the mpi backend",
                     nccl_built() ? why.c_str() : "not built");
            return create_backend(comm, Kind::MPI, node_color);
        }
        return create_backend(comm, Kind::AUTO, node_color);
    }
    DSM_REQUIRE(capabilities_of(kind).accepts(space), DSM_ERR_NOT_SUPPORTED, src, kind_name(kind),
                ": the ", kind_name(kind), " backend does not take ", space_name(space), " memory");
    if (kind == Kind::NCCL) {
        DSM_REQUIRE(nccl_built(), DSM_ERR_NOT_SUPPORTED,
                    src, "nccl: the nccl backend is not built: libdsm was configured without ",
                    DSM_HAVE_CUDA ? "NCCL" : "CUDA");
        DSM_REQUIRE(every_rank_has_a_device(c.get(), &why), DSM_ERR_NOT_SUPPORTED,
                    src, "nccl: the nccl backend needs a CUDA device on every rank: ", why);
    }
    return create_backend(comm, kind, node_color);
}

} // namespace comm
} // namespace dsm

DSM_PARAM_LINK(comm_backend)
