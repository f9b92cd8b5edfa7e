/* Meshes of 1 to 4 dimensions at any rank count: layout, queries, communicators. */
#include "mpi_test.h"

#include <stdlib.h>

/* Split test_size (a power of two, or anything) into ndims factors, innermost first. */
static void make_shape(int ndims, int shape[]) {
    int rest = test_size;
    for (int d = 0; d < ndims; ++d) shape[d] = 1;
    for (int d = ndims - 1; d > 0 && rest % 2 == 0; --d) {
        shape[d] = 2;
        rest /= 2;
    }
    shape[0] *= rest;
}

/* The rank at each position: the node-aware placement's order (position =
   rank on one host, or when the nodes hold consecutive ranks), or, without
   placement, the world rank. */
static int *positions(dsm_placement_t placement) {
    int *rank_of = malloc(sizeof(int) * (size_t)test_size);
    for (int p = 0; p < test_size; ++p) rank_of[p] = p;
    if (placement == DSM_PLACEMENT_NODE) test_node_order(rank_of);
    return rank_of;
}

/* Check a mesh whose positions hold the ranks `rank_of` says (row-major
   coordinates, groups, communicators). */
static void check_row_major(dsm_mesh_t mesh, int ndims, const int shape[], const int *rank_of) {
    int nd = -1, got[DSM_MESH_MAX_DIMS], coords[DSM_MESH_MAX_DIMS];
    ASSERT_OK(dsm_mesh_ndims(mesh, &nd));
    assert_int_equal(nd, ndims);
    ASSERT_OK(dsm_mesh_shape(mesh, DSM_MESH_MAX_DIMS, got));
    ASSERT_OK(dsm_mesh_coords(mesh, ndims, coords));
    int mine = 0; /* this rank's position */
    while (rank_of[mine] != test_rank) ++mine;
    int stride = 1, pos = 0;
    for (int d = ndims - 1; d >= 0; --d) {
        assert_int_equal(got[d], shape[d]);
        assert_int_equal(coords[d], (mine / stride) % shape[d]); /* last dimension fastest */
        pos += coords[d] * stride;
        int size = -1, rank = -1;
        ASSERT_OK(dsm_mesh_dim_size(mesh, d, &size));
        ASSERT_OK(dsm_mesh_dim_rank(mesh, d, &rank));
        assert_int_equal(size, shape[d]);
        assert_int_equal(rank, coords[d]);

        const char *name = NULL;
        int index = -1;
        ASSERT_OK(dsm_mesh_dim_name(mesh, d, &name));
        ASSERT_OK(dsm_mesh_dim_index(mesh, name, &index));
        assert_int_equal(index, d);
        ASSERT_OK(dsm_mesh_size(mesh, name, &size));
        ASSERT_OK(dsm_mesh_rank(mesh, name, &rank));
        assert_int_equal(size, shape[d]);
        assert_int_equal(rank, coords[d]);

        /* The communicator of the dimension: rank = coordinate, members differ only in d. */
        MPI_Comm comm;
        int csize, crank;
        ASSERT_OK(dsm_mesh_comm(mesh, name, &comm));
        MPI_Comm_size(comm, &csize);
        MPI_Comm_rank(comm, &crank);
        assert_int_equal(csize, shape[d]);
        assert_int_equal(crank, coords[d]);
        int members[64];
        ASSERT_OK(dsm_mesh_group_ranks(mesh, name, 64, members));
        for (int i = 0; i < shape[d]; ++i)
            assert_int_equal(members[i], rank_of[mine + (i - coords[d]) * stride]);
        int *gathered = malloc(sizeof(int) * (size_t)csize);
        MPI_Allgather(&test_rank, 1, MPI_INT, gathered, 1, MPI_INT, comm);
        for (int i = 0; i < csize; ++i) assert_int_equal(gathered[i], members[i]);
        free(gathered);
        stride *= shape[d];
    }
    int size = -1, rank = -1;
    MPI_Comm all;
    ASSERT_OK(dsm_mesh_size(mesh, NULL, &size));
    ASSERT_OK(dsm_mesh_rank(mesh, NULL, &rank));
    ASSERT_OK(dsm_mesh_comm(mesh, NULL, &all));
    assert_int_equal(size, test_size);
    assert_int_equal(pos, mine);
    assert_int_equal(rank, pos);
    int arank;
    MPI_Comm_rank(all, &arank);
    assert_int_equal(arank, pos);
}

static void test_meshes_1d_to_4d(void **state) {
    (void)state;
    const char *names[] = {"pp", "dp", "cp", "tp"};
    for (int ndims = 1; ndims <= 4; ++ndims) {
        int shape[4];
        make_shape(ndims, shape);
        const char *n[4];
        for (int d = 0; d < ndims; ++d) n[d] = names[4 - ndims + d];
        for (int placement = DSM_PLACEMENT_NODE; placement <= DSM_PLACEMENT_NONE; ++placement) {
            dsm_mesh_options_t opts = DSM_MESH_OPTIONS_INITIALIZER;
            opts.placement = (dsm_placement_t)placement;
            dsm_mesh_t mesh = NULL;
            ASSERT_OK(dsm_mesh_create_with_options(MPI_COMM_WORLD, ndims, shape, n, &opts, &mesh));
            assert_non_null(mesh);
            int *rank_of = positions((dsm_placement_t)placement);
            check_row_major(mesh, ndims, shape, rank_of);
            free(rank_of);
            ASSERT_OK(dsm_mesh_free(&mesh));
            assert_null(mesh);
        }
    }
}

static void test_inferred_dimension(void **state) {
    (void)state;
    int shape[3] = {1, -1, 1};
    const char *names[] = {"a", "b", "c"};
    dsm_mesh_t mesh = NULL;
    ASSERT_OK(dsm_mesh_create(MPI_COMM_WORLD, 3, shape, names, &mesh));
    int size = 0;
    ASSERT_OK(dsm_mesh_size(mesh, "b", &size));
    assert_int_equal(size, test_size);
    int expect[3] = {1, test_size, 1};
    int *rank_of = positions(DSM_PLACEMENT_NODE);
    check_row_major(mesh, 3, expect, rank_of);
    free(rank_of);
    ASSERT_OK(dsm_mesh_free(&mesh));
}

static void test_dp_sp_convenience(void **state) {
    (void)state;
    int sp = test_size % 2 == 0 ? 2 : 1;
    dsm_mesh_t mesh = NULL;
    ASSERT_OK(dsm_mesh_create_dp_sp(MPI_COMM_WORLD, -1, sp, &mesh));
    const char *name = NULL;
    ASSERT_OK(dsm_mesh_dim_name(mesh, 0, &name));
    assert_string_equal(name, "data_parallel");
    ASSERT_OK(dsm_mesh_dim_name(mesh, 1, &name));
    assert_string_equal(name, "sequence_parallel");
    int dp = 0, s = 0;
    ASSERT_OK(dsm_mesh_size(mesh, "data_parallel", &dp));
    ASSERT_OK(dsm_mesh_size(mesh, "sequence_parallel", &s));
    assert_int_equal(dp, test_size / sp);
    assert_int_equal(s, sp);
    /* Each SP group is a run of consecutive positions: consecutive ranks on
       one host, the ranks of one node wherever nodes hold a multiple of sp. */
    int members[8], mine = 0, *rank_of = positions(DSM_PLACEMENT_NODE);
    while (rank_of[mine] != test_rank) ++mine;
    ASSERT_OK(dsm_mesh_group_ranks(mesh, "sequence_parallel", 8, members));
    int fits = 1;
    for (int r = 0; r < test_size; ++r) fits &= test_node_size(r) % sp == 0;
    for (int i = 0; i < sp; ++i) {
        assert_int_equal(members[i], rank_of[mine - mine % sp + i]);
        if (fits) assert_int_equal(test_node_of[members[i]], test_node_of[test_rank]);
    }
    free(rank_of);
    ASSERT_OK(dsm_mesh_free(&mesh));
}

static void test_query_errors(void **state) {
    (void)state;
    int shape[2] = {-1, 1};
    const char *names[] = {"dp", "sp"};
    dsm_mesh_t mesh = NULL;
    ASSERT_OK(dsm_mesh_create(MPI_COMM_WORLD, 2, shape, names, &mesh));
    int v = 0, buf[1];
    const char *s = NULL;
    MPI_Comm c;
    ASSERT_FAILS(dsm_mesh_dim_size(mesh, 2, &v), DSM_ERR_INVALID_ARGUMENT, "dim is 2");
    ASSERT_FAILS(dsm_mesh_dim_rank(mesh, -1, &v), DSM_ERR_INVALID_ARGUMENT, "dim is -1");
    ASSERT_FAILS(dsm_mesh_dim_name(mesh, 5, &s), DSM_ERR_INVALID_ARGUMENT, "dim is 5");
    ASSERT_FAILS(dsm_mesh_dim_index(mesh, "tp", &v), DSM_ERR_NOT_FOUND, "dimensions: dp, sp");
    ASSERT_FAILS(dsm_mesh_size(mesh, "tp", &v), DSM_ERR_NOT_FOUND, "\"tp\"");
    ASSERT_FAILS(dsm_mesh_rank(mesh, "", &v), DSM_ERR_NOT_FOUND, "known: dp, sp");
    ASSERT_FAILS(dsm_mesh_comm(mesh, "x", &c), DSM_ERR_NOT_FOUND, "\"x\"");
    ASSERT_FAILS(dsm_mesh_shape(mesh, 1, buf), DSM_ERR_INVALID_ARGUMENT, "len is 1");
    ASSERT_FAILS(dsm_mesh_coords(mesh, 0, buf), DSM_ERR_INVALID_ARGUMENT, "len is 0");
    if (test_size > 1)
        ASSERT_FAILS(dsm_mesh_group_ranks(mesh, "dp", 1, buf), DSM_ERR_INVALID_ARGUMENT, "len is 1");
    ASSERT_FAILS(dsm_mesh_ndims(NULL, &v), DSM_ERR_NULL_POINTER, "mesh is NULL");
    ASSERT_FAILS(dsm_mesh_ndims(mesh, NULL), DSM_ERR_NULL_POINTER, "ndims is NULL");
    ASSERT_FAILS(dsm_mesh_shape(mesh, 2, NULL), DSM_ERR_NULL_POINTER, "shape is NULL");
    ASSERT_FAILS(dsm_mesh_dim_index(mesh, NULL, &v), DSM_ERR_NULL_POINTER, "name is NULL");
    ASSERT_FAILS(dsm_mesh_comm(mesh, "dp", NULL), DSM_ERR_NULL_POINTER, "comm is NULL");
    ASSERT_FAILS(dsm_mesh_describe(mesh, (dsm_format_t)9, (char **)&s), DSM_ERR_INVALID_ARGUMENT, "format 9");
    assert_null(s);
    ASSERT_OK(dsm_mesh_free(&mesh));
    ASSERT_OK(dsm_mesh_free(&mesh)); /* already NULL */
    ASSERT_OK(dsm_mesh_free(NULL));
}

static void test_describe(void **state) {
    (void)state;
    int shape[2] = {-1, test_size % 2 == 0 ? 2 : 1};
    const char *names[] = {"dp", "sp"};
    dsm_mesh_t mesh = NULL;
    ASSERT_OK(dsm_mesh_create(MPI_COMM_WORLD, 2, shape, names, &mesh));
    char *text = NULL;
    ASSERT_OK(dsm_mesh_describe(mesh, DSM_FORMAT_TEXT, &text));
    assert_non_null(strstr(text, "rank"));
    assert_non_null(strstr(text, "host"));
    assert_non_null(strstr(text, "numa"));
    assert_non_null(strstr(text, "gpu"));
    assert_non_null(strstr(text, "coords"));
    /* One row per rank, after the two header lines. */
    int lines = 0;
    for (const char *p = text; *p; ++p) lines += *p == '\n';
    assert_int_equal(lines, test_size + 2);
    dsm_free(text);
    ASSERT_OK(dsm_mesh_describe(mesh, DSM_FORMAT_JSON, &text));
    assert_non_null(strstr(text, "\"format\": \"dsm-mesh\""));
    assert_non_null(strstr(text, "\"ranks\""));
    dsm_free(text);
    ASSERT_OK(dsm_mesh_free(&mesh));
}

static void test_caller_comm_can_be_freed(void **state) {
    (void)state;
    MPI_Comm mine;
    MPI_Comm_dup(MPI_COMM_WORLD, &mine);
    int shape[1] = {-1};
    const char *names[] = {"dp"};
    dsm_mesh_t mesh = NULL;
    ASSERT_OK(dsm_mesh_create(MPI_COMM_WORLD, 1, shape, names, &mesh));
    dsm_mesh_t other = NULL;
    ASSERT_OK(dsm_mesh_create(mine, 1, shape, names, &other));
    MPI_Comm_free(&mine); /* the mesh holds its own duplicate */
    MPI_Comm c;
    ASSERT_OK(dsm_mesh_comm(other, "dp", &c));
    int sum = 0, one = 1;
    assert_int_equal(MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, c), MPI_SUCCESS);
    assert_int_equal(sum, test_size);
    /* The library's communicators return errors instead of aborting. */
    MPI_Errhandler eh;
    MPI_Comm_get_errhandler(c, &eh);
    assert_true(eh == MPI_ERRORS_RETURN);
    MPI_Errhandler_free(&eh);
    ASSERT_OK(dsm_mesh_free(&other));
    ASSERT_OK(dsm_mesh_free(&mesh));
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_meshes_1d_to_4d),   cmocka_unit_test(test_inferred_dimension),
        cmocka_unit_test(test_dp_sp_convenience), cmocka_unit_test(test_query_errors),
        cmocka_unit_test(test_describe),          cmocka_unit_test(test_caller_comm_can_be_freed),
    };
    return RUN_MPI_TESTS("mesh", tests);
}
