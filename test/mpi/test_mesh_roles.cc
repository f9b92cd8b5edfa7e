// Mesh::roles(): the groups the engine takes from the mesh (the view's
// ranks, data_parallel = every dimension of the view but sequence_parallel
// flattened row-major, sequence_parallel), on the whole mesh and on slices.
#include <memory>
#include <vector>

#include "mesh/mesh.hpp"

// CMocka (through mpi_test.h) last: its fail() macro would break the C++ headers.
#include "mpi_test.h"

static int size_of(const dsm::Comm &c) {
    int n = 0;
    MPI_Comm_size(c.get(), &n);
    return n;
}

static int rank_of(const dsm::Comm &c) {
    int r = 0;
    MPI_Comm_rank(c.get(), &r);
    return r;
}

// (dp, sp) when the size is even, else (size, 1): each rank's group ranks
// equal its coordinates.
static void test_two_dims(void **) {
    const int sp = test_size % 2 == 0 ? 2 : 1, dp = test_size / sp;
    const int shape[2] = {dp, sp};
    const char *names[2] = {"data_parallel", "sequence_parallel"};
    auto mesh = dsm::Mesh::create(MPI_COMM_WORLD, 2, shape, names, nullptr, true);
    const std::vector<int> c = mesh->coords();
    {
        dsm::Mesh::Roles r = mesh->roles();
        assert_int_equal(size_of(r.product), test_size);
        assert_int_equal(size_of(r.data_parallel), dp);
        assert_int_equal(rank_of(r.data_parallel), c[0]);
        assert_int_equal(size_of(r.sequence_parallel), sp);
        assert_int_equal(rank_of(r.sequence_parallel), c[1]);
        assert_int_equal(rank_of(r.product), c[0] * sp + c[1]);
        assert_true(mesh->node() >= 0);
        // A slice of the data-parallel dimension: its ranks only, no SP.
        const char *dpn[1] = {"data_parallel"};
        auto slice = mesh->slice(1, dpn);
        dsm::Mesh::Roles s = slice->roles();
        assert_int_equal(size_of(s.product), dp);
        assert_int_equal(size_of(s.data_parallel), dp);
        assert_int_equal(rank_of(s.data_parallel), c[0]);
        assert_int_equal(size_of(s.sequence_parallel), 1);
        r.product.reset();
        r.data_parallel.reset();
        r.sequence_parallel.reset();
        s.product.reset();
        s.data_parallel.reset();
        s.sequence_parallel.reset();
        assert_int_equal(slice->release(), MPI_SUCCESS);
    }
    assert_int_equal(mesh->release(), MPI_SUCCESS);
}

// Three dimensions with sequence_parallel in the middle: data parallel is
// the row-major index over the other two.
static void test_three_dims(void **) {
    if (test_size % 4 != 0) skip();
    const int shape[3] = {test_size / 4, 2, 2};
    const char *names[3] = {"replica", "sequence_parallel", "shard"};
    auto mesh = dsm::Mesh::create(MPI_COMM_WORLD, 3, shape, names, nullptr, true);
    const std::vector<int> c = mesh->coords();
    dsm::Mesh::Roles r = mesh->roles();
    assert_int_equal(size_of(r.data_parallel), test_size / 2);
    assert_int_equal(rank_of(r.data_parallel), c[0] * 2 + c[2]);
    assert_int_equal(size_of(r.sequence_parallel), 2);
    assert_int_equal(rank_of(r.sequence_parallel), c[1]);
    r.product.reset();
    r.data_parallel.reset();
    r.sequence_parallel.reset();
    assert_int_equal(mesh->release(), MPI_SUCCESS);
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_dims),
        cmocka_unit_test(test_three_dims),
    };
    return RUN_MPI_TESTS("mesh_roles", tests);
}
