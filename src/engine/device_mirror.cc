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
    void to_device_async(void *dst, const void *src, size_t bytes) override {
        const cuda::DeviceGuard on(device_);
        cuda::copy_bytes_async(dst, src, bytes, stream_.get());
    }
    struct EventMark final : Mark {
        cuda::Event event;
    };
    std::unique_ptr<Mark> mark() override {
        const cuda::DeviceGuard on(device_);
        auto m = std::make_unique<EventMark>();
        m->event = cuda::Event::create();
        return m;
    }
    void record(Mark &m) override { static_cast<EventMark &>(m).event.record(stream_.get()); }
    void wait_mark(Mark &m) override { static_cast<EventMark &>(m).event.synchronize(); }
    bool pin(void *host, size_t bytes, std::string &why) override {
        cuda::HostRegistration r(host, bytes);
        if (!r.registered()) {
            why = r.reason();
            return false;
        }
        pinned_.push_back(std::move(r));
        return true;
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
    std::vector<cuda::HostRegistration> pinned_; // unregistered before the stream goes
};

// Host memory standing in for a device (DSM_SIM_DEVICE_MEMORY=1): separate
// buffers and real copies, so the engine's offload path runs as it does on a
// GPU. Copies to the device are queued and made only when waited for (a mark
// or the whole stream): a caller that read a device copy without waiting for
// it would read stale values, as on a busy GPU.
class SimulatedMemory final : public MirrorMemory {
public:
    Block alloc(size_t bytes) override { return host_block(bytes); }
    Block alloc_host(size_t bytes) override { return host_block(bytes); }
    void to_device(void *dst, const void *src, size_t bytes) override {
        run(queue_.size()); // stream order: the queued copies come first
        std::memcpy(dst, src, bytes);
    }
    void to_host_async(void *dst, const void *src, size_t bytes) override {
        run(queue_.size());
        std::memcpy(dst, src, bytes);
    }
    void to_device_async(void *dst, const void *src, size_t bytes) override {
        queue_.push_back(Copy{dst, src, bytes});
    }
    struct Position final : Mark {
        size_t upto = 0; // copies enqueued in all when recorded
    };
    std::unique_ptr<Mark> mark() override { return std::make_unique<Position>(); }
    void record(Mark &m) override { static_cast<Position &>(m).upto = done_ + queue_.size(); }
    void wait_mark(Mark &m) override {
        const size_t upto = static_cast<Position &>(m).upto;
        if (upto > done_) run(upto - done_);
    }
    bool pin(void *, size_t, std::string &) override { return true; }
    // Copies count as in flight until wait(), so every gradient takes the
    // deferred path (added in by drain()), the one a busy GPU takes.
    bool idle() override { return false; }
    void wait() override { run(queue_.size()); }
    void zero(void *p, size_t bytes) override {
        run(queue_.size());
        std::memset(p, 0, bytes);
    }
    std::string name() const override { return "simulated"; }

private:
    struct Copy {
        void *dst;
        const void *src;
        size_t bytes;
    };
    void run(size_t n) { // the first n queued copies, in order
        for (size_t i = 0; i < n; ++i) std::memcpy(queue_[i].dst, queue_[i].src, queue_[i].bytes);
        queue_.erase(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(n));
        done_ += n;
    }
    std::vector<Copy> queue_;
    size_t done_ = 0; // copies made so far
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
    if (s.uploading) { // refresh() enqueued this copy: wait for it alone
        s.uploading = false;
        try {
            memory_->wait_mark(*s.upload);
        } catch (...) {
            s.version = 0;
            throw;
        }
    }
    if (keep == Keep::NONE || s.version != current || !s.values) {
        ensure(s.values, s.values_bytes, bytes, false);
        s.version = 0; // not valid until the copy succeeded
        memory_->to_device(s.values.get(), host, bytes);
        s.version = current;
        ++copies_at_acquire_;
    }
    if (keep == Keep::STEP) s.values_host = host;
    return s.values.get();
}

void DeviceMirror::settle() noexcept {
    bool any = false;
    for (const Slot &s : slots_) any = any || s.uploading;
    if (!any) return;
    try {
        memory_->wait();
    } catch (...) {
        // A failed copy: every refreshed copy is stale, made again at its
        // next acquire (where a broken device reports the error).
        for (Slot &s : slots_)
            if (s.uploading) s.version = 0;
    }
    for (Slot &s : slots_) s.uploading = false;
}

void DeviceMirror::invalidate(bool frozen) noexcept {
    settle(); // the copies read the host values about to change
    ++version_;
    if (frozen) ++frozen_version_;
}

void DeviceMirror::refresh() noexcept {
    for (Slot &s : slots_) {
        if (s.values_host == nullptr || !s.values || s.version == version_) continue;
        try {
            if (!s.upload) s.upload = memory_->mark();
            memory_->to_device_async(s.values.get(), s.values_host, s.values_bytes);
            s.version = version_;
            s.uploading = true;
            memory_->record(*s.upload);
            ++copies_refreshed_;
        } catch (...) {
            s.version = 0; // copied at the next acquire, which reports the error
            s.uploading = false;
        }
    }
}

bool DeviceMirror::pin(void *host, size_t bytes, std::string &why) {
    if (!memory_->pin(host, bytes, why)) return false;
    pinned_bytes_ += bytes;
    return true;
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
    settle(); // the refresh() copies too: the engine may write the host values next
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
