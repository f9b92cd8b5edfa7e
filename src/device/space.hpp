// Memory spaces: where the engine's memory lives, the queue its work is
// ordered on, and copies. One interface, three implementations:
//
//   host  the CPU: aligned host memory; every call runs before it returns.
//   cuda  a CUDA device: cudaMalloc'd memory, one stream (the engine's own,
//         or the user's: dsm_engine_set_stream); calls enqueue on the stream
//         and return.
//   sim   a simulated device: host memory of its own, poisoned when
//         allocated (0xff bytes, NaN in every float dtype, as device memory
//         holds garbage), with a queue of its own: every call is deferred
//         until synchronize(), a download, or a collective that waits for
//         the queue (Queue's wait function). Host code runs on it through
//         run(), in queue order, so the device-resident engine on it runs
//         the host's kernels and computes the host engine's bits: that is
//         how every device path is tested on a machine without a GPU.
//
// The math on a space's memory is its subsystem's, one table per space:
// amp/math.hpp (convert, scale, accumulate, inspect) and the optimizer's
// update (optim/optimizer.hpp), each with a host-addressable table (the CPU
// kernels through run()) and a CUDA one (src/optim/*_cuda.cu).
//
// The queue: calls on a space run in the order they were made; download
// waits for what was enqueued before it; synchronize() waits for
// everything, wait_mark() for what came before a mark. copy() moves bytes
// between any two of the space's memory and host memory (the host side
// page-locked for the copy to be asynchronous on CUDA). Collectives on the space's memory take queue(): the nccl
// backend enqueues on its stream, host backends wait for it first
// (comm/backend.hpp).
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

#include "core/memstat.hpp"
#include "device/queue.hpp"

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
    // The queue the space's work and the collectives on its memory are
    // ordered on.
    virtual Queue queue() const noexcept = 0;

    // Memory, 64-byte aligned; uninitialized unless zeroed (the zeroing is
    // enqueued). alloc_host: host memory for staging copies (page-locked for
    // CUDA).
    virtual void *alloc(size_t bytes) = 0;
    virtual void free(void *p) noexcept = 0;
    virtual void *alloc_host(size_t bytes) = 0;
    virtual void free_host(void *p) noexcept = 0;

    // Enqueued.
    virtual void zero(void *p, size_t bytes) = 0;
    virtual void copy(void *dst, const void *src, size_t bytes) = 0;
    // Host -> space; `host` may be reused as soon as this returns.
    virtual void upload(void *dst, const void *host, size_t bytes) = 0;
    // Space -> host; waits: `host` holds the bytes on return.
    virtual void download(void *host, const void *src, size_t bytes) = 0;
    virtual void synchronize() = 0;

    // A mark in the queue: record() marks the work enqueued so far,
    // wait_mark() waits until that work is done (a CUDA event).
    struct Mark {
        virtual ~Mark() = default;
    };
    virtual std::unique_ptr<Mark> mark() = 0;
    virtual void record(Mark &m) = 0;
    virtual void wait_mark(Mark &m) = 0;
    // Whether every enqueued call is done (never waits). The simulated
    // device counts its work in flight until it is waited for.
    virtual bool idle() = 0;
    // Page-lock `bytes` of host memory at `host` for the space's lifetime, so
    // that copies from it run by DMA; false (the reason in `why`) where that
    // failed, the memory then staying pageable. Host and sim: nothing to do.
    virtual bool pin(void *host, size_t bytes, std::string &why) = 0;

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
    ~Staging();
    Staging(const Staging &) = delete;
    Staging &operator=(const Staging &) = delete;
    void *data() const noexcept { return ptr_; }

private:
    Space *space_;
    void *ptr_;
    size_t bytes_;
};

// Where a space's allocations count in core/memstat.hpp: the host's as host
// memory, a device's (CUDA or simulated) as device memory.
memstat::Kind stat_kind(const Space &space) noexcept;

} // namespace device
} // namespace dsm
