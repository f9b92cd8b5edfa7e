#include "zero/buffers.hpp"

#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

namespace dsm {
namespace zero {

Buffer BufferPool::take(size_t bytes, bool zero, memstat::Use use) {
    Buffer b = take_idle(bytes, zero);
    if (b) {
        std::lock_guard<std::mutex> lock(mu_);
        try {
            out_[b.data()] = {use, b.capacity()};
            memstat::use_add(use, b.capacity());
        } catch (...) {
            // Not counted: the counts are a report, not a bound.
        }
    }
    return b;
}

Buffer BufferPool::take_idle(size_t bytes, bool zero) {
    std::unique_lock<std::mutex> lock(mu_);
    size_t best = idle_.size();
    for (size_t i = 0; i < idle_.size(); ++i) {
        const size_t c = idle_[i].capacity();
        if (c >= bytes && c / 2 <= bytes && (best == idle_.size() || c < idle_[best].capacity())) best = i;
    }
    if (best == idle_.size()) {
        lock.unlock();
        return Buffer(*space_, bytes, zero);
    }
    Buffer b = std::move(idle_[best]);
    idle_[best] = std::move(idle_.back());
    idle_.pop_back();
    idle_bytes_ -= b.capacity();
    lock.unlock();
    b.resize(bytes);
    if (zero && bytes > 0) space_->zero(b.data(), bytes);
    return b;
}

void BufferPool::give(Buffer &&b) noexcept {
    if (!b) return;
    Buffer mine = std::move(b);
    std::lock_guard<std::mutex> lock(mu_);
    forget(mine.data());
    if (idle_bytes_ + mine.capacity() > limit_) return; // freed here
    try {
        idle_.push_back(std::move(mine));
        idle_bytes_ += idle_.back().capacity();
    } catch (...) {
        // No room to remember it: it is freed.
    }
}

void BufferPool::forget(const void *p) noexcept {
    const auto it = out_.find(p);
    if (it == out_.end()) return;
    memstat::use_sub(it->second.first, it->second.second);
    out_.erase(it);
}

void BufferPool::release(const Buffer &b) noexcept {
    if (!b) return;
    std::lock_guard<std::mutex> lock(mu_);
    forget(b.data());
}

void BufferPool::clear() noexcept {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto &kv : out_) memstat::use_sub(kv.second.first, kv.second.second);
    out_.clear();
    idle_.clear();
    idle_bytes_ = 0;
}

SharedBuffer::SharedBuffer(comm::Backend *backend, device::Space &space, size_t bytes) : bytes_(bytes) {
    if (space.kind() == device::Kind::HOST) {
        backend_ = backend;
        ptr_ = backend->alloc_shared(bytes);
        // Node-shared memory with the shm backend, private memory otherwise.
        stat_ = std::strcmp(backend->name(), "shm") == 0 ? memstat::Kind::SHARED : memstat::Kind::HOST;
        memstat::add(stat_, bytes_);
    } else {
        own_ = Buffer(space, bytes);
        ptr_ = own_.data();
    }
}

void SharedBuffer::reset() noexcept {
    own_.reset();
    if (backend_ != nullptr && ptr_ != nullptr) {
        try {
            backend_->free_shared(ptr_);
        } catch (...) {
            // Destructors never throw; close() reports errors.
        }
        memstat::sub(stat_, bytes_);
    }
    backend_ = nullptr;
    ptr_ = nullptr;
    bytes_ = 0;
}

void SharedBuffer::swap(SharedBuffer &o) noexcept {
    std::swap(own_, o.own_);
    std::swap(backend_, o.backend_);
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    std::swap(stat_, o.stat_);
}

} // namespace zero
} // namespace dsm
