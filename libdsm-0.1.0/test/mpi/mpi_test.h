/*
 * Shared helpers of the MPI tests: every test program runs its CMocka group
 * on every rank; the launcher wrapper reduces the ranks' exit codes to one.
 */
#ifndef DSM_MPI_TEST_H
#define DSM_MPI_TEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

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

/* Assert a call succeeded, showing the library's message when it did not. */
#define ASSERT_OK(call)                                                                  \
    do {                                                                                 \
        dsm_status_t st_ = (call);                                                       \
        if (st_ != DSM_SUCCESS) fail_msg("%s: %s", #call, dsm_get_last_error());         \
    } while (0)

/* Assert a call failed with `status` and a message containing `text`. */
#define ASSERT_FAILS(call, status, text)                                                 \
    do {                                                                                 \
        dsm_status_t st_ = (call);                                                       \
        if (st_ != (status))                                                             \
            fail_msg("%s returned %d (%s), expected %d; message: %s", #call, (int)st_,   \
                     dsm_status_string(st_), (int)(status), dsm_get_last_error());       \
        if (strstr(dsm_get_last_error(), (text)) == NULL)                                \
            fail_msg("%s: message \"%s\" lacks \"%s\"", #call, dsm_get_last_error(),     \
                     (text));                                                            \
    } while (0)

/* Run a CMocka group under MPI; returns nonzero on this rank if a test failed. */
static inline int run_mpi_group(const char *name, const struct CMUnitTest *tests, size_t n,
                                int *argc, char ***argv) {
    int provided;
    MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &test_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &test_size);
    char group[128];
    snprintf(group, sizeof group, "%s[np=%d rank=%d]", name, test_size, test_rank);
    int failed = _cmocka_run_group_tests(group, tests, n, NULL, NULL);
    /* Every rank learns whether any rank failed, so none exits early while
       another still waits in a collective. */
    int any = 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Finalize();
    return failed != 0 ? 1 : (any != 0 ? 1 : 0);
}

#define RUN_MPI_TESTS(name, tests) run_mpi_group((name), (tests), sizeof(tests) / sizeof((tests)[0]), &argc, &argv)

#endif
