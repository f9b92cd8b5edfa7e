/*
 * fp32 steps with non-finite (Inf or NaN) gradients, as the configuration's
 * fp32_nonfinite_gradients says (a libdsm extension): "skip" skips the step on
 * every rank (reported in the step info, the weights unchanged), "fail" fails
 * it on every rank with DSM_ERR_NUMERIC naming the step and the first
 * parameter, "warn" (the default) says it once in the log and applies the
 * step. One rank's bad gradient decides for all of them, at every ZeRO stage.
 * The log reads its environment once per process, so this program sets it
 * before its first libdsm call.
 */
#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include "mpi_test.h"
#include "engine_memory.h"

#define NP 3
static const int64_t shape_a[2] = {5, 3}, shape_b[1] = {17}, shape_c[1] = {40};
static const size_t numel[NP] = {15, 17, 40};
#define TOTAL 72
static float init[TOTAL];
static char log_prefix[256];

static void params(dsm_param_desc_t d[NP]) {
    static const char *names[NP] = {"a", "b", "c"};
    const int64_t *shapes[NP] = {shape_a, shape_b, shape_c};
    const int ndims[NP] = {2, 1, 1};
    size_t off = 0;
    for (int i = 0; i < NP; ++i) {
        memset(&d[i], 0, sizeof d[i]);
        d[i].name = names[i];
        d[i].ndims = ndims[i];
        d[i].shape = shapes[i];
        d[i].dtype = DSM_FLOAT32;
        d[i].trainable = 1;
        d[i].init_values = init + off;
        off += numel[i];
    }
}

/* An engine at ZeRO `stage` with `extra` keys (", \"key\": value" or ""). */
static dsm_engine_t engine(int stage, const char *extra) {
    char cfg[1024];
    snprintf(cfg, sizeof cfg,
             "{\"train_micro_batch_size_per_gpu\": 1, \"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": 0.1}},"
             " \"zero_optimization\": {\"stage\": %d, \"reduce_bucket_size\": 20,"
             " \"stage3_param_persistence_threshold\": 16}%s}",
             stage, extra);
    dsm_param_desc_t d[NP];
    params(d);
    dsm_engine_t e = NULL;
    ASSERT_OK(dsm_engine_init_comm(MPI_COMM_WORLD, cfg, d, NP, &e));
    return e;
}

/* Every rank adds finite gradients; rank `bad_rank[k]` puts `bad_value[k]` into
   parameter `bad_param[k]` (k < nbad). */
static void gradients(dsm_engine_t e, int nbad, const int *bad_rank, const int *bad_param,
                      const float *bad_value) {
    for (int i = 0; i < NP; ++i) {
        float g32[40];
        for (size_t j = 0; j < numel[i]; ++j) g32[j] = 0.01f * (float)(i + 1) + 0.001f * (float)j;
        for (int k = 0; k < nbad; ++k)
            if (bad_rank[k] == test_rank && bad_param[k] == i) g32[numel[i] / 2] = bad_value[k];
        void *g;
        ASSERT_OK(dsm_engine_grad_acquire(e, i, &g));
        engine_write_f32(e, g, g32, numel[i]);
        ASSERT_OK(dsm_engine_grad_release(e, i));
    }
}

/* One bad element (NaN) in parameter 'b' on the last rank. */
static void nan_in_b(dsm_engine_t e) {
    const int r = test_size - 1, p = 1;
    const float v = NAN;
    gradients(e, 1, &r, &p, &v);
}

static void good(dsm_engine_t e) { gradients(e, 0, NULL, NULL, NULL); }

static void snapshot(dsm_engine_t e, float out[TOTAL]) {
    size_t off = 0;
    for (int i = 0; i < NP; ++i) {
        const void *v;
        ASSERT_OK(dsm_engine_param_acquire(e, i, &v));
        engine_copy(e, out + off, v, numel[i] * sizeof(float));
        ASSERT_OK(dsm_engine_param_release(e, i));
        off += numel[i];
    }
}

static int all_finite(const float *x, size_t n) {
    for (size_t i = 0; i < n; ++i)
        if (!isfinite(x[i])) return 0;
    return 1;
}

/* How often `text` is in rank 0's log (every rank gets the count). */
static int log_count(const char *text) {
    fflush(NULL);
    MPI_Barrier(MPI_COMM_WORLD);
    int count = 0;
    if (test_rank == 0) {
        char path[300];
        snprintf(path, sizeof path, "%s.0", log_prefix);
        FILE *f = fopen(path, "r");
        if (f != NULL) {
            static char buf[1 << 20];
            size_t n = fread(buf, 1, sizeof buf - 1, f);
            buf[n] = '\0';
            fclose(f);
            for (const char *p = strstr(buf, text); p != NULL; p = strstr(p + 1, text)) ++count;
        }
    }
    MPI_Bcast(&count, 1, MPI_INT, 0, MPI_COMM_WORLD);
    return count;
}

/* "skip": the bad step is skipped everywhere and said in the step info; the
   weights stay as they were; the next good step applies. */
static void test_skip(void **state) {
    (void)state;
    for (int stage = 0; stage <= 3; ++stage) {
        dsm_engine_t e = engine(stage, ", \"fp32_nonfinite_gradients\": \"skip\"");
        dsm_step_info_t info = DSM_STEP_INFO_INITIALIZER;
        float w1[TOTAL], w2[TOTAL], w3[TOTAL];
        good(e);
        ASSERT_OK(dsm_step(e, &info));
        assert_int_equal(info.skipped, 0);
        snapshot(e, w1);
        nan_in_b(e);
        ASSERT_OK(dsm_step(e, &info));
        assert_int_equal(info.boundary, 1);
        assert_int_equal(info.skipped, 1);
        assert_int_equal(info.skipped_steps, 1);
        assert_int_equal(info.global_steps, 2);
        assert_true(isinf(info.grad_norm));
        snapshot(e, w2);
        assert_memory_equal(w1, w2, sizeof w1);
        good(e);
        ASSERT_OK(dsm_step(e, &info));
        assert_int_equal(info.skipped, 0);
        assert_int_equal(info.skipped_steps, 1);
        assert_true(isfinite(info.grad_norm));
        snapshot(e, w3);
        assert_true(all_finite(w3, TOTAL));
        assert_true(memcmp(w1, w3, sizeof w1) != 0);
        ASSERT_OK(dsm_engine_free(&e));
    }
    /* Gradient accumulation: a bad micro-step skips the window's step. */
    dsm_engine_t e = engine(2, ", \"fp32_nonfinite_gradients\": \"skip\", \"gradient_accumulation_steps\": 2");
    dsm_step_info_t info = DSM_STEP_INFO_INITIALIZER;
    float w0[TOTAL], w1[TOTAL];
    snapshot(e, w0);
    nan_in_b(e);
    ASSERT_OK(dsm_step(e, &info));
    assert_int_equal(info.boundary, 0);
    good(e);
    ASSERT_OK(dsm_step(e, &info));
    assert_int_equal(info.boundary, 1);
    assert_int_equal(info.skipped, 1);
    snapshot(e, w1);
    assert_memory_equal(w0, w1, sizeof w0);
    ASSERT_OK(dsm_engine_free(&e));
    assert_true(log_count("non-finite fp32 gradients (first in parameter 'b'), skipped") >= 5);
}

/* "fail": DSM_ERR_NUMERIC on every rank, naming the step and the first
   parameter with a bad element on any rank; then the engine can only be
   freed (locally), and a new one works. */
static void test_fail(void **state) {
    (void)state;
    for (int stage = 0; stage <= 3; ++stage) {
        dsm_engine_t e = engine(stage, ", \"fp32_nonfinite_gradients\": \"fail\"");
        good(e);
        ASSERT_OK(dsm_step(e, NULL));
        /* rank 0: NaN in 'c'; the last rank: Inf in 'b' (rank 0 has both on one rank) */
        const int ranks[2] = {0, test_size - 1}, which[2] = {2, 1};
        const float values[2] = {NAN, -INFINITY};
        gradients(e, 2, ranks, which, values);
        ASSERT_FAILS(dsm_step(e, NULL), DSM_ERR_NUMERIC,
                     "step 2: non-finite (Inf or NaN) fp32 gradients (first in parameter 'b'); "
                     "fp32_nonfinite_gradients is \"fail\"");
        ASSERT_FAILS(dsm_step(e, NULL), DSM_ERR_STATE, "can only be freed");
        ASSERT_OK(dsm_engine_free(&e));
        assert_null(e);
        e = engine(stage, ", \"fp32_nonfinite_gradients\": \"fail\"");
        good(e);
        ASSERT_OK(dsm_step(e, NULL));
        ASSERT_OK(dsm_engine_free(&e));
    }
}

/* "warn", and the default: the step is applied as before (the NaN reaches
   the weights), and rank 0's log says it once per engine. */
static void test_warn(void **state) {
    (void)state;
    const char *warn = "dsm WARN ENGINE step 2: non-finite (Inf or NaN) fp32 gradients (first in parameter 'b'); "
                       "the step is applied";
    const int before = log_count(warn);
    for (int k = 0; k < 2; ++k) {
        for (int stage = 0; stage <= 3; ++stage) {
            dsm_engine_t e = engine(stage, k == 0 ? "" : ", \"fp32_nonfinite_gradients\": \"Warn\"");
            dsm_step_info_t info = DSM_STEP_INFO_INITIALIZER;
            good(e);
            ASSERT_OK(dsm_step(e, &info));
            nan_in_b(e);
            ASSERT_OK(dsm_step(e, &info));
            assert_int_equal(info.skipped, 0);
            assert_int_equal(info.skipped_steps, 0);
            assert_true(isinf(info.grad_norm));
            float w[TOTAL];
            snapshot(e, w);
            assert_false(all_finite(w + numel[0], numel[1])); /* 'b' */
            nan_in_b(e);
            ASSERT_OK(dsm_step(e, &info));
            assert_int_equal(info.skipped, 0);
            ASSERT_OK(dsm_engine_free(&e));
            assert_int_equal(log_count(warn), before + 4 * k + stage + 1);
        }
    }
    assert_int_equal(log_count("non-finite (Inf or NaN) fp32 gradients (first in parameter 'b'); the step"),
                     before + 8);
}

/* The key is about fp32: bf16 with check_grad_overflow false applies the
   step as DeepSpeed does, whatever fp32_nonfinite_gradients says. */
static void test_bf16_unaffected(void **state) {
    (void)state;
    dsm_engine_t e = engine(1, ", \"fp32_nonfinite_gradients\": \"fail\", \"bf16\": {\"enabled\": true, "
                               "\"check_grad_overflow\": false}");
    dsm_step_info_t info = DSM_STEP_INFO_INITIALIZER;
    nan_in_b(e);
    ASSERT_OK(dsm_step(e, &info));
    assert_int_equal(info.skipped, 0);
    ASSERT_OK(dsm_engine_free(&e));
}

/* bf16 checks its gradients by default (DeepSpeed's check_grad_overflow
   default, true): one rank's NaN skips the step on every rank. */
static void test_bf16_checks_by_default(void **state) {
    (void)state;
    dsm_engine_t e = engine(1, ", \"bf16\": {\"enabled\": true}");
    dsm_step_info_t info = DSM_STEP_INFO_INITIALIZER;
    nan_in_b(e);
    ASSERT_OK(dsm_step(e, &info));
    assert_int_equal(info.skipped, 1);
    ASSERT_OK(dsm_engine_free(&e));
}

/* A bad value fails dsm_engine_init on every rank, naming it. */
static void test_bad_value(void **state) {
    (void)state;
    dsm_param_desc_t d[NP];
    params(d);
    dsm_engine_t e = NULL;
    ASSERT_FAILS(dsm_engine_init_comm(MPI_COMM_WORLD,
                                 "{\"train_micro_batch_size_per_gpu\": 1, \"optimizer\": {\"type\": \"SGD\"},"
                                 " \"fp32_nonfinite_gradients\": \"ignore\"}",
                                 d, NP, &e),
                 DSM_ERR_CONFIG, "fp32_nonfinite_gradients: expected one of \"warn\", \"skip\", \"fail\", got \"ignore\"");
    assert_null(e);
}

static void cleanup(void) {
    char path[300];
    snprintf(path, sizeof path, "%s.%d", log_prefix, test_rank);
    unlink(path);
}

int main(int argc, char **argv) {
    for (int i = 0; i < TOTAL; ++i) init[i] = 0.5f - 0.01f * (float)i;
    /* The same prefix on every rank: the parent's pid (all ranks share it under mpiexec). */
    const char *tmp = getenv("TMPDIR");
    snprintf(log_prefix, sizeof log_prefix, "%s/dsm-nonfinite-test-%ld", tmp != NULL ? tmp : "/tmp", (long)getppid());
    char file[300];
    snprintf(file, sizeof file, "%s.%%r", log_prefix);
    setenv("DSM_DEBUG", "INFO", 1);
    setenv("DSM_DEBUG_SUBSYS", "ENGINE", 1);
    setenv("DSM_DEBUG_FILE", file, 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_skip), cmocka_unit_test(test_fail), cmocka_unit_test(test_warn),
        cmocka_unit_test(test_bf16_unaffected), cmocka_unit_test(test_bf16_checks_by_default),
        cmocka_unit_test(test_bad_value),
    };
    atexit(cleanup);
    return RUN_MPI_TESTS("test_engine_nonfinite", tests);
}
