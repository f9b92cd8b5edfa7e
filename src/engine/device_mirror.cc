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

DSM_PARAM(sim, SIM_DEVICE_MEMORY, param::Bool(), "0",
          "Testing: 1 makes an engine that offloads (zero_optimization.offload_optimizer or offload_param "
          "device \"cpu\") keep its device copies of the parameters and gradients in separate host memory "
          "instead of on a CUDA device, so the offload path runs without a GPU.");

bool simulated() { return param_SIM_DEVICE_MEMORY().value(); }

} // namespace

std::string offload_unavailable() {
    if (simulated()) return "";
    const cuda::DeviceCount c = cuda::device_count();
    return c.count > 0 ? "" : "no usable CUDA device (" + c.reason + ")";
}

std::unique_ptr<device::Space> offload_memory(const cuda::DeviceHint &hint) {
    if (simulated()) return device::make_sim();
    const std::string why = offload_unavailable();
    DSM_REQUIRE(why.empty(), DSM_ERR_NOT_SUPPORTED, "ZeRO-Offload: ", why);
    return device::make_cuda(cuda::use_device(hint));
}

DeviceMirror::DeviceMirror(std::unique_ptr<device::Space> memory, size_t nparams, dsm_dtype_t dtype)
    : memory_(std::move(memory)), slots_(nparams), dtype_(dtype), esize_(dtype_size(dtype)) {}

void DeviceMirror::ensure(Block &b, size_t &have, size_t bytes, bool host) {
    if (b && have >= bytes) return;
    b.reset();
    have = 0;
    device::Space *sp = memory_.get();
    // Counted in core/memstat.hpp: page-locked host staging, or device memory.
    if (host) {
        b = Block(sp->alloc_host(bytes), [sp, bytes](void *p) {
            sp->free_host(p);
            memstat::sub(memstat::Kind::HOST, bytes);
        });
        memstat::add(memstat::Kind::HOST, bytes);
    } else {
        b = Block(sp->alloc(bytes), [sp, bytes](void *p) {
            sp->free(p);
            memstat::sub(device::stat_kind(*sp), bytes);
        });
        memstat::add(device::stat_kind(*sp), bytes);
    }
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
        memory_->upload(s.values.get(), host, bytes);
        memory_->synchronize();
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
        memory_->synchronize();
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
            memory_->copy(s.values.get(), s.values_host, s.values_bytes);
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
        memory_->synchronize(); // no copy may still write into memory freed below
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
    memory_->synchronize(); // zeroed before the user writes into it
    s.grad_host = host;
    s.grad_numel = numel;
    return s.grad.get();
}

void DeviceMirror::grad_release(int index) {
    Slot &s = slots_[static_cast<size_t>(index)];
    const size_t bytes = s.grad_numel * esize_;
    ensure(s.staging, s.staging_bytes, bytes, true);
    memory_->copy(s.staging.get(), s.grad.get(), bytes);
    pending_.push_back(index);
    if (memory_->idle()) add_pending();
}

void DeviceMirror::drain() {
    settle(); // the refresh() copies too: the engine may write the host values next
    if (pending_.empty()) return;
    memory_->synchronize();
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

DSM_PARAM_LINK(engine_device_mirror)
