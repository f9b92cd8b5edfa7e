// Where the user computes: the values dsm_engine_param_acquire() returns and
// the buffers dsm_engine_grad_acquire() returns. The engine's host buffers
// themselves (Compute, the CPU mode), or, with ZeRO-Offload, device copies
// of them (OffloadCompute over a DeviceMirror, device_mirror.hpp). The engine
// calls the same methods in both modes; the host one does nothing.
#pragma once

#include <memory>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/device_mirror.hpp"

namespace dsm {
namespace engine {

class Compute {
public:
    using Keep = DeviceMirror::Keep;
    virtual ~Compute() = default;
    // "" on the host, else the device ("cuda:0", "simulated").
    virtual std::string device() const { return std::string(); }
    // The space of the memory param() and grad() hand out: the engine's own
    // (`engine`) on the host, the mirror's with ZeRO-Offload.
    virtual device::Space &space(device::Space &engine) noexcept { return engine; }
    // The values (gradient buffer) the user gets for parameter `index`, whose
    // host values (host gradient) the engine holds at `host`.
    virtual const void *param(int, const void *host, size_t, Keep) { return host; }
    virtual void param_release(int, Keep) noexcept {}
    virtual void *grad(int, void *host, size_t) { return host; }
    virtual void grad_release(int) {}
    // Before the engine reads its gradients: everything released is in.
    virtual void drain() {}
    // Before the host parameters change (with `frozen`: the frozen ones
    // too), and after they did (publish()).
    virtual void invalidate(bool frozen = false) noexcept { (void)frozen; }
    virtual void refresh() noexcept {}
    // The parameters held whole on the host, which the device copies are
    // refreshed from.
    virtual void pin(void *, size_t) {}
    // Frees the device side (the engine's close).
    virtual void release() noexcept {}
    // dsm_engine_describe()'s "offload" member and text line.
    virtual void describe(nlohmann::json &, std::ostringstream &) const {}
};

class OffloadCompute final : public Compute {
public:
    // `pin`: page-lock the host parameters (offload pin_memory).
    OffloadCompute(std::unique_ptr<DeviceMirror> mirror, bool pin) : mirror_(std::move(mirror)), pin_(pin) {}
    std::string device() const override { return mirror_ ? mirror_->memory().name() : std::string(); }
    device::Space &space(device::Space &engine) noexcept override { return mirror_ ? mirror_->memory() : engine; }
    const void *param(int index, const void *host, size_t numel, Keep keep) override {
        return mirror_->param(index, host, numel, keep);
    }
    void param_release(int index, Keep keep) noexcept override { mirror_->param_release(index, keep); }
    void *grad(int index, void *host, size_t numel) override { return mirror_->grad(index, host, numel); }
    void grad_release(int index) override { mirror_->grad_release(index); }
    void drain() override { mirror_->drain(); }
    void invalidate(bool frozen) noexcept override { mirror_->invalidate(frozen); }
    void refresh() noexcept override { mirror_->refresh(); }
    void pin(void *host, size_t bytes) override;
    void release() noexcept override { mirror_.reset(); }
    void describe(nlohmann::json &j, std::ostringstream &os) const override;

private:
    std::unique_ptr<DeviceMirror> mirror_;
    bool pin_ = false;
};

} // namespace engine
} // namespace dsm
