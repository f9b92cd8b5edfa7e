// Node-aware placement on simulated nodes (DSM_SIM_NODES / DSM_SIM_NUMA /
// DSM_SIM_GPUS), read back through dsm_mesh_describe's JSON, and CPU binding;
// where no DSM_SIM_NODES is set, the expectations follow the real nodes.
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

// CMocka (through mpi_test.h) last: its fail() macro would break the C++ headers.
#include "mpi_test.h"

using json = nlohmann::json;

static json describe(dsm_mesh_t mesh) {
    char *text = nullptr;
    ASSERT_OK(dsm_mesh_describe(mesh, DSM_FORMAT_JSON, &text));
    json j = json::parse(text);
    dsm_free(text);
    return j;
}

static dsm_mesh_t create(std::vector<int> shape, std::vector<const char *> names,
                         dsm_placement_t placement = DSM_PLACEMENT_NODE) {
    dsm_mesh_options_t opts = DSM_MESH_OPTIONS_INITIALIZER;
    opts.placement = placement;
    dsm_mesh_t mesh = nullptr;
    ASSERT_OK(dsm_mesh_create_with_options(MPI_COMM_WORLD, static_cast<int>(shape.size()), shape.data(),
                                           names.data(), &opts, &mesh));
    return mesh;
}

// Every group of every dimension: does it lie on one node? Checked against
// the JSON's within_node, and, where `expect` says so, required.
static void check_groups(const json &j, const std::vector<int> &expect_within) {
    const auto &ranks = j["ranks"];
    assert_int_equal(static_cast<int>(ranks.size()), test_size);
    for (size_t d = 0; d < j["names"].size(); ++d) {
        std::string name = j["names"][d];
        bool all_within = true;
        for (const auto &r : ranks) {
            int node = r["node"];
            for (int m : r["groups"][name]) {
                if (ranks[static_cast<size_t>(m)]["node"] != node) all_within = false;
                // Group membership is symmetric.
                bool back = false;
                for (int x : ranks[static_cast<size_t>(m)]["groups"][name]) back |= x == r["rank"].get<int>();
                assert_true(back);
            }
        }
        assert_int_equal(all_within, j["within_node"][name].get<bool>());
        if (expect_within[d] >= 0) assert_int_equal(all_within, expect_within[d]);
    }
    // The positions are a permutation, and coords are their row-major digits.
    std::vector<int> seen(static_cast<size_t>(test_size), 0);
    for (const auto &r : ranks) {
        int pos = r["position"], p = 0;
        seen[static_cast<size_t>(pos)]++;
        for (size_t d = 0; d < j["shape"].size(); ++d) p = p * j["shape"][d].get<int>() + r["coords"][d].get<int>();
        assert_int_equal(p, pos);
    }
    for (int s : seen) assert_int_equal(s, 1);
}

static void test_cyclic_two_nodes(void **) {
    if (test_size < 2 || test_size % 2) skip();
    setenv("DSM_SIM_NODES", "2:cyclic", 1);
    dsm_mesh_t mesh = create({2, -1}, {"dp", "sp"});
    json j = describe(mesh);
    assert_int_equal(j["nnodes"].get<int>(), 2);
    // Node of rank r is r % 2; the sp group of a rank is all ranks of its node.
    assert_int_equal(j["ranks"][1]["host"].get<std::string>() == "simnode1", 1);
    check_groups(j, {0, 1});
    int members[8];
    ASSERT_OK(dsm_mesh_group_ranks(mesh, "sp", 8, members));
    for (int i = 0; i < test_size / 2; ++i) assert_int_equal(members[i] % 2, test_rank % 2);
    ASSERT_OK(dsm_mesh_free(&mesh));
    // Without placement the same launch puts every sp group of two or more
    // ranks across both nodes (at 2 ranks an sp group is one rank: on one node).
    mesh = create({2, -1}, {"dp", "sp"}, DSM_PLACEMENT_NONE);
    j = describe(mesh);
    assert_string_equal(j["placement"].get<std::string>().c_str(), "none");
    check_groups(j, {-1, test_size > 2 ? 0 : 1});
    ASSERT_OK(dsm_mesh_free(&mesh));
    unsetenv("DSM_SIM_NODES");
}

static void test_block_two_nodes_3d(void **) {
    if (test_size < 4 || test_size % 4) skip();
    setenv("DSM_SIM_NODES", "2:block", 1);
    dsm_mesh_t mesh = create({2, -1, 2}, {"dp", "cp", "tp"});
    json j = describe(mesh);
    check_groups(j, {0, 1, 1});
    // Block order needs no reordering: position = rank.
    for (const auto &r : j["ranks"]) assert_int_equal(r["position"].get<int>(), r["rank"].get<int>());
    ASSERT_OK(dsm_mesh_free(&mesh));
    unsetenv("DSM_SIM_NODES");
}

static void test_named_nodes_and_uneven(void **) {
    if (test_size == 4) {
        // Node names in launch order; nodes are numbered by their lowest rank.
        setenv("DSM_SIM_NODES", "b,a,b,a", 1);
        dsm_mesh_t mesh = create({2, 2}, {"dp", "sp"});
        json j = describe(mesh);
        assert_int_equal(j["ranks"][0]["node"].get<int>(), 0);
        assert_int_equal(j["ranks"][1]["node"].get<int>(), 1);
        assert_string_equal(j["ranks"][1]["host"].get<std::string>().c_str(), "a");
        check_groups(j, {0, 1});
        ASSERT_OK(dsm_mesh_free(&mesh));
    }
    if (test_size == 8) {
        // 3 + 3 + 2 ranks: pairs cannot all stay on one node; the JSON says so.
        setenv("DSM_SIM_NODES", "3:block", 1);
        dsm_mesh_t mesh = create({4, 2}, {"dp", "sp"});
        json j = describe(mesh);
        assert_int_equal(j["nnodes"].get<int>(), 3);
        check_groups(j, {0, 0});
        ASSERT_OK(dsm_mesh_free(&mesh));
        // 4 cyclic nodes of 2: the pairs do.
        setenv("DSM_SIM_NODES", "4:cyclic", 1);
        mesh = create({4, 2}, {"dp", "sp"});
        check_groups(describe(mesh), {0, 1});
        ASSERT_OK(dsm_mesh_free(&mesh));
    }
    unsetenv("DSM_SIM_NODES");
}

static void test_numa_and_gpus(void **) {
    if (test_size != 4) skip();
    // NUMA domains 1,0,1,0 on the real nodes: inside a node, the ranks of
    // domain 0 come first; 2 GPUs per node, shared out in placement order.
    setenv("DSM_SIM_NUMA", "1,0,1,0", 1);
    setenv("DSM_SIM_GPUS", "2", 1);
    dsm_mesh_t mesh = create({2, 2}, {"dp", "sp"});
    json j = describe(mesh);
    const int numa[4] = {1, 0, 1, 0};
    std::vector<int> rank_of(4);
    for (int r = 0; r < 4; ++r) rank_of[static_cast<size_t>(r)] = r;
    std::sort(rank_of.begin(), rank_of.end(), [&](int a, int b) {
        if (test_node_of[a] != test_node_of[b]) return test_node_of[a] < test_node_of[b]; // nodes by lowest rank
        if (numa[a] != numa[b]) return numa[a] < numa[b];
        return a < b;
    });
    int expect_pos[4], expect_gpu[4], seen[4] = {0, 0, 0, 0};
    for (int pos = 0; pos < 4; ++pos) {
        const int r = rank_of[static_cast<size_t>(pos)], n = test_node_size(r), i = seen[test_node_of[r]]++;
        expect_pos[r] = pos;
        expect_gpu[r] = n >= 2 ? i * 2 / n : i; // the i-th of n ranks of a node
    }
    if (test_nnodes == 1) { // on one host, as worked out by hand
        const int one_host_pos[4] = {2, 0, 3, 1}, one_host_gpu[4] = {1, 0, 1, 0};
        for (int r = 0; r < 4; ++r) {
            assert_int_equal(expect_pos[r], one_host_pos[r]);
            assert_int_equal(expect_gpu[r], one_host_gpu[r]);
        }
    }
    for (int r = 0; r < 4; ++r) {
        assert_int_equal(j["ranks"][static_cast<size_t>(r)]["position"].get<int>(), expect_pos[r]);
        assert_int_equal(j["ranks"][static_cast<size_t>(r)]["numa"].get<int>(), (r + 1) % 2);
        assert_int_equal(j["ranks"][static_cast<size_t>(r)]["gpu"].get<int>(), expect_gpu[r]);
    }
    // The sp group: the two positions of this rank's pair (one NUMA domain
    // on one host, one node on two nodes of two ranks).
    const int first = expect_pos[test_rank] - expect_pos[test_rank] % 2;
    int members[2];
    ASSERT_OK(dsm_mesh_group_ranks(mesh, "sp", 2, members));
    assert_int_equal(members[0], rank_of[static_cast<size_t>(first)]);
    assert_int_equal(members[1], rank_of[static_cast<size_t>(first + 1)]);
    ASSERT_OK(dsm_mesh_free(&mesh));
    unsetenv("DSM_SIM_NUMA");
    unsetenv("DSM_SIM_GPUS");
}

static void test_spread_binding(void **) {
    int hwloc = 0;
    ASSERT_OK(dsm_library_feature("hwloc", &hwloc));
    int shape[1] = {-1};
    const char *names[] = {"dp"};
    dsm_mesh_options_t opts = DSM_MESH_OPTIONS_INITIALIZER;
    opts.bind = DSM_BIND_SPREAD;
    dsm_mesh_t mesh = nullptr;
    if (!hwloc) {
        ASSERT_FAILS(dsm_mesh_create_with_options(MPI_COMM_WORLD, 1, shape, names, &opts, &mesh),
                     DSM_ERR_NOT_SUPPORTED, "--with-hwloc");
        return;
    }
    cpu_set_t before, after;
    CPU_ZERO(&before);
    sched_getaffinity(0, sizeof before, &before);
    ASSERT_OK(dsm_mesh_create_with_options(MPI_COMM_WORLD, 1, shape, names, &opts, &mesh));
    CPU_ZERO(&after);
    sched_getaffinity(0, sizeof after, &after);
    int ncpu = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
    // The CPUs are shared out among the ranks of a node.
    const int local = test_node_size(test_rank);
    assert_true(CPU_COUNT(&after) >= 1);
    // With at least as many ranks as CPUs each rank gets a share, not the node.
    if (local >= ncpu && ncpu > 1) assert_true(CPU_COUNT(&after) < ncpu);
    // Ranks of a node get disjoint shares while there are enough CPUs (the
    // same answer on every rank of a node).
    MPI_Comm node;
    MPI_Comm_split(MPI_COMM_WORLD, test_node_of[test_rank], test_rank, &node);
    if (local <= ncpu) {
        std::vector<unsigned char> mine(static_cast<size_t>(ncpu)), all(static_cast<size_t>(ncpu));
        for (int c = 0; c < ncpu; ++c) mine[static_cast<size_t>(c)] = CPU_ISSET(c, &after) ? 1 : 0;
        MPI_Allreduce(mine.data(), all.data(), ncpu, MPI_UNSIGNED_CHAR, MPI_SUM, node);
        for (int c = 0; c < ncpu; ++c) assert_true(all[static_cast<size_t>(c)] <= 1);
    }
    MPI_Comm_free(&node);
    ASSERT_OK(dsm_mesh_free(&mesh));
    sched_setaffinity(0, sizeof before, &before);
    // GPU binding on a node without GPUs falls back to an even share.
    opts.bind = DSM_BIND_GPU;
    ASSERT_OK(dsm_mesh_create_with_options(MPI_COMM_WORLD, 1, shape, names, &opts, &mesh));
    CPU_ZERO(&after);
    sched_getaffinity(0, sizeof after, &after);
    assert_true(CPU_COUNT(&after) >= 1);
    if (local >= ncpu && ncpu > 1) assert_true(CPU_COUNT(&after) < ncpu);
    ASSERT_OK(dsm_mesh_free(&mesh));
    sched_setaffinity(0, sizeof before, &before);
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cyclic_two_nodes),   cmocka_unit_test(test_block_two_nodes_3d),
        cmocka_unit_test(test_named_nodes_and_uneven), cmocka_unit_test(test_numa_and_gpus),
        cmocka_unit_test(test_spread_binding),
    };
    return RUN_MPI_TESTS("mesh_placement", tests);
}
