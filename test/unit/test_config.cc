// The DeepSpeed JSON configuration reader: defaults, batch arithmetic, errors,
// unsupported features, unknown keys, and real configuration files
// (test/data/config/*.json, found through $top_srcdir).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "config/config.hpp"
#include "config/config_load.hpp"
#include "core/error.hpp"

// CMocka last: its fail() macro would break the C++ headers.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

extern "C" { // this CMocka header has no C++ guards
#include <cmocka.h>
}

using dsm::config::Config;
using dsm::config::ConfigContext;
using dsm::config::Dtype;
using dsm::config::Json;
using dsm::config::OptimizerType;
using dsm::config::SchedulerType;

static Config parse(const std::string &text, int64_t world = 1, int64_t mesh = 0, bool strict = false) {
    ConfigContext ctx;
    ctx.world_size = world;
    ctx.mesh_data_parallel = mesh;
    ctx.strict = strict;
    return dsm::config::parse_config(text, ctx);
}

// parse() must throw dsm::Error with `status` and a message containing `part`.
static void expect_error(const std::string &text, dsm_status_t status, const char *part, int64_t world = 1,
                         int64_t mesh = 0, bool strict = false) {
    try {
        parse(text, world, mesh, strict);
    } catch (const dsm::Error &e) {
        if (e.status() != status || std::strstr(e.what(), part) == nullptr)
            std::fprintf(stderr, "config %s\n  got status %d \"%s\"\n  want status %d with \"%s\"\n", text.c_str(),
                         static_cast<int>(e.status()), e.what(), static_cast<int>(status), part);
        assert_int_equal(e.status(), status);
        assert_non_null(std::strstr(e.what(), part));
        return;
    }
    std::fprintf(stderr, "config %s\n  parsed, want status %d with \"%s\"\n", text.c_str(), static_cast<int>(status),
                 part);
    fail();
}

static void expect_batch(const Config &c, int64_t tb, int64_t mb, int64_t gas) {
    assert_int_equal(c.train_batch_size, tb);
    assert_int_equal(c.train_micro_batch_size_per_gpu, mb);
    assert_int_equal(c.gradient_accumulation_steps, gas);
}

static std::string data_path(const char *name) {
    const char *top = std::getenv("top_srcdir");
    return std::string(top && *top ? top : ".") + "/test/data/config/" + name;
}

// ---------------------------------------------------------------- defaults

static void test_defaults(void **) {
    Config c = parse("{\"train_batch_size\": 8}");
    expect_batch(c, 8, 8, 1);
    assert_true(c.train_batch_size_given);
    assert_false(c.train_micro_batch_size_per_gpu_given);
    assert_int_equal(c.steps_per_print, 10);
    assert_false(c.wall_clock_breakdown);
    assert_true(c.gradient_clipping == 1.0);
    assert_false(c.prescale_gradients);
    assert_true(c.gradient_predivide_factor == 1.0);
    assert_true(c.gradient_allreduce_op == dsm::config::AllreduceOp::MEAN);
    assert_true(c.communication_data_type == Dtype::NONE);
    assert_true(c.seq_parallel_communication_data_type == Dtype::FP32);
    assert_int_equal(c.sequence_parallel_size, 1);
    assert_false(c.fp16.enabled);
    assert_true(c.fp16.loss_scale == 0.0);
    assert_int_equal(c.fp16.initial_scale_power, 16);
    assert_int_equal(c.fp16.loss_scale_window, 1000);
    assert_int_equal(c.fp16.hysteresis, 2);
    assert_false(c.fp16.consecutive_hysteresis);
    assert_true(c.fp16.min_loss_scale == 1.0);
    assert_false(c.bf16.enabled);
    assert_int_equal(c.zero.stage, 0);
    assert_true(c.zero.contiguous_gradients);
    assert_true(c.zero.reduce_scatter);
    assert_int_equal(c.zero.reduce_bucket_size, 500000000);
    assert_true(c.zero.allgather_partitions);
    assert_int_equal(c.zero.allgather_bucket_size, 500000000);
    assert_false(c.zero.overlap_comm);
    assert_int_equal(c.zero.sub_group_size, 1000000000);
    assert_int_equal(c.zero.prefetch_bucket_size, 50000000);
    assert_int_equal(c.zero.param_persistence_threshold, 100000);
    assert_int_equal(c.zero.max_live_parameters, 1000000000);
    assert_int_equal(c.zero.max_reuse_distance, 1000000000);
    assert_int_equal(c.zero.zero_hpz_partition_size, 1);
    assert_int_equal(c.zero.mics_shard_size, -1);
    assert_true(c.zero.offload_optimizer.device == dsm::config::OffloadDevice::NONE);
    assert_true(c.optimizer.type == OptimizerType::NONE);
    assert_true(c.scheduler.type == SchedulerType::NONE);
    assert_true(c.checkpoint.tag_validation == dsm::config::TagValidation::WARN);
    assert_false(c.checkpoint.load_universal);
    assert_true(c.grad_accum_dtype == Dtype::NONE);
    assert_true(c.unknown_keys.empty());
    assert_int_equal(c.data_parallel_world_size, 1);
    assert_string_equal(c.data_parallel_source.c_str(), "world");
    // Stage 3 turns overlap_comm on by default.
    assert_true(parse("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 3}}").zero.overlap_comm);
}

// ---------------------------------------------------------------- batch arithmetic

static void test_batch_all_three(void **) {
    expect_batch(parse("{\"train_batch_size\": 32, \"train_micro_batch_size_per_gpu\": 2, "
                       "\"gradient_accumulation_steps\": 4}", 4),
                 32, 2, 4);
    expect_error("{\"train_batch_size\": 32, \"train_micro_batch_size_per_gpu\": 2, "
                 "\"gradient_accumulation_steps\": 2}",
                 DSM_ERR_CONFIG, "train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step * "
                                 "world_size 32 != 2 * 2 * 4", 4);
}

static void test_batch_tb_mb(void **) {
    Config c = parse("{\"train_batch_size\": 32, \"train_micro_batch_size_per_gpu\": 2}", 4);
    expect_batch(c, 32, 2, 4);
    assert_false(c.gradient_accumulation_steps_given);
    // 30 // 4 // 4 = 1, and 30 != 4 * 1 * 4.
    expect_error("{\"train_batch_size\": 30, \"train_micro_batch_size_per_gpu\": 4}", DSM_ERR_CONFIG,
                 "30 != 4 * 1 * 4", 4);
    // 2 // 4 = 0 accumulation steps.
    expect_error("{\"train_batch_size\": 2, \"train_micro_batch_size_per_gpu\": 4}", DSM_ERR_CONFIG,
                 "Gradient accumulation steps: 0 has to be greater than 0");
    expect_error("{\"train_batch_size\": 8, \"train_micro_batch_size_per_gpu\": 0}", DSM_ERR_CONFIG,
                 "Micro batch size per gpu: 0 has to be greater than 0");
}

static void test_batch_tb_gas(void **) {
    expect_batch(parse("{\"train_batch_size\": 32, \"gradient_accumulation_steps\": 2}", 4), 32, 4, 2);
    expect_error("{\"train_batch_size\": 32, \"gradient_accumulation_steps\": 3}", DSM_ERR_CONFIG,
                 "32 != 2 * 3 * 4", 4);
    expect_error("{\"train_batch_size\": 32, \"gradient_accumulation_steps\": 0}", DSM_ERR_CONFIG,
                 "Gradient accumulation steps: 0 has to be greater than 0", 4);
}

static void test_batch_mb_gas(void **) {
    Config c = parse("{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": 3}", 4);
    expect_batch(c, 24, 2, 3);
    assert_false(c.train_batch_size_given);
    // The value the user gave is named, not the train batch of -8 derived from it.
    expect_error("{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": -1}", DSM_ERR_CONFIG,
                 "Gradient accumulation steps: -1 has to be greater than 0 (gradient_accumulation_steps = -1)", 4);
}

static void test_batch_one_given(void **) {
    expect_batch(parse("{\"train_batch_size\": 32}", 4), 32, 8, 1);
    expect_error("{\"train_batch_size\": 6}", DSM_ERR_CONFIG, "6 != 1 * 1 * 4", 4);
    expect_error("{\"train_batch_size\": 2}", DSM_ERR_CONFIG, "Micro batch size per gpu: 0 has to be greater than 0",
                 4);
    expect_batch(parse("{\"train_micro_batch_size_per_gpu\": 3}", 4), 12, 3, 1);
    expect_error("{\"gradient_accumulation_steps\": 3}", DSM_ERR_CONFIG,
                 "Either train_batch_size or train_micro_batch_size_per_gpu needs to be provided");
    expect_error("{}", DSM_ERR_CONFIG, "Either train_batch_size or train_micro_batch_size_per_gpu");
    // null is "not given".
    expect_batch(parse("{\"train_batch_size\": null, \"train_micro_batch_size_per_gpu\": 2}", 2), 4, 2, 1);
}

static void test_batch_values(void **) {
    // A bad given value is named as given, never as a value derived from it.
    expect_error("{\"train_micro_batch_size_per_gpu\": -1}", DSM_ERR_CONFIG,
                 "Micro batch size per gpu: -1 has to be greater than 0 (train_micro_batch_size_per_gpu = -1)", 2);
    expect_error("{\"train_batch_size\": 8, \"train_micro_batch_size_per_gpu\": -1}", DSM_ERR_CONFIG,
                 "train_micro_batch_size_per_gpu = -1", 2);
    expect_error("{\"train_batch_size\": -4, \"gradient_accumulation_steps\": 2}", DSM_ERR_CONFIG,
                 "Train batch size: -4 has to be greater than 0 (train_batch_size = -4)", 2);
    // A derived value that is not positive says how it was derived.
    expect_error("{\"train_batch_size\": 2, \"train_micro_batch_size_per_gpu\": 4}", DSM_ERR_CONFIG,
                 "Gradient accumulation steps: 0 has to be greater than 0 (derived: gradient_accumulation_steps = "
                 "train_batch_size 2 // train_micro_batch_size_per_gpu 4 // world_size 1)");
    expect_error("{\"train_batch_size\": 2}", DSM_ERR_CONFIG,
                 "Micro batch size per gpu: 0 has to be greater than 0 (derived: train_micro_batch_size_per_gpu = "
                 "train_batch_size 2 // world_size 4)", 4);
    expect_error("{\"train_batch_size\": 0}", DSM_ERR_CONFIG, "Train batch size: 0 has to be greater than 0");
    expect_error("{\"train_batch_size\": -8, \"train_micro_batch_size_per_gpu\": 2}", DSM_ERR_CONFIG,
                 "Train batch size: -8 has to be greater than 0");
    expect_error("{\"train_batch_size\": \"auto\"}", DSM_ERR_CONFIG,
                 "train_batch_size: expected an integer, got \"auto\"");
    expect_error("{\"train_batch_size\": 32.5}", DSM_ERR_CONFIG, "train_batch_size: expected an integer, got 32.5");
    expect_batch(parse("{\"train_batch_size\": 32.0}", 1), 32, 32, 1);
    expect_error("{\"train_micro_batch_size_per_gpu\": 4611686018427387904}", DSM_ERR_CONFIG, "overflow", 4);
}

static void test_batch_world_from_sequence_parallel(void **) {
    Config c = parse("{\"train_micro_batch_size_per_gpu\": 2, \"sequence_parallel_size\": 2}", 8);
    expect_batch(c, 8, 2, 1);
    assert_int_equal(c.data_parallel_world_size, 4);
    assert_string_equal(c.data_parallel_source.c_str(), "sequence_parallel_size");
    expect_batch(parse("{\"train_batch_size\": 16, \"sequence_parallel_size\": 4, "
                       "\"train_micro_batch_size_per_gpu\": 2}", 8),
                 16, 2, 4);
    expect_error("{\"train_batch_size\": 16, \"sequence_parallel_size\": 4}", DSM_ERR_CONFIG,
                 "does not divide the world size 6", 6);
    expect_error("{\"train_batch_size\": 16, \"sequence_parallel_size\": 0}", DSM_ERR_CONFIG,
                 "sequence_parallel_size: expected an integer >= 1, got 0", 4);
    // The message says where W came from.
    expect_error("{\"train_batch_size\": 16, \"gradient_accumulation_steps\": 3, \"sequence_parallel_size\": 2}",
                 DSM_ERR_CONFIG, "world_size = world 8 / sequence_parallel_size 2", 8);
}

static void test_batch_world_from_mesh(void **) {
    // The mesh's data-parallel dimension wins over sequence_parallel_size.
    Config c = parse("{\"train_batch_size\": 16, \"gradient_accumulation_steps\": 2, "
                     "\"sequence_parallel_size\": 4}", 16, 2);
    expect_batch(c, 16, 4, 2);
    assert_int_equal(c.data_parallel_world_size, 2);
    assert_string_equal(c.data_parallel_source.c_str(), "mesh");
    expect_batch(parse("{\"train_micro_batch_size_per_gpu\": 4}", 8, 4), 16, 4, 1);
    expect_error("{\"train_batch_size\": 16}", DSM_ERR_CONFIG, "16 != 5 * 1 * 3", 12, 3);
    // data_parallel_size, when given, must agree.
    expect_batch(parse("{\"train_batch_size\": 16, \"data_parallel_size\": 4}", 8, 4), 16, 4, 1);
    expect_error("{\"train_batch_size\": 16, \"data_parallel_size\": 2}", DSM_ERR_CONFIG,
                 "data_parallel_size: 2 differs from the data-parallel size 4", 8, 4);
}

static void test_sequence_parallel_from_mesh(void **) {
    // Where the mesh's sequence_parallel dimension is known it is the resolved size;
    // a key of 1 (or no key) defers to it, another value contradicts it.
    ConfigContext ctx;
    ctx.world_size = 8;
    ctx.mesh_data_parallel = 4;
    ctx.mesh_sequence_parallel = 2;
    for (const char *text : {"{\"train_batch_size\": 8}", "{\"train_batch_size\": 8, \"sequence_parallel_size\": 1}",
                             "{\"train_batch_size\": 8, \"sequence_parallel_size\": 2}"}) {
        Config c = dsm::config::parse_config(text, ctx);
        assert_int_equal(c.sequence_parallel_size, 2);
        assert_int_equal(c.data_parallel_world_size, 4);
        Json j = Json::parse(dsm::config::config_to_json(c));
        assert_int_equal(j["sequence_parallel_size"].get<int>(), 2);
    }
    try {
        (void)dsm::config::parse_config("{\"train_batch_size\": 8, \"sequence_parallel_size\": 4}", ctx);
        fail_msg("a sequence_parallel_size that contradicts the mesh was accepted");
    } catch (const dsm::Error &e) {
        assert_int_equal(e.status(), DSM_ERR_CONFIG);
        assert_non_null(strstr(e.what(), "sequence_parallel_size: the configuration says 4 but the mesh's "
                                         "sequence_parallel dimension has 2 ranks"));
    }
}

// ---------------------------------------------------------------- syntax, duplicates, files

static void test_syntax_error_position(void **) {
    expect_error("{\n  \"train_batch_size\": 8,\n  \"fp16\": {enabled: true}\n}", DSM_ERR_CONFIG, "line 3, column");
    expect_error("{\"train_batch_size\": 8,}", DSM_ERR_CONFIG, "JSON syntax error at line 1, column");
    expect_error("{\"train_batch_size\": 8, \"fp16\": {\"loss_scale\": 1e999}}", DSM_ERR_CONFIG, "1e999");
    // Comments are allowed, as in DeepSpeed's hjson reader.
    expect_batch(parse("{\n  // global batch\n  \"train_batch_size\": 8 /* all ranks */\n}"), 8, 8, 1);
}

static void test_duplicate_keys(void **) {
    expect_error("{\"train_batch_size\": 8, \"train_batch_size\": 16}", DSM_ERR_CONFIG,
                 "duplicate key 'train_batch_size'");
    expect_error("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 1, \"stage\": 2}}", DSM_ERR_CONFIG,
                 "duplicate key 'zero_optimization.stage'");
    expect_error("{\"train_batch_size\": 8, \"zero_optimization\": {\"offload_optimizer\": "
                 "{\"device\": \"cpu\", \"device\": \"cpu\"}}}",
                 DSM_ERR_CONFIG, "duplicate key 'zero_optimization.offload_optimizer.device'");
    // The same key in different objects is fine.
    Config c = parse("{\"train_batch_size\": 8, \"fp16\": {\"enabled\": false}, \"bf16\": {\"enabled\": true}}");
    assert_true(c.bf16.enabled);
    // csv_monitor and tensorboard: DeepSpeed's keys and defaults.
    c = parse("{\"train_batch_size\": 8}");
    assert_false(c.csv_monitor.enabled);
    assert_false(c.tensorboard.enabled);
    assert_string_equal(c.csv_monitor.job_name.c_str(), "DeepSpeedJobName");
    c = parse("{\"train_batch_size\": 8, \"csv_monitor\": {\"enabled\": true, \"output_path\": \"logs\", "
              "\"job_name\": \"run1\"}, \"tensorboard\": {\"enabled\": true}}");
    assert_true(c.csv_monitor.enabled && c.tensorboard.enabled);
    assert_string_equal(c.csv_monitor.output_path.c_str(), "logs");
    assert_string_equal(c.csv_monitor.job_name.c_str(), "run1");
    assert_string_equal(c.tensorboard.output_path.c_str(), "");
    expect_error("{\"train_batch_size\": 8, \"csv_monitor\": {\"enabled\": true, \"job_name\": \"a/b\"}}",
                 DSM_ERR_CONFIG, "csv_monitor.job_name: \"a/b\" must be a non-empty name without '/'");
    expect_error("{\"train_batch_size\": 8, \"tensorboard\": {\"enabled\": 1}}", DSM_ERR_CONFIG,
                 "tensorboard.enabled");
    // DeepSpeed's default (DeepSpeedBF16Config.check_grad_overflow = True).
    assert_true(c.bf16.check_grad_overflow);
    assert_false(parse("{\"train_batch_size\": 8, \"bf16\": {\"enabled\": true, \"check_grad_overflow\": false}}")
                     .bf16.check_grad_overflow);
}

static void test_files(void **) {
    expect_error("/nonexistent/ds_config.json", DSM_ERR_IO, "'/nonexistent/ds_config.json': No such file or directory");
    expect_error("[1, 2]", DSM_ERR_IO, "'[1, 2]'");
    const char *path = "test_config_tmp.json";
    FILE *f = std::fopen(path, "w");
    assert_non_null(f);
    std::fputs("[1, 2]", f);
    std::fclose(f);
    expect_error(path, DSM_ERR_CONFIG, "expected a JSON object, got [1,2]");
    f = std::fopen(path, "w");
    std::fputs("{\n\"train_batch_size\": 4\n", f);
    std::fclose(f);
    expect_error(path, DSM_ERR_CONFIG, "test_config_tmp.json': JSON syntax error at line 3");
    std::remove(path);
    // Leading blanks before inline JSON.
    expect_batch(parse("  \n {\"train_batch_size\": 4}"), 4, 4, 1);
}

// ---------------------------------------------------------------- what the reader refuses to read

// A fresh temporary directory (removed by the caller).
static std::string temp_dir() {
    const char *tmp = std::getenv("TMPDIR");
    std::string templ = std::string(tmp != nullptr && *tmp ? tmp : "/tmp") + "/dsm-test-config-XXXXXX";
    std::vector<char> buf(templ.begin(), templ.end());
    buf.push_back('\0');
    assert_non_null(mkdtemp(buf.data()));
    return std::string(buf.data());
}

static void write_file(const std::string &path, const std::string &text) {
    FILE *f = std::fopen(path.c_str(), "wb");
    assert_non_null(f);
    assert_int_equal(std::fwrite(text.data(), 1, text.size(), f), text.size());
    assert_int_equal(std::fclose(f), 0);
}

// Peak resident memory of this process, in KiB.
static long peak_kib() {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

static void test_not_regular_files(void **) {
    std::string dir = temp_dir();
    // A directory is named as one, not reported as a JSON syntax error.
    expect_error(dir, DSM_ERR_IO, ("cannot read configuration file '" + dir + "': is a directory").c_str());
    // A FIFO with no writer: refused at once (opening it for reading would block).
    std::string fifo = dir + "/ds_config.json";
    assert_int_equal(mkfifo(fifo.c_str(), 0600), 0);
    expect_error(fifo, DSM_ERR_IO, ("'" + fifo + "': is a FIFO (named pipe)").c_str());
    assert_int_equal(unlink(fifo.c_str()), 0);
    // A device that never ends: refused by its type, nothing read.
    long before = peak_kib();
    expect_error("/dev/zero", DSM_ERR_IO, "cannot read configuration file '/dev/zero': is a character device");
    expect_error("/dev/null", DSM_ERR_IO, "'/dev/null': is a character device");
    assert_true(peak_kib() - before < 64 * 1024);
    // A socket: refused by its type too (opening one fails with a less clear reason).
    std::string sock = dir + "/sock.json";
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_un addr;
    std::memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    if (sock.size() < sizeof addr.sun_path) {
        std::memcpy(addr.sun_path, sock.c_str(), sock.size() + 1);
        assert_int_equal(bind(fd, reinterpret_cast<struct sockaddr *>(&addr), sizeof addr), 0);
        expect_error(sock, DSM_ERR_IO,
                     ("'" + sock + "': is a socket; a configuration file must be a regular file").c_str());
        unlink(sock.c_str());
    }
    close(fd);
    // Not readable: the system's reason (unless running as root).
    std::string secret = dir + "/secret.json";
    write_file(secret, "{\"train_batch_size\": 8}");
    assert_int_equal(chmod(secret.c_str(), 0), 0);
    if (geteuid() != 0) expect_error(secret, DSM_ERR_IO, "Permission denied");
    assert_int_equal(unlink(secret.c_str()), 0);
    assert_int_equal(rmdir(dir.c_str()), 0);
}

static void test_nul_byte(void **) {
    // Text after a NUL byte is not dropped silently: the byte is an error with its offset.
    std::string text("{\"train_batch_size\": 8}\0{\"x\": 1}", 32);
    expect_error(text, DSM_ERR_CONFIG, "configuration (inline JSON): a NUL byte (\\0) at byte offset 23");
    expect_error(std::string("{\"train_batch_size\": 8, \"a\": \"b\0c\"}", 35), DSM_ERR_CONFIG, "byte offset 31");
    std::string dir = temp_dir(), path = dir + "/nul.json";
    write_file(path, text);
    expect_error(path, DSM_ERR_CONFIG, ("configuration '" + path + "': a NUL byte (\\0) at byte offset 23").c_str());
    unlink(path.c_str());
    rmdir(dir.c_str());
}

// {"train_batch_size": 8, "k": {"k": ... {}}} with `depth` levels of objects
// in all (the top-level object is level 1), keys of `key_len` bytes.
static std::string nested(size_t depth, size_t key_len = 1) {
    std::string key = "\"" + std::string(key_len, 'k') + "\": ";
    std::string text = "{\"train_batch_size\": 8, ";
    text.reserve(depth * (key.size() + 2) + 32);
    for (size_t i = 1; i < depth; ++i) text += key + "{";
    for (size_t i = 1; i < depth; ++i) text += "}";
    return text + "}";
}

static void test_size_and_depth_limits(void **) {
    assert_int_equal(dsm::config::kMaxConfigDepth, 1000);
    assert_int_equal(dsm::config::kMaxConfigBytes, 64 << 20);
    // Exactly at the depth limit is accepted, one more level is refused, naming the limit.
    Config c = parse(nested(1000));
    assert_int_equal(c.unknown_keys.size(), 1);
    expect_error(nested(1001), DSM_ERR_CONFIG,
                 "configuration (inline JSON): objects and arrays nest deeper than the limit of 1000 levels "
                 "(under 'k.k.k");
    // Arrays count as levels too.
    std::string arrays = "{\"train_batch_size\": 8, \"a\": " + std::string(999, '[') + std::string(999, ']') + "}";
    parse(arrays);
    arrays = "{\"train_batch_size\": 8, \"a\": " + std::string(1000, '[') + std::string(1000, ']') + "}";
    expect_error(arrays, DSM_ERR_CONFIG, "nest deeper than the limit of 1000 levels (under 'a[][]");
    // Far deeper text (1M levels, where quadratic paths took gigabytes) stops at the limit, cheaply.
    long before = peak_kib();
    expect_error(nested(1000000), DSM_ERR_CONFIG, "limit of 1000 levels");
    assert_true(peak_kib() - before < 256 * 1024);

    // The size limit: inline text and files, one byte over is refused before it is parsed.
    std::string big = "{\"train_batch_size\": 8}" + std::string(dsm::config::kMaxConfigBytes, ' ');
    expect_error(big, DSM_ERR_CONFIG, "bytes, larger than the limit of 64 MiB (67108864 bytes) on a configuration");
    big.clear();
    big.shrink_to_fit();
    std::string dir = temp_dir(), path = dir + "/big.json";
    write_file(path, "{\"train_batch_size\": 8}");
    assert_int_equal(truncate(path.c_str(), static_cast<off_t>(dsm::config::kMaxConfigBytes) + 1), 0); // sparse
    expect_error(path, DSM_ERR_CONFIG,
                 ("configuration '" + path + "': 67108865 bytes, larger than the limit of 64 MiB").c_str());
    // Exactly at the limit is read (NUL bytes of the sparse tail aside: padded with blanks).
    std::string at_limit = "{\"train_batch_size\": 8}";
    at_limit += std::string(dsm::config::kMaxConfigBytes - at_limit.size(), ' ');
    write_file(path, at_limit);
    at_limit.clear();
    at_limit.shrink_to_fit();
    expect_batch(parse(path), 8, 8, 1);
    unlink(path.c_str());
    rmdir(dir.c_str());
}

static void test_deep_nesting_is_cheap(void **) {
    // 1000 levels of 61,000-byte keys: a 61 MB file at the depth limit. Paths
    // copied per level would take 1000 * 1000 / 2 * 61 KB = 30 GB.
    std::string text = nested(1000, 61000);
    assert_true(text.size() > 60000000 && text.size() < dsm::config::kMaxConfigBytes);
    std::string dir = temp_dir(), path = dir + "/deep.json";
    write_file(path, text);
    long before = peak_kib();
    Config c = parse(path);
    expect_batch(c, 8, 8, 1);
    assert_int_equal(c.unknown_keys.size(), 1);
    // The text, its keys and the parsed document: a few times 60 MB.
    long grown = peak_kib() - before;
    if (grown >= 1024 * 1024) std::fprintf(stderr, "peak memory grew by %ld KiB\n", grown);
    assert_true(grown < 1024 * 1024);
    // A duplicate key: its path is built once, when the message needs it, and cut.
    text.insert(text.size() - 1, ", \"" + std::string(61000, 'k') + "\": 1");
    expect_error(text, DSM_ERR_CONFIG, ("duplicate key '" + std::string(997, 'k') + "...'").c_str());
    // Deep down: a duplicate in the innermost object.
    std::string deep = nested(1000, 100);
    deep.insert(deep.find('}'), "\"d\": 1, \"d\": 2");
    std::string key(100, 'k');
    expect_error(deep, DSM_ERR_CONFIG, ("duplicate key '" + key + "." + key + "." + key).c_str());
    unlink(path.c_str());
    rmdir(dir.c_str());
}

// ---------------------------------------------------------------- types and ranges

static void test_types_and_ranges(void **) {
    expect_error("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 4}}", DSM_ERR_CONFIG,
                 "zero_optimization.stage: expected 0..3, got 4");
    expect_error("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": \"2\"}}", DSM_ERR_CONFIG,
                 "zero_optimization.stage: expected an integer, got \"2\"");
    expect_error("{\"train_batch_size\": 8, \"zero_optimization\": 3}", DSM_ERR_CONFIG,
                 "zero_optimization: expected an object, got 3");
    expect_error("{\"train_batch_size\": 8, \"fp16\": {\"enabled\": \"yes\"}}", DSM_ERR_CONFIG,
                 "fp16.enabled: expected true or false, got \"yes\"");
    expect_error("{\"train_batch_size\": 8, \"gradient_clipping\": -1}", DSM_ERR_CONFIG,
                 "gradient_clipping: expected a number >= 0, got -1");
    expect_error("{\"train_batch_size\": 8, \"steps_per_print\": 0}", DSM_ERR_CONFIG,
                 "steps_per_print: expected an integer >= 1, got 0");
    expect_error("{\"train_batch_size\": 8, \"gradient_predivide_factor\": 0}", DSM_ERR_CONFIG,
                 "gradient_predivide_factor: expected a number > 0, got 0");
    expect_error("{\"train_batch_size\": 8, \"gradient_allreduce_op\": \"max\"}", DSM_ERR_CONFIG,
                 "gradient_allreduce_op: expected one of \"mean\", \"sum\", got \"max\"");
    expect_error("{\"train_batch_size\": 8, \"communication_data_type\": \"fp8\"}", DSM_ERR_CONFIG,
                 "communication_data_type: expected \"fp32\", \"fp16\" or \"bf16\", got \"fp8\"");
    Config c = parse("{\"train_batch_size\": 8, \"communication_data_type\": \"BFP16\", "
                     "\"seq_parallel_communication_data_type\": \"fp16\", \"gradient_allreduce_op\": \"SUM\"}");
    assert_true(c.communication_data_type == Dtype::BF16);
    assert_true(c.seq_parallel_communication_data_type == Dtype::FP16);
    assert_true(c.gradient_allreduce_op == dsm::config::AllreduceOp::SUM);
}

static void test_fp16_checks(void **) {
    expect_error("{\"train_batch_size\": 8, \"fp16\": {\"enabled\": true, \"loss_scale\": -1}}", DSM_ERR_CONFIG,
                 "fp16.loss_scale: expected a number >= 0, got -1");
    expect_error("{\"train_batch_size\": 8, \"fp16\": {\"enabled\": true, \"loss_scale_window\": 0}}", DSM_ERR_CONFIG,
                 "fp16.loss_scale_window: expected an integer >= 1, got 0");
    expect_error("{\"train_batch_size\": 8, \"fp16\": {\"enabled\": true, \"min_loss_scale\": 0}}", DSM_ERR_CONFIG,
                 "fp16.min_loss_scale: expected a number > 0, got 0");
    expect_error("{\"train_batch_size\": 8, \"fp16\": {\"enabled\": true, \"initial_scale_power\": 200}}",
                 DSM_ERR_CONFIG, "fp16.initial_scale_power: expected 0..127, got 200");
    expect_error("{\"train_batch_size\": 8, \"fp16\": {\"enabled\": true, \"hysteresis\": 0}}", DSM_ERR_CONFIG,
                 "fp16.hysteresis: expected an integer >= 1, got 0");
    expect_error("{\"train_batch_size\": 8, \"fp16\": {\"enabled\": true}, \"bf16\": {\"enabled\": true}}",
                 DSM_ERR_CONFIG, "bfloat16 and fp16 modes cannot be simultaneously enabled");
    expect_error("{\"train_batch_size\": 8, \"fp16\": {\"enabled\": true}, \"bfloat16\": {\"enabled\": true}}",
                 DSM_ERR_CONFIG, "bfloat16.enabled: bfloat16 and fp16");
    expect_error("{\"train_batch_size\": 8, \"bf16\": {\"enabled\": true}, \"bfloat16\": {\"enabled\": true}}",
                 DSM_ERR_CONFIG, "give one of them");
    Config c = parse("{\"train_batch_size\": 8, \"bfloat16\": {\"enabled\": true}}");
    assert_true(c.bf16.enabled);
    c = parse("{\"train_batch_size\": 8, \"fp16\": {\"enabled\": true, \"loss_scale\": 1024, "
              "\"initial_scale_power\": 12, \"consecutive_hysteresis\": true, \"min_loss_scale\": 0.5}}");
    assert_true(c.fp16.loss_scale == 1024.0);
    assert_int_equal(c.fp16.initial_scale_power, 12);
    assert_true(c.fp16.consecutive_hysteresis);
    assert_true(c.fp16.min_loss_scale == 0.5);
}

static void test_zero(void **) {
    expect_error("{\"train_batch_size\": 8, \"gradient_allreduce_op\": \"sum\", \"zero_optimization\": {\"stage\": 3}}",
                 DSM_ERR_CONFIG, "gradient_allreduce_op: 'sum' is not supported with ZeRO stage 3");
    parse("{\"train_batch_size\": 8, \"gradient_allreduce_op\": \"sum\", \"zero_optimization\": {\"stage\": 2}}");
    expect_error("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 2, \"allgather_bucket_size\": 0}}",
                 DSM_ERR_CONFIG, "zero_optimization.allgather_bucket_size: expected an integer >= 1 with ZeRO stage 1 or 2, got 0");
    expect_error("{\"train_batch_size\": 8, \"zero_optimization\": {\"allgather_bucket_size\": -1}}", DSM_ERR_CONFIG,
                 "zero_optimization.allgather_bucket_size: expected an integer >= 0, got -1");
    expect_error("{\"train_batch_size\": 8, \"zero_optimization\": {\"allgather_bucket_size\": 1.5}}",
                 DSM_ERR_CONFIG, "zero_optimization.allgather_bucket_size: expected an integer, got 1.5");
    assert_int_equal(parse("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 3, "
                           "\"allgather_bucket_size\": 0}}").zero.allgather_bucket_size, 0);
    // ZeRO++ hpZ: any size >= 0 is read (the engine checks it against the data-parallel size).
    assert_int_equal(parse("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 3, "
                           "\"zero_hpz_partition_size\": 8}}").zero.zero_hpz_partition_size, 8);
    assert_int_equal(parse("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 1, "
                           "\"zero_hpz_partition_size\": 3}}").zero.zero_hpz_partition_size, 3);
    expect_error("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 3, \"zero_hpz_partition_size\": -2}}",
                 DSM_ERR_CONFIG, "zero_optimization.zero_hpz_partition_size: expected an integer >= 0, got -2");
    // ZeRO++ qwZ and qgZ: read here, checked against the stage by the engine.
    {
        const Config q = parse("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 3, "
                               "\"zero_quantized_weights\": true, \"zero_quantized_gradients\": true}}");
        assert_true(q.zero.zero_quantized_weights);
        assert_true(q.zero.zero_quantized_gradients);
        assert_false(parse("{\"train_batch_size\": 8}").zero.zero_quantized_weights);
        expect_error("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 3, \"zero_quantized_weights\": 1}}",
                     DSM_ERR_CONFIG, "zero_optimization.zero_quantized_weights");
    }
    // Legacy boolean form.
    Config c = parse("{\"train_batch_size\": 8, \"zero_optimization\": true, \"allgather_size\": 1000}");
    assert_int_equal(c.zero.stage, 1);
    assert_true(c.zero.legacy_form);
    assert_int_equal(c.zero.allgather_bucket_size, 1000);
    assert_true(c.unknown_keys.empty());
    c = parse("{\"train_batch_size\": 8, \"zero_optimization\": false}");
    assert_int_equal(c.zero.stage, 0);
    // Offload and the deprecated keys.
    c = parse("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 3, \"offload_optimizer\": "
              "{\"device\": \"CPU\", \"pin_memory\": true, \"ratio\": 0.5}, \"offload_param\": {\"device\": \"none\"}}}");
    assert_true(c.zero.offload_optimizer.device == dsm::config::OffloadDevice::CPU);
    assert_true(c.zero.offload_optimizer.pin_memory);
    assert_true(c.zero.offload_param.device == dsm::config::OffloadDevice::NONE);
    expect_error("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": "
                 "{\"device\": \"cpu\", \"ratio\": 0.5}}}",
                 DSM_ERR_CONFIG, "partial offloading (0.5) is only supported with ZeRO stage 3");
    c = parse("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 2, \"cpu_offload\": true}}");
    assert_true(c.zero.offload_optimizer.device == dsm::config::OffloadDevice::CPU);
    c = parse("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 3, "
              "\"stage3_gather_fp16_weights_on_model_save\": true, \"stage3_max_live_parameters\": 3e9}}");
    assert_true(c.zero.gather_16bit_weights_on_model_save);
    assert_int_equal(c.zero.max_live_parameters, 3000000000LL);
}

static void test_optimizer(void **) {
    Config c = parse("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"ADAM\"}}");
    assert_true(c.optimizer.type == OptimizerType::ADAM);
    assert_true(c.optimizer.adam_w_mode);
    assert_false(c.optimizer.torch_adam);
    assert_true(c.optimizer.lr == 1e-3 && c.optimizer.beta1 == 0.9 && c.optimizer.beta2 == 0.999);
    assert_true(c.optimizer.eps == 1e-8 && c.optimizer.weight_decay == 0.0);
    c = parse("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"adam\", \"params\": {\"adam_w_mode\": false, "
              "\"torch_adam\": true, \"lr\": 0.01}}}");
    assert_false(c.optimizer.adam_w_mode);
    assert_true(c.optimizer.torch_adam);
    assert_true(c.optimizer.lr == 0.01);
    assert_true(c.optimizer.params["lr"].get<double>() == 0.01);
    c = parse("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"adam_w_mode\": false}}}");
    assert_true(c.optimizer.type == OptimizerType::ADAMW);
    assert_true(c.optimizer.adam_w_mode); // AdamW is always decoupled
    assert_true(parse("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"sgd\", \"params\": {\"lr\": 0.1}}}")
                    .optimizer.type == OptimizerType::SGD);
    assert_true(parse("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"LAMB\"}}").optimizer.type ==
                OptimizerType::LAMB);
    c = parse("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"Lion\"}}");
    // DeepSpeed's FusedLion and CPU Lion: betas (0.9, 0.999).
    assert_true(c.optimizer.type == OptimizerType::LION && c.optimizer.beta1 == 0.9 && c.optimizer.beta2 == 0.999);
    c = parse("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"adagrad\"}}");
    assert_true(c.optimizer.type == OptimizerType::ADAGRAD && c.optimizer.lr == 1e-2 && c.optimizer.eps == 1e-10);

    expect_error("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"Adam\", \"params\": {\"max_grad_norm\": 1.0}}}",
                 DSM_ERR_CONFIG, "optimizer.params.max_grad_norm: 1.0 is not accepted as an optimizer parameter");
    expect_error("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"Adamax\"}}", DSM_ERR_CONFIG,
                 "optimizer.type: expected one of Adam, AdamW, SGD, Lamb, Lion, Adagrad, got \"Adamax\"");
    expect_error("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"OneBitAdam\"}}", DSM_ERR_NOT_SUPPORTED,
                 "optimizer.type: \"OneBitAdam\" is not supported");
    expect_error("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"Adam\", \"params\": {\"betas\": [0.9]}}}",
                 DSM_ERR_CONFIG, "optimizer.params.betas: expected a list of two numbers, got [0.9]");
    expect_error("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": -1}}}",
                 DSM_ERR_CONFIG, "optimizer.params.lr: expected a number >= 0, got -1");
    expect_error("{\"train_batch_size\": 8, \"optimizer\": {\"params\": {\"lr\": 1}}}", DSM_ERR_CONFIG,
                 "optimizer.type: missing");
}

static void test_scheduler(void **) {
    Config c = parse("{\"train_batch_size\": 8, \"scheduler\": {\"type\": \"WarmupLR\"}}");
    assert_true(c.scheduler.type == SchedulerType::WARMUP_LR);
    assert_true(c.scheduler.params["warmup_max_lr"].is_null()); // the optimizer's lr
    c = parse("{\"train_batch_size\": 8, \"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": "
              "{\"total_num_steps\": 1000, \"last_batch_iteration\": 7}}}");
    assert_true(c.scheduler.params["warmup_max_lr"].get<double>() == 0.001);
    // The same parameters, typed.
    assert_true(c.scheduler.schedule.type == dsm::optim::LrScheduleType::WarmupDecayLR);
    assert_int_equal(*c.scheduler.schedule.total_num_steps, 1000);
    assert_int_equal(c.scheduler.schedule.warmup_num_steps, 1000);
    assert_int_equal(c.scheduler.last_batch_iteration, 7);
    // Ranges are checked by the reader.
    expect_error("{\"train_batch_size\": 8, \"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": "
                 "{\"total_num_steps\": 10}}}",
                 DSM_ERR_CONFIG, "scheduler.params.total_num_steps: must be at least warmup_num_steps (1000), got 10");
    c = parse("{\"train_batch_size\": 8, \"scheduler\": {\"type\": \"WarmupLR\"}}");
    assert_int_equal(c.scheduler.params["warmup_num_steps"].get<int>(), 1000);
    assert_string_equal(c.scheduler.params["warmup_type"].get<std::string>().c_str(), "log");
    c = parse("{\"train_batch_size\": 8, \"scheduler\": {\"type\": \"OneCycle\", \"params\": "
              "{\"cycle_min_lr\": [0.1, 0.2], \"cycle_max_lr\": 1}}}");
    assert_true(c.scheduler.params["cycle_min_lr"].is_array());
    assert_true(c.scheduler.params["cycle_second_step_size"].is_null());
    assert_true(c.scheduler.params["cycle_momentum"].get<bool>());
    c = parse("{\"train_batch_size\": 8, \"scheduler\": {\"type\": \"LRRangeTest\"}}");
    assert_int_equal(c.scheduler.params["lr_range_test_step_size"].get<int>(), 2000);
    c = parse("{\"train_batch_size\": 8, \"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": "
              "{\"total_num_steps\": 1000}}}");
    assert_true(c.scheduler.params["cos_min_ratio"].get<double>() == 0.0001);
    expect_error("{\"train_batch_size\": 8, \"scheduler\": {\"type\": \"WarmupDecayLR\"}}", DSM_ERR_CONFIG,
                 "scheduler.params.total_num_steps: required by WarmupDecayLR");
    expect_error("{\"train_batch_size\": 8, \"scheduler\": {\"type\": \"OneCycle\", \"params\": {\"cycle_min_lr\": 1}}}",
                 DSM_ERR_CONFIG, "scheduler.params.cycle_max_lr: required by OneCycle");
    expect_error("{\"train_batch_size\": 8, \"scheduler\": {\"type\": \"CosineAnnealing\"}}", DSM_ERR_CONFIG,
                 "scheduler.type: expected one of WarmupLR");
    expect_error("{\"train_batch_size\": 8, \"scheduler\": {\"type\": \"WarmupLR\", \"params\": "
                 "{\"warmup_type\": \"cosine\"}}}",
                 DSM_ERR_CONFIG, "scheduler.params.warmup_type: expected \"log\" or \"linear\", got \"cosine\"");
    expect_error("{\"train_batch_size\": 8, \"scheduler\": {\"type\": \"WarmupLR\", \"params\": "
                 "{\"warmup_max_lr\": \"high\"}}}",
                 DSM_ERR_CONFIG, "scheduler.params.warmup_max_lr: expected a number >= 0 or a list");
    expect_error("{\"train_batch_size\": 8, \"scheduler\": {\"type\": \"LRRangeTest\", \"params\": "
                 "{\"lr_range_test_step_size\": 0}}}",
                 DSM_ERR_CONFIG, "scheduler.params.lr_range_test_step_size: expected an integer >= 1, got 0");
}

static void test_checkpoint_and_data_types(void **) {
    Config c = parse("{\"train_batch_size\": 8, \"checkpoint\": {\"tag_validation\": \"fail\", \"load_universal\": true}, "
                     "\"data_types\": {\"grad_accum_dtype\": \"bf16\"}}");
    assert_true(c.checkpoint.tag_validation == dsm::config::TagValidation::FAIL);
    assert_true(c.checkpoint.load_universal);
    assert_true(c.grad_accum_dtype == Dtype::BF16);
    assert_true(parse("{\"train_batch_size\": 8, \"checkpoint\": {\"tag_validation\": \"IGNORE\"}}")
                    .checkpoint.tag_validation == dsm::config::TagValidation::IGNORE);
    expect_error("{\"train_batch_size\": 8, \"checkpoint\": {\"tag_validation\": \"strict\"}}", DSM_ERR_CONFIG,
                 "checkpoint.tag_validation: expected one of \"Warn\", \"Ignore\", \"Fail\", got \"strict\"");
    expect_error("{\"train_batch_size\": 8, \"data_types\": {\"grad_accum_dtype\": \"int8\"}}", DSM_ERR_CONFIG,
                 "data_types.grad_accum_dtype: expected \"fp32\", \"fp16\" or \"bf16\", got \"int8\"");
}

// fp32_nonfinite_gradients (a libdsm extension): "warn" by default, any case;
// a bad value is an error naming the key and the value.
static void test_fp32_nonfinite_gradients(void **) {
    using dsm::config::NonfiniteGrads;
    assert_true(parse("{\"train_batch_size\": 8}").fp32_nonfinite_gradients == NonfiniteGrads::WARN);
    assert_true(parse("{\"train_batch_size\": 8, \"fp32_nonfinite_gradients\": \"skip\"}").fp32_nonfinite_gradients ==
                NonfiniteGrads::SKIP);
    assert_true(parse("{\"train_batch_size\": 8, \"fp32_nonfinite_gradients\": \"Fail\"}").fp32_nonfinite_gradients ==
                NonfiniteGrads::FAIL);
    assert_true(parse("{\"train_batch_size\": 8, \"fp32_nonfinite_gradients\": \"WARN\"}").fp32_nonfinite_gradients ==
                NonfiniteGrads::WARN);
    // A known key: no unknown-key warning, and accepted in strict mode.
    assert_true(parse("{\"train_batch_size\": 8, \"fp32_nonfinite_gradients\": \"skip\"}").unknown_keys.empty());
    parse("{\"train_batch_size\": 8, \"fp32_nonfinite_gradients\": \"fail\"}", 1, 0, true);
    expect_error("{\"train_batch_size\": 8, \"fp32_nonfinite_gradients\": \"ignore\"}", DSM_ERR_CONFIG,
                 "fp32_nonfinite_gradients: expected one of \"warn\", \"skip\", \"fail\", got \"ignore\"");
    expect_error("{\"train_batch_size\": 8, \"fp32_nonfinite_gradients\": \"\"}", DSM_ERR_CONFIG,
                 "fp32_nonfinite_gradients: expected one of \"warn\", \"skip\", \"fail\", got \"\"");
    expect_error("{\"train_batch_size\": 8, \"fp32_nonfinite_gradients\": true}", DSM_ERR_CONFIG,
                 "fp32_nonfinite_gradients: expected one of \"warn\", \"skip\", \"fail\", got true");
    expect_error("{\"train_batch_size\": 8, \"fp32_nonfinite_gradients\": 1}", DSM_ERR_CONFIG,
                 "fp32_nonfinite_gradients: expected one of \"warn\", \"skip\", \"fail\", got 1");
    // The resolved configuration says it.
    Json j = Json::parse(dsm::config::config_to_json(parse("{\"train_batch_size\": 8}")));
    assert_string_equal(j["fp32_nonfinite_gradients"].get<std::string>().c_str(), "warn");
    j = Json::parse(dsm::config::config_to_json(parse("{\"train_batch_size\": 8, \"fp32_nonfinite_gradients\": \"SKIP\"}")));
    assert_string_equal(j["fp32_nonfinite_gradients"].get<std::string>().c_str(), "skip");
}

static void test_not_supported(void **) {
    const char *cases[][2] = {
        {"\"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\": \"nvme\"}}",
         "zero_optimization.offload_param.device"},
        {"\"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"/x\"}}",
         "zero_optimization.offload_optimizer.device"},
        {"\"zero_optimization\": {\"stage\": 3, \"mics_shard_size\": 8}", "zero_optimization.mics_shard_size"},
        {"\"zero_optimization\": {\"stage\": 3, \"zero_quantized_nontrainable_weights\": true}",
         "zero_optimization.zero_quantized_nontrainable_weights"},
        {"\"amp\": {\"enabled\": true, \"opt_level\": \"O1\"}", "amp"},
        {"\"flops_profiler\": {\"enabled\": true}", "flops_profiler"},
        {"\"autotuning\": {\"enabled\": true}", "autotuning"},
        {"\"wandb\": {\"enabled\": true}", "wandb"},
        {"\"compression_training\": {}", "compression_training"},
        {"\"pipeline\": {\"stages\": 2}", "pipeline"},
        {"\"sparse_gradients\": true", "sparse_gradients"},
        {"\"activation_checkpointing\": {\"partition_activations\": true}", "activation_checkpointing.partition_activations"},
        {"\"fp16\": {\"enabled\": true, \"auto_cast\": true}", "fp16.auto_cast"},
        {"\"optimizer\": {\"type\": \"adam\", \"params\": {\"amsgrad\": true}}", "optimizer.params.amsgrad"},
        {"\"checkpoint\": {\"use_node_local_storage\": true}", "checkpoint.use_node_local_storage"},
    };
    for (auto &c : cases)
        expect_error(std::string("{\"train_batch_size\": 8, ") + c[0] + "}", DSM_ERR_NOT_SUPPORTED, c[1]);
    // Disabled blocks are accepted, with their other keys.
    Config ok = parse("{\"train_batch_size\": 8, \"amp\": {\"enabled\": false, \"opt_level\": \"O1\"}, "
                      "\"flops_profiler\": {\"enabled\": false, \"profile_step\": 1}, \"sparse_gradients\": false, "
                      "\"activation_checkpointing\": {\"partition_activations\": false, \"number_checkpoints\": 4}}");
    assert_true(ok.unknown_keys.empty());
}

static void test_unknown_keys(void **) {
    const char *text = "{\"train_batch_size\": 8, \"trian_micro_batch\": 2, \"zero_optimization\": {\"stage\": 1, "
                       "\"bucket\": 5}, \"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 1, \"momentum\": 0.9}}}";
    Config c = parse(text);
    assert_int_equal(c.unknown_keys.size(), 3);
    std::string all;
    for (const std::string &k : c.unknown_keys) all += k + ";";
    assert_non_null(std::strstr(all.c_str(), "trian_micro_batch;"));
    assert_non_null(std::strstr(all.c_str(), "zero_optimization.bucket;"));
    assert_non_null(std::strstr(all.c_str(), "optimizer.params.momentum;"));
    expect_error(text, DSM_ERR_CONFIG, "unknown keys (strict checking): ", 1, 0, true);
    expect_error(text, DSM_ERR_CONFIG, "trian_micro_batch", 1, 0, true);
    expect_error(text, DSM_ERR_CONFIG, "zero_optimization.bucket", 1, 0, true);
    // Strict and clean.
    parse("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 1}}", 1, 0, true);
}

static void test_to_json(void **) {
    Config c = parse("{\"train_micro_batch_size_per_gpu\": 2, \"sequence_parallel_size\": 2, \"bf16\": {\"enabled\": true}, "
                     "\"optimizer\": {\"type\": \"AdamW\"}, \"scheduler\": {\"type\": \"WarmupLR\"}, \"extra\": 1}", 8);
    Json j = Json::parse(dsm::config::config_to_json(c));
    assert_int_equal(j["train_batch_size"].get<int>(), 8);
    assert_int_equal(j["gradient_accumulation_steps"].get<int>(), 1);
    assert_true(j["gradient_clipping"].get<double>() == 1.0);
    assert_true(j["bf16"]["enabled"].get<bool>());
    assert_int_equal(j["zero_optimization"]["stage"].get<int>(), 0);
    assert_string_equal(j["optimizer"]["type"].get<std::string>().c_str(), "adamw");
    assert_true(j["optimizer"]["params"]["adam_w_mode"].get<bool>());
    assert_string_equal(j["scheduler"]["type"].get<std::string>().c_str(), "WarmupLR");
    assert_int_equal(j["scheduler"]["params"]["warmup_num_steps"].get<int>(), 1000);
    assert_true(j["communication_data_type"].is_null());
    assert_string_equal(j["checkpoint"]["tag_validation"].get<std::string>().c_str(), "WARN");
    assert_int_equal(j["resolved"]["world_size"].get<int>(), 8);
    assert_int_equal(j["resolved"]["data_parallel_world_size"].get<int>(), 4);
    assert_string_equal(j["resolved"]["data_parallel_source"].get<std::string>().c_str(), "sequence_parallel_size");
    assert_int_equal(j["resolved"]["given"].size(), 1);
    assert_int_equal(j["resolved"]["derived"].size(), 2);
    assert_string_equal(j["unknown_keys"][0].get<std::string>().c_str(), "extra");
    // Keys accepted without effect are listed, and marked in the text form; keys with an effect are not.
    std::vector<std::string> none = j["resolved"]["no_effect"].get<std::vector<std::string>>();
    for (const char *k : {"zero_optimization.contiguous_gradients", "zero_optimization.offload_optimizer.buffer_count",
                          "checkpoint.load_universal", "seq_parallel_communication_data_type"})
        if (std::find(none.begin(), none.end(), k) == none.end()) fail_msg("%s is not in resolved.no_effect", k);
    for (const std::string &k : none) assert_true(dsm::config::key_has_no_effect(k));
    for (const char *k : {"zero_optimization.stage", "gradient_clipping", "bf16.enabled", "optimizer.type",
                          "zero_optimization.overlap_comm", "checkpoint.tag_validation", "optimizer.params.torch_adam"}) {
        assert_false(dsm::config::key_has_no_effect(k));
        if (std::find(none.begin(), none.end(), k) != none.end()) fail_msg("%s is in resolved.no_effect", k);
    }
    const std::string text = dsm::config::config_to_text(c);
    assert_non_null(strstr(text.c_str(), "\nzero_optimization.sub_group_size = 1000000000  # no effect in libdsm\n"));
    assert_non_null(strstr(text.c_str(), "\nzero_optimization.stage = 0\n"));
}

// The unknown-key message names the near key of the same level and what
// applies without it; a key near nothing gets no suggestion.
static void test_unknown_key_suggestions(void **) {
    const char *typo = "{\"train_batch_size\": 8, \"zero_optimisation\": {\"stage\": 3}}";
    expect_error(typo, DSM_ERR_CONFIG, "zero_optimisation (did you mean zero_optimization? without it, ZeRO stage 0 "
                                       "applies)", 1, 0, true);
    expect_error("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 2, \"overlap_com\": true}}",
                 DSM_ERR_CONFIG, "did you mean zero_optimization.overlap_comm? without it, "
                                 "zero_optimization.overlap_comm = false applies", 1, 0, true);
    expect_error("{\"train_batch_size\": 8, \"gradient_cliping\": 0.5}", DSM_ERR_CONFIG,
                 "did you mean gradient_clipping? without it, gradient_clipping = 1.0 applies", 1, 0, true);
    expect_error("{\"train_batch_size\": 8, \"fp16\": {\"enabeld\": true}}", DSM_ERR_CONFIG,
                 "did you mean fp16.enabled?", 1, 0, true);
    try {
        parse("{\"train_batch_size\": 8, \"completely_different\": 1}", 1, 0, true);
        fail_msg("strict parsing accepted an unknown key");
    } catch (const dsm::Error &e) {
        assert_non_null(std::strstr(e.what(), "completely_different"));
        assert_null(std::strstr(e.what(), "did you mean"));
    }
    // Not strict: read, the key listed.
    Config c = parse(typo);
    assert_int_equal(c.unknown_keys.size(), 1);
    assert_int_equal(c.zero.stage, 0);
}

// resolve_for(): a configuration read for one job, resolved again for
// another from the keys the text gave.
static void test_resolve_for(void **) {
    Config c = parse("{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": 3}", 8);
    assert_int_equal(c.train_batch_size, 48);
    ConfigContext ctx;
    ctx.world_size = 8;
    ctx.mesh_data_parallel = 4;
    ctx.mesh_sequence_parallel = 2;
    Config r = dsm::config::resolve_for(c, ctx);
    assert_int_equal(r.train_batch_size, 24);
    assert_int_equal(r.data_parallel_world_size, 4);
    assert_int_equal(r.sequence_parallel_size, 2);
    assert_string_equal(r.data_parallel_source.c_str(), "mesh");
    assert_false(r.train_batch_size_given);
    // A given train_batch_size that does not divide for the new mesh.
    Config t = parse("{\"train_batch_size\": 8, \"train_micro_batch_size_per_gpu\": 8}", 1);
    ctx.world_size = 2;
    ctx.mesh_data_parallel = 2;
    ctx.mesh_sequence_parallel = 1;
    try {
        (void)dsm::config::resolve_for(t, ctx);
        fail_msg("resolve_for accepted batch values that do not divide");
    } catch (const dsm::Error &e) {
        assert_int_equal(e.status(), DSM_ERR_CONFIG);
        assert_non_null(std::strstr(e.what(), "train_batch_size"));
    }
}

// ---------------------------------------------------------------- real configuration files

static void test_example_files(void **) {
    Config c = parse(data_path("zero1_fp16_adam.json"), 8, 0, true);
    expect_batch(c, 64, 4, 2);
    assert_int_equal(c.zero.stage, 1);
    assert_true(c.fp16.enabled);
    assert_true(c.optimizer.type == OptimizerType::ADAM && c.optimizer.adam_w_mode);
    assert_true(c.optimizer.weight_decay == 0.01);
    assert_true(c.scheduler.type == SchedulerType::WARMUP_LR);

    c = parse(data_path("zero2_bf16_adamw_warmupdecay.json"), 8, 0, true);
    expect_batch(c, 256, 8, 4);
    assert_int_equal(c.zero.stage, 2);
    assert_true(c.bf16.enabled);
    assert_true(c.zero.overlap_comm);
    assert_int_equal(c.zero.allgather_bucket_size, 200000000);
    assert_true(c.zero.offload_optimizer.device == dsm::config::OffloadDevice::CPU);
    assert_true(c.optimizer.type == OptimizerType::ADAMW && c.optimizer.beta2 == 0.95);
    assert_int_equal(c.scheduler.params["total_num_steps"].get<int>(), 10000);

    c = parse(data_path("zero3_bf16_cosine.json"), 8, 0, true);
    expect_batch(c, 256, 4, 8);
    assert_int_equal(c.zero.stage, 3);
    assert_int_equal(c.zero.prefetch_bucket_size, 15099494);
    assert_true(c.zero.gather_16bit_weights_on_model_save);
    assert_true(c.scheduler.type == SchedulerType::WARMUP_COSINE_LR);
    assert_true(c.checkpoint.tag_validation == dsm::config::TagValidation::FAIL);
    assert_true(c.grad_accum_dtype == Dtype::FP32);

    c = parse(data_path("zero3_fp16_lamb_onecycle.json"), 8, 0, true);
    expect_batch(c, 1024, 16, 8);
    assert_true(c.optimizer.type == OptimizerType::LAMB && !c.optimizer.bias_correction);
    assert_int_equal(c.fp16.initial_scale_power, 32);
    assert_true(c.scheduler.type == SchedulerType::ONE_CYCLE);
    assert_true(c.gradient_clipping == 0.0);
    assert_true(c.zero.offload_param.device == dsm::config::OffloadDevice::CPU);
    // The same file on 4 ranks breaks the batch equation.
    expect_error(data_path("zero3_fp16_lamb_onecycle.json"), DSM_ERR_CONFIG, "1024 != 16 * 8 * 4", 4);

    c = parse(data_path("ulysses_sp_bf16_sgd.json"), 8, 0, true);
    expect_batch(c, 4, 1, 2);
    assert_int_equal(c.data_parallel_world_size, 2);
    assert_true(c.seq_parallel_communication_data_type == Dtype::BF16);
    assert_true(c.optimizer.type == OptimizerType::SGD && c.optimizer.nesterov);
    assert_true(c.scheduler.type == SchedulerType::LR_RANGE_TEST);
    assert_true(c.gradient_allreduce_op == dsm::config::AllreduceOp::SUM);

    c = parse(data_path("fp32_lion_legacy_zero.json"), 8, 0, true);
    expect_batch(c, 32, 4, 1);
    assert_true(c.zero.legacy_form && c.zero.stage == 1);
    assert_int_equal(c.zero.allgather_bucket_size, 100000000);
    assert_true(c.optimizer.type == OptimizerType::LION);
    assert_true(c.prescale_gradients && c.gradient_predivide_factor == 2.0);

    c = parse(data_path("zero0_fp16_static_adagrad.json"), 8, 0, true);
    expect_batch(c, 96, 12, 1);
    assert_true(c.fp16.loss_scale == 128.0);
    assert_true(c.optimizer.type == OptimizerType::ADAGRAD);
    assert_true(c.checkpoint.tag_validation == dsm::config::TagValidation::IGNORE);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_batch_all_three),
        cmocka_unit_test(test_batch_tb_mb),
        cmocka_unit_test(test_batch_tb_gas),
        cmocka_unit_test(test_batch_mb_gas),
        cmocka_unit_test(test_batch_one_given),
        cmocka_unit_test(test_batch_values),
        cmocka_unit_test(test_batch_world_from_sequence_parallel),
        cmocka_unit_test(test_batch_world_from_mesh),
        cmocka_unit_test(test_sequence_parallel_from_mesh),
        cmocka_unit_test(test_syntax_error_position),
        cmocka_unit_test(test_duplicate_keys),
        cmocka_unit_test(test_files),
        cmocka_unit_test(test_not_regular_files),
        cmocka_unit_test(test_nul_byte),
        cmocka_unit_test(test_size_and_depth_limits),
        cmocka_unit_test(test_deep_nesting_is_cheap),
        cmocka_unit_test(test_types_and_ranges),
        cmocka_unit_test(test_fp16_checks),
        cmocka_unit_test(test_zero),
        cmocka_unit_test(test_optimizer),
        cmocka_unit_test(test_scheduler),
        cmocka_unit_test(test_checkpoint_and_data_types),
        cmocka_unit_test(test_fp32_nonfinite_gradients),
        cmocka_unit_test(test_not_supported),
        cmocka_unit_test(test_unknown_keys),
        cmocka_unit_test(test_unknown_key_suggestions),
        cmocka_unit_test(test_resolve_for),
        cmocka_unit_test(test_to_json),
        cmocka_unit_test(test_example_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
