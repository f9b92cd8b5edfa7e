// "zero_optimization": DeepSpeed's DeepSpeedZeroConfig keys and defaults.
#include "config/config_internal.hpp"

#include "core/error.hpp"
#include "core/log.hpp"

namespace dsm {
namespace config {

namespace {

[[noreturn]] void unsupported(const std::string &path, const std::string &what) {
    DSM_FAIL(DSM_ERR_NOT_SUPPORTED, path, ": ", what, " is not supported by libdsm");
}

void read_offload(Node &zero, const char *key, OffloadConfig &out, bool optimizer) {
    Node off = zero.child(key);
    if (!off.present()) return;
    out.device = static_cast<OffloadDevice>(off.get_choice("device", 0, {"none", "cpu", "nvme"}));
    if (out.device == OffloadDevice::NVME)
        unsupported(off.key_path("device"), "offloading to NVMe (\"nvme\")");
    off.get_string("nvme_path", "");
    out.pin_memory = off.get_bool("pin_memory", false);
    out.buffer_count = off.get_int("buffer_count", out.buffer_count, 0);
    if (optimizer) {
        off.get_bool("pipeline_read", false);
        off.get_bool("pipeline_write", false);
        off.get_bool("fast_init", false);
        out.ratio = off.get_number("ratio", 1.0, 0.0, 1.0);
    } else {
        off.get_int("buffer_size", 100000000, 0);
        off.get_int("max_in_cpu", 1000000000, 0);
    }
    off.finish();
}

// Keys DeepSpeed has that libdsm accepts only in their default (off) state.
void reject_enabled(Node &zero) {
    static const char *bools[] = {"zero_quantized_nontrainable_weights", "mics_hierarchical_params_gather",
                                  "legacy_stage1", "elastic_checkpoint", "pipeline_loading_checkpoint"};
    for (const char *k : bools)
        if (zero.get_bool(k, false)) unsupported(zero.key_path(k), cat("\"", k, "\": true"));
    if (zero.get(std::string("zeropp_loco_param")) != nullptr)
        unsupported(zero.key_path("zeropp_loco_param"), "LoCo-ZeRO++ (\"zeropp_loco_param\")");
}

} // namespace

void read_zero(Node &root, Config &cfg) {
    ZeroConfig &z = cfg.zero;
    const Json *v = root.get("zero_optimization");
    if (v != nullptr && v->is_boolean()) {
        // Legacy form: true means stage 1, with "allgather_size" at the top level.
        z.legacy_form = true;
        z.stage = v->get<bool>() ? 1 : 0;
        if (z.stage > 0) z.allgather_bucket_size = root.get_int("allgather_size", z.allgather_bucket_size, 0);
        DSM_WARN(INIT, "configuration: \"zero_optimization\": %s is DeepSpeed's deprecated form; use "
                       "{\"stage\": %d}",
                 z.stage ? "true" : "false", z.stage);
        z.overlap_comm = false;
        return;
    }
    Node zero = root.child("zero_optimization");
    z.stage = static_cast<int>(zero.get_int("stage", 0, 0, 3));
    z.contiguous_gradients = zero.get_bool("contiguous_gradients", z.contiguous_gradients);
    z.reduce_scatter = zero.get_bool("reduce_scatter", z.reduce_scatter);
    z.reduce_bucket_size = zero.get_int("reduce_bucket_size", z.reduce_bucket_size, 0);
    z.use_multi_rank_bucket_allreduce =
        zero.get_bool("use_multi_rank_bucket_allreduce", z.use_multi_rank_bucket_allreduce);
    z.allgather_partitions = zero.get_bool("allgather_partitions", z.allgather_partitions);
    z.allgather_bucket_size = zero.get_int("allgather_bucket_size", z.allgather_bucket_size, 0);
    // ZeRO-1/2 split each allgather into numel * dp / allgather_bucket_size shards.
    if ((z.stage == 1 || z.stage == 2) && z.allgather_bucket_size == 0)
        zero.fail("allgather_bucket_size", "an integer >= 1 with ZeRO stage 1 or 2", Json(0));
    z.overlap_comm = zero.get_bool("overlap_comm", z.stage == 3);
    z.load_from_fp32_weights = zero.get_bool("load_from_fp32_weights", z.load_from_fp32_weights);

    // Deprecated spellings of the offload blocks.
    if (zero.get_bool("cpu_offload", false)) z.offload_optimizer.device = OffloadDevice::CPU;
    if (zero.get_bool("cpu_offload_param", false)) z.offload_param.device = OffloadDevice::CPU;
    bool pin = zero.get_bool("cpu_offload_use_pin_memory", false);
    z.offload_optimizer.pin_memory = z.offload_param.pin_memory = pin;
    read_offload(zero, "offload_optimizer", z.offload_optimizer, true);
    read_offload(zero, "offload_param", z.offload_param, false);
    if (z.offload_optimizer.ratio < 1.0 && z.stage != 3)
        DSM_FAIL(DSM_ERR_CONFIG, "zero_optimization.offload_optimizer.ratio: partial offloading (",
                 z.offload_optimizer.ratio, ") is only supported with ZeRO stage 3, stage is ", z.stage);

    z.sub_group_size = zero.get_int("sub_group_size", z.sub_group_size, 0);
    z.prefetch_bucket_size = zero.get_int("stage3_prefetch_bucket_size", z.prefetch_bucket_size, 0);
    z.param_persistence_threshold =
        zero.get_int("stage3_param_persistence_threshold", z.param_persistence_threshold, 0);
    z.model_persistence_threshold =
        zero.get_int("stage3_model_persistence_threshold", z.model_persistence_threshold, 0);
    z.max_live_parameters = zero.get_int("stage3_max_live_parameters", z.max_live_parameters, 0);
    z.max_reuse_distance = zero.get_int("stage3_max_reuse_distance", z.max_reuse_distance, 0);
    bool old_gather = zero.get_bool("stage3_gather_fp16_weights_on_model_save", false);
    z.gather_16bit_weights_on_model_save =
        zero.get_bool("stage3_gather_16bit_weights_on_model_save", old_gather);
    z.module_granularity_threshold =
        zero.get_int("stage3_module_granularity_threshold", z.module_granularity_threshold);
    z.use_all_reduce_for_fetch_params =
        zero.get_bool("stage3_use_all_reduce_for_fetch_params", z.use_all_reduce_for_fetch_params);
    z.ignore_unused_parameters = zero.get_bool("ignore_unused_parameters", z.ignore_unused_parameters);
    z.round_robin_gradients = zero.get_bool("round_robin_gradients", z.round_robin_gradients);
    // ZeRO++ hpZ; the engine checks it against the data-parallel size
    // (stage 3) or ignores it with a warning (stages 0-2), as DeepSpeed does.
    z.zero_hpz_partition_size = zero.get_int("zero_hpz_partition_size", 1, 0);
    // ZeRO++ qwZ and qgZ; the engine checks them against the stage.
    z.zero_quantized_weights = zero.get_bool("zero_quantized_weights", false);
    z.zero_quantized_gradients = zero.get_bool("zero_quantized_gradients", false);
    z.mics_shard_size = zero.get_int("mics_shard_size", -1);
    if (z.mics_shard_size > 0)
        unsupported(zero.key_path("mics_shard_size"), cat("MiCS sharding (", z.mics_shard_size, ")"));
    z.memory_efficient_linear = zero.get_bool("memory_efficient_linear", z.memory_efficient_linear);
    z.override_module_apply = zero.get_bool("override_module_apply", z.override_module_apply);
    reject_enabled(zero);
    zero.finish();
}

} // namespace config
} // namespace dsm
