/*
 * Checkpoints that survive a cluster: asynchronous saves (checkpoint.writer.
 * decoupled) write what the state was at the call while training goes on,
 * are waited for by the next checkpoint call, and report a background
 * failure once, on every rank, naming the file; checkpoint.keep_last removes
 * only complete checkpoints of libdsm beyond the newest, never `latest`'s;
 * DSM_CKPT_LOAD_FALLBACK skips checkpoints that do not verify;
 * DSM_CKPT_LOAD_NON_STRICT loads what matches and reports the rest.
 */
#define MPI_TEST_THREAD_LEVEL MPI_THREAD_MULTIPLE

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "mpi_test.h"
#include "ckpt_test.h"

static const char *ASYNC = ", \"checkpoint\": {\"writer\": {\"decoupled\": true}}";

static int async_available(void) {
    int level = MPI_THREAD_SINGLE;
    MPI_Query_thread(&level);
    return level == MPI_THREAD_MULTIPLE;
}

static void path_of(char *out, size_t len, const char *d, const char *tag) { snprintf(out, len, "%s/%s.h5", d, tag); }

/* Truncate a checkpoint file to half (rank 0; every rank waits). */
static void truncate_file(const char *d, const char *tag) {
    char path[600];
    path_of(path, sizeof path, d, tag);
    if (test_rank == 0) {
        struct stat st;
        assert_int_equal(stat(path, &st), 0);
        assert_int_equal(truncate(path, st.st_size / 2), 0);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

/* dsm_engine_load_report as text (JSON). */
static char *report(dsm_engine_t e) {
    char *text = NULL;
    ASSERT_OK(dsm_engine_load_report(e, DSM_FORMAT_JSON, &text));
    return text;
}

/* The values at the call are saved, whatever training does meanwhile; the
   file loads bit for bit, at every precision. */
static void test_async_round_trip(void **state) {
    (void)state;
    const char *precisions[3] = {FP32, FP16, BF16};
    for (int p = 0; p < 3; ++p) {
        char extra[256], adir[300];
        snprintf(extra, sizeof extra, "%s%s", precisions[p], ASYNC);
        snprintf(adir, sizeof adir, "%s/rt%d", dir, p);
        dsm_engine_t e = engine_on(MPI_COMM_WORLD, 2, FP32, extra, 0.0f);
        train(e, MPI_COMM_WORLD, 2);
        float at_save[TOTAL], later[TOTAL], loaded[TOTAL];
        snapshot(e, at_save);
        ASSERT_OK(dsm_engine_save_checkpoint(e, adir, "a", "client", 6));
        train(e, MPI_COMM_WORLD, 2); /* changes the engine's state, not the save's copy */
        snapshot(e, later);
        ASSERT_OK(dsm_engine_checkpoint_wait(e));
        ASSERT_OK(dsm_engine_checkpoint_wait(e)); /* nothing running: at once */
        char latest[64];
        read_latest(adir, latest, sizeof latest);
        assert_string_equal(latest, "a");
        ASSERT_OK(dsm_engine_free(&e));

        dsm_engine_t f = engine_on(MPI_COMM_WORLD, 1, FP32, precisions[p], 1.0f);
        void *blob = NULL;
        size_t size = 0;
        ASSERT_OK(dsm_engine_load_checkpoint(f, adir, NULL, 0, &blob, &size));
        assert_int_equal(size, 6);
        assert_memory_equal(blob, "client", 6);
        dsm_free(blob);
        snapshot(f, loaded);
        assert_memory_equal(loaded, at_save, sizeof loaded);
        assert_memory_not_equal(loaded, later, sizeof loaded);
        ASSERT_OK(dsm_engine_free(&f));
    }
}

/* The next save, a load and the free wait for a running save. */
static void test_async_waits(void **state) {
    (void)state;
    char path[600], latest[64];
    dsm_engine_t e = engine_on(MPI_COMM_WORLD, 3, FP32, ASYNC, 0.0f);
    train(e, MPI_COMM_WORLD, 1);
    ASSERT_OK(dsm_engine_save_checkpoint(e, dir, "one", NULL, 0));
    train(e, MPI_COMM_WORLD, 1);
    ASSERT_OK(dsm_engine_save_checkpoint(e, dir, NULL, NULL, 0)); /* waits for "one" */
    path_of(path, sizeof path, dir, "one");
    assert_true(file_exists(path));
    ASSERT_OK(dsm_engine_load_checkpoint(e, dir, NULL, 0, NULL, NULL)); /* waits for global_step2 */
    read_latest(dir, latest, sizeof latest);
    assert_string_equal(latest, "global_step2");
    train(e, MPI_COMM_WORLD, 1);
    ASSERT_OK(dsm_engine_save_checkpoint(e, dir, "last", NULL, 0));
    ASSERT_OK(dsm_engine_free(&e)); /* waits */
    read_latest(dir, latest, sizeof latest);
    assert_string_equal(latest, "last");
    path_of(path, sizeof path, dir, "last");
    assert_true(file_exists(path));
}

/* A save that fails in the background: reported once, on every rank, by the
   next call of each kind, naming the file; `latest` stays; nothing else done. */
static void test_async_failure(void **state) {
    (void)state;
    if (!async_available()) skip();
    char spec[64], path[600], latest[64];
    dsm_engine_t e = engine_on(MPI_COMM_WORLD, 1, FP32, ASYNC, 0.0f);
    train(e, MPI_COMM_WORLD, 1);
    ASSERT_OK(dsm_engine_save_checkpoint(e, dir, "good", NULL, 0));
    ASSERT_OK(dsm_engine_checkpoint_wait(e));

    /* By dsm_engine_checkpoint_wait, at each point of the save. */
    const char *points[3] = {"write", "data", "latest"};
    for (int k = 0; k < 3; ++k) {
        char tag[32];
        snprintf(tag, sizeof tag, "bad_%s", points[k]);
        snprintf(spec, sizeof spec, "%s:%d", points[k], k == 0 ? test_size - 1 : 0);
        setenv("DSM_CKPT_FAULT", spec, 1);
        ASSERT_OK(dsm_engine_save_checkpoint(e, dir, tag, NULL, 0));
        path_of(path, sizeof path, dir, tag);
        ASSERT_FAILS(dsm_engine_checkpoint_wait(e), DSM_ERR_IO, path);
        assert_non_null(strstr(dsm_last_error(), "injected fault"));
        unsetenv("DSM_CKPT_FAULT");
        ASSERT_OK(dsm_engine_checkpoint_wait(e)); /* reported once */
        read_latest(dir, latest, sizeof latest);
        assert_string_equal(latest, "good");
        assert_int_equal(file_exists(path), k == 2); /* complete only after the rename */
    }

    /* By dsm_step, once the save has ended everywhere: that step does nothing. */
    snprintf(spec, sizeof spec, "write:%d", test_size - 1);
    setenv("DSM_CKPT_FAULT", spec, 1);
    dsm_step_info_t before = DSM_STEP_INFO_INITIALIZER, after = DSM_STEP_INFO_INITIALIZER;
    ASSERT_OK(dsm_engine_step_info(e, &before));
    ASSERT_OK(dsm_engine_save_checkpoint(e, dir, "bad_step", NULL, 0));
    dsm_status_t st = DSM_SUCCESS;
    long steps = 0;
    while (st == DSM_SUCCESS && steps < 1000000) {
        st = dsm_step(e, NULL);
        if (st == DSM_SUCCESS) ++steps;
        if (st == DSM_SUCCESS && steps % 64 == 0) usleep(1000);
    }
    assert_int_equal(st, DSM_ERR_IO);
    path_of(path, sizeof path, dir, "bad_step");
    assert_non_null(strstr(dsm_last_error(), path));
    unsetenv("DSM_CKPT_FAULT");
    /* Every rank stepped as often before it was reported. */
    long lo = steps, hi = steps;
    MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_LONG, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_LONG, MPI_MAX, MPI_COMM_WORLD);
    assert_int_equal(lo, hi);
    ASSERT_OK(dsm_engine_step_info(e, &after));
    assert_int_equal(after.micro_steps, before.micro_steps + steps);
    ASSERT_OK(dsm_step(e, NULL)); /* usable */

    /* By a load (which then loads nothing) and by the free. */
    setenv("DSM_CKPT_FAULT", spec, 1);
    ASSERT_OK(dsm_engine_save_checkpoint(e, dir, "bad_load", NULL, 0));
    ASSERT_FAILS(dsm_engine_load_checkpoint(e, dir, "good", 0, NULL, NULL), DSM_ERR_IO, "asynchronous save");
    unsetenv("DSM_CKPT_FAULT");
    ASSERT_OK(dsm_engine_load_checkpoint(e, dir, "good", 0, NULL, NULL));
    setenv("DSM_CKPT_FAULT", spec, 1);
    ASSERT_OK(dsm_engine_save_checkpoint(e, dir, "bad_free", NULL, 0));
    ASSERT_FAILS(dsm_engine_free(&e), DSM_ERR_IO, "bad_free.h5");
    unsetenv("DSM_CKPT_FAULT");
    assert_null(e);
    read_latest(dir, latest, sizeof latest);
    assert_string_equal(latest, "good");
    path_of(path, sizeof path, dir, "bad_free");
    assert_false(file_exists(path));
}

/* Arguments and directories: errors of the call itself, at once. */
static void test_async_bad_arguments(void **state) {
    (void)state;
    char bad[600];
    dsm_engine_t e = engine_on(MPI_COMM_WORLD, 0, FP32, ASYNC, 0.0f);
    ASSERT_FAILS(dsm_engine_checkpoint_wait(NULL), DSM_ERR_NULL_POINTER, "engine");
    ASSERT_FAILS(dsm_engine_load_report(e, DSM_FORMAT_JSON, NULL), DSM_ERR_NULL_POINTER, "text");
    char *text = NULL;
    ASSERT_FAILS(dsm_engine_load_report(e, (dsm_format_t)7, &text), DSM_ERR_INVALID_ARGUMENT, "format 7");
    assert_null(text);
    text = report(e);
    assert_non_null(strstr(text, "\"loaded\": false"));
    dsm_free(text);
    ASSERT_FAILS(dsm_engine_save_checkpoint(e, dir, "a/b", NULL, 0), DSM_ERR_INVALID_ARGUMENT, "character '/'");
    ASSERT_FAILS(dsm_engine_load_checkpoint(e, dir, NULL, 0x20u, NULL, NULL), DSM_ERR_INVALID_ARGUMENT,
                 "unknown bits 0x20");
    /* A directory that cannot be created (under a file): the save's own error. */
    if (test_rank == 0) {
        char file[400];
        snprintf(file, sizeof file, "%s/plain", dir);
        FILE *f = fopen(file, "w");
        assert_non_null(f);
        fclose(f);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    snprintf(bad, sizeof bad, "%s/plain/sub", dir);
    ASSERT_FAILS(dsm_engine_save_checkpoint(e, bad, "t", NULL, 0), DSM_ERR_IO, bad);
    ASSERT_OK(dsm_engine_checkpoint_wait(e));
    /* A missing directory to load from, with and without the fallback. */
    snprintf(bad, sizeof bad, "%s/missing", dir);
    ASSERT_FAILS(dsm_engine_load_checkpoint(e, bad, NULL, 0, NULL, NULL), DSM_ERR_IO, "does not exist");
    ASSERT_FAILS(dsm_engine_load_checkpoint(e, bad, NULL, DSM_CKPT_LOAD_FALLBACK, NULL, NULL), DSM_ERR_IO,
                 "no checkpoint in");
    /* Bad on one rank only: every rank fails. */
    ASSERT_FAILS(dsm_engine_load_checkpoint(e, dir, NULL, test_rank == test_size - 1 ? 0x40u : 0u, NULL, NULL),
                 DSM_ERR_INVALID_ARGUMENT, "unknown bits 0x40");
    ASSERT_OK(dsm_engine_free(&e));

    /* keep_last: a count >= 0. */
    const char *bad_keep[4] = {"-1", "\"2\"", "1.5", "true"};
    const char *said[4] = {"got -1", "got \"2\"", "got 1.5", "got true"};
    for (int k = 0; k < 4; ++k) {
        char cfg[1024], extra[128];
        snprintf(extra, sizeof extra, ", \"checkpoint\": {\"keep_last\": %s}", bad_keep[k]);
        config(cfg, sizeof cfg, 1, FP32, extra);
        dsm_param_desc_t d[NP];
        float bias = 0.0f;
        params(d, &bias);
        dsm_engine_t x = NULL;
        ASSERT_FAILS(dsm_engine_init_comm(MPI_COMM_WORLD, cfg, d, NP, &x), DSM_ERR_CONFIG, said[k]);
        assert_non_null(strstr(dsm_last_error(), "checkpoint.keep_last"));
        assert_null(x);
    }
}

/* keep_last N: the N newest complete checkpoints of libdsm stay, and the one
   `latest` names; other files stay. */
static void test_keep_last(void **state) {
    (void)state;
    char path[600], kdir[300];
    for (int mode = 0; mode < 2; ++mode) {
        snprintf(kdir, sizeof kdir, "%s/keep%d", dir, mode);
        char extra[256];
        snprintf(extra, sizeof extra, ", \"checkpoint\": {\"keep_last\": 2%s}",
                 mode ? ", \"writer\": {\"decoupled\": true}" : "");
        dsm_engine_t e = engine_on(MPI_COMM_WORLD, 2, FP32, extra, 0.0f);
        if (test_rank == 0) { /* a file libdsm did not write */
            assert_int_equal(mkdir(kdir, 0777), 0);
            snprintf(path, sizeof path, "%s/other.h5", kdir);
            FILE *f = fopen(path, "w");
            assert_non_null(f);
            fputs("not a checkpoint\n", f);
            fclose(f);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        const char *tags[4] = {"s1", "s2", "s3", "s4"};
        for (int k = 0; k < 4; ++k) {
            train(e, MPI_COMM_WORLD, 1);
            ASSERT_OK(dsm_engine_save_checkpoint(e, kdir, tags[k], NULL, 0));
            ASSERT_OK(dsm_engine_checkpoint_wait(e));
            if (k == 1) truncate_file(kdir, "s1"); /* incomplete now: never removed */
        }
        for (int k = 0; k < 4; ++k) {
            path_of(path, sizeof path, kdir, tags[k]);
            assert_int_equal(file_exists(path), k != 1);
        }
        snprintf(path, sizeof path, "%s/other.h5", kdir);
        assert_true(file_exists(path));

        /* Make s3 the newest by time: with keep_last 2 it stays, and so does
           the new s5 that `latest` names; s4 goes. */
        if (test_rank == 0) {
            path_of(path, sizeof path, kdir, "s3");
            struct timeval tv[2];
            gettimeofday(&tv[0], NULL);
            tv[0].tv_sec += 3600;
            tv[1] = tv[0];
            assert_int_equal(utimes(path, tv), 0);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        ASSERT_OK(dsm_engine_free(&e));
        snprintf(extra, sizeof extra, ", \"checkpoint\": {\"keep_last\": 1%s}",
                 mode ? ", \"writer\": {\"decoupled\": true}" : "");
        e = engine_on(MPI_COMM_WORLD, 2, FP32, extra, 0.0f);
        ASSERT_OK(dsm_engine_save_checkpoint(e, kdir, "s5", NULL, 0));
        ASSERT_OK(dsm_engine_free(&e));
        const char *stay[3] = {"s3", "s5", "s1"}, *gone[2] = {"s2", "s4"};
        for (int k = 0; k < 3; ++k) {
            path_of(path, sizeof path, kdir, stay[k]);
            assert_true(file_exists(path));
        }
        for (int k = 0; k < 2; ++k) {
            path_of(path, sizeof path, kdir, gone[k]);
            assert_false(file_exists(path));
        }
        char latest[64];
        read_latest(kdir, latest, sizeof latest);
        assert_string_equal(latest, "s5");
    }
}

/* DSM_CKPT_LOAD_FALLBACK: the newest checkpoint that verifies, every skipped
   one reported; no fallback without the flag; a mismatch is never skipped. */
static void test_fallback(void **state) {
    (void)state;
    char fdir[300], path[600];
    snprintf(fdir, sizeof fdir, "%s/fb", dir);
    dsm_engine_t e = engine_on(MPI_COMM_WORLD, 1, FP32, "", 0.0f);
    float at_g2[TOTAL], loaded[TOTAL];
    const char *tags[3] = {"g1", "g2", "g3"};
    for (int k = 0; k < 3; ++k) {
        train(e, MPI_COMM_WORLD, 1);
        if (k == 1) snapshot(e, at_g2);
        ASSERT_OK(dsm_engine_save_checkpoint(e, fdir, tags[k], NULL, 0));
        MPI_Barrier(MPI_COMM_WORLD);
        usleep(20000); /* distinct modification times on coarse file systems */
    }
    truncate_file(fdir, "g3");
    ASSERT_FAILS(dsm_engine_load_checkpoint(e, fdir, NULL, 0, NULL, NULL), DSM_ERR_IO, "g3.h5");

    dsm_engine_t f = engine_on(MPI_COMM_WORLD, 2, FP32, "", 1.0f);
    ASSERT_OK(dsm_engine_load_checkpoint(f, fdir, NULL, DSM_CKPT_LOAD_FALLBACK, NULL, NULL));
    snapshot(f, loaded);
    assert_memory_equal(loaded, at_g2, sizeof loaded);
    char *text = report(f);
    assert_non_null(strstr(text, "\"tag\": \"g2\""));
    assert_non_null(strstr(text, "\"tag\": \"g3\""));
    assert_non_null(strstr(text, "\"reason\""));
    dsm_free(text);
    char *plain = NULL;
    ASSERT_OK(dsm_engine_load_report(f, DSM_FORMAT_TEXT, &plain));
    assert_non_null(strstr(plain, "skipped: g3: "));
    dsm_free(plain);

    /* A named tag that is missing; `latest` removed. */
    ASSERT_FAILS(dsm_engine_load_checkpoint(f, fdir, "nope", 0, NULL, NULL), DSM_ERR_IO, "nope.h5");
    ASSERT_OK(dsm_engine_load_checkpoint(f, fdir, "nope", DSM_CKPT_LOAD_FALLBACK, NULL, NULL));
    text = report(f);
    assert_non_null(strstr(text, "\"tag\": \"g2\""));
    dsm_free(text);
    if (test_rank == 0) {
        snprintf(path, sizeof path, "%s/latest", fdir);
        assert_int_equal(unlink(path), 0);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    ASSERT_FAILS(dsm_engine_load_checkpoint(f, fdir, NULL, 0, NULL, NULL), DSM_ERR_IO, "latest");
    ASSERT_OK(dsm_engine_load_checkpoint(f, fdir, NULL, DSM_CKPT_LOAD_FALLBACK, NULL, NULL));

    /* Nothing verifies: every one named. */
    truncate_file(fdir, "g2");
    truncate_file(fdir, "g1");
    ASSERT_FAILS(dsm_engine_load_checkpoint(f, fdir, NULL, DSM_CKPT_LOAD_FALLBACK, NULL, NULL), DSM_ERR_IO,
                 "no checkpoint in");
    assert_non_null(strstr(dsm_last_error(), "'g1'"));
    assert_non_null(strstr(dsm_last_error(), "'g3'"));
    ASSERT_OK(dsm_engine_free(&f));

    /* Another model's checkpoint is a mismatch, not skipped. */
    ASSERT_OK(dsm_engine_save_checkpoint(e, fdir, "g4", NULL, 0));
    ASSERT_OK(dsm_engine_free(&e));
    char cfg[1024];
    config(cfg, sizeof cfg, 1, FP32, "");
    dsm_param_desc_t d[NP];
    float bias = 0.0f;
    params(d, &bias);
    d[0].name = "renamed";
    ASSERT_OK(dsm_engine_init_comm(MPI_COMM_WORLD, cfg, d, NP, &e));
    ASSERT_FAILS(dsm_engine_load_checkpoint(e, fdir, NULL, DSM_CKPT_LOAD_FALLBACK, NULL, NULL), DSM_ERR_MISMATCH,
                 "renamed");
    ASSERT_OK(dsm_engine_free(&e));
}

/* DSM_CKPT_LOAD_NON_STRICT: matching tensors load, the rest is listed. */
static void test_non_strict(void **state) {
    (void)state;
    dsm_engine_t e = engine_on(MPI_COMM_WORLD, 3, FP32, "", 0.0f);
    train(e, MPI_COMM_WORLD, 2);
    float saved[TOTAL];
    snapshot(e, saved);
    ASSERT_OK(dsm_engine_save_checkpoint(e, dir, "full", NULL, 0));
    ASSERT_OK(dsm_engine_free(&e));

    /* w as saved, b of another shape, s absent, a new x; e frozen as saved. */
    static const int64_t shape_b6[1] = {6}, shape_x[1] = {4};
    char cfg[1024];
    config(cfg, sizeof cfg, 2, FP32, "");
    dsm_param_desc_t d[NP];
    float bias = 1.0f;
    params(d, &bias);
    d[1].shape = shape_b6;
    d[2].name = "x";
    d[2].shape = shape_x;
    ASSERT_OK(dsm_engine_init_comm(MPI_COMM_WORLD, cfg, d, NP, &e));
    float before_x[4], after[TOTAL];
    const void *v;
    ASSERT_OK(dsm_engine_param_acquire(e, 2, &v));
    engine_read_f32(e, v, before_x, 4);
    ASSERT_OK(dsm_engine_param_release(e, 2));

    ASSERT_FAILS(dsm_engine_load_checkpoint(e, dir, "full", 0, NULL, NULL), DSM_ERR_MISMATCH, "unexpected tensor 's'");
    ASSERT_OK(dsm_engine_load_checkpoint(e, dir, "full", DSM_CKPT_LOAD_NON_STRICT, NULL, NULL));
    char *text = report(e);
    assert_non_null(strstr(text, "\"/params/x\""));
    assert_non_null(strstr(text, "\"/params/s\""));
    assert_non_null(strstr(text, "/params/b [5] in the checkpoint, [6] in the engine"));
    assert_non_null(strstr(text, "/optimizer/exp_avg/x"));
    dsm_free(text);
    /* w and e loaded; x kept its values. */
    size_t off = 0;
    for (int i = 0; i < NP; ++i) {
        const int64_t n = i == 1 ? 6 : i == 2 ? 4 : numel[i];
        ASSERT_OK(dsm_engine_param_acquire(e, i, &v));
        engine_read_f32(e, v, after + off, (size_t)n);
        ASSERT_OK(dsm_engine_param_release(e, i));
        off += (size_t)n;
    }
    assert_memory_equal(after, saved, 35 * sizeof(float));                    /* w */
    assert_memory_equal(after + 35 + 6, before_x, sizeof before_x);           /* x */
    assert_memory_equal(after + 35 + 6 + 4, saved + 35 + 5 + 1, 9 * sizeof(float)); /* e */
    train(e, MPI_COMM_WORLD, 1);
    ASSERT_OK(dsm_engine_free(&e));
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_async_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_async_waits, setup, teardown),
        cmocka_unit_test_setup_teardown(test_async_failure, setup, teardown),
        cmocka_unit_test_setup_teardown(test_async_bad_arguments, setup, teardown),
        cmocka_unit_test_setup_teardown(test_keep_last, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fallback, setup, teardown),
        cmocka_unit_test_setup_teardown(test_non_strict, setup, teardown),
    };
    return RUN_MPI_TESTS("test_checkpoint_async", tests);
}
