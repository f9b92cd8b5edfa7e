// The CUDA layer (src/cuda/device.*) and the "nccl" backend.
//
// Host tests, run everywhere: the device choice as a pure function with
// made-up device counts, DSM_CUDA_DEVICE parsing and its errors, the CUDA
// error text, device_count() and CUDA-aware MPI detection answering without
// crashing, and Kind::NCCL failing on every rank, with a clear message and
// no hang, where no device is usable.
//
// GPU tests, skipped (with the reason) unless every rank has a device of its
// own: the RAII types, and every collective of the nccl backend on device
// buffers against the same collective of the mpi backend on host copies, for
// every dtype, uneven and equal counts, in place, and argument errors. The
// mpi backend on device buffers (staged through pinned memory) runs wherever
// every rank sees a device, shared or not. The
// data are small integers, so every reduction order gives the same bits and
// the two backends must agree exactly.
//
// A failed check is recorded, not asserted at once, so that every rank goes
// on through the same collectives; each test ends by agreeing on failures.
#include "dsm_config.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#if DSM_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include "comm/backend.hpp"
#include "comm/common.hpp"
#include "comm/mpi_backend.hpp"
#include "comm/nccl_backend.hpp"
#include "comm/shm_backend.hpp"
#include "comm/reduce.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/half.hpp"
#include "cuda/device.hpp"
#include "mesh/mesh.hpp"

// CMocka (through mpi_test.h) last: its fail() macro would break the C++ headers.
#include "mpi_test.h"

using dsm::comm::Backend;
using dsm::comm::Kind;
using dsm::comm::Op;
namespace cuda = dsm::cuda;

#include "mpi_test_cxx.h"

namespace {

// ---------------------------------------------------------------- device choice (pure)

void test_choose_device(void **) {
    guarded([] {
        using cuda::DeviceSource;
        const std::vector<int> identity;
        // Nothing known: local rank modulo the count.
        for (int local = 0; local < 9; ++local) {
            const cuda::DeviceChoice c = cuda::choose_device(4, -1, cuda::DeviceHint{-1, 0, local}, identity);
            CHECK(c.device == local % 4 && c.source == DeviceSource::LOCAL_RANK, "local rank ", local, " got ",
                  c.device);
        }
        // The placement's assignment (topo::place: GPU i*g/n of g for the
        // i-th of n ranks when n >= g, else GPU i), mapped through PCI order.
        const std::vector<int> pci = {3, 1, 0, 2}; // PCI position -> CUDA ordinal
        for (int n : {2, 4, 8}) {
            for (int i = 0; i < n; ++i) {
                const int g = 4, gpu = n >= g ? i * g / n : i;
                const cuda::DeviceChoice a = cuda::choose_device(g, -1, cuda::DeviceHint{gpu, g, i}, identity);
                CHECK(a.device == gpu && a.source == DeviceSource::PLACEMENT, "n ", n, " i ", i, ": ", a.device);
                const cuda::DeviceChoice b = cuda::choose_device(g, -1, cuda::DeviceHint{gpu, g, i}, pci);
                CHECK(b.device == pci[static_cast<size_t>(gpu)] && b.source == DeviceSource::PLACEMENT, "n ", n,
                      " i ", i, " in PCI order: ", b.device);
            }
        }
        // A process that sees another number of devices than the placement
        // counted (CUDA_VISIBLE_DEVICES per rank) cannot use the index.
        cuda::DeviceChoice c = cuda::choose_device(1, -1, cuda::DeviceHint{3, 4, 5}, identity);
        CHECK(c.device == 0 && c.source == DeviceSource::LOCAL_RANK, "one visible device: ", c.device);
        c = cuda::choose_device(2, -1, cuda::DeviceHint{1, 4, 3}, identity);
        CHECK(c.device == 1 && c.source == DeviceSource::LOCAL_RANK, "two of four visible: ", c.device);
        c = cuda::choose_device(4, -1, cuda::DeviceHint{-1, 4, 6}, identity);
        CHECK(c.device == 2 && c.source == DeviceSource::LOCAL_RANK, "no placement GPU: ", c.device);
        // The override wins over everything.
        c = cuda::choose_device(4, 3, cuda::DeviceHint{1, 4, 0}, pci);
        CHECK(c.device == 3 && c.source == DeviceSource::OVERRIDE, "override: ", c.device);
        CHECK(std::string(cuda::source_name(DeviceSource::OVERRIDE)) == "DSM_CUDA_DEVICE", "source name");
        // Errors.
        EXPECT_ERROR(cuda::choose_device(2, 2, cuda::DeviceHint{}, identity), DSM_ERR_INVALID_ARGUMENT,
                     "DSM_CUDA_DEVICE=2 is not a device of this process: it sees 2 CUDA devices (0 to 1)");
        EXPECT_ERROR(cuda::choose_device(1, 5, cuda::DeviceHint{}, identity), DSM_ERR_INVALID_ARGUMENT,
                     "it sees 1 CUDA device (0)");
        EXPECT_ERROR(cuda::choose_device(0, -1, cuda::DeviceHint{}, identity), DSM_ERR_NOT_SUPPORTED,
                     "no CUDA device");
        EXPECT_ERROR(cuda::choose_device(0, 0, cuda::DeviceHint{}, identity), DSM_ERR_NOT_SUPPORTED,
                     "no CUDA device");
        EXPECT_ERROR(cuda::choose_device(2, -1, cuda::DeviceHint{-1, 0, -1}, identity), DSM_ERR_INVALID_ARGUMENT,
                     "local rank -1");
        EXPECT_ERROR(cuda::choose_device(2, -1, cuda::DeviceHint{}, std::vector<int>{0, 0}),
                     DSM_ERR_INVALID_ARGUMENT, "not a permutation");
        EXPECT_ERROR(cuda::choose_device(2, -1, cuda::DeviceHint{}, std::vector<int>{1}), DSM_ERR_INVALID_ARGUMENT,
                     "not a permutation");
    });
}

// The hint a mesh gives: the placement's GPU (simulated: DSM_SIM_GPUS=4 per
// node) and the rank's place on its node; with as many devices as the
// placement counted, the choice is the placement's GPU, distinct for the
// ranks of a node while they are no more than the GPUs.
void test_mesh_hint(void **) {
    guarded([] {
        setenv("DSM_SIM_GPUS", "4", 1);
        const int shape[] = {test_size};
        const char *const names[] = {"dp"};
        std::unique_ptr<dsm::Mesh> mesh = dsm::Mesh::create(MPI_COMM_WORLD, 1, shape, names, nullptr, true);
        unsetenv("DSM_SIM_GPUS");
        const dsm::MeshState &st = mesh->state();
        const cuda::DeviceHint h = cuda::mesh_hint(st);
        const size_t me = static_cast<size_t>(st.rank);
        CHECK(h.node_gpus == 4 && h.placement_gpu == st.placement.gpu_of_rank[me] &&
                  h.local_rank == st.ranks[me].local_rank,
              "hint ", h.placement_gpu, "/", h.node_gpus, "/", h.local_rank);
        const cuda::DeviceChoice c = cuda::choose_device(4, -1, h, {});
        CHECK(c.device == h.placement_gpu && c.source == cuda::DeviceSource::PLACEMENT, "choice ", c.device);
        // Devices of the ranks on this (possibly simulated) node.
        MPI_Comm node = MPI_COMM_NULL;
        MPI_Comm_split(MPI_COMM_WORLD, st.ranks[me].node, test_rank, &node);
        int local_size = 1;
        MPI_Comm_size(node, &local_size);
        std::vector<int> devs(static_cast<size_t>(local_size));
        MPI_Allgather(&c.device, 1, MPI_INT, devs.data(), 1, MPI_INT, node);
        MPI_Comm_free(&node);
        std::sort(devs.begin(), devs.end());
        if (local_size <= 4)
            CHECK(std::adjacent_find(devs.begin(), devs.end()) == devs.end(), "two ranks of a node share a GPU");
        // Seeing another number of devices: the local rank decides.
        const cuda::DeviceChoice d = cuda::choose_device(2, -1, h, {});
        CHECK(d.device == h.local_rank % 2 && d.source == cuda::DeviceSource::LOCAL_RANK, "choice ", d.device);
        CHECK(mesh->release() == MPI_SUCCESS, "mesh release");
    });
}

void test_device_override_parsing(void **) {
    guarded([] {
        CHECK(cuda::parse_device_override("") == -1, "empty is unset");
        CHECK(cuda::parse_device_override("0") == 0, "0");
        CHECK(cuda::parse_device_override("7") == 7, "7");
        CHECK(cuda::parse_device_override("007") == 7, "007");
        CHECK(cuda::parse_device_override("2147483647") == INT_MAX, "INT_MAX");
        for (const char *bad : {"-1", "abc", " 1", "1 ", "1.5", "+1", "0x1", "2147483648", "99999999999"})
            EXPECT_ERROR(cuda::parse_device_override(bad), DSM_ERR_INVALID_ARGUMENT,
                         dsm::cat("environment DSM_CUDA_DEVICE=\"", bad, "\": expected a CUDA device number"));

        // Through the environment: a bad value fails before any CUDA call,
        // with or without a device.
        setenv("DSM_CUDA_DEVICE", "gpu0", 1);
        EXPECT_ERROR(cuda::select_device(cuda::DeviceHint{}), DSM_ERR_INVALID_ARGUMENT, "DSM_CUDA_DEVICE=\"gpu0\"");
        // A number beyond the devices: DSM_ERR_INVALID_ARGUMENT naming it, or
        // DSM_ERR_NOT_SUPPORTED where there is no device at all.
        setenv("DSM_CUDA_DEVICE", "4096", 1);
        if (cuda::device_count().count > 0)
            EXPECT_ERROR(cuda::select_device(cuda::DeviceHint{}), DSM_ERR_INVALID_ARGUMENT, "DSM_CUDA_DEVICE=4096");
        else
            EXPECT_ERROR(cuda::select_device(cuda::DeviceHint{}), DSM_ERR_NOT_SUPPORTED, "no CUDA device is usable");
        unsetenv("DSM_CUDA_DEVICE");
        CHECK(cuda::selected_device() == -1, "a failed select_device chose ", cuda::selected_device());
    });
}

// ---------------------------------------------------------------- host-side answers

void test_device_count_and_errors(void **) {
    guarded([] {
        const cuda::DeviceCount dc = cuda::device_count();
        CHECK(dc.count >= 0, "count ", dc.count);
        CHECK((dc.count == 0) == !dc.reason.empty(), "count ", dc.count, " with reason \"", dc.reason, "\"");
#if !DSM_HAVE_CUDA
        CHECK(dc.reason.find("built without CUDA") != std::string::npos, "reason \"", dc.reason, "\"");
#endif
        if (dc.count == 0) {
            if (test_rank == 0) print_message("no usable CUDA device: %s\n", dc.reason.c_str());
            // Whatever needs a device fails cleanly, naming the call.
            const dsm_status_t want = DSM_HAVE_CUDA ? DSM_ERR_CUDA : DSM_ERR_NOT_SUPPORTED;
            EXPECT_ERROR(cuda::DeviceBuffer(64), want, "cudaMalloc");
            EXPECT_ERROR(cuda::Stream::create(), want, "cudaStreamCreate");
            EXPECT_ERROR(cuda::select_device(cuda::DeviceHint{}), DSM_ERR_NOT_SUPPORTED, "no CUDA device is usable");
        }
        // Host memory and NULL are never device memory.
        std::vector<char> host(64);
        CHECK(!cuda::is_device_pointer(host.data()), "host memory taken for device memory");
        CHECK(!cuda::is_device_pointer(nullptr), "NULL taken for device memory");
        // The CUDA error text names the call and CUDA's message (error 2 is
        // cudaErrorMemoryAllocation; the text needs no driver).
        try {
            DSM_CHECK_CUDA(2);
            record("DSM_CHECK_CUDA(2) did not throw");
        } catch (const dsm::Error &e) {
            CHECK(e.status() == DSM_ERR_CUDA, "status ", e.status());
            CHECK(e.message().find("2 failed") != std::string::npos, "message \"", e.message(), "\"");
#if DSM_HAVE_CUDA
            CHECK(e.message().find("cudaErrorMemoryAllocation") != std::string::npos, "message \"", e.message(), "\"");
#endif
        }
        int zero = 0;
        DSM_CHECK_CUDA(zero); // success does not throw
    });
}

void test_cuda_aware_mpi(void **) {
    guarded([] {
        const int aware = cuda::cuda_aware_mpi() ? 1 : 0;
        int lo = 0, hi = 0;
        MPI_Allreduce(&aware, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        MPI_Allreduce(&aware, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        CHECK(lo == hi, "ranks disagree on CUDA-aware MPI");
        if (test_rank == 0) print_message("CUDA-aware MPI: %s\n", aware ? "yes" : "no");
    });
}

// Whether every rank has a usable device; the same answer everywhere.
bool all_have_devices() {
    int mine = cuda::device_count().count > 0 ? 1 : 0, all = 0;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return all != 0;
}

void test_nccl_kind_without_device(void **) {
    const bool devices = all_have_devices();
    guarded([&] {
        CHECK(dsm::comm::kind_from_name("nccl") == Kind::NCCL, "kind_from_name(\"nccl\")");
        EXPECT_ERROR(dsm::comm::kind_from_name("gpu"), DSM_ERR_INVALID_ARGUMENT, "\"nccl\"");
#if DSM_HAVE_NCCL_BACKEND
        // A bad timeout fails on every rank before NCCL starts, device or not.
        setenv("DSM_NCCL_TIMEOUT", "soon", 1);
        EXPECT_ERROR(dsm::comm::create_backend(MPI_COMM_WORLD, Kind::NCCL), DSM_ERR_INVALID_ARGUMENT,
                     "DSM_NCCL_TIMEOUT=\"soon\"");
        unsetenv("DSM_NCCL_TIMEOUT");
        if (!devices)
            EXPECT_ERROR(dsm::comm::create_backend(MPI_COMM_WORLD, Kind::NCCL), DSM_ERR_NOT_SUPPORTED,
                         "the nccl backend needs a CUDA device");
#else
        (void)devices; // no device is usable without CUDA
        EXPECT_ERROR(dsm::comm::create_backend(MPI_COMM_WORLD, Kind::NCCL), DSM_ERR_NOT_SUPPORTED,
                     "the nccl backend is not built");
#endif
        // AUTO never picks NCCL.
        CHECK(std::string(dsm::comm::create_backend(MPI_COMM_WORLD, Kind::AUTO)->name()) != "nccl", "AUTO gave nccl");
    });
}

// Ranks of a node on one GPU, where NCCL cannot run: the pure check, and
// where a node's ranks outnumber its GPUs, the clear error in place of
// NCCL's ("Duplicate GPU detected") and the automatic choice declining.
void test_shared_device(void **) {
    guarded([] {
        using P = std::pair<int, int>;
        CHECK(cuda::first_shared({}) == P(-1, -1), "first_shared of nothing");
        CHECK(cuda::first_shared({"0000:3b:00.0", "0000:5e:00.0"}) == P(-1, -1), "two devices shared");
        CHECK(cuda::first_shared({"a", "b", "a", "b"}) == P(0, 2), "first_shared a b a b");
        CHECK(cuda::first_shared({"a", "b", "b"}) == P(1, 2), "first_shared a b b");
#if DSM_HAVE_NCCL_BACKEND
        MPI_Comm node = MPI_COMM_NULL;
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
        int local_size = 1;
        MPI_Comm_size(node, &local_size);
        MPI_Comm_free(&node);
        const int count = cuda::device_count().count;
        const char *forced = std::getenv("DSM_CUDA_DEVICE");
        int have = count > 0 ? 1 : 0, crowded = count > 0 && count < local_size ? 1 : 0;
        MPI_Allreduce(MPI_IN_PLACE, &have, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        MPI_Allreduce(MPI_IN_PLACE, &crowded, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        if (have && crowded && (forced == nullptr || *forced == '\0')) {
            std::string why;
            CHECK(!dsm::comm::every_rank_has_its_own_device(MPI_COMM_WORLD, nullptr, &why),
                  "ranks sharing a GPU have devices of their own");
            CHECK(why.find("share the CUDA device at PCI bus id") != std::string::npos, "why: ", why);
            EXPECT_ERROR(dsm::comm::create_backend(MPI_COMM_WORLD, Kind::NCCL), DSM_ERR_NOT_SUPPORTED,
                         "share the CUDA device at PCI bus id");
            // AUTO on device memory takes the mpi backend instead.
            CHECK(std::string(dsm::comm::make_backend(MPI_COMM_WORLD, dsm::comm::Space::DEVICE)->name()) == "mpi",
                  "make_backend(DEVICE) on a shared GPU is not mpi");
        }
#endif
    });
}

// ---------------------------------------------------------------- GPU tests

// Why the GPU tests cannot run here; empty when they can. Collective the
// first time (every test asks in the same order), then cached.
const std::string &gpu_unusable() {
    static bool known = false;
    static std::string why;
    if (known) return why;
    known = true;
#if !DSM_HAVE_NCCL_BACKEND
    why = "libdsm was built without the nccl backend (CUDA and NCCL)";
#else
    MPI_Comm node = MPI_COMM_NULL;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    int local_size = 1;
    MPI_Comm_size(node, &local_size);
    MPI_Comm_free(&node);
    const cuda::DeviceCount dc = cuda::device_count();
    const char *forced = std::getenv("DSM_CUDA_DEVICE");
    std::string mine;
    if (dc.count == 0)
        mine = "no usable CUDA device (" + dc.reason + ")";
    else if (dc.count < local_size)
        mine = dsm::cat(local_size, " ranks on a node with ", dc.count, " CUDA devices: NCCL needs one per rank");
    else if (forced != nullptr && *forced != '\0' && local_size > 1)
        mine = "DSM_CUDA_DEVICE puts every rank of a node on one device";
    int ok = mine.empty() ? 1 : 0, all = 0;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all) why = mine.empty() ? "another rank has no CUDA device of its own" : mine;
#endif
    return why;
}

// At the start of a GPU test: true (having told CMocka to skip) when the
// GPU tests cannot run. skip() leaves the test at once, so it is called
// before anything collective of the test, on every rank alike.
#define SKIP_WITHOUT_GPU()                                                                               \
    do {                                                                                                 \
        if (!gpu_unusable().empty()) {                                                                   \
            if (test_rank == 0) print_message("skipped: %s\n", gpu_unusable().c_str());                  \
            skip();                                                                                      \
            return;                                                                                      \
        }                                                                                                \
    } while (0)

#if DSM_HAVE_NCCL_BACKEND

using Bytes = std::vector<unsigned char>;

const dsm_dtype_t kFloatTypes[] = {DSM_FLOAT32, DSM_FLOAT64, DSM_FLOAT16, DSM_BFLOAT16};
const dsm_dtype_t kAllTypes[] = {DSM_FLOAT32, DSM_FLOAT64, DSM_FLOAT16, DSM_BFLOAT16,
                                 DSM_INT8,    DSM_UINT8,   DSM_INT32,   DSM_INT64};
const Op kOps[] = {Op::SUM, Op::MAX, Op::MIN};

size_t esize(dsm_dtype_t t) { return dsm::require_dtype_size(t); }

uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

uint64_t hash(uint64_t seed, int r, size_t i) { return mix(mix(seed * 1000003u + static_cast<uint64_t>(r)) ^ i); }

// `count` elements of rank r's data: small integers (-15..15) for the float
// types, so that sums are exact in every type and order; random bytes for
// the integer types (moved, never reduced).
Bytes make_data(dsm_dtype_t t, uint64_t seed, int r, size_t count) {
    const size_t es = esize(t);
    Bytes b(count * es);
    for (size_t i = 0; i < count; ++i) {
        const double v = static_cast<double>(static_cast<int>(hash(seed, r, i) % 31) - 15);
        unsigned char *p = b.data() + i * es;
        if (t == DSM_FLOAT64) {
            std::memcpy(p, &v, 8);
        } else if (t == DSM_FLOAT32) {
            const float f = static_cast<float>(v);
            std::memcpy(p, &f, 4);
        } else if (t == DSM_FLOAT16 || t == DSM_BFLOAT16) {
            const float f = static_cast<float>(v);
            const uint16_t h = t == DSM_FLOAT16 ? dsm::fp32_to_fp16(f) : dsm::fp32_to_bf16(f);
            std::memcpy(p, &h, 2);
        } else {
            for (size_t k = 0; k < es; ++k) p[k] = static_cast<unsigned char>(hash(seed ^ 0x55, r, i * es + k));
        }
    }
    return b;
}

// Device memory holding a copy of host bytes.
class Dev {
public:
    explicit Dev(size_t bytes) : buf_(bytes, true) {}
    explicit Dev(const Bytes &h) : buf_(h.size(), true) {
        if (!h.empty()) DSM_CHECK_CUDA(cudaMemcpy(buf_.get(), h.data(), h.size(), cudaMemcpyHostToDevice));
    }
    unsigned char *get() const { return static_cast<unsigned char *>(buf_.get()); }
    Bytes host() const {
        Bytes h(buf_.bytes());
        if (!h.empty()) DSM_CHECK_CUDA(cudaMemcpy(h.data(), buf_.get(), h.size(), cudaMemcpyDeviceToHost));
        return h;
    }

private:
    cuda::DeviceBuffer buf_;
};

std::vector<size_t> offsets(const std::vector<size_t> &counts, size_t *total) {
    std::vector<size_t> offs(counts.size());
    size_t sum = 0;
    for (size_t r = 0; r < counts.size(); ++r) {
        offs[r] = sum;
        sum += counts[r];
    }
    *total = sum;
    return offs;
}

// Block counts per rank: uneven (some zero) or equal, times `scale`.
std::vector<size_t> block_counts(bool uneven, size_t scale) {
    std::vector<size_t> c(static_cast<size_t>(test_size));
    for (int r = 0; r < test_size; ++r)
        c[static_cast<size_t>(r)] = uneven ? static_cast<size_t>((r * 5 + 3) % 7) * scale : 3 * scale;
    return c;
}

struct Pair {
    std::unique_ptr<Backend> nccl, mpi;
};

Pair make_pair() {
    Pair p;
    p.nccl = dsm::comm::create_backend(MPI_COMM_WORLD, Kind::NCCL);
    p.mpi = dsm::comm::create_backend(MPI_COMM_WORLD, Kind::MPI);
    return p;
}

std::string label(const char *what, dsm_dtype_t t, size_t count) {
    return dsm::cat(what, " ", dsm::dtype_name(t), " count ", count);
}

#endif // DSM_HAVE_NCCL_BACKEND

void test_gpu_device_types(void **) {
    SKIP_WITHOUT_GPU();
#if DSM_HAVE_NCCL_BACKEND
    guarded([] {
        MPI_Comm node = MPI_COMM_NULL;
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
        int local_rank = 0;
        MPI_Comm_rank(node, &local_rank);
        MPI_Comm_free(&node);
        // The process's device, by local rank (no placement here).
        const cuda::DeviceChoice c = cuda::select_device(cuda::DeviceHint{-1, 0, local_rank});
        CHECK(c.device == local_rank % cuda::device_count().count, "device ", c.device, " for local rank ", local_rank);
        CHECK(cuda::selected_device() == c.device && cuda::use_device(cuda::DeviceHint{}) == c.device,
              "selected_device ", cuda::selected_device());
        const std::vector<int> pci = cuda::devices_in_pci_order();
        CHECK(static_cast<int>(pci.size()) == cuda::device_count().count, "PCI order of ", pci.size(), " devices");

        cuda::DeviceBuffer d(1000, true);
        CHECK(cuda::is_device_pointer(d.get()) && d.bytes() == 1000, "DeviceBuffer");
        Bytes h(1000, 0xff);
        DSM_CHECK_CUDA(cudaMemcpy(h.data(), d.get(), 1000, cudaMemcpyDeviceToHost));
        CHECK(h == Bytes(1000, 0), "DeviceBuffer not zeroed");
        cuda::DeviceBuffer moved = std::move(d);
        CHECK(d.get() == nullptr && moved.bytes() == 1000, "moved DeviceBuffer");
        cuda::PinnedBuffer pinned(4096);
        CHECK(pinned.get() != nullptr && !cuda::is_device_pointer(pinned.get()), "PinnedBuffer");
        cuda::Stream s = cuda::Stream::create();
        DSM_CHECK_CUDA(cudaMemsetAsync(moved.get(), 1, 1000, s.get()));
        DSM_CHECK_CUDA(cudaMemcpyAsync(pinned.get(), moved.get(), 1000, cudaMemcpyDeviceToHost, s.get()));
        s.synchronize();
        CHECK(std::memcmp(pinned.get(), Bytes(1000, 1).data(), 1000) == 0, "Stream copy");
        {
            const cuda::DeviceGuard g(c.device);
            int now = -1;
            DSM_CHECK_CUDA(cudaGetDevice(&now));
            CHECK(now == c.device, "DeviceGuard");
        }
    });
#endif
}

void test_gpu_allreduce(void **) {
    SKIP_WITHOUT_GPU();
#if DSM_HAVE_NCCL_BACKEND
    guarded([] {
        Pair be = make_pair();
        CHECK(std::string(be.nccl->name()) == "nccl" && be.nccl->size() == test_size && be.nccl->rank() == test_rank,
              "nccl backend identity");
        uint64_t seed = 1;
        for (dsm_dtype_t t : kFloatTypes)
            for (Op op : kOps)
                for (size_t count : {size_t(0), size_t(1), size_t(7), size_t(1000), size_t(65537)}) {
                    const std::string what = label("allreduce", t, count);
                    const Bytes in = make_data(t, ++seed, test_rank, count);
                    Bytes want(in.size());
                    be.mpi->allreduce(in.data(), want.data(), count, t, op);
                    Dev send(in), recv(in.size());
                    be.nccl->allreduce(send.get(), recv.get(), count, t, op);
                    CHECK(recv.host() == want, what, ": differs from the mpi backend");
                    CHECK(send.host() == in, what, ": send was modified");
                    be.nccl->allreduce(send.get(), send.get(), count, t, op);
                    CHECK(send.host() == want, what, " in place: differs from the mpi backend");
                }
        be.nccl->barrier();
    });
#endif
}

void test_gpu_reduce_scatterv(void **) {
    SKIP_WITHOUT_GPU();
#if DSM_HAVE_NCCL_BACKEND
    guarded([] {
        Pair be = make_pair();
        const size_t me = static_cast<size_t>(test_rank);
        uint64_t seed = 100;
        for (bool uneven : {true, false})
            for (size_t scale : {size_t(1), size_t(1000)})
                for (dsm_dtype_t t : kFloatTypes)
                    for (Op op : kOps) {
                        const std::vector<size_t> counts = block_counts(uneven, scale);
                        size_t total = 0;
                        const std::vector<size_t> offs = offsets(counts, &total);
                        const size_t es = esize(t);
                        const std::string what = label(uneven ? "reduce_scatterv uneven" : "reduce_scatterv equal",
                                                       t, total);
                        const Bytes in = make_data(t, ++seed, test_rank, total);
                        Bytes want(counts[me] * es);
                        be.mpi->reduce_scatterv(in.data(), want.data(), counts, t, op);
                        Dev send(in), recv(want.size());
                        be.nccl->reduce_scatterv(send.get(), recv.get(), counts, t, op);
                        CHECK(recv.host() == want, what, ": differs from the mpi backend");
                        // In place: the result lands on this member's block of send.
                        be.nccl->reduce_scatterv(send.get(), send.get() + offs[me] * es, counts, t, op);
                        const Bytes after = send.host();
                        CHECK(Bytes(after.begin() + static_cast<long>(offs[me] * es),
                                    after.begin() + static_cast<long>((offs[me] + counts[me]) * es)) == want,
                              what, " in place: differs from the mpi backend");
                        if (!uneven) {
                            // The equal form through the base class.
                            Dev send2(in), recv2(want.size());
                            be.nccl->reduce_scatter(send2.get(), recv2.get(), counts[0], t, op);
                            CHECK(recv2.host() == want, what, " reduce_scatter: differs from the mpi backend");
                        }
                    }
    });
#endif
}

void test_gpu_allgatherv(void **) {
    SKIP_WITHOUT_GPU();
#if DSM_HAVE_NCCL_BACKEND
    guarded([] {
        Pair be = make_pair();
        const size_t me = static_cast<size_t>(test_rank);
        uint64_t seed = 200;
        for (bool uneven : {true, false})
            for (size_t scale : {size_t(1), size_t(1000)})
                for (dsm_dtype_t t : kAllTypes) {
                    const std::vector<size_t> counts = block_counts(uneven, scale);
                    size_t total = 0;
                    const std::vector<size_t> offs = offsets(counts, &total);
                    const size_t es = esize(t);
                    const std::string what = label(uneven ? "allgatherv uneven" : "allgatherv equal", t, total);
                    const Bytes in = make_data(t, ++seed, test_rank, counts[me]);
                    Bytes want(total * es);
                    be.mpi->allgatherv(in.data(), want.data(), counts, t);
                    Dev send(in), recv(want.size());
                    be.nccl->allgatherv(send.get(), recv.get(), counts, t);
                    CHECK(recv.host() == want, what, ": differs from the mpi backend");
                    // In place: this member's block already lies in recv.
                    Bytes start(total * es, 0);
                    std::copy(in.begin(), in.end(), start.begin() + static_cast<long>(offs[me] * es));
                    Dev both(start);
                    be.nccl->allgatherv(both.get() + offs[me] * es, both.get(), counts, t);
                    CHECK(both.host() == want, what, " in place: differs from the mpi backend");
                }
    });
#endif
}

void test_gpu_alltoallv(void **) {
    SKIP_WITHOUT_GPU();
#if DSM_HAVE_NCCL_BACKEND
    guarded([] {
        Pair be = make_pair();
        const size_t n = static_cast<size_t>(test_size), me = static_cast<size_t>(test_rank);
        uint64_t seed = 300;
        for (size_t scale : {size_t(1), size_t(777)})
            for (dsm_dtype_t t : kAllTypes) {
                // Member p sends (p + 2q) % 5 * scale elements to q (some zero),
                // each block after a gap of q elements.
                std::vector<size_t> sc(n), sd(n), rc(n), rd(n);
                size_t send_end = 0, recv_end = 0;
                for (size_t q = 0; q < n; ++q) {
                    sc[q] = (me + 2 * q) % 5 * scale;
                    rc[q] = (q + 2 * me) % 5 * scale;
                    sd[q] = send_end + q;
                    rd[q] = recv_end + q;
                    send_end = sd[q] + sc[q];
                    recv_end = rd[q] + rc[q];
                }
                const size_t es = esize(t);
                const std::string what = label("alltoallv", t, send_end);
                const Bytes in = make_data(t, ++seed, test_rank, send_end);
                Bytes want(recv_end * es, 0);
                be.mpi->reset_stats();
                be.nccl->reset_stats();
                be.mpi->alltoallv(in.data(), sc, sd, want.data(), rc, rd, t);
                Dev send(in), recv(want.size());
                be.nccl->alltoallv(send.get(), sc, sd, recv.get(), rc, rd, t);
                CHECK(recv.host() == want, what, ": differs from the mpi backend");
                CHECK(be.nccl->stats().bytes_sent == be.mpi->stats().bytes_sent &&
                          be.nccl->stats().calls == be.mpi->stats().calls,
                      what, ": stats ", be.nccl->stats().bytes_sent, " bytes, expected ", be.mpi->stats().bytes_sent);
            }
    });
#endif
}

void test_gpu_bcast_barrier(void **) {
    SKIP_WITHOUT_GPU();
#if DSM_HAVE_NCCL_BACKEND
    guarded([] {
        Pair be = make_pair();
        uint64_t seed = 400;
        for (dsm_dtype_t t : kAllTypes)
            for (int root : {0, test_size - 1})
                for (size_t count : {size_t(0), size_t(1), size_t(1000)}) {
                    const std::string what = dsm::cat(label("bcast", t, count), " root ", root);
                    const Bytes in = make_data(t, ++seed, test_rank, count);
                    Bytes want = in;
                    be.mpi->bcast(want.data(), count, t, root);
                    Dev buf(in);
                    be.nccl->bcast(buf.get(), count, t, root);
                    CHECK(buf.host() == want, what, ": differs from the mpi backend");
                }
        for (int i = 0; i < 3; ++i) be.nccl->barrier();
    });
#endif
}

void test_gpu_alltoall_packed(void **) {
    SKIP_WITHOUT_GPU();
#if DSM_HAVE_NCCL_BACKEND
    guarded([] {
        Pair be = make_pair();
        const size_t n = static_cast<size_t>(test_size), me = static_cast<size_t>(test_rank);
        // p sends q a block of (p * 7 + q * 3) % 11 * 37 bytes (some empty);
        // byte k of it is hash(p, q, k).
        auto bytes = [](size_t p, size_t q) { return (p * 7 + q * 3) % 11 * 37; };
        auto block = [&](size_t p, size_t q) {
            Bytes b(bytes(p, q));
            for (size_t k = 0; k < b.size(); ++k) b[k] = static_cast<unsigned char>(hash(p, static_cast<int>(q), k));
            return b;
        };
        std::vector<size_t> sb(n), rb(n);
        for (size_t q = 0; q < n; ++q) {
            sb[q] = bytes(me, q);
            rb[q] = bytes(q, me);
        }
        std::vector<Bytes> got(n), want(n);
        be.mpi->alltoall_packed(
            sb, rb, [&](int q, void *buf) { std::memcpy(buf, block(me, static_cast<size_t>(q)).data(), sb[q]); },
            [&](int q, const void *buf) {
                const unsigned char *p = static_cast<const unsigned char *>(buf);
                want[static_cast<size_t>(q)].assign(p, p + rb[static_cast<size_t>(q)]);
            });
        // The callbacks get device pointers.
        be.nccl->alltoall_packed(
            sb, rb,
            [&](int q, void *buf) {
                CHECK(cuda::is_device_pointer(buf), "pack got a host pointer");
                const Bytes b = block(me, static_cast<size_t>(q));
                DSM_CHECK_CUDA(cudaMemcpy(buf, b.data(), b.size(), cudaMemcpyHostToDevice));
            },
            [&](int q, const void *buf) {
                Bytes h(rb[static_cast<size_t>(q)]);
                DSM_CHECK_CUDA(cudaMemcpy(h.data(), buf, h.size(), cudaMemcpyDeviceToHost));
                got[static_cast<size_t>(q)] = h;
            });
        for (size_t q = 0; q < n; ++q)
            CHECK(got[q] == want[q] && got[q] == block(q, me), "alltoall_packed block from ", q, " differs");

        // A failing pack on the last member: every member throws, the
        // backend stays usable.
        // (Every block non-empty: an empty one is never packed.)
        const int last = test_size - 1;
        const std::vector<size_t> full(n, 8);
        try {
            be.nccl->alltoall_packed(
                full, full,
                [&](int, void *) {
                    if (test_rank == last) throw std::runtime_error("pack refused");
                },
                [](int, const void *) {});
            record("a failing pack did not throw");
        } catch (const std::exception &e) {
            const std::string text = test_rank == last ? "pack refused" : dsm::cat("member ", last);
            CHECK(std::string(e.what()).find(text) != std::string::npos, "\"", e.what(), "\" lacks \"", text, "\"");
        }
        be.nccl->barrier();
    });
#endif
}

void test_gpu_memory_and_errors(void **) {
    SKIP_WITHOUT_GPU();
#if DSM_HAVE_NCCL_BACKEND
    guarded([] {
        Pair be = make_pair();
        void *p = be.nccl->alloc_shared(1000);
        CHECK(cuda::is_device_pointer(p), "alloc_shared gave host memory");
        Bytes h(1000, 0xff);
        DSM_CHECK_CUDA(cudaMemcpy(h.data(), p, 1000, cudaMemcpyDeviceToHost));
        CHECK(h == Bytes(1000, 0), "alloc_shared memory not zeroed");
        // A collective on it, then free.
        be.nccl->allreduce(p, p, 250, DSM_FLOAT32, Op::SUM);
        be.nccl->free_shared(p);
        be.nccl->free_shared(nullptr);
        int local = 0;
        EXPECT_ERROR(be.nccl->free_shared(&local), DSM_ERR_INVALID_ARGUMENT, "was not returned by alloc_shared");

        // Argument errors are local and leave the backend usable.
        std::vector<float> host(16, 1.0f);
        Dev dev(Bytes(64, 0));
        EXPECT_ERROR(be.nccl->allreduce(host.data(), dev.get(), 16, DSM_FLOAT32, Op::SUM), DSM_ERR_INVALID_ARGUMENT,
                     "send (");
        EXPECT_ERROR(be.nccl->allreduce(dev.get(), host.data(), 16, DSM_FLOAT32, Op::SUM), DSM_ERR_INVALID_ARGUMENT,
                     "is not CUDA device memory");
        EXPECT_ERROR(be.nccl->allreduce(dev.get(), dev.get(), 16, DSM_INT32, Op::SUM), DSM_ERR_INVALID_ARGUMENT,
                     "int32");
        EXPECT_ERROR(be.nccl->allreduce(nullptr, dev.get(), 16, DSM_FLOAT32, Op::SUM), DSM_ERR_NULL_POINTER, "send");
        EXPECT_ERROR(be.nccl->reduce_scatterv(dev.get(), dev.get(), std::vector<size_t>(1 + test_size, 1),
                                              DSM_FLOAT32, Op::SUM),
                     DSM_ERR_INVALID_ARGUMENT, "entries");
        EXPECT_ERROR(be.nccl->bcast(dev.get(), 4, DSM_FLOAT32, test_size), DSM_ERR_INVALID_ARGUMENT, "root");
        be.nccl->barrier();

        // After abandon() every call throws DSM_ERR_STATE; memory still frees.
        void *q = be.nccl->alloc_shared(64);
        be.nccl->abandon();
        EXPECT_ERROR(be.nccl->barrier(), DSM_ERR_STATE, "abandoned");
        be.nccl->free_shared(q);
    });
#endif
}

} // namespace

// The "mpi" backend on device buffers (staged through pinned host memory, or
// given to a CUDA-aware MPI) against the same backend on host copies. Ranks
// may share a device here, so one GPU for the whole job is enough.
void test_gpu_mpi_device_buffers(void **) {
#if !DSM_HAVE_NCCL_BACKEND
    if (test_rank == 0) print_message("skipped: libdsm was built without CUDA and NCCL\n");
    skip();
#else
    {
        const cuda::DeviceCount dc = cuda::device_count();
        int mine = dc.count > 0 ? 1 : 0, all = 0;
        MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        if (!all) {
            if (test_rank == 0) print_message("skipped: a rank has no usable CUDA device\n");
            skip();
            return;
        }
    }
    guarded([] {
        MPI_Comm node = MPI_COMM_NULL;
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
        int local_rank = 0;
        MPI_Comm_rank(node, &local_rank);
        MPI_Comm_free(&node);
        cuda::set_device(local_rank % cuda::device_count().count);
        auto mpi = dsm::comm::create_backend(MPI_COMM_WORLD, Kind::MPI);
        const size_t me = static_cast<size_t>(test_rank), n = static_cast<size_t>(test_size);
        uint64_t seed = 900;
        for (dsm_dtype_t t : kFloatTypes)
            for (size_t count : {size_t(1), size_t(4097)}) {
                const size_t es = esize(t);
                for (Op op : kOps) {
                    const Bytes in = make_data(t, ++seed, test_rank, count);
                    Bytes want(in.size());
                    mpi->allreduce(in.data(), want.data(), count, t, op);
                    Dev send(in), recv(in.size());
                    mpi->allreduce(send.get(), recv.get(), count, t, op);
                    CHECK(recv.host() == want, label("staged allreduce", t, count), ": differs from host buffers");
                    mpi->allreduce(send.get(), send.get(), count, t, op);
                    CHECK(send.host() == want, label("staged allreduce in place", t, count), ": differs");
                }
                const std::vector<size_t> counts = block_counts(true, count);
                size_t total = 0;
                const std::vector<size_t> offs = offsets(counts, &total);
                const Bytes full = make_data(t, ++seed, test_rank, total);
                Bytes part(counts[me] * es);
                mpi->reduce_scatterv(full.data(), part.data(), counts, t, Op::SUM);
                Dev dfull(full), dpart(part.size());
                mpi->reduce_scatterv(dfull.get(), dpart.get(), counts, t, Op::SUM);
                CHECK(dpart.host() == part, label("staged reduce_scatterv", t, total), ": differs");
                Bytes gathered(total * es);
                mpi->allgatherv(part.data(), gathered.data(), counts, t);
                Dev dgathered(gathered.size());
                mpi->allgatherv(dpart.get(), dgathered.get(), counts, t);
                CHECK(dgathered.host() == gathered, label("staged allgatherv", t, total), ": differs");
                // alltoallv: count elements to every member.
                std::vector<size_t> c(n, count), d(n);
                for (size_t q = 0; q < n; ++q) d[q] = q * count;
                const Bytes a = make_data(t, ++seed, test_rank, n * count);
                Bytes b(a.size());
                mpi->alltoallv(a.data(), c, d, b.data(), c, d, t);
                Dev da(a), db(a.size());
                mpi->alltoallv(da.get(), c, d, db.get(), c, d, t);
                CHECK(db.host() == b, label("staged alltoallv", t, n * count), ": differs");
                Bytes root = make_data(t, ++seed, 0, count);
                Dev droot(test_rank == 0 ? root : Bytes(root.size(), 0));
                mpi->bcast(droot.get(), count, t, 0);
                CHECK(droot.host() == root, label("staged bcast", t, count), ": differs");
            }
    });
#endif
}

// ZeRO-Offload on a real device: the values the engine gives are device
// memory, the gradients written there reach the host optimizer, and training
// ends with the same bits as the host engine, at every stage, with the
// parameters' copies after each step made from pageable and from page-locked
// (pin_memory) host memory. Ranks may share a device.
void test_gpu_offload_engine(void **) {
#if !DSM_HAVE_CUDA
    if (test_rank == 0) print_message("skipped: libdsm was built without CUDA\n");
    skip();
#else
    if (!all_have_devices()) {
        if (test_rank == 0) print_message("skipped: a rank has no usable CUDA device\n");
        skip();
        return;
    }
    guarded([] {
        const int64_t shape[2] = {33, 17};
        const size_t n = 33 * 17;
        std::vector<float> init(n);
        for (size_t i = 0; i < n; ++i) init[i] = 0.01f * static_cast<float>(static_cast<int>(i % 97) - 48);
        auto train = [&](int stage, bool offload, bool pin, std::vector<float> &out) {
            char cfg[512];
            std::snprintf(cfg, sizeof cfg,
                          "{\"train_micro_batch_size_per_gpu\": 1, \"gradient_accumulation_steps\": 2,"
                          " \"steps_per_print\": 1000000, \"zero_optimization\": {\"stage\": %d,"
                          " \"reduce_bucket_size\": 100, \"stage3_param_persistence_threshold\": 10%s%s},"
                          " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}}}",
                          stage,
                          !offload ? ""
                          : pin    ? ", \"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": true}"
                                   : ", \"offload_optimizer\": {\"device\": \"cpu\"}",
                          offload && stage == 3 ? ", \"offload_param\": {\"device\": \"cpu\"}" : "");
            dsm_param_desc_t d{};
            d.name = "w";
            d.ndims = 2;
            d.shape = shape;
            d.dtype = DSM_FLOAT32;
            d.trainable = 1;
            d.init_values = init.data();
            dsm_engine_t e = nullptr;
            // The model state on the host (auto would keep it on the device
            // without offload): offload's device copies against host memory.
            setenv("DSM_ENGINE_DEVICE", "host", 1);
            const dsm_status_t st = dsm_engine_init_comm(MPI_COMM_WORLD, cfg, &d, 1, &e);
            unsetenv("DSM_ENGINE_DEVICE");
            CHECK(st == DSM_SUCCESS, "init: ", dsm_last_error());
            if (e == nullptr) return;
            std::vector<float> v(n), g(n);
            for (int micro = 0; micro < 6; ++micro) {
                const void *pv = nullptr;
                void *pg = nullptr;
                CHECK(dsm_engine_param_acquire(e, 0, &pv) == DSM_SUCCESS, dsm_last_error());
                CHECK(dsm_engine_grad_acquire(e, 0, &pg) == DSM_SUCCESS, dsm_last_error());
                CHECK(cuda::is_device_pointer(pv) == offload && cuda::is_device_pointer(pg) == offload,
                      "stage ", stage, ": device pointers ", cuda::is_device_pointer(pv), cuda::is_device_pointer(pg));
                cuda::copy_bytes(v.data(), pv, n * sizeof(float));
                cuda::copy_bytes(g.data(), pg, n * sizeof(float));
                for (size_t i = 0; i < n; ++i)
                    g[i] += v[i] - 0.1f * static_cast<float>((test_rank + 1) * (i % 5)) + 0.01f * static_cast<float>(micro);
                cuda::copy_bytes(pg, g.data(), n * sizeof(float));
                CHECK(dsm_engine_grad_release(e, 0) == DSM_SUCCESS, dsm_last_error());
                CHECK(dsm_engine_param_release(e, 0) == DSM_SUCCESS, dsm_last_error());
                CHECK(dsm_step(e, nullptr) == DSM_SUCCESS, dsm_last_error());
            }
            const void *pv = nullptr;
            CHECK(dsm_engine_param_acquire(e, 0, &pv) == DSM_SUCCESS, dsm_last_error());
            out.resize(n);
            cuda::copy_bytes(out.data(), pv, n * sizeof(float));
            CHECK(dsm_engine_param_release(e, 0) == DSM_SUCCESS, dsm_last_error());
            CHECK(dsm_engine_free(&e) == DSM_SUCCESS, dsm_last_error());
        };
        for (int stage = 0; stage <= 3; ++stage) {
            std::vector<float> host;
            train(stage, false, false, host);
            for (int pin = 0; pin <= 1; ++pin) {
                std::vector<float> dev;
                train(stage, true, pin != 0, dev);
                CHECK(host.size() == dev.size() &&
                          std::memcmp(host.data(), dev.data(), host.size() * sizeof(float)) == 0,
                      "stage ", stage, pin ? " (pin_memory)" : "",
                      ": training with offload on the GPU differs from the host engine");
            }
        }
    });
#endif
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_choose_device),
        cmocka_unit_test(test_mesh_hint),
        cmocka_unit_test(test_device_override_parsing),
        cmocka_unit_test(test_device_count_and_errors),
        cmocka_unit_test(test_cuda_aware_mpi),
        cmocka_unit_test(test_nccl_kind_without_device),
        cmocka_unit_test(test_shared_device),
        cmocka_unit_test(test_gpu_device_types),
        cmocka_unit_test(test_gpu_allreduce),
        cmocka_unit_test(test_gpu_reduce_scatterv),
        cmocka_unit_test(test_gpu_allgatherv),
        cmocka_unit_test(test_gpu_alltoallv),
        cmocka_unit_test(test_gpu_bcast_barrier),
        cmocka_unit_test(test_gpu_alltoall_packed),
        cmocka_unit_test(test_gpu_memory_and_errors),
        cmocka_unit_test(test_gpu_mpi_device_buffers),
        cmocka_unit_test(test_gpu_offload_engine),
    };
    return RUN_MPI_TESTS("test_cuda", tests);
}
