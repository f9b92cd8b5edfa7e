// DeepSpeed's loss scaling for fp16 training (deepspeed/runtime/fp16/
// loss_scaler.py): a static scale, or a dynamic one that halves on overflow
// (after `hysteresis` overflows), doubles at each clean step whose distance
// from the last overflow, less one, is a positive multiple of `window`
// (DeepSpeed's stable_interval rule: without an overflow, at the steps
// window+1, 2 window+1, ...), and never drops below `min_scale`.
#pragma once

#include <cstdint>


namespace dsm {
namespace amp {

struct LossScalerConfig {
    bool dynamic = true;
    double static_scale = 1.0;        // when !dynamic
    double init_scale = 65536.0;      // 2^initial_scale_power
    double scale_factor = 2.0;
    int64_t window = 1000;            // loss_scale_window
    int64_t hysteresis = 2;           // delayed_shift
    bool consecutive_hysteresis = false;
    double min_scale = 1.0;
    bool raise_error_at_min_scale = true; // DeepSpeed's default; no fp16 key sets it
};

// The state a checkpoint stores, with DeepSpeed's names.
struct LossScalerState {
    double cur_scale = 1.0;
    int64_t cur_iter = 0;
    int64_t last_overflow_iter = -1;
    int64_t cur_hysteresis = 1;
};

class LossScaler {
public:
    explicit LossScaler(const LossScalerConfig &cfg);
    double scale() const noexcept { return state_.cur_scale; }
    bool dynamic() const noexcept { return cfg_.dynamic; }
    // DeepSpeed's update_scale(overflow). A dynamic scaler at min_scale that
    // sees an overflow with raise_error_at_min_scale throws DSM_ERR_NUMERIC
    // (the scale is left unchanged).
    void update(bool overflow);
    const LossScalerState &state() const noexcept { return state_; }
    void set_state(const LossScalerState &s);
    const LossScalerConfig &config() const noexcept { return cfg_; }

private:
    LossScalerConfig cfg_;
    LossScalerState state_;
};

} // namespace amp
} // namespace dsm
