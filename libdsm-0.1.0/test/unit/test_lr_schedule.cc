// Learning-rate schedules: values at the boundaries of every phase, computed
// here from the closed-form formulas, and every validation error.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "optim/lr_schedule.hpp"

#include "cxx_test.h" // last: CMocka's fail() macro would break the C++ headers

using dsm::optim::LrSchedule;
using dsm::optim::LrScheduleParams;
using dsm::optim::LrScheduleType;


// Step until last_step() == target.
static void step_to(LrSchedule &s, int64_t target) {
    while (s.last_step() < target) s.step();
    assert_int_equal(s.last_step(), target);
}

// The lr of a single-group schedule at last_step() == t.
static double lr_at(LrSchedule &s, int64_t t) {
    step_to(s, t);
    return s.lr()[0];
}
// OneCycle's lr and momentum at last_step() == t.
#define CYCLE(s, t, lr, mom) (NEAR(lr_at((s), (t)), (lr)), NEAR((s).momentum()[0], (mom)))

// --- WarmupLR -------------------------------------------------------------

static void test_warmup_linear(void **) {
    LrScheduleParams p;
    p.warmup_min_lr = {0.0};
    p.warmup_max_lr = {0.001};
    p.warmup_num_steps = 10;
    p.warmup_type = "linear";
    auto s = LrSchedule::create(p, {0.5});
    assert_int_equal(s.last_step(), -1);
    NEAR(s.lr()[0], 0.0); // before any step(): warmup_min_lr
    assert_true(s.momentum().empty());
    NEAR(lr_at(s, 0), 0.0);
    NEAR(lr_at(s, 1), 0.0001);
    NEAR(lr_at(s, 5), 0.0005);
    NEAR(lr_at(s, 9), 0.0009);
    NEAR(lr_at(s, 10), 0.001); // end of warmup
    NEAR(lr_at(s, 11), 0.001);
    NEAR(lr_at(s, 100000), 0.001);
}

static void test_warmup_log(void **) {
    LrScheduleParams p; // warmup_type defaults to "log"
    p.warmup_min_lr = {0.0001};
    p.warmup_max_lr = {0.001};
    p.warmup_num_steps = 100;
    auto s = LrSchedule::create(p, {1.0});
    NEAR(s.lr()[0], 0.0001);
    NEAR(lr_at(s, 0), 0.0001);                  // log(1) = 0
    NEAR(lr_at(s, 9), 0.0001 + 0.0009 * 0.5);   // log(10) / log(100)
    NEAR(lr_at(s, 30), 0.0001 + 0.0009 * std::log(31.0) / std::log(100.0));
    NEAR(lr_at(s, 99), 0.001);                  // log(100) / log(100)
    NEAR(lr_at(s, 100), 0.001);
    NEAR(lr_at(s, 5000), 0.001);
}

static void test_warmup_defaults(void **) {
    // Defaults: min 0, max = each group's base lr, 1000 steps, log.
    LrScheduleParams p;
    auto s = LrSchedule::create(p, {0.01, 0.02});
    ALL_NEAR(s.lr(), {0.0, 0.0});
    step_to(s, 9);
    ALL_NEAR(s.lr(), {0.01 / 3.0, 0.02 / 3.0}); // log(10) / log(1000)
    step_to(s, 99);
    ALL_NEAR(s.lr(), {0.01 * 2.0 / 3.0, 0.02 * 2.0 / 3.0});
    step_to(s, 999);
    ALL_NEAR(s.lr(), {0.01, 0.02});
    step_to(s, 1000);
    ALL_NEAR(s.lr(), {0.01, 0.02});
}

static void test_warmup_one_step_acts_as_two(void **) {
    LrScheduleParams p;
    p.warmup_max_lr = {0.001};
    p.warmup_num_steps = 1;
    p.warmup_type = "linear";
    auto s = LrSchedule::create(p, {1.0});
    NEAR(lr_at(s, 0), 0.0);
    NEAR(lr_at(s, 1), 0.0005);
    NEAR(lr_at(s, 2), 0.001);
}

static void test_warmup_per_group(void **) {
    LrScheduleParams p;
    p.warmup_min_lr = {0.0, 0.001};
    p.warmup_max_lr = {0.01, 0.002};
    p.warmup_num_steps = 4;
    p.warmup_type = "linear";
    auto s = LrSchedule::create(p, {1.0, 1.0});
    assert_int_equal(s.num_groups(), 2);
    ALL_NEAR(s.lr(), {0.0, 0.001});
    step_to(s, 2);
    ALL_NEAR(s.lr(), {0.005, 0.0015});
    step_to(s, 4);
    ALL_NEAR(s.lr(), {0.01, 0.002});
    // A scalar min with a per-group max.
    p.warmup_min_lr = {0.0};
    s = LrSchedule::create(p, {1.0, 1.0});
    step_to(s, 1);
    ALL_NEAR(s.lr(), {0.0025, 0.0005});
}

// --- WarmupDecayLR --------------------------------------------------------

static void test_warmup_decay(void **) {
    LrScheduleParams p;
    p.type = LrScheduleType::WarmupDecayLR;
    p.warmup_num_steps = 10;
    p.warmup_type = "linear";
    p.total_num_steps = 110;
    auto s = LrSchedule::create(p, {0.5}); // max defaults to 0.001, not the base lr
    NEAR(s.lr()[0], 0.0);
    NEAR(lr_at(s, 5), 0.0005);
    NEAR(lr_at(s, 9), 0.0009);
    NEAR(lr_at(s, 10), 0.001);           // (110 - 10) / 100
    NEAR(lr_at(s, 11), 0.001 * 0.99);    // (110 - 11) / 100
    NEAR(lr_at(s, 60), 0.0005);          // mid-decay
    NEAR(lr_at(s, 109), 0.00001);
    NEAR(lr_at(s, 110), 0.0);            // total_num_steps
    NEAR(lr_at(s, 500), 0.0);            // clamped at 0

    p.warmup_min_lr = {0.0001};
    p.warmup_max_lr = {0.0011, 0.0021};
    p.warmup_type = "log";
    s = LrSchedule::create(p, {1.0, 1.0});
    step_to(s, 0);
    ALL_NEAR(s.lr(), {0.0001, 0.0001});
    step_to(s, 60);
    ALL_NEAR(s.lr(), {0.0006, 0.0011});
    step_to(s, 110);
    ALL_NEAR(s.lr(), {0.0001, 0.0001});
}

static void test_warmup_decay_no_decay_window(void **) {
    // total_num_steps == warmup_num_steps: the span is max(1, 0) = 1.
    LrScheduleParams p;
    p.type = LrScheduleType::WarmupDecayLR;
    p.warmup_num_steps = 10;
    p.warmup_type = "linear";
    p.total_num_steps = 10;
    auto s = LrSchedule::create(p, {1.0});
    NEAR(lr_at(s, 9), 0.0009);
    NEAR(lr_at(s, 10), 0.0);
    NEAR(lr_at(s, 11), 0.0);
}

// --- WarmupCosineLR -------------------------------------------------------

static void test_warmup_cosine(void **) {
    LrScheduleParams p;
    p.type = LrScheduleType::WarmupCosineLR;
    p.total_num_steps = 110;
    p.warmup_num_steps = 10;
    p.warmup_type = "linear";
    p.warmup_min_ratio = 0.1;
    p.cos_min_ratio = 0.01;
    auto s = LrSchedule::create(p, {0.1, 0.2});
    ALL_NEAR(s.lr(), {0.0, 0.0}); // 0 before the first step
    step_to(s, 0);
    ALL_NEAR(s.lr(), {0.01, 0.02});   // ratio 0.1
    step_to(s, 5);
    ALL_NEAR(s.lr(), {0.055, 0.11});  // 0.1 + 0.5 * 0.9
    step_to(s, 9);
    ALL_NEAR(s.lr(), {0.091, 0.182}); // 0.1 + 0.9 * 0.9: last warmup step
    step_to(s, 10);                   // end of warmup: cosine at 1/100
    const double r10 = 0.01 + 0.99 * (1.0 + std::cos(kPi * 0.01)) / 2.0;
    ALL_NEAR(s.lr(), {0.1 * r10, 0.2 * r10});
    step_to(s, 59);                   // half way: cos(pi / 2) = 0
    ALL_NEAR(s.lr(), {0.0505, 0.101});
    step_to(s, 84);                   // 3/4: (1 + cos(3 pi / 4)) / 2
    const double r84 = 0.01 + 0.99 * (1.0 - std::sqrt(0.5)) / 2.0;
    ALL_NEAR(s.lr(), {0.1 * r84, 0.2 * r84});
    step_to(s, 109);                  // progress 1: cos_min_ratio
    ALL_NEAR(s.lr(), {0.001, 0.002});
    step_to(s, 110);
    ALL_NEAR(s.lr(), {0.001, 0.002});
    step_to(s, 1000);                 // stays at the floor
    ALL_NEAR(s.lr(), {0.001, 0.002});
}

static void test_warmup_cosine_defaults(void **) {
    // warmup_min_ratio 0, 1000 log steps, cos_min_ratio 0.0001.
    LrScheduleParams p;
    p.type = LrScheduleType::WarmupCosineLR;
    p.total_num_steps = 2000;
    auto s = LrSchedule::create(p, {0.3});
    NEAR(lr_at(s, 0), 0.0);
    NEAR(lr_at(s, 9), 0.1);              // log(10) / log(1000)
    NEAR(lr_at(s, 999), 0.3);
    NEAR(lr_at(s, 1499), 0.3 * (0.0001 + 0.9999 * 0.5));
    NEAR(lr_at(s, 1999), 0.3 * 0.0001);
    NEAR(lr_at(s, 2000), 0.3 * 0.0001);
}

// --- OneCycle -------------------------------------------------------------

static LrScheduleParams one_cycle() {
    LrScheduleParams p;
    p.type = LrScheduleType::OneCycle;
    p.cycle_min_lr = {0.001};
    p.cycle_max_lr = {0.01};
    p.cycle_first_step_size = 10;
    return p;
}

static void test_one_cycle(void **) {
    auto s = LrSchedule::create(one_cycle(), {1.0});
    // Before any step(): cycle_min_lr and cycle_min_mom.
    NEAR(s.lr()[0], 0.001);
    NEAR(s.momentum()[0], 0.8);
    // First half: scale = (t + 1) / 10.
    CYCLE(s, 0, 0.0019, 0.89);
    CYCLE(s, 4, 0.0055, 0.85);
    CYCLE(s, 9, 0.01, 0.8); // peak
    // Second half: scale = (20 - t - 1) / 10.
    CYCLE(s, 10, 0.0091, 0.81);
    CYCLE(s, 14, 0.0055, 0.85);
    CYCLE(s, 19, 0.001, 0.9); // end of the cycle
    // After the cycle, no decay by default: cycle_min_lr and cycle_max_mom.
    CYCLE(s, 20, 0.001, 0.9);
    CYCLE(s, 5000, 0.001, 0.9);
}

static void test_one_cycle_decay(void **) {
    auto p = one_cycle();
    p.decay_step_size = 5;
    p.decay_lr_rate = 0.5;
    p.decay_mom_rate = 0.1;
    auto s = LrSchedule::create(p, {1.0});
    CYCLE(s, 19, 0.001, 0.9);
    // Decay interval (t - 20 + 1) / 5.
    CYCLE(s, 20, 0.001 / 1.1, 0.9 * 1.02);
    CYCLE(s, 29, 0.0005, 0.9 * 1.2);
    NEAR(lr_at(s, 119), 0.001 / 11.0);
    // A zero rate skips that decay even with a decay_step_size.
    p.decay_mom_rate = 0.0;
    s = LrSchedule::create(p, {1.0});
    CYCLE(s, 29, 0.0005, 0.9);
}

static void test_one_cycle_asymmetric(void **) {
    auto p = one_cycle();
    p.cycle_second_step_size = 30;
    auto s = LrSchedule::create(p, {1.0});
    NEAR(lr_at(s, 4), 0.0055);
    NEAR(lr_at(s, 9), 0.01);
    NEAR(lr_at(s, 24), 0.0055);  // (40 - 25) / 30
    NEAR(lr_at(s, 38), 0.0013);  // 1 / 30
    NEAR(lr_at(s, 39), 0.001);
    NEAR(lr_at(s, 40), 0.001);
    // A zero-length second half drops straight back to the minimum.
    p.cycle_second_step_size = 0;
    s = LrSchedule::create(p, {1.0});
    NEAR(lr_at(s, 8), 0.0091);
    NEAR(lr_at(s, 9), 0.001);
}

static void test_one_cycle_stairs(void **) {
    auto p = one_cycle();
    p.cycle_first_stair_count = 2; // the second half uses 2 as well
    auto s = LrSchedule::create(p, {1.0});
    // First half: floor((t + 1) * 2 / 10) / 2.
    NEAR(lr_at(s, 0), 0.001);
    NEAR(lr_at(s, 3), 0.001);
    CYCLE(s, 4, 0.0055, 0.85);
    NEAR(lr_at(s, 8), 0.0055);
    CYCLE(s, 9, 0.01, 0.8);
    // Second half: floor((20 - t - 1) * 2 / 10) / 2.
    NEAR(lr_at(s, 10), 0.0055);
    NEAR(lr_at(s, 14), 0.0055);
    CYCLE(s, 15, 0.001, 0.9);
    NEAR(lr_at(s, 19), 0.001);
    // A second stair count of 0 keeps the second half continuous.
    p.cycle_second_stair_count = 0;
    s = LrSchedule::create(p, {1.0});
    NEAR(lr_at(s, 8), 0.0055);
    NEAR(lr_at(s, 10), 0.0091);
    NEAR(lr_at(s, 15), 0.0046);
    // Asymmetric halves with stairs: the peak is reached exactly.
    p = one_cycle();
    p.cycle_first_step_size = 3;
    p.cycle_second_step_size = 7;
    p.cycle_first_stair_count = 3;
    p.cycle_second_stair_count = 7;
    s = LrSchedule::create(p, {1.0});
    NEAR(lr_at(s, 0), 0.004);
    NEAR(lr_at(s, 2), 0.01);
    NEAR(lr_at(s, 3), 0.001 + 0.009 * 6.0 / 7.0);
    NEAR(lr_at(s, 9), 0.001);
}

static void test_one_cycle_per_group_and_no_momentum(void **) {
    auto p = one_cycle();
    p.cycle_min_lr = {0.001, 0.002};
    p.cycle_max_lr = {0.01, 0.02};
    p.cycle_min_mom = {0.8, 0.85};
    p.cycle_max_mom = {0.9, 0.95};
    auto s = LrSchedule::create(p, {1.0, 1.0});
    ALL_NEAR(s.lr(), {0.001, 0.002});
    ALL_NEAR(s.momentum(), {0.8, 0.85});
    step_to(s, 14);
    ALL_NEAR(s.lr(), {0.0055, 0.011});
    ALL_NEAR(s.momentum(), {0.85, 0.9});
    // Scalar max with per-group min.
    p.cycle_max_lr = {0.01};
    s = LrSchedule::create(p, {1.0, 1.0});
    step_to(s, 9);
    ALL_NEAR(s.lr(), {0.01, 0.01});
    // Without momentum cycling the momentum lists are not read.
    p.cycle_momentum = false;
    p.cycle_min_mom = {0.1, 0.2, 0.3};
    s = LrSchedule::create(p, {1.0, 1.0});
    assert_true(s.momentum().empty());
    step_to(s, 4);
    assert_true(s.momentum().empty());
    ALL_NEAR(s.lr(), {0.0055, 0.006});
    assert_true(LrSchedule::kOneCycleBeta2 == 0.99);
}

// --- LRRangeTest ----------------------------------------------------------

static void test_range_test(void **) {
    LrScheduleParams p;
    p.type = LrScheduleType::LRRangeTest;
    p.lr_range_test_min_lr = {0.001};
    p.lr_range_test_step_size = 10;
    p.lr_range_test_step_rate = 0.5;
    auto s = LrSchedule::create(p, {1.0});
    NEAR(s.lr()[0], 0.001);
    NEAR(lr_at(s, 0), 0.00105); // 1 + 0.5 * 1 / 10
    NEAR(lr_at(s, 8), 0.00145);
    NEAR(lr_at(s, 9), 0.0015);
    NEAR(lr_at(s, 19), 0.002);
    NEAR(lr_at(s, 1999), 0.101);

    p.lr_range_test_staircase = true;
    s = LrSchedule::create(p, {1.0});
    NEAR(s.lr()[0], 0.001);
    NEAR(lr_at(s, 0), 0.001);
    NEAR(lr_at(s, 8), 0.001);
    NEAR(lr_at(s, 9), 0.0015);
    NEAR(lr_at(s, 18), 0.0015);
    NEAR(lr_at(s, 19), 0.002);

    // Per group, and the defaults (1e-3, 2000 steps, rate 1).
    p.lr_range_test_staircase = false;
    p.lr_range_test_min_lr = {0.001, 0.01};
    s = LrSchedule::create(p, {1.0, 1.0});
    step_to(s, 9);
    ALL_NEAR(s.lr(), {0.0015, 0.015});
    LrScheduleParams d;
    d.type = LrScheduleType::LRRangeTest;
    s = LrSchedule::create(d, {0.7});
    NEAR(s.lr()[0], 0.001);
    NEAR(lr_at(s, 999), 0.0015);
    NEAR(lr_at(s, 1999), 0.002);
}

// --- State, names ---------------------------------------------------------

static void test_checkpoint_restore(void **) {
    auto p = one_cycle();
    p.decay_step_size = 5;
    p.decay_lr_rate = 0.5;
    auto a = LrSchedule::create(p, {1.0});
    for (int i = 0; i < 37; ++i) a.step();
    assert_int_equal(a.last_step(), 36);
    auto b = LrSchedule::create(p, {1.0});
    b.set_last_step(a.last_step());
    for (int i = 0; i < 3; ++i) {
        assert_true(a.lr() == b.lr());
        assert_true(a.momentum() == b.momentum());
        a.step();
        b.step();
    }
    LrSchedule c = a; // a value: copies advance independently
    c.step();
    assert_int_equal(c.last_step(), a.last_step() + 1);
    b.set_last_step(-1);
    NEAR(b.lr()[0], 0.001);
    NEAR(b.momentum()[0], 0.8);
}

static void test_names(void **) {
    for (auto t : {LrScheduleType::WarmupLR, LrScheduleType::WarmupDecayLR,
                   LrScheduleType::WarmupCosineLR, LrScheduleType::OneCycle,
                   LrScheduleType::LRRangeTest}) {
        assert_true(dsm::optim::lr_schedule_type_from_name(dsm::optim::lr_schedule_name(t)) == t);
    }
    assert_string_equal(dsm::optim::lr_schedule_name(LrScheduleType::WarmupCosineLR),
                        "WarmupCosineLR");
}

// --- Validation -----------------------------------------------------------

#define EXPECT_CONFIG(p, groups, ...)                                                             \
    expect_error_at([&] { LrSchedule::create((p), std::vector<double>(groups, 0.1)); },         \
                    DSM_ERR_CONFIG, __VA_ARGS__, __LINE__)

static void test_warmup_errors(void **) {
    for (auto t : {LrScheduleType::WarmupLR, LrScheduleType::WarmupDecayLR,
                   LrScheduleType::WarmupCosineLR}) {
        LrScheduleParams p;
        p.type = t;
        p.total_num_steps = 5000;
        p.warmup_num_steps = 0;
        EXPECT_CONFIG(p, 1, {"scheduler.params.warmup_num_steps", "got 0"});
        p.warmup_num_steps = -5;
        EXPECT_CONFIG(p, 1, {"scheduler.params.warmup_num_steps", "got -5"});
        p.warmup_num_steps = 1000;
        p.warmup_type = "cosine";
        EXPECT_CONFIG(p, 1, {"scheduler.params.warmup_type", "\"cosine\""});
        p.warmup_type = "LINEAR";
        EXPECT_CONFIG(p, 1, {"scheduler.params.warmup_type", "\"LINEAR\""});
        p.warmup_type = "linear";
        if (t == LrScheduleType::WarmupLR) continue;
        p.total_num_steps.reset();
        EXPECT_CONFIG(p, 1, {"scheduler.params.total_num_steps", "got none"});
        p.total_num_steps = 500;
        EXPECT_CONFIG(p, 1, {"scheduler.params.total_num_steps", "(1000)", "got 500"});
        p.total_num_steps = -1;
        EXPECT_CONFIG(p, 1, {"scheduler.params.total_num_steps", "got -1"});
        // warmup_num_steps 1 acts as 2, so total_num_steps 1 is too short.
        p.warmup_num_steps = 1;
        p.total_num_steps = 1;
        EXPECT_CONFIG(p, 1, {"scheduler.params.total_num_steps", "(2)", "got 1"});
        p.total_num_steps = 2;
        LrSchedule::create(p, {0.1});
    }
    LrScheduleParams p;
    p.type = LrScheduleType::WarmupDecayLR;
    p.total_num_steps = 5000;
    p.warmup_min_lr = {0.0, 0.1};
    EXPECT_CONFIG(p, 3, {"scheduler.params.warmup_min_lr", "expected 1 or 3", "got 2"});
    p.warmup_min_lr = {0.0};
    p.warmup_max_lr = {0.1, 0.2, 0.3, 0.4};
    EXPECT_CONFIG(p, 3, {"scheduler.params.warmup_max_lr", "expected 1 or 3", "got 4"});
}

static void test_one_cycle_errors(void **) {
    auto p = one_cycle();
    p.cycle_min_lr.clear();
    EXPECT_CONFIG(p, 1, {"scheduler.params.cycle_min_lr", "got none"});
    p = one_cycle();
    p.cycle_max_lr.clear();
    EXPECT_CONFIG(p, 1, {"scheduler.params.cycle_max_lr", "got none"});
    p = one_cycle();
    p.cycle_first_step_size = 0;
    EXPECT_CONFIG(p, 1, {"scheduler.params.cycle_first_step_size", "got 0"});
    p.cycle_first_step_size = -3;
    EXPECT_CONFIG(p, 1, {"scheduler.params.cycle_first_step_size", "got -3"});
    p = one_cycle();
    p.cycle_second_step_size = -1;
    EXPECT_CONFIG(p, 1, {"scheduler.params.cycle_second_step_size", "got -1"});
    p = one_cycle();
    p.decay_step_size = -7;
    EXPECT_CONFIG(p, 1, {"scheduler.params.decay_step_size", "got -7"});
    p = one_cycle();
    p.cycle_min_lr = {0.001, 0.002};
    EXPECT_CONFIG(p, 3, {"scheduler.params.cycle_min_lr", "got 2"});
    p = one_cycle();
    p.cycle_max_lr = {0.01, 0.02};
    EXPECT_CONFIG(p, 3, {"scheduler.params.cycle_max_lr", "got 2"});
    p = one_cycle();
    p.cycle_min_mom = {0.8, 0.8};
    EXPECT_CONFIG(p, 3, {"scheduler.params.cycle_min_mom", "got 2"});
    p = one_cycle();
    p.cycle_max_mom = {0.9, 0.9, 0.9, 0.9};
    EXPECT_CONFIG(p, 3, {"scheduler.params.cycle_max_mom", "got 4"});
}

static void test_range_test_and_other_errors(void **) {
    LrScheduleParams p;
    p.type = LrScheduleType::LRRangeTest;
    p.lr_range_test_step_size = 0;
    EXPECT_CONFIG(p, 1, {"scheduler.params.lr_range_test_step_size", "got 0"});
    p.lr_range_test_step_size = -2;
    EXPECT_CONFIG(p, 1, {"scheduler.params.lr_range_test_step_size", "got -2"});
    p.lr_range_test_step_size = 10;
    p.lr_range_test_min_lr = {0.1, 0.2};
    EXPECT_CONFIG(p, 3, {"scheduler.params.lr_range_test_min_lr", "got 2"});

    expect_error_at([] { dsm::optim::lr_schedule_type_from_name("Cosine"); }, DSM_ERR_CONFIG,
                    {"scheduler.type", "\"Cosine\""}, __LINE__);
    expect_error_at([] { LrSchedule::create(LrScheduleParams{}, {}); },
                    DSM_ERR_INVALID_ARGUMENT, {"base_lrs", "got 0"}, __LINE__);
    auto s = LrSchedule::create(LrScheduleParams{}, {0.1});
    expect_error_at([&] { s.set_last_step(-2); }, DSM_ERR_INVALID_ARGUMENT,
                    {"last_step", "got -2"}, __LINE__);
    assert_int_equal(s.last_step(), -1);
}

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_warmup_linear),
        cmocka_unit_test(test_warmup_log),
        cmocka_unit_test(test_warmup_defaults),
        cmocka_unit_test(test_warmup_one_step_acts_as_two),
        cmocka_unit_test(test_warmup_per_group),
        cmocka_unit_test(test_warmup_decay),
        cmocka_unit_test(test_warmup_decay_no_decay_window),
        cmocka_unit_test(test_warmup_cosine),
        cmocka_unit_test(test_warmup_cosine_defaults),
        cmocka_unit_test(test_one_cycle),
        cmocka_unit_test(test_one_cycle_decay),
        cmocka_unit_test(test_one_cycle_asymmetric),
        cmocka_unit_test(test_one_cycle_stairs),
        cmocka_unit_test(test_one_cycle_per_group_and_no_momentum),
        cmocka_unit_test(test_range_test),
        cmocka_unit_test(test_checkpoint_restore),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_warmup_errors),
        cmocka_unit_test(test_one_cycle_errors),
        cmocka_unit_test(test_range_test_and_other_errors),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
