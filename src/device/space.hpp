// Memory spaces: where the engine's memory lives and how its math runs on
// that memory. One interface, three implementations:
//
//   host  the CPU: aligned host memory; every call runs before it returns
//         (amp's vectorized loops, the optimizer's SIMD kernels).
//   cuda  a CUDA device: cudaMalloc'd memory, one stream (the engine's own,
//         or the user's: dsm_engine_set_stream); calls enqueue on the stream
//         and return (src/cuda/kernels.cu).
//   sim   a simulated device: host memory of its own, poisoned when
//         allocated (NaN bytes, as device memory holds garbage), with a queue
//         of its own: every call is deferred until synchronize(), a
//         download, a reduction that returns a value, or a collective that
//         waits for the queue (comm::Queue's wait function). It runs the
//         host's kernels, so the device-resident engine on it computes the
//         same bits as the host engine: that is how every device path is
//         tested on a machine without a GPU.
//
// The queue: calls on a space run in the order they were made. Methods that
// return a value from the memory (download, inspect, has_nonfinite) wait for
// what was enqueued before them; synchronize() waits for everything.
// Collectives on the space's memory take queue(): the nccl backend enqueues
// on its stream, host backends wait for it first (comm/backend.hpp).
//
// Errors throw dsm::Error: DSM_ERR_OUT_OF_MEMORY for an allocation,
// DSM_ERR_CUDA for a failed CUDA call, DSM_ERR_NOT_SUPPORTED for a space this
// build or machine cannot provide.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "amp/convert.hpp"
#include "comm/backend.hpp"
#include "dsm.h"

namespace dsm {
namespace device {

enum class Kind { HOST, CUDA, SIM };

class Space {
public:
    virtual ~Space() = default;
    virtual Kind kind() const noexcept = 0;
    // "host", "cuda:N", "simulated".
    virtual std::string name() const = 0;
    // Whether the CPU may read and write the memory (host and sim: then the
    // host's kernels run on it, in queue order: run()).
    bool host_addressable() const noexcept { return kind() != Kind::CUDA; }
    // The memory a communication backend must accept for this space's
    // buffers, and the queue its collectives are ordered on.
    comm::Space comm_space() const noexcept {
        return kind() == Kind::CUDA ? comm::Space::DEVICE : comm::Space::HOST;
    }
    virtual comm::Queue queue() const noexcept = 0;

    // Memory, 64-byte aligned; uninitialized unless zeroed (the zeroing is
    // enqueued). alloc_host: host memory for staging copies (page-locked for
    // CUDA).
    virtual void *alloc(size_t bytes) = 0;
    virtual void free(void *p) noexcept = 0;
    virtual void *alloc_host(size_t bytes) = 0;
    virtual void free_host(void *p) noexcept = 0;

    // Enqueued.
    virtual void zero(void *p, size_t bytes) = 0;
    virtual void fill(float *p, size_t n, float value) = 0;
    virtual void copy(void *dst, const void *src, size_t bytes) = 0;    // within the space
    // Host -> space; `host` may be reused as soon as this returns.
    virtual void upload(void *dst, const void *host, size_t bytes) = 0;
    // Space -> host; waits: `host` holds the bytes on return.
    virtual void download(void *host, const void *src, size_t bytes) = 0;
    virtual void synchronize() = 0;

    // The math (amp/convert.hpp's, bit for bit), enqueued.
    virtual void convert(const void *src, dsm_dtype_t src_type, void *dst, dsm_dtype_t dst_type, size_t n) = 0;
    virtual void scale(void *x, dsm_dtype_t type, size_t n, double s) = 0;
    // dst (fp32) += scale * src.
    virtual void accumulate(const void *src, dsm_dtype_t src_type, float *dst, size_t n, float scale) = 0;
    // dst (any float dtype) += scale * src, 16-bit dst through fp32.
    void accumulate_into(const void *src, dsm_dtype_t src_type, void *dst, dsm_dtype_t dst_type, size_t n,
                         float scale, float *scratch);
    // Wait for the queue and return one small result: the fp32 x's sum of
    // squares times scale^2 and whether some element is Inf or NaN
    // (amp::norm_part; on CUDA summed in another fixed order), and whether
    // some element of x is Inf or NaN.
    virtual amp::NormPart inspect(const float *x, size_t n, float scale) = 0;
    virtual bool has_nonfinite(const void *x, dsm_dtype_t type, size_t n) = 0;

    // Host-addressable spaces: enqueue host code that reads and writes the
    // space's memory (host: runs now; sim: deferred). CUDA: DSM_ERR_INTERNAL.
    virtual void run(std::function<void()> work) = 0;
};

// The host space (one for the process).
Space &host();
// A simulated device (its own memory and queue).
std::unique_ptr<Space> make_sim();
// The CUDA device `device` with a stream of its own; DSM_ERR_NOT_SUPPORTED
// without CUDA (the kernels) or without that device.
std::unique_ptr<Space> make_cuda(int device);
// The stream the CUDA space's work goes on (NULL: its own), for
// dsm_engine_set_stream. Other spaces: DSM_ERR_NOT_SUPPORTED.
void set_stream(Space &space, void *stream);

// An owned allocation of a space; empty by default. Zeroed on construction
// (enqueued).
class Buffer {
public:
    Buffer() = default;
    Buffer(Space &space, size_t bytes, bool zero = true);
    // Host memory (the host space).
    explicit Buffer(size_t bytes) : Buffer(host(), bytes) {}
    ~Buffer() { reset(); }
    Buffer(Buffer &&o) noexcept { swap(o); }
    Buffer &operator=(Buffer &&o) noexcept {
        reset();
        swap(o);
        return *this;
    }
    Buffer(const Buffer &) = delete;
    Buffer &operator=(const Buffer &) = delete;
    void *data() const noexcept { return ptr_; }
    size_t bytes() const noexcept { return bytes_; }
    size_t capacity() const noexcept { return capacity_; }
    Space *space() const noexcept { return space_; }
    explicit operator bool() const noexcept { return ptr_ != nullptr; }
    // Use the first `bytes` (<= capacity()) of the allocation.
    void resize(size_t bytes) noexcept { bytes_ = bytes; }
    void reset() noexcept;

private:
    void swap(Buffer &o) noexcept;
    Space *space_ = nullptr;
    void *ptr_ = nullptr;
    size_t bytes_ = 0, capacity_ = 0;
};

// Host staging memory of a space (page-locked for CUDA), for checkpoints.
class Staging {
public:
    Staging(Space &space, size_t bytes);
    ~Staging() { space_->free_host(ptr_); }
    Staging(const Staging &) = delete;
    Staging &operator=(const Staging &) = delete;
    void *data() const noexcept { return ptr_; }

private:
    Space *space_;
    void *ptr_;
};

} // namespace device
} // namespace dsm
