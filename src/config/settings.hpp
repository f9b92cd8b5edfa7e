// What a parsed DeepSpeed configuration gives the layers below it, in their
// own types: the optimizer's hyperparameters (optim::Hyper), the loss
// scaler's settings (amp::LossScalerConfig) and the learning-rate schedule
// (the "scheduler" section, read once by the configuration reader into
// SchedulerConfig::schedule, with the optimizer's lr as the base lr), with a step-by-step listing of the schedule (dsm-info lr).
// The optimizer and mixed-precision layers know nothing of the configuration.
//
// Parameter groups: a configuration describes one optimizer lr, so the base
// lrs have one element. A per-group list in "scheduler.params" (n elements)
// makes schedule_from_config() and describe_lr() use n groups, each with the
// optimizer's lr as its base lr; lists of different lengths above 1 are
// DSM_ERR_CONFIG (from LrSchedule::create()).
//
// Errors: dsm::Error with DSM_ERR_CONFIG and a message naming
// "scheduler.params.KEY" and the value found; DSM_ERR_INVALID_ARGUMENT for a
// bad `steps` in describe_lr().
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "amp/loss_scaler.hpp"
#include "config/config.hpp"
#include "optim/lr_schedule.hpp"
#include "optim/optimizer.hpp"

namespace dsm {
namespace config {

// describe_lr() lists at most this many steps.
constexpr int64_t kDescribeLrMaxSteps = 10000000;

// The configured optimizer's hyperparameters (type NONE: DSM_ERR_CONFIG).
optim::Hyper optimizer_hyper(const OptimizerConfig &cfg);

// fp16 section -> scaler settings (dynamic when loss_scale == 0). With fp16
// off (fp32, bf16) the scaler is static at 1.
amp::LossScalerConfig loss_scaler_config(const Config &cfg);

// The LrScheduleType of a configured scheduler; DSM_ERR_CONFIG for NONE.
optim::LrScheduleType lr_schedule_type(SchedulerType type);

// The base lr of each parameter group: the optimizer's lr (one group), which
// the configuration reader sets to the optimizer type's default when
// "optimizer.params.lr" is missing (1e-3; 1e-2 for Adagrad). Without an
// optimizer type the learning rate belongs to an optimizer built outside the
// configuration: DSM_ERR_CONFIG when the configured scheduler reads the base
// lr, starts at last_batch_iteration >= 0 (the optimizer's lr is in force
// until its first step), or there is no scheduler; otherwise {0.0}, a
// placeholder that the schedule ignores.
std::vector<double> base_lrs_from_config(const Config &cfg);

// Check the ranges of the schedule's parameters (what LrSchedule::create()
// checks), whether or not the optimizer's lr is known: the reader calls it,
// so a configuration is rejected when it is read, not when training starts.
void check_schedule_params(const SchedulerConfig &sched);

// The configured schedule, with schedule_groups() groups and its last_step()
// at "scheduler.params.last_batch_iteration"; empty without a scheduler.
std::optional<optim::LrSchedule> schedule_from_config(const Config &cfg);

// The learning rate of each parameter group and, for OneCycle with
// cycle_momentum, the momentum (beta1) at step 0 (before the first optimizer
// step: the values the schedule sets when it is built at
// last_batch_iteration -1; the optimizer's lr and beta1 for a schedule
// restored by hand at last_batch_iteration >= 0, which leaves them alone
// until its first step, as DeepSpeed's schedules and the engine do) and
// after each of 1..steps optimizer steps. Without a scheduler the lr is the optimizer's lr
// at every step. `steps` in 0..kDescribeLrMaxSteps, else
// DSM_ERR_INVALID_ARGUMENT.
//
// JSON (one line):
//   {"format":"dsm-lr","format_version":1,"scheduler":"WarmupLR" (or "none"),
//    "params":{...scheduler.params...},"groups":1,"last_batch_iteration":-1,
//    "steps":[{"step":0,"lr":[...],"momentum":[...]}, ...]}
// with "momentum" only for OneCycle with cycle_momentum.
// ("last_batch_iteration": the schedule's last_step() at step 0; only with a
// scheduler.)
// Text: two header lines (the schedule and its parameters; the groups and
// what a step is), a column line starting with "step", then one line per step:
//   STEP  LR[0] [LR[1] ...]  [MOM[0] [MOM[1] ...]]
// Data lines, and only they, start with a digit.
std::string describe_lr(const Config &cfg, int64_t steps, bool json);

} // namespace config
} // namespace dsm
