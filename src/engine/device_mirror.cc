// The device side of ZeRO-Offload (see device_mirror.hpp).
#include "dsm_config.h"

#include "engine/device_mirror.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "amp/convert.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/param.hpp"

namespace dsm {
namespace engine {

namespace {

void free_host(void *p) { std::free(p); }
void free_device(void *p) { cuda::free_device(p); }
void free_pinned(void *p) { cuda::free_pinned(p); }

MirrorMemory::Block host_block(size_t bytes) {
    void *p = std::aligned_alloc(256, (std::max<size_t>(bytes, 1) + 255) / 256 * 256);
    DSM_REQUIRE(p != nullptr, DSM_ERR_OUT_OF_MEMORY, "allocating ", bytes, " bytes of host memory failed");
    return MirrorMemory::Block(p, free_host);
}

// The rank's CUDA device.
class CudaMemory final : public MirrorMemory {
public:
    explicit CudaMemory(int device) : device_(device) {
        const cuda::DeviceGuard on(device_);
        stream_ = cuda::Stream::create();
    }
    Block alloc(size_t bytes) override {
        const cuda::DeviceGuard on(device_);
        cuda::DeviceBuffer b(bytes);
        return Block(b.release(), free_device);
    }
    Block alloc_host(size_t bytes) override {
        cuda::PinnedBuffer b(bytes);
        return Block(b.release(), free_pinned);
    }
    void to_device(void *dst, const void *src, size_t bytes) override { cuda::copy_bytes(dst, src, bytes); }
    void to_host_async(void *dst, const void *src, size_t bytes) override {
        cuda::copy_bytes_async(dst, src, bytes, stream_.get());
    }
    bool idle() override { return stream_.idle(); }
    void wait() override { stream_.synchronize(); }
    void zero(void *p, size_t bytes) override {
        const cuda::DeviceGuard on(device_);
        cuda::zero_bytes(p, bytes);
    }
    std::string name() const override { return "cuda:" + std::to_string(device_); }

private:
    int device_;
    cuda::Stream stream_; // a blocking stream: ordered after the user's work on the legacy default stream
};

// Host memory standing in for a device (DSM_SIM_DEVICE_MEMORY=1): separate
// buffers and real copies, so the engine's offload path runs as it does on a
// GPU.
class SimulatedMemory final : public MirrorMemory {
public:
    Block alloc(size_t bytes) override { return host_block(bytes); }
    Block alloc_host(size_t bytes) override { return host_block(bytes); }
    void to_device(void *dst, const void *src, size_t bytes) override { std::memcpy(dst, src, bytes); }
    void to_host_async(void *dst, const void *src, size_t bytes) override { std::memcpy(dst, src, bytes); }
    // Copies count as in flight until wait(), so every gradient takes the
    // deferred path (added in by drain()), the one a busy GPU takes.
    bool idle() override { return false; }
    void wait() override {}
    void zero(void *p, size_t bytes) override { std::memset(p, 0, bytes); }
    std::string name() const override { return "simulated"; }
};

bool simulated() {
    const std::string v = param_choice("DSM_SIM_DEVICE_MEMORY", {"0", "1"});
    return v == "1";
}

} // namespace

std::string offload_unavailable() {
    if (simulated()) return "";
    const cuda::DeviceCount c = cuda::device_count();
    return c.count > 0 ? "" : "no usable CUDA device (" + c.reason + ")";
}

std::unique_ptr<MirrorMemory> offload_memory(const cuda::DeviceHint &hint) {
    if (simulated()) return std::make_unique<SimulatedMemory>();
    const std::string why = offload_unavailable();
    DSM_REQUIRE(why.empty(), DSM_ERR_NOT_SUPPORTED, "ZeRO-Offload: ", why);
    return std::make_unique<CudaMemory>(cuda::use_device(hint));
}

DeviceMirror::DeviceMirror(std::unique_ptr<MirrorMemory> memory, size_t nparams, dsm_dtype_t dtype)
    : memory_(std::move(memory)), slots_(nparams), dtype_(dtype), esize_(dtype_size(dtype)) {}

void DeviceMirror::ensure(MirrorMemory::Block &b, size_t &have, size_t bytes, bool host) {
    if (b && have >= bytes) return;
    b.reset();
    have = 0;
    b = host ? memory_->alloc_host(bytes) : memory_->alloc(bytes);
    have = bytes;
}

const void *DeviceMirror::param(int index, const void *host, size_t numel, Keep keep) {
    Slot &s = slots_[static_cast<size_t>(index)];
    const size_t bytes = numel * esize_;
    const uint64_t current = keep == Keep::LOAD ? frozen_version_ : version_;
    if (keep == Keep::NONE || s.version != current || !s.values) {
        ensure(s.values, s.values_bytes, bytes, false);
        s.version = 0; // not valid until the copy succeeded
        memory_->to_device(s.values.get(), host, bytes);
        s.version = current;
    }
    return s.values.get();
}

void DeviceMirror::param_release(int index, Keep keep) noexcept {
    if (keep != Keep::NONE) return;
    Slot &s = slots_[static_cast<size_t>(index)];
    s.values.reset();
    s.values_bytes = 0;
    s.version = 0;
}

DeviceMirror::~DeviceMirror() {
    try {
        memory_->wait(); // no copy may still write into memory freed below
    } catch (...) {
    }
}

void *DeviceMirror::grad(int index, void *host, size_t numel) {
    Slot &s = slots_[static_cast<size_t>(index)];
    const size_t bytes = numel * esize_;
    // Acquired again before the last release was added in: finish that first
    // (its copy reads this buffer, its add reads the staging).
    if (std::find(pending_.begin(), pending_.end(), index) != pending_.end()) drain();
    ensure(s.grad, s.grad_bytes, bytes, false);
    memory_->zero(s.grad.get(), bytes);
    s.grad_host = host;
    s.grad_numel = numel;
    return s.grad.get();
}

void DeviceMirror::grad_release(int index) {
    Slot &s = slots_[static_cast<size_t>(index)];
    const size_t bytes = s.grad_numel * esize_;
    ensure(s.staging, s.staging_bytes, bytes, true);
    memory_->to_host_async(s.staging.get(), s.grad.get(), bytes);
    pending_.push_back(index);
    if (memory_->idle()) add_pending();
}

void DeviceMirror::drain() {
    if (pending_.empty()) return;
    memory_->wait();
    add_pending();
}

// host += copied gradient in the compute dtype, each sum rounded once: in
// fp32 directly, 16-bit through fp32 scratch (as the engine's buckets add).
void DeviceMirror::add_pending() {
    for (int index : pending_) {
        Slot &s = slots_[static_cast<size_t>(index)];
        if (dtype_ == DSM_FLOAT32) {
            amp::accumulate(s.staging.get(), dtype_, static_cast<float *>(s.grad_host), s.grad_numel, 1.0f);
        } else {
            scratch_.resize(s.grad_numel);
            amp::convert(s.grad_host, dtype_, scratch_.data(), DSM_FLOAT32, s.grad_numel);
            amp::accumulate(s.staging.get(), dtype_, scratch_.data(), s.grad_numel, 1.0f);
            amp::convert(scratch_.data(), DSM_FLOAT32, s.grad_host, dtype_, s.grad_numel);
        }
        s.grad_host = nullptr;
    }
    pending_.clear();
}

size_t DeviceMirror::device_bytes() const noexcept {
    size_t n = 0;
    for (const Slot &s : slots_) n += s.values_bytes + s.grad_bytes; // staging is host memory
    return n;
}

} // namespace engine
} // namespace dsm
