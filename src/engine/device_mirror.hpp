// ZeRO-Offload (zero_optimization.offload_optimizer / offload_param device
// "cpu"): the parameters the user computes with and the gradients the user
// writes live on the rank's CUDA device; the engine's flat buffers, the fp32
// master weights and the optimizer state stay in host memory, where the
// reductions, the vectorized CPU optimizer and the checkpoints work on them
// exactly as without offload.
//
// The mirror is the device side of that arrangement, one slot per parameter:
//   param(): the device copy of a parameter's values, copied from the host
//     when the host values changed since the last copy: a trainable
//     parameter's at each step, a frozen one's at a checkpoint load
//     (invalidate()); copies of ZeRO-3 gathered parameters live only while
//     acquired.
//   grad(): a zeroed device buffer for the user to add a gradient into;
//     grad_release() enqueues its copy to page-locked host memory on the
//     mirror's stream and returns, so the copy overlaps the user's next
//     layers; the copied gradient is added into the host gradient the engine
//     gave (host += device, in the compute dtype) as soon as the stream is
//     idle at a later call, and at the latest by drain(), which the engine
//     calls before it reads its gradients (a bucket flush, the step, a
//     checkpoint). Accumulation over micro-steps and every ZeRO stage thus
//     behave as without offload.
//
// Where the copies live is a MirrorMemory: a CUDA device, or, for tests on
// machines without one (DSM_SIM_DEVICE_MEMORY=1), separate host memory that
// stands in for it. Nothing here is collective; errors throw dsm::Error
// (DSM_ERR_CUDA, DSM_ERR_OUT_OF_MEMORY).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cuda/device.hpp"
#include "dsm.h"

namespace dsm {
namespace engine {

class MirrorMemory {
public:
    using Block = std::unique_ptr<void, void (*)(void *)>;
    virtual ~MirrorMemory() = default;
    virtual Block alloc(size_t bytes) = 0;                           // uninitialized
    virtual Block alloc_host(size_t bytes) = 0;                      // staging (pinned for CUDA)
    virtual void to_device(void *dst, const void *src, size_t bytes) = 0;
    // Enqueue a copy to host memory from alloc_host(); copies run in order.
    virtual void to_host_async(void *dst, const void *src, size_t bytes) = 0;
    virtual bool idle() = 0; // every enqueued copy is done (never waits)
    virtual void wait() = 0; // until every enqueued copy is done
    virtual void zero(void *p, size_t bytes) = 0;
    virtual std::string name() const = 0;                            // "cuda:0", "simulated"
};

// The memory of the offloading engine on this rank: the simulated device
// when DSM_SIM_DEVICE_MEMORY is 1, else the CUDA device chosen for the rank
// (cuda::use_device(): DSM_CUDA_DEVICE, the mesh placement's GPU, or the
// node-local rank). DSM_ERR_NOT_SUPPORTED with the reason when no device is
// usable.
std::unique_ptr<MirrorMemory> offload_memory(const cuda::DeviceHint &hint);

// Why offloading cannot run on this rank ("" when it can): no usable CUDA
// device and no simulation.
std::string offload_unavailable();

class DeviceMirror {
public:
    DeviceMirror(std::unique_ptr<MirrorMemory> memory, size_t nparams, dsm_dtype_t dtype);
    ~DeviceMirror();
    DeviceMirror(const DeviceMirror &) = delete;
    DeviceMirror &operator=(const DeviceMirror &) = delete;

    const MirrorMemory &memory() const noexcept { return *memory_; }

    // How long a device copy of a parameter stays valid.
    enum class Keep {
        NONE,  // a ZeRO-3 gather: copied at each acquire, freed at release
        STEP,  // a kept trainable parameter: until invalidate()
        LOAD,  // a frozen parameter: until invalidate(true)
    };
    // The device copy of parameter `index` (`numel` elements at `host`).
    const void *param(int index, const void *host, size_t numel, Keep keep);
    void param_release(int index, Keep keep) noexcept;

    // A zeroed device buffer for the gradient of `index`; its sum goes into
    // `host` after grad_release(), by drain() at the latest.
    void *grad(int index, void *host, size_t numel);
    void grad_release(int index);
    // Finish every released gradient: wait for the copies, add them in.
    void drain();
    // Released gradients not added in yet.
    size_t pending() const noexcept { return pending_.size(); }

    // The trainable parameters' host values changed (a step), and with
    // `frozen` the frozen ones' too (a checkpoint load): refresh those copies
    // at their next acquire.
    void invalidate(bool frozen = false) noexcept {
        ++version_;
        if (frozen) ++frozen_version_;
    }

    // Bytes of device memory held now.
    size_t device_bytes() const noexcept;

private:
    struct Slot {
        MirrorMemory::Block values{nullptr, nullptr};
        size_t values_bytes = 0;
        uint64_t version = 0;     // version_ (frozen_version_) when the values were copied (0: never)
        MirrorMemory::Block grad{nullptr, nullptr};
        size_t grad_bytes = 0;
        MirrorMemory::Block staging{nullptr, nullptr}; // the gradient copied back
        size_t staging_bytes = 0;
        void *grad_host = nullptr; // where the gradient is added
        size_t grad_numel = 0;
    };
    void ensure(MirrorMemory::Block &b, size_t &have, size_t bytes, bool host);
    void add_pending(); // add every pending gradient (their copies are done)

    std::unique_ptr<MirrorMemory> memory_;
    std::vector<Slot> slots_;
    dsm_dtype_t dtype_;
    size_t esize_;
    uint64_t version_ = 1, frozen_version_ = 1;
    std::vector<int> pending_; // released gradients being copied, in release order
    std::vector<float> scratch_; // 16-bit adds in fp32
};

} // namespace engine
} // namespace dsm
