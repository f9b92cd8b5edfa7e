// The DeepSpeed JSON configuration: typed, validated, with DeepSpeed's
// defaults and batch arithmetic. Internal C++ (no public C API); reading is
// local to one process, the caller makes the ranks agree on the verdict.
//
// Errors are thrown as dsm::Error: DSM_ERR_CONFIG for a bad configuration
// (syntax with line and column, duplicate keys, wrong types and ranges naming
// the full key path and the value found, batch arithmetic), DSM_ERR_IO for a
// file that cannot be read, DSM_ERR_NOT_SUPPORTED for a DeepSpeed feature
// that libdsm does not implement when the configuration enables it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "optim/lr_schedule.hpp"
#include "optim/optimizer_type.hpp"

namespace dsm {
namespace config {

using Json = nlohmann::json;

enum class Dtype { NONE, FP32, FP16, BF16 }; // NONE: not set, decided by other keys
enum class AllreduceOp { MEAN, SUM };
enum class OffloadDevice { NONE, CPU, NVME };
using optim::OptimizerType; // the optimizer layer's type
enum class SchedulerType { NONE, WARMUP_LR, WARMUP_DECAY_LR, WARMUP_COSINE_LR, ONE_CYCLE, LR_RANGE_TEST };
enum class TagValidation { WARN, IGNORE, FAIL };
// fp32_nonfinite_gradients (a libdsm extension): what an fp32 step does with
// Inf/NaN gradients.
enum class NonfiniteGrads { WARN, SKIP, FAIL };

const char *dtype_name(Dtype d);                 // "fp32", "fp16", "bf16", or "none"
using optim::optimizer_name;                      // DeepSpeed's lower-case name ("adamw")
const char *scheduler_name(SchedulerType t);     // DeepSpeed's class name ("WarmupLR")

// What the caller knows about the job when the configuration is read.
struct ConfigContext {
    int64_t world_size = 1;          // number of ranks
    int64_t mesh_data_parallel = 0;  // size of the mesh's data_parallel dimension, 0 if unknown
    int64_t mesh_sequence_parallel = 0;  // size of the mesh's sequence_parallel dimension, 0 if unknown
    bool strict = false;             // unknown keys are an error instead of a warning (DSM_CONFIG_STRICT=1 too)
    bool warn_unknown = true;        // this process warns about unknown keys (the collective read: rank 0 only)
};

struct Fp16Config {
    bool enabled = false;
    bool auto_cast = false;               // accepted only false
    double loss_scale = 0.0;              // 0: dynamic loss scaling
    int64_t initial_scale_power = 16;     // dynamic: initial scale 2^power
    int64_t loss_scale_window = 1000;
    int64_t hysteresis = 2;
    bool consecutive_hysteresis = false;
    double min_loss_scale = 1.0;
    bool fp16_master_weights_and_grads = false; // accepted only false
};

struct Bf16Config {
    bool enabled = false;
    bool immediate_grad_update = false;
    bool check_grad_overflow = true;
};

struct OffloadConfig {
    OffloadDevice device = OffloadDevice::NONE;
    bool pin_memory = false;
    int64_t buffer_count = 0;       // 4 for the optimizer, 5 for parameters
    double ratio = 1.0;             // optimizer only
};

struct ZeroConfig {
    int stage = 0;
    bool legacy_form = false;       // "zero_optimization": true|false
    bool contiguous_gradients = true;
    bool reduce_scatter = true;
    int64_t reduce_bucket_size = 500000000;
    bool use_multi_rank_bucket_allreduce = true;
    bool allgather_partitions = true;
    int64_t allgather_bucket_size = 500000000;
    bool overlap_comm = false;      // default: true for stage 3, false otherwise
    bool load_from_fp32_weights = true;
    OffloadConfig offload_optimizer{OffloadDevice::NONE, false, 4, 1.0};
    OffloadConfig offload_param{OffloadDevice::NONE, false, 5, 1.0};
    int64_t sub_group_size = 1000000000;
    int64_t prefetch_bucket_size = 50000000;          // stage3_prefetch_bucket_size
    int64_t param_persistence_threshold = 100000;     // stage3_param_persistence_threshold
    int64_t model_persistence_threshold = INT64_MAX;  // stage3_model_persistence_threshold
    int64_t max_live_parameters = 1000000000;         // stage3_max_live_parameters
    int64_t max_reuse_distance = 1000000000;          // stage3_max_reuse_distance
    bool gather_16bit_weights_on_model_save = false;  // stage3_gather_16bit_weights_on_model_save
    int64_t module_granularity_threshold = 0;         // stage3_module_granularity_threshold
    bool use_all_reduce_for_fetch_params = false;     // stage3_use_all_reduce_for_fetch_params
    bool ignore_unused_parameters = true;
    bool round_robin_gradients = false;
    int64_t zero_hpz_partition_size = 1;              // ZeRO-3 hpZ group size (0, 1: off)
    bool zero_quantized_weights = false;              // ZeRO++ qwZ (stage 3)
    bool zero_quantized_gradients = false;            // ZeRO++ qgZ (stages 2 and 3)
    int64_t mics_shard_size = -1;                     // accepted only <= 0
    bool memory_efficient_linear = true;
    bool override_module_apply = true;
};

struct OptimizerConfig {
    OptimizerType type = OptimizerType::NONE;
    std::string type_name;          // as written in the file
    bool adam_w_mode = true;        // effective: always true for AdamW
    bool torch_adam = false;
    double lr = 0.0;                // per-type defaults (see config_optim.cc)
    double beta1 = 0.0, beta2 = 0.0;
    double eps = 0.0;
    double weight_decay = 0.0;
    double momentum = 0.0;          // SGD
    double dampening = 0.0;         // SGD
    bool nesterov = false;          // SGD
    double max_coeff = 10.0, min_coeff = 0.01; // Lamb
    bool bias_correction = true;    // Adam, AdamW, Lamb
    double lr_decay = 0.0;          // Adagrad
    double initial_accumulator_value = 0.0; // Adagrad
    Json params = Json::object();   // "optimizer.params" as written
};

struct SchedulerConfig {
    SchedulerType type = SchedulerType::NONE;
    std::string type_name;          // as written in the file
    Json params = Json::object();   // "scheduler.params" with DeepSpeed's defaults filled in
    // The same, typed and range-checked (when type is not NONE).
    optim::LrScheduleParams schedule;
    int64_t last_batch_iteration = -1; // "scheduler.params.last_batch_iteration"
};

struct CheckpointConfig {
    TagValidation tag_validation = TagValidation::WARN;
    bool load_universal = false;
    bool decoupled = false; // writer.decoupled: saves write in the background
    int keep_last = 0;      // libdsm's own: keep the N newest checkpoints (0: all)
};

// DeepSpeed's csv_monitor and tensorboard blocks: files under
// output_path/job_name, written by rank 0.
struct MonitorConfig {
    bool enabled = false;
    std::string output_path;                   // "" : the working directory
    std::string job_name = "DeepSpeedJobName"; // DeepSpeed's default
};

struct Config {
    // Batch values after DeepSpeed's derivation.
    int64_t train_batch_size = 0;
    int64_t train_micro_batch_size_per_gpu = 0;
    int64_t gradient_accumulation_steps = 0;
    bool train_batch_size_given = false;
    bool train_micro_batch_size_per_gpu_given = false;
    bool gradient_accumulation_steps_given = false;
    // The data-parallel size W in TB == MB * GAS * W and where it came from:
    // "mesh", "sequence_parallel_size" or "world".
    int64_t world_size = 1;
    int64_t data_parallel_world_size = 1;
    std::string data_parallel_source = "world";

    int64_t steps_per_print = 10;
    bool wall_clock_breakdown = false;
    double gradient_clipping = 1.0;
    bool prescale_gradients = false;
    double gradient_predivide_factor = 1.0;
    AllreduceOp gradient_allreduce_op = AllreduceOp::MEAN;
    Dtype communication_data_type = Dtype::NONE;
    Dtype seq_parallel_communication_data_type = Dtype::FP32;
    int64_t sequence_parallel_size = 1;
    int64_t data_parallel_size = 0;   // 0: not given; else must equal data_parallel_world_size
    bool zero_allow_untested_optimizer = false;
    bool zero_force_ds_cpu_optimizer = true;

    Fp16Config fp16;
    Bf16Config bf16;
    NonfiniteGrads fp32_nonfinite_gradients = NonfiniteGrads::WARN;
    ZeroConfig zero;
    OptimizerConfig optimizer;
    SchedulerConfig scheduler;
    CheckpointConfig checkpoint;
    MonitorConfig csv_monitor, tensorboard;
    Dtype grad_accum_dtype = Dtype::NONE;   // data_types.grad_accum_dtype

    // Key paths that libdsm does not know (warned about, or an error when strict).
    std::vector<std::string> unknown_keys;

    // As read, before the job's context resolved it (resolve_for() starts
    // again from these): where the text came from ("'ds.json'", "(inline
    // JSON)"), and sequence_parallel_size as the text gave it.
    std::string origin;
    bool sequence_parallel_size_given = false;
    int64_t sequence_parallel_size_read = 1;
};

// Limits on what the reader accepts (doc/configuration.md, "Limits"): the
// text's size in bytes (a file or inline JSON), and how deeply objects and
// arrays nest (the top-level object is depth 1). Beyond either, DSM_ERR_CONFIG
// naming the limit.
constexpr size_t kMaxConfigBytes = size_t(64) << 20;
constexpr size_t kMaxConfigDepth = 1000;

// Read a configuration: `text_or_path` is inline JSON when its first
// non-blank character is '{', else the path of a JSON file. A path must name
// a regular file (a directory, FIFO, device or socket is DSM_ERR_IO naming
// what it is, without opening it for a blocking read).
Config parse_config(const std::string &text_or_path, const ConfigContext &ctx);

// A configuration read by parse_config() (for any context), resolved again
// for `ctx`: the data-parallel size and the batch values derived from the
// keys the text gave, with the same checks and messages. Reads nothing.
Config resolve_for(const Config &read, const ConfigContext &ctx);

// The warning (or, `strict`, the error) about cfg.unknown_keys: each key with
// the known key nearest to it at the same level ("did you mean
// zero_optimization?") and what then applies in its place ("ZeRO stage 0").
// `known`: the key names the reader asked for, per object path. "" when there
// is no unknown key.
std::string unknown_keys_message(const Config &cfg, const std::map<std::string, std::set<std::string>> &known,
                                 bool strict);

// The resolved configuration as JSON: every key with its effective value and
// the derived batch values (format in config_json.cc).
std::string config_to_json(const Config &cfg);

// Whether the key at `path` (as config_to_json() nests it: "zero_optimization.sub_group_size")
// is read and checked but changes nothing in this version of libdsm.
bool key_has_no_effect(const std::string &path);

// DeepSpeed's batch derivation and checks: which of tb/mb/gas are given
// (nullptr: not given) decides the derivation, then TB > 0, MB > 0, GAS > 0 and
// TB == MB * GAS * W. Fills the three values of `cfg`; `w_note` is appended
// to the equality message to say where W came from.
void resolve_batch(Config &cfg, const int64_t *tb, const int64_t *mb, const int64_t *gas, int64_t w,
                   const std::string &w_note);

// The data-parallel size W (DeepSpeed's chain: mesh, world / sequence_parallel_size, world),
// and sequence_parallel_size from the mesh where the context knows it.
void resolve_data_parallel(Config &cfg, const ConfigContext &ctx, bool sp_given);

} // namespace config
} // namespace dsm

// What a dsm_config_t handle points to (src/api/config_api.cc makes it,
// dsm_engine_init_with_config reads it).
struct dsm_config_s {
    dsm::config::Config cfg;
};
