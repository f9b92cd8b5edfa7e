/*
 * What a training loop needs besides the step, and the configuration read
 * once: dsm_engine_resume (a checkpoint when there is one, "nothing to
 * resume" when there is none), dsm_engine_mean_loss (the loss averaged over
 * data parallel x sequence parallel), dsm_engine_init_with_config, one
 * collective read of the configuration per init call, and one warning (rank
 * 0) about an unknown key, naming the near key and what applies instead;
 * DSM_CONFIG_STRICT=1 makes it an error on every rank. Bad arguments, on
 * every rank or on one, fail every rank with a message naming the value.
 *
 * The counts are read from this process's own log (DSM_DEBUG=INFO,
 * DSM_DEBUG_SUBSYS=INIT, DSM_DEBUG_FILE), set before the library starts.
 */
#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mpi_test.h"

static const int64_t shape_w[1] = {8};
static char log_path[256];
static char dir[256];

static void params(dsm_param_desc_t *d) {
    memset(d, 0, sizeof *d);
    d->name = "w";
    d->ndims = 1;
    d->shape = shape_w;
    d->dtype = DSM_FLOAT32;
    d->trainable = 1;
}

/* How many lines of this process's log contain `text`. */
static int log_count(const char *text) {
    FILE *f = fopen(log_path, "r");
    if (f == NULL) return 0;
    char line[8192];
    int n = 0;
    while (fgets(line, sizeof line, f) != NULL) n += strstr(line, text) != NULL;
    fclose(f);
    return n;
}

/* The last line of this process's log containing `text` ("" if none). */
static void log_last(const char *text, char *out, size_t len) {
    out[0] = 0;
    FILE *f = fopen(log_path, "r");
    if (f == NULL) return;
    char line[8192];
    while (fgets(line, sizeof line, f) != NULL)
        if (strstr(line, text) != NULL) snprintf(out, len, "%s", line);
    fclose(f);
}

#define READS() log_count("configuration: collective read")

/* ------------------------------------------------------------ the configuration read once */

static void test_config_read_once(void **state) {
    (void)state;
    const char *cfg = "{\"train_micro_batch_size_per_gpu\": 1, \"optimizer\": {\"type\": \"SGD\"}, \"steps_per_print\": 11}";
    dsm_param_desc_t d;
    params(&d);
    dsm_engine_t e = NULL;

    int before = READS();
    ASSERT_OK(dsm_engine_init_comm(MPI_COMM_WORLD, cfg, &d, 1, &e));
    assert_int_equal(READS() - before, 1); /* the mesh and the engine from one read */
    ASSERT_OK(dsm_engine_free(&e));

    dsm_mesh_t mesh = NULL;
    before = READS();
    ASSERT_OK(dsm_mesh_create_for_config(MPI_COMM_WORLD, cfg, &mesh));
    assert_int_equal(READS() - before, 1);
    before = READS();
    ASSERT_OK(dsm_engine_init(mesh, cfg, &d, 1, &e));
    assert_int_equal(READS() - before, 1);
    ASSERT_OK(dsm_engine_free(&e));

    dsm_config_t c = NULL;
    before = READS();
    ASSERT_OK(dsm_config_load(MPI_COMM_WORLD, cfg, 0, &c));
    ASSERT_OK(dsm_engine_init_with_config(mesh, c, &d, 1, NULL, &e));
    assert_int_equal(READS() - before, 1); /* the load; the engine reads nothing */
    ASSERT_OK(dsm_config_free(&c));
    ASSERT_OK(dsm_engine_free(&e));
    ASSERT_OK(dsm_mesh_free(&mesh));
}

/* ------------------------------------------------------------ dsm_engine_init_with_config */

static void test_init_with_config(void **state) {
    (void)state;
    dsm_param_desc_t d;
    params(&d);
    /* Read over the world (W = world size), built on a data_parallel x
       sequence_parallel mesh: the batch values follow the mesh. */
    const int sp = test_size % 2 == 0 ? 2 : 1, dp = test_size / sp;
    dsm_mesh_t mesh = NULL;
    ASSERT_OK(dsm_mesh_create_dp_sp(MPI_COMM_WORLD, dp, sp, &mesh));
    dsm_config_t c = NULL;
    ASSERT_OK(dsm_config_load(MPI_COMM_WORLD,
                              "{\"train_micro_batch_size_per_gpu\": 2, \"optimizer\": {\"type\": \"AdamW\"}}", 0, &c));
    int64_t tb = 0, mb = 0, gas = 0, w = 0;
    ASSERT_OK(dsm_config_batch(c, &tb, NULL, NULL, &w));
    assert_int_equal(w, test_size);
    dsm_engine_t e = NULL;
    ASSERT_OK(dsm_engine_init_with_config(mesh, c, &d, 1, NULL, &e));
    ASSERT_OK(dsm_config_free(&c)); /* the engine keeps its own */
    ASSERT_OK(dsm_engine_batch(e, &tb, &mb, &gas, &w));
    assert_int_equal(w, dp);
    assert_int_equal(mb, 2);
    assert_int_equal(tb, 2 * dp);
    ASSERT_OK(dsm_engine_free(&e));

    /* NULL configuration: on every rank, then on the last rank only. */
    ASSERT_OK(dsm_config_load(MPI_COMM_WORLD,
                              "{\"train_micro_batch_size_per_gpu\": 2, \"optimizer\": {\"type\": \"AdamW\"}}", 0, &c));
    e = (dsm_engine_t)0x1;
    ASSERT_FAILS(dsm_engine_init_with_config(mesh, NULL, &d, 1, NULL, &e), DSM_ERR_NULL_POINTER, "config is NULL");
    assert_null(e);
    ASSERT_FAILS(dsm_engine_init_with_config(mesh, test_rank == test_size - 1 ? NULL : c, &d, 1, NULL, &e),
                 DSM_ERR_NULL_POINTER, "config is NULL");
    assert_null(e);
    /* A NULL output and a NULL mesh. */
    ASSERT_FAILS(dsm_engine_init_with_config(mesh, c, &d, 1, NULL, NULL), DSM_ERR_NULL_POINTER, "engine");
    ASSERT_FAILS(dsm_engine_init_with_config(NULL, c, &d, 1, NULL, &e), DSM_ERR_NULL_POINTER, "mesh is NULL");
    /* Configurations that differ between ranks: the key is named. */
    dsm_config_t other = NULL;
    ASSERT_OK(dsm_config_resolve(test_rank == test_size - 1
                                     ? "{\"train_micro_batch_size_per_gpu\": 2, \"optimizer\": {\"type\": \"AdamW\", "
                                       "\"params\": {\"lr\": 0.5}}}"
                                     : "{\"train_micro_batch_size_per_gpu\": 2, \"optimizer\": {\"type\": \"AdamW\"}}",
                                 test_size, 0, 0, &other));
    if (test_size > 1)
        ASSERT_FAILS(dsm_engine_init_with_config(mesh, other, &d, 1, NULL, &e), DSM_ERR_MISMATCH, "optimizer.params.lr");
    ASSERT_OK(dsm_config_free(&other));
    /* Batch values that do not divide for this mesh. */
    ASSERT_OK(dsm_config_resolve("{\"train_batch_size\": 7, \"train_micro_batch_size_per_gpu\": 7, "
                                 "\"optimizer\": {\"type\": \"AdamW\"}}",
                                 1, 0, 0, &other));
    if (dp > 1)
        ASSERT_FAILS(dsm_engine_init_with_config(mesh, other, &d, 1, NULL, &e), DSM_ERR_CONFIG, "train_batch_size");
    ASSERT_OK(dsm_config_free(&other));
    ASSERT_OK(dsm_config_free(&c));
    ASSERT_OK(dsm_mesh_free(&mesh));
}

/* ------------------------------------------------------------ unknown keys */

static void test_unknown_key_warned_once(void **state) {
    (void)state;
    /* The British spelling: training would go on at stage 0. */
    const char *cfg = "{\"train_micro_batch_size_per_gpu\": 1, \"zero_optimisation\": {\"stage\": 3},"
                      " \"optimizer\": {\"type\": \"SGD\"}, \"steps_per_print\": 12}";
    dsm_param_desc_t d;
    params(&d);
    const int before = log_count("unknown key");
    dsm_mesh_t mesh = NULL;
    dsm_engine_t e = NULL;
    ASSERT_OK(dsm_mesh_create_for_config(MPI_COMM_WORLD, cfg, &mesh));
    ASSERT_OK(dsm_engine_init(mesh, cfg, &d, 1, &e));
    ASSERT_OK(dsm_engine_free(&e));
    ASSERT_OK(dsm_engine_init_comm(MPI_COMM_WORLD, cfg, &d, 1, &e));
    ASSERT_OK(dsm_engine_free(&e));
    ASSERT_OK(dsm_mesh_free(&mesh));
    /* Once in the job: on rank 0, once for the configuration. */
    assert_int_equal(log_count("unknown key") - before, test_rank == 0 ? 1 : 0);
    if (test_rank == 0) {
        char line[8192];
        log_last("unknown key", line, sizeof line);
        if (strstr(line, "zero_optimisation") == NULL || strstr(line, "did you mean zero_optimization?") == NULL ||
            strstr(line, "ZeRO stage 0 applies") == NULL || strstr(line, "DSM_CONFIG_STRICT=1") == NULL)
            fail_msg("the warning lacks the key, the suggestion, the default or the strict switch: %s", line);
    }
    /* A nested key: the near key of its own level. */
    const char *nested = "{\"train_micro_batch_size_per_gpu\": 1, \"zero_optimization\": {\"stage\": 1, "
                         "\"reduce_bucket_sise\": 100}, \"optimizer\": {\"type\": \"SGD\"}}";
    ASSERT_OK(dsm_engine_init_comm(MPI_COMM_WORLD, nested, &d, 1, &e));
    ASSERT_OK(dsm_engine_free(&e));
    if (test_rank == 0) {
        char line[8192];
        log_last("unknown key", line, sizeof line);
        if (strstr(line, "did you mean zero_optimization.reduce_bucket_size?") == NULL ||
            strstr(line, "zero_optimization.reduce_bucket_size = 500000000 applies") == NULL)
            fail_msg("no suggestion or default for a nested key: %s", line);
    }
}

static void test_strict_environment(void **state) {
    (void)state;
    const char *cfg = "{\"train_micro_batch_size_per_gpu\": 1, \"zero_optimisation\": {\"stage\": 2},"
                      " \"optimizer\": {\"type\": \"SGD\"}}";
    dsm_param_desc_t d;
    params(&d);
    dsm_engine_t e = (dsm_engine_t)0x1;
    setenv("DSM_CONFIG_STRICT", "1", 1);
    ASSERT_FAILS(dsm_engine_init_comm(MPI_COMM_WORLD, cfg, &d, 1, &e), DSM_ERR_CONFIG,
                 "did you mean zero_optimization?");
    assert_null(e);
    /* Strict on one rank only: that rank's error on every rank. */
    if (test_rank != test_size - 1) unsetenv("DSM_CONFIG_STRICT");
    ASSERT_FAILS(dsm_engine_init_comm(MPI_COMM_WORLD, cfg, &d, 1, &e), DSM_ERR_CONFIG, "zero_optimisation");
    /* A bad value names the variable. */
    setenv("DSM_CONFIG_STRICT", "maybe", 1);
    ASSERT_FAILS(dsm_engine_init_comm(MPI_COMM_WORLD, cfg, &d, 1, &e), DSM_ERR_INVALID_ARGUMENT,
                 "DSM_CONFIG_STRICT");
    unsetenv("DSM_CONFIG_STRICT");
    ASSERT_OK(dsm_engine_init_comm(MPI_COMM_WORLD, cfg, &d, 1, &e));
    ASSERT_OK(dsm_engine_free(&e));
}

/* ------------------------------------------------------------ dsm_engine_mean_loss */

static void test_mean_loss(void **state) {
    (void)state;
    dsm_param_desc_t d;
    params(&d);
    const int sp = test_size % 2 == 0 ? 2 : 1, dp = test_size / sp;
    dsm_mesh_t mesh = NULL;
    ASSERT_OK(dsm_mesh_create_dp_sp(MPI_COMM_WORLD, dp, sp, &mesh));
    dsm_engine_t e = NULL;
    ASSERT_OK(dsm_engine_init(mesh, "{\"train_micro_batch_size_per_gpu\": 1, \"optimizer\": {\"type\": \"SGD\"}}",
                              &d, 1, &e));
    ASSERT_OK(dsm_mesh_free(&mesh));
    double mean = -1.0;
    /* Equal weights: the plain mean of the ranks' losses (dp x sp ranks). */
    ASSERT_OK(dsm_engine_mean_loss(e, (double)test_rank, 1.0, &mean));
    assert_true(fabs(mean - (test_size - 1) / 2.0) < 1e-12);
    /* Weighted by tokens: sum(loss x tokens) / sum(tokens). */
    double num = 0.0, den = 0.0;
    for (int r = 0; r < test_size; ++r) num += (double)r * (r + 1), den += r + 1;
    ASSERT_OK(dsm_engine_mean_loss(e, (double)test_rank, (double)(test_rank + 1), &mean));
    assert_true(fabs(mean - num / den) < 1e-12);
    /* A rank with weight 0 adds nothing, even a NaN. */
    if (test_size > 1) {
        ASSERT_OK(dsm_engine_mean_loss(e, test_rank == 0 ? NAN : 2.0, test_rank == 0 ? 0.0 : 1.0, &mean));
        assert_true(mean == 2.0);
    }

    /* Bad arguments, on every rank and on the last rank only. */
    const int last = test_rank == test_size - 1;
    ASSERT_FAILS(dsm_engine_mean_loss(e, 1.0, -1.0, &mean), DSM_ERR_INVALID_ARGUMENT, "weight is -1");
    ASSERT_FAILS(dsm_engine_mean_loss(e, 1.0, last ? -2.0 : 1.0, &mean), DSM_ERR_INVALID_ARGUMENT, "weight is -2");
    ASSERT_FAILS(dsm_engine_mean_loss(e, 1.0, last ? NAN : 1.0, &mean), DSM_ERR_INVALID_ARGUMENT, "weight is nan");
    ASSERT_FAILS(dsm_engine_mean_loss(e, 1.0, last ? INFINITY : 1.0, &mean), DSM_ERR_INVALID_ARGUMENT, "weight is inf");
    ASSERT_FAILS(dsm_engine_mean_loss(e, 1.0, 1.0, last ? NULL : &mean), DSM_ERR_NULL_POINTER, "mean");
    ASSERT_FAILS(dsm_engine_mean_loss(e, 1.0, 0.0, &mean), DSM_ERR_INVALID_ARGUMENT, "weights of all");
    ASSERT_FAILS(dsm_engine_mean_loss(NULL, 1.0, 1.0, &mean), DSM_ERR_NULL_POINTER, "engine");
    /* The engine is still usable after agreed argument errors. */
    ASSERT_OK(dsm_engine_mean_loss(e, 3.0, 1.0, &mean));
    assert_true(mean == 3.0);
    dsm_step_info_t info = DSM_STEP_INFO_INITIALIZER;
    ASSERT_OK(dsm_step(e, &info));
    ASSERT_OK(dsm_engine_free(&e));
}

/* ------------------------------------------------------------ dsm_engine_resume */

static void test_resume(void **state) {
    (void)state;
    int hdf5 = 0;
    ASSERT_OK(dsm_library_feature("hdf5", &hdf5));
    dsm_param_desc_t d;
    params(&d);
    const char *cfg = "{\"train_micro_batch_size_per_gpu\": 1, \"optimizer\": {\"type\": \"SGD\", "
                      "\"params\": {\"lr\": 0.1}}}";
    dsm_engine_t e = NULL;
    ASSERT_OK(dsm_engine_init_comm(MPI_COMM_WORLD, cfg, &d, 1, &e));
    char sub[300];
    snprintf(sub, sizeof sub, "%s/run", dir);

    /* Nothing to resume: the directory does not exist, then has no latest. */
    int resumed = -1;
    void *blob = (void *)0x1;
    size_t size = 99;
    ASSERT_OK(dsm_engine_resume(e, sub, 0, &resumed, &blob, &size));
    assert_int_equal(resumed, 0);
    assert_null(blob);
    assert_int_equal(size, 0);
    if (test_rank == 0) assert_int_equal(mkdir(sub, 0755), 0);
    MPI_Barrier(MPI_COMM_WORLD);
    resumed = -1;
    ASSERT_OK(dsm_engine_resume(e, sub, 0, &resumed, NULL, NULL));
    assert_int_equal(resumed, 0);

    /* Bad arguments, on every rank and on one. */
    const int last = test_rank == test_size - 1;
    ASSERT_FAILS(dsm_engine_resume(e, NULL, 0, &resumed, NULL, NULL), DSM_ERR_NULL_POINTER, "dir is NULL");
    ASSERT_FAILS(dsm_engine_resume(e, last ? NULL : sub, 0, &resumed, NULL, NULL), DSM_ERR_NULL_POINTER,
                 "dir is NULL");
    ASSERT_FAILS(dsm_engine_resume(e, last ? "" : sub, 0, &resumed, NULL, NULL), DSM_ERR_INVALID_ARGUMENT,
                 "directory is empty");
    ASSERT_FAILS(dsm_engine_resume(e, sub, last ? 0x100u : 0u, &resumed, NULL, NULL), DSM_ERR_INVALID_ARGUMENT,
                 "flags 0x100");
    ASSERT_FAILS(dsm_engine_resume(e, sub, 0, last ? NULL : &resumed, NULL, NULL), DSM_ERR_NULL_POINTER, "resumed");
    ASSERT_FAILS(dsm_engine_resume(NULL, sub, 0, &resumed, NULL, NULL), DSM_ERR_NULL_POINTER, "engine");

    if (!hdf5) {
        ASSERT_OK(dsm_engine_free(&e));
        return;
    }
    /* A step, a save; a new engine resumes it with its client state. */
    float *g = NULL;
    ASSERT_OK(dsm_engine_grad_acquire(e, 0, (void **)&g));
    for (int i = 0; i < 8; ++i) g[i] = (float)(i + 1);
    ASSERT_OK(dsm_engine_grad_release(e, 0));
    dsm_step_info_t info = DSM_STEP_INFO_INITIALIZER;
    ASSERT_OK(dsm_step(e, &info));
    float saved[8];
    ASSERT_OK(dsm_engine_param_read_f32(e, 0, saved, 8));
    ASSERT_OK(dsm_engine_save_checkpoint(e, sub, NULL, "state", 5));
    ASSERT_OK(dsm_engine_free(&e));

    ASSERT_OK(dsm_engine_init_comm(MPI_COMM_WORLD, cfg, &d, 1, &e));
    resumed = -1;
    ASSERT_OK(dsm_engine_resume(e, sub, 0, &resumed, &blob, &size));
    assert_int_equal(resumed, 1);
    assert_int_equal(size, 5);
    assert_memory_equal(blob, "state", 5);
    dsm_free(blob);
    float now[8];
    ASSERT_OK(dsm_engine_param_read_f32(e, 0, now, 8));
    assert_memory_equal(now, saved, sizeof now);
    ASSERT_OK(dsm_engine_step_info(e, &info));
    assert_int_equal(info.global_steps, 1);

    /* A latest that names a missing checkpoint is an error, not "nothing". */
    if (test_rank == 0) {
        char path[400];
        snprintf(path, sizeof path, "%s/latest", sub);
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fputs("global_step99", f);
        fclose(f);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    ASSERT_FAILS(dsm_engine_resume(e, sub, 0, &resumed, NULL, NULL), DSM_ERR_IO, "global_step99");
    assert_int_equal(resumed, 0);
    ASSERT_OK(dsm_engine_free(&e));
}

static int setup(void **state) {
    (void)state;
    if (test_rank == 0) {
        snprintf(dir, sizeof dir, "%s", "/tmp/dsm-test-loop-XXXXXX");
        if (mkdtemp(dir) == NULL) return 1;
    }
    MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    MPI_Barrier(MPI_COMM_WORLD);
    if (test_rank == 0) {
        char cmd[400];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd) != 0) return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    /* This process's log, read back by the tests: INIT lines at INFO. */
    snprintf(log_path, sizeof log_path, "/tmp/dsm-test-loop-%ld.log", (long)getpid());
    setenv("DSM_DEBUG", "INFO", 1);
    setenv("DSM_DEBUG_SUBSYS", "INIT", 1);
    setenv("DSM_DEBUG_FILE", log_path, 1);
    unsetenv("DSM_CONFIG_STRICT");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_read_once),
        cmocka_unit_test(test_init_with_config),
        cmocka_unit_test(test_unknown_key_warned_once),
        cmocka_unit_test(test_strict_environment),
        cmocka_unit_test(test_mean_loss),
        cmocka_unit_test_setup_teardown(test_resume, setup, teardown),
    };
    const int rc = RUN_MPI_TESTS("engine_loop", tests);
    unlink(log_path);
    return rc;
}
