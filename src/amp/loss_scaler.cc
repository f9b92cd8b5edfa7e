// DeepSpeed's LossScaler and DynamicLossScaler (loss_scaler.hpp). The update
// follows DynamicLossScaler.update_scale step by step; names in comments are
// DeepSpeed's (delayed_shift = hysteresis, scale_window = window).
#include "amp/loss_scaler.hpp"

#include <cmath>

#include "core/error.hpp"

namespace dsm {
namespace amp {

namespace {

bool positive_finite(double x) { return std::isfinite(x) && x > 0.0; }

void check_config(const LossScalerConfig &c) {
    if (!c.dynamic) {
        DSM_REQUIRE(positive_finite(c.static_scale), DSM_ERR_INVALID_ARGUMENT,
                    "loss scaler: static_scale must be finite and > 0, got ", c.static_scale);
        return;
    }
    DSM_REQUIRE(positive_finite(c.init_scale), DSM_ERR_INVALID_ARGUMENT,
                "loss scaler: init_scale must be finite and > 0, got ", c.init_scale);
    DSM_REQUIRE(std::isfinite(c.scale_factor) && c.scale_factor > 1.0, DSM_ERR_INVALID_ARGUMENT,
                "loss scaler: scale_factor must be finite and > 1, got ", c.scale_factor);
    DSM_REQUIRE(c.window >= 1, DSM_ERR_INVALID_ARGUMENT, "loss scaler: window must be >= 1, got ", c.window);
    DSM_REQUIRE(c.hysteresis >= 1, DSM_ERR_INVALID_ARGUMENT, "loss scaler: hysteresis must be >= 1, got ",
                c.hysteresis);
    DSM_REQUIRE(positive_finite(c.min_scale), DSM_ERR_INVALID_ARGUMENT,
                "loss scaler: min_scale must be finite and > 0, got ", c.min_scale);
}

} // namespace

LossScaler::LossScaler(const LossScalerConfig &cfg) : cfg_(cfg) {
    check_config(cfg_);
    state_.cur_scale = cfg_.dynamic ? cfg_.init_scale : cfg_.static_scale;
    state_.cur_hysteresis = cfg_.dynamic ? cfg_.hysteresis : 1;
}

void LossScaler::update(bool overflow) {
    LossScalerState &s = state_;
    if (!cfg_.dynamic) { // LossScaler.update_scale does nothing; the step is still counted
        ++s.cur_iter;
        return;
    }
    if (overflow) {
        if (cfg_.hysteresis == 1 || s.cur_hysteresis == 1) {
            // Checked before anything changes: the state stays as it was.
            DSM_REQUIRE(!(s.cur_scale == cfg_.min_scale && cfg_.raise_error_at_min_scale), DSM_ERR_NUMERIC,
                        "fp16 gradients overflow at the minimum loss scale ", s.cur_scale,
                        " (fp16.min_loss_scale) at iteration ", s.cur_iter,
                        ": the scale cannot decrease any further; training has diverged");
            s.cur_scale = std::fmax(s.cur_scale / cfg_.scale_factor, cfg_.min_scale);
        } else {
            // Hysteresis: tolerate this overflow, shrink on a later one.
            --s.cur_hysteresis;
        }
        s.last_overflow_iter = s.cur_iter;
    } else {
        if (cfg_.consecutive_hysteresis) s.cur_hysteresis = cfg_.hysteresis;
        // DeepSpeed's stable_interval: the clean steps before this one since
        // the last overflow (or the start, where last_overflow_iter is -1).
        // After `window` of them this clean step grows the scale (the first
        // growth after the start or an overflow comes on the window+1-th
        // clean step, the next ones every `window` steps) and refills the
        // hysteresis. Releases before
        // this form grew at (cur_iter - last_overflow_iter) % window == 0 in
        // ZeRO 1-3; DeepSpeed now uses stable_interval at every stage.
        const int64_t stable_interval = s.cur_iter - s.last_overflow_iter - 1;
        if (stable_interval > 0 && stable_interval % cfg_.window == 0) {
            if (!cfg_.consecutive_hysteresis) s.cur_hysteresis = cfg_.hysteresis;
            s.cur_scale *= cfg_.scale_factor;
        }
    }
    ++s.cur_iter;
}

void LossScaler::set_state(const LossScalerState &s) {
    DSM_REQUIRE(positive_finite(s.cur_scale), DSM_ERR_INVALID_ARGUMENT,
                "loss scaler state: cur_scale must be finite and > 0, got ", s.cur_scale);
    DSM_REQUIRE(s.cur_iter >= 0, DSM_ERR_INVALID_ARGUMENT, "loss scaler state: cur_iter must be >= 0, got ",
                s.cur_iter);
    // An overflow is recorded at the iteration it happens, before cur_iter
    // moves on: -1 <= last_overflow_iter < cur_iter.
    DSM_REQUIRE(s.last_overflow_iter >= -1 && s.last_overflow_iter < s.cur_iter, DSM_ERR_INVALID_ARGUMENT,
                "loss scaler state: last_overflow_iter must be in [-1, cur_iter - 1] = [-1, ", s.cur_iter - 1,
                "], got ", s.last_overflow_iter);
    DSM_REQUIRE(s.cur_hysteresis >= 1, DSM_ERR_INVALID_ARGUMENT,
                "loss scaler state: cur_hysteresis must be >= 1, got ", s.cur_hysteresis);
    state_ = s;
}

} // namespace amp
} // namespace dsm
