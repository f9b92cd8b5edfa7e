/*
 * Engine misuse: every bad argument gets a clear status and a message naming
 * the bad value; misuse on one rank, or that differs across ranks, fails
 * every rank at the next collective point instead of hanging them; after a
 * failed collective call the engine only accepts dsm_engine_free().
 */
#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include "mpi_test.h"
#include "engine_memory.h"

static const int64_t shape_a[2] = {5, 3}, shape_b[1] = {17};

static const char *CFG0 = "{\"train_micro_batch_size_per_gpu\": 1, \"zero_optimization\": {\"stage\": 0},"
                          " \"optimizer\": {\"type\": \"AdamW\"}}";
static const char *CFG2 = "{\"train_micro_batch_size_per_gpu\": 1, \"zero_optimization\": {\"stage\": 2,"
                          " \"reduce_bucket_size\": 8}, \"optimizer\": {\"type\": \"AdamW\"}}";
static const char *CFG3 = "{\"train_micro_batch_size_per_gpu\": 1, \"zero_optimization\": {\"stage\": 3,"
                          " \"stage3_param_persistence_threshold\": 0}, \"optimizer\": {\"type\": \"SGD\"}}";

static void params(dsm_param_desc_t d[3]) {
    memset(d, 0, 3 * sizeof d[0]);
    d[0].name = "a";
    d[0].ndims = 2;
    d[0].shape = shape_a;
    d[0].dtype = DSM_FLOAT32;
    d[0].trainable = 1;
    d[1] = d[0];
    d[1].name = "b";
    d[1].ndims = 1;
    d[1].shape = shape_b;
    d[2] = d[1];
    d[2].name = "frozen";
    d[2].trainable = 0;
}

/* One bad descriptor field on `bad_rank` (-1: every rank) fails every rank. */
static void expect_bad_desc(void (*spoil)(dsm_param_desc_t *), int bad_rank, dsm_status_t status, const char *text) {
    dsm_param_desc_t d[3];
    params(d);
    if (bad_rank < 0 || bad_rank == test_rank) spoil(d);
    dsm_engine_t e = (dsm_engine_t)0x1;
    ASSERT_FAILS(dsm_engine_init_comm(MPI_COMM_WORLD, CFG0, d, 3, &e), status, text);
    assert_null(e);
}

static void no_name(dsm_param_desc_t *d) { d[1].name = NULL; }
static void empty_name(dsm_param_desc_t *d) { d[1].name = ""; }
static void space_name(dsm_param_desc_t *d) { d[1].name = "my weight"; }
static void dup_name(dsm_param_desc_t *d) { d[1].name = "a"; }
static void bad_ndims(dsm_param_desc_t *d) { d[0].ndims = 9; }
static void neg_ndims(dsm_param_desc_t *d) { d[0].ndims = -1; }
static void null_shape(dsm_param_desc_t *d) { d[0].shape = NULL; }
static void zero_dim(dsm_param_desc_t *d) {
    static const int64_t s[2] = {5, 0};
    d[0].shape = s;
}
static void bad_dtype(dsm_param_desc_t *d) { d[0].dtype = DSM_INT32; }
static void bad_trainable(dsm_param_desc_t *d) { d[0].trainable = 2; }
static void bad_decay(dsm_param_desc_t *d) { d[0].no_weight_decay = -1; }
static void other_shape(dsm_param_desc_t *d) {
    static const int64_t s[1] = {18};
    d[1].shape = s;
}
static void other_flag(dsm_param_desc_t *d) { d[1].no_weight_decay = 1; }
static void all_frozen(dsm_param_desc_t *d) { d[0].trainable = d[1].trainable = 0; }

static void test_bad_descriptors(void **state) {
    (void)state;
    const int last = test_size - 1;
    expect_bad_desc(no_name, -1, DSM_ERR_NULL_POINTER, "params[1].name is NULL");
    expect_bad_desc(no_name, last, DSM_ERR_NULL_POINTER, "params[1].name is NULL");
    expect_bad_desc(empty_name, last, DSM_ERR_INVALID_ARGUMENT, "params[1].name ''");
    expect_bad_desc(space_name, last, DSM_ERR_INVALID_ARGUMENT, "'my weight' has a space");
    expect_bad_desc(dup_name, last, DSM_ERR_INVALID_ARGUMENT, "parameter name 'a' is used twice");
    expect_bad_desc(bad_ndims, last, DSM_ERR_INVALID_ARGUMENT, "ndims is 9");
    expect_bad_desc(neg_ndims, last, DSM_ERR_INVALID_ARGUMENT, "ndims is -1");
    expect_bad_desc(null_shape, last, DSM_ERR_NULL_POINTER, "shape is NULL");
    expect_bad_desc(zero_dim, last, DSM_ERR_INVALID_ARGUMENT, "shape[1] is 0");
    expect_bad_desc(bad_dtype, last, DSM_ERR_INVALID_ARGUMENT, "dtype 6");
    expect_bad_desc(bad_trainable, last, DSM_ERR_INVALID_ARGUMENT, "trainable is 2");
    expect_bad_desc(bad_decay, last, DSM_ERR_INVALID_ARGUMENT, "no_weight_decay is -1");
    expect_bad_desc(all_frozen, -1, DSM_ERR_INVALID_ARGUMENT, "every parameter is frozen (trainable = 0 in all 3)");
    /* DSM_PARAM_DESC_INITIALIZER: trainable, fp32, decay, nothing else set. */
    const dsm_param_desc_t init = DSM_PARAM_DESC_INITIALIZER;
    assert_int_equal(init.trainable, 1);
    assert_int_equal(init.dtype, DSM_FLOAT32);
    assert_int_equal(init.no_weight_decay, 0);
    assert_int_equal(init.ndims, 0);
    assert_null(init.name);
    assert_null(init.init_values);
    assert_null(init.init_fn);
    if (test_size > 1) {
        expect_bad_desc(other_shape, last, DSM_ERR_MISMATCH, "b[18]");
        expect_bad_desc(other_flag, last, DSM_ERR_MISMATCH, "no_decay");
    }
}

static void test_bad_arguments(void **state) {
    (void)state;
    dsm_param_desc_t d[3];
    params(d);
    dsm_engine_t e = NULL;
    ASSERT_FAILS(dsm_engine_init_comm(MPI_COMM_WORLD, CFG0, d, 3, NULL), DSM_ERR_NULL_POINTER, "engine (the output) is NULL");
    ASSERT_FAILS(dsm_engine_init_comm(MPI_COMM_WORLD, NULL, d, 3, &e), DSM_ERR_NULL_POINTER, "config is NULL");
    ASSERT_FAILS(dsm_engine_init_comm(MPI_COMM_WORLD, CFG0, NULL, 3, &e), DSM_ERR_NULL_POINTER, "params is NULL");
    ASSERT_FAILS(dsm_engine_init_comm(MPI_COMM_WORLD, CFG0, d, 0, &e), DSM_ERR_INVALID_ARGUMENT, "nparams is 0");
    /* A bad DSM_NUM_THREADS, on every rank or on the last one only: every rank fails, naming it. */
    const char *bad_threads[] = {"0", "-2", "four", "3x", ""};
    for (size_t k = 0; k < sizeof bad_threads / sizeof bad_threads[0]; ++k) {
        const int here = k < 4 || test_rank == test_size - 1;
        if (k == 4) setenv("DSM_NUM_THREADS", test_rank == test_size - 1 ? "many" : "1", 1);
        else if (here) setenv("DSM_NUM_THREADS", bad_threads[k], 1);
        char want[64];
        snprintf(want, sizeof want, "DSM_NUM_THREADS=\"%s\"", k == 4 ? "many" : bad_threads[k]);
        ASSERT_FAILS(dsm_engine_init_comm(MPI_COMM_WORLD, CFG0, d, 3, &e), DSM_ERR_INVALID_ARGUMENT, want);
        unsetenv("DSM_NUM_THREADS");
    }
    setenv("DSM_NUM_THREADS", "2", 1);
    ASSERT_OK(dsm_engine_init_comm(MPI_COMM_WORLD, CFG0, d, 3, &e));
    ASSERT_OK(dsm_engine_free(&e));
    unsetenv("DSM_NUM_THREADS");
    /* A bad DSM_SIMD, on every rank or on the last one only: every rank fails, naming the value and the
     * accepted ones. A set this CPU may lack is no error (DSM_SIMD caps the choice), nor is the case. */
    for (int k = 0; k < 2; ++k) {
        if (k == 0 || test_rank == test_size - 1) setenv("DSM_SIMD", "sse9", 1);
        ASSERT_FAILS(dsm_engine_init_comm(MPI_COMM_WORLD, CFG0, d, 3, &e), DSM_ERR_INVALID_ARGUMENT,
                     "DSM_SIMD=\"sse9\"");
        assert_non_null(strstr(dsm_last_error(), "one of auto, avx512, avx2, generic"));
        assert_null(e);
        unsetenv("DSM_SIMD");
    }
    setenv("DSM_SIMD", "AVX512", 1);
    ASSERT_OK(dsm_engine_init_comm(MPI_COMM_WORLD, CFG0, d, 3, &e));
    ASSERT_OK(dsm_engine_free(&e));
    unsetenv("DSM_SIMD");
    /* only the last rank passes a bad count: all fail */
    ASSERT_FAILS(dsm_engine_init_comm(MPI_COMM_WORLD, CFG0, d, test_rank == test_size - 1 ? -3 : 3, &e),
                 DSM_ERR_INVALID_ARGUMENT, "nparams is -3");
    ASSERT_FAILS(dsm_engine_init_comm(MPI_COMM_NULL, CFG0, d, 3, &e), DSM_ERR_INVALID_ARGUMENT,
                 "MPI_COMM_NULL");
    ASSERT_FAILS(dsm_engine_init_comm(MPI_COMM_WORLD, "{\"train_micro_batch_size_per_gpu\": 1}", d, 3, &e), DSM_ERR_CONFIG,
                 "optimizer");
    ASSERT_FAILS(dsm_engine_init_comm(MPI_COMM_WORLD, "/nonexistent/ds_config.json", d, 3, &e), DSM_ERR_IO, "nonexistent");
    assert_null(e);
    ASSERT_FAILS(dsm_engine_free(NULL), DSM_SUCCESS, "");
    ASSERT_FAILS(dsm_engine_num_params(NULL, NULL), DSM_ERR_NULL_POINTER, "engine is NULL");
    ASSERT_FAILS(dsm_step(NULL, NULL), DSM_ERR_NULL_POINTER, "engine is NULL");
    ASSERT_FAILS(dsm_convert(shape_a, DSM_INT64, d, DSM_FLOAT32, 1), DSM_ERR_INVALID_ARGUMENT, "7");
    /* The dtypes are checked even when there is nothing to convert. */
    ASSERT_FAILS(dsm_convert(NULL, DSM_FLOAT32, NULL, DSM_INT32, 0), DSM_ERR_INVALID_ARGUMENT, "6");
    ASSERT_FAILS(dsm_convert(NULL, DSM_FLOAT32, NULL, DSM_BFLOAT16, 0), DSM_SUCCESS, "");
    /* dsm_engine_init on a mesh names itself in its messages; a NULL mesh is an error (no implicit world). */
    dsm_mesh_t world = NULL;
    ASSERT_OK(dsm_mesh_create_for_config(MPI_COMM_WORLD, CFG0, &world));
    int ndims = 0;
    ASSERT_OK(dsm_mesh_ndims(world, &ndims));
    assert_int_equal(ndims, 1);
    ASSERT_FAILS(dsm_engine_init(world, "/nonexistent/ds_config.json", d, 3, &e), DSM_ERR_IO, "dsm_engine_init:");
    ASSERT_FAILS(dsm_engine_init(NULL, CFG0, d, 3, &e), DSM_ERR_NULL_POINTER, "mesh is NULL");
    assert_null(e);
    ASSERT_FAILS(dsm_engine_init(world, CFG0, d, 3, NULL), DSM_ERR_NULL_POINTER, "engine (the output) is NULL");
    ASSERT_FAILS(dsm_engine_init(world, NULL, d, 3, &e), DSM_ERR_NULL_POINTER, "config is NULL");
    ASSERT_FAILS(dsm_engine_init(world, CFG0, NULL, 3, &e), DSM_ERR_NULL_POINTER, "params is NULL");
    ASSERT_OK(dsm_engine_init(world, CFG0, d, 3, &e));
    ASSERT_OK(dsm_engine_free(&e));
    ASSERT_OK(dsm_mesh_free(&world));
    /* The explicit world mesh's own bad arguments, on every rank or one. */
    ASSERT_FAILS(dsm_mesh_create_for_config(MPI_COMM_WORLD, CFG0, NULL), DSM_ERR_NULL_POINTER, "mesh");
    ASSERT_FAILS(dsm_mesh_create_for_config(MPI_COMM_WORLD, NULL, &world), DSM_ERR_NULL_POINTER, "config is NULL");
    assert_null(world);
    ASSERT_FAILS(dsm_mesh_create_for_config(MPI_COMM_WORLD, test_rank == test_size - 1 ? NULL : CFG0, &world),
                 DSM_ERR_NULL_POINTER, "config is NULL");
    ASSERT_FAILS(dsm_mesh_create_for_config(MPI_COMM_NULL, CFG0, &world), DSM_ERR_INVALID_ARGUMENT, "MPI_COMM_NULL");
    ASSERT_FAILS(dsm_mesh_create_for_config(MPI_COMM_WORLD, "/nonexistent/ds_config.json", &world), DSM_ERR_IO,
                 "nonexistent");
    ASSERT_FAILS(dsm_mesh_create_for_config(MPI_COMM_WORLD, "{\"train_batch_size\": \"x\"}", &world),
                 DSM_ERR_CONFIG, "train_batch_size");
    assert_null(world);
    /* sequence_parallel_size makes it data_parallel x sequence_parallel. */
    if (test_size % 2 == 0) {
        char sp_cfg[128];
        snprintf(sp_cfg, sizeof sp_cfg, "{\"train_batch_size\": %d, \"sequence_parallel_size\": 2}", test_size / 2);
        ASSERT_OK(dsm_mesh_create_for_config(MPI_COMM_WORLD, sp_cfg, &world));
        int shape[2] = {0, 0};
        ASSERT_OK(dsm_mesh_ndims(world, &ndims));
        assert_int_equal(ndims, 2);
        ASSERT_OK(dsm_mesh_shape(world, 2, shape));
        assert_int_equal(shape[0], test_size / 2);
        assert_int_equal(shape[1], 2);
        ASSERT_OK(dsm_mesh_free(&world));
    }
    ASSERT_FAILS(dsm_engine_init_comm(MPI_COMM_WORLD, "/nonexistent/ds_config.json", d, 3, &e), DSM_ERR_IO,
                 "dsm_engine_init_comm:");
}

/*
 * ZeRO-Offload's refusals, on every rank: parameter offload below stage 3;
 * offload without a usable CUDA device (on a machine with one it works and
 * the engine says where its copies are); a device present on one rank only
 * (the simulation on rank 0); a bad DSM_SIM_DEVICE_MEMORY.
 */
static void test_offload_errors(void **state) {
    (void)state;
    dsm_param_desc_t d[3];
    params(d);
    dsm_engine_t e = NULL;
    const char *opt = "{\"train_micro_batch_size_per_gpu\": 1, \"optimizer\": {\"type\": \"AdamW\"},"
                      " \"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\"}}}";
    const char *par = "{\"train_micro_batch_size_per_gpu\": 1, \"optimizer\": {\"type\": \"AdamW\"},"
                      " \"zero_optimization\": {\"stage\": 2, \"offload_param\": {\"device\": \"cpu\"}}}";
    unsetenv("DSM_SIM_DEVICE_MEMORY");
    ASSERT_FAILS(dsm_engine_init_comm(MPI_COMM_WORLD, par, d, 3, &e), DSM_ERR_CONFIG,
                 "offload_param.device \"cpu\": offloading parameters needs ZeRO stage 3, stage is 2");
    int have_cuda = 0;
    dsm_status_t st = dsm_engine_init_comm(MPI_COMM_WORLD, opt, d, 3, &e);
    if (st == DSM_SUCCESS) {
        /* A GPU: the copies are on it. */
        char *text = NULL;
        ASSERT_OK(dsm_engine_describe(e, DSM_FORMAT_JSON, &text));
        if (strstr(text, "\"device\":\"cuda:") == NULL) fail_msg("offload without a device: %s", text);
        dsm_free(text);
        ASSERT_OK(dsm_engine_free(&e));
        have_cuda = 1;
    } else {
        ASSERT_FAILS(st, DSM_ERR_NOT_SUPPORTED,
                     "zero_optimization.offload_optimizer.device \"cpu\": ZeRO-Offload keeps the parameters and "
                     "gradients on a CUDA device, and this rank has no usable CUDA device (");
        assert_null(e);
    }
    int all_cuda;
    MPI_Allreduce(&have_cuda, &all_cuda, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all_cuda && test_size > 1) {
        /* Only rank 0 has a (simulated) device: every rank fails, with the message of the lowest failing rank. */
        if (test_rank == 0) setenv("DSM_SIM_DEVICE_MEMORY", "1", 1);
        ASSERT_FAILS(dsm_engine_init_comm(MPI_COMM_WORLD, opt, d, 3, &e), DSM_ERR_NOT_SUPPORTED,
                     "rank 1: zero_optimization.offload_optimizer.device \"cpu\"");
        ASSERT_FAILS(DSM_ERR_NOT_SUPPORTED, DSM_ERR_NOT_SUPPORTED, "no usable CUDA device");
        assert_null(e);
        unsetenv("DSM_SIM_DEVICE_MEMORY");
    }
    setenv("DSM_SIM_DEVICE_MEMORY", "yes", 1);
    ASSERT_FAILS(dsm_engine_init_comm(MPI_COMM_WORLD, opt, d, 3, &e), DSM_ERR_INVALID_ARGUMENT,
                 "environment DSM_SIM_DEVICE_MEMORY=\"yes\": expected one of 0, 1");
    assert_null(e);
    unsetenv("DSM_SIM_DEVICE_MEMORY");
}

static int failing_init(void *user, int index, const char *name, int64_t offset, int64_t count, float *values) {
    (void)user;
    (void)name;
    (void)offset;
    for (int64_t i = 0; i < count; ++i) values[i] = 0;
    return index == 1 && test_rank == test_size - 1 ? -1 : 0;
}

static void test_init_fn_failure(void **state) {
    (void)state;
    dsm_param_desc_t d[3];
    params(d);
    for (int i = 0; i < 3; ++i) d[i].init_fn = failing_init;
    dsm_engine_t e;
    ASSERT_FAILS(dsm_engine_init_comm(MPI_COMM_WORLD, CFG0, d, 3, &e), DSM_ERR_INVALID_ARGUMENT, "init_fn returned an error");
    /* init_fn missing on a rank while the first rank uses it */
    if (test_size > 1 && test_rank == 1) d[1].init_fn = NULL;
    if (test_size > 1)
        ASSERT_FAILS(dsm_engine_init_comm(MPI_COMM_WORLD, CFG0, d, 3, &e), DSM_ERR_INVALID_ARGUMENT, "init_fn is NULL here");
}

static void test_local_misuse(void **state) {
    (void)state;
    dsm_param_desc_t d[3];
    params(d);
    dsm_engine_t e;
    ASSERT_OK(dsm_engine_init_comm(MPI_COMM_WORLD, CFG2, d, 3, &e));
    const void *v;
    void *g;
    ASSERT_FAILS(dsm_engine_param_acquire(e, 3, &v), DSM_ERR_INVALID_ARGUMENT, "index 3 is out of range 0..2");
    ASSERT_FAILS(dsm_engine_param_acquire(e, -1, &v), DSM_ERR_INVALID_ARGUMENT, "index -1");
    ASSERT_FAILS(dsm_engine_param_acquire(e, 0, NULL), DSM_ERR_NULL_POINTER, "values is NULL");
    ASSERT_OK(dsm_engine_param_acquire(e, 0, &v));
    ASSERT_FAILS(dsm_engine_param_acquire(e, 0, &v), DSM_ERR_STATE, "'a' is already acquired");
    ASSERT_OK(dsm_engine_param_release(e, 0));
    ASSERT_FAILS(dsm_engine_param_release(e, 0), DSM_ERR_STATE, "'a' is not acquired");
    ASSERT_FAILS(dsm_engine_grad_acquire(e, 2, &g), DSM_ERR_INVALID_ARGUMENT, "'frozen' is frozen");
    ASSERT_FAILS(dsm_engine_grad_release(e, 1), DSM_ERR_STATE, "gradient of 'b' is not acquired");
    ASSERT_OK(dsm_engine_grad_acquire(e, 1, &g));
    ASSERT_FAILS(dsm_engine_grad_acquire(e, 1, &g), DSM_ERR_STATE, "already acquired");
    ASSERT_OK(dsm_engine_grad_release(e, 1));
    int idx;
    ASSERT_FAILS(dsm_engine_param_index(e, "nope", &idx), DSM_ERR_NOT_FOUND, "'nope'");
    dsm_step_info_t info = DSM_STEP_INFO_INITIALIZER;
    info.size = 8;
    ASSERT_FAILS(dsm_step(e, &info), DSM_ERR_INVALID_ARGUMENT, "info->size is 8");
    ASSERT_FAILS(dsm_step(e, NULL), DSM_ERR_STATE, "can only be freed");
    ASSERT_OK(dsm_engine_free(&e));
    assert_null(e);
}

/* A gradient still acquired on one rank at dsm_step: every rank fails. */
static void test_unreleased_gradient(void **state) {
    (void)state;
    const char *cfgs[] = {CFG0, CFG2, CFG3};
    for (int k = 0; k < 3; ++k) {
        dsm_param_desc_t d[3];
        params(d);
        dsm_engine_t e;
        ASSERT_OK(dsm_engine_init_comm(MPI_COMM_WORLD, cfgs[k], d, 3, &e));
        void *g;
        ASSERT_OK(dsm_engine_grad_acquire(e, 0, &g));
        ASSERT_OK(dsm_engine_grad_release(e, 0));
        if (test_rank == test_size - 1) ASSERT_OK(dsm_engine_grad_acquire(e, 1, &g));
        ASSERT_FAILS(dsm_step(e, NULL), DSM_ERR_STATE, "the gradient of 'b' is still acquired");
        ASSERT_FAILS(dsm_engine_grad_acquire(e, 0, &g), DSM_ERR_STATE, "can only be freed");
        ASSERT_OK(dsm_engine_free(&e));
    }
}

/* The fp32 helpers and dsm_engine_batch: every bad argument gets a
   clear status naming it, on every rank, and the engine stays usable. */
static void test_f32_helpers_errors(void **state) {
    (void)state;
    dsm_param_desc_t d[3];
    params(d);
    dsm_engine_t e = NULL;
    ASSERT_OK(dsm_engine_init_comm(MPI_COMM_WORLD, CFG2, d, 3, &e));
    float a[15], b[17];
    ASSERT_FAILS(dsm_engine_param_read_f32(NULL, 0, a, 15), DSM_ERR_NULL_POINTER, "engine");
    ASSERT_FAILS(dsm_engine_param_read_f32(e, 3, a, 15), DSM_ERR_INVALID_ARGUMENT, "index 3 is out of range 0..2");
    ASSERT_FAILS(dsm_engine_param_read_f32(e, -1, a, 15), DSM_ERR_INVALID_ARGUMENT, "index -1");
    ASSERT_FAILS(dsm_engine_param_read_f32(e, 0, a, 14), DSM_ERR_INVALID_ARGUMENT,
                 "count 14 is not the 15 elements of parameter 'a'");
    ASSERT_FAILS(dsm_engine_param_read_f32(e, 0, a, -1), DSM_ERR_INVALID_ARGUMENT, "count -1");
    ASSERT_FAILS(dsm_engine_param_read_f32(e, 0, NULL, 15), DSM_ERR_NULL_POINTER, "values is NULL");
    ASSERT_FAILS(dsm_engine_grad_add_f32(e, 1, b, 16), DSM_ERR_INVALID_ARGUMENT,
                 "count 16 is not the 17 elements of parameter 'b'");
    ASSERT_FAILS(dsm_engine_grad_add_f32(e, 1, NULL, 17), DSM_ERR_NULL_POINTER, "grad is NULL");
    ASSERT_FAILS(dsm_engine_grad_add_f32(e, 2, b, 17), DSM_ERR_INVALID_ARGUMENT, "'frozen' is frozen");
    /* While acquired: a state error, and the acquisition stays. */
    const void *v;
    ASSERT_OK(dsm_engine_param_acquire(e, 0, &v));
    ASSERT_FAILS(dsm_engine_param_read_f32(e, 0, a, 15), DSM_ERR_STATE, "'a' is already acquired");
    ASSERT_OK(dsm_engine_param_release(e, 0));
    /* Then a whole micro-step through the helpers. */
    for (int i = 0; i < 17; ++i) b[i] = 0.5f;
    ASSERT_OK(dsm_engine_param_read_f32(e, 0, a, 15));
    ASSERT_OK(dsm_engine_param_read_f32(e, 2, b, 17));
    for (int i = 0; i < 15; ++i) a[i] = 1.0f;
    for (int i = 0; i < 17; ++i) b[i] = 0.25f;
    ASSERT_OK(dsm_engine_grad_add_f32(e, 1, b, 17));
    ASSERT_OK(dsm_engine_grad_add_f32(e, 0, a, 15));
    ASSERT_OK(dsm_step(e, NULL));
    /* The batch values: as configured, NULL outputs allowed. */
    int64_t tb = 0, mb = 0, gas = 0, dp = 0;
    ASSERT_OK(dsm_engine_batch(e, &tb, &mb, &gas, &dp));
    assert_int_equal(mb, 1);
    assert_int_equal(gas, 1);
    assert_int_equal(dp, test_size);
    assert_int_equal(tb, test_size);
    ASSERT_OK(dsm_engine_batch(e, NULL, NULL, NULL, NULL));
    ASSERT_FAILS(dsm_engine_batch(NULL, &tb, NULL, NULL, NULL), DSM_ERR_NULL_POINTER, "engine");
    ASSERT_OK(dsm_engine_free(&e));
}

/* The text of a file, or "" when it cannot be read (at most 4 KiB). */
static void read_text(const char *path, char *buf, size_t len) {
    buf[0] = '\0';
    FILE *f = fopen(path, "r");
    if (f == NULL) return;
    size_t n = fread(buf, 1, len - 1, f);
    buf[n] = '\0';
    fclose(f);
}

/* Metrics: with csv_monitor and tensorboard on, the first rank alone writes
   DeepSpeed's files under output_path/job_name at every boundary (global
   samples as the step), the mean of the losses given, the program's
   scalars and the FLOPs figures; bad arguments fail naming them. */
static void test_metrics(void **state) {
    (void)state;
    char root[64] = "/tmp/dsm-test-metrics-XXXXXX";
    if (test_rank == 0) assert_non_null(mkdtemp(root));
    MPI_Bcast(root, sizeof root, MPI_CHAR, 0, MPI_COMM_WORLD);
    char cfg[1024];
    snprintf(cfg, sizeof cfg,
             "{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": 2,"
             " \"zero_optimization\": {\"stage\": 1}, \"optimizer\": {\"type\": \"AdamW\"},"
             " \"fp16\": {\"enabled\": true, \"initial_scale_power\": 4},"
             " \"csv_monitor\": {\"enabled\": true, \"output_path\": \"%s/csv\", \"job_name\": \"job\"},"
             " \"tensorboard\": {\"enabled\": true, \"output_path\": \"%s/tb\"}}",
             root, root);
    dsm_param_desc_t d[3];
    params(d);
    dsm_engine_t e = NULL;
    ASSERT_OK(dsm_engine_init_comm(MPI_COMM_WORLD, cfg, d, 3, &e));
    ASSERT_FAILS(dsm_engine_log_scalar(e, NULL, 1.0), DSM_ERR_NULL_POINTER, "name is NULL");
    ASSERT_FAILS(dsm_engine_log_scalar(e, "", 1.0), DSM_ERR_INVALID_ARGUMENT, "name '' must have 1..255");
    ASSERT_FAILS(dsm_engine_log_scalar(e, "a,b", 1.0), DSM_ERR_INVALID_ARGUMENT, "name 'a,b' has");
    ASSERT_FAILS(dsm_engine_set_flops(e, -1.0, 0.0), DSM_ERR_INVALID_ARGUMENT, "flops_per_sample -1");
    ASSERT_FAILS(dsm_engine_set_flops(e, 1.0, NAN), DSM_ERR_INVALID_ARGUMENT, "peak_flops nan");
    ASSERT_FAILS(dsm_engine_log_loss(NULL, 1.0), DSM_ERR_NULL_POINTER, "engine");
    ASSERT_OK(dsm_engine_set_flops(e, 1e9, 1e12));
    for (int step = 0; step < 3; ++step)
        for (int micro = 0; micro < 2; ++micro) {
            ASSERT_OK(dsm_engine_log_loss(e, step + micro + 0.5)); /* mean per step: step + 1 */
            ASSERT_OK(dsm_step(e, NULL));
        }
    ASSERT_OK(dsm_engine_log_scalar(e, "Eval/accuracy", 0.75));
    ASSERT_OK(dsm_engine_free(&e));
    MPI_Barrier(MPI_COMM_WORLD);
    if (test_rank == 0) {
        const long long tb = 2LL * 2 * test_size; /* samples per boundary */
        char path[256], text[4096], want[512];
        snprintf(path, sizeof path, "%s/csv/job/Train_Samples_train_loss.csv", root);
        read_text(path, text, sizeof text);
        snprintf(want, sizeof want, "step,train_loss\n%lld,1\n%lld,2\n%lld,3\n", tb, 2 * tb, 3 * tb);
        if (strcmp(text, want) != 0) fail_msg("%s is \"%s\", expected \"%s\"", path, text, want);
        const char *names[] = {"Train_Samples_lr", "Train_Samples_loss_scale", "Train_Samples_grad_norm",
                               "Train_Samples_skipped_steps", "Train_Samples_samples_per_sec",
                               "Train_Samples_elapsed_time_ms_step", "Train_Samples_elapsed_time_ms_wait",
                               "Train_Samples_tflops", "Train_Samples_mfu"};
        for (size_t k = 0; k < sizeof names / sizeof names[0]; ++k) {
            snprintf(path, sizeof path, "%s/csv/job/%s.csv", root, names[k]);
            read_text(path, text, sizeof text);
            int lines = 0;
            for (const char *c = text; *c; ++c) lines += *c == '\n';
            if (strncmp(text, "step,", 5) != 0 || lines != 4) fail_msg("%s: \"%s\" (4 lines expected)", path, text);
        }
        snprintf(path, sizeof path, "%s/csv/job/Eval_accuracy.csv", root);
        read_text(path, text, sizeof text);
        snprintf(want, sizeof want, "step,accuracy\n%lld,0.75\n", 3 * tb);
        if (strcmp(text, want) != 0) fail_msg("%s is \"%s\", expected \"%s\"", path, text, want);
        /* One event file, under the default job name. */
        char cmd[512];
        snprintf(cmd, sizeof cmd, "test \"$(ls '%s/tb/DeepSpeedJobName' | grep -c '^events.out.tfevents.')\" = 1", root);
        assert_int_equal(system(cmd), 0);
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
        assert_int_equal(system(cmd), 0);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    /* A directory the first rank cannot create: init fails on every rank, naming it. */
    snprintf(cfg, sizeof cfg,
             "{\"train_micro_batch_size_per_gpu\": 1, \"optimizer\": {\"type\": \"AdamW\"},"
             " \"csv_monitor\": {\"enabled\": true, \"output_path\": \"/proc/dsm-no-such-dir\"}}");
    ASSERT_FAILS(dsm_engine_init_comm(MPI_COMM_WORLD, cfg, d, 3, &e), DSM_ERR_IO, "/proc/dsm-no-such-dir");
}

/* ZeRO-2: released gradients differ across ranks -> mismatch at the bucket or the step. */
/* timers_seconds.wait: the time dsm_step waits at its opening agreement for
 * the ranks that came later. The last rank comes 0.3 s late to one step; the
 * others' wait must show it (at least 0.2 s), not the reduction's timer or
 * the optimizer's; a rank alone never waits for anybody. */
static double described_timer(dsm_engine_t e, const char *key) {
    char *text = NULL;
    ASSERT_OK(dsm_engine_describe(e, DSM_FORMAT_JSON, &text));
    char want[64];
    snprintf(want, sizeof want, "\"%s\":", key);
    const double v = strtod(test_json_at(text, "\"timers_seconds\":", want), NULL);
    dsm_free(text);
    return v;
}

static void test_wait_timer(void **state) {
    (void)state;
    dsm_param_desc_t d[3];
    params(d);
    dsm_engine_t e = NULL;
    ASSERT_OK(dsm_engine_init_comm(MPI_COMM_WORLD, CFG2, d, 3, &e));
    ASSERT_OK(dsm_step(e, NULL));
    const double before = described_timer(e, "wait"), reduce0 = described_timer(e, "reduce");
    if (test_rank == test_size - 1) usleep(300000);
    ASSERT_OK(dsm_step(e, NULL));
    const double waited = described_timer(e, "wait") - before, reduced = described_timer(e, "reduce") - reduce0;
    /* The timers move forward, and a rank that waited for a peer counts
       some wait; rank 0 arrives long before the late rank, so most of what
       it spends in the step is the wait, not the reduction. */
    if (!(waited >= 0 && reduced >= 0)) fail_msg("timers went back: wait %+.3f s, reduce %+.3f s", waited, reduced);
    if (test_size > 1 && test_rank == 0 && !(waited > 0))
        fail_msg("rank 0 counted no wait for a rank 0.3 s late (reduce took %.3f s)", reduced);
    /* The figures against the 0.3 s: deadlines, asserted where they are
       meaningful (DSM_TEST_DEADLINES=1, the multinode stage), not on a
       loaded machine. */
    if (test_deadlines()) {
        if (test_size > 1 && test_rank == 0 && waited < 0.2)
            fail_msg("rank 0 waited %.3f s for a rank 0.3 s late (reduce took %.3f s)", waited, reduced);
        if (reduced >= 0.2) fail_msg("the late rank's 0.3 s counted in the reduction timer (%.3f s)", reduced);
        if (test_size == 1 && waited >= 0.2) fail_msg("one rank waited %.3f s", waited);
    }
    ASSERT_OK(dsm_engine_free(&e));
}

static void test_release_mismatch(void **state) {
    (void)state;
    if (test_size < 2) skip();
    dsm_param_desc_t d[3];
    params(d);
    dsm_engine_t e;
    ASSERT_OK(dsm_engine_init_comm(MPI_COMM_WORLD, CFG2, d, 3, &e));
    void *g;
    const int which = test_rank == test_size - 1 ? 1 : 0;
    ASSERT_OK(dsm_engine_grad_acquire(e, which, &g));
    dsm_status_t st = dsm_engine_grad_release(e, which); /* a bucket of 8 elements: both flush */
    if (st == DSM_SUCCESS) st = dsm_step(e, NULL);
    assert_int_equal(st, DSM_ERR_MISMATCH);
    assert_non_null(strstr(dsm_last_error(), "release the same gradients"));
    ASSERT_OK(dsm_engine_free(&e));
}

/* ZeRO-3: ranks acquire different parameters -> mismatch, not a hang. */
static void test_gather_mismatch(void **state) {
    (void)state;
    if (test_size < 2) skip();
    dsm_param_desc_t d[3];
    params(d);
    dsm_engine_t e;
    ASSERT_OK(dsm_engine_init_comm(MPI_COMM_WORLD, CFG3, d, 3, &e));
    const void *v;
    ASSERT_FAILS(dsm_engine_param_acquire(e, test_rank == 0 ? 0 : 1, &v), DSM_ERR_MISMATCH,
                 "acquire the same parameters in the same order");
    ASSERT_OK(dsm_engine_free(&e));
}

/*
 * One rank frees the engine while the others step: every rank fails with
 * DSM_ERR_MISMATCH naming both calls, none hangs in the collective frees, and
 * the others can still free their engine.
 */
static void test_free_mismatch(void **state) {
    (void)state;
    if (test_size < 2) skip();
    dsm_param_desc_t d[3];
    params(d);
    dsm_engine_t e;
    ASSERT_OK(dsm_engine_init_comm(MPI_COMM_WORLD, CFG2, d, 3, &e));
    if (test_rank == 0) {
        ASSERT_FAILS(dsm_engine_free(&e), DSM_ERR_MISMATCH, "dsm_engine_free");
        assert_null(e);
    } else {
        ASSERT_FAILS(dsm_step(e, NULL), DSM_ERR_MISMATCH, "dsm_engine_free");
        ASSERT_FAILS(dsm_step(e, NULL), DSM_ERR_STATE, "can only be freed");
        ASSERT_OK(dsm_engine_free(&e));
        assert_null(e);
    }
    /* The ranks are in step again: a new engine works. */
    ASSERT_OK(dsm_engine_init_comm(MPI_COMM_WORLD, CFG2, d, 3, &e));
    ASSERT_OK(dsm_step(e, NULL));
    ASSERT_OK(dsm_engine_free(&e));
}

/* A fresh directory, the same on every rank (rank 0 makes it). */
static void temp_dir(char *dir, size_t size) {
    if (test_rank == 0) {
        const char *tmp = getenv("TMPDIR");
        snprintf(dir, size, "%s/dsm-test-engine-errors-XXXXXX", tmp != NULL ? tmp : "/tmp");
        assert_non_null(mkdtemp(dir));
    }
    MPI_Bcast(dir, (int)size, MPI_CHAR, 0, MPI_COMM_WORLD);
}

static void remove_dir(const char *dir) {
    MPI_Barrier(MPI_COMM_WORLD);
    if (test_rank == 0) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        assert_int_equal(system(cmd), 0);
    }
}

/* After an agreed failure every rank's engine only accepts free, and its free
   is local: it returns on every rank, and a new engine works. */
static void expect_failed_then_free(dsm_engine_t *e, const char *dir) {
    dsm_param_desc_t d[3];
    params(d);
    ASSERT_FAILS(dsm_step(*e, NULL), DSM_ERR_STATE, "can only be freed");
    ASSERT_FAILS(dsm_engine_save_checkpoint(*e, dir, "again", NULL, 0), DSM_ERR_STATE, "can only be freed");
    ASSERT_FAILS(dsm_engine_load_checkpoint(*e, dir, NULL, 0, NULL, NULL), DSM_ERR_STATE, "can only be freed");
    ASSERT_OK(dsm_engine_free(e));
    assert_null(*e);
    ASSERT_OK(dsm_engine_init_comm(MPI_COMM_WORLD, CFG2, d, 3, e));
    ASSERT_OK(dsm_step(*e, NULL));
    ASSERT_OK(dsm_engine_free(e));
}

/*
 * Rank 0 saves or loads a checkpoint while the others step (or load while
 * they save, or saves with a bad argument while they step): every rank
 * fails, every rank's engine is failed, and dsm_engine_free returns on all
 * of them (it used to wait in a collective on the rank that saved).
 */
static void test_checkpoint_step_mismatch(void **state) {
    (void)state;
    if (test_size < 2) skip();
    int hdf5 = 0;
    ASSERT_OK(dsm_library_feature("hdf5", &hdf5));
    char dir[256];
    temp_dir(dir, sizeof dir);
    dsm_param_desc_t d[3];
    params(d);
    dsm_engine_t e;
    if (hdf5) { /* something to load */
        ASSERT_OK(dsm_engine_init_comm(MPI_COMM_WORLD, CFG2, d, 3, &e));
        ASSERT_OK(dsm_engine_save_checkpoint(e, dir, "saved", NULL, 0));
        ASSERT_OK(dsm_engine_free(&e));
    }
    /* what rank 0 does: 0 save, 1 load, 2 save with dir NULL; the others step, except in case 3 (they save
       while rank 0 loads) */
    for (int k = 0; k < 4; ++k) {
        ASSERT_OK(dsm_engine_init_comm(MPI_COMM_WORLD, CFG2, d, 3, &e));
        ASSERT_OK(dsm_step(e, NULL)); /* one good step first */
        dsm_status_t st;
        if (test_rank == 0)
            st = k == 0   ? dsm_engine_save_checkpoint(e, dir, "rank0", NULL, 0)
                 : k == 2 ? dsm_engine_save_checkpoint(e, NULL, "rank0", NULL, 0)
                          : dsm_engine_load_checkpoint(e, dir, "saved", 0, NULL, NULL);
        else
            st = k == 3 ? dsm_engine_save_checkpoint(e, dir, "others", NULL, 0) : dsm_step(e, NULL);
        const char *mine = test_rank == 0 ? (k == 0 || k == 2 ? "dsm_engine_save_checkpoint" : "dsm_engine_load_checkpoint")
                                          : (k == 3 ? "dsm_engine_save_checkpoint" : "dsm_step");
        const char *theirs = test_rank != 0 ? (k == 0 || k == 2 ? "dsm_engine_save_checkpoint" : "dsm_engine_load_checkpoint")
                                            : (k == 3 ? "dsm_engine_save_checkpoint" : "dsm_step");
        if (k == 2) {
            ASSERT_FAILS(st, DSM_ERR_NULL_POINTER, "rank 0: dir is NULL");
        } else if (!hdf5) {
            ASSERT_FAILS(st, DSM_ERR_NOT_SUPPORTED, "rank 0: checkpoints need parallel HDF5");
        } else {
            ASSERT_FAILS(st, DSM_ERR_MISMATCH, "at different collective points");
            ASSERT_FAILS(st, DSM_ERR_MISMATCH, mine);
            ASSERT_FAILS(st, DSM_ERR_MISMATCH, theirs);
        }
        expect_failed_then_free(&e, dir);
    }
    remove_dir(dir);
}

/*
 * The same when the others are in a collective acquire or release: a ZeRO-3
 * gather (dsm_engine_param_acquire) or a ZeRO-2 bucket reduction
 * (dsm_engine_grad_release) while rank 0 saves or loads.
 */
static void test_checkpoint_gather_flush_mismatch(void **state) {
    (void)state;
    if (test_size < 2) skip();
    int hdf5 = 0;
    ASSERT_OK(dsm_library_feature("hdf5", &hdf5));
    char dir[256];
    temp_dir(dir, sizeof dir);
    dsm_param_desc_t d[3];
    params(d);
    dsm_engine_t e;
    ASSERT_OK(dsm_engine_init_comm(MPI_COMM_WORLD, CFG3, d, 3, &e));
    ASSERT_OK(dsm_engine_save_checkpoint(e, dir, "saved", NULL, 0));
    const void *v;
    dsm_status_t st = test_rank == 0 ? dsm_engine_save_checkpoint(e, dir, "rank0", NULL, 0)
                                     : dsm_engine_param_acquire(e, 1, &v);
    if (hdf5)
        ASSERT_FAILS(st, DSM_ERR_MISMATCH,
                     "some are in dsm_engine_param_acquire (ZeRO-3 gather), others in dsm_engine_save_checkpoint");
    else
        ASSERT_FAILS(st, DSM_ERR_NOT_SUPPORTED, "rank 0: checkpoints need parallel HDF5");
    expect_failed_then_free(&e, dir);

    ASSERT_OK(dsm_engine_init_comm(MPI_COMM_WORLD, CFG2, d, 3, &e));
    void *g;
    if (test_rank == 0) {
        st = dsm_engine_load_checkpoint(e, dir, "saved", 0, NULL, NULL);
    } else {
        ASSERT_OK(dsm_engine_grad_acquire(e, 1, &g)); /* 17 elements: the bucket of 8 is full */
        st = dsm_engine_grad_release(e, 1);
    }
    if (hdf5)
        ASSERT_FAILS(st, DSM_ERR_MISMATCH,
                     "some are in dsm_engine_grad_release (bucket reduction), others in dsm_engine_load_checkpoint");
    else
        ASSERT_FAILS(st, DSM_ERR_NOT_SUPPORTED, "rank 0: checkpoints need parallel HDF5");
    expect_failed_then_free(&e, dir);
    remove_dir(dir);
}

/*
 * Every rank loads, with the same arguments, a checkpoint of another model:
 * the message says what does not match (not only that something differs),
 * and the engine, which every rank left at the same point, still works.
 */
static void test_checkpoint_model_mismatch(void **state) {
    (void)state;
    int hdf5 = 0;
    ASSERT_OK(dsm_library_feature("hdf5", &hdf5));
    if (!hdf5) skip();
    char dir[256];
    temp_dir(dir, sizeof dir);
    dsm_param_desc_t d[3];
    params(d);
    dsm_engine_t e;
    ASSERT_OK(dsm_engine_init_comm(MPI_COMM_WORLD, CFG2, d, 3, &e));
    ASSERT_OK(dsm_step(e, NULL));
    ASSERT_OK(dsm_engine_save_checkpoint(e, dir, "model", NULL, 0));
    ASSERT_OK(dsm_engine_free(&e));
    static const int64_t longer[1] = {18};
    d[1].shape = longer;
    ASSERT_OK(dsm_engine_init_comm(MPI_COMM_WORLD, CFG2, d, 3, &e));
    ASSERT_FAILS(dsm_engine_load_checkpoint(e, dir, "model", 0, NULL, NULL), DSM_ERR_MISMATCH,
                 "does not match the engine's parameters: /params/b has shape [17] in the checkpoint but [18] "
                 "in the engine");
    ASSERT_OK(dsm_step(e, NULL));
    ASSERT_OK(dsm_engine_free(&e));
    remove_dir(dir);
}

/* fp16 at its minimum loss scale and still overflowing: DSM_ERR_NUMERIC everywhere. */
static void test_min_scale(void **state) {
    (void)state;
    const char *cfg = "{\"train_micro_batch_size_per_gpu\": 1, \"optimizer\": {\"type\": \"AdamW\"},"
                      " \"fp16\": {\"enabled\": true, \"initial_scale_power\": 0, \"min_loss_scale\": 1,"
                      " \"hysteresis\": 1}, \"zero_optimization\": {\"stage\": 1}}";
    dsm_param_desc_t d[3];
    params(d);
    dsm_engine_t e;
    ASSERT_OK(dsm_engine_init_comm(MPI_COMM_WORLD, cfg, d, 3, &e));
    void *g;
    ASSERT_OK(dsm_engine_grad_acquire(e, 0, &g));
    if (test_rank == 0) {
        float inf = INFINITY;
        engine_write_f32(e, g, &inf, 1); /* the engine's dtype: fp16 */
    }
    ASSERT_OK(dsm_engine_grad_release(e, 0));
    ASSERT_FAILS(dsm_step(e, NULL), DSM_ERR_NUMERIC, "scale");
    ASSERT_OK(dsm_engine_free(&e));
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_descriptors), cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_f32_helpers_errors), cmocka_unit_test(test_metrics), cmocka_unit_test(test_wait_timer),
        cmocka_unit_test(test_init_fn_failure), cmocka_unit_test(test_local_misuse),
        cmocka_unit_test(test_unreleased_gradient), cmocka_unit_test(test_release_mismatch),
        cmocka_unit_test(test_gather_mismatch), cmocka_unit_test(test_free_mismatch),
        cmocka_unit_test(test_min_scale), cmocka_unit_test(test_offload_errors),
        cmocka_unit_test(test_checkpoint_step_mismatch), cmocka_unit_test(test_checkpoint_gather_flush_mismatch),
        cmocka_unit_test(test_checkpoint_model_mismatch),
    };
    return RUN_MPI_TESTS("test_engine_errors", tests);
}
