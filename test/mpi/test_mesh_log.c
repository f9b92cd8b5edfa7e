/*
 * The debug log: DSM_DEBUG / DSM_DEBUG_FILE with %r, rank-prefixed lines, and
 * the warning when a shape cannot keep its innermost dimension inside a node.
 * The log reads its environment once per process, so this program sets it
 * before its first libdsm call.
 */
#include "mpi_test.h"

#include <stdlib.h>
#include <unistd.h>

static char log_prefix[256];

static int file_contains(const char *path, const char *text) {
    FILE *f = fopen(path, "r");
    if (f == NULL) return 0;
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return strstr(buf, text) != NULL;
}

static void check_log(const char *text) {
    MPI_Barrier(MPI_COMM_WORLD);
    if (test_rank != 0) return;
    char path[300];
    snprintf(path, sizeof path, "%s.0", log_prefix);
    if (!file_contains(path, text)) fail_msg("%s lacks \"%s\"", path, text);
}

static dsm_mesh_t create_on(const char *nodes, int dp, int sp) {
    setenv("DSM_SIM_NODES", nodes, 1);
    int shape[2] = {dp, sp};
    const char *names[] = {"dp", "sp"};
    dsm_mesh_t mesh = NULL;
    ASSERT_OK(dsm_mesh_create(MPI_COMM_WORLD, 2, shape, names, &mesh));
    unsetenv("DSM_SIM_NODES");
    return mesh;
}

/* A dimension larger than a node cannot stay inside one: said at INFO. */
static void test_dimension_larger_than_node_is_logged(void **state) {
    (void)state;
    if (test_size < 2) skip();
    dsm_mesh_t mesh = create_on("2:block", 1, test_size);
    ASSERT_OK(dsm_mesh_free(&mesh));
    char expect[200];
    snprintf(expect, sizeof expect,
             ":0 dsm INFO MESH dimension sp (size %d) cannot stay inside a node: with the dimensions "
             "inside it a group needs %d ranks, nodes have at most %d",
             test_size, test_size, test_size / 2);
    check_log(expect);
    check_log("dsm INFO MESH dimension dp (size 1): every group inside one node");
    check_log("dsm INFO INIT libdsm ");
}

/* Uneven nodes break groups that would fit a node: a warning. */
static void test_uneven_nodes_warn(void **state) {
    (void)state;
    if (test_size < 4) skip();
    dsm_mesh_t mesh = create_on("3:block", test_size / 2, 2); /* 4 ranks: 2+1+1; 8 ranks: 3+3+2 */
    ASSERT_OK(dsm_mesh_free(&mesh));
    check_log(":0 dsm WARN MESH dimension sp (size 2) cannot stay inside a node: its groups need 2 ranks");
}

/* Without placement, a round-robin launch puts pairs that node-aware
   placement would keep on a node across nodes: the warning says so. */
static void test_no_placement_warns(void **state) {
    (void)state;
    if (test_size < 4 || test_size % 2) skip();
    setenv("DSM_SIM_NODES", "2:cyclic", 1);
    int shape[2] = {test_size / 2, 2};
    const char *names[] = {"dp", "sp"};
    dsm_mesh_options_t opts = DSM_MESH_OPTIONS_INITIALIZER;
    opts.placement = DSM_PLACEMENT_NONE;
    dsm_mesh_t mesh = NULL;
    ASSERT_OK(dsm_mesh_create_with_options(MPI_COMM_WORLD, 2, shape, names, &opts, &mesh));
    unsetenv("DSM_SIM_NODES");
    ASSERT_OK(dsm_mesh_free(&mesh));
    check_log(":0 dsm WARN MESH dimension sp (size 2) does not stay inside a node: placement none keeps the "
              "launch order of the ranks");
}

static void test_errors_leave_a_breadcrumb(void **state) {
    (void)state;
    int shape[1] = {0};
    const char *names[] = {"dp"};
    dsm_mesh_t mesh = NULL;
    ASSERT_FAILS(dsm_mesh_create(MPI_COMM_WORLD, 1, shape, names, &mesh), DSM_ERR_INVALID_ARGUMENT,
                 "shape[0] is 0");
    char path[300];
    snprintf(path, sizeof path, "%s.%d", log_prefix, test_rank);
    /* file:line of the check, then the message. */
    if (!file_contains(path, "dsm INFO ERROR ") || !file_contains(path, "mesh.cc:"))
        fail_msg("%s has no error breadcrumb", path);
}

static void cleanup(void) {
    char path[300];
    snprintf(path, sizeof path, "%s.%d", log_prefix, test_rank);
    unlink(path);
}

int main(int argc, char **argv) {
    /* The prefix must be the same on all ranks: the launcher's job id is not
       portable, so use the parent's pid (all ranks share it under mpiexec). */
    const char *tmp = getenv("TMPDIR");
    snprintf(log_prefix, sizeof log_prefix, "%s/dsm-log-test-%ld", tmp != NULL ? tmp : "/tmp",
             (long)getppid());
    char file[300];
    snprintf(file, sizeof file, "%s.%%r", log_prefix);
    setenv("DSM_DEBUG", "INFO", 1);
    setenv("DSM_DEBUG_SUBSYS", "INIT,MESH,ERROR", 1);
    setenv("DSM_DEBUG_FILE", file, 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dimension_larger_than_node_is_logged),
        cmocka_unit_test(test_uneven_nodes_warn),
        cmocka_unit_test(test_no_placement_warns),
        cmocka_unit_test(test_errors_leave_a_breadcrumb),
    };
    atexit(cleanup);
    return RUN_MPI_TESTS("mesh_log", tests);
}
