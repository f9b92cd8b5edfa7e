/*
 * Bad arguments to dsm_mesh_create: every rank returns the same error with a
 * message naming the bad value, also when only one rank passed it, and
 * nothing hangs or leaks into the next call.
 */
#include "mpi_test.h"

#include <stdlib.h>

static const char *dp_sp[] = {"dp", "sp"};

/* Create with the given arguments on every rank and expect `status` + `text` everywhere. */
static void expect_create_fails(int ndims, const int *shape, const char *const *names,
                                dsm_status_t status, const char *text) {
    dsm_mesh_t mesh = (dsm_mesh_t)&mesh; /* garbage that must be overwritten */
    ASSERT_FAILS(dsm_mesh_create(MPI_COMM_WORLD, ndims, shape, names, &mesh), status, text);
    assert_null(mesh);
}

/* After an error the next collective call works: nothing is left half done. */
static void expect_next_create_works(void) {
    int shape[1] = {-1};
    const char *names[] = {"dp"};
    dsm_mesh_t mesh = NULL;
    ASSERT_OK(dsm_mesh_create(MPI_COMM_WORLD, 1, shape, names, &mesh));
    ASSERT_OK(dsm_mesh_free(&mesh));
}

static int last(void) { return test_rank == test_size - 1; }

static void test_product_mismatch(void **state) {
    (void)state;
    int shape[2] = {test_size + 1, 1};
    expect_create_fails(2, shape, dp_sp, DSM_ERR_INVALID_ARGUMENT, "communicator size");
    int big[2] = {test_size, 3};
    expect_create_fails(2, big, dp_sp, DSM_ERR_INVALID_ARGUMENT, "communicator size");
    expect_next_create_works();
}

static void test_bad_sizes(void **state) {
    (void)state;
    int zero[2] = {test_size, 0};
    expect_create_fails(2, zero, dp_sp, DSM_ERR_INVALID_ARGUMENT, "shape[1] is 0");
    int neg[2] = {-3, test_size};
    expect_create_fails(2, neg, dp_sp, DSM_ERR_INVALID_ARGUMENT, "shape[0] is -3");
    int two[2] = {-1, -1};
    expect_create_fails(2, two, dp_sp, DSM_ERR_INVALID_ARGUMENT, "both -1");
    int indiv[2] = {-1, test_size + 1};
    expect_create_fails(2, indiv, dp_sp, DSM_ERR_INVALID_ARGUMENT, "communicator size");
    if (test_size > 3 && test_size % 3 != 0) {
        int three[2] = {-1, 3};
        expect_create_fails(2, three, dp_sp, DSM_ERR_INVALID_ARGUMENT, "not divisible by 3");
    }
    int shape[1] = {test_size};
    expect_create_fails(0, shape, dp_sp, DSM_ERR_INVALID_ARGUMENT, "ndims is 0");
    int nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, test_size};
    const char *names9[9] = {"a", "b", "c", "d", "e", "f", "g", "h", "i"};
    expect_create_fails(9, nine, names9, DSM_ERR_INVALID_ARGUMENT, "ndims is 9");
    expect_next_create_works();
}

static void test_bad_names(void **state) {
    (void)state;
    int shape[2] = {test_size, 1};
    const char *dup[] = {"dp", "dp"};
    expect_create_fails(2, shape, dup, DSM_ERR_INVALID_ARGUMENT, "must be unique");
    const char *empty[] = {"dp", ""};
    expect_create_fails(2, shape, empty, DSM_ERR_INVALID_ARGUMENT, "names[1] is empty");
    const char *digit[] = {"1dp", "sp"};
    expect_create_fails(2, shape, digit, DSM_ERR_INVALID_ARGUMENT, "\"1dp\" is not an identifier");
    const char *space[] = {"dp", "s p"};
    expect_create_fails(2, shape, space, DSM_ERR_INVALID_ARGUMENT, "\"s p\"");
    char longname[DSM_NAME_MAX + 2];
    memset(longname, 'x', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    const char *toolong[] = {"dp", longname};
    expect_create_fails(2, shape, toolong, DSM_ERR_INVALID_ARGUMENT, "64 characters");
    const char *null_entry[] = {"dp", NULL};
    expect_create_fails(2, shape, null_entry, DSM_ERR_NULL_POINTER, "names[1] is NULL");
    expect_create_fails(2, shape, NULL, DSM_ERR_NULL_POINTER, "names is NULL");
    expect_create_fails(2, NULL, dp_sp, DSM_ERR_NULL_POINTER, "shape is NULL");
    expect_next_create_works();
}

/* Only the last rank passes something bad: all ranks fail, and the message says which rank. */
static void test_one_bad_rank(void **state) {
    (void)state;
    char where[32];
    snprintf(where, sizeof where, "rank %d: ", test_size - 1);
    char text[128];

    int shape[2] = {test_size, last() ? 0 : 1};
    snprintf(text, sizeof text, "%sshape[1] is 0", where);
    expect_create_fails(2, shape, dp_sp, DSM_ERR_INVALID_ARGUMENT, text);

    int good[2] = {test_size, 1};
    const char *bad_names[] = {"dp", last() ? "" : "sp"};
    snprintf(text, sizeof text, "%snames[1] is empty", where);
    expect_create_fails(2, good, bad_names, DSM_ERR_INVALID_ARGUMENT, text);

    snprintf(text, sizeof text, "%sshape is NULL", where);
    expect_create_fails(2, last() ? NULL : good, dp_sp, DSM_ERR_NULL_POINTER, text);

    /* A NULL output pointer on one rank. */
    dsm_mesh_t mesh = NULL;
    snprintf(text, sizeof text, "%smesh (the output) is NULL", where);
    ASSERT_FAILS(dsm_mesh_create(MPI_COMM_WORLD, 2, good, dp_sp, last() ? NULL : &mesh),
                 DSM_ERR_NULL_POINTER, text);
    assert_null(mesh);

    /* A bad environment on one rank is a bad argument too. */
    if (last()) setenv("DSM_MESH_PLACEMENT", "diagonal", 1);
    snprintf(text, sizeof text, "%senvironment DSM_MESH_PLACEMENT=\"diagonal\"", where);
    expect_create_fails(2, good, dp_sp, DSM_ERR_INVALID_ARGUMENT, text);
    unsetenv("DSM_MESH_PLACEMENT");
    expect_next_create_works();
}

/* Valid but different arguments on different ranks. */
static void test_mismatch_across_ranks(void **state) {
    (void)state;
    if (test_size < 2) skip();
    int shape[2] = {test_size, 1};
    const char *other[] = {"dp", "cp"};
    expect_create_fails(2, shape, last() ? other : dp_sp, DSM_ERR_MISMATCH, "names [dp,cp]");
    int swapped[2] = {1, test_size};
    expect_create_fails(2, last() ? swapped : shape, dp_sp, DSM_ERR_MISMATCH, "differ across ranks");
    /* Placement chosen differently through the environment. */
    if (last()) setenv("DSM_MESH_PLACEMENT", "none", 1);
    expect_create_fails(2, shape, dp_sp, DSM_ERR_MISMATCH, "placement none");
    unsetenv("DSM_MESH_PLACEMENT");
    expect_next_create_works();
}

static void test_bad_options(void **state) {
    (void)state;
    int shape[1] = {test_size};
    const char *names[] = {"dp"};
    dsm_mesh_t mesh = NULL;
    dsm_mesh_options_t opts = DSM_MESH_OPTIONS_INITIALIZER;
    opts.size = 3;
    ASSERT_FAILS(dsm_mesh_create_with_options(MPI_COMM_WORLD, 1, shape, names, &opts, &mesh),
                 DSM_ERR_INVALID_ARGUMENT, "options->size is 3");
    opts.size = sizeof opts + 8;
    ASSERT_FAILS(dsm_mesh_create_with_options(MPI_COMM_WORLD, 1, shape, names, &opts, &mesh),
                 DSM_ERR_INVALID_ARGUMENT, "DSM_MESH_OPTIONS_INITIALIZER");
    dsm_mesh_options_t bad = DSM_MESH_OPTIONS_INITIALIZER;
    bad.placement = (dsm_placement_t)17;
    ASSERT_FAILS(dsm_mesh_create_with_options(MPI_COMM_WORLD, 1, shape, names, &bad, &mesh),
                 DSM_ERR_INVALID_ARGUMENT, "options->placement is 17");
    bad = (dsm_mesh_options_t)DSM_MESH_OPTIONS_INITIALIZER;
    bad.bind = (dsm_bind_t)-2;
    ASSERT_FAILS(dsm_mesh_create_with_options(MPI_COMM_WORLD, 1, shape, names, &bad, &mesh),
                 DSM_ERR_INVALID_ARGUMENT, "options->bind is -2");
    /* An options struct from an older caller (size covering only the first field) is fine. */
    dsm_mesh_options_t old = DSM_MESH_OPTIONS_INITIALIZER;
    old.size = sizeof(size_t);
    ASSERT_OK(dsm_mesh_create_with_options(MPI_COMM_WORLD, 1, shape, names, &old, &mesh));
    ASSERT_OK(dsm_mesh_free(&mesh));
    setenv("DSM_BIND", "everywhere", 1);
    ASSERT_FAILS(dsm_mesh_create(MPI_COMM_WORLD, 1, shape, names, &mesh), DSM_ERR_INVALID_ARGUMENT,
                 "DSM_BIND=\"everywhere\"");
    unsetenv("DSM_BIND");
    expect_next_create_works();
}

static void test_null_communicator(void **state) {
    (void)state;
    int shape[1] = {1};
    const char *names[] = {"dp"};
    dsm_mesh_t mesh = NULL;
    ASSERT_FAILS(dsm_mesh_create(MPI_COMM_NULL, 1, shape, names, &mesh), DSM_ERR_INVALID_ARGUMENT,
                 "MPI_COMM_NULL");
    assert_null(mesh);
    /* MPI_COMM_SELF works on every rank on its own. */
    ASSERT_OK(dsm_mesh_create(MPI_COMM_SELF, 1, shape, names, &mesh));
    ASSERT_OK(dsm_mesh_free(&mesh));
}

static void test_bad_simulated_nodes(void **state) {
    (void)state;
    int shape[1] = {test_size};
    const char *names[] = {"dp"};
    dsm_mesh_t mesh = NULL;
    setenv("DSM_SIM_NODES", "2:diagonal", 1);
    ASSERT_FAILS(dsm_mesh_create(MPI_COMM_WORLD, 1, shape, names, &mesh), DSM_ERR_INVALID_ARGUMENT,
                 "order \"diagonal\"");
    setenv("DSM_SIM_NODES", "a,b,c,d,e,f,g,h,i", 1);
    ASSERT_FAILS(dsm_mesh_create(MPI_COMM_WORLD, 1, shape, names, &mesh), DSM_ERR_INVALID_ARGUMENT,
                 "names 9 nodes");
    setenv("DSM_SIM_NODES", "x:block", 1);
    ASSERT_FAILS(dsm_mesh_create(MPI_COMM_WORLD, 1, shape, names, &mesh), DSM_ERR_INVALID_ARGUMENT,
                 "\"x\" is not an integer");
    unsetenv("DSM_SIM_NODES");
    setenv("DSM_SIM_NUMA", "0", 1);
    if (test_size > 1)
        ASSERT_FAILS(dsm_mesh_create(MPI_COMM_WORLD, 1, shape, names, &mesh), DSM_ERR_INVALID_ARGUMENT,
                     "one per rank is needed");
    unsetenv("DSM_SIM_NUMA");
    expect_next_create_works();
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_product_mismatch),  cmocka_unit_test(test_bad_sizes),
        cmocka_unit_test(test_bad_names),         cmocka_unit_test(test_one_bad_rank),
        cmocka_unit_test(test_mismatch_across_ranks), cmocka_unit_test(test_bad_options),
        cmocka_unit_test(test_null_communicator), cmocka_unit_test(test_bad_simulated_nodes),
    };
    return RUN_MPI_TESTS("mesh_errors", tests);
}
