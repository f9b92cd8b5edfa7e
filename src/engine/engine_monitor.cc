// The engine's metrics: what it writes through the Monitor at each
// accumulation boundary, and the calls that give it the loss, user scalars
// and the FLOPs figures (doc/engine.md, "Metrics").
#include "dsm_config.h"

#include <cctype>
#include <cmath>
#include <cstring>

#include "core/agree.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/memstat.hpp"
#include "engine/engine.hpp"

namespace dsm {
namespace engine {

void Engine::open_monitor() {
    agree(world_, [&] { monitor_ = std::make_unique<Monitor>(cfg_, world_rank_ == 0); });
    if (monitor_->enabled()) DSM_INFO(ENGINE, "metrics: %s", monitor_->where().c_str());
}

void Engine::log_loss(double loss) {
    check_usable();
    loss_sum_ += loss;
    ++loss_count_;
}

void Engine::log_scalar(const char *name, double value) {
    check_usable();
    DSM_ARG_NOT_NULL(name);
    const size_t n = std::strlen(name);
    DSM_REQUIRE(n >= 1 && n <= 255, DSM_ERR_INVALID_ARGUMENT, "name '", name, "' must have 1..255 characters");
    for (size_t i = 0; i < n; ++i)
        DSM_REQUIRE(std::isprint(static_cast<unsigned char>(name[i])) && name[i] != ',' && name[i] != '"',
                    DSM_ERR_INVALID_ARGUMENT, "name '", name, "' has a control character, a comma or a quote");
    if (!monitor_ || !monitor_->enabled()) return;
    try {
        monitor_->write(name, value, global_samples_);
    } catch (const Error &e) {
        DSM_WARN(ENGINE, "metrics: %s; no more metrics are written", e.what());
        monitor_.reset();
    }
}

void Engine::set_flops(double flops_per_sample, double peak_flops) {
    check_usable();
    DSM_REQUIRE(std::isfinite(flops_per_sample) && flops_per_sample >= 0, DSM_ERR_INVALID_ARGUMENT,
                "flops_per_sample ", flops_per_sample, " is not a finite number >= 0");
    DSM_REQUIRE(std::isfinite(peak_flops) && peak_flops >= 0, DSM_ERR_INVALID_ARGUMENT, "peak_flops ", peak_flops,
                " is not a finite number >= 0");
    flops_per_sample_ = flops_per_sample;
    peak_flops_ = peak_flops;
}

// Rank 0, after a boundary's update (or skip): DeepSpeed's names where it has
// them (Train/Samples/train_loss, lr, loss_scale with fp16), libdsm's beside
// them, all with the global sample count as the step.
void Engine::record_step(double norm) {
    const double t = MPI_Wtime();
    const double secs = t - (monitor_last_ > 0 ? monitor_last_ : window_start_);
    monitor_last_ = t;
    const Timers dt{timers_.reduce - monitor_timers_.reduce, timers_.optimizer - monitor_timers_.optimizer,
                    timers_.gather - monitor_timers_.gather, timers_.wait - monitor_timers_.wait};
    monitor_timers_ = timers_;
    const bool mean = loss_count_ > 0;
    const double loss = mean ? loss_sum_ / static_cast<double>(loss_count_) : 0.0;
    loss_sum_ = 0.0;
    loss_count_ = 0;
    if (!monitor_ || !monitor_->enabled()) return;
    const int64_t step = global_samples_;
    const double samples = static_cast<double>(cfg_.train_batch_size);
    try {
        if (mean) monitor_->write("Train/Samples/train_loss", loss, step);
        monitor_->write("Train/Samples/lr", current_lr(), step);
        if (cfg_.fp16.enabled) monitor_->write("Train/Samples/loss_scale", scaler_->scale(), step);
        monitor_->write("Train/Samples/grad_norm", norm, step);
        monitor_->write("Train/Samples/skipped_steps", static_cast<double>(skipped_steps_), step);
        if (secs > 0) {
            monitor_->write("Train/Samples/samples_per_sec", samples / secs, step);
            monitor_->write("Train/Samples/elapsed_time_ms_iteration", 1e3 * secs, step);
        }
        monitor_->write("Train/Samples/elapsed_time_ms_backward_allreduce", 1e3 * dt.reduce, step);
        monitor_->write("Train/Samples/elapsed_time_ms_step", 1e3 * dt.optimizer, step);
        monitor_->write("Train/Samples/elapsed_time_ms_allgather", 1e3 * dt.gather, step);
        monitor_->write("Train/Samples/elapsed_time_ms_wait", 1e3 * dt.wait, step);
        // This rank's (the first's) memory high-water marks since the engine's creation.
        monitor_->write("Memory/host_peak_bytes", static_cast<double>(memstat::peak(memstat::Kind::HOST)), step);
        monitor_->write("Memory/device_peak_bytes", static_cast<double>(memstat::peak(memstat::Kind::DEVICE)), step);
        monitor_->write("Memory/shared_peak_bytes", static_cast<double>(memstat::peak(memstat::Kind::SHARED)), step);
        if (flops_per_sample_ > 0 && secs > 0) {
            // Per rank: the model's FLOPs of the batch spread over the ranks.
            const double flops = flops_per_sample_ * samples / secs / static_cast<double>(world_size_);
            monitor_->write("Train/Samples/tflops", flops / 1e12, step);
            if (peak_flops_ > 0) monitor_->write("Train/Samples/mfu", flops / peak_flops_, step);
        }
        monitor_->flush();
    } catch (const Error &e) {
        // Training goes on: the files are not worth a failed step.
        DSM_WARN(ENGINE, "metrics: %s; no more metrics are written", e.what());
        monitor_.reset();
    }
}

} // namespace engine
} // namespace dsm
