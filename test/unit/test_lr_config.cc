// Learning-rate schedules from a DeepSpeed configuration: every scheduler
// parsed from inline JSON and checked against the closed-form values,
// per-group lists, type errors, the base lr, and describe_lr()'s output.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config.hpp"
#include "core/error.hpp"
#include "config/settings.hpp"
#include "optim/lr_schedule.hpp"

#include "cxx_test.h" // last: CMocka's fail() macro would break the C++ headers

using dsm::config::Config;
using dsm::config::ConfigContext;
using dsm::config::Json;
using dsm::config::SchedulerType;
using dsm::optim::LrSchedule;
using dsm::optim::LrScheduleParams;
using dsm::optim::LrScheduleType;


// A configuration from inline JSON: `optimizer` and `scheduler` are the JSON
// values of those sections ("" leaves the section out).
static Config parse(const std::string &optimizer, const std::string &scheduler) {
    std::string text = "{\"train_batch_size\": 8";
    if (!optimizer.empty()) text += ", \"optimizer\": " + optimizer;
    if (!scheduler.empty()) text += ", \"scheduler\": " + scheduler;
    text += "}";
    ConfigContext ctx;
    ctx.world_size = 1;
    return dsm::config::parse_config(text, ctx);
}

static const char *const kAdamW = R"({"type": "AdamW", "params": {"lr": 0.3}})";

// The configured schedule (must exist).
static LrSchedule schedule(const std::string &optimizer, const std::string &scheduler) {
    std::optional<LrSchedule> s = dsm::config::schedule_from_config(parse(optimizer, scheduler));
    assert_true(s.has_value());
    return *s;
}

// Step until last_step() == target.
static void step_to(LrSchedule &s, int64_t target) {
    while (s.last_step() < target) s.step();
    assert_int_equal(s.last_step(), target);
}

static double lr_at(LrSchedule &s, int64_t t) {
    step_to(s, t);
    return s.lr()[0];
}
#define CYCLE(s, t, lr, mom) (NEAR(lr_at((s), (t)), (lr)), NEAR((s).momentum()[0], (mom)))

#define EXPECT_ERROR(expr, status, ...) expect_error_at([&] { (void)(expr); }, (status), __VA_ARGS__, __LINE__)

// --- The five schedules ---------------------------------------------------

static void test_warmup_lr(void **) {
    auto s = schedule(kAdamW, R"({"type": "WarmupLR", "params": {"warmup_min_lr": 0.0001,
        "warmup_max_lr": 0.001, "warmup_num_steps": 100}})");
    assert_true(s.type() == LrScheduleType::WarmupLR);
    assert_int_equal(s.num_groups(), 1);
    assert_int_equal(s.last_step(), -1);
    NEAR(s.lr()[0], 0.0001);
    NEAR(lr_at(s, 0), 0.0001);                 // log(1) = 0
    NEAR(lr_at(s, 9), 0.0001 + 0.0009 * 0.5);  // log(10) / log(100)
    NEAR(lr_at(s, 30), 0.0001 + 0.0009 * std::log(31.0) / std::log(100.0));
    NEAR(lr_at(s, 99), 0.001);
    NEAR(lr_at(s, 5000), 0.001);
    assert_true(s.momentum().empty());

    // Without warmup_max_lr WarmupLR warms up to the optimizer's lr (0.3),
    // as DeepSpeed does; linear warmup.
    s = schedule(kAdamW, R"({"type": "WarmupLR", "params": {"warmup_num_steps": 10,
        "warmup_type": "linear"}})");
    NEAR(lr_at(s, 0), 0.0);
    NEAR(lr_at(s, 5), 0.15);
    NEAR(lr_at(s, 10), 0.3);
    // The default 1000 log steps, integral float accepted.
    s = schedule(kAdamW, R"({"type": "WarmupLR", "params": {"warmup_num_steps": 1e3}})");
    NEAR(lr_at(s, 9), 0.3 / 3.0);
    NEAR(lr_at(s, 999), 0.3);
}

static void test_warmup_decay_lr(void **) {
    auto s = schedule(kAdamW, R"({"type": "WarmupDecayLR", "params": {"warmup_num_steps": 10,
        "warmup_type": "linear", "total_num_steps": 110}})");
    assert_true(s.type() == LrScheduleType::WarmupDecayLR);
    NEAR(s.lr()[0], 0.0);
    NEAR(lr_at(s, 5), 0.0005);
    NEAR(lr_at(s, 10), 0.001);
    NEAR(lr_at(s, 11), 0.001 * 0.99);
    NEAR(lr_at(s, 60), 0.0005);
    NEAR(lr_at(s, 110), 0.0);
    NEAR(lr_at(s, 500), 0.0);
}

static void test_warmup_cosine_lr(void **) {
    // Scales the optimizer's lr (0.1).
    auto s = schedule(R"({"type": "Adam", "params": {"lr": 0.1}})",
                      R"({"type": "WarmupCosineLR", "params": {"total_num_steps": 110,
        "warmup_num_steps": 10, "warmup_type": "linear", "warmup_min_ratio": 0.1,
        "cos_min_ratio": 0.01}})");
    assert_true(s.type() == LrScheduleType::WarmupCosineLR);
    NEAR(s.lr()[0], 0.0);
    NEAR(lr_at(s, 0), 0.01);
    NEAR(lr_at(s, 5), 0.055);
    NEAR(lr_at(s, 9), 0.091);
    NEAR(lr_at(s, 10), 0.1 * (0.01 + 0.99 * (1.0 + std::cos(kPi * 0.01)) / 2.0));
    NEAR(lr_at(s, 59), 0.0505);
    NEAR(lr_at(s, 84), 0.1 * (0.01 + 0.99 * (1.0 - std::sqrt(0.5)) / 2.0));
    NEAR(lr_at(s, 109), 0.001);
    NEAR(lr_at(s, 1000), 0.001);

    // Without "params.lr" the optimizer's default lr: 1e-3, 1e-2 for Adagrad.
    const char *cosine = R"({"type": "WarmupCosineLR", "params": {"total_num_steps": 2000}})";
    s = schedule(R"({"type": "Lamb"})", cosine);
    NEAR(lr_at(s, 999), 0.001);
    NEAR(lr_at(s, 1499), 0.001 * (0.0001 + 0.9999 * 0.5));
    s = schedule(R"({"type": "Adagrad"})", cosine);
    NEAR(lr_at(s, 999), 0.01);
    NEAR(lr_at(s, 1999), 0.01 * 0.0001);
}

static void test_one_cycle(void **) {
    auto s = schedule(kAdamW, R"({"type": "OneCycle", "params": {"cycle_min_lr": 0.001,
        "cycle_max_lr": 0.01, "cycle_first_step_size": 10}})");
    assert_true(s.type() == LrScheduleType::OneCycle);
    NEAR(s.lr()[0], 0.001);
    NEAR(s.momentum()[0], 0.8);
    CYCLE(s, 0, 0.0019, 0.89);
    CYCLE(s, 4, 0.0055, 0.85);
    CYCLE(s, 9, 0.01, 0.8);
    CYCLE(s, 10, 0.0091, 0.81);
    CYCLE(s, 19, 0.001, 0.9);
    CYCLE(s, 5000, 0.001, 0.9);

    // Decay after the cycle; asymmetric halves with null second stair count.
    s = schedule(kAdamW, R"({"type": "OneCycle", "params": {"cycle_min_lr": 0.001,
        "cycle_max_lr": 0.01, "cycle_first_step_size": 10, "decay_step_size": 5,
        "decay_lr_rate": 0.5, "decay_mom_rate": 0.1, "cycle_second_stair_count": null}})");
    CYCLE(s, 20, 0.001 / 1.1, 0.9 * 1.02);
    CYCLE(s, 29, 0.0005, 0.9 * 1.2);
    s = schedule(kAdamW, R"({"type": "OneCycle", "params": {"cycle_min_lr": 0.001,
        "cycle_max_lr": 0.01, "cycle_first_step_size": 10, "cycle_second_step_size": 30}})");
    NEAR(lr_at(s, 24), 0.0055);
    NEAR(lr_at(s, 38), 0.0013);
    // Stairs.
    s = schedule(kAdamW, R"({"type": "OneCycle", "params": {"cycle_min_lr": 0.001,
        "cycle_max_lr": 0.01, "cycle_first_step_size": 10, "cycle_first_stair_count": 2}})");
    NEAR(lr_at(s, 3), 0.001);
    CYCLE(s, 4, 0.0055, 0.85);
    NEAR(lr_at(s, 14), 0.0055);
    CYCLE(s, 15, 0.001, 0.9);
    // No momentum cycling.
    s = schedule(kAdamW, R"({"type": "OneCycle", "params": {"cycle_min_lr": 0.001,
        "cycle_max_lr": 0.01, "cycle_first_step_size": 10, "cycle_momentum": false}})");
    assert_true(s.momentum().empty());
    NEAR(lr_at(s, 4), 0.0055);
}

static void test_lr_range_test(void **) {
    auto s = schedule(kAdamW, R"({"type": "LRRangeTest", "params": {"lr_range_test_min_lr": 0.001,
        "lr_range_test_step_size": 10, "lr_range_test_step_rate": 0.5}})");
    assert_true(s.type() == LrScheduleType::LRRangeTest);
    NEAR(s.lr()[0], 0.001);
    NEAR(lr_at(s, 0), 0.00105);
    NEAR(lr_at(s, 9), 0.0015);
    NEAR(lr_at(s, 1999), 0.101);
    s = schedule(kAdamW, R"({"type": "LRRangeTest", "params": {"lr_range_test_min_lr": 0.001,
        "lr_range_test_step_size": 10, "lr_range_test_step_rate": 0.5,
        "lr_range_test_staircase": true}})");
    NEAR(lr_at(s, 8), 0.001);
    NEAR(lr_at(s, 9), 0.0015);
    NEAR(lr_at(s, 19), 0.002);
    // Defaults (1e-3, 2000 steps, rate 1).
    s = schedule(kAdamW, R"({"type": "LRRangeTest"})");
    NEAR(lr_at(s, 999), 0.0015);
    NEAR(lr_at(s, 1999), 0.002);
}

static void test_last_batch_iteration(void **) {
    auto s = schedule(kAdamW, R"({"type": "WarmupLR", "params": {"warmup_num_steps": 10,
        "warmup_type": "linear", "last_batch_iteration": 4}})");
    assert_int_equal(s.last_step(), 4);
    NEAR(s.lr()[0], 0.12); // 4/10 of the way to the optimizer's lr 0.3
    s.step();
    NEAR(s.lr()[0], 0.15);
}

// OneCycle cycles momentum only for optimizers with betas, as DeepSpeed does
// (its OneCycle turns cycle_momentum off when the optimizer's defaults have
// no "betas"): SGD and Adagrad keep their own.
static void test_one_cycle_momentum_needs_betas(void **) {
    const char *one_cycle = R"({"type": "OneCycle", "params": {"cycle_min_lr": 0.001,
        "cycle_max_lr": 0.01, "cycle_first_step_size": 10}})";
    for (const char *opt : {R"({"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}})",
                            R"({"type": "Adagrad", "params": {"lr": 0.1}})"}) {
        auto s = schedule(opt, one_cycle);
        assert_true(s.momentum().empty());
    }
    for (const char *opt : {kAdamW, R"({"type": "Lion"})", R"({"type": "Lamb"})"}) {
        auto s = schedule(opt, one_cycle);
        ALL_NEAR(s.momentum(), {0.8}); // cycle_min_mom at t = -1
    }
}

// --- Per-group lists ------------------------------------------------------

static void test_per_group(void **) {
    auto s = schedule(kAdamW, R"({"type": "WarmupLR", "params": {"warmup_min_lr": [0.0, 0.001],
        "warmup_max_lr": [0.01, 0.002], "warmup_num_steps": 4, "warmup_type": "linear"}})");
    assert_int_equal(s.num_groups(), 2);
    ALL_NEAR(s.lr(), {0.0, 0.001});
    step_to(s, 2);
    ALL_NEAR(s.lr(), {0.005, 0.0015});
    // A scalar min with a per-group max.
    s = schedule(kAdamW, R"({"type": "WarmupDecayLR", "params": {"warmup_min_lr": 0.0001,
        "warmup_max_lr": [0.0011, 0.0021], "total_num_steps": 110, "warmup_num_steps": 10}})");
    step_to(s, 60);
    ALL_NEAR(s.lr(), {0.0006, 0.0011});

    s = schedule(kAdamW, R"({"type": "OneCycle", "params": {"cycle_min_lr": [0.001, 0.002],
        "cycle_max_lr": [0.01, 0.02], "cycle_first_step_size": 10,
        "cycle_min_mom": [0.8, 0.85], "cycle_max_mom": [0.9, 0.95]}})");
    ALL_NEAR(s.momentum(), {0.8, 0.85});
    step_to(s, 14);
    ALL_NEAR(s.lr(), {0.0055, 0.011});
    ALL_NEAR(s.momentum(), {0.85, 0.9});

    s = schedule(kAdamW, R"({"type": "LRRangeTest", "params": {"lr_range_test_min_lr": [0.001, 0.01],
        "lr_range_test_step_size": 10, "lr_range_test_step_rate": 0.5}})");
    step_to(s, 9);
    ALL_NEAR(s.lr(), {0.0015, 0.015});

    // Lists of different lengths: the reader rejects them.
    EXPECT_ERROR(parse(kAdamW, R"({"type": "WarmupLR", "params": {"warmup_min_lr": [0.0, 0.1],
        "warmup_max_lr": [0.1, 0.2, 0.3]}})"), DSM_ERR_CONFIG, {"scheduler.params.warmup_min_lr", "got 2"});
}

// --- The typed parameters the reader writes ------------------------------

// The schedule's parameters as the configuration reader wrote them.
static LrScheduleParams params_of(const std::string &scheduler, int64_t *last = nullptr) {
    const Config c = parse(kAdamW, scheduler);
    if (last) *last = c.scheduler.last_batch_iteration;
    return c.scheduler.schedule;
}

static void test_params_from_json(void **) {
    // Missing keys keep the LrScheduleParams defaults; WarmupLR without
    // warmup_max_lr reads the base lr.
    int64_t last = 0;
    LrScheduleParams p = params_of(R"({"type": "WarmupLR"})", &last);
    assert_true(p.type == LrScheduleType::WarmupLR);
    assert_int_equal(p.warmup_num_steps, 1000);
    assert_true(p.warmup_max_lr.empty());
    assert_true(dsm::optim::schedule_uses_base_lr(p));
    assert_int_equal(dsm::optim::schedule_groups(p), 1);
    assert_int_equal(last, -1);
    // WarmupDecayLR warms up to 0.001 unless told otherwise, and lists it.
    const Config decay = parse(kAdamW, R"({"type": "WarmupDecayLR", "params": {"total_num_steps": 20,
        "warmup_num_steps": 10}})");
    ALL_NEAR(decay.scheduler.schedule.warmup_max_lr, {0.001});
    NEAR(decay.scheduler.params["warmup_max_lr"].get<double>(), 0.001);
    assert_int_equal(*decay.scheduler.schedule.total_num_steps, 20);

    p = params_of(R"({"type": "OneCycle", "params": {
        "cycle_min_lr": [0.1, 0.2, 0.3], "cycle_max_lr": 1, "decay_lr_rate": 0.5,
        "cycle_first_step_size": 7, "cycle_second_step_size": 9, "cycle_first_stair_count": 2,
        "cycle_second_stair_count": 3, "decay_step_size": 4, "cycle_momentum": false,
        "cycle_min_mom": 0.5, "cycle_max_mom": [0.6, 0.7], "decay_mom_rate": 0.25,
        "last_batch_iteration": 12}})", &last);
    assert_true(p.type == LrScheduleType::OneCycle);
    ALL_NEAR(p.cycle_min_lr, {0.1, 0.2, 0.3});
    ALL_NEAR(p.cycle_max_lr, {1.0});
    NEAR(p.decay_lr_rate, 0.5);
    assert_int_equal(p.cycle_first_step_size, 7);
    assert_int_equal(*p.cycle_second_step_size, 9);
    assert_int_equal(p.cycle_first_stair_count, 2);
    assert_int_equal(*p.cycle_second_stair_count, 3);
    assert_int_equal(p.decay_step_size, 4);
    assert_false(p.cycle_momentum);
    ALL_NEAR(p.cycle_min_mom, {0.5});
    ALL_NEAR(p.cycle_max_mom, {0.6, 0.7});
    NEAR(p.decay_mom_rate, 0.25);
    assert_int_equal(dsm::optim::schedule_groups(p), 3);
    assert_false(dsm::optim::schedule_uses_base_lr(p));
    assert_int_equal(last, 12);
    // Null leaves an optional key unset.
    p = params_of(R"({"type": "OneCycle", "params": {"cycle_min_lr": 0.1, "cycle_max_lr": 1,
        "cycle_second_step_size": null}})");
    assert_false(p.cycle_second_step_size.has_value());

    p = params_of(R"({"type": "WarmupCosineLR", "params": {
        "total_num_steps": 50, "warmup_num_steps": 5, "warmup_type": "linear",
        "warmup_min_ratio": 0.2, "cos_min_ratio": 0.05}})");
    assert_int_equal(*p.total_num_steps, 50);
    assert_int_equal(p.warmup_num_steps, 5);
    assert_string_equal(p.warmup_type.c_str(), "linear");
    NEAR(p.warmup_min_ratio, 0.2);
    NEAR(p.cos_min_ratio, 0.05);
    assert_true(dsm::optim::schedule_uses_base_lr(p));

    p = params_of(R"({"type": "LRRangeTest", "params": {
        "lr_range_test_min_lr": [0.1, 0.2], "lr_range_test_step_size": 3,
        "lr_range_test_step_rate": 2.5, "lr_range_test_staircase": true}})");
    ALL_NEAR(p.lr_range_test_min_lr, {0.1, 0.2});
    assert_int_equal(p.lr_range_test_step_size, 3);
    NEAR(p.lr_range_test_step_rate, 2.5);
    assert_true(p.lr_range_test_staircase);
    assert_int_equal(dsm::optim::schedule_groups(p), 2);
}

static void test_wrong_types(void **) {
    // The reader names the key and the value.
    auto bad = [](const std::string &type, const std::string &params, const char *key, const char *value) {
        EXPECT_ERROR(parse(kAdamW, "{\"type\": \"" + type + "\", \"params\": " + params + "}"), DSM_ERR_CONFIG,
                     {key, value});
    };
    bad("WarmupLR", R"({"warmup_num_steps": "ten"})", "scheduler.params.warmup_num_steps", "\"ten\"");
    bad("WarmupDecayLR", R"({"total_num_steps": 10.5})", "scheduler.params.total_num_steps", "10.5");
    bad("WarmupLR", R"({"warmup_max_lr": [0.1, "x"]})", "scheduler.params.warmup_max_lr", "[0.1,\"x\"]");
    bad("WarmupLR", R"({"warmup_min_lr": []})", "scheduler.params.warmup_min_lr", "[]");
    bad("WarmupLR", R"({"warmup_type": 3})", "scheduler.params.warmup_type", "got 3");
    // Scalars that DeepSpeed does not take per group.
    bad("OneCycle", R"({"cycle_min_lr": 0.1, "cycle_max_lr": 1, "decay_lr_rate": [0.1]})",
        "scheduler.params.decay_lr_rate", "[0.1]");
    bad("WarmupCosineLR", R"({"total_num_steps": 10, "cos_min_ratio": "low"})", "scheduler.params.cos_min_ratio",
        "\"low\"");
    bad("OneCycle", R"({"cycle_min_lr": 0.1, "cycle_max_lr": 1, "cycle_momentum": 1})",
        "scheduler.params.cycle_momentum", "got 1");
    bad("OneCycle", R"({"cycle_min_lr": 0.1, "cycle_max_lr": 1, "cycle_second_step_size": "5"})",
        "scheduler.params.cycle_second_step_size", "\"5\"");
    bad("LRRangeTest", R"({"lr_range_test_staircase": "yes"})", "scheduler.params.lr_range_test_staircase",
        "\"yes\"");
    bad("LRRangeTest", "[1]", "scheduler.params", "[1]");
    bad("WarmupLR", R"({"last_batch_iteration": -3})", "scheduler.params.last_batch_iteration", "-3");
    bad("WarmupLR", R"({"last_batch_iteration": "a"})", "scheduler.params.last_batch_iteration", "\"a\"");
    bad("OneCycle", R"({"cycle_max_lr": 1})", "scheduler.params.cycle_min_lr", "required by OneCycle");
}

// --- Base lr and no scheduler ---------------------------------------------

static void test_base_lrs(void **) {
    auto base = dsm::config::base_lrs_from_config(parse(kAdamW, ""));
    ALL_NEAR(base, {0.3});
    base = dsm::config::base_lrs_from_config(parse(R"({"type": "SGD"})", ""));
    ALL_NEAR(base, {0.001});
    base = dsm::config::base_lrs_from_config(parse(R"({"type": "adagrad"})", ""));
    ALL_NEAR(base, {0.01});

    // No optimizer section: fine for schedules with their own lrs...
    const Config one_cycle = parse("", R"({"type": "OneCycle", "params": {"cycle_min_lr": 0.001,
        "cycle_max_lr": 0.01, "cycle_first_step_size": 10}})");
    base = dsm::config::base_lrs_from_config(one_cycle);
    assert_int_equal(base.size(), 1);
    auto s = dsm::config::schedule_from_config(one_cycle);
    assert_true(s.has_value());
    step_to(*s, 4);
    NEAR(s->lr()[0], 0.0055);
    // WarmupLR with warmup_max_lr given needs no optimizer...
    s = dsm::config::schedule_from_config(parse("", R"({"type": "WarmupLR", "params": {"warmup_max_lr": 0.002}})"));
    assert_true(s.has_value());
    step_to(*s, 999);
    NEAR(s->lr()[0], 0.002);
    // ...without it, it warms up to the optimizer's lr, which must exist.
    EXPECT_ERROR(dsm::config::base_lrs_from_config(parse("", R"({"type": "WarmupLR"})")), DSM_ERR_CONFIG,
                 {"WarmupLR", "no optimizer"});
    // ...an error for WarmupCosineLR, which scales the optimizer's lr.
    const Config cosine = parse("", R"({"type": "WarmupCosineLR", "params": {"total_num_steps": 10, "warmup_num_steps": 5}})");
    EXPECT_ERROR(dsm::config::base_lrs_from_config(cosine), DSM_ERR_CONFIG,
                 {"WarmupCosineLR", "no optimizer"});
    EXPECT_ERROR(dsm::config::schedule_from_config(cosine), DSM_ERR_CONFIG, {"WarmupCosineLR"});
    // ...and without any scheduler.
    EXPECT_ERROR(dsm::config::base_lrs_from_config(parse("", "")), DSM_ERR_CONFIG,
                 {"no optimizer", "no scheduler"});
}

static void test_no_scheduler(void **) {
    const Config c = parse(kAdamW, "");
    assert_false(dsm::config::schedule_from_config(c).has_value());
    const Json j = Json::parse(dsm::config::describe_lr(c, 3, true));
    assert_string_equal(j["scheduler"].get<std::string>().c_str(), "none");
    assert_int_equal(j["groups"].get<int>(), 1);
    assert_int_equal(j["steps"].size(), 4);
    for (const Json &e : j["steps"]) {
        ALL_NEAR(e["lr"].get<std::vector<double>>(), {0.3});
        assert_false(e.contains("momentum"));
    }
    const std::string text = dsm::config::describe_lr(c, 3, false);
    assert_non_null(std::strstr(text.c_str(), "no scheduler: constant lr"));
    EXPECT_ERROR(dsm::config::describe_lr(parse("", ""), 3, false), DSM_ERR_CONFIG, {"no optimizer"});
}

// --- describe_lr ----------------------------------------------------------

// Lines of `text` that start with a digit (the data lines).
static std::vector<std::string> data_lines(const std::string &text) {
    std::vector<std::string> out;
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line))
        if (!line.empty() && line[0] >= '0' && line[0] <= '9') out.push_back(line);
    return out;
}

static void test_describe_json(void **) {
    const Config c = parse(kAdamW, R"({"type": "OneCycle", "params": {"cycle_min_lr": [0.001, 0.002],
        "cycle_max_lr": [0.01, 0.02], "cycle_first_step_size": 10}})");
    const Json j = Json::parse(dsm::config::describe_lr(c, 25, true));
    assert_string_equal(j["format"].get<std::string>().c_str(), "dsm-lr");
    assert_int_equal(j["format_version"].get<int>(), 1);
    assert_string_equal(j["scheduler"].get<std::string>().c_str(), "OneCycle");
    assert_int_equal(j["groups"].get<int>(), 2);
    assert_int_equal(j["last_batch_iteration"].get<int>(), -1);
    assert_int_equal(j["params"]["cycle_first_step_size"].get<int>(), 10);
    const Json &steps = j["steps"];
    assert_int_equal(steps.size(), 26);
    for (size_t i = 0; i < steps.size(); ++i) assert_int_equal(steps[i]["step"].get<int64_t>(), i);
    // Step 0: the values set when the schedule is built; step N: after N step() calls.
    ALL_NEAR(steps[0]["lr"].get<std::vector<double>>(), {0.001, 0.002});
    ALL_NEAR(steps[0]["momentum"].get<std::vector<double>>(), {0.8, 0.8});
    ALL_NEAR(steps[1]["lr"].get<std::vector<double>>(), {0.0019, 0.0038});   // last_step 0
    ALL_NEAR(steps[10]["lr"].get<std::vector<double>>(), {0.01, 0.02});       // last_step 9: peak
    ALL_NEAR(steps[10]["momentum"].get<std::vector<double>>(), {0.8, 0.8});
    ALL_NEAR(steps[15]["lr"].get<std::vector<double>>(), {0.0055, 0.011});    // last_step 14
    ALL_NEAR(steps[15]["momentum"].get<std::vector<double>>(), {0.85, 0.85});

    // No momentum outside OneCycle with cycle_momentum; 0 steps gives one entry.
    const Config w = parse(kAdamW, R"({"type": "WarmupLR", "params": {"warmup_num_steps": 10,
        "warmup_type": "linear"}})");
    const Json k = Json::parse(dsm::config::describe_lr(w, 0, true));
    assert_int_equal(k["steps"].size(), 1);
    assert_false(k["steps"][0].contains("momentum"));
    const Json m = Json::parse(dsm::config::describe_lr(w, 6, true));
    assert_int_equal(m["steps"].size(), 7);
    NEAR(m["steps"][6]["lr"][0].get<double>(), 0.15); // last_step 5: half way to the optimizer lr 0.3
}

static void test_describe_text(void **) {
    const Config c = parse(kAdamW, R"({"type": "OneCycle", "params": {"cycle_min_lr": 0.001,
        "cycle_max_lr": 0.01, "cycle_first_step_size": 10}})");
    const std::string text = dsm::config::describe_lr(c, 20, false);
    assert_non_null(std::strstr(text.c_str(), "OneCycle"));
    assert_non_null(std::strstr(text.c_str(), "cycle_max_lr=0.01"));
    assert_non_null(std::strstr(text.c_str(), "before the first optimizer step"));
    const auto lines = data_lines(text);
    assert_int_equal(lines.size(), 21);
    assert_string_equal(lines[0].c_str(), "0  0.001  0.8");
    assert_string_equal(lines[5].c_str(), "5  0.0055  0.85");
    assert_string_equal(lines[10].c_str(), "10  0.01  0.8");

    for (const char *sched : {R"({"type": "WarmupLR"})",
                              R"({"type": "WarmupDecayLR", "params": {"total_num_steps": 2000}})",
                              R"({"type": "WarmupCosineLR", "params": {"total_num_steps": 2000}})",
                              R"({"type": "LRRangeTest"})"}) {
        const Config d = parse(kAdamW, sched);
        assert_int_equal(data_lines(dsm::config::describe_lr(d, 37, false)).size(), 38);
        assert_int_equal(Json::parse(dsm::config::describe_lr(d, 37, true))["steps"].size(), 38);
    }
    // Per-group columns.
    const Config g = parse(kAdamW, R"({"type": "LRRangeTest", "params": {"lr_range_test_min_lr": [1, 2],
        "lr_range_test_step_size": 1, "lr_range_test_step_rate": 1}})");
    const auto glines = data_lines(dsm::config::describe_lr(g, 2, false));
    assert_int_equal(glines.size(), 3);
    assert_string_equal(glines[2].c_str(), "2  3 6"); // last_step 1: 1 + 2
    assert_int_equal(data_lines(dsm::config::describe_lr(parse(kAdamW, ""), 4, false)).size(), 5);
}

static void test_describe_steps_range(void **) {
    const Config c = parse(kAdamW, R"({"type": "WarmupLR"})");
    EXPECT_ERROR(dsm::config::describe_lr(c, -1, false), DSM_ERR_INVALID_ARGUMENT, {"steps", "-1"});
    EXPECT_ERROR(dsm::config::describe_lr(c, 10000001, true), DSM_ERR_INVALID_ARGUMENT,
                 {"steps", "10000001"});
    EXPECT_ERROR(dsm::config::describe_lr(parse(kAdamW, ""), -5, true), DSM_ERR_INVALID_ARGUMENT,
                 {"steps", "-5"});
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_warmup_lr),
        cmocka_unit_test(test_warmup_decay_lr),
        cmocka_unit_test(test_warmup_cosine_lr),
        cmocka_unit_test(test_one_cycle),
        cmocka_unit_test(test_lr_range_test),
        cmocka_unit_test(test_last_batch_iteration),
        cmocka_unit_test(test_one_cycle_momentum_needs_betas),
        cmocka_unit_test(test_per_group),
        cmocka_unit_test(test_params_from_json),
        cmocka_unit_test(test_wrong_types),
        cmocka_unit_test(test_base_lrs),
        cmocka_unit_test(test_no_scheduler),
        cmocka_unit_test(test_describe_json),
        cmocka_unit_test(test_describe_text),
        cmocka_unit_test(test_describe_steps_range),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
