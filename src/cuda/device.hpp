// The CUDA runtime layer: whether a device is usable, which device this rank
// uses, RAII owners of streams and memory, CUDA-aware MPI detection, and the
// error check that turns a CUDA error into dsm::Error. Not a memory space
// (those are src/device/, the CUDA one cuda_space.cc) and no kernels (those
// are src/optim/*_cuda.cu): see README.md in this folder.
//
// No CUDA type appears here, so any file may include this header: a stream
// is a `CUstream_st *`, which is what cudaStream_t is. Built without CUDA
// (DSM_HAVE_CUDA 0) the same functions exist: device_count() reports 0
// devices with the reason, and whatever needs a device throws
// DSM_ERR_NOT_SUPPORTED.
//
// Errors: a failed CUDA call throws dsm::Error DSM_ERR_CUDA with the call and
// CUDA's error name and string (DSM_CHECK_CUDA). Destructors never throw.
// Nothing here is collective.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

struct CUstream_st; // cudaStream_t is CUstream_st *
struct CUevent_st;  // cudaEvent_t is CUevent_st *

namespace dsm {
struct MeshState;
class Mesh;

namespace cuda {

// ---------------------------------------------------------------- devices

// What cudaGetDeviceCount says. A machine without a driver or without a
// device, or a build without CUDA, is a normal answer: count 0 and the
// reason ("built without CUDA", "cudaGetDeviceCount: no CUDA-capable device
// is detected (cudaErrorNoDevice)", ...). Any other failure of the call is
// reported the same way: the caller's question is whether a device is usable.
struct DeviceCount {
    int count = 0;
    std::string reason; // empty when count > 0
};
DeviceCount device_count() noexcept;

// What the mesh placement knows about this rank (topo::Placement and
// topo::RankInfo); the defaults say "nothing".
struct DeviceHint {
    int placement_gpu = -1; // the GPU the placement gave this rank, -1 for none
    int node_gpus = 0;      // GPUs the placement counted on the node
    int local_rank = 0;     // this rank's index among the ranks of its node
};

// The hint of the calling rank of a mesh.
DeviceHint mesh_hint(const MeshState &mesh);
DeviceHint mesh_hint(const Mesh &mesh);

enum class DeviceSource {
    OVERRIDE,   // DSM_CUDA_DEVICE
    PLACEMENT,  // the mesh placement's GPU
    LOCAL_RANK, // node-local rank modulo the device count
};
const char *source_name(DeviceSource source) noexcept; // "DSM_CUDA_DEVICE", "placement", "local rank"

struct DeviceChoice {
    int device = -1; // a CUDA device ordinal, 0 <= device < count
    DeviceSource source = DeviceSource::LOCAL_RANK;
};

// The value of DSM_CUDA_DEVICE: -1 when `value` is empty (not set), else a
// decimal device number 0 <= n <= INT_MAX without sign, space or suffix;
// anything else is DSM_ERR_INVALID_ARGUMENT naming the variable and value.
int parse_device_override(const std::string &value);

// Which device a rank uses, as a pure function of what it sees (tests call it
// with made-up counts):
// 1. `override_device` (>= 0: DSM_CUDA_DEVICE) when it is below `count`, else
//    DSM_ERR_INVALID_ARGUMENT naming it and the count;
// 2. the placement's GPU when there is one and the process sees exactly the
//    GPUs the placement counted (count == node_gpus): the placement numbers a
//    node's GPUs in PCI bus order (hwloc), so GPU i is pci_order[i], the CUDA
//    ordinal of the i-th device by PCI domain, bus and device (empty:
//    the identity). A process that sees another number of devices
//    (CUDA_VISIBLE_DEVICES, DSM_SIM_GPUS) cannot map the index and falls
//    through to 3;
// 3. local_rank % count.
// count <= 0 is DSM_ERR_NOT_SUPPORTED; a negative local rank or a pci_order
// that is not a permutation of 0..count-1 is DSM_ERR_INVALID_ARGUMENT.
DeviceChoice choose_device(int count, int override_device, const DeviceHint &hint,
                           const std::vector<int> &pci_order);

// The CUDA ordinals of this process's devices sorted by PCI domain, bus and
// device (cudaGetDeviceProperties).
std::vector<int> devices_in_pci_order();

// The PCI bus id of `device` ("0000:3b:00.0"): the same name for a GPU in
// every process of a node, whatever CUDA_VISIBLE_DEVICES each one has.
// DSM_ERR_CUDA, or DSM_ERR_NOT_SUPPORTED in a build without CUDA.
std::string pci_bus_id(int device);

// The first two positions of `ids` that hold the same bus id, {-1, -1} when
// all differ (ranks of a node that would share a GPU).
std::pair<int, int> first_shared(const std::vector<std::string> &ids);

// Choose this process's device (choose_device() with the real count, PCI order
// and DSM_CUDA_DEVICE), make it current (cudaSetDevice) and remember it for
// the process. DSM_ERR_NOT_SUPPORTED with device_count()'s reason when no
// device is usable. Logs the choice and its source at INFO.
DeviceChoice select_device(const DeviceHint &hint);

// The device select_device() chose for this process, -1 before.
int selected_device() noexcept;

// The device select_device() chose, made current for the calling thread;
// when none was chosen yet, select_device(fallback).
int use_device(const DeviceHint &fallback);

// cudaSetDevice(device); DSM_ERR_CUDA.
void set_device(int device);

// Makes `device` current for a scope and restores the previous device after.
class DeviceGuard {
public:
    explicit DeviceGuard(int device);
    ~DeviceGuard();
    DeviceGuard(const DeviceGuard &) = delete;
    DeviceGuard &operator=(const DeviceGuard &) = delete;

private:
    int previous_ = -1;
};

// ---------------------------------------------------------------- memory and streams

// Whether `p` points into memory a CUDA device reads directly: cudaMalloc'd
// (cudaMemoryTypeDevice) or managed memory. False for host memory, pinned or
// not, for NULL, without a driver, and without CUDA.
bool is_device_pointer(const void *p) noexcept;

// Set `bytes` of device memory to zero and wait until it is done
// (cudaMemset). DSM_ERR_CUDA; DSM_ERR_NOT_SUPPORTED without CUDA.
void zero_bytes(void *p, size_t bytes);

// Free what DeviceBuffer::release() or PinnedBuffer::release() gave up
// (cudaFree, cudaFreeHost); NULL is ignored. Never throw.
void free_device(void *p) noexcept;
void free_pinned(void *p) noexcept;

// Copy `bytes` between any two of host, pinned and device memory
// (cudaMemcpy with cudaMemcpyDefault: the pointers say which way), waiting
// until the copy is done. DSM_ERR_CUDA; DSM_ERR_NOT_SUPPORTED without CUDA.
void copy_bytes(void *dst, const void *src, size_t bytes);

// Enqueue a copy of `bytes` on `stream` (cudaMemcpyAsync, cudaMemcpyDefault)
// and return; it runs asynchronously when the host side is pinned memory.
// DSM_ERR_CUDA; DSM_ERR_NOT_SUPPORTED without CUDA.
void copy_bytes_async(void *dst, const void *src, size_t bytes, CUstream_st *stream);

// An owned stream, on the device current at creation. Move-only; empty
// (NULL) when default-constructed.
class Stream {
public:
    Stream() = default;
    // cudaStreamCreate: a blocking stream, so work on the legacy default
    // stream is ordered with it. DSM_ERR_CUDA.
    static Stream create();
    ~Stream();
    Stream(Stream &&o) noexcept;
    Stream &operator=(Stream &&o) noexcept;
    Stream(const Stream &) = delete;
    Stream &operator=(const Stream &) = delete;

    CUstream_st *get() const noexcept { return stream_; }
    // cudaStreamSynchronize; DSM_ERR_CUDA.
    void synchronize() const;
    // Whether everything enqueued so far is done (cudaStreamQuery), without
    // waiting; DSM_ERR_CUDA for an error of the stream's work.
    bool idle() const;
    void reset() noexcept;

private:
    explicit Stream(CUstream_st *s) noexcept : stream_(s) {}
    CUstream_st *stream_ = nullptr;
};

// An owned event marking a point of a stream (cudaEventCreateWithFlags with
// timing disabled, on the device current at creation). Move-only; empty
// (NULL) when default-constructed.
class Event {
public:
    Event() = default;
    // DSM_ERR_CUDA.
    static Event create();
    ~Event() { reset(); }
    Event(Event &&o) noexcept;
    Event &operator=(Event &&o) noexcept;
    Event(const Event &) = delete;
    Event &operator=(const Event &) = delete;

    // Mark the work enqueued on `stream` so far (cudaEventRecord); DSM_ERR_CUDA.
    void record(CUstream_st *stream);
    // Wait until the marked work is done (cudaEventSynchronize); DSM_ERR_CUDA
    // for an error of that work.
    void synchronize() const;
    void reset() noexcept;

private:
    CUevent_st *event_ = nullptr;
};

// Page-lock existing host memory for the object's lifetime
// (cudaHostRegister / cudaHostUnregister), so that asynchronous copies from
// and to it need no staging. Registration may fail (memory the driver cannot
// lock, a limit on locked memory): registered() is then false and the memory
// stays usable as ordinary pageable memory; nothing throws. Move-only.
class HostRegistration {
public:
    HostRegistration() = default;
    HostRegistration(void *p, size_t bytes) noexcept;
    ~HostRegistration() { reset(); }
    HostRegistration(HostRegistration &&o) noexcept;
    HostRegistration &operator=(HostRegistration &&o) noexcept;
    HostRegistration(const HostRegistration &) = delete;
    HostRegistration &operator=(const HostRegistration &) = delete;

    bool registered() const noexcept { return ptr_ != nullptr; }
    size_t bytes() const noexcept { return bytes_; }
    // Why registration failed ("" when it did not).
    const std::string &reason() const noexcept { return reason_; }
    void reset() noexcept;

private:
    void *ptr_ = nullptr;
    size_t bytes_ = 0;
    std::string reason_;
};

// Memory of the CUDA runtime, owned: Free (free_device or free_pinned)
// gives it back on reset() and destruction. Move-only; empty (NULL) when
// default-constructed. The two kinds below differ only in how they allocate.
template <void (*Free)(void *) noexcept> class CudaMemory {
public:
    CudaMemory() = default;
    ~CudaMemory() { reset(); }
    CudaMemory(CudaMemory &&o) noexcept
        : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
    CudaMemory &operator=(CudaMemory &&o) noexcept {
        if (this != &o) {
            reset();
            ptr_ = std::exchange(o.ptr_, nullptr);
            bytes_ = std::exchange(o.bytes_, 0);
        }
        return *this;
    }
    CudaMemory(const CudaMemory &) = delete;
    CudaMemory &operator=(const CudaMemory &) = delete;

    void *get() const noexcept { return ptr_; }
    size_t bytes() const noexcept { return bytes_; }
    void reset() noexcept {
        Free(ptr_);
        ptr_ = nullptr;
        bytes_ = 0;
    }
    // Give the memory up: the caller frees it with Free.
    void *release() noexcept {
        bytes_ = 0;
        return std::exchange(ptr_, nullptr);
    }

protected:
    // Take ownership of `bytes` at p, just allocated (the object is empty).
    void adopt(void *p, size_t bytes) noexcept {
        ptr_ = p;
        bytes_ = bytes;
    }

private:
    void *ptr_ = nullptr;
    size_t bytes_ = 0;
};

// Device memory (cudaMalloc on the current device), at least 256-byte
// aligned, zeroed when asked; freed with free_device().
class DeviceBuffer : public CudaMemory<free_device> {
public:
    DeviceBuffer() = default;
    explicit DeviceBuffer(size_t bytes, bool zero = false);
};

// Page-locked host memory (cudaMallocHost), which the devices read and write
// directly and copies to or from run asynchronously; freed with free_pinned().
class PinnedBuffer : public CudaMemory<free_pinned> {
public:
    PinnedBuffer() = default;
    explicit PinnedBuffer(size_t bytes);
};

// ---------------------------------------------------------------- MPI

// Whether the MPI library moves device memory itself, asked at run time
// (after MPI_Init): Open MPI's MPIX_Query_cuda_support() from <mpi-ext.h>
// where the header defines MPIX_CUDA_AWARE_SUPPORT; false for other MPI
// libraries, which libdsm cannot ask.
bool cuda_aware_mpi() noexcept;

// ---------------------------------------------------------------- errors

namespace detail {
// Throw DSM_ERR_CUDA for CUDA error `code` (a cudaError_t) returned by `call`.
[[noreturn]] void cuda_fail(int code, const char *call, const char *file, int line);
} // namespace detail

} // namespace cuda
} // namespace dsm

// DSM_CHECK_CUDA(call): a CUDA runtime error (cudaSuccess is 0) becomes
// DSM_ERR_CUDA with the call and CUDA's error name and string.
#define DSM_CHECK_CUDA(call)                                                                 \
    do {                                                                                     \
        const int dsm_cuda_rc_ = static_cast<int>(call);                                     \
        if (dsm_cuda_rc_ != 0)                                                               \
            ::dsm::cuda::detail::cuda_fail(dsm_cuda_rc_, #call, __FILE__, __LINE__);         \
    } while (0)
