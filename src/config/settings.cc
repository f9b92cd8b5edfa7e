#include "dsm_config.h"

#include "config/settings.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "config/json_reader.hpp"
#include "core/error.hpp"
#include "core/log.hpp"

namespace dsm {
namespace config {

namespace {

using optim::LrSchedule;
using optim::LrScheduleParams;
using optim::LrScheduleType;

void append_values(std::string &out, const std::vector<double> &values) {
    char buf[40];
    for (size_t g = 0; g < values.size(); ++g) {
        std::snprintf(buf, sizeof buf, g == 0 ? "%.10g" : " %.10g", values[g]);
        out += buf;
    }
}

void append_json_values(std::string &out, const std::vector<double> &values) {
    out += '[';
    for (size_t g = 0; g < values.size(); ++g) {
        if (g > 0) out += ',';
        out += Json(values[g]).dump();
    }
    out += ']';
}

std::string column_labels(const char *name, size_t groups) {
    if (groups == 1) return name;
    std::string s;
    for (size_t g = 0; g < groups; ++g) s += cat(g == 0 ? "" : " ", name, "[", g, "]");
    return s;
}

} // namespace

optim::Hyper optimizer_hyper(const OptimizerConfig &cfg) {
    DSM_REQUIRE(cfg.type != OptimizerType::NONE, DSM_ERR_CONFIG,
                "optimizer.type: none is configured, and the update needs one (Adam, AdamW, SGD, Lamb, "
                "Lion or Adagrad)");
    optim::Hyper h;
    h.type = cfg.type;
    h.lr = cfg.lr;
    h.beta1 = cfg.beta1;
    h.beta2 = cfg.beta2;
    h.eps = cfg.eps;
    h.weight_decay = cfg.weight_decay;
    h.adam_w_mode = cfg.type == OptimizerType::ADAMW || cfg.adam_w_mode;
    h.torch_adam = cfg.torch_adam;
    h.bias_correction = cfg.bias_correction;
    h.momentum = cfg.momentum;
    h.dampening = cfg.dampening;
    h.nesterov = cfg.nesterov;
    h.max_coeff = cfg.max_coeff;
    h.min_coeff = cfg.min_coeff;
    h.lr_decay = cfg.lr_decay;
    h.initial_accumulator_value = cfg.initial_accumulator_value;
    return h;
}

amp::LossScalerConfig loss_scaler_config(const Config &cfg) {
    amp::LossScalerConfig c;
    const Fp16Config &f = cfg.fp16;
    if (!f.enabled || f.loss_scale > 0.0) {
        // DeepSpeed's CreateLossScaler: a static LossScaler with
        // fp16.loss_scale in fp16, and 1.0 for fp32 and bf16.
        c.dynamic = false;
        c.static_scale = f.enabled ? f.loss_scale : 1.0;
        return c;
    }
    c.dynamic = true;
    c.init_scale = std::ldexp(1.0, static_cast<int>(f.initial_scale_power));
    c.scale_factor = 2.0; // fixed in DeepSpeed
    c.window = f.loss_scale_window;
    c.hysteresis = f.hysteresis;
    c.consecutive_hysteresis = f.consecutive_hysteresis;
    c.min_scale = f.min_loss_scale;
    c.raise_error_at_min_scale = true; // DeepSpeed's default; not a configuration key
    return c;
}

LrScheduleType lr_schedule_type(SchedulerType type) {
    switch (type) {
    case SchedulerType::WARMUP_LR: return LrScheduleType::WarmupLR;
    case SchedulerType::WARMUP_DECAY_LR: return LrScheduleType::WarmupDecayLR;
    case SchedulerType::WARMUP_COSINE_LR: return LrScheduleType::WarmupCosineLR;
    case SchedulerType::ONE_CYCLE: return LrScheduleType::OneCycle;
    case SchedulerType::LR_RANGE_TEST: return LrScheduleType::LRRangeTest;
    case SchedulerType::NONE: break;
    }
    DSM_FAIL(DSM_ERR_CONFIG, "scheduler.type: no scheduler is configured, got ",
             scheduler_name(type));
}

std::vector<double> base_lrs_from_config(const Config &cfg) {
    if (cfg.optimizer.type != OptimizerType::NONE) return {cfg.optimizer.lr};
    DSM_REQUIRE(cfg.scheduler.type != SchedulerType::NONE, DSM_ERR_CONFIG,
                "optimizer: the configuration has no optimizer type and no scheduler, so it "
                "defines no learning rate (the optimizer is built outside the configuration)");
    const LrScheduleParams &p = cfg.scheduler.schedule;
    if (cfg.scheduler.last_batch_iteration >= 0)
        DSM_FAIL(DSM_ERR_CONFIG, "optimizer: ", lr_schedule_name(p.type), " restored at last_batch_iteration ",
                 cfg.scheduler.last_batch_iteration,
                 " leaves the optimizer's lr in force until its first step, but the configuration has no optimizer "
                 "type (add \"optimizer\": {\"type\": ..., \"params\": {\"lr\": ...}})");
    if (optim::schedule_uses_base_lr(p)) {
        const char *why = p.type == LrScheduleType::WarmupCosineLR
                              ? "scales the optimizer's lr"
                              : "without scheduler.params.warmup_max_lr warms up to the optimizer's lr";
        DSM_FAIL(DSM_ERR_CONFIG, "optimizer: ", lr_schedule_name(p.type), " ", why,
                 ", but the configuration has no optimizer type (add \"optimizer\": {\"type\": ..., "
                 "\"params\": {\"lr\": ...}})");
    }
    return {0.0}; // ignored by this schedule
}

std::optional<LrSchedule> schedule_from_config(const Config &cfg) {
    if (cfg.scheduler.type == SchedulerType::NONE) return std::nullopt;
    LrScheduleParams p = cfg.scheduler.schedule;
    // DeepSpeed cycles momentum only for optimizers with betas: SGD's
    // momentum and Adagrad are left alone, with a warning.
    const OptimizerType t = cfg.optimizer.type;
    if (p.type == LrScheduleType::OneCycle && p.cycle_momentum &&
        (t == OptimizerType::SGD || t == OptimizerType::ADAGRAD)) {
        p.cycle_momentum = false;
        DSM_WARN(INIT, "scheduler: OneCycle's cycle_momentum is off: optimizer %s has no betas to cycle",
                 cfg.optimizer.type_name.c_str());
    }
    const std::vector<double> base = base_lrs_from_config(cfg);
    LrSchedule s = LrSchedule::create(p, std::vector<double>(optim::schedule_groups(p), base[0]));
    s.set_last_step(cfg.scheduler.last_batch_iteration);
    return s;
}

std::string describe_lr(const Config &cfg, int64_t steps, bool json) {
    DSM_REQUIRE(steps >= 0 && steps <= kDescribeLrMaxSteps, DSM_ERR_INVALID_ARGUMENT,
                "steps: must be in 0..", kDescribeLrMaxSteps, ", got ", steps);
    std::optional<LrSchedule> sched = schedule_from_config(cfg);
    const std::vector<double> constant = sched ? std::vector<double>() : base_lrs_from_config(cfg);
    const size_t groups = sched ? sched->num_groups() : constant.size();
    const bool has_momentum = sched && !sched->momentum().empty();
    // A schedule restored by hand (last_batch_iteration >= 0) leaves the
    // optimizer's lr and betas in force until its first step, as DeepSpeed's
    // do and as the engine does: step 0 lists the optimizer's values.
    const bool pending = sched && sched->last_step() >= 0;
    const char *name = sched ? lr_schedule_name(sched->type()) : "none";

    std::string out;
    out.reserve(static_cast<size_t>(steps + 1) * (json ? 40 : 20) * (has_momentum ? 2 : 1) + 512);
    if (json) {
        out += cat("{\"format\":\"dsm-lr\",\"format_version\":1,\"scheduler\":\"", name,
                   "\",\"params\":", (sched ? cfg.scheduler.params : Json::object()).dump(),
                   ",\"groups\":", groups);
        if (sched) out += cat(",\"last_batch_iteration\":", sched->last_step());
        out += ",\"steps\":[";
    } else {
        if (sched) {
            out += cat("scheduler ", name, ":");
            for (auto it = cfg.scheduler.params.begin(); it != cfg.scheduler.params.end(); ++it)
                out += cat(" ", it.key(), "=", it.value().dump());
            out += "\n";
        } else {
            out += cat("no scheduler: constant lr = optimizer lr (",
                       optimizer_name(cfg.optimizer.type), ", lr=",
                       Json(cfg.optimizer.lr).dump(), ")\n");
        }
        out += cat("parameter groups: ", groups,
                   "; step 0 = before the first optimizer step, step N = after N optimizer steps",
                   pending ? "; the optimizer's own lr until the first step (last_batch_iteration >= 0)" : "",
                   has_momentum ? "; momentum = beta1 set by OneCycle" : "", "\n");
        out += cat("step  ", column_labels("lr", groups),
                   has_momentum ? "  " + column_labels("momentum", groups) : std::string(), "\n");
    }
    for (int64_t i = 0; i <= steps; ++i) {
        if (sched && i > 0) sched->step();
        const bool before = pending && i == 0;
        const std::vector<double> lr =
            !sched ? constant : before ? std::vector<double>(groups, cfg.optimizer.lr) : sched->lr();
        const std::vector<double> mom =
            !has_momentum ? std::vector<double>() : before ? std::vector<double>(groups, cfg.optimizer.beta1)
                                                           : sched->momentum();
        if (json) {
            out += i == 0 ? "{\"step\":" : ",{\"step\":";
            out += std::to_string(i);
            out += ",\"lr\":";
            append_json_values(out, lr);
            if (has_momentum) {
                out += ",\"momentum\":";
                append_json_values(out, mom);
            }
            out += '}';
        } else {
            out += std::to_string(i);
            out += "  ";
            append_values(out, lr);
            if (has_momentum) {
                out += "  ";
                append_values(out, mom);
            }
            out += '\n';
        }
    }
    if (json) out += "]}\n";
    return out;
}

void check_schedule_params(const SchedulerConfig &sched) {
    if (sched.type == SchedulerType::NONE) return;
    // Placeholder base lrs: only the parameters are checked here.
    (void)LrSchedule::create(sched.schedule, std::vector<double>(optim::schedule_groups(sched.schedule), 1.0));
}

} // namespace config
} // namespace dsm
