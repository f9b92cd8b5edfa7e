/*
 * Shared helpers of the MPI tests: every test program runs its CMocka group
 * on every rank; the launcher wrapper reduces the ranks' exit codes to one.
 * A test that fails on some ranks only fails every rank, or ends the job:
 * none hangs (see mpi_test_agree).
 */
#ifndef DSM_MPI_TEST_H
#define DSM_MPI_TEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef __cplusplus
extern "C" { /* this CMocka header has no C++ guards */
#endif
#include <cmocka.h>
#ifdef __cplusplus
}
#endif
#include <mpi.h>

#include "dsm.h"

static int test_rank, test_size;

/* ---------------------------------------------------------------- nodes
 * The real nodes the ranks run on, as the library finds them: ranks that
 * share memory (MPI_COMM_TYPE_SHARED) are on one node, a node is known by
 * its lowest rank. run_mpi_group fills these before the tests run; tests
 * derive what they expect from them instead of assuming one host. */
static int *test_node_of; /* [test_size]: the lowest rank on rank r's node */
static int test_nnodes;   /* how many nodes */

/* The number of ranks on rank r's node. */
static inline int test_node_size(int r) {
    int n = 0;
    for (int q = 0; q < test_size; ++q) n += test_node_of[q] == test_node_of[r];
    return n;
}

static inline int test_max_node_size(void) {
    int most = 0;
    for (int r = 0; r < test_size; ++r) most = test_node_size(r) > most ? test_node_size(r) : most;
    return most;
}

/* The rank at each position under node-aware placement (DSM_PLACEMENT_NODE,
   the default) where no NUMA domain tells ranks apart (unbound ranks, or one
   domain): the ranks sorted by node, nodes in the order of their lowest
   ranks, then by rank. On one host: position = rank. */
static inline void test_node_order(int *rank_of_position) {
    int pos = 0;
    for (int node = 0; node < test_size; ++node)
        for (int r = 0; r < test_size; ++r)
            if (test_node_of[r] == node) rank_of_position[pos++] = r;
}

static inline void test_find_nodes(void) {
    MPI_Comm shared;
    int lowest = test_rank;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, test_rank, MPI_INFO_NULL, &shared);
    MPI_Allreduce(&test_rank, &lowest, 1, MPI_INT, MPI_MIN, shared);
    MPI_Comm_free(&shared);
    test_node_of = (int *)malloc(sizeof(int) * (size_t)test_size);
    MPI_Allgather(&lowest, 1, MPI_INT, test_node_of, 1, MPI_INT, MPI_COMM_WORLD);
    test_nnodes = 0;
    for (int r = 0; r < test_size; ++r) test_nnodes += test_node_of[r] == r;
}

/* Wall-clock deadlines (a call ends within so many seconds) are asserted
   only where DSM_TEST_DEADLINES=1: the multinode stage sets it; `make check`
   asserts statuses and messages, and its outer timeout is the hang guard. */
static inline int test_deadlines(void) {
    const char *e = getenv("DSM_TEST_DEADLINES");
    return e != NULL && strcmp(e, "1") == 0;
}

/* Assert a call succeeded, showing the library's message when it did not. */
#define ASSERT_OK(call)                                                                  \
    do {                                                                                 \
        dsm_status_t st_ = (call);                                                       \
        if (st_ != DSM_SUCCESS) fail_msg("%s: %s", #call, dsm_last_error());         \
    } while (0)

/* Assert a call failed with `status` and a message containing `text`. */
#define ASSERT_FAILS(call, status, text)                                                 \
    do {                                                                                 \
        dsm_status_t st_ = (call);                                                       \
        if (st_ != (status))                                                             \
            fail_msg("%s returned %d (%s), expected %d; message: %s", #call, (int)st_,   \
                     dsm_status_string(st_), (int)(status), dsm_last_error());       \
        if (strstr(dsm_last_error(), (text)) == NULL)                                \
            fail_msg("%s: message \"%s\" lacks \"%s\"", #call, dsm_last_error(),     \
                     (text));                                                            \
    } while (0)

/* ---------------------------------------------------------------- failing on one rank
 * A CMocka assertion leaves its test at once, on its rank only: the other
 * ranks may be waiting in a collective that the failed rank will never
 * reach. So run_mpi_group wraps every test: at its end (after a failure too)
 * each rank says on a communicator of its own whether the test failed here.
 * When every rank comes, they all learn it and the group goes on (every rank
 * fails the test); a rank that failed and waits DSM_TEST_FAIL_WAIT seconds
 * (default 10) in vain ends the whole job with MPI_Abort once CMocka has
 * printed its failure, as the ranks that did not come are stuck where it
 * left. A failing setup is agreed on alike. */

static MPI_Comm mpi_test_comm = MPI_COMM_NULL;
static const struct CMUnitTest *mpi_test_current; /* the test running, as the caller wrote it */
static int mpi_test_finished, mpi_test_skipped;
static double mpi_test_start; /* MPI_Wtime at the test's setup: rank 0 prints each test's time */

/* skip() ends a test as a failure does; the wrapper must tell them apart. */
#undef skip
#define skip() (mpi_test_skipped = 1, _skip(__FILE__, __LINE__))

/* Set when the ranks did not come to an agreement: the job ends as soon as
   CMocka has printed why this rank failed (before the next test starts). */
static const char *mpi_test_abort_why;
static double mpi_test_abort_wait;

static inline void mpi_test_abort_if_pending(void) {
    if (!mpi_test_abort_why) return;
    fflush(stdout);
    fprintf(stderr,
            "rank %d of %d: %s %s, and the other ranks did not reach its end within %g s "
            "(DSM_TEST_FAIL_WAIT): MPI_Abort ends the job\n",
            test_rank, test_size, mpi_test_current->name, mpi_test_abort_why, mpi_test_abort_wait);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* Every rank says whether `what` failed here; returns the lowest failing
   rank, or test_size when none failed; -1 when this rank failed and the
   others did not come in time (the job is to be aborted). */
static inline int mpi_test_agree(int failed, const char *what) {
    int mine = failed ? test_rank : test_size, lowest = test_size, done = 0;
    MPI_Request req;
    MPI_Iallreduce(&mine, &lowest, 1, MPI_INT, MPI_MIN, mpi_test_comm, &req);
    if (!failed) {
        MPI_Wait(&req, MPI_STATUS_IGNORE);
        return lowest;
    }
    const char *env = getenv("DSM_TEST_FAIL_WAIT");
    const double wait = env && atof(env) > 0 ? atof(env) : 10.0;
    const double deadline = MPI_Wtime() + wait;
    while (MPI_Test(&req, &done, MPI_STATUS_IGNORE), !done) {
        if (MPI_Wtime() > deadline) {
            mpi_test_abort_why = what;
            mpi_test_abort_wait = wait;
            return -1;
        }
        usleep(1000);
    }
    return lowest;
}

static int mpi_test_setup(void **state) {
    mpi_test_abort_if_pending(); /* the previous test's */
    mpi_test_current = (const struct CMUnitTest *)*state;
    mpi_test_finished = mpi_test_skipped = 0;
    mpi_test_start = MPI_Wtime();
    *state = mpi_test_current->initial_state;
    if (!mpi_test_current->setup_func) return 0;
    const int rc = mpi_test_current->setup_func(state);
    const int lowest = mpi_test_agree(rc != 0, "failed in its setup");
    if (lowest < 0) mpi_test_abort_if_pending(); /* (CMocka has printed nothing to wait for) */
    if (lowest < test_size && rc == 0) print_error("the setup failed on rank %d\n", lowest);
    return lowest < test_size;
}

static void mpi_test_body(void **state) {
    mpi_test_current->test_func(state);
    mpi_test_finished = 1;
}

static int mpi_test_teardown(void **state) {
    const int failed = !mpi_test_finished && !mpi_test_skipped;
    const int lowest = mpi_test_agree(failed, "failed");
    if (lowest < 0) return 0; /* no collective teardown: the others are stuck */
    int rc = mpi_test_current->teardown_func ? mpi_test_current->teardown_func(state) : 0;
    if (lowest < test_size && !failed) {
        print_error("rank %d failed this test\n", lowest);
        rc = 1;
    }
    if (test_rank == 0) printf("[ TIME     ] %s: %.2f s\n", mpi_test_current->name, MPI_Wtime() - mpi_test_start);
    return rc;
}

/* The thread level a test program asks for (test_engine: MPI_THREAD_MULTIPLE,
   which overlap_comm's progress thread needs). */
#ifndef MPI_TEST_THREAD_LEVEL
#define MPI_TEST_THREAD_LEVEL MPI_THREAD_SERIALIZED
#endif

/* Run a CMocka group under MPI; returns nonzero on this rank if a test failed. */
static inline int run_mpi_group(const char *name, const struct CMUnitTest *tests, size_t n,
                                int *argc, char ***argv) {
    int provided;
    MPI_Init_thread(argc, argv, MPI_TEST_THREAD_LEVEL, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &test_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &test_size);
    MPI_Comm_dup(MPI_COMM_WORLD, &mpi_test_comm);
    test_find_nodes();
    struct CMUnitTest *wrapped = (struct CMUnitTest *)malloc(n * sizeof *wrapped);
    /* DSM_TEST_ONLY: the names of the tests to run (separated by spaces or
       commas; all when unset). A name that is not a test of this program
       fails the run, so that a typo cannot pass by running nothing. */
    const char *only = getenv("DSM_TEST_ONLY");
    size_t kept = 0;
    int bad_only = 0;
    if (only && *only) {
        char list[4096];
        snprintf(list, sizeof list, "%s", only);
        for (char *save = NULL, *w = strtok_r(list, " ,", &save); w; w = strtok_r(NULL, " ,", &save)) {
            size_t i = 0;
            while (i < n && strcmp(tests[i].name, w) != 0) ++i;
            if (i == n) {
                if (test_rank == 0)
                    fprintf(stderr, "%s: DSM_TEST_ONLY names '%s', which is not one of its tests\n", name, w);
                bad_only = 1;
            }
        }
    }
    for (size_t i = 0; i < n; ++i) {
        if (only && *only) {
            char list[4096];
            int hit = 0;
            snprintf(list, sizeof list, "%s", only);
            for (char *save = NULL, *w = strtok_r(list, " ,", &save); w && !hit; w = strtok_r(NULL, " ,", &save))
                hit = strcmp(tests[i].name, w) == 0;
            if (!hit) continue;
        }
        wrapped[kept] = tests[i];
        wrapped[kept].test_func = mpi_test_body;
        wrapped[kept].setup_func = mpi_test_setup;
        wrapped[kept].teardown_func = mpi_test_teardown;
        wrapped[kept].initial_state = (void *)&tests[i];
        ++kept;
    }
    if (only && *only && test_rank == 0)
        printf("DSM_TEST_ONLY: %zu of the %zu tests of %s run\n", kept, n, name);
    char group[128];
    snprintf(group, sizeof group, "%s[np=%d rank=%d]", name, test_size, test_rank);
    int failed = bad_only || kept == 0 ? 1 : _cmocka_run_group_tests(group, wrapped, kept, NULL, NULL);
    mpi_test_abort_if_pending(); /* the last test's */
    free(wrapped);
    /* Every rank learns whether any rank failed (a failed setup or teardown
       included), so none exits early while another still waits. */
    int any = 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Comm_free(&mpi_test_comm);
    free(test_node_of);
    MPI_Finalize();
    return failed != 0 ? 1 : (any != 0 ? 1 : 0);
}

#define RUN_MPI_TESTS(name, tests) run_mpi_group((name), (tests), sizeof(tests) / sizeof((tests)[0]), &argc, &argv)

#endif
