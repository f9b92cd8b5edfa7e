#include "zero/buffers.hpp"

#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

namespace dsm {
namespace zero {

void HostBuffer::Free::operator()(void *p) const noexcept { std::free(p); }

HostBuffer::HostBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes == 0) return;
    const size_t rounded = (bytes + 63) / 64 * 64;
    void *p = std::aligned_alloc(64, rounded);
    if (p == nullptr) throw std::bad_alloc();
    std::memset(p, 0, rounded);
    ptr_.reset(p);
    capacity_ = rounded;
}

HostBuffer BufferPool::take(size_t bytes, bool zero) {
    size_t best = idle_.size();
    for (size_t i = 0; i < idle_.size(); ++i) {
        const size_t c = idle_[i].capacity();
        if (c >= bytes && c / 2 <= bytes && (best == idle_.size() || c < idle_[best].capacity())) best = i;
    }
    if (best == idle_.size()) return HostBuffer(bytes); // zeroed
    HostBuffer b = std::move(idle_[best]);
    idle_[best] = std::move(idle_.back());
    idle_.pop_back();
    idle_bytes_ -= b.capacity();
    b.resize(bytes);
    if (zero && bytes > 0) std::memset(b.data(), 0, bytes);
    return b;
}

void BufferPool::give(HostBuffer &&b) noexcept {
    if (!b) return;
    HostBuffer mine = std::move(b);
    if (idle_bytes_ + mine.capacity() > limit_) return; // freed here
    try {
        idle_.push_back(std::move(mine));
        idle_bytes_ += idle_.back().capacity();
    } catch (...) {
        // No room to remember it: it is freed.
    }
}

void BufferPool::clear() noexcept {
    idle_.clear();
    idle_bytes_ = 0;
}

SharedBuffer::SharedBuffer(comm::Backend *backend, size_t bytes)
    : backend_(backend), ptr_(backend->alloc_shared(bytes)), bytes_(bytes) {}

void SharedBuffer::reset() noexcept {
    if (backend_ != nullptr && ptr_ != nullptr) {
        try {
            backend_->free_shared(ptr_);
        } catch (...) {
            // Destructors never throw; close() reports errors.
        }
    }
    backend_ = nullptr;
    ptr_ = nullptr;
    bytes_ = 0;
}

void SharedBuffer::swap(SharedBuffer &o) noexcept {
    std::swap(backend_, o.backend_);
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
}

} // namespace zero
} // namespace dsm
