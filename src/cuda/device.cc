// The CUDA runtime layer (see device.hpp). Every CUDA call sits behind
// DSM_HAVE_CUDA; without it the functions report 0 devices or throw
// DSM_ERR_NOT_SUPPORTED.
#include "dsm_config.h"

#include "cuda/device.hpp"

#include <algorithm>
#include <atomic>
#include <climits>
#include <tuple>
#include <utility>

#include <mpi.h>
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h> // Open MPI: MPIX_CUDA_AWARE_SUPPORT, MPIX_Query_cuda_support()
#endif

#if DSM_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include "core/error.hpp"
#include "core/log.hpp"
#include "core/param.hpp"
#include "mesh/mesh.hpp"

namespace dsm {
namespace cuda {

namespace {

DSM_PARAM(cuda, CUDA_DEVICE, param::Parsed<int>("int", "a CUDA device number (0, 1, ...)", parse_device_override, -1),
          "",
          "The CUDA device every rank of the process uses, as CUDA numbers the devices the process sees "
          "(after CUDA_VISIBLE_DEVICES). Empty: the GPU the mesh placement gave the rank when the process "
          "sees all of its node's GPUs, else the rank's index on its node modulo the device count.");

#if !DSM_HAVE_CUDA
[[noreturn]] void no_cuda(const char *what) {
    DSM_FAIL(DSM_ERR_NOT_SUPPORTED, what, ": libdsm was built without CUDA");
}
#endif

std::atomic<int> g_selected{-1}; // select_device()'s choice for the process

} // namespace

// ---------------------------------------------------------------- errors

namespace detail {

void cuda_fail(int code, const char *call, const char *file, int line) {
#if DSM_HAVE_CUDA
    const cudaError_t e = static_cast<cudaError_t>(code);
    // Reset the thread's last error, so that a later unrelated check does not
    // report this one again (sticky errors stay whatever we do).
    (void)cudaGetLastError();
    throw_error(DSM_ERR_CUDA, cat(call, " failed: ", cudaGetErrorString(e), " (", cudaGetErrorName(e), ")"), file,
                line);
#else
    throw_error(DSM_ERR_CUDA, cat(call, " failed with CUDA error ", code), file, line);
#endif
}

} // namespace detail

// ---------------------------------------------------------------- devices

DeviceCount device_count() noexcept {
#if DSM_HAVE_CUDA
    int n = 0;
    const cudaError_t rc = cudaGetDeviceCount(&n);
    if (rc != cudaSuccess) {
        (void)cudaGetLastError();
        return {0, cat("cudaGetDeviceCount: ", cudaGetErrorString(rc), " (", cudaGetErrorName(rc), ")")};
    }
    if (n <= 0) return {0, "cudaGetDeviceCount: no CUDA device"};
    return {n, std::string()};
#else
    return {0, "libdsm was built without CUDA"};
#endif
}

DeviceHint mesh_hint(const MeshState &mesh) {
    DeviceHint h;
    const size_t r = static_cast<size_t>(mesh.rank);
    if (r < mesh.placement.gpu_of_rank.size()) h.placement_gpu = mesh.placement.gpu_of_rank[r];
    if (r < mesh.ranks.size()) {
        h.node_gpus = mesh.ranks[r].node_gpus;
        h.local_rank = mesh.ranks[r].local_rank;
    }
    return h;
}

DeviceHint mesh_hint(const Mesh &mesh) { return mesh_hint(mesh.state()); }

const char *source_name(DeviceSource source) noexcept {
    switch (source) {
    case DeviceSource::OVERRIDE: return "DSM_CUDA_DEVICE";
    case DeviceSource::PLACEMENT: return "placement";
    case DeviceSource::LOCAL_RANK: return "local rank";
    }
    return "invalid";
}

int parse_device_override(const std::string &value) {
    if (value.empty()) return -1;
    const bool digits = value.size() <= 10 && std::all_of(value.begin(), value.end(), [](char c) {
                            return c >= '0' && c <= '9';
                        });
    const long long v = digits ? std::stoll(value) : -1;
    DSM_REQUIRE(digits && v <= INT_MAX, DSM_ERR_INVALID_ARGUMENT, "environment DSM_CUDA_DEVICE=\"", value,
                "\": expected a CUDA device number (0, 1, ...)");
    return static_cast<int>(v);
}

DeviceChoice choose_device(int count, int override_device, const DeviceHint &hint,
                           const std::vector<int> &pci_order) {
    DSM_REQUIRE(count > 0, DSM_ERR_NOT_SUPPORTED, "no CUDA device is usable (", count, " devices)");
    if (override_device >= 0) {
        DSM_REQUIRE(override_device < count, DSM_ERR_INVALID_ARGUMENT, "DSM_CUDA_DEVICE=", override_device,
                    " is not a device of this process: it sees ", count,
                    count == 1 ? " CUDA device (0)" : cat(" CUDA devices (0 to ", count - 1, ")"));
        return {override_device, DeviceSource::OVERRIDE};
    }
    DSM_REQUIRE(hint.local_rank >= 0, DSM_ERR_INVALID_ARGUMENT, "local rank ", hint.local_rank, " is negative");
    if (!pci_order.empty()) {
        std::vector<int> sorted = pci_order;
        std::sort(sorted.begin(), sorted.end());
        bool permutation = sorted.size() == static_cast<size_t>(count);
        for (size_t i = 0; permutation && i < sorted.size(); ++i) permutation = sorted[i] == static_cast<int>(i);
        DSM_REQUIRE(permutation, DSM_ERR_INVALID_ARGUMENT, "the PCI order of ", pci_order.size(),
                    " devices is not a permutation of the ", count, " devices");
    }
    if (hint.placement_gpu >= 0 && hint.placement_gpu < count && hint.node_gpus == count) {
        const size_t i = static_cast<size_t>(hint.placement_gpu);
        return {pci_order.empty() ? hint.placement_gpu : pci_order[i], DeviceSource::PLACEMENT};
    }
    return {hint.local_rank % count, DeviceSource::LOCAL_RANK};
}

std::vector<int> devices_in_pci_order() {
#if DSM_HAVE_CUDA
    int n = 0;
    DSM_CHECK_CUDA(cudaGetDeviceCount(&n));
    std::vector<std::tuple<int, int, int, int>> keys; // domain, bus, device, ordinal
    for (int d = 0; d < n; ++d) {
        int domain = 0, bus = 0, dev = 0;
        DSM_CHECK_CUDA(cudaDeviceGetAttribute(&domain, cudaDevAttrPciDomainId, d));
        DSM_CHECK_CUDA(cudaDeviceGetAttribute(&bus, cudaDevAttrPciBusId, d));
        DSM_CHECK_CUDA(cudaDeviceGetAttribute(&dev, cudaDevAttrPciDeviceId, d));
        keys.emplace_back(domain, bus, dev, d);
    }
    std::sort(keys.begin(), keys.end());
    std::vector<int> order;
    for (const auto &k : keys) order.push_back(std::get<3>(k));
    return order;
#else
    return {};
#endif
}

std::string pci_bus_id(int device) {
#if DSM_HAVE_CUDA
    char id[64] = {0};
    DSM_CHECK_CUDA(cudaDeviceGetPCIBusId(id, static_cast<int>(sizeof id), device));
    return id;
#else
    (void)device;
    no_cuda("cudaDeviceGetPCIBusId");
#endif
}

std::pair<int, int> first_shared(const std::vector<std::string> &ids) {
    for (size_t j = 1; j < ids.size(); ++j)
        for (size_t i = 0; i < j; ++i)
            if (ids[i] == ids[j]) return {static_cast<int>(i), static_cast<int>(j)};
    return {-1, -1};
}

DeviceChoice select_device(const DeviceHint &hint) {
    // The override is checked first, so a bad value fails even without a device.
    const int override_device = param_CUDA_DEVICE().value();
    const DeviceCount dc = device_count();
    DSM_REQUIRE(dc.count > 0, DSM_ERR_NOT_SUPPORTED, "no CUDA device is usable: ", dc.reason);
    const DeviceChoice c = choose_device(dc.count, override_device, hint, devices_in_pci_order());
    set_device(c.device);
    g_selected.store(c.device);
    DSM_INFO(INIT, "CUDA device %d of %d (chosen by %s)", c.device, dc.count, source_name(c.source));
    return c;
}

int selected_device() noexcept { return g_selected.load(); }

int use_device(const DeviceHint &fallback) {
    const int d = g_selected.load();
    if (d < 0) return select_device(fallback).device;
    set_device(d);
    return d;
}

void set_device(int device) {
#if DSM_HAVE_CUDA
    DSM_CHECK_CUDA(cudaSetDevice(device));
#else
    (void)device;
    no_cuda("cudaSetDevice");
#endif
}

DeviceGuard::DeviceGuard(int device) {
#if DSM_HAVE_CUDA
    int current = -1;
    DSM_CHECK_CUDA(cudaGetDevice(&current));
    if (current != device) {
        DSM_CHECK_CUDA(cudaSetDevice(device));
        previous_ = current;
    }
#else
    (void)device;
    no_cuda("cudaSetDevice");
#endif
}

DeviceGuard::~DeviceGuard() {
#if DSM_HAVE_CUDA
    if (previous_ >= 0) (void)cudaSetDevice(previous_);
#endif
}

// ---------------------------------------------------------------- memory and streams

bool is_device_pointer(const void *p) noexcept {
#if DSM_HAVE_CUDA
    if (p == nullptr) return false;
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
#else
    (void)p;
    return false;
#endif
}

void zero_bytes(void *p, size_t bytes) {
#if DSM_HAVE_CUDA
    if (bytes == 0) return;
    DSM_CHECK_CUDA(cudaMemset(p, 0, bytes));
    DSM_CHECK_CUDA(cudaStreamSynchronize(nullptr));
#else
    (void)p, (void)bytes;
    no_cuda("cudaMemset");
#endif
}

void copy_bytes(void *dst, const void *src, size_t bytes) {
#if DSM_HAVE_CUDA
    if (bytes == 0 || dst == src) return;
    DSM_CHECK_CUDA(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
#else
    (void)dst, (void)src, (void)bytes;
    no_cuda("cudaMemcpy");
#endif
}

Stream Stream::create() {
#if DSM_HAVE_CUDA
    cudaStream_t s = nullptr;
    DSM_CHECK_CUDA(cudaStreamCreate(&s));
    return Stream(s);
#else
    no_cuda("cudaStreamCreate");
#endif
}

Stream::~Stream() { reset(); }

Stream::Stream(Stream &&o) noexcept : stream_(std::exchange(o.stream_, nullptr)) {}

Stream &Stream::operator=(Stream &&o) noexcept {
    if (this != &o) {
        reset();
        stream_ = std::exchange(o.stream_, nullptr);
    }
    return *this;
}

void Stream::synchronize() const {
#if DSM_HAVE_CUDA
    if (stream_ != nullptr) DSM_CHECK_CUDA(cudaStreamSynchronize(stream_));
#endif
}

bool Stream::idle() const {
#if DSM_HAVE_CUDA
    if (stream_ == nullptr) return true;
    const cudaError_t rc = cudaStreamQuery(stream_);
    if (rc == cudaErrorNotReady) return false;
    DSM_CHECK_CUDA(rc);
#endif
    return true;
}

void copy_bytes_async(void *dst, const void *src, size_t bytes, CUstream_st *stream) {
#if DSM_HAVE_CUDA
    if (bytes == 0) return;
    DSM_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));
#else
    (void)dst, (void)src, (void)bytes, (void)stream;
    no_cuda("cudaMemcpyAsync");
#endif
}

void Stream::reset() noexcept {
#if DSM_HAVE_CUDA
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
#endif
    stream_ = nullptr;
}

Event Event::create() {
#if DSM_HAVE_CUDA
    Event e;
    DSM_CHECK_CUDA(cudaEventCreateWithFlags(&e.event_, cudaEventDisableTiming));
    return e;
#else
    no_cuda("cudaEventCreateWithFlags");
#endif
}

Event::Event(Event &&o) noexcept : event_(std::exchange(o.event_, nullptr)) {}

Event &Event::operator=(Event &&o) noexcept {
    if (this != &o) {
        reset();
        event_ = std::exchange(o.event_, nullptr);
    }
    return *this;
}

void Event::record(CUstream_st *stream) {
#if DSM_HAVE_CUDA
    DSM_CHECK_CUDA(cudaEventRecord(event_, stream));
#else
    (void)stream;
    no_cuda("cudaEventRecord");
#endif
}

void Event::synchronize() const {
#if DSM_HAVE_CUDA
    if (event_ != nullptr) DSM_CHECK_CUDA(cudaEventSynchronize(event_));
#endif
}

void Event::reset() noexcept {
#if DSM_HAVE_CUDA
    if (event_ != nullptr) (void)cudaEventDestroy(event_);
#endif
    event_ = nullptr;
}

HostRegistration::HostRegistration(void *p, size_t bytes) noexcept {
    if (p == nullptr || bytes == 0) return;
#if DSM_HAVE_CUDA
    const cudaError_t rc = cudaHostRegister(p, bytes, cudaHostRegisterPortable);
    if (rc != cudaSuccess) {
        (void)cudaGetLastError(); // not sticky: the memory stays usable
        try {
            reason_ = cat("cudaHostRegister of ", bytes, " bytes failed: ", cudaGetErrorString(rc));
        } catch (...) {
        }
        return;
    }
    ptr_ = p;
    bytes_ = bytes;
#else
    try {
        reason_ = "libdsm was built without CUDA";
    } catch (...) {
    }
#endif
}

HostRegistration::HostRegistration(HostRegistration &&o) noexcept
    : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)), reason_(std::move(o.reason_)) {}

HostRegistration &HostRegistration::operator=(HostRegistration &&o) noexcept {
    if (this != &o) {
        reset();
        ptr_ = std::exchange(o.ptr_, nullptr);
        bytes_ = std::exchange(o.bytes_, 0);
        reason_ = std::move(o.reason_);
    }
    return *this;
}

void HostRegistration::reset() noexcept {
#if DSM_HAVE_CUDA
    if (ptr_ != nullptr) (void)cudaHostUnregister(ptr_);
#endif
    ptr_ = nullptr;
    bytes_ = 0;
}

#if DSM_HAVE_CUDA
// The outcome of an allocation `call` of `bytes`: DSM_ERR_OUT_OF_MEMORY
// when there is no room (the error is cleared: it is not sticky),
// DSM_ERR_CUDA for any other error.
namespace {
void check_alloc(cudaError_t rc, const char *call, size_t bytes) {
    if (rc == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        DSM_FAIL(DSM_ERR_OUT_OF_MEMORY, call, " of ", bytes, " bytes failed: ", cudaGetErrorString(rc));
    }
    if (rc != cudaSuccess) detail::cuda_fail(rc, call, __FILE__, __LINE__);
}
} // namespace
#endif

DeviceBuffer::DeviceBuffer(size_t bytes, bool zero) {
#if DSM_HAVE_CUDA
    void *p = nullptr;
    const size_t n = std::max<size_t>(bytes, 1);
    check_alloc(cudaMalloc(&p, n), "cudaMalloc", bytes);
    if (zero) {
        // cudaMemset may return before the memory is written: wait for it, so
        // that the zeros are there whatever stream reads them next.
        cudaError_t z = cudaMemset(p, 0, n);
        if (z == cudaSuccess) z = cudaStreamSynchronize(nullptr);
        if (z != cudaSuccess) {
            (void)cudaFree(p);
            detail::cuda_fail(z, "cudaMemset", __FILE__, __LINE__);
        }
    }
    adopt(p, bytes);
#else
    (void)bytes;
    (void)zero;
    no_cuda("cudaMalloc");
#endif
}

void free_device(void *p) noexcept {
#if DSM_HAVE_CUDA
    if (p != nullptr) (void)cudaFree(p);
#else
    (void)p;
#endif
}

PinnedBuffer::PinnedBuffer(size_t bytes) {
#if DSM_HAVE_CUDA
    void *p = nullptr;
    check_alloc(cudaMallocHost(&p, std::max<size_t>(bytes, 1)), "cudaMallocHost", bytes);
    adopt(p, bytes);
#else
    (void)bytes;
    no_cuda("cudaMallocHost");
#endif
}

void free_pinned(void *p) noexcept {
#if DSM_HAVE_CUDA
    if (p != nullptr) (void)cudaFreeHost(p);
#else
    (void)p;
#endif
}

// ---------------------------------------------------------------- MPI

bool cuda_aware_mpi() noexcept {
#if defined(MPIX_CUDA_AWARE_SUPPORT)
    // The macro says how Open MPI was built; the query, how it runs now.
    return MPIX_Query_cuda_support() == 1;
#else
    return false;
#endif
}

} // namespace cuda
} // namespace dsm

DSM_PARAM_LINK(cuda_device)
