// Buffers of the ZeRO stages and the engine, in a memory space
// (device/space.hpp): a pool of idle buffers for reuse, and the buffers the
// data-parallel backend shares (Backend::alloc_shared, collective) where the
// space is the host.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "comm/backend.hpp"
#include "core/memstat.hpp"
#include "device/space.hpp"

namespace dsm {
namespace zero {

// Memory of the stage's space (device/space.hpp), zeroed when allocated;
// host memory by default.
using Buffer = device::Buffer;
using HostBuffer = device::Buffer;

// Idle buffers of released ZeRO-3 gathers and ZeRO-2/3 gradient
// staging, in one space, reused so that a micro-step does not map, fault in and zero fresh
// pages for every parameter. Holds at most limit() bytes of idle buffers
// (the stage sets it to twice the largest gather or staging need), so the
// memory the ZeRO formulas promise stays the engine's bound.
class BufferPool {
public:
    void set_space(device::Space &space) noexcept { space_ = &space; }
    void set_limit(size_t bytes) noexcept { limit_ = bytes; }
    size_t limit() const noexcept { return limit_; }
    size_t idle_bytes() const noexcept { return idle_bytes_; }
    // A buffer of `bytes`: the smallest idle one that holds them without
    // wasting more than half, else a new one; zeroed when `zero`. Counted
    // in `use` (core/memstat.hpp) until it is given back.
    Buffer take(size_t bytes, bool zero, memstat::Use use = memstat::Use::STAGING);
    // Keep `b` for reuse if it fits under the limit, else free it.
    void give(Buffer &&b) noexcept;
    // `b`, taken from the pool, is freed by its holder: no longer in use.
    void release(const Buffer &b) noexcept;
    void clear() noexcept;

private:
    Buffer take_idle(size_t bytes, bool zero);
    void forget(const void *p) noexcept; // under mu_
    device::Space *space_ = &device::host();
    std::mutex mu_;
    std::vector<Buffer> idle_;
    size_t idle_bytes_ = 0, limit_ = 0;
    // The buffers handed out: their use and counted bytes.
    std::unordered_map<const void *, std::pair<memstat::Use, size_t>> out_;
};

// A buffer the data-parallel backend may share: from Backend::alloc_shared
// (collective to allocate and to free) in host memory, else a Buffer of the
// space. Zeroed.
class SharedBuffer {
public:
    SharedBuffer() = default;
    SharedBuffer(comm::Backend *backend, device::Space &space, size_t bytes);
    ~SharedBuffer() { reset(); }
    SharedBuffer(SharedBuffer &&o) noexcept { swap(o); }
    SharedBuffer &operator=(SharedBuffer &&o) noexcept {
        reset();
        swap(o);
        return *this;
    }
    SharedBuffer(const SharedBuffer &) = delete;
    SharedBuffer &operator=(const SharedBuffer &) = delete;
    void *data() const noexcept { return ptr_; }
    size_t bytes() const noexcept { return bytes_; }
    void reset() noexcept;

private:
    void swap(SharedBuffer &o) noexcept;
    Buffer own_; // a space other than the host's
    comm::Backend *backend_ = nullptr;
    void *ptr_ = nullptr;
    size_t bytes_ = 0;
    memstat::Kind stat_ = memstat::Kind::HOST; // where the backend's memory counts
};

} // namespace zero
} // namespace dsm
