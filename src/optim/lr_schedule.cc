#include "dsm_config.h"

#include "optim/lr_schedule.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

#include "core/error.hpp"

namespace dsm {
namespace optim {

namespace {

constexpr const char *kPrefix = "scheduler.params.";
constexpr double kPi = 3.14159265358979323846;

// One value per group from a "float or list" parameter.
std::vector<double> per_group(const std::vector<double> &value, size_t groups, const char *key) {
    if (value.size() == 1) return std::vector<double>(groups, value[0]);
    DSM_REQUIRE(value.size() == groups, DSM_ERR_CONFIG, kPrefix, key, ": expected 1 or ", groups,
                " values (one per parameter group), got ", value.size());
    return value;
}

void require_total_steps(const LrScheduleParams &p, int64_t warmup_steps) {
    DSM_REQUIRE(p.total_num_steps.has_value(), DSM_ERR_CONFIG, kPrefix,
                "total_num_steps: required by ", lr_schedule_name(p.type), ", got none");
    DSM_REQUIRE(*p.total_num_steps >= warmup_steps, DSM_ERR_CONFIG, kPrefix,
                "total_num_steps: must be at least warmup_num_steps (", warmup_steps, "), got ",
                *p.total_num_steps);
}

} // namespace

const char *lr_schedule_name(LrScheduleType type) noexcept {
    switch (type) {
    case LrScheduleType::WarmupLR: return "WarmupLR";
    case LrScheduleType::WarmupDecayLR: return "WarmupDecayLR";
    case LrScheduleType::WarmupCosineLR: return "WarmupCosineLR";
    case LrScheduleType::OneCycle: return "OneCycle";
    case LrScheduleType::LRRangeTest: return "LRRangeTest";
    }
    return "unknown";
}

bool schedule_uses_base_lr(const LrScheduleParams &p) noexcept {
    return p.type == LrScheduleType::WarmupCosineLR ||
           (p.type == LrScheduleType::WarmupLR && p.warmup_max_lr.empty());
}

size_t schedule_groups(const LrScheduleParams &p) noexcept {
    size_t n = 1;
    auto take = [&n](const std::vector<double> &v) { n = std::max(n, v.size()); };
    switch (p.type) {
    case LrScheduleType::WarmupLR:
    case LrScheduleType::WarmupDecayLR:
        take(p.warmup_min_lr);
        take(p.warmup_max_lr);
        break;
    case LrScheduleType::WarmupCosineLR: break;
    case LrScheduleType::OneCycle:
        take(p.cycle_min_lr);
        take(p.cycle_max_lr);
        if (p.cycle_momentum) {
            take(p.cycle_min_mom);
            take(p.cycle_max_mom);
        }
        break;
    case LrScheduleType::LRRangeTest: take(p.lr_range_test_min_lr); break;
    }
    return n;
}

LrScheduleType lr_schedule_type_from_name(const std::string &name) {
    for (auto t : {LrScheduleType::WarmupLR, LrScheduleType::WarmupDecayLR,
                   LrScheduleType::WarmupCosineLR, LrScheduleType::OneCycle,
                   LrScheduleType::LRRangeTest}) {
        if (name == lr_schedule_name(t)) return t;
    }
    DSM_FAIL(DSM_ERR_CONFIG,
             "scheduler.type: expected WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle or "
             "LRRangeTest, got \"",
             name, "\"");
}

LrSchedule LrSchedule::create(const LrScheduleParams &p, std::vector<double> base_lrs) {
    DSM_REQUIRE(!base_lrs.empty(), DSM_ERR_INVALID_ARGUMENT,
                "base_lrs: at least one parameter group is required, got 0");
    LrSchedule s;
    s.type_ = p.type;
    s.base_lrs_ = std::move(base_lrs);
    const size_t groups = s.base_lrs_.size();

    switch (p.type) {
    case LrScheduleType::WarmupLR:
    case LrScheduleType::WarmupDecayLR:
    case LrScheduleType::WarmupCosineLR: {
        DSM_REQUIRE(p.warmup_num_steps > 0, DSM_ERR_CONFIG, kPrefix,
                    "warmup_num_steps: must be a positive integer, got ", p.warmup_num_steps);
        DSM_REQUIRE(p.warmup_type == "log" || p.warmup_type == "linear", DSM_ERR_CONFIG, kPrefix,
                    "warmup_type: must be \"log\" or \"linear\", got \"", p.warmup_type, "\"");
        s.linear_ = p.warmup_type == "linear";
        s.warmup_steps_ = std::max<int64_t>(2, p.warmup_num_steps);
        if (p.type != LrScheduleType::WarmupLR) {
            require_total_steps(p, s.warmup_steps_);
            s.total_steps_ = *p.total_num_steps;
        }
        if (p.type == LrScheduleType::WarmupCosineLR) {
            s.warmup_min_ratio_ = p.warmup_min_ratio;
            s.cos_min_ratio_ = p.cos_min_ratio;
            break;
        }
        s.min_lrs_ = per_group(p.warmup_min_lr, groups, "warmup_min_lr");
        if (!p.warmup_max_lr.empty())
            s.max_lrs_ = per_group(p.warmup_max_lr, groups, "warmup_max_lr");
        else if (p.type == LrScheduleType::WarmupLR)
            s.max_lrs_ = s.base_lrs_;
        else
            s.max_lrs_.assign(groups, 0.001);
        break;
    }
    case LrScheduleType::OneCycle: {
        DSM_REQUIRE(!p.cycle_min_lr.empty(), DSM_ERR_CONFIG, kPrefix,
                    "cycle_min_lr: required by OneCycle, got none");
        DSM_REQUIRE(!p.cycle_max_lr.empty(), DSM_ERR_CONFIG, kPrefix,
                    "cycle_max_lr: required by OneCycle, got none");
        DSM_REQUIRE(p.cycle_first_step_size > 0, DSM_ERR_CONFIG, kPrefix,
                    "cycle_first_step_size: must be positive, got ", p.cycle_first_step_size);
        const int64_t second = p.cycle_second_step_size.value_or(p.cycle_first_step_size);
        DSM_REQUIRE(second >= 0, DSM_ERR_CONFIG, kPrefix,
                    "cycle_second_step_size: must be non-negative, got ", second);
        DSM_REQUIRE(p.decay_step_size >= 0, DSM_ERR_CONFIG, kPrefix,
                    "decay_step_size: must be non-negative, got ", p.decay_step_size);
        s.first_size_ = static_cast<double>(p.cycle_first_step_size);
        s.second_size_ = static_cast<double>(second);
        s.total_size_ = s.first_size_ + s.second_size_;
        s.step_ratio_ = s.first_size_ / s.total_size_;
        s.first_stairs_ = p.cycle_first_stair_count;
        s.second_stairs_ = p.cycle_second_stair_count.value_or(p.cycle_first_stair_count);
        s.decay_step_size_ = static_cast<double>(p.decay_step_size);
        s.min_lrs_ = per_group(p.cycle_min_lr, groups, "cycle_min_lr");
        s.max_lrs_ = per_group(p.cycle_max_lr, groups, "cycle_max_lr");
        s.decay_lr_rate_ = p.decay_lr_rate;
        // DeepSpeed skips a decay when its step size or its rate is zero.
        s.skip_lr_decay_ = p.decay_step_size == 0 || p.decay_lr_rate == 0.0;
        s.cycle_momentum_ = p.cycle_momentum;
        if (s.cycle_momentum_) {
            s.min_moms_ = per_group(p.cycle_min_mom, groups, "cycle_min_mom");
            s.max_moms_ = per_group(p.cycle_max_mom, groups, "cycle_max_mom");
            s.decay_mom_rate_ = p.decay_mom_rate;
            s.skip_mom_decay_ = p.decay_step_size == 0 || p.decay_mom_rate == 0.0;
        }
        break;
    }
    case LrScheduleType::LRRangeTest:
        s.min_lrs_ = per_group(p.lr_range_test_min_lr, groups, "lr_range_test_min_lr");
        DSM_REQUIRE(p.lr_range_test_step_size > 0, DSM_ERR_CONFIG, kPrefix,
                    "lr_range_test_step_size: must be a positive integer, got ",
                    p.lr_range_test_step_size);
        s.range_step_size_ = static_cast<double>(p.lr_range_test_step_size);
        s.range_step_rate_ = p.lr_range_test_step_rate;
        s.staircase_ = p.lr_range_test_staircase;
        break;
    default:
        DSM_FAIL(DSM_ERR_CONFIG, "scheduler.type: unknown schedule, got ",
                 static_cast<int>(p.type));
    }
    return s;
}

void LrSchedule::set_last_step(int64_t last_step) {
    DSM_REQUIRE(last_step >= -1, DSM_ERR_INVALID_ARGUMENT,
                "last_step: must be -1 (not started) or more, got ", last_step);
    last_step_ = last_step;
}

// Warmup fraction reached at last_step_ (< warmup_steps_), shared by the
// warmup schedules: log(t + 1) / log(W) or t / W.
static double warmup_fraction(int64_t t, int64_t warmup_steps, bool linear) {
    if (linear) return static_cast<double>(t) / static_cast<double>(warmup_steps);
    const double inverse_log = 1.0 / std::log(static_cast<double>(warmup_steps));
    return inverse_log * std::log(static_cast<double>(t + 1));
}

double LrSchedule::warmup_gamma() const {
    if (last_step_ < warmup_steps_) return warmup_fraction(last_step_, warmup_steps_, linear_);
    if (type_ == LrScheduleType::WarmupLR) return 1.0;
    // WarmupDecayLR: linear decay to 0 at total_num_steps.
    const double remaining = static_cast<double>(total_steps_ - last_step_);
    const double span = std::max(1.0, static_cast<double>(total_steps_ - warmup_steps_));
    return std::max(0.0, remaining / span);
}

double LrSchedule::cosine_ratio() const {
    if (last_step_ < warmup_steps_) {
        const double ratio = warmup_fraction(last_step_, warmup_steps_, linear_);
        return warmup_min_ratio_ + ratio * (1.0 - warmup_min_ratio_);
    }
    const double real_last = static_cast<double>(last_step_ - warmup_steps_ + 1);
    const double real_total = static_cast<double>(std::max<int64_t>(1, total_steps_ - warmup_steps_));
    const double progress = std::min(1.0, real_last / real_total);
    const double ratio = (1.0 + std::cos(kPi * progress)) / 2.0;
    return std::max(0.0, cos_min_ratio_ + (1.0 - cos_min_ratio_) * ratio);
}

// Position in the cycle, 0 at the ends and 1 at the peak, for the batch after
// last_step_; with stairs, held flat over each of stair_count equal parts of a
// half cycle, quantised from the integer batch offset as DeepSpeed does.
double LrSchedule::cycle_scale() const {
    const double batch = static_cast<double>(last_step_ + 1);
    const double cycle = std::floor(1.0 + batch / total_size_);
    const double x = 1.0 + batch / total_size_ - cycle;
    double scale;
    int64_t stairs;
    if (x <= step_ratio_) {
        scale = x / step_ratio_;
        stairs = first_stairs_;
    } else {
        scale = (x - 1.0) / (step_ratio_ - 1.0);
        stairs = second_stairs_;
    }
    if (stairs > 0) {
        const double count = static_cast<double>(stairs);
        const double in_cycle = std::fmod(batch, total_size_);
        const double position = in_cycle <= first_size_
                                    ? in_cycle * count / first_size_
                                    : (total_size_ - in_cycle) * count / second_size_;
        scale = std::floor(position) / count;
    }
    return scale;
}

double LrSchedule::decay_interval() const {
    return (static_cast<double>(last_step_) - total_size_ + 1.0) / decay_step_size_;
}

std::vector<double> LrSchedule::lr() const {
    const size_t groups = base_lrs_.size();
    std::vector<double> out(groups);
    switch (type_) {
    case LrScheduleType::WarmupLR:
    case LrScheduleType::WarmupDecayLR: {
        if (last_step_ < 0) return min_lrs_;
        const double gamma = warmup_gamma();
        for (size_t g = 0; g < groups; ++g)
            out[g] = min_lrs_[g] + (max_lrs_[g] - min_lrs_[g]) * gamma;
        return out;
    }
    case LrScheduleType::WarmupCosineLR: {
        if (last_step_ < 0) return out; // DeepSpeed sets 0.0 before the first step
        const double ratio = cosine_ratio();
        for (size_t g = 0; g < groups; ++g) out[g] = base_lrs_[g] * ratio;
        return out;
    }
    case LrScheduleType::OneCycle: {
        if (last_step_ < 0) return min_lrs_;
        if (static_cast<double>(last_step_) < total_size_) {
            const double scale = cycle_scale();
            for (size_t g = 0; g < groups; ++g)
                out[g] = min_lrs_[g] + (max_lrs_[g] - min_lrs_[g]) * scale;
            return out;
        }
        if (skip_lr_decay_) return min_lrs_;
        const double factor = 1.0 + decay_lr_rate_ * decay_interval();
        for (size_t g = 0; g < groups; ++g) out[g] = min_lrs_[g] / factor;
        return out;
    }
    case LrScheduleType::LRRangeTest: {
        double interval = static_cast<double>(last_step_ + 1) / range_step_size_;
        if (staircase_) interval = std::floor(interval);
        const double increase = 1.0 + range_step_rate_ * interval;
        for (size_t g = 0; g < groups; ++g) out[g] = min_lrs_[g] * increase;
        return out;
    }
    }
    return out;
}

std::vector<double> LrSchedule::momentum() const {
    if (type_ != LrScheduleType::OneCycle || !cycle_momentum_) return {};
    // DeepSpeed sets cycle_min_mom when it builds the schedule, although the
    // cycle formula gives cycle_max_mom at the first step.
    if (last_step_ < 0) return min_moms_;
    const size_t groups = base_lrs_.size();
    std::vector<double> out(groups);
    if (static_cast<double>(last_step_) < total_size_) {
        const double scale = cycle_scale();
        for (size_t g = 0; g < groups; ++g)
            out[g] = max_moms_[g] - (max_moms_[g] - min_moms_[g]) * scale;
        return out;
    }
    if (skip_mom_decay_) return max_moms_;
    const double factor = 1.0 + decay_mom_rate_ * decay_interval();
    for (size_t g = 0; g < groups; ++g) out[g] = max_moms_[g] * factor;
    return out;
}

} // namespace optim
} // namespace dsm
