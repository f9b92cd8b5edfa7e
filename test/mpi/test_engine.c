/*
 * The training engine against a single-rank run: the same model, data and
 * seed trained at N ranks (data parallel, every ZeRO stage, with and without
 * gradient accumulation, each optimizer, fp32/fp16/bf16, a DP x SP mesh) ends
 * with the same parameters as an engine on MPI_COMM_SELF that sees the whole
 * global batch, within fp32 rounding. Also: skipped steps on overflow, the
 * counters, initialization by callback, and the description.
 *
 * The device-resident engine on the simulated device (DSM_ENGINE_DEVICE=sim:
 * the model state in memory of its own, every operation deferred to its
 * queue) against the host engine: the same bits at every ZeRO stage, in
 * fp32, fp16 and bf16, with accumulation and clipping, on a DP x SP mesh, and
 * a checkpoint saved by one loaded by the other.
 *
 * The model is a small MLP written here: y = s * (tanh(x W1 + b1) W2 + b2) + f
 * with W1 [7 x 61] (larger than the reduction buckets the tests configure),
 * a scalar s and a frozen f; loss = mean over the micro-batch of
 * 0.5 * |y - t|^2.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* overlap_comm runs its progress thread only with MPI_THREAD_MULTIPLE. */
#define MPI_TEST_THREAD_LEVEL MPI_THREAD_MULTIPLE
#include "mpi_test.h"
#include "engine_memory.h"

#define NIN 7
#define NH 61
#define NOUT 3
#define NPARAMS 6
#define MAXSTEPS 8

enum { W1, B1, W2, B2, S, F };
static const int64_t shape_w1[2] = {NIN, NH}, shape_b1[1] = {NH}, shape_w2[2] = {NH, NOUT}, shape_b2[1] = {NOUT};
static const size_t numel[NPARAMS] = {NIN * NH, NH, NH * NOUT, NOUT, 1, NOUT};
#define TOTAL (NIN * NH + NH + NH * NOUT + NOUT + 1 + NOUT)


static int init_fn(void *user, int index, const char *name, int64_t offset, int64_t count, float *values) {
    (void)user;
    (void)name;
    for (int64_t i = 0; i < count; ++i) {
        float v = 0.4f * test_hashf(100u + (unsigned)index, (unsigned)(offset + i));
        if (index == S) v = 1.0f;
        values[i] = v;
    }
    return 0;
}

static void describe_params(dsm_param_desc_t d[NPARAMS], const float *init /* TOTAL or NULL */) {
    static const char *names[NPARAMS] = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "out.scale", "out.frozen"};
    const int64_t *shapes[NPARAMS] = {shape_w1, shape_b1, shape_w2, shape_b2, NULL, shape_b2};
    const int ndims[NPARAMS] = {2, 1, 2, 1, 0, 1};
    size_t off = 0;
    for (int i = 0; i < NPARAMS; ++i) {
        memset(&d[i], 0, sizeof d[i]);
        d[i].name = names[i];
        d[i].ndims = ndims[i];
        d[i].shape = shapes[i];
        d[i].dtype = DSM_FLOAT32;
        d[i].trainable = i != F;
        d[i].no_weight_decay = i == B1 || i == B2 || i == S;
        d[i].init_values = init ? init + off : NULL;
        d[i].init_fn = init_fn;
        off += numel[i];
    }
}

/* One sample's input and target. */
static void sample(unsigned idx, float x[NIN], float t[NOUT]) {
    for (int i = 0; i < NIN; ++i) x[i] = test_hashf(7u, idx * 31u + (unsigned)i);
    for (int o = 0; o < NOUT; ++o) t[o] = 0.5f * test_hashf(9u, idx * 17u + (unsigned)o);
}

static void to_f32(dsm_engine_t e, const void *src, float *dst, size_t n) { engine_read_f32(e, src, dst, n); }

/* grad += g (n elements) in the engine's dtype. */
static void add_grad(dsm_engine_t e, void *grad, const float *g, size_t n) {
    float *cur = malloc(n * sizeof *cur);
    engine_read_f32(e, grad, cur, n);
    for (size_t i = 0; i < n; ++i) cur[i] += g[i];
    engine_write_f32(e, grad, cur, n);
    free(cur);
}

/* 1: get_param and the gradients go through dsm_engine_param_read_f32 and
   dsm_engine_grad_add_f32 instead (test_f32_helpers). */
static int use_f32_helpers;

/* Acquire parameter i as fp32 into dst (and release it). */
static void get_param(dsm_engine_t e, int i, float *dst) {
    if (use_f32_helpers) {
        ASSERT_OK(dsm_engine_param_read_f32(e, i, dst, (int64_t)numel[i]));
        return;
    }
    const void *v;
    ASSERT_OK(dsm_engine_param_acquire(e, i, &v));
    to_f32(e, v, dst, numel[i]);
    ASSERT_OK(dsm_engine_param_release(e, i));
}

/*
 * One micro-step on samples [first, first + count): forward, backward (the
 * gradient of the mean loss times `gscale`), into the engine. `poison`: write
 * an Inf into fc2.bias's gradient.
 */
static double micro_step(dsm_engine_t e, unsigned first, int count, float gscale, int poison) {
    static float w1[NIN * NH], b1[NH], w2[NH * NOUT], b2[NOUT], s, f[NOUT];
    float *p[NPARAMS] = {w1, b1, w2, b2, &s, f};
    for (int i = 0; i < NPARAMS; ++i) get_param(e, i, p[i]);
    static float g[NPARAMS][NIN * NH];
    memset(g, 0, sizeof g);
    double loss = 0;
    double ls = 1.0;
    ASSERT_OK(dsm_engine_loss_scale(e, &ls));
    for (int n = 0; n < count; ++n) {
        float x[NIN], t[NOUT], h[NH], z[NOUT], y[NOUT], dy[NOUT], dz[NOUT], dh[NH];
        sample(first + (unsigned)n, x, t);
        for (int j = 0; j < NH; ++j) {
            float a = b1[j];
            for (int i = 0; i < NIN; ++i) a += x[i] * w1[i * NH + j];
            h[j] = tanhf(a);
        }
        for (int o = 0; o < NOUT; ++o) {
            float a = b2[o];
            for (int j = 0; j < NH; ++j) a += h[j] * w2[j * NOUT + o];
            z[o] = a;
            y[o] = s * a + f[o];
            dy[o] = (y[o] - t[o]) * gscale * (float)ls / (float)count;
            loss += 0.5 * (y[o] - t[o]) * (y[o] - t[o]) / count;
        }
        for (int o = 0; o < NOUT; ++o) {
            g[S][0] += dy[o] * z[o];
            dz[o] = dy[o] * s;
            g[B2][o] += dz[o];
        }
        for (int j = 0; j < NH; ++j) {
            float a = 0;
            for (int o = 0; o < NOUT; ++o) {
                g[W2][j * NOUT + o] += h[j] * dz[o];
                a += w2[j * NOUT + o] * dz[o];
            }
            dh[j] = a * (1 - h[j] * h[j]);
            g[B1][j] += dh[j];
            for (int i = 0; i < NIN; ++i) g[W1][i * NH + j] += x[i] * dh[j];
        }
    }
    if (poison) g[B2][1] = INFINITY;
    /* Backward order, re-acquiring what backward reads (a ZeRO-3 re-gather). */
    for (int i = F - 1; i >= 0; --i) {
        if (i == W2 || i == S) get_param(e, i, p[i]);
        if (use_f32_helpers) {
            ASSERT_OK(dsm_engine_grad_add_f32(e, i, g[i], (int64_t)numel[i]));
            continue;
        }
        void *buf;
        ASSERT_OK(dsm_engine_grad_acquire(e, i, &buf));
        add_grad(e, buf, g[i], numel[i]);
        ASSERT_OK(dsm_engine_grad_release(e, i));
    }
    return loss;
}

/* Every parameter, fp32, concatenated. */
static void read_all(dsm_engine_t e, float *out) {
    size_t off = 0;
    for (int i = 0; i < NPARAMS; ++i) {
        get_param(e, i, out + off);
        off += numel[i];
    }
}

typedef struct {
    int stage, gas, mb, steps;
    const char *optimizer; /* the "optimizer" JSON object */
    const char *extra;     /* more top-level keys, "" or starting with ',' */
    int use_init_values;
} run_t;

/* More zero_optimization keys for every run (test_offload), "" or starting with ','. */
static const char *zero_extra = "";
/* stage3_prefetch_bucket_size for every run (test_overlap_bits). */
static int prefetch_bucket = 500;

static void make_config(char *buf, size_t len, const run_t *r, int mb) {
    snprintf(buf, len,
             "{\"train_micro_batch_size_per_gpu\": %d, \"gradient_accumulation_steps\": %d,"
             " \"steps_per_print\": 1000000%s,"
             " \"zero_optimization\": {\"stage\": %d, \"reduce_bucket_size\": 100,"
             " \"stage3_param_persistence_threshold\": 10, \"stage3_prefetch_bucket_size\": %d%s},"
             " \"optimizer\": %s %s}",
             mb, r->gas, strstr(r->extra, "gradient_clipping") ? "" : ", \"gradient_clipping\": 0.5", r->stage,
             prefetch_bucket, zero_extra, r->optimizer, r->extra);
}

/*
 * Train on `comm` with micro-batch `mb` per data-parallel rank; the global
 * micro-batch is mb * dp, of which data-parallel rank `dp_rank` takes its
 * slice. `sp` ranks share each slice and each adds 1/sp of the gradient.
 */
static void train(MPI_Comm comm, dsm_mesh_t mesh, const run_t *r, int mb, int dp, int dp_rank, int sp,
                  float *out, dsm_step_info_t *last) {
    char cfg[2048];
    make_config(cfg, sizeof cfg, r, mb);
    float init[TOTAL];
    size_t off = 0;
    for (int i = 0; i < NPARAMS; ++i) {
        init_fn(NULL, i, NULL, 0, (int64_t)numel[i], init + off);
        off += numel[i];
    }
    dsm_param_desc_t d[NPARAMS];
    describe_params(d, r->use_init_values ? init : NULL);
    dsm_engine_t e = NULL;
    if (mesh)
        ASSERT_OK(dsm_engine_init(mesh, cfg, d, NPARAMS, &e));
    else
        ASSERT_OK(dsm_engine_init_comm(comm, cfg, d, NPARAMS, &e));
    const int global_mb = mb * dp;
    for (int step = 0; step < r->steps; ++step)
        for (int k = 0; k < r->gas; ++k) {
            const unsigned m = (unsigned)(step * r->gas + k);
            micro_step(e, m * (unsigned)global_mb + (unsigned)(dp_rank * mb), mb, 1.0f / (float)sp, 0);
            dsm_step_info_t info = DSM_STEP_INFO_INITIALIZER;
            ASSERT_OK(dsm_step(e, &info));
            assert_int_equal(info.boundary, k == r->gas - 1);
            if (last) *last = info;
        }
    read_all(e, out);
    ASSERT_OK(dsm_engine_free(&e));
    assert_null(e);
}

static void compare(const float *got, const float *want, double tol, const char *what) {
    double worst = 0;
    int at = -1;
    for (int i = 0; i < TOTAL; ++i) {
        double d = fabs((double)got[i] - (double)want[i]) / (1.0 + fabs((double)want[i]));
        if (!(d <= worst)) worst = d, at = i;
    }
    if (!(worst <= tol))
        fail_msg("%s: element %d differs: %.9g vs single-rank %.9g (relative %.3g > %.3g)", what, at, got[at],
                 want[at], worst, tol);
}

/* The N-rank data-parallel run against the single-rank run. */
static void check_run(const run_t *r, double tol, const char *what) {
    float got[TOTAL], want[TOTAL];
    train(MPI_COMM_WORLD, NULL, r, r->mb, test_size, test_rank, 1, got, NULL);
    train(MPI_COMM_SELF, NULL, r, r->mb * test_size, 1, 0, 1, want, NULL);
    compare(got, want, tol, what);
    /* Every rank holds the same bits. */
    float mx[TOTAL], mn[TOTAL];
    MPI_Allreduce(got, mx, TOTAL, MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(got, mn, TOTAL, MPI_FLOAT, MPI_MIN, MPI_COMM_WORLD);
    assert_memory_equal(mx, mn, sizeof mx);
}

static const char *ADAMW = "{\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.1, \"eps\": 1e-6}}";

static void test_stages(void **state) {
    (void)state;
    for (int stage = 0; stage <= 3; ++stage)
        for (int gas = 1; gas <= 2; ++gas) {
            run_t r = {stage, gas, 3, 4, ADAMW, "", stage % 2};
            char what[64];
            snprintf(what, sizeof what, "stage %d, gas %d", stage, gas);
            check_run(&r, 2e-5, what);
        }
}

static void test_optimizers(void **state) {
    (void)state;
    const char *opts[] = {
        "{\"type\": \"Adam\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.05, \"adam_w_mode\": false, \"eps\": 1e-6}}",
        "{\"type\": \"Adam\", \"params\": {\"lr\": 0.01, \"bias_correction\": false, \"eps\": 1e-6}}",
        "{\"type\": \"SGD\", \"params\": {\"lr\": 0.05, \"momentum\": 0.9, \"nesterov\": true, \"weight_decay\": 0.01}}",
        "{\"type\": \"SGD\", \"params\": {\"lr\": 0.05, \"momentum\": 0.5, \"dampening\": 0.1}}",
        "{\"type\": \"Lamb\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.01, \"eps\": 1e-6}}",
        "{\"type\": \"Lion\", \"params\": {\"lr\": 0.001, \"weight_decay\": 0.1}}",
        "{\"type\": \"Adagrad\", \"params\": {\"lr\": 0.05, \"lr_decay\": 0.01, \"eps\": 1e-6}}",
    };
    for (size_t k = 0; k < sizeof opts / sizeof opts[0]; ++k)
        for (int stage = 1; stage <= 3; stage += 2) {
            run_t r = {stage, 2, 2, 3, opts[k], "", 1};
            char what[256];
            snprintf(what, sizeof what, "stage %d, optimizer %s", stage, opts[k]);
            check_run(&r, 3e-5, what);
        }
}

static void test_precision(void **state) {
    (void)state;
    const run_t runs[] = {
        {1, 1, 3, 3, ADAMW, ", \"fp16\": {\"enabled\": true}", 1},
        {3, 2, 2, 3, ADAMW, ", \"fp16\": {\"enabled\": true, \"initial_scale_power\": 8}", 0},
        {2, 2, 2, 3, ADAMW, ", \"bf16\": {\"enabled\": true}", 1},
        {0, 1, 2, 3, ADAMW, ", \"bf16\": {\"enabled\": true}, \"communication_data_type\": \"fp32\"", 1},
        {2, 1, 2, 3, ADAMW, ", \"communication_data_type\": \"bf16\"", 1},
    };
    for (size_t k = 0; k < sizeof runs / sizeof runs[0]; ++k) {
        char what[256];
        snprintf(what, sizeof what, "stage %d%s", runs[k].stage, runs[k].extra);
        check_run(&runs[k], 2e-2, what);
    }
}

static void test_allreduce_semantics(void **state) {
    (void)state;
    /* Postscale with a predivide factor and prescale give the mean; "sum" gives
       dp times the mean gradient: compare SGD (linear in the gradient) runs. */
    const char *sgd = "{\"type\": \"SGD\", \"params\": {\"lr\": 0.01}}";
    run_t a = {1, 1, 2, 2, sgd, ", \"gradient_predivide_factor\": 2.0", 1};
    check_run(&a, 2e-5, "gradient_predivide_factor 2");
    run_t b = {2, 1, 2, 2, sgd, ", \"prescale_gradients\": true", 1};
    check_run(&b, 2e-5, "prescale_gradients");
    if (test_size > 1) {
        /* "sum" over dp ranks with lr / dp equals the mean with lr (SGD, no clipping). */
        char sum_sgd[128];
        snprintf(sum_sgd, sizeof sum_sgd, "{\"type\": \"SGD\", \"params\": {\"lr\": %.17g}}", 0.01 / test_size);
        run_t c = {2, 1, 2, 2, sum_sgd, ", \"gradient_allreduce_op\": \"sum\", \"gradient_clipping\": 0", 1};
        run_t m = {2, 1, 2, 2, sgd, ", \"gradient_clipping\": 0", 1};
        float got[TOTAL], want[TOTAL];
        train(MPI_COMM_WORLD, NULL, &c, 2, test_size, test_rank, 1, got, NULL);
        train(MPI_COMM_SELF, NULL, &m, 2 * test_size, 1, 0, 1, want, NULL);
        compare(got, want, 2e-5, "gradient_allreduce_op sum");
    }
}

/*
 * Overflow on one rank: every rank skips, parameters and lr stay, the scale
 * halves. WarmupLR holds warmup_min_lr for the first two applied steps (as
 * DeepSpeed's does: iteration 0 gives gamma 0), so that lr must be non-zero
 * for the steps to move the parameters.
 */
static void test_overflow_skip(void **state) {
    (void)state;
    const char *cfg = "{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": 1,"
                      " \"steps_per_print\": 1000000, \"fp16\": {\"enabled\": true, \"initial_scale_power\": 10,"
                      " \"hysteresis\": 1}, \"zero_optimization\": {\"stage\": 2},"
                      " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}},"
                      " \"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_num_steps\": 10,"
                      " \"warmup_type\": \"linear\", \"warmup_min_lr\": 0.001, \"warmup_max_lr\": 0.01}}}";
    dsm_param_desc_t d[NPARAMS];
    describe_params(d, NULL);
    dsm_engine_t e;
    ASSERT_OK(dsm_engine_init_comm(MPI_COMM_WORLD, cfg, d, NPARAMS, &e));
    dsm_step_info_t info = DSM_STEP_INFO_INITIALIZER;
    micro_step(e, (unsigned)test_rank * 2u, 2, 1.0f, 0);
    ASSERT_OK(dsm_step(e, &info));
    assert_int_equal(info.skipped, 0);
    assert_true(info.loss_scale == 1024.0);
    const double lr1 = info.lr;
    float before[TOTAL], after[TOTAL];
    read_all(e, before);
    micro_step(e, 100u + (unsigned)test_rank * 2u, 2, 1.0f, test_rank == test_size - 1);
    ASSERT_OK(dsm_step(e, &info));
    assert_int_equal(info.boundary, 1);
    assert_int_equal(info.skipped, 1);
    assert_int_equal(info.skipped_steps, 1);
    assert_int_equal(info.global_steps, 2);
    assert_true(info.loss_scale == 512.0);
    assert_true(info.lr == lr1);
    assert_false(isfinite(info.grad_norm));
    read_all(e, after);
    assert_memory_equal(before, after, sizeof before);
    /* The next clean step applies. */
    micro_step(e, 200u + (unsigned)test_rank * 2u, 2, 1.0f, 0);
    ASSERT_OK(dsm_step(e, &info));
    assert_int_equal(info.skipped, 0);
    assert_true(info.lr > lr1);
    assert_true(isfinite(info.grad_norm) && info.grad_norm > 0);
    read_all(e, after);
    assert_memory_not_equal(before, after, sizeof before);
    ASSERT_OK(dsm_engine_free(&e));
}

static void test_counters(void **state) {
    (void)state;
    run_t r = {1, 3, 2, 2, ADAMW, "", 0};
    float out[TOTAL];
    dsm_step_info_t last = DSM_STEP_INFO_INITIALIZER;
    train(MPI_COMM_WORLD, NULL, &r, 2, test_size, test_rank, 1, out, &last);
    assert_int_equal(last.micro_steps, 6);
    assert_int_equal(last.global_steps, 2);
    assert_int_equal(last.skipped_steps, 0);
    assert_int_equal(last.global_samples, 2 * 2 * 3 * test_size);
    assert_true(last.grad_norm > 0);
    assert_true(last.loss_scale == 1.0);
}

static void train_on(const char *device, dsm_mesh_t mesh, const run_t *r, int dp, int dp_rank, int sp, float *out,
                     dsm_step_info_t *last);

/* dsm_engine_param_read_f32 and dsm_engine_grad_add_f32 train to the same
   bits as acquiring, converting and releasing by hand, at every stage, in
   fp32, fp16 and bf16, on the host and on the simulated device. */
static void test_f32_helpers(void **state) {
    (void)state;
    const char *precisions[] = {"", ", \"fp16\": {\"enabled\": true, \"initial_scale_power\": 8}",
                                ", \"bf16\": {\"enabled\": true}"};
    const char *devices[] = {"host", "sim"};
    for (int stage = 0; stage <= 3; ++stage)
        for (int p = 0; p < 3; ++p)
            for (int dev = 0; dev < 2; ++dev) {
                run_t r = {stage, 2, 2, 2, ADAMW, precisions[p], 0};
                float by_hand[TOTAL], helpers[TOTAL];
                train_on(devices[dev], NULL, &r, test_size, test_rank, 1, by_hand, NULL);
                use_f32_helpers = 1;
                train_on(devices[dev], NULL, &r, test_size, test_rank, 1, helpers, NULL);
                use_f32_helpers = 0;
                if (memcmp(by_hand, helpers, sizeof by_hand) != 0)
                    fail_msg("stage %d%s on %s: the fp32 helpers train to other bits", stage, precisions[p],
                             devices[dev]);
            }
}

/* The lr of step `step` that dsm_config_describe_lr lists for `cfg_text`. */
static double described_lr(const char *cfg_text, int step) {
    dsm_config_t c = NULL;
    ASSERT_OK(dsm_config_load(MPI_COMM_WORLD, cfg_text, 0, &c));
    char *json = NULL;
    ASSERT_OK(dsm_config_describe_lr(c, step, DSM_FORMAT_JSON, &json));
    char key[64];
    snprintf(key, sizeof key, "{\"step\":%d,\"lr\":[", step);
    const char *at = strstr(json, key);
    if (at == NULL) fail_msg("dsm_config_describe_lr: no step %d in %s", step, json);
    const double lr = strtod(at + strlen(key), NULL);
    dsm_free(json);
    ASSERT_OK(dsm_config_free(&c));
    return lr;
}

/* A schedule resumed from the configuration (last_batch_iteration >= 0)
   leaves the optimizer's lr until its first step, as DeepSpeed's schedules
   do (they set the lr at construction only from iteration -1); from then on
   each step sets the lr of the schedule's next iteration. The engine and
   dsm_config_describe_lr agree (and doc/configuration.md shows this case,
   checked by test/tools/dsm-info.sh). */
static void test_schedule_resumed(void **state) {
    (void)state;
    run_t r = {1, 1, 2, 0, "{\"type\": \"AdamW\", \"params\": {\"lr\": 0.5}}",
               ", \"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_min_lr\": 0, "
               "\"warmup_max_lr\": 0.01, \"warmup_num_steps\": 10, \"warmup_type\": \"linear\", "
               "\"last_batch_iteration\": 4}}",
               0};
    char cfg[2048];
    make_config(cfg, sizeof cfg, &r, r.mb);
    dsm_param_desc_t d[NPARAMS];
    describe_params(d, NULL);
    dsm_engine_t e = NULL;
    ASSERT_OK(dsm_engine_init_comm(MPI_COMM_WORLD, cfg, d, NPARAMS, &e));
    dsm_step_info_t info = DSM_STEP_INFO_INITIALIZER;
    ASSERT_OK(dsm_engine_step_info(e, &info));
    if (info.lr != 0.5) fail_msg("lr before the first step: %.17g, expected the optimizer's 0.5", info.lr);
    micro_step(e, (unsigned)(test_rank * r.mb), r.mb, 1.0f, 0);
    ASSERT_OK(dsm_step(e, &info)); /* steps with 0.5; the schedule moves to iteration 5 */
    if (fabs(info.lr - 0.005) > 1e-15) fail_msg("lr after the first step: %.17g, expected 0.005", info.lr);
    ASSERT_OK(dsm_engine_free(&e));
    const double before = described_lr(cfg, 0), after = described_lr(cfg, 1);
    if (before != 0.5) fail_msg("dsm_config_describe_lr step 0: %.17g, the engine steps first with 0.5", before);
    if (fabs(after - 0.005) > 1e-15)
        fail_msg("dsm_config_describe_lr step 1: %.17g, the engine's lr after the first step is 0.005", after);
}

/* init_fn and init_values give the same parameters at every stage. */
static void test_init_paths(void **state) {
    (void)state;
    for (int stage = 0; stage <= 3; ++stage) {
        run_t a = {stage, 1, 1, 0, ADAMW, "", 0}, b = a;
        b.use_init_values = 1;
        float x[TOTAL], y[TOTAL];
        train(MPI_COMM_WORLD, NULL, &a, 1, test_size, test_rank, 1, x, NULL);
        train(MPI_COMM_WORLD, NULL, &b, 1, test_size, test_rank, 1, y, NULL);
        assert_memory_equal(x, y, sizeof x);
        assert_true(x[TOTAL - NOUT - 1] == 1.0f); /* out.scale */
    }
}

/* A data_parallel x sequence_parallel mesh: gradients summed over SP. */
/* A (data_parallel, sequence_parallel) mesh over every rank, and this rank's
   data-parallel index. */
static dsm_mesh_t dp_sp_mesh(int dp, int sp, int *dp_rank) {
    dsm_mesh_t mesh;
    ASSERT_OK(dsm_mesh_create_dp_sp(MPI_COMM_WORLD, dp, sp, &mesh));
    ASSERT_OK(dsm_mesh_rank(mesh, "data_parallel", dp_rank));
    return mesh;
}

static void test_dp_sp_mesh(void **state) {
    (void)state;
    if (test_size % 2 != 0 || test_size < 4) skip();
    const int sp = 2, dp = test_size / sp;
    int dp_rank;
    dsm_mesh_t mesh = dp_sp_mesh(dp, sp, &dp_rank);
    for (int stage = 0; stage <= 3; ++stage) {
        run_t r = {stage, 2, 2, 3, ADAMW, "", 1};
        float got[TOTAL], want[TOTAL];
        train(MPI_COMM_WORLD, mesh, &r, 2, dp, dp_rank, sp, got, NULL);
        train(MPI_COMM_SELF, NULL, &r, 2 * dp, 1, 0, 1, want, NULL);
        char what[64];
        snprintf(what, sizeof what, "dp %d x sp %d, stage %d", dp, sp, stage);
        compare(got, want, 2e-5, what);
    }
    ASSERT_OK(dsm_mesh_free(&mesh));
}

static void test_describe(void **state) {
    (void)state;
    const char *cfg = "{\"train_micro_batch_size_per_gpu\": 1, \"zero_optimization\": {\"stage\": 2},"
                      " \"optimizer\": {\"type\": \"AdamW\"}}";
    dsm_param_desc_t d[NPARAMS];
    describe_params(d, NULL);
    dsm_engine_t e;
    ASSERT_OK(dsm_engine_init_comm(MPI_COMM_WORLD, cfg, d, NPARAMS, &e));
    char *text = NULL;
    ASSERT_OK(dsm_engine_describe(e, DSM_FORMAT_JSON, &text));
    assert_non_null(strstr(text, "\"format\":\"dsm-engine\""));
    assert_non_null(strstr(text, "\"zero_stage\":2"));
    assert_non_null(strstr(text, "\"zero_formula_bytes_per_parameter\""));
    char expect[64];
    snprintf(expect, sizeof expect, "\"data_parallel_size\":%d", test_size);
    assert_non_null(strstr(text, expect));
    dsm_free(text);
    ASSERT_OK(dsm_engine_describe(e, DSM_FORMAT_TEXT, &text));
    assert_non_null(strstr(text, "ZeRO stage 2"));
    dsm_free(text);
    int n, idx;
    ASSERT_OK(dsm_engine_num_params(e, &n));
    assert_int_equal(n, NPARAMS);
    ASSERT_OK(dsm_engine_param_index(e, "fc2.weight", &idx));
    assert_int_equal(idx, W2);
    int64_t ne;
    ASSERT_OK(dsm_engine_param_numel(e, W1, &ne));
    assert_int_equal(ne, NIN * NH);
    dsm_mesh_t m;
    ASSERT_OK(dsm_engine_borrow_mesh(e, &m));
    int sz;
    ASSERT_OK(dsm_mesh_size(m, "data_parallel", &sz));
    assert_int_equal(sz, test_size);
    ASSERT_OK(dsm_engine_free(&e));
}

/* A number of the "offload" object of the engine's JSON description. */
static long long offload_count(dsm_engine_t e, const char *key) {
    char *text = NULL;
    ASSERT_OK(dsm_engine_describe(e, DSM_FORMAT_JSON, &text));
    const char *o = strstr(text, "\"offload\":{");
    if (o == NULL) fail_msg("no offload object in %s", text);
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *k = strstr(o, pat);
    if (k == NULL) fail_msg("no %s in %s", key, o);
    const long long n = strtoll(k + strlen(pat), NULL, 10);
    dsm_free(text);
    return n;
}

/* train() with the engine's model state on `device` (DSM_ENGINE_DEVICE). */
static void train_on(const char *device, dsm_mesh_t mesh, const run_t *r, int dp, int dp_rank, int sp, float *out,
                     dsm_step_info_t *last) {
    setenv("DSM_ENGINE_DEVICE", device, 1);
    train(MPI_COMM_WORLD, mesh, r, r->mb, dp, dp_rank, sp, out, last);
    unsetenv("DSM_ENGINE_DEVICE");
}

/*
 * A gradient added with fmaf, acquired twice in a micro-step and in two
 * micro-steps of an accumulation window, trains to the same bits at stages
 * 2 and 3 on the host as with ZeRO-Offload (where every acquisition goes
 * through the reduction bucket). Handing out the gradient partition itself
 * on one rank (to spare the bucket's copy) changed these bits, and this
 * test caught it.
 */
static void test_grad_in_place(void **state) {
    (void)state;
    const char *opt = ", \"offload_optimizer\": {\"device\": \"cpu\"}";
    for (int stage = 2; stage <= 3; ++stage) {
        float got[TOTAL], want[TOTAL];
        for (int off = 0; off <= 1; ++off) {
            run_t r = {stage, 2, 1, 1, ADAMW, "", 0};
            char cfg[2048];
            zero_extra = off ? opt : "";
            make_config(cfg, sizeof cfg, &r, 1);
            zero_extra = "";
            dsm_param_desc_t d[NPARAMS];
            describe_params(d, NULL);
            dsm_engine_t e;
            setenv(off ? "DSM_SIM_DEVICE_MEMORY" : "DSM_ENGINE_DEVICE", off ? "1" : "host", 1);
            ASSERT_OK(dsm_engine_init_comm(MPI_COMM_WORLD, cfg, d, NPARAMS, &e));
            unsetenv("DSM_SIM_DEVICE_MEMORY");
            unsetenv("DSM_ENGINE_DEVICE");
            for (int step = 0; step < 2; ++step)
                for (int micro = 0; micro < 2; ++micro) {
                    for (int k = 0; k < 2; ++k) {
                        void *g;
                        ASSERT_OK(dsm_engine_grad_acquire(e, B1, &g));
                        float *x = (float *)g;
                        for (int i = 0; i < NH; ++i)
                            x[i] = fmaf(1.0f + test_hashf(7u, (unsigned)(i + 3 * k + micro)),
                                        test_hashf(5u, (unsigned)(i + test_rank + k)), x[i]);
                        ASSERT_OK(dsm_engine_grad_release(e, B1));
                    }
                    ASSERT_OK(dsm_step(e, NULL));
                }
            read_all(e, off ? got : want);
            ASSERT_OK(dsm_engine_free(&e));
        }
        for (int i = 0; i < TOTAL; ++i)
            if (memcmp(&got[i], &want[i], sizeof got[i]) != 0)
                fail_msg("stage %d: a gradient added with fmaf twice per micro-step, two micro-steps per window: "
                         "element %d is %.9g on the host, %.9g with offload", stage, i, want[i], got[i]);
    }
}

/*
 * Gradients acquired twice in a row per micro-step (the first copy still
 * pending, in the bucket where it fits), whole and by ranges (two disjoint
 * ranges of W1 before its whole gradient), accumulation 3, each rank alone
 * (MPI_COMM_SELF), at ZeRO-2 and 3, whose gradients go through the buckets
 * (or, on the host, the partition's own elements while they are zero in the
 * window). One term added per element and acquisition: stages 2 and 3 end
 * with stage 0's bits (stage 0 adds each term into the window's sum; a bucket
 * adds its one term into it). Two terms per acquisition, the second with
 * fmaf (the bucket rounds their sum before adding it into the window's): the
 * host ends with the bits of the simulated device, whose gradients all go
 * through the buckets. Each micro-step ends with two gradients out at once,
 * released in the other order.
 */
static void one_rank_add(dsm_engine_t e, void *g, size_t n, int terms, unsigned seed) {
    float *x = malloc(n * sizeof *x);
    engine_read_f32(e, g, x, n);
    for (size_t i = 0; i < n; ++i) {
        x[i] += test_hashf(seed, (unsigned)i);
        if (terms > 1) x[i] = fmaf(1.0f + test_hashf(seed + 1u, (unsigned)i), test_hashf(seed + 2u, (unsigned)i), x[i]);
    }
    engine_write_f32(e, g, x, n);
    free(x);
}

static void one_rank_train(const char *device, int stage, int terms, float *out) {
    run_t r = {stage, 3, 1, 1, ADAMW, "", 1};
    char cfg[2048];
    make_config(cfg, sizeof cfg, &r, 1);
    dsm_param_desc_t d[NPARAMS];
    describe_params(d, NULL);
    dsm_engine_t e;
    setenv("DSM_ENGINE_DEVICE", device, 1);
    ASSERT_OK(dsm_engine_init_comm(MPI_COMM_SELF, cfg, d, NPARAMS, &e));
    unsetenv("DSM_ENGINE_DEVICE");
    for (unsigned m = 0; m < 6; ++m) {
        const int64_t cut[3] = {0, 2 * NH, 5 * NH};
        for (int c = 0; c < 2; ++c) {
            void *g;
            ASSERT_OK(dsm_engine_grad_acquire_range(e, W1, cut[c], cut[c + 1] - cut[c], &g));
            one_rank_add(e, g, (size_t)(cut[c + 1] - cut[c]), terms, 40u * m + 30u + (unsigned)c);
            ASSERT_OK(dsm_engine_grad_release_range(e, W1, cut[c], cut[c + 1] - cut[c]));
        }
        for (int i = S; i >= W1; --i)
            for (unsigned k = 0; k < 2; ++k) {
                void *g;
                ASSERT_OK(dsm_engine_grad_acquire(e, i, &g));
                one_rank_add(e, g, numel[i], terms, 40u * m + 10u * k + (unsigned)i);
                ASSERT_OK(dsm_engine_grad_release(e, i));
            }
        /* Two gradients out at once, released in the other order (as the
           PyTorch bridge does with a block's): the first may hold the bucket
           while the second's release comes. */
        void *g1, *g2;
        ASSERT_OK(dsm_engine_grad_acquire(e, S, &g1));
        ASSERT_OK(dsm_engine_grad_acquire(e, B1, &g2));
        one_rank_add(e, g1, numel[S], terms, 40u * m + 7u);
        one_rank_add(e, g2, numel[B1], terms, 40u * m + 9u);
        ASSERT_OK(dsm_engine_grad_release(e, B1));
        ASSERT_OK(dsm_engine_grad_release(e, S));
        ASSERT_OK(dsm_step(e, NULL));
    }
    read_all(e, out);
    ASSERT_OK(dsm_engine_free(&e));
}

static void test_one_rank_grads(void **state) {
    (void)state;
    float want[TOTAL], got[TOTAL];
    one_rank_train("host", 0, 1, want);
    for (int stage = 2; stage <= 3; ++stage) {
        one_rank_train("host", stage, 1, got);
        for (int i = 0; i < TOTAL; ++i)
            if (memcmp(&got[i], &want[i], sizeof got[i]) != 0)
                fail_msg("one rank, one term per acquisition: stage %d's element %d is %.9g, stage 0's %.9g", stage, i,
                         got[i], want[i]);
    }
    for (int stage = 2; stage <= 3; ++stage) {
        one_rank_train("sim", stage, 2, want);
        one_rank_train("host", stage, 2, got);
        for (int i = 0; i < TOTAL; ++i)
            if (memcmp(&got[i], &want[i], sizeof got[i]) != 0)
                fail_msg("one rank, two terms per acquisition: stage %d's element %d is %.9g on the host, %.9g "
                         "through the buckets (simulated device)", stage, i, got[i], want[i]);
    }
}

/*
 * ZeRO-Offload with the device simulated in host memory
 * (DSM_SIM_DEVICE_MEMORY=1): the parameters the model reads and the
 * gradients it writes are separate copies, refreshed after every step and
 * added into the engine's gradients at release, so training ends with the
 * same bits as without offload, at every stage, with accumulation, in fp32,
 * bf16 and fp16, and with ZeRO-3 parameter offload.
 */
static void test_offload(void **state) {
    (void)state;
    const char *opt = ", \"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": true}";
    const char *both = ", \"offload_optimizer\": {\"device\": \"cpu\"}, \"offload_param\": {\"device\": \"cpu\"}";
    const run_t runs[] = {
        {0, 1, 3, 3, ADAMW, "", 1},
        {0, 2, 3, 3, ADAMW, "", 0},
        {1, 2, 2, 3, ADAMW, "", 1},
        {2, 1, 3, 3, ADAMW, "", 0},
        {2, 2, 2, 3, ADAMW, "", 1},
        {3, 2, 2, 3, ADAMW, "", 1},
        {3, 2, 2, 3, ADAMW, "", 0},
        {3, 1, 2, 3, ADAMW, "", 1},
        {2, 1, 2, 3, ADAMW, ", \"bf16\": {\"enabled\": true}", 1},
        {1, 1, 2, 3, ADAMW, ", \"fp16\": {\"enabled\": true, \"initial_scale_power\": 8}", 1},
    };
    const char *offload[] = {opt, opt, opt, opt, opt, opt, both, ", \"offload_param\": {\"device\": \"cpu\"}", opt, opt};
    for (size_t k = 0; k < sizeof runs / sizeof runs[0]; ++k) {
        const run_t *r = &runs[k];
        float got[TOTAL], want[TOTAL];
        setenv("DSM_SIM_DEVICE_MEMORY", "1", 1);
        zero_extra = offload[k];
        train(MPI_COMM_WORLD, NULL, r, r->mb, test_size, test_rank, 1, got, NULL);
        unsetenv("DSM_SIM_DEVICE_MEMORY");
        zero_extra = "";
        /* The same arithmetic on the host (auto would train on a GPU where every rank has one). */
        train_on("host", NULL, r, test_size, test_rank, 1, want, NULL);
        for (int i = 0; i < TOTAL; ++i)
            if (memcmp(&got[i], &want[i], sizeof got[i]) != 0)
                fail_msg("offload, stage %d, gas %d%s%s: element %d is %.9g, without offload %.9g", r->stage, r->gas,
                         r->extra, offload[k], i, got[i], want[i]);
    }

    /* A gradient acquired twice in a micro-step (the first copy still pending): both sums count. */
    for (int stage = 0; stage <= 3; ++stage) {
        float got[TOTAL], want[TOTAL];
        for (int off = 0; off <= 1; ++off) {
            run_t r = {stage, 1, 1, 1, ADAMW, "", 1};
            char cfg[2048];
            zero_extra = off ? opt : "";
            make_config(cfg, sizeof cfg, &r, 1);
            zero_extra = "";
            dsm_param_desc_t d[NPARAMS];
            describe_params(d, NULL);
            dsm_engine_t e;
            /* The baseline on the host, where the gradient is written in place (auto would choose a GPU). */
            setenv(off ? "DSM_SIM_DEVICE_MEMORY" : "DSM_ENGINE_DEVICE", off ? "1" : "host", 1);
            ASSERT_OK(dsm_engine_init_comm(MPI_COMM_WORLD, cfg, d, NPARAMS, &e));
            unsetenv("DSM_SIM_DEVICE_MEMORY");
            unsetenv("DSM_ENGINE_DEVICE");
            for (int k = 0; k < 2; ++k) {
                void *g;
                ASSERT_OK(dsm_engine_grad_acquire(e, B1, &g));
                for (int i = 0; i < NH; ++i) ((float *)g)[i] += (float)(k + 1) * test_hashf(5u, (unsigned)(i + test_rank));
                ASSERT_OK(dsm_engine_grad_release(e, B1));
            }
            ASSERT_OK(dsm_step(e, NULL));
            read_all(e, off ? got : want);
            ASSERT_OK(dsm_engine_free(&e));
        }
        if (memcmp(got, want, sizeof got) != 0) fail_msg("stage %d: a gradient acquired twice differs with offload", stage);
    }

    /* The description says where the copies are; the values are copies, not the engine's buffers. */
    setenv("DSM_SIM_DEVICE_MEMORY", "1", 1);
    run_t r = {2, 1, 1, 1, ADAMW, "", 1};
    char cfg[2048];
    zero_extra = opt;
    make_config(cfg, sizeof cfg, &r, 1);
    zero_extra = "";
    dsm_param_desc_t d[NPARAMS];
    describe_params(d, NULL);
    dsm_engine_t e;
    ASSERT_OK(dsm_engine_init_comm(MPI_COMM_WORLD, cfg, d, NPARAMS, &e));
    unsetenv("DSM_SIM_DEVICE_MEMORY");
    char *text = NULL;
    ASSERT_OK(dsm_engine_describe(e, DSM_FORMAT_JSON, &text));
    if (strstr(text, "\"offload\":{\"device\":\"simulated\"") == NULL) fail_msg("no offload device in %s", text);
    dsm_free(text);
    ASSERT_OK(dsm_engine_describe(e, DSM_FORMAT_TEXT, &text));
    assert_non_null(strstr(text, "offload: master weights and optimizer state in host memory"));
    dsm_free(text);
    const void *v1, *v2;
    void *g;
    ASSERT_OK(dsm_engine_param_acquire(e, W1, &v1));
    ASSERT_OK(dsm_engine_grad_acquire(e, W1, &g));
    assert_true((const void *)g != v1);
    for (size_t i = 0; i < numel[W1]; ++i) assert_true(((const float *)g)[i] == 0.0f);
    ((float *)g)[0] = 1.0f;
    ASSERT_OK(dsm_engine_grad_release(e, W1));
    ASSERT_OK(dsm_engine_param_release(e, W1));
    ASSERT_OK(dsm_engine_param_acquire(e, W1, &v2));
    assert_true(v1 == v2); /* a kept parameter keeps its copy until the next step */
    ASSERT_OK(dsm_engine_param_release(e, W1));
    assert_int_equal(offload_count(e, "param_copies_at_acquire"), 1);
    assert_int_equal(offload_count(e, "param_copies_after_step"), 0);
    /* pin_memory page-locks the parameters the copies are made from (the simulation always succeeds). */
    assert_true(offload_count(e, "pinned_host_bytes") >= (long long)(TOTAL * sizeof(float)));
    /* The step enqueues the new values of the copies it holds (W1 only); the next acquire waits for that copy alone. */
    ASSERT_OK(dsm_step(e, NULL));
    assert_int_equal(offload_count(e, "param_copies_after_step"), 1);
    float after[TOTAL];
    read_all(e, after);
    assert_int_equal(offload_count(e, "param_copies_after_step"), 1);
    assert_int_equal(offload_count(e, "param_copies_at_acquire"), NPARAMS); /* the others, at their first acquire */
    ASSERT_OK(dsm_engine_param_acquire(e, W1, &v2));
    assert_true(v1 == v2);
    ASSERT_OK(dsm_engine_param_release(e, W1));
    /* A second step refreshes every trainable parameter's copy (the frozen one changes only at a load). */
    ASSERT_OK(dsm_step(e, NULL));
    assert_int_equal(offload_count(e, "param_copies_after_step"), 1 + (NPARAMS - 1));
    ASSERT_OK(dsm_engine_free(&e));

    /* The same two steps without offload, on the host: the values the offloading engine gave after the first one. */
    make_config(cfg, sizeof cfg, &r, 1);
    setenv("DSM_ENGINE_DEVICE", "host", 1);
    ASSERT_OK(dsm_engine_init_comm(MPI_COMM_WORLD, cfg, d, NPARAMS, &e));
    unsetenv("DSM_ENGINE_DEVICE");
    ASSERT_OK(dsm_engine_grad_acquire(e, W1, &g));
    ((float *)g)[0] = 1.0f;
    ASSERT_OK(dsm_engine_grad_release(e, W1));
    ASSERT_OK(dsm_step(e, NULL));
    float want[TOTAL];
    read_all(e, want);
    ASSERT_OK(dsm_engine_free(&e));
    if (memcmp(after, want, sizeof want) != 0) fail_msg("the device copies after a step differ from the engine's values");

    /* Without pin_memory nothing is page-locked. */
    setenv("DSM_SIM_DEVICE_MEMORY", "1", 1);
    zero_extra = ", \"offload_optimizer\": {\"device\": \"cpu\"}";
    make_config(cfg, sizeof cfg, &r, 1);
    zero_extra = "";
    ASSERT_OK(dsm_engine_init_comm(MPI_COMM_WORLD, cfg, d, NPARAMS, &e));
    unsetenv("DSM_SIM_DEVICE_MEMORY");
    assert_int_equal(offload_count(e, "pinned_host_bytes"), 0);
    ASSERT_OK(dsm_engine_free(&e));
}

/* ---------------------------------------------------------------- device-resident (simulated) */


static void check_bits(dsm_mesh_t mesh, const run_t *r, int dp, int dp_rank, int sp, const char *what) {
    float host[TOTAL], sim[TOTAL];
    dsm_step_info_t hi = DSM_STEP_INFO_INITIALIZER, si = DSM_STEP_INFO_INITIALIZER;
    train_on("host", mesh, r, dp, dp_rank, sp, host, &hi);
    train_on("sim", mesh, r, dp, dp_rank, sp, sim, &si);
    for (int i = 0; i < TOTAL; ++i)
        if (memcmp(&host[i], &sim[i], sizeof(float)) != 0)
            fail_msg("%s: element %d: simulated device %.9g, host %.9g (must be the same bits)", what, i, sim[i],
                     host[i]);
    if (memcmp(&hi.grad_norm, &si.grad_norm, sizeof(double)) != 0 || hi.loss_scale != si.loss_scale ||
        hi.skipped_steps != si.skipped_steps)
        fail_msg("%s: step info differs: grad_norm %.17g / %.17g, loss_scale %g / %g, skipped %lld / %lld", what,
                 si.grad_norm, hi.grad_norm, si.loss_scale, hi.loss_scale, (long long)si.skipped_steps,
                 (long long)hi.skipped_steps);
}

static void test_device_bit_exact(void **state) {
    (void)state;
    const char *precisions[] = {"", ", \"fp16\": {\"enabled\": true, \"initial_scale_power\": 30}",
                                ", \"bf16\": {\"enabled\": true}"};
    for (int stage = 0; stage <= 3; ++stage)
        for (int p = 0; p < 3; ++p) {
            /* gas 2 with gradient_clipping 0.5 (make_config's default); fp16
               starts at scale 2^30, so the first steps overflow and skip. */
            run_t r = {stage, 2, 2, 4, ADAMW, precisions[p], stage % 2};
            char what[160];
            snprintf(what, sizeof what, "stage %d%s", stage, precisions[p]);
            check_bits(NULL, &r, test_size, test_rank, 1, what);
        }
    const char *lamb = "{\"type\": \"Lamb\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.01, \"eps\": 1e-6}}";
    run_t l = {3, 1, 2, 3, lamb, ", \"communication_data_type\": \"bf16\"", 1};
    check_bits(NULL, &l, test_size, test_rank, 1, "stage 3, Lamb, bf16 reductions");
    if (test_size % 2 == 0) {
        const int sp = 2, dp = test_size / sp;
        int dp_rank;
        dsm_mesh_t mesh = dp_sp_mesh(dp, sp, &dp_rank);
        for (int stage = 1; stage <= 3; stage += 2) {
            run_t r = {stage, 2, 2, 3, ADAMW, ", \"bf16\": {\"enabled\": true}", 1};
            char what[64];
            snprintf(what, sizeof what, "dp %d x sp %d, stage %d, bf16", dp, sp, stage);
            check_bits(mesh, &r, dp, dp_rank, sp, what);
        }
        ASSERT_OK(dsm_mesh_free(&mesh));
    }
}

/* overlap_comm changes when the collectives run, never what they compute:
   the same bits with it on and off, at every stage, on the host (a progress
   thread: this program runs at MPI_THREAD_MULTIPLE) and on the simulated
   device (deferred to the waits; its poisoned memory and deferred queue make
   a missing wait visible), with gradient accumulation, 16-bit precision,
   small buckets, and ZeRO-3 prefetch windows, live limits and reuse
   distances of every kind. */
static void overlap_pair(const run_t *r, const char *device, const char *zero_keys, const char *what) {
    float off[TOTAL], on[TOTAL];
    dsm_step_info_t oi = DSM_STEP_INFO_INITIALIZER, ni = DSM_STEP_INFO_INITIALIZER;
    char keys[512];
    snprintf(keys, sizeof keys, ", \"overlap_comm\": false%s", zero_keys);
    zero_extra = keys;
    train_on(device, NULL, r, test_size, test_rank, 1, off, &oi);
    snprintf(keys, sizeof keys, ", \"overlap_comm\": true%s", zero_keys);
    train_on(device, NULL, r, test_size, test_rank, 1, on, &ni);
    zero_extra = "";
    for (int i = 0; i < TOTAL; ++i)
        if (memcmp(&off[i], &on[i], sizeof(float)) != 0)
            fail_msg("%s on %s: element %d: overlap_comm on %.9g, off %.9g (must be the same bits)", what, device, i,
                     on[i], off[i]);
    if (memcmp(&oi.grad_norm, &ni.grad_norm, sizeof(double)) != 0 || oi.loss_scale != ni.loss_scale ||
        oi.skipped_steps != ni.skipped_steps)
        fail_msg("%s on %s: step info differs with overlap_comm: grad_norm %.17g / %.17g", what, device,
                 ni.grad_norm, oi.grad_norm);
}

static void test_overlap_bits(void **state) {
    (void)state;
    const char *precisions[] = {"", ", \"bf16\": {\"enabled\": true}"};
    const char *devices[] = {"host", "sim"};
    /* make_config: reduce_bucket_size 100 (several flushes per micro-step). */
    const char *keys[] = {"", ", \"allgather_bucket_size\": 7", ", \"stage3_max_reuse_distance\": 0",
                          ", \"stage3_max_live_parameters\": 30, \"stage3_max_reuse_distance\": 40",
                          ", \"stage3_max_reuse_distance\": 100000"};
    const int prefetch[] = {500, 500, 0, 500, 100000};
    for (int stage = 0; stage <= 3; ++stage)
        for (int p = 0; p < 2; ++p)
            for (int d = 0; d < 2; ++d)
                for (int k = 0; k < 5; ++k) {
                    if (k >= 2 && stage < 3) continue;
                    if (k == 1 && stage == 0) continue;
                    run_t r = {stage, 2, 2, 3, ADAMW, precisions[p], 0};
                    char what[256];
                    snprintf(what, sizeof what, "stage %d%s%s, stage3_prefetch_bucket_size %d", stage, precisions[p],
                             keys[k], prefetch[k]);
                    prefetch_bucket = prefetch[k];
                    overlap_pair(&r, devices[d], keys[k], what);
                    prefetch_bucket = 500;
                }
}

/* At stages 0/1 overlap_comm reduces a bucket when its last gradient is
   released in the boundary micro-step: acquiring one of its gradients again
   is DSM_ERR_STATE (naming the parameter), and the step still completes. */
static dsm_engine_t engine_on(const char *device, const run_t *r);
static void test_overlap_reacquire(void **state) {
    (void)state;
    for (int stage = 0; stage <= 1; ++stage) {
        run_t r = {stage, 1, 1, 1, ADAMW, "", 0};
        zero_extra = ", \"overlap_comm\": true";
        dsm_engine_t e = engine_on("host", &r);
        zero_extra = "";
        void *buf;
        for (int i = F - 1; i >= 0; --i) {
            ASSERT_OK(dsm_engine_grad_acquire(e, i, &buf));
            ASSERT_OK(dsm_engine_grad_release(e, i));
        }
        assert_int_equal(dsm_engine_grad_acquire(e, 0, &buf), DSM_ERR_STATE);
        assert_non_null(strstr(dsm_last_error(), "acquired again after its bucket's reduction started"));
        ASSERT_OK(dsm_step(e, NULL));
        ASSERT_OK(dsm_engine_free(&e));
    }
}

/* Bad values of the knobs overlap_comm honours fail dsm_engine_init on every
   rank, naming the key and the value. */
static void test_overlap_bad_config(void **state) {
    (void)state;
    const char *keys[] = {"stage3_prefetch_bucket_size", "stage3_max_live_parameters", "stage3_max_reuse_distance",
                          "allgather_bucket_size", "overlap_comm"};
    for (int k = 0; k < 5; ++k) {
        char cfg[512], want[128];
        snprintf(cfg, sizeof cfg,
                 "{\"train_micro_batch_size_per_gpu\": 1, \"zero_optimization\": {\"stage\": 3, \"%s\": %s},"
                 " \"optimizer\": {\"type\": \"AdamW\"}}",
                 keys[k], k == 4 ? "\"yes\"" : "-5");
        snprintf(want, sizeof want, "zero_optimization.%s: expected", keys[k]);
        dsm_param_desc_t d[NPARAMS];
        describe_params(d, NULL);
        dsm_engine_t e = NULL;
        assert_int_equal(dsm_engine_init_comm(MPI_COMM_WORLD, cfg, d, NPARAMS, &e), DSM_ERR_CONFIG);
        assert_null(e);
        const char *msg = dsm_last_error();
        if (!strstr(msg, want) || !strstr(msg, k == 4 ? "got \"yes\"" : "got -5"))
            fail_msg("%s: the error does not name the key and the value: %s", keys[k], msg);
    }
}

/* An engine on `device` for run r (every rank a data-parallel rank). */
static dsm_engine_t engine_on(const char *device, const run_t *r) {
    char cfg[2048];
    make_config(cfg, sizeof cfg, r, r->mb);
    dsm_param_desc_t d[NPARAMS];
    describe_params(d, NULL);
    dsm_engine_t e = NULL;
    setenv("DSM_ENGINE_DEVICE", device, 1);
    ASSERT_OK(dsm_engine_init_comm(MPI_COMM_WORLD, cfg, d, NPARAMS, &e));
    unsetenv("DSM_ENGINE_DEVICE");
    return e;
}

static void steps(dsm_engine_t e, const run_t *r, int first, int count) {
    const int global_mb = r->mb * test_size;
    for (int m = first; m < first + count; ++m) {
        micro_step(e, (unsigned)(m * global_mb + test_rank * r->mb), r->mb, 1.0f, 0);
        ASSERT_OK(dsm_step(e, NULL));
    }
}

/* A checkpoint written by the device-resident engine loads into the host
   engine and the reverse: the same parameters, and the same bits after one
   more step (the optimizer state came along). */
static void test_device_checkpoint(void **state) {
    (void)state;
    char dir[64] = "/tmp/dsm-test-device-XXXXXX";
    if (test_rank == 0 && mkdtemp(dir) == NULL) fail_msg("mkdtemp failed");
    MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    const char *pairs[2][2] = {{"sim", "host"}, {"host", "sim"}};
    for (int stage = 0; stage <= 3; stage += 3)
        for (int k = 0; k < 2; ++k) {
            run_t r = {stage, 1, 2, 0, ADAMW, ", \"bf16\": {\"enabled\": true}", 0};
            dsm_engine_t a = engine_on(pairs[k][0], &r);
            steps(a, &r, 0, 3);
            const dsm_status_t st = dsm_engine_save_checkpoint(a, dir, "cross", NULL, 0);
            if (st == DSM_ERR_NOT_SUPPORTED) {
                ASSERT_OK(dsm_engine_free(&a));
                skip();
            }
            ASSERT_OK(st);
            dsm_engine_t b = engine_on(pairs[k][1], &r);
            ASSERT_OK(dsm_engine_load_checkpoint(b, dir, "cross", 0, NULL, NULL));
            float pa[TOTAL], pb[TOTAL];
            read_all(a, pa);
            read_all(b, pb);
            assert_memory_equal(pa, pb, sizeof pa);
            steps(a, &r, 3, 1);
            steps(b, &r, 3, 1);
            read_all(a, pa);
            read_all(b, pb);
            if (memcmp(pa, pb, sizeof pa) != 0)
                fail_msg("stage %d: saved on %s, loaded on %s: the next step differs", stage, pairs[k][0],
                         pairs[k][1]);
            ASSERT_OK(dsm_engine_free(&a));
            ASSERT_OK(dsm_engine_free(&b));
        }
    MPI_Barrier(MPI_COMM_WORLD);
    if (test_rank == 0) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        assert_int_equal(system(cmd), 0);
    }
}

/* On a real GPU (skipped without one): the device-resident engine on CUDA
   with NCCL against the host engine, within fp32 rounding (NCCL and the
   norm's reduction add in another order). */
static void test_device_cuda(void **state) {
    (void)state;
    run_t r = {0, 2, 2, 3, ADAMW, "", 1};
    char cfg[2048];
    make_config(cfg, sizeof cfg, &r, r.mb);
    dsm_param_desc_t d[NPARAMS];
    describe_params(d, NULL);
    dsm_engine_t e = NULL;
    setenv("DSM_ENGINE_DEVICE", "cuda", 1);
    const dsm_status_t st = dsm_engine_init_comm(MPI_COMM_WORLD, cfg, d, NPARAMS, &e);
    unsetenv("DSM_ENGINE_DEVICE");
    if (st == DSM_ERR_NOT_SUPPORTED) skip(); /* no GPU (the same status on every rank) */
    ASSERT_OK(st);
    ASSERT_OK(dsm_engine_free(&e));
    for (int stage = 0; stage <= 3; ++stage)
        for (int p = 0; p < 2; ++p) {
            run_t q = {stage, 2, 2, 3, ADAMW, p ? ", \"bf16\": {\"enabled\": true}" : "", stage % 2};
            float host[TOTAL], gpu[TOTAL];
            train_on("host", NULL, &q, test_size, test_rank, 1, host, NULL);
            train_on("cuda", NULL, &q, test_size, test_rank, 1, gpu, NULL);
            char what[96];
            snprintf(what, sizeof what, "cuda, stage %d%s", stage, p ? ", bf16" : "");
            compare(gpu, host, p ? 2e-2 : 2e-5, what);
        }
    if (test_size % 2 == 0) { /* NCCL communicators split per mesh dimension */
        const int sp = 2, dp = test_size / sp;
        int dp_rank;
        dsm_mesh_t mesh = dp_sp_mesh(dp, sp, &dp_rank);
        for (int stage = 1; stage <= 3; stage += 2) {
            run_t q = {stage, 2, 2, 3, ADAMW, "", 1};
            float host[TOTAL], gpu[TOTAL];
            train_on("host", mesh, &q, dp, dp_rank, sp, host, NULL);
            train_on("cuda", mesh, &q, dp, dp_rank, sp, gpu, NULL);
            char what[96];
            snprintf(what, sizeof what, "cuda, dp %d x sp %d, stage %d", dp, sp, stage);
            compare(gpu, host, 2e-5, what);
        }
        ASSERT_OK(dsm_mesh_free(&mesh));
    }
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stages),       cmocka_unit_test(test_optimizers),
        cmocka_unit_test(test_precision),    cmocka_unit_test(test_allreduce_semantics),
        cmocka_unit_test(test_overflow_skip), cmocka_unit_test(test_counters),
        cmocka_unit_test(test_schedule_resumed), cmocka_unit_test(test_f32_helpers),
        cmocka_unit_test(test_init_paths),   cmocka_unit_test(test_dp_sp_mesh),
        cmocka_unit_test(test_describe),     cmocka_unit_test(test_offload),
        cmocka_unit_test(test_grad_in_place), cmocka_unit_test(test_one_rank_grads),
        cmocka_unit_test(test_device_bit_exact), cmocka_unit_test(test_device_checkpoint),
        cmocka_unit_test(test_device_cuda),  cmocka_unit_test(test_overlap_bits),
        cmocka_unit_test(test_overlap_reacquire), cmocka_unit_test(test_overlap_bad_config),
    };
    return RUN_MPI_TESTS("test_engine", tests);
}
