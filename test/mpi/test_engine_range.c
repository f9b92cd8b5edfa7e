/*
 * Element ranges of parameters and gradients (dsm_engine_param_acquire_range
 * and the others) on a model that stacks its layers: W of L x R x C (every
 * layer's weights in one tensor), b of L x C, and a small whole parameter e.
 *
 * - bits: a run that acquires and releases W and b one layer's slice at a
 *   time (forward in layer order, backward in reverse) gives the parameter
 *   bits of a run that acquires them whole with the same gradients, at
 *   ZeRO stages 0-3, fp32 and bf16, with and without overlap_comm, with two
 *   micro-steps per step, on the host and the simulated device; the values
 *   of every range are those of the whole parameter. The gradients are
 *   multiples of 1/16 that sum exactly in any order, so the reductions give
 *   the same bits whatever the packing.
 * - peak: ZeRO-3, the stacked model, reduce_bucket_size one layer: the
 *   high-water mark of this rank's memory (dsm_engine_describe) during
 *   training by slices is at most the memory after creation (the
 *   partitions, the bucket) plus two layers' slices (the parameter slice and
 *   the gradient slice of the layer being differentiated); acquired whole,
 *   the peak holds the whole tensors (on one rank the parameter is read in
 *   place and the gradient is the gradient partition's own elements, so
 *   neither is held).
 * - errors: a range outside the parameter, a count < 1, a negative offset,
 *   a NULL output on some ranks: under ZeRO-3 (collective) every rank gets
 *   the error and the engine stays usable; at stages 0-2 the bad ranks get
 *   it. Ranks acquiring different ranges: DSM_ERR_MISMATCH on every rank. A
 *   release of a range that is not acquired, the same range twice, a
 *   gradient range of a frozen parameter, dsm_step with a range held on one
 *   rank: the statuses the header documents, no hang.
 * - dsm_engine_init_comm_with_options: DSM_DEVICE_HOST over a communicator;
 *   a bad options struct on one rank fails every rank.
 */
#include "dsm_config.h"

#include <stdlib.h>

#include "mpi_test.h"
#include "engine_memory.h"

#define L 4
#define R 24
#define C 40
#define SLICE (R * C)
#define NP 4 /* W, b, e, frozen f */
static const int64_t shape_W[3] = {L, R, C}, shape_b[2] = {L, C}, shape_e[1] = {C}, shape_f[1] = {8};
static const char *names[NP] = {"W", "b", "e", "f"};
static const int64_t numel[NP] = {L * SLICE, L * C, C, 8};

static int init_fn(void *user, int index, const char *name, int64_t offset, int64_t count, float *values) {
    (void)user;
    (void)name;
    for (int64_t i = 0; i < count; ++i) values[i] = 0.5f * test_hashf(3u + (unsigned)index, (unsigned)(offset + i));
    return 0;
}

static void params(dsm_param_desc_t d[NP]) {
    memset(d, 0, NP * sizeof d[0]);
    const int64_t *shapes[NP] = {shape_W, shape_b, shape_e, shape_f};
    const int nd[NP] = {3, 2, 1, 1};
    for (int i = 0; i < NP; ++i) {
        d[i].name = names[i];
        d[i].ndims = nd[i];
        d[i].shape = shapes[i];
        d[i].dtype = DSM_FLOAT32;
        d[i].trainable = i != 3;
        d[i].no_weight_decay = i == 1;
        d[i].init_fn = init_fn;
    }
}

static void make_config(char *buf, size_t len, int stage, int bf16, int overlap, int gas, int bucket) {
    snprintf(buf, len,
             "{\"train_micro_batch_size_per_gpu\": 1, \"gradient_accumulation_steps\": %d, %s"
             " \"steps_per_print\": 1000000, \"gradient_clipping\": 1.0,"
             " \"zero_optimization\": {\"stage\": %d, \"overlap_comm\": %s, \"reduce_bucket_size\": %d,"
             " \"stage3_param_persistence_threshold\": 0, \"stage3_prefetch_bucket_size\": 0},"
             " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.1}}}",
             gas, bf16 ? "\"bf16\": {\"enabled\": true}," : "", stage, overlap ? "true" : "false", bucket);
}

static dsm_engine_t make_engine(const char *cfg, dsm_device_t device) {
    dsm_param_desc_t d[NP];
    params(d);
    dsm_engine_options_t o = DSM_ENGINE_OPTIONS_INITIALIZER;
    o.device = device;
    dsm_engine_t e = NULL;
    ASSERT_OK(dsm_engine_init_comm_with_options(MPI_COMM_WORLD, cfg, d, NP, &o, &e));
    return e;
}

/* The gradient of element j of parameter i: a multiple of 1/16 in
   [-2, 2], so that every sum over ranks and micro-steps is exact. */
static float grad_of(int i, int64_t j, int s, int k) {
    const float h = test_hashf((unsigned)(i * 977 + test_rank * 131 + s * 7 + k), (unsigned)j);
    return (float)(int)(h * 32.0f) / 16.0f;
}

/* Add the gradients of elements [off, off + n) of parameter i into `grad`. */
static void add_grad(dsm_engine_t e, void *grad, int i, int64_t off, int64_t n, int s, int k) {
    float *tmp = malloc((size_t)n * sizeof(float));
    engine_read_f32(e, grad, tmp, (size_t)n);
    for (int64_t j = 0; j < n; ++j) tmp[j] += grad_of(i, off + j, s, k);
    engine_write_f32(e, grad, tmp, (size_t)n);
    free(tmp);
}

/* Check that the range [off, off + n) of parameter i has `whole`'s values. */
static void check_values(dsm_engine_t e, const void *p, int i, int64_t off, int64_t n, const float *whole) {
    float *tmp = malloc((size_t)n * sizeof(float));
    engine_read_f32(e, p, tmp, (size_t)n);
    if (memcmp(tmp, whole + off, (size_t)n * sizeof(float)) != 0)
        fail_msg("parameter '%s' range %lld+%lld differs from the whole parameter's values", names[i],
                 (long long)off, (long long)n);
    free(tmp);
}

/* The slice of layer l of a stacked parameter (W or b): offset and count. */
static int64_t slice_len(int i) { return i == 0 ? SLICE : C; }

/* Train `steps` steps; by slices (ranges) or whole; out: W, b, e (fp32).
   Without `out`, no whole parameter is read (test_peak). */
static void train(dsm_engine_t e, int by_range, int steps, int gas, float *out[3]) {
    static float whole[3][L * SLICE];
    for (int s = 0; s < steps; ++s)
        for (int k = 0; k < gas; ++k) {
            /* The whole values (to compare the ranges with), read by the f32 call. */
            if (out)
                for (int i = 0; i < 3; ++i) ASSERT_OK(dsm_engine_param_read_f32(e, i, whole[i], numel[i]));
            /* forward */
            for (int l = 0; l < L; ++l)
                for (int i = 0; i < 2; ++i) {
                    const void *p = NULL;
                    if (by_range) {
                        ASSERT_OK(dsm_engine_param_acquire_range(e, i, l * slice_len(i), slice_len(i), &p));
                        if (out) check_values(e, p, i, l * slice_len(i), slice_len(i), whole[i]);
                        ASSERT_OK(dsm_engine_param_release_range(e, i, l * slice_len(i), slice_len(i)));
                    } else if (l == 0) {
                        ASSERT_OK(dsm_engine_param_acquire(e, i, &p));
                        if (out) check_values(e, p, i, 0, numel[i], whole[i]);
                        ASSERT_OK(dsm_engine_param_release(e, i));
                    }
                }
            /* backward: e first, then the layers in reverse */
            void *g = NULL;
            ASSERT_OK(dsm_engine_grad_acquire(e, 2, &g));
            add_grad(e, g, 2, 0, C, s, k);
            ASSERT_OK(dsm_engine_grad_release(e, 2));
            if (by_range) {
                for (int l = L - 1; l >= 0; --l)
                    for (int i = 0; i < 2; ++i) {
                        const int64_t off = l * slice_len(i), n = slice_len(i);
                        const void *p = NULL;
                        ASSERT_OK(dsm_engine_param_acquire_range(e, i, off, n, &p));
                        ASSERT_OK(dsm_engine_grad_acquire_range(e, i, off, n, &g));
                        add_grad(e, g, i, off, n, s, k);
                        ASSERT_OK(dsm_engine_grad_release_range(e, i, off, n));
                        ASSERT_OK(dsm_engine_param_release_range(e, i, off, n));
                    }
            } else {
                for (int i = 0; i < 2; ++i) {
                    const void *p = NULL;
                    ASSERT_OK(dsm_engine_param_acquire(e, i, &p));
                    ASSERT_OK(dsm_engine_grad_acquire(e, i, &g));
                    add_grad(e, g, i, 0, numel[i], s, k);
                    ASSERT_OK(dsm_engine_grad_release(e, i));
                    ASSERT_OK(dsm_engine_param_release(e, i));
                }
            }
            ASSERT_OK(dsm_step(e, NULL));
        }
    if (out)
        for (int i = 0; i < 3; ++i) ASSERT_OK(dsm_engine_param_read_f32(e, i, out[i], numel[i]));
}

static void test_bits(void **state) {
    (void)state;
    static float a[3][L * SLICE], b[3][L * SLICE];
    float *pa[3] = {a[0], a[1], a[2]}, *pb[3] = {b[0], b[1], b[2]};
    const dsm_device_t devices[2] = {DSM_DEVICE_HOST, DSM_DEVICE_SIMULATED};
    for (int dev = 0; dev < 2; ++dev)
        for (int stage = 0; stage <= 3; ++stage)
            for (int v = 0; v < 3; ++v) {
                /* v: 0 fp32, 1 bf16, 2 fp32 with overlap_comm; the simulated device: fp32 only */
                if (dev == 1 && v != 0) continue;
                const int bf16 = v == 1, overlap = v == 2, gas = 2;
                char cfg[1024];
                make_config(cfg, sizeof cfg, stage, bf16, overlap, gas, SLICE + C);
                dsm_engine_t whole = make_engine(cfg, devices[dev]), sliced = make_engine(cfg, devices[dev]);
                train(whole, 0, 2, gas, pa);
                train(sliced, 1, 2, gas, pb);
                for (int i = 0; i < 3; ++i)
                    if (memcmp(a[i], b[i], (size_t)numel[i] * sizeof(float)) != 0)
                        fail_msg("%s, stage %d, %s%s: parameter '%s' trained by slices differs from whole",
                                 dev ? "simulated" : "host", stage, bf16 ? "bf16" : "fp32",
                                 overlap ? ", overlap_comm" : "", names[i]);
                ASSERT_OK(dsm_engine_free(&sliced));
                ASSERT_OK(dsm_engine_free(&whole));
            }
}

/* This rank's bytes of every kind (host, device, shared) in the "rank_bytes_<what>" object. */
static unsigned long long rank_bytes(dsm_engine_t e, const char *what) {
    char *text = NULL, key[64];
    ASSERT_OK(dsm_engine_describe(e, DSM_FORMAT_JSON, &text));
    snprintf(key, sizeof key, "\"rank_bytes_%s\":", what);
    const char *o = strstr(text, key);
    assert_non_null(o);
    unsigned long long sum = 0;
    const char *kinds[3] = {"\"host\":", "\"device\":", "\"shared\":"};
    for (int k = 0; k < 3; ++k) {
        const char *p = strstr(o, kinds[k]);
        assert_non_null(p);
        sum += strtoull(p + strlen(kinds[k]), NULL, 10);
    }
    dsm_free(text);
    ASSERT_OK(dsm_engine_describe(e, DSM_FORMAT_TEXT, &text));
    assert_non_null(strstr(text, "peak since the engine's creation"));
    dsm_free(text);
    return sum;
}

static void test_peak(void **state) {
    (void)state;
    char cfg[1024];
    make_config(cfg, sizeof cfg, 3, 0, 0, 1, SLICE + C);
    const unsigned long long layer = (unsigned long long)(SLICE + C) * sizeof(float);
    unsigned long long peak_slices = 0, peak_whole = 0;
    for (int by_range = 1; by_range >= 0; --by_range) {
        dsm_engine_t e = make_engine(cfg, DSM_DEVICE_HOST);
        const unsigned long long base = rank_bytes(e, "now");
        assert_true(rank_bytes(e, "peak") == base); /* the peaks start at the engine's memory */
        train(e, by_range, 2, 1, NULL);
        const unsigned long long peak = rank_bytes(e, "peak");
        /* Each buffer is rounded up to 64 bytes: four buffers (two slices of W, two of b). */
        if (by_range) {
            peak_slices = peak - base;
            if (peak - base > 2 * layer + 4 * 64)
                fail_msg("ZeRO-3 by slices: peak %llu bytes is more than the %llu after creation plus two layers' "
                         "slices (%llu bytes)", peak, base, 2 * layer);
        } else {
            peak_whole = peak - base;
        }
        ASSERT_OK(dsm_engine_free(&e));
    }
    /* Whole, the peak holds W and its gradient whole; on one rank ZeRO-3
       reads the parameter partition in place, and each gradient (one
       micro-step per window) is the gradient partition's own elements:
       neither is held, by slices or whole. */
    const unsigned long long whole_w = (unsigned long long)L * SLICE * sizeof(float);
    if (test_size > 1) {
        assert_true(peak_whole >= 2 * whole_w);
    } else if (peak_whole != 0 || peak_slices != 0) {
        fail_msg("ZeRO-3 on one rank: peak %llu bytes (whole), %llu bytes (by slices) above the memory after "
                 "creation; expected none (parameters read in place, gradients the partition's "
                 "own)", peak_whole, peak_slices);
    }
    if (test_rank == 0)
        printf("stacked ZeRO-3, %d ranks, layer slice %llu bytes: peak above the engine's memory after creation "
               "%llu bytes by slices, %llu bytes whole\n",
               test_size, layer, peak_slices, peak_whole);
}

/* Odd ranks (or the last rank with one rank) are the bad ones. */
static int bad_rank(void) { return test_size == 1 ? 1 : test_rank % 2 == 1; }

static void test_errors(void **state) {
    (void)state;
    for (int stage = 0; stage <= 3; ++stage) {
        char cfg[1024];
        make_config(cfg, sizeof cfg, stage, 0, 0, 1, SLICE + C);
        dsm_engine_t e = make_engine(cfg, DSM_DEVICE_HOST);
        const int collective = stage == 3;
        const void *p = NULL;
        void *g = NULL;
        /* Bad ranges on some ranks. */
        const int64_t bad[4][2] = {{L * SLICE, 1}, {0, 0}, {-1, 4}, {SLICE, L * SLICE}};
        for (int k = 0; k < 4; ++k) {
            const int64_t off = bad_rank() ? bad[k][0] : 0, n = bad_rank() ? bad[k][1] : SLICE;
            const dsm_status_t st = dsm_engine_param_acquire_range(e, 0, off, n, &p);
            if (bad_rank() || collective) {
                ASSERT_FAILS(st, DSM_ERR_INVALID_ARGUMENT, "is not inside parameter 'W'");
                assert_null(p);
            } else {
                assert_int_equal(st, DSM_SUCCESS);
                ASSERT_OK(dsm_engine_param_release_range(e, 0, 0, SLICE));
            }
            if (bad_rank())
                ASSERT_FAILS(dsm_engine_grad_acquire_range(e, 0, off, n, &g), DSM_ERR_INVALID_ARGUMENT,
                             "is not inside parameter 'W'");
        }
        /* A NULL output on some ranks. */
        {
            const dsm_status_t st = dsm_engine_param_acquire_range(e, 1, 0, C, bad_rank() ? NULL : &p);
            if (bad_rank() || collective)
                ASSERT_FAILS(st, DSM_ERR_NULL_POINTER, "values");
            else {
                assert_int_equal(st, DSM_SUCCESS);
                ASSERT_OK(dsm_engine_param_release_range(e, 1, 0, C));
            }
            ASSERT_FAILS(dsm_engine_grad_acquire_range(e, 1, 0, C, NULL), DSM_ERR_NULL_POINTER, "grad");
        }
        /* Different valid ranges on the ranks of a collective acquire. */
        if (collective && test_size > 1) {
            const int64_t off = bad_rank() ? SLICE : 0;
            ASSERT_FAILS(dsm_engine_param_acquire_range(e, 0, off, SLICE, &p), DSM_ERR_MISMATCH, "disagree");
        }
        /* The engine is still usable: a good range on every rank. */
        ASSERT_OK(dsm_engine_param_acquire_range(e, 0, SLICE, SLICE, &p));
        /* The same range twice; the release of a range not acquired. */
        ASSERT_FAILS(dsm_engine_param_acquire_range(e, 0, SLICE, SLICE, &p), DSM_ERR_STATE, "already acquired");
        ASSERT_FAILS(dsm_engine_param_release_range(e, 0, 0, SLICE), DSM_ERR_STATE, "is not acquired");
        ASSERT_OK(dsm_engine_param_release_range(e, 0, SLICE, SLICE));
        ASSERT_FAILS(dsm_engine_param_release_range(e, 0, SLICE, SLICE), DSM_ERR_STATE, "is not acquired");
        ASSERT_FAILS(dsm_engine_grad_release_range(e, 0, 0, SLICE), DSM_ERR_STATE, "is not acquired");
        /* Bad indices; a frozen parameter has no gradient, its values have ranges. */
        ASSERT_FAILS(dsm_engine_param_acquire_range(e, NP, 0, 1, &p), DSM_ERR_INVALID_ARGUMENT, "out of range");
        ASSERT_FAILS(dsm_engine_grad_acquire_range(e, 3, 0, 4, &g), DSM_ERR_INVALID_ARGUMENT, "frozen");
        ASSERT_OK(dsm_engine_param_acquire_range(e, 3, 2, 4, &p));
        ASSERT_OK(dsm_engine_param_release_range(e, 3, 2, 4));
        ASSERT_FAILS(dsm_engine_param_acquire_range(e, 3, 6, 4, &p), DSM_ERR_INVALID_ARGUMENT,
                     "is not inside parameter 'f'");
        /* A gradient range held at dsm_step on one rank: every rank fails. */
        ASSERT_OK(dsm_engine_grad_acquire_range(e, 1, C, C, &g));
        ASSERT_FAILS(dsm_engine_grad_acquire_range(e, 1, C, C, &g), DSM_ERR_STATE, "already acquired");
        if (!bad_rank()) ASSERT_OK(dsm_engine_grad_release_range(e, 1, C, C));
        if (test_size > 1) {
            ASSERT_FAILS(dsm_step(e, NULL), DSM_ERR_STATE, "gradient range 40+40 of 'b' is still acquired");
        } else {
            ASSERT_FAILS(dsm_step(e, NULL), DSM_ERR_STATE, "is still acquired");
        }
        ASSERT_OK(dsm_engine_free(&e));
    }
}

static void test_init_comm_with_options(void **state) {
    (void)state;
    char cfg[1024];
    make_config(cfg, sizeof cfg, 2, 0, 0, 1, SLICE + C);
    dsm_engine_t e = make_engine(cfg, DSM_DEVICE_HOST);
    dsm_device_t d = DSM_DEVICE_DEFAULT;
    ASSERT_OK(dsm_engine_device(e, &d));
    assert_int_equal(d, DSM_DEVICE_HOST);
    ASSERT_OK(dsm_engine_free(&e));
    /* NULL options: the defaults. */
    dsm_param_desc_t pd[NP];
    params(pd);
    ASSERT_OK(dsm_engine_init_comm_with_options(MPI_COMM_WORLD, cfg, pd, NP, NULL, &e));
    ASSERT_OK(dsm_engine_free(&e));
    /* A bad struct on one rank fails every rank. */
    dsm_engine_options_t o = DSM_ENGINE_OPTIONS_INITIALIZER;
    if (test_rank == test_size - 1) o.size = 3;
    ASSERT_FAILS(dsm_engine_init_comm_with_options(MPI_COMM_WORLD, cfg, pd, NP, &o, &e), DSM_ERR_INVALID_ARGUMENT,
                 "options->size is 3");
    assert_null(e);
    ASSERT_FAILS(dsm_engine_init_comm_with_options(MPI_COMM_NULL, cfg, pd, NP, NULL, &e), DSM_ERR_INVALID_ARGUMENT,
                 "MPI_COMM_NULL");
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bits),
        cmocka_unit_test(test_peak),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_init_comm_with_options),
    };
    return RUN_MPI_TESTS("test_engine_range", tests);
}
