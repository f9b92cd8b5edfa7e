// Learning-rate schedules with DeepSpeed's formulas, defaults and step
// counting (deepspeed/runtime/lr_schedules.py): WarmupLR, WarmupDecayLR,
// WarmupCosineLR, OneCycle and LRRangeTest.
//
// Step counting: a schedule starts at last_step() == -1 (DeepSpeed's
// last_batch_iteration); each step() adds one. lr() and momentum() are the
// values the optimizer holds after that many step() calls: at -1 the values
// DeepSpeed writes into the optimizer when it builds the schedule.
//
// Per-group values: every parameter DeepSpeed takes as "float or list" is a
// vector here. One element is a scalar applied to every parameter group; n
// elements (n = number of groups) give one value per group; any other length is
// DSM_ERR_CONFIG.
//
// Errors: create() validates the parameters and throws dsm::Error with
// DSM_ERR_CONFIG and a message "scheduler.params.NAME: ... got VALUE"
// ("scheduler.type: ..." for an unknown schedule name). Stricter than
// DeepSpeed, which only logs a warning and goes on, for an unknown warmup_type
// (DeepSpeed then uses "log") and for total_num_steps below warmup_num_steps;
// a negative decay_step_size, which DeepSpeed accepts, is also an error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dsm {
namespace optim {

enum class LrScheduleType { WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest };

// DeepSpeed's name of a schedule ("WarmupLR", ...).
const char *lr_schedule_name(LrScheduleType type) noexcept;

// The schedule a DeepSpeed name stands for (exact, case-sensitive as in
// DeepSpeed); otherwise DSM_ERR_CONFIG naming scheduler.type and the name.
LrScheduleType lr_schedule_type_from_name(const std::string &name);

// Every parameter of every schedule, with the defaults of DeepSpeed's
// constructors (what a ds_config "scheduler.params" block gets when a key is
// left out). A schedule reads only its own fields.
struct LrScheduleParams {
    LrScheduleType type = LrScheduleType::WarmupLR;

    // WarmupLR, WarmupDecayLR, WarmupCosineLR.
    int64_t warmup_num_steps = 1000; // must be > 0; values below 2 act as 2
    std::string warmup_type = "log"; // "log" or "linear"
    // WarmupDecayLR and WarmupCosineLR: required, >= the effective warmup_num_steps.
    std::optional<int64_t> total_num_steps;

    // WarmupLR, WarmupDecayLR.
    std::vector<double> warmup_min_lr = {0.0};
    // Empty: WarmupLR warms up to each group's base lr, WarmupDecayLR to 0.001.
    std::vector<double> warmup_max_lr;

    // WarmupCosineLR: ratios of each group's base lr.
    double warmup_min_ratio = 0.0;
    double cos_min_ratio = 0.0001;

    // OneCycle. cycle_min_lr and cycle_max_lr are required (no default in DeepSpeed).
    std::vector<double> cycle_min_lr;
    std::vector<double> cycle_max_lr;
    double decay_lr_rate = 0.0;
    int64_t cycle_first_step_size = 2000;              // > 0
    std::optional<int64_t> cycle_second_step_size;     // >= 0; unset: cycle_first_step_size
    int64_t cycle_first_stair_count = 0;               // <= 0: continuous
    std::optional<int64_t> cycle_second_stair_count;   // unset: cycle_first_stair_count
    int64_t decay_step_size = 0;                       // >= 0; 0: no post-cycle decay
    bool cycle_momentum = true;
    std::vector<double> cycle_min_mom = {0.8};
    std::vector<double> cycle_max_mom = {0.9};
    double decay_mom_rate = 0.0;

    // LRRangeTest.
    std::vector<double> lr_range_test_min_lr = {1e-3};
    int64_t lr_range_test_step_size = 2000; // > 0
    double lr_range_test_step_rate = 1.0;
    bool lr_range_test_staircase = false;
};

// A schedule bound to a number of parameter groups. A plain value: copy it,
// save last_step() in a checkpoint and restore it with set_last_step().
class LrSchedule {
public:
    // While OneCycle cycles momentum it sets each group's betas to
    // (momentum()[g], kOneCycleBeta2), as DeepSpeed does.
    static constexpr double kOneCycleBeta2 = 0.99;

    // base_lrs: each parameter group's lr as configured in the optimizer (one
    // element per group, at least one). WarmupCosineLR scales these; WarmupLR
    // warms up to them when warmup_max_lr is empty; the others ignore them.
    static LrSchedule create(const LrScheduleParams &params, std::vector<double> base_lrs);

    LrScheduleType type() const noexcept { return type_; }
    size_t num_groups() const noexcept { return base_lrs_.size(); }

    // Advance one training step (DeepSpeed's scheduler.step()).
    void step() noexcept { ++last_step_; }

    // DeepSpeed's last_batch_iteration: -1 before the first step().
    int64_t last_step() const noexcept { return last_step_; }

    // Restore a checkpointed last_step() (DeepSpeed's load_state_dict);
    // DSM_ERR_INVALID_ARGUMENT below -1.
    void set_last_step(int64_t last_step);

    // Each group's learning rate at last_step().
    std::vector<double> lr() const;

    // Each group's momentum (beta1) at last_step() for OneCycle with
    // cycle_momentum; empty for every other schedule.
    std::vector<double> momentum() const;

private:
    LrSchedule() = default;

    double warmup_gamma() const;     // WarmupLR, WarmupDecayLR: 0..1
    double cosine_ratio() const;     // WarmupCosineLR: factor on base lr
    double cycle_scale() const;      // OneCycle, inside the cycle: 0..1
    double decay_interval() const;   // OneCycle, after the cycle

    LrScheduleType type_ = LrScheduleType::WarmupLR;
    int64_t last_step_ = -1;
    std::vector<double> base_lrs_;

    // Warmup family.
    int64_t warmup_steps_ = 2; // max(2, warmup_num_steps)
    bool linear_ = false;
    int64_t total_steps_ = 0;
    std::vector<double> min_lrs_, max_lrs_; // also OneCycle's cycle bounds and LRRangeTest's min
    double warmup_min_ratio_ = 0.0, cos_min_ratio_ = 0.0;

    // OneCycle.
    double first_size_ = 0, second_size_ = 0, total_size_ = 0, step_ratio_ = 0;
    int64_t first_stairs_ = 0, second_stairs_ = 0;
    double decay_step_size_ = 0, decay_lr_rate_ = 0, decay_mom_rate_ = 0;
    bool skip_lr_decay_ = true, skip_mom_decay_ = true, cycle_momentum_ = false;
    std::vector<double> min_moms_, max_moms_;

    // LRRangeTest.
    double range_step_size_ = 0, range_step_rate_ = 0;
    bool staircase_ = false;
};

// Whether the schedule reads the base lr: WarmupCosineLR always, WarmupLR when
// warmup_max_lr is empty. The others take their lrs from their own parameters.
bool schedule_uses_base_lr(const LrScheduleParams &params) noexcept;

// The number of parameter groups the per-group lists of `params` imply: the
// longest list of the schedule's own "float or list" parameters, 1 when all
// are scalars.
size_t schedule_groups(const LrScheduleParams &params) noexcept;

} // namespace optim
} // namespace dsm
