/* Slicing and flattening: shared communicators, cached groups, their errors. */
#include "mpi_test.h"

static const char *names3[] = {"dp", "cp", "tp"};

/* A 3-D mesh dp x cp x tp with cp and tp of size 2 where the rank count allows. */
static dsm_mesh_t make_3d(int shape[3]) {
    shape[2] = test_size % 2 == 0 ? 2 : 1;
    shape[1] = test_size % 4 == 0 ? 2 : 1;
    shape[0] = test_size / (shape[1] * shape[2]);
    dsm_mesh_t mesh = NULL;
    ASSERT_OK(dsm_mesh_create(MPI_COMM_WORLD, 3, shape, names3, &mesh));
    return mesh;
}

static void test_slice(void **state) {
    (void)state;
    int shape[3], coords[3];
    dsm_mesh_t mesh = make_3d(shape);
    ASSERT_OK(dsm_mesh_coords(mesh, 3, coords));
    const char *dp_tp[] = {"dp", "tp"};
    dsm_mesh_t slice = NULL;
    ASSERT_OK(dsm_mesh_slice(mesh, 2, dp_tp, &slice));
    int nd = 0, s[2], c[2];
    ASSERT_OK(dsm_mesh_ndims(slice, &nd));
    assert_int_equal(nd, 2);
    ASSERT_OK(dsm_mesh_shape(slice, 2, s));
    ASSERT_OK(dsm_mesh_coords(slice, 2, c));
    assert_int_equal(s[0], shape[0]);
    assert_int_equal(s[1], shape[2]);
    assert_int_equal(c[0], coords[0]);
    assert_int_equal(c[1], coords[2]);
    int size = 0, rank = -1;
    ASSERT_OK(dsm_mesh_size(slice, NULL, &size));
    ASSERT_OK(dsm_mesh_rank(slice, NULL, &rank));
    assert_int_equal(size, shape[0] * shape[2]);
    assert_int_equal(rank, coords[0] * shape[2] + coords[2]);
    /* The slice reuses the parent's communicators. */
    MPI_Comm a, b;
    ASSERT_OK(dsm_mesh_comm(mesh, "tp", &a));
    ASSERT_OK(dsm_mesh_comm(slice, "tp", &b));
    assert_true(a == b);
    ASSERT_FAILS(dsm_mesh_comm(slice, NULL, &a), DSM_ERR_NOT_SUPPORTED, "dsm_mesh_flatten");
    ASSERT_FAILS(dsm_mesh_size(slice, "cp", &size), DSM_ERR_NOT_FOUND, "known: dp, tp");

    /* A one-dimension slice's own communicator is that dimension's. */
    const char *cp[] = {"cp"};
    dsm_mesh_t one = NULL;
    ASSERT_OK(dsm_mesh_slice(mesh, 1, cp, &one));
    ASSERT_OK(dsm_mesh_comm(one, NULL, &a));
    ASSERT_OK(dsm_mesh_comm(mesh, "cp", &b));
    assert_true(a == b);

    /* The slice outlives its parent: the communicators stay until the last handle goes. */
    ASSERT_OK(dsm_mesh_free(&mesh));
    ASSERT_OK(dsm_mesh_comm(slice, "dp", &a));
    int one_v = 1, sum = 0;
    assert_int_equal(MPI_Allreduce(&one_v, &sum, 1, MPI_INT, MPI_SUM, a), MPI_SUCCESS);
    assert_int_equal(sum, shape[0]);
    ASSERT_OK(dsm_mesh_free(&slice));
    ASSERT_OK(dsm_mesh_free(&one));
}

static void test_slice_errors(void **state) {
    (void)state;
    int shape[3];
    dsm_mesh_t mesh = make_3d(shape);
    dsm_mesh_t slice = (dsm_mesh_t)&slice;
    const char *order[] = {"tp", "dp"};
    ASSERT_FAILS(dsm_mesh_slice(mesh, 2, order, &slice), DSM_ERR_INVALID_ARGUMENT,
                 "names must follow the mesh order (dp, cp, tp): \"dp\" comes before \"tp\"");
    assert_null(slice);
    const char *twice[] = {"dp", "dp"};
    ASSERT_FAILS(dsm_mesh_slice(mesh, 2, twice, &slice), DSM_ERR_INVALID_ARGUMENT, "\"dp\" is named twice");
    const char *unknown[] = {"dp", "pp"};
    ASSERT_FAILS(dsm_mesh_slice(mesh, 2, unknown, &slice), DSM_ERR_NOT_FOUND, "\"pp\"");
    ASSERT_FAILS(dsm_mesh_slice(mesh, 0, unknown, &slice), DSM_ERR_INVALID_ARGUMENT, "nnames is 0");
    ASSERT_FAILS(dsm_mesh_slice(mesh, 4, unknown, &slice), DSM_ERR_INVALID_ARGUMENT, "nnames is 4");
    ASSERT_FAILS(dsm_mesh_slice(mesh, 1, NULL, &slice), DSM_ERR_NULL_POINTER, "names is NULL");
    const char *null_entry[] = {NULL};
    ASSERT_FAILS(dsm_mesh_slice(mesh, 1, null_entry, &slice), DSM_ERR_NULL_POINTER, "names[0] is NULL");
    ASSERT_FAILS(dsm_mesh_slice(mesh, 1, order, NULL), DSM_ERR_NULL_POINTER, "slice is NULL");
    ASSERT_FAILS(dsm_mesh_slice(NULL, 1, order, &slice), DSM_ERR_NULL_POINTER, "mesh is NULL");
    ASSERT_OK(dsm_mesh_free(&mesh));
}

static void test_flatten(void **state) {
    (void)state;
    int shape[3], coords[3];
    dsm_mesh_t mesh = make_3d(shape);
    ASSERT_OK(dsm_mesh_coords(mesh, 3, coords));
    const char *dp_cp[] = {"dp", "cp"};
    MPI_Comm flat = MPI_COMM_NULL, again = MPI_COMM_NULL;
    ASSERT_OK(dsm_mesh_flatten(mesh, 2, dp_cp, "dp_cp", &flat));
    int size = 0, rank = -1, csize = 0, crank = -1;
    ASSERT_OK(dsm_mesh_size(mesh, "dp_cp", &size));
    ASSERT_OK(dsm_mesh_rank(mesh, "dp_cp", &rank));
    MPI_Comm_size(flat, &csize);
    MPI_Comm_rank(flat, &crank);
    assert_int_equal(size, shape[0] * shape[1]);
    assert_int_equal(csize, size);
    assert_int_equal(rank, coords[0] * shape[1] + coords[1]);
    assert_int_equal(crank, rank);
    /* Members differ only in dp and cp; in group-rank order. */
    int members[64], gathered[64];
    ASSERT_OK(dsm_mesh_group_ranks(mesh, "dp_cp", 64, members));
    MPI_Allgather(&test_rank, 1, MPI_INT, gathered, 1, MPI_INT, flat);
    for (int i = 0; i < size; ++i) {
        assert_int_equal(members[i], gathered[i]);
        assert_int_equal(members[i] % shape[2], coords[2]);
    }
    /* Cached by name. */
    ASSERT_OK(dsm_mesh_flatten(mesh, 2, dp_cp, "dp_cp", &again));
    assert_true(flat == again);
    MPI_Comm by_name;
    ASSERT_OK(dsm_mesh_comm(mesh, "dp_cp", &by_name));
    assert_true(by_name == flat);
    ASSERT_OK(dsm_mesh_flatten(mesh, 2, dp_cp, "dp_cp", NULL));

    /* Visible from a slice that has the dimensions, not from one that lacks them. */
    dsm_mesh_t s1 = NULL, s2 = NULL;
    ASSERT_OK(dsm_mesh_slice(mesh, 2, dp_cp, &s1));
    ASSERT_OK(dsm_mesh_comm(s1, "dp_cp", &by_name));
    assert_true(by_name == flat);
    const char *tp[] = {"tp"};
    ASSERT_OK(dsm_mesh_slice(mesh, 1, tp, &s2));
    ASSERT_FAILS(dsm_mesh_comm(s2, "dp_cp", &by_name), DSM_ERR_NOT_FOUND, "\"dp_cp\"");
    /* Flattening from a slice is collective over the whole mesh too. */
    const char *cp_tp[] = {"cp", "tp"};
    ASSERT_OK(dsm_mesh_flatten(mesh, 2, cp_tp, "cp_tp", NULL));
    ASSERT_OK(dsm_mesh_size(mesh, "cp_tp", &size));
    assert_int_equal(size, shape[1] * shape[2]);
    ASSERT_OK(dsm_mesh_flatten(s1, 1, dp_cp, "dp_only", NULL));
    ASSERT_OK(dsm_mesh_size(mesh, "dp_only", &size));
    assert_int_equal(size, shape[0]);

    char *text = NULL;
    ASSERT_OK(dsm_mesh_describe(mesh, DSM_FORMAT_JSON, &text));
    assert_non_null(strstr(text, "\"dp_cp\""));
    assert_non_null(strstr(text, "\"cp_tp\""));
    dsm_free(text);
    ASSERT_OK(dsm_mesh_free(&s1));
    ASSERT_OK(dsm_mesh_free(&s2));
    ASSERT_OK(dsm_mesh_free(&mesh));
}

static void test_flatten_errors(void **state) {
    (void)state;
    int shape[3];
    dsm_mesh_t mesh = make_3d(shape);
    const char *dp_cp[] = {"dp", "cp"};
    const char *cp_tp[] = {"cp", "tp"};
    const char *order[] = {"cp", "dp"};
    ASSERT_FAILS(dsm_mesh_flatten(mesh, 2, dp_cp, "tp", NULL), DSM_ERR_INVALID_ARGUMENT,
                 "flat_name \"tp\" clashes with a dimension");
    ASSERT_OK(dsm_mesh_flatten(mesh, 2, dp_cp, "group", NULL));
    ASSERT_FAILS(dsm_mesh_flatten(mesh, 2, cp_tp, "group", NULL), DSM_ERR_INVALID_ARGUMENT,
                 "clashes with the flattened group of the same name over (dp, cp)");
    ASSERT_FAILS(dsm_mesh_flatten(mesh, 2, order, "x", NULL), DSM_ERR_INVALID_ARGUMENT, "mesh order");
    ASSERT_FAILS(dsm_mesh_flatten(mesh, 2, dp_cp, "", NULL), DSM_ERR_INVALID_ARGUMENT, "flat_name is empty");
    ASSERT_FAILS(dsm_mesh_flatten(mesh, 2, dp_cp, "a-b", NULL), DSM_ERR_INVALID_ARGUMENT, "not an identifier");
    ASSERT_FAILS(dsm_mesh_flatten(mesh, 2, dp_cp, NULL, NULL), DSM_ERR_NULL_POINTER, "flat_name is NULL");
    const char *unknown[] = {"dp", "zz"};
    ASSERT_FAILS(dsm_mesh_flatten(mesh, 2, unknown, "x", NULL), DSM_ERR_NOT_FOUND, "\"zz\"");
    /* One rank differs: all fail, none hangs. */
    if (test_size > 1) {
        char text[64];
        snprintf(text, sizeof text, "rank %d has [dp,cp] as other", test_size - 1);
        ASSERT_FAILS(dsm_mesh_flatten(mesh, 2, dp_cp, test_rank == test_size - 1 ? "other" : "same", NULL),
                     DSM_ERR_MISMATCH, text);
        snprintf(text, sizeof text, "rank %d: flatten: \"dp\" is named twice", test_size - 1);
        const char *twice[] = {"dp", "dp"};
        ASSERT_FAILS(dsm_mesh_flatten(mesh, 2, test_rank == test_size - 1 ? twice : dp_cp, "fresh", NULL),
                     DSM_ERR_INVALID_ARGUMENT, text);
    }
    /* Nothing was cached by the failed calls. */
    int size;
    ASSERT_FAILS(dsm_mesh_size(mesh, "same", &size), DSM_ERR_NOT_FOUND, "\"same\"");
    ASSERT_FAILS(dsm_mesh_size(mesh, "fresh", &size), DSM_ERR_NOT_FOUND, "\"fresh\"");
    ASSERT_OK(dsm_mesh_free(&mesh));
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slice),
        cmocka_unit_test(test_slice_errors),
        cmocka_unit_test(test_flatten),
        cmocka_unit_test(test_flatten_errors),
    };
    return RUN_MPI_TESTS("mesh_groups", tests);
}
