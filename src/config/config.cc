// Reading a DeepSpeed JSON configuration: top-level keys, precision,
// checkpoint, data types, DeepSpeed features libdsm does not implement,
// unknown keys, then the batch arithmetic (config_batch.cc).
#include "config/config_internal.hpp"

#include <fcntl.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstring>

#include <mutex>
#include <set>

#include "core/error.hpp"
#include "core/hash.hpp"
#include "core/log.hpp"
#include "core/param.hpp"


namespace dsm {
namespace config {

DSM_PARAM(engine, CONFIG_STRICT, param::Bool(), "0",
          "1: keys a configuration has that libdsm does not know are an error (DSM_ERR_CONFIG, on every rank) "
          "instead of a warning, for the engine as for dsm_config_load() with DSM_CONFIG_STRICT.");

const char *dtype_name(Dtype d) {
    switch (d) {
    case Dtype::NONE: return "none";
    case Dtype::FP32: return "fp32";
    case Dtype::FP16: return "fp16";
    case Dtype::BF16: return "bf16";
    }
    return "?";
}

Dtype dtype_from(Node &node, const std::string &key, Dtype def, bool allow_none) {
    const Json *v = node.get(key);
    if (v == nullptr) return def;
    static const struct {
        const char *name;
        Dtype dtype;
    } names[] = {{"fp32", Dtype::FP32},          {"float32", Dtype::FP32},       {"float", Dtype::FP32},
                 {"torch.float32", Dtype::FP32}, {"fp16", Dtype::FP16},          {"float16", Dtype::FP16},
                 {"half", Dtype::FP16},          {"torch.float16", Dtype::FP16}, {"bf16", Dtype::BF16},
                 {"bfloat16", Dtype::BF16},      {"bfp16", Dtype::BF16},         {"torch.bfloat16", Dtype::BF16}};
    if (v->is_string()) {
        std::string s = v->get<std::string>();
        for (auto &n : names)
            if (strcasecmp(s.c_str(), n.name) == 0) return n.dtype;
        if (allow_none && strcasecmp(s.c_str(), "none") == 0) return Dtype::NONE;
    }
    node.fail(key, allow_none ? "\"fp32\", \"fp16\", \"bf16\" or null" : "\"fp32\", \"fp16\" or \"bf16\"", *v);
}

namespace {

// What a path that is not a regular file names, for messages.
const char *file_kind(mode_t mode) {
    if (S_ISDIR(mode)) return "is a directory";
    if (S_ISFIFO(mode)) return "is a FIFO (named pipe)";
    if (S_ISCHR(mode)) return "is a character device";
    if (S_ISBLK(mode)) return "is a block device";
    if (S_ISSOCK(mode)) return "is a socket";
    return "is not a regular file";
}

[[noreturn]] void too_large(const std::string &origin, const std::string &size) {
    DSM_FAIL(DSM_ERR_CONFIG, "configuration ", origin, ": ", size, " bytes, larger than the limit of 64 MiB (",
             kMaxConfigBytes, " bytes) on a configuration");
}

struct Fd {
    int fd;
    ~Fd() {
        if (fd >= 0) ::close(fd);
    }
};

// Read a regular file whole, at most kMaxConfigBytes. Anything else (a FIFO,
// a device such as /dev/zero, a directory) is refused by its type before it is
// read: stat() first, then open() without blocking (a FIFO with no writer would
// block an ordinary open) and fstat() again in case the path changed between.
std::string read_regular_file(const std::string &path, const std::string &origin) {
    auto io_fail = [&](const char *why) {
        DSM_FAIL(DSM_ERR_IO, "cannot read configuration file '", path, "': ", why);
    };
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) io_fail(std::strerror(errno));
    if (!S_ISREG(st.st_mode))
        DSM_FAIL(DSM_ERR_IO, "cannot read configuration file '", path, "': ", file_kind(st.st_mode),
                 "; a configuration file must be a regular file");
    Fd f{::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC)};
    if (f.fd < 0) io_fail(std::strerror(errno));
    if (::fstat(f.fd, &st) != 0) io_fail(std::strerror(errno));
    if (!S_ISREG(st.st_mode))
        DSM_FAIL(DSM_ERR_IO, "cannot read configuration file '", path, "': ", file_kind(st.st_mode),
                 "; a configuration file must be a regular file");
    if (static_cast<uint64_t>(st.st_size) > kMaxConfigBytes) too_large(origin, cat(st.st_size));
    std::string text;
    text.reserve(static_cast<size_t>(st.st_size));
    // The size may be wrong (files in /proc say 0) or change: read to the end,
    // but never more than one byte past the limit.
    char buf[1 << 16];
    for (;;) {
        ssize_t n = ::read(f.fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) io_fail(std::strerror(errno));
        if (n == 0) break;
        text.append(buf, static_cast<size_t>(n));
        if (text.size() > kMaxConfigBytes) too_large(origin, cat("more than ", kMaxConfigBytes));
    }
    return text;
}

std::string load_text(const std::string &text_or_path, std::string *origin) {
    size_t first = text_or_path.find_first_not_of(" \t\r\n");
    if (first != std::string::npos && text_or_path[first] == '{') {
        *origin = "(inline JSON)";
        if (text_or_path.size() > kMaxConfigBytes) too_large(*origin, cat(text_or_path.size()));
        return text_or_path;
    }
    *origin = "'" + text_or_path + "'";
    return read_regular_file(text_or_path, *origin);
}

void read_precision(Node &root, Config &cfg) {
    Node fp16 = root.child("fp16");
    Fp16Config &f = cfg.fp16;
    f.enabled = fp16.get_bool("enabled", false);
    f.auto_cast = fp16.get_bool("auto_cast", false);
    f.loss_scale = fp16.get_number("loss_scale", 0.0, 0.0, INFINITY);
    f.initial_scale_power = fp16.get_int("initial_scale_power", f.initial_scale_power, 0, 127);
    f.loss_scale_window = fp16.get_int("loss_scale_window", f.loss_scale_window, 1);
    f.hysteresis = fp16.get_int("hysteresis", f.hysteresis, 1);
    f.consecutive_hysteresis = fp16.get_bool("consecutive_hysteresis", false);
    f.min_loss_scale = fp16.get_number("min_loss_scale", 1.0, 0.0, INFINITY, true);
    f.fp16_master_weights_and_grads = fp16.get_bool("fp16_master_weights_and_grads", false);
    if (f.enabled && f.auto_cast)
        DSM_FAIL(DSM_ERR_NOT_SUPPORTED, "fp16.auto_cast: casting the model's inputs is not supported by libdsm");
    if (f.enabled && f.fp16_master_weights_and_grads)
        DSM_FAIL(DSM_ERR_NOT_SUPPORTED, "fp16.fp16_master_weights_and_grads: not supported by libdsm");
    fp16.finish();

    // "bf16", or DeepSpeed's older spelling "bfloat16".
    DSM_REQUIRE(!(root.has("bf16") && root.has("bfloat16")), DSM_ERR_CONFIG,
                "bf16 and bfloat16: give one of them (\"bfloat16\" is the older spelling of \"bf16\")");
    Node bf16 = root.child(root.has("bfloat16") ? "bfloat16" : "bf16");
    Bf16Config &b = cfg.bf16;
    b.enabled = bf16.get_bool("enabled", false);
    b.immediate_grad_update = bf16.get_bool("immediate_grad_update", false);
    b.check_grad_overflow = bf16.get_bool("check_grad_overflow", true); // DeepSpeed's default since PR #6976
    static const char *unsupported[] = {"bf16_master_weights_and_grads", "bf16_optimizer_states"};
    for (const char *k : unsupported)
        if (bf16.get_bool(k, false))
            DSM_FAIL(DSM_ERR_NOT_SUPPORTED, bf16.key_path(k), ": not supported by libdsm");
    bf16.finish();
    DSM_REQUIRE(!(f.enabled && b.enabled), DSM_ERR_CONFIG,
                "fp16.enabled and ", bf16.path(), ".enabled: bfloat16 and fp16 modes cannot be simultaneously enabled");
    // libdsm's own key (DeepSpeed has none): fp32 steps with Inf/NaN gradients.
    cfg.fp32_nonfinite_gradients =
        static_cast<NonfiniteGrads>(root.get_choice("fp32_nonfinite_gradients", 0, {"warn", "skip", "fail"}));
}

void read_checkpoint(Node &root, Config &cfg) {
    Node ck = root.child("checkpoint");
    cfg.checkpoint.tag_validation =
        static_cast<TagValidation>(ck.get_choice("tag_validation", 0, {"Warn", "Ignore", "Fail"}));
    cfg.checkpoint.load_universal = ck.get_bool("load_universal", false);
    if (ck.get_bool("use_node_local_storage", false))
        DSM_FAIL(DSM_ERR_NOT_SUPPORTED, "checkpoint.use_node_local_storage: not supported by libdsm");
    Node pw = ck.child("parallel_write");
    if (pw.get_bool("pipeline_stage", false))
        DSM_FAIL(DSM_ERR_NOT_SUPPORTED, "checkpoint.parallel_write.pipeline_stage: not supported by libdsm");
    pw.finish();
    // DeepSpeed's decoupled checkpoint engine: the save returns once the
    // state is copied and the file is written in the background. The other
    // writer keys choose among DeepSpeed's Python writers (libdsm has one).
    Node wr = ck.child("writer");
    cfg.checkpoint.decoupled = wr.get_bool("decoupled", false);
    wr.finish();
    // libdsm's own key (DeepSpeed has none).
    cfg.checkpoint.keep_last = static_cast<int>(ck.get_int("keep_last", 0, 0, INT_MAX));
    ck.finish();

    for (auto [key, mc] : {std::pair<const char *, MonitorConfig *>{"csv_monitor", &cfg.csv_monitor},
                           std::pair<const char *, MonitorConfig *>{"tensorboard", &cfg.tensorboard}}) {
        Node m = root.child(key);
        mc->enabled = m.get_bool("enabled", false);
        mc->output_path = m.get_string("output_path", "");
        mc->job_name = m.get_string("job_name", "DeepSpeedJobName");
        if (mc->enabled)
            DSM_REQUIRE(!mc->job_name.empty() && mc->job_name.find('/') == std::string::npos, DSM_ERR_CONFIG,
                        key, ".job_name: \"", mc->job_name, "\" must be a non-empty name without '/'");
        m.finish();
    }

    Node dt = root.child("data_types");
    cfg.grad_accum_dtype = dtype_from(dt, "grad_accum_dtype", Dtype::NONE, false);
    for (const char *k : {"param_dtype", "buffer_dtype"})
        if (dt.get(k) != nullptr) DSM_FAIL(DSM_ERR_NOT_SUPPORTED, dt.key_path(k), ": not supported by libdsm");
    dt.finish();
}

// DeepSpeed features libdsm does not implement: accepted when absent or
// disabled, rejected by name when enabled.
void reject_unsupported(Node &root) {
    // Blocks switched on by "enabled": true.
    static const char *enabled_blocks[] = {
        "amp",          "flops_profiler",  "autotuning",     "wandb",
        "comet",        "comms_logger",    "elasticity",     "curriculum_learning",
        "progressive_layer_drop", "quantize_training", "data_efficiency", "hybrid_engine",
        "torch_autocast", "nebula",        "eigenvalue",     "datastates_ckpt"};
    for (const char *k : enabled_blocks) {
        const Json *v = root.get(k);
        if (v == nullptr) continue;
        if (!v->is_object()) root.fail(k, "an object", *v);
        Node n(v, k, nullptr);
        if (n.get_bool("enabled", false))
            DSM_FAIL(DSM_ERR_NOT_SUPPORTED, k, ": not supported by libdsm (remove the block or set \"enabled\": false)");
    }
    // Blocks that act whenever they are there.
    static const char *present_blocks[] = {"compression_training", "sparse_attention", "pipeline",
                                           "weight_quantization",  "expert_parallel",  "tensor_parallel",
                                           "compile"};
    for (const char *k : present_blocks)
        if (root.get(k) != nullptr)
            DSM_FAIL(DSM_ERR_NOT_SUPPORTED, k, ": not supported by libdsm (remove the block)");
    // Flags.
    static const char *flags[] = {"sparse_gradients", "fp32_allreduce", "disable_allgather", "dump_state",
                                  "memory_breakdown", "dataloader_drop_last", "use_data_before_expert_parallelism"};
    for (const char *k : flags)
        if (root.get_bool(k, false)) DSM_FAIL(DSM_ERR_NOT_SUPPORTED, k, ": true is not supported by libdsm");
    // Activation checkpointing lives in the model code; only its inert form is accepted.
    Node ac = root.child("activation_checkpointing");
    for (const char *k : {"partition_activations", "cpu_checkpointing", "contiguous_memory_optimization",
                          "synchronize_checkpoint_boundary", "profile"})
        if (ac.get_bool(k, false))
            DSM_FAIL(DSM_ERR_NOT_SUPPORTED, ac.key_path(k), ": activation checkpointing is not supported by libdsm");
    ac.get(std::string("number_checkpoints"));
    ac.finish();
}

void read_top_level(Node &root, Config &cfg) {
    cfg.steps_per_print = root.get_int("steps_per_print", cfg.steps_per_print, 1);
    cfg.wall_clock_breakdown = root.get_bool("wall_clock_breakdown", false);
    cfg.gradient_clipping = root.get_number("gradient_clipping", cfg.gradient_clipping, 0.0, INFINITY);
    cfg.prescale_gradients = root.get_bool("prescale_gradients", false);
    cfg.gradient_predivide_factor = root.get_number("gradient_predivide_factor", 1.0, 0.0, INFINITY, true);
    cfg.gradient_allreduce_op = static_cast<AllreduceOp>(root.get_choice("gradient_allreduce_op", 0, {"mean", "sum"}));
    cfg.communication_data_type = dtype_from(root, "communication_data_type", Dtype::NONE, false);
    cfg.seq_parallel_communication_data_type =
        dtype_from(root, "seq_parallel_communication_data_type", Dtype::FP32, false);
    cfg.sequence_parallel_size = root.get_int("sequence_parallel_size", 1, 1);
    cfg.data_parallel_size = root.get_int("data_parallel_size", 0, 1);
    cfg.zero_allow_untested_optimizer = root.get_bool("zero_allow_untested_optimizer", false);
    cfg.zero_force_ds_cpu_optimizer = root.get_bool("zero_force_ds_cpu_optimizer", true);
    // Accepted, no effect in libdsm (as in DeepSpeed without Python or NVMe).
    root.get_int("vocabulary_size", 0, 0);
    root.get_bool("disable_python_gc", false);
    const Json *aio = root.get("aio");
    if (aio != nullptr && !aio->is_object()) root.fail("aio", "an object", *aio);
}

// The batch values and W for `ctx`, from what the text gave (cfg's *_given
// flags and the values read), with the data-parallel size's origin in the
// equality message.
void resolve(Config &cfg, const ConfigContext &ctx) {
    cfg.sequence_parallel_size = cfg.sequence_parallel_size_read;
    resolve_data_parallel(cfg, ctx, cfg.sequence_parallel_size_given);
    std::string note;
    if (cfg.data_parallel_source == "sequence_parallel_size")
        note = cat("world_size = world ", cfg.world_size, " / sequence_parallel_size ", cfg.sequence_parallel_size);
    else if (cfg.data_parallel_source == "world")
        note = cat("world_size = number of ranks ", cfg.world_size);
    else
        note = cat("world_size = data_parallel dimension of the mesh, of ", cfg.world_size, " ranks");
    const int64_t tb = cfg.train_batch_size, mb = cfg.train_micro_batch_size_per_gpu,
                  gas = cfg.gradient_accumulation_steps;
    resolve_batch(cfg, cfg.train_batch_size_given ? &tb : nullptr, cfg.train_micro_batch_size_per_gpu_given ? &mb : nullptr,
                  cfg.gradient_accumulation_steps_given ? &gas : nullptr, cfg.data_parallel_world_size, note);
}

// Warn about unknown keys once per configuration and process: a program
// that reads the same configuration for its mesh and for its engine is told
// once.
void warn_once(const std::string &text, const std::string &message) {
    static std::mutex mu;
    static std::set<uint64_t> warned;
    const uint64_t key = fnv1a(text) ^ (fnv1a(message) * 0x9e3779b97f4a7c15ull);
    {
        std::lock_guard<std::mutex> lock(mu);
        if (!warned.insert(key).second) return;
    }
    DSM_WARN(INIT, "%s", message.c_str());
}

} // namespace

Config parse_config(const std::string &text_or_path, const ConfigContext &ctx) {
    std::string origin;
    std::string text = load_text(text_or_path, &origin);
    Json doc = parse_json_text(text, origin);
    DSM_REQUIRE(doc.is_object(), DSM_ERR_CONFIG, "configuration ", origin, ": expected a JSON object, got ",
                show(doc));

    Config cfg;
    cfg.origin = origin;
    KnownKeys known;
    {
        KnownKeysScope scope(&known);
        Node root(&doc, "", &cfg.unknown_keys);
        cfg.train_batch_size = root.get_opt_int("train_batch_size", &cfg.train_batch_size_given);
        cfg.train_micro_batch_size_per_gpu =
            root.get_opt_int("train_micro_batch_size_per_gpu", &cfg.train_micro_batch_size_per_gpu_given);
        cfg.gradient_accumulation_steps =
            root.get_opt_int("gradient_accumulation_steps", &cfg.gradient_accumulation_steps_given);
        cfg.sequence_parallel_size_given = root.has("sequence_parallel_size");

        read_top_level(root, cfg);
        read_precision(root, cfg);
        read_zero(root, cfg);
        read_optimizer(root, cfg);
        read_scheduler(root, cfg);
        read_checkpoint(root, cfg);
        reject_unsupported(root);
        root.finish();
    }
    cfg.sequence_parallel_size_read = cfg.sequence_parallel_size;

    DSM_REQUIRE(!(cfg.gradient_allreduce_op == AllreduceOp::SUM && cfg.zero.stage == 3), DSM_ERR_CONFIG,
                "gradient_allreduce_op: 'sum' is not supported with ZeRO stage 3");

    if (!cfg.unknown_keys.empty()) {
        std::sort(cfg.unknown_keys.begin(), cfg.unknown_keys.end());
        const bool strict = ctx.strict || param_CONFIG_STRICT().value();
        DSM_REQUIRE(!strict, DSM_ERR_CONFIG, unknown_keys_message(cfg, known, true),
                    ctx.strict ? "" : " (DSM_CONFIG_STRICT=1)");
        if (ctx.warn_unknown)
            warn_once(text, unknown_keys_message(cfg, known, false) +
                                "; DSM_CONFIG_STRICT=1 makes unknown keys an error");
    }

    resolve(cfg, ctx);
    return cfg;
}

Config resolve_for(const Config &read, const ConfigContext &ctx) {
    Config cfg = read;
    resolve(cfg, ctx);
    return cfg;
}

} // namespace config
} // namespace dsm

DSM_PARAM_LINK(config)
