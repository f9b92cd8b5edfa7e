// ZeRO-Offload's side of the Compute seam (compute.hpp).
#include "engine/compute.hpp"

#include "core/log.hpp"

namespace dsm {
namespace engine {

// ZeRO-Offload with pin_memory: page-lock the host parameters the device
// copies are refreshed from, so that those copies run by DMA while the user
// computes. Where the driver refuses, the copies go through its staging (the
// host waits for that part): a note in the log, not an error.
void OffloadCompute::pin(void *host, size_t bytes) {
    if (!pin_ || host == nullptr) return;
    std::string why;
    if (!mirror_->pin(host, bytes, why))
        DSM_INFO(ENGINE, "offload pin_memory: the parameters stay in pageable memory: %s", why.c_str());
}

void OffloadCompute::describe(nlohmann::json &j, std::ostringstream &os) const {
    j["offload"] = {{"device", mirror_->memory().name()},
                    {"device_bytes", mirror_->device_bytes()},
                    {"pinned_host_bytes", mirror_->pinned_bytes()},
                    {"param_copies_at_acquire", mirror_->copies_at_acquire()},
                    {"param_copies_after_step", mirror_->copies_refreshed()}};
    os << "offload: master weights and optimizer state in host memory; parameters and gradients on "
       << mirror_->memory().name() << " (" << mirror_->device_bytes() << " bytes now); "
       << mirror_->pinned_bytes() << " bytes of host parameters page-locked\n";
}

} // namespace engine
} // namespace dsm
