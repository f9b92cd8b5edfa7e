// Loss scaling: the sequences of DeepSpeed's DynamicLossScaler.update_scale
// (deepspeed/runtime/fp16/loss_scaler.py, with the stable_interval growth
// rule) traced by hand, the static scaler,
// the mapping from the fp16 configuration section, and checkpoint state.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "amp/loss_scaler.hpp"
#include "config/config.hpp"
#include "config/settings.hpp"
#include "core/error.hpp"

#include "cxx_test.h" // last: CMocka's fail() macro would break the C++ headers

using dsm::amp::LossScaler;
using dsm::amp::LossScalerConfig;
using dsm::amp::LossScalerState;

static LossScalerConfig dynamic_cfg(double init, int64_t window, int64_t hysteresis, bool consecutive = false,
                                    double min_scale = 1.0) {
    LossScalerConfig c;
    c.dynamic = true;
    c.init_scale = init;
    c.window = window;
    c.hysteresis = hysteresis;
    c.consecutive_hysteresis = consecutive;
    c.min_scale = min_scale;
    return c;
}

// One update and the state after it.
#define STEP(s, overflow, scale, hyst, iter, last)                                                               \
    do {                                                                                                         \
        (s).update(overflow);                                                                                    \
        expect_state_at((s), (scale), (hyst), (iter), (last), __LINE__);                                         \
    } while (0)

static void expect_state_at(const LossScaler &s, double scale, int64_t hyst, int64_t iter, int64_t last, int line) {
    const LossScalerState &st = s.state();
    if (st.cur_scale != scale || st.cur_hysteresis != hyst || st.cur_iter != iter || st.last_overflow_iter != last)
        fail_msg("line %d: state (scale %g, hysteresis %lld, iter %lld, last overflow %lld), expected (%g, %lld, "
                 "%lld, %lld)",
                 line, st.cur_scale, (long long)st.cur_hysteresis, (long long)st.cur_iter,
                 (long long)st.last_overflow_iter, scale, (long long)hyst, (long long)iter, (long long)last);
    if (s.scale() != scale) fail_msg("line %d: scale() %g, expected %g", line, s.scale(), scale);
}

// update() n times with the same verdict.
static void repeat(LossScaler &s, bool overflow, int n) {
    for (int i = 0; i < n; ++i) s.update(overflow);
}

// --- growth ------------------------------------------------------------------

static void test_growth_after_window(void **) {
    LossScaler s(dynamic_cfg(1024, 4, 2));
    assert_true(s.dynamic());
    expect_state_at(s, 1024, 2, 0, -1, __LINE__);
    // stable_interval = cur_iter - last_overflow_iter - 1 clean steps came
    // before; growth when it is a positive multiple of the window: at
    // cur_iter 4 (the 5th clean step), then every 4 steps (cur_iter 8, ...).
    STEP(s, false, 1024, 2, 1, -1);
    STEP(s, false, 1024, 2, 2, -1);
    STEP(s, false, 1024, 2, 3, -1);
    STEP(s, false, 1024, 2, 4, -1);
    STEP(s, false, 2048, 2, 5, -1);
    repeat(s, false, 3);
    expect_state_at(s, 2048, 2, 8, -1, __LINE__);
    STEP(s, false, 4096, 2, 9, -1);
    // After an overflow (here at iteration 2) the count starts again from it.
    LossScaler h(dynamic_cfg(1024, 4, 1));
    repeat(h, false, 2);
    STEP(h, true, 512, 1, 3, 2);
    STEP(h, false, 512, 1, 4, 2);
    STEP(h, false, 512, 1, 5, 2);
    STEP(h, false, 512, 1, 6, 2);
    STEP(h, false, 512, 1, 7, 2);
    STEP(h, false, 1024, 1, 8, 2); // cur_iter 7: 7 - 2 - 1 = 4 clean steps before it
}

static void test_window_one(void **) {
    LossScaler s(dynamic_cfg(2, 1, 1));
    STEP(s, false, 2, 1, 1, -1); // stable_interval 0: no growth
    STEP(s, false, 4, 1, 2, -1);
    STEP(s, false, 8, 1, 3, -1);
    STEP(s, true, 4, 1, 4, 3);
    STEP(s, false, 4, 1, 5, 3);
    STEP(s, false, 8, 1, 6, 3);
}

// The sequences DeepSpeed's own tests assert
// (tests/unit/runtime/half_precision/test_dynamic_loss_scale.py).
static void test_deepspeed_sequences(void **) {
    // test_no_overflow: power 8, window 2; the scale seen after step i + 1
    // doubles once cur_iter has passed a multiple of the window.
    LossScaler s(dynamic_cfg(256, 2, 2));
    double expected = 256;
    for (int i = 0; i < 10; ++i) {
        s.update(false);
        assert_true(s.scale() == expected);
        assert_int_equal(s.state().cur_iter, i + 1);
        if (s.state().cur_iter % 2 == 0) expected *= 2;
    }
    // test_some_overflow: hysteresis 1; two overflows halve twice, window + 1
    // clean steps grow once, one more overflow halves.
    LossScaler o(dynamic_cfg(256, 2, 1));
    repeat(o, true, 2);
    expect_state_at(o, 64, 1, 2, 1, __LINE__);
    repeat(o, false, 3);
    expect_state_at(o, 128, 1, 5, 1, __LINE__);
    STEP(o, true, 64, 1, 6, 5);
    // test_all_overflow (unfused): power 4, min 2, hysteresis 1. That test
    // drives the ZeRO-0 optimizer, which keeps skipping at the minimum;
    // DynamicLossScaler (ZeRO 1-3) raises there, and so does libdsm.
    LossScaler a(dynamic_cfg(16, 2, 1, false, 2));
    STEP(a, true, 8, 1, 1, 0);
    STEP(a, true, 4, 1, 2, 1);
    STEP(a, true, 2, 1, 3, 2);
    expect_error_at([&] { a.update(true); }, DSM_ERR_NUMERIC, {"minimum loss scale 2"}, __LINE__);
}

// --- hysteresis ----------------------------------------------------------------

static void test_hysteresis_refilled_only_at_growth(void **) {
    LossScaler s(dynamic_cfg(1024, 4, 2));
    STEP(s, true, 1024, 1, 1, 0);  // first overflow: hysteresis 2 -> 1, scale kept
    STEP(s, true, 512, 1, 2, 1);   // second: halve
    STEP(s, false, 512, 1, 3, 1);  // a clean step does not refill the hysteresis...
    STEP(s, true, 256, 1, 4, 3);   // ...so the next overflow halves at once
    repeat(s, false, 4);
    expect_state_at(s, 256, 1, 8, 3, __LINE__);
    STEP(s, false, 512, 2, 9, 3);  // growth refills it
    STEP(s, true, 512, 1, 10, 9);  // tolerated again
    STEP(s, true, 256, 1, 11, 10);
}

static void test_consecutive_hysteresis(void **) {
    LossScaler s(dynamic_cfg(1024, 4, 2, true));
    STEP(s, true, 1024, 1, 1, 0);
    STEP(s, false, 1024, 2, 2, 0); // refilled after every clean step
    STEP(s, true, 1024, 1, 3, 2);
    STEP(s, false, 1024, 2, 4, 2);
    STEP(s, true, 1024, 1, 5, 4);
    STEP(s, true, 512, 1, 6, 5);   // two in a row: halve
    STEP(s, true, 256, 1, 7, 6);   // and again while overflows continue
    STEP(s, false, 256, 2, 8, 6);
    repeat(s, false, 3);
    expect_state_at(s, 256, 2, 11, 6, __LINE__);
    STEP(s, false, 512, 2, 12, 6); // cur_iter 11: 11 - 6 - 1 = 4
}

static void test_hysteresis_three(void **) {
    LossScaler s(dynamic_cfg(64, 100, 3));
    STEP(s, true, 64, 2, 1, 0);
    STEP(s, true, 64, 1, 2, 1);
    STEP(s, true, 32, 1, 3, 2);
    STEP(s, true, 16, 1, 4, 3);
}

// --- minimum scale -------------------------------------------------------------

static void test_min_scale_floor(void **) {
    LossScalerConfig c = dynamic_cfg(8, 1000, 1, false, 3);
    c.raise_error_at_min_scale = false;
    LossScaler s(c);
    STEP(s, true, 4, 1, 1, 0);
    STEP(s, true, 3, 1, 2, 1); // max(4 / 2, 3)
    STEP(s, true, 3, 1, 3, 2); // at the minimum: stays, no error
    STEP(s, true, 3, 1, 4, 3);
}

static void test_error_at_min_scale(void **) {
    LossScaler s(dynamic_cfg(4, 1000, 1, false, 1));
    STEP(s, true, 2, 1, 1, 0);
    STEP(s, true, 1, 1, 2, 1);
    STEP(s, false, 1, 1, 3, 1);
    expect_error_at([&] { s.update(true); }, DSM_ERR_NUMERIC, {"minimum loss scale 1", "iteration 3"}, __LINE__);
    expect_state_at(s, 1, 1, 3, 1, __LINE__); // nothing changed
    expect_error_at([&] { s.update(true); }, DSM_ERR_NUMERIC, {"1"}, __LINE__);
    STEP(s, false, 1, 1, 4, 1); // a clean step still works

    // With hysteresis the tolerated overflows come first.
    LossScaler h(dynamic_cfg(0.5, 1000, 2, false, 0.5));
    STEP(h, true, 0.5, 1, 1, 0);
    expect_error_at([&] { h.update(true); }, DSM_ERR_NUMERIC, {"0.5"}, __LINE__);
    expect_state_at(h, 0.5, 1, 1, 0, __LINE__);
}

// --- static scaler ---------------------------------------------------------------

static void test_static_scaler(void **) {
    LossScalerConfig c;
    c.dynamic = false;
    c.static_scale = 128;
    LossScaler s(c);
    assert_false(s.dynamic());
    expect_state_at(s, 128, 1, 0, -1, __LINE__);
    STEP(s, true, 128, 1, 1, -1);
    STEP(s, false, 128, 1, 2, -1);
    repeat(s, true, 5000);
    expect_state_at(s, 128, 1, 5002, -1, __LINE__);
}

// --- configuration ----------------------------------------------------------------

static void test_config_mapping(void **) {
    dsm::config::Config cfg;
    LossScalerConfig c = dsm::config::loss_scaler_config(cfg); // fp16 off: static 1
    assert_false(c.dynamic);
    assert_true(c.static_scale == 1.0);
    cfg.bf16.enabled = true;
    c = dsm::config::loss_scaler_config(cfg);
    assert_false(c.dynamic);
    assert_true(c.static_scale == 1.0);
    cfg.bf16.enabled = false;

    cfg.fp16.enabled = true; // DeepSpeed's defaults
    c = dsm::config::loss_scaler_config(cfg);
    assert_true(c.dynamic);
    assert_true(c.init_scale == 65536.0);
    assert_true(c.scale_factor == 2.0);
    assert_int_equal(c.window, 1000);
    assert_int_equal(c.hysteresis, 2);
    assert_false(c.consecutive_hysteresis);
    assert_true(c.min_scale == 1.0);
    assert_true(c.raise_error_at_min_scale);
    assert_true(LossScaler(c).scale() == 65536.0);

    cfg.fp16.initial_scale_power = 0;
    cfg.fp16.loss_scale_window = 7;
    cfg.fp16.hysteresis = 5;
    cfg.fp16.consecutive_hysteresis = true;
    cfg.fp16.min_loss_scale = 0.25;
    c = dsm::config::loss_scaler_config(cfg);
    assert_true(c.init_scale == 1.0);
    assert_int_equal(c.window, 7);
    assert_int_equal(c.hysteresis, 5);
    assert_true(c.consecutive_hysteresis);
    assert_true(c.min_scale == 0.25);
    cfg.fp16.initial_scale_power = 127;
    assert_true(dsm::config::loss_scaler_config(cfg).init_scale == std::ldexp(1.0, 127));

    cfg.fp16.loss_scale = 128; // > 0: static
    c = dsm::config::loss_scaler_config(cfg);
    assert_false(c.dynamic);
    assert_true(c.static_scale == 128.0);
    assert_true(LossScaler(c).scale() == 128.0);
}

static void test_config_from_json(void **) {
    dsm::config::ConfigContext ctx;
    const auto cfg = dsm::config::parse_config(
        R"({"train_batch_size": 4, "fp16": {"enabled": true, "initial_scale_power": 16, "hysteresis": 3,
            "loss_scale_window": 50, "min_loss_scale": 2}})",
        ctx);
    LossScaler s(dsm::config::loss_scaler_config(cfg));
    assert_true(s.dynamic());
    expect_state_at(s, 65536, 3, 0, -1, __LINE__);
    assert_int_equal(s.config().window, 50);
    assert_true(s.config().min_scale == 2.0);
    const auto st = dsm::config::parse_config(R"({"train_batch_size": 4, "fp16": {"enabled": true, "loss_scale": 512}})", ctx);
    assert_true(LossScaler(dsm::config::loss_scaler_config(st)).scale() == 512.0);
}

static void test_bad_config(void **) {
    auto bad = [](LossScalerConfig c, std::vector<std::string> parts, int line) {
        expect_error_at([&] { LossScaler s(c); }, DSM_ERR_INVALID_ARGUMENT, parts, line);
    };
    const double nan = std::numeric_limits<double>::quiet_NaN();
    const double inf = std::numeric_limits<double>::infinity();
    LossScalerConfig c = dynamic_cfg(1024, 10, 2);
    c.window = 0;
    bad(c, {"window", "got 0"}, __LINE__);
    c = dynamic_cfg(1024, 10, 0);
    bad(c, {"hysteresis", "got 0"}, __LINE__);
    bad(dynamic_cfg(0, 10, 2), {"init_scale", "got 0"}, __LINE__);
    bad(dynamic_cfg(inf, 10, 2), {"init_scale", "got inf"}, __LINE__);
    bad(dynamic_cfg(1024, 10, 2, false, -1), {"min_scale", "got -1"}, __LINE__);
    bad(dynamic_cfg(1024, 10, 2, false, nan), {"min_scale", "got nan"}, __LINE__);
    c = dynamic_cfg(1024, 10, 2);
    c.scale_factor = 1.0;
    bad(c, {"scale_factor", "got 1"}, __LINE__);
    c = LossScalerConfig();
    c.dynamic = false;
    c.static_scale = -2;
    bad(c, {"static_scale", "got -2"}, __LINE__);
}

// --- checkpoint state ----------------------------------------------------------------

static void test_state_round_trip(void **) {
    const LossScalerConfig c = dynamic_cfg(1 << 20, 5, 2);
    const std::vector<bool> trace = {false, true, false, false, true, true, false, false, false,
                                     false, false, false, true, false, false, false, false, false};
    LossScaler a(c);
    for (size_t i = 0; i < 9; ++i) a.update(trace[i]);
    LossScaler b(c);
    b.set_state(a.state());
    for (size_t i = 9; i < trace.size(); ++i) {
        a.update(trace[i]);
        b.update(trace[i]);
        const LossScalerState &x = a.state(), &y = b.state();
        assert_true(x.cur_scale == y.cur_scale);
        assert_int_equal(x.cur_iter, y.cur_iter);
        assert_int_equal(x.last_overflow_iter, y.last_overflow_iter);
        assert_int_equal(x.cur_hysteresis, y.cur_hysteresis);
    }
    LossScalerState s;
    s.cur_scale = 0.125;
    s.cur_iter = 12;
    s.last_overflow_iter = 11;
    s.cur_hysteresis = 4;
    b.set_state(s);
    expect_state_at(b, 0.125, 4, 12, 11, __LINE__);
}

static void test_bad_state(void **) {
    LossScaler s(dynamic_cfg(1024, 10, 2));
    repeat(s, false, 3);
    auto bad = [&](LossScalerState st, std::vector<std::string> parts, int line) {
        expect_error_at([&] { s.set_state(st); }, DSM_ERR_INVALID_ARGUMENT, parts, line);
        expect_state_at(s, 1024, 2, 3, -1, line); // unchanged
    };
    LossScalerState ok;
    ok.cur_scale = 8;
    ok.cur_iter = 10;
    ok.last_overflow_iter = 4;
    ok.cur_hysteresis = 1;
    LossScalerState st = ok;
    st.cur_scale = 0;
    bad(st, {"cur_scale", "got 0"}, __LINE__);
    st.cur_scale = -4;
    bad(st, {"cur_scale", "got -4"}, __LINE__);
    st.cur_scale = std::numeric_limits<double>::infinity();
    bad(st, {"cur_scale", "got inf"}, __LINE__);
    st.cur_scale = std::numeric_limits<double>::quiet_NaN();
    bad(st, {"cur_scale", "got nan"}, __LINE__);
    st = ok;
    st.cur_iter = -1;
    st.last_overflow_iter = -1;
    bad(st, {"cur_iter", "got -1"}, __LINE__);
    st = ok;
    st.last_overflow_iter = -2;
    bad(st, {"last_overflow_iter", "got -2"}, __LINE__);
    st.last_overflow_iter = 10;
    bad(st, {"last_overflow_iter", "[-1, 9]", "got 10"}, __LINE__);
    st = ok;
    st.cur_hysteresis = 0;
    bad(st, {"cur_hysteresis", "got 0"}, __LINE__);
}

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_growth_after_window),
        cmocka_unit_test(test_window_one),
        cmocka_unit_test(test_deepspeed_sequences),
        cmocka_unit_test(test_hysteresis_refilled_only_at_growth),
        cmocka_unit_test(test_consecutive_hysteresis),
        cmocka_unit_test(test_hysteresis_three),
        cmocka_unit_test(test_min_scale_floor),
        cmocka_unit_test(test_error_at_min_scale),
        cmocka_unit_test(test_static_scaler),
        cmocka_unit_test(test_config_mapping),
        cmocka_unit_test(test_config_from_json),
        cmocka_unit_test(test_bad_config),
        cmocka_unit_test(test_state_round_trip),
        cmocka_unit_test(test_bad_state),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
