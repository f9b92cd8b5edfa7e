// Host buffers of the ZeRO stages and the engine: zeroed aligned host
// memory, a pool of idle buffers for reuse, and buffers of the data-parallel
// backend's shared memory (Backend::alloc_shared, collective).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "comm/backend.hpp"

namespace dsm {
namespace zero {

// Zeroed host memory aligned to 64 bytes.
class HostBuffer {
public:
    HostBuffer() = default;
    explicit HostBuffer(size_t bytes);
    void *data() const noexcept { return ptr_.get(); }
    size_t bytes() const noexcept { return bytes_; }
    size_t capacity() const noexcept { return capacity_; }
    explicit operator bool() const noexcept { return ptr_ != nullptr; }
    // Use the first `bytes` (<= capacity()) of the allocation.
    void resize(size_t bytes) noexcept { bytes_ = bytes; }

private:
    struct Free {
        void operator()(void *p) const noexcept;
    };
    std::unique_ptr<void, Free> ptr_;
    size_t bytes_ = 0, capacity_ = 0;
};

// Idle host buffers of released ZeRO-3 gathers and ZeRO-2/3 gradient
// staging, reused so that a micro-step does not map, fault in and zero fresh
// pages for every parameter. Holds at most limit() bytes of idle buffers
// (the stage sets it to twice the largest gather or staging need), so the
// memory the ZeRO formulas promise stays the engine's bound.
class BufferPool {
public:
    void set_limit(size_t bytes) noexcept { limit_ = bytes; }
    size_t limit() const noexcept { return limit_; }
    size_t idle_bytes() const noexcept { return idle_bytes_; }
    // A buffer of `bytes`: the smallest idle one that holds them without
    // wasting more than half, else a new one; zeroed when `zero`.
    HostBuffer take(size_t bytes, bool zero);
    // Keep `b` for reuse if it fits under the limit, else free it.
    void give(HostBuffer &&b) noexcept;
    void clear() noexcept;

private:
    std::vector<HostBuffer> idle_;
    size_t idle_bytes_ = 0, limit_ = 0;
};

// A buffer from Backend::alloc_shared (collective to allocate and to free).
class SharedBuffer {
public:
    SharedBuffer() = default;
    SharedBuffer(comm::Backend *backend, size_t bytes);
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
    comm::Backend *backend_ = nullptr;
    void *ptr_ = nullptr;
    size_t bytes_ = 0;
};

} // namespace zero
} // namespace dsm
