// The resolved configuration as JSON (for `dsm-info config --json`).
//
// Format: one object with DeepSpeed's key names and nesting, every key with
// its effective value (defaults filled in, the batch values derived), plus
//   "resolved": {"world_size", "data_parallel_world_size",
//                "data_parallel_source": "mesh"|"sequence_parallel_size"|"world",
//                "given": [batch keys present in the file],
//                "derived": [batch keys libdsm computed],
//                "no_effect": [key paths read and checked that change nothing in libdsm]}
//   "unknown_keys": [key paths that were ignored]
// Dtypes are "fp32"/"fp16"/"bf16" or null where DeepSpeed decides from other
// keys; names are canonical ("adamw", "WarmupLR", "WARN").
#include "config/config.hpp"

#include <algorithm>

namespace dsm {
namespace config {

namespace {

using OJson = nlohmann::ordered_json;

// Keys the engine reads and checks and then never consults, as
// config_to_json() nests them (engine.md, "Configuration keys the engine
// uses", is the other side of this list).
const char *const kNoEffect[] = {
    "zero_allow_untested_optimizer",
    "zero_force_ds_cpu_optimizer",
    "seq_parallel_communication_data_type",
    "fp16.auto_cast",
    "fp16.fp16_master_weights_and_grads",
    "bf16.immediate_grad_update",
    "zero_optimization.contiguous_gradients",
    "zero_optimization.reduce_scatter",
    "zero_optimization.use_multi_rank_bucket_allreduce",
    "zero_optimization.allgather_partitions",
    "zero_optimization.load_from_fp32_weights",
    "zero_optimization.offload_optimizer.buffer_count",
    "zero_optimization.offload_optimizer.ratio",
    "zero_optimization.offload_param.buffer_count",
    "zero_optimization.sub_group_size",
    "zero_optimization.stage3_model_persistence_threshold",
    "zero_optimization.stage3_gather_16bit_weights_on_model_save",
    "zero_optimization.stage3_module_granularity_threshold",
    "zero_optimization.stage3_use_all_reduce_for_fetch_params",
    "zero_optimization.ignore_unused_parameters",
    "zero_optimization.round_robin_gradients",
    "zero_optimization.mics_shard_size",
    "zero_optimization.memory_efficient_linear",
    "zero_optimization.override_module_apply",
    "zero_optimization.legacy_form",
    "checkpoint.load_universal",
    "data_types.grad_accum_dtype",
};

OJson dtype_json(Dtype d) { return d == Dtype::NONE ? OJson() : OJson(dtype_name(d)); }

const char *device_name(OffloadDevice d) {
    switch (d) {
    case OffloadDevice::NONE: return "none";
    case OffloadDevice::CPU: return "cpu";
    case OffloadDevice::NVME: return "nvme";
    }
    return "?";
}

OJson offload_json(const OffloadConfig &o, bool optimizer) {
    OJson j;
    j["device"] = device_name(o.device);
    j["pin_memory"] = o.pin_memory;
    j["buffer_count"] = o.buffer_count;
    if (optimizer) j["ratio"] = o.ratio;
    return j;
}

OJson zero_json(const ZeroConfig &z) {
    OJson j;
    j["stage"] = z.stage;
    j["contiguous_gradients"] = z.contiguous_gradients;
    j["reduce_scatter"] = z.reduce_scatter;
    j["reduce_bucket_size"] = z.reduce_bucket_size;
    j["use_multi_rank_bucket_allreduce"] = z.use_multi_rank_bucket_allreduce;
    j["allgather_partitions"] = z.allgather_partitions;
    j["allgather_bucket_size"] = z.allgather_bucket_size;
    j["overlap_comm"] = z.overlap_comm;
    j["load_from_fp32_weights"] = z.load_from_fp32_weights;
    j["offload_optimizer"] = offload_json(z.offload_optimizer, true);
    j["offload_param"] = offload_json(z.offload_param, false);
    j["sub_group_size"] = z.sub_group_size;
    j["stage3_prefetch_bucket_size"] = z.prefetch_bucket_size;
    j["stage3_param_persistence_threshold"] = z.param_persistence_threshold;
    j["stage3_model_persistence_threshold"] = z.model_persistence_threshold;
    j["stage3_max_live_parameters"] = z.max_live_parameters;
    j["stage3_max_reuse_distance"] = z.max_reuse_distance;
    j["stage3_gather_16bit_weights_on_model_save"] = z.gather_16bit_weights_on_model_save;
    j["stage3_module_granularity_threshold"] = z.module_granularity_threshold;
    j["stage3_use_all_reduce_for_fetch_params"] = z.use_all_reduce_for_fetch_params;
    j["ignore_unused_parameters"] = z.ignore_unused_parameters;
    j["round_robin_gradients"] = z.round_robin_gradients;
    j["zero_hpz_partition_size"] = z.zero_hpz_partition_size;
    j["zero_quantized_weights"] = z.zero_quantized_weights;
    j["zero_quantized_gradients"] = z.zero_quantized_gradients;
    j["mics_shard_size"] = z.mics_shard_size;
    j["memory_efficient_linear"] = z.memory_efficient_linear;
    j["override_module_apply"] = z.override_module_apply;
    j["legacy_form"] = z.legacy_form;
    return j;
}

OJson optimizer_json(const OptimizerConfig &o) {
    if (o.type == OptimizerType::NONE) return OJson();
    OJson j;
    j["type"] = optimizer_name(o.type);
    OJson p;
    p["lr"] = o.lr;
    p["weight_decay"] = o.weight_decay;
    switch (o.type) {
    case OptimizerType::ADAM:
    case OptimizerType::ADAMW:
    case OptimizerType::LAMB:
        p["betas"] = {o.beta1, o.beta2};
        p["eps"] = o.eps;
        p["bias_correction"] = o.bias_correction;
        if (o.type == OptimizerType::LAMB) {
            p["max_coeff"] = o.max_coeff;
            p["min_coeff"] = o.min_coeff;
        } else {
            p["adam_w_mode"] = o.adam_w_mode;
            p["torch_adam"] = o.torch_adam;
        }
        break;
    case OptimizerType::LION: p["betas"] = {o.beta1, o.beta2}; break;
    case OptimizerType::ADAGRAD:
        p["eps"] = o.eps;
        p["lr_decay"] = o.lr_decay;
        p["initial_accumulator_value"] = o.initial_accumulator_value;
        break;
    case OptimizerType::SGD:
        p["momentum"] = o.momentum;
        p["dampening"] = o.dampening;
        p["nesterov"] = o.nesterov;
        break;
    case OptimizerType::NONE: break;
    }
    j["params"] = p;
    return j;
}

} // namespace

std::string config_to_json(const Config &c) {
    OJson j;
    j["train_batch_size"] = c.train_batch_size;
    j["train_micro_batch_size_per_gpu"] = c.train_micro_batch_size_per_gpu;
    j["gradient_accumulation_steps"] = c.gradient_accumulation_steps;
    j["steps_per_print"] = c.steps_per_print;
    j["wall_clock_breakdown"] = c.wall_clock_breakdown;
    j["gradient_clipping"] = c.gradient_clipping;
    j["prescale_gradients"] = c.prescale_gradients;
    j["gradient_predivide_factor"] = c.gradient_predivide_factor;
    j["gradient_allreduce_op"] = c.gradient_allreduce_op == AllreduceOp::SUM ? "sum" : "mean";
    j["communication_data_type"] = dtype_json(c.communication_data_type);
    j["seq_parallel_communication_data_type"] = dtype_json(c.seq_parallel_communication_data_type);
    j["sequence_parallel_size"] = c.sequence_parallel_size;
    j["data_parallel_size"] = c.data_parallel_size > 0 ? OJson(c.data_parallel_size) : OJson();
    j["zero_allow_untested_optimizer"] = c.zero_allow_untested_optimizer;
    j["zero_force_ds_cpu_optimizer"] = c.zero_force_ds_cpu_optimizer;

    OJson f;
    f["enabled"] = c.fp16.enabled;
    f["auto_cast"] = c.fp16.auto_cast;
    f["loss_scale"] = c.fp16.loss_scale;
    f["initial_scale_power"] = c.fp16.initial_scale_power;
    f["loss_scale_window"] = c.fp16.loss_scale_window;
    f["hysteresis"] = c.fp16.hysteresis;
    f["consecutive_hysteresis"] = c.fp16.consecutive_hysteresis;
    f["min_loss_scale"] = c.fp16.min_loss_scale;
    f["fp16_master_weights_and_grads"] = c.fp16.fp16_master_weights_and_grads;
    j["fp16"] = f;
    OJson b;
    b["enabled"] = c.bf16.enabled;
    b["immediate_grad_update"] = c.bf16.immediate_grad_update;
    b["check_grad_overflow"] = c.bf16.check_grad_overflow;
    j["bf16"] = b;
    static const char *nonfinite[] = {"warn", "skip", "fail"};
    j["fp32_nonfinite_gradients"] = nonfinite[static_cast<int>(c.fp32_nonfinite_gradients)];
    j["zero_optimization"] = zero_json(c.zero);
    j["optimizer"] = optimizer_json(c.optimizer);
    if (c.scheduler.type == SchedulerType::NONE) {
        j["scheduler"] = OJson();
    } else {
        OJson s;
        s["type"] = scheduler_name(c.scheduler.type);
        s["params"] = OJson::parse(c.scheduler.params.dump());
        j["scheduler"] = s;
    }
    static const char *tags[] = {"WARN", "IGNORE", "FAIL"};
    for (auto [key, mc] : {std::pair<const char *, const MonitorConfig *>{"csv_monitor", &c.csv_monitor},
                           std::pair<const char *, const MonitorConfig *>{"tensorboard", &c.tensorboard}})
        j[key] = {{"enabled", mc->enabled}, {"output_path", mc->output_path}, {"job_name", mc->job_name}};
    j["checkpoint"] = {{"tag_validation", tags[static_cast<int>(c.checkpoint.tag_validation)]},
                       {"load_universal", c.checkpoint.load_universal},
                       {"writer", {{"decoupled", c.checkpoint.decoupled}}},
                       {"keep_last", c.checkpoint.keep_last}};
    j["data_types"] = {{"grad_accum_dtype", dtype_json(c.grad_accum_dtype)}};

    OJson given = OJson::array(), derived = OJson::array();
    (c.train_batch_size_given ? given : derived).push_back("train_batch_size");
    (c.train_micro_batch_size_per_gpu_given ? given : derived).push_back("train_micro_batch_size_per_gpu");
    (c.gradient_accumulation_steps_given ? given : derived).push_back("gradient_accumulation_steps");
    OJson r;
    r["world_size"] = c.world_size;
    r["data_parallel_world_size"] = c.data_parallel_world_size;
    r["data_parallel_source"] = c.data_parallel_source;
    r["given"] = given;
    r["derived"] = derived;
    r["no_effect"] = OJson::array();
    j["resolved"] = r;
    j["unknown_keys"] = c.unknown_keys;
    for (const char *k : kNoEffect) {
        std::string pointer = std::string("/") + k;
        std::replace(pointer.begin(), pointer.end(), '.', '/');
        if (j.contains(OJson::json_pointer(pointer))) j["resolved"]["no_effect"].push_back(k);
    }
    return j.dump(2);
}

bool key_has_no_effect(const std::string &path) {
    for (const char *k : kNoEffect)
        if (path == k) return true;
    return false;
}

} // namespace config
} // namespace dsm
