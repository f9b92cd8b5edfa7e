// ZeRO-Offload (zero_optimization.offload_optimizer / offload_param device
// "cpu"): the parameters the user computes with and the gradients the user
// writes live on the rank's CUDA device; the engine's flat buffers, the fp32
// master weights and the optimizer state stay in host memory, where the
// reductions, the vectorized CPU optimizer and the checkpoints work on them
// exactly as without offload.
//
// The mirror is the device side of that arrangement, one slot per parameter:
//   param(): the device copy of a parameter's values. A kept trainable
//     parameter's copy, once made, is refreshed by refresh(), which the
//     engine calls when a step has written the new values: it enqueues the
//     copies from the host on the mirror's stream and returns, so they run
//     while the user goes on (its next batch, the forward pass up to the
//     parameter); param() waits for that parameter's copy alone. A frozen
//     parameter's copy is made again at its first acquire after a checkpoint
//     load (invalidate(true)); copies of ZeRO-3 gathered parameters live only
//     while acquired.
//   grad(): a zeroed device buffer for the user to add a gradient into;
//     grad_release() enqueues its copy to page-locked host memory on the
//     mirror's stream and returns, so the copy overlaps the user's next
//     layers; the copied gradient is added into the host gradient the engine
//     gave (host += device, in the compute dtype) as soon as the stream is
//     idle at a later call, and at the latest by drain(), which the engine
//     calls before it reads its gradients (a bucket flush, the step, a
//     checkpoint). Accumulation over micro-steps and every ZeRO stage thus
//     behave as without offload.
//   pin(): page-lock the engine's parameter buffer (offload pin_memory), so
//     that refresh()'s copies run by DMA without the driver staging them.
//
// Where the copies live is a memory space (device/space.hpp): the rank's
// CUDA device, or, for tests on machines without one
// (DSM_SIM_DEVICE_MEMORY=1), the simulated device, whose copies run only
// when waited for, as a device runs them later. Nothing here is collective; errors throw dsm::Error
// (DSM_ERR_CUDA, DSM_ERR_OUT_OF_MEMORY).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cuda/device.hpp"
#include "device/space.hpp"
#include "dsm.h"

namespace dsm {
namespace engine {

// The memory of the offloading engine on this rank: the simulated device
// when DSM_SIM_DEVICE_MEMORY is 1, else the CUDA device chosen for the rank
// (cuda::use_device(): DSM_CUDA_DEVICE, the mesh placement's GPU, or the
// node-local rank). DSM_ERR_NOT_SUPPORTED with the reason when no device is
// usable.
std::unique_ptr<device::Space> offload_memory(const cuda::DeviceHint &hint);

// Why offloading cannot run on this rank ("" when it can): no usable CUDA
// device and no simulation.
std::string offload_unavailable();

class DeviceMirror {
public:
    DeviceMirror(std::unique_ptr<device::Space> memory, size_t nparams, dsm_dtype_t dtype);
    ~DeviceMirror();
    DeviceMirror(const DeviceMirror &) = delete;
    DeviceMirror &operator=(const DeviceMirror &) = delete;

    const device::Space &memory() const noexcept { return *memory_; }
    device::Space &memory() noexcept { return *memory_; }

    // How long a device copy of a parameter stays valid.
    enum class Keep {
        NONE,  // a ZeRO-3 gather: copied at each acquire, freed at release
        STEP,  // a kept trainable parameter: until invalidate()
        LOAD,  // a frozen parameter: until invalidate(true)
    };
    // The device copy of parameter `index` (`numel` elements at `host`),
    // waiting for its refresh() copy when that is still running.
    const void *param(int index, const void *host, size_t numel, Keep keep);
    void param_release(int index, Keep keep) noexcept;

    // A zeroed device buffer for the gradient of `index`; its sum goes into
    // `host` after grad_release(), by drain() at the latest.
    void *grad(int index, void *host, size_t numel);
    void grad_release(int index);
    // Finish every released gradient: wait for the copies, add them in;
    // wait for the refresh() copies too.
    void drain();
    // Released gradients not added in yet.
    size_t pending() const noexcept { return pending_.size(); }

    // The host values of the trainable parameters are about to change (a
    // step), and with `frozen` the frozen ones' too (a checkpoint load):
    // waits for the refresh() copies still reading the host values, and
    // makes every copy stale. Never throws: a failed copy is made again,
    // synchronously, at the parameter's next acquire.
    void invalidate(bool frozen = false) noexcept;
    // The new host values are in place: enqueue the copies of the kept
    // trainable parameters that have a device copy. Never throws (as above).
    void refresh() noexcept;
    // Page-lock `bytes` of the engine's host parameters at `host`; false with
    // the reason where that failed (copies then go through the driver's
    // staging).
    bool pin(void *host, size_t bytes, std::string &why);
    // Host bytes page-locked by pin().
    size_t pinned_bytes() const noexcept { return pinned_bytes_; }
    // Parameter copies to the device so far: made by param() while the
    // caller waited, and enqueued by refresh().
    uint64_t copies_at_acquire() const noexcept { return copies_at_acquire_; }
    uint64_t copies_refreshed() const noexcept { return copies_refreshed_; }

    // Bytes of device memory held now.
    size_t device_bytes() const noexcept;

private:
    // Memory of the space (device) or its host staging, freed by the space.
    using Block = std::unique_ptr<void, std::function<void(void *)>>;
    struct Slot {
        Block values;
        size_t values_bytes = 0;
        uint64_t version = 0;     // version_ (frozen_version_) when the values were copied (0: never)
        const void *values_host = nullptr; // Keep::STEP: the host values refresh() copies
        std::unique_ptr<device::Space::Mark> upload; // marks the refresh() copy
        bool uploading = false;   // that copy may still be running
        Block grad;
        size_t grad_bytes = 0;
        Block staging; // the gradient copied back
        size_t staging_bytes = 0;
        void *grad_host = nullptr; // where the gradient is added
        size_t grad_numel = 0;
    };
    void ensure(Block &b, size_t &have, size_t bytes, bool host);
    void add_pending(); // add every pending gradient (their copies are done)
    void settle() noexcept; // wait for the refresh() copies; a failed one is stale

    std::unique_ptr<device::Space> memory_;
    std::vector<Slot> slots_;
    dsm_dtype_t dtype_;
    size_t esize_;
    uint64_t version_ = 1, frozen_version_ = 1;
    size_t pinned_bytes_ = 0;
    uint64_t copies_at_acquire_ = 0, copies_refreshed_ = 0;
    std::vector<int> pending_; // released gradients being copied, in release order
    std::vector<float> scratch_; // 16-bit adds in fp32
};

} // namespace engine
} // namespace dsm
