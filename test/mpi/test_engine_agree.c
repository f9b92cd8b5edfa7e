/*
 * The engine's agreement messages: ranks that make different engine calls,
 * or the same call with different arguments, fail on every rank with
 * DSM_ERR_MISMATCH and a message that names the call made, the field that
 * differs and each side's value with its ranks, and never a hash or a
 * fingerprint (no number of 10 digits or more). One test per agreement
 * site: the ZeRO-3 gather (parameter index), the gather of a range (offset,
 * count), a gradient bucket's contents, the stop signal, ranks at different
 * collective points (which ranks are where), and the checkpoint tag.
 */
#include <ctype.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include "mpi_test.h"

static const int64_t shape_a[2] = {5, 3}, shape_b[1] = {17};

static const char *CFG2 = "{\"train_micro_batch_size_per_gpu\": 1, \"zero_optimization\": {\"stage\": 2,"
                          " \"reduce_bucket_size\": 8}, \"optimizer\": {\"type\": \"AdamW\"}}";
static const char *CFG3 = "{\"train_micro_batch_size_per_gpu\": 1, \"zero_optimization\": {\"stage\": 3,"
                          " \"stage3_param_persistence_threshold\": 0}, \"optimizer\": {\"type\": \"SGD\"}}";
static const char *CFG2_FAIL_TAGS = "{\"train_micro_batch_size_per_gpu\": 1, \"zero_optimization\": {\"stage\": 2},"
                                    " \"optimizer\": {\"type\": \"AdamW\"},"
                                    " \"checkpoint\": {\"tag_validation\": \"Fail\"}}";

static void params(dsm_param_desc_t d[2]) {
    memset(d, 0, 2 * sizeof d[0]);
    d[0].name = "a";
    d[0].ndims = 2;
    d[0].shape = shape_a;
    d[0].dtype = DSM_FLOAT32;
    d[0].trainable = 1;
    d[1] = d[0];
    d[1].name = "b";
    d[1].ndims = 1;
    d[1].shape = shape_b;
}

static dsm_engine_t engine(const char *cfg) {
    dsm_param_desc_t d[2];
    params(d);
    dsm_engine_t e = NULL;
    ASSERT_OK(dsm_engine_init_comm(MPI_COMM_WORLD, cfg, d, 2, &e));
    return e;
}

/* The last error names no hash: no run of 10 or more digits. */
static void no_fingerprint(void) {
    const char *m = dsm_last_error();
    int run = 0;
    for (; *m != '\0'; ++m) {
        run = isdigit((unsigned char)*m) ? run + 1 : 0;
        if (run >= 10) fail_msg("the message prints a number of 10 digits or more: %s", dsm_last_error());
    }
}

/* "rank L" for the last rank, or "ranks 1-L" / "rank 1" for every rank but 0. */
static void last_rank(char *s, size_t n) { snprintf(s, n, "rank %d", test_size - 1); }
static void all_but_0(char *s, size_t n) {
    if (test_size == 2) snprintf(s, n, "rank 1");
    else if (test_size == 3) snprintf(s, n, "ranks 1, 2");
    else snprintf(s, n, "ranks 1-%d", test_size - 1);
}
static void all_but_last(char *s, size_t n) {
    if (test_size == 2) snprintf(s, n, "rank 0");
    else if (test_size == 3) snprintf(s, n, "ranks 0, 1");
    else snprintf(s, n, "ranks 0-%d", test_size - 2);
}

/* ZeRO-3: the last rank acquires another parameter. */
static void test_gather_index(void **state) {
    (void)state;
    if (test_size < 2) skip();
    dsm_engine_t e = engine(CFG3);
    const void *v;
    const int last = test_rank == test_size - 1;
    char text[256], who[64], others[64];
    all_but_last(others, sizeof others);
    last_rank(who, sizeof who);
    snprintf(text, sizeof text, "on the parameter index: %s %s 0 ('a'); %s has 1 ('b')", others,
             test_size == 2 ? "has" : "have", who);
    ASSERT_FAILS(dsm_engine_param_acquire(e, last ? 1 : 0, &v), DSM_ERR_MISMATCH,
                 "disagree at dsm_engine_param_acquire (ZeRO-3 gather)");
    ASSERT_FAILS(DSM_ERR_MISMATCH, DSM_ERR_MISMATCH, text);
    ASSERT_FAILS(DSM_ERR_MISMATCH, DSM_ERR_MISMATCH, "acquire the same parameters in the same order");
    no_fingerprint();
    ASSERT_OK(dsm_engine_free(&e));
}

/* ZeRO-3 ranges: the same parameter and count, another offset on the last
   rank; then another count. The message names the call made, the field and
   both values, and what is the same. */
static void test_gather_range(void **state) {
    (void)state;
    if (test_size < 2) skip();
    const int last = test_rank == test_size - 1;
    char text[256], who[64], others[64];
    all_but_last(others, sizeof others);
    last_rank(who, sizeof who);
    const char *have = test_size == 2 ? "has" : "have";
    const void *v;

    dsm_engine_t e = engine(CFG3);
    ASSERT_FAILS(dsm_engine_param_acquire_range(e, 1, last ? 8 : 0, 4, &v), DSM_ERR_MISMATCH,
                 "disagree at dsm_engine_param_acquire_range (ZeRO-3 gather of a range) on the offset");
    snprintf(text, sizeof text, "%s %s 0; %s has 8 (the same on every rank: parameter index 1 ('b'), count 4;", others,
             have, who);
    ASSERT_FAILS(DSM_ERR_MISMATCH, DSM_ERR_MISMATCH, text);
    no_fingerprint();
    ASSERT_OK(dsm_engine_free(&e));

    e = engine(CFG3);
    ASSERT_FAILS(dsm_engine_param_acquire_range(e, 1, 4, last ? 5 : 4, &v), DSM_ERR_MISMATCH,
                 "(ZeRO-3 gather of a range) on the count");
    snprintf(text, sizeof text, "%s %s 4; %s has 5 (the same on every rank: parameter index 1 ('b'), offset 4;",
             others, have, who);
    ASSERT_FAILS(DSM_ERR_MISMATCH, DSM_ERR_MISMATCH, text);
    no_fingerprint();
    ASSERT_OK(dsm_engine_free(&e));
}

/* ZeRO-2, buckets of 8 elements: the last rank releases another gradient
   into the bucket; the message names the bucket by index and the first
   entry that differs, with each side's parameter and range. */
static void test_bucket(void **state) {
    (void)state;
    if (test_size < 2) skip();
    dsm_engine_t e = engine(CFG2);
    const int which = test_rank == test_size - 1 ? 1 : 0;
    void *g;
    ASSERT_OK(dsm_engine_grad_acquire(e, which, &g));
    dsm_status_t st = dsm_engine_grad_release(e, which);
    if (st == DSM_SUCCESS) st = dsm_step(e, NULL);
    char text[256], who[64], others[64];
    all_but_last(others, sizeof others);
    last_rank(who, sizeof who);
    ASSERT_FAILS(st, DSM_ERR_MISMATCH,
                 "disagree at dsm_engine_grad_release (bucket reduction) on the gradients in bucket 0: entry 0");
    snprintf(text, sizeof text, "%s %s parameter 0 ('a') [0+15]; %s has parameter 1 ('b') [0+17]", others,
             test_size == 2 ? "has" : "have", who);
    ASSERT_FAILS(st, DSM_ERR_MISMATCH, text);
    ASSERT_FAILS(st, DSM_ERR_MISMATCH, "release the same gradients in the same order");
    no_fingerprint();
    ASSERT_OK(dsm_engine_free(&e));
}

/* Another stop signal on the last rank: both signal numbers named. */
static void test_stop_signal(void **state) {
    (void)state;
    if (test_size < 2) skip();
    dsm_engine_t e = engine(CFG2);
    char text[256], who[64], others[64];
    all_but_last(others, sizeof others);
    last_rank(who, sizeof who);
    snprintf(text, sizeof text, "on the signal number: %s %s %d; %s has %d", others, test_size == 2 ? "has" : "have",
             SIGUSR1, who, SIGUSR2);
    ASSERT_FAILS(dsm_engine_set_stop_signal(e, test_rank == test_size - 1 ? SIGUSR2 : SIGUSR1), DSM_ERR_MISMATCH,
                 "disagree at dsm_engine_set_stop_signal");
    ASSERT_FAILS(DSM_ERR_MISMATCH, DSM_ERR_MISMATCH, text);
    no_fingerprint();
    ASSERT_OK(dsm_engine_free(&e));
}

/* Rank 0 frees the engine while the others step, then rank 0 releases a
   gradient while the others step: the message says which ranks are where. */
static void test_points(void **state) {
    (void)state;
    if (test_size < 2) skip();
    char text[256], others[64];
    all_but_0(others, sizeof others);
    dsm_engine_t e = engine(CFG2);
    snprintf(text, sizeof text, "some are in dsm_step, others in dsm_engine_free: rank 0 is in dsm_engine_free; %s %s in dsm_step",
             others, test_size == 2 ? "is" : "are");
    if (test_rank == 0) {
        ASSERT_FAILS(dsm_engine_free(&e), DSM_ERR_MISMATCH, text);
    } else {
        ASSERT_FAILS(dsm_step(e, NULL), DSM_ERR_MISMATCH, text);
        ASSERT_OK(dsm_engine_free(&e));
    }
    no_fingerprint();

    e = engine(CFG2);
    void *g;
    dsm_status_t st;
    if (test_rank == 0) {
        ASSERT_OK(dsm_engine_grad_acquire(e, 1, &g)); /* 17 elements: the bucket of 8 is full */
        st = dsm_engine_grad_release(e, 1);
    } else {
        st = dsm_step(e, NULL);
    }
    snprintf(text, sizeof text,
             "some are in dsm_engine_grad_release (bucket reduction), others in dsm_step: rank 0 is in "
             "dsm_engine_grad_release (bucket reduction); %s %s in dsm_step",
             others, test_size == 2 ? "is" : "are");
    ASSERT_FAILS(st, DSM_ERR_MISMATCH, text);
    no_fingerprint();
    ASSERT_OK(dsm_engine_free(&e));
}

/* Different checkpoint tags under tag_validation "Fail": both tags named. */
static void test_tags(void **state) {
    (void)state;
    if (test_size < 2) skip();
    int hdf5 = 0;
    ASSERT_OK(dsm_library_feature("hdf5", &hdf5));
    if (!hdf5) skip();
    char dir[256];
    if (test_rank == 0) {
        const char *tmp = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/dsm-test-engine-agree-XXXXXX", tmp != NULL ? tmp : "/tmp");
        assert_non_null(mkdtemp(dir));
    }
    MPI_Bcast(dir, (int)sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    dsm_engine_t e = engine(CFG2_FAIL_TAGS);
    char tag[32], text[128];
    snprintf(tag, sizeof tag, "tag_r%d", test_rank == 0 ? 0 : 1);
    ASSERT_FAILS(dsm_engine_save_checkpoint(e, dir, tag, NULL, 0), DSM_ERR_MISMATCH,
                 "the ranks passed different checkpoint tags (the tag argument): rank 0 passed 'tag_r0', rank 1 passed "
                 "'tag_r1'");
    (void)text;
    no_fingerprint();
    ASSERT_OK(dsm_engine_free(&e));
    MPI_Barrier(MPI_COMM_WORLD);
    if (test_rank == 0) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        assert_int_equal(system(cmd), 0);
    }
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gather_index), cmocka_unit_test(test_gather_range), cmocka_unit_test(test_bucket),
        cmocka_unit_test(test_stop_signal),  cmocka_unit_test(test_points),       cmocka_unit_test(test_tags),
    };
    return RUN_MPI_TESTS("test_engine_agree", tests);
}
