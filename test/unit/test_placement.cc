// Rank placement on synthetic node layouts (no MPI needed).
#include <chrono>
#include <vector>

#include "topo/placement.hpp"
#include "topo/threads.hpp"

// CMocka last: its fail() macro would break the C++ headers.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

extern "C" { // this CMocka header has no C++ guards
#include <cmocka.h>
}

using dsm::topo::RankInfo;

// `node_of[r]`: node index of rank r (nodes numbered by lowest rank); numa optional.
static std::vector<RankInfo> layout(const std::vector<int> &node_of, const std::vector<int> &numa = {},
                                    int gpus = 0) {
    std::vector<RankInfo> out(node_of.size());
    std::vector<int> count(node_of.size(), 0);
    for (size_t r = 0; r < node_of.size(); ++r) {
        out[r].rank = static_cast<int>(r);
        out[r].node = node_of[r];
        out[r].local_rank = count[static_cast<size_t>(node_of[r])]++;
        out[r].numa = numa.empty() ? -1 : numa[r];
        out[r].node_gpus = gpus;
    }
    for (auto &ri : out) ri.local_size = count[static_cast<size_t>(ri.node)];
    return out;
}

static void test_no_placement_is_identity(void **) {
    auto ranks = layout({0, 1, 0, 1});
    auto p = dsm::topo::place(ranks, false);
    for (int i = 0; i < 4; ++i) {
        assert_int_equal(p.rank_of_position[static_cast<size_t>(i)], i);
        assert_int_equal(p.position_of_rank[static_cast<size_t>(i)], i);
    }
}

static void test_cyclic_launch_keeps_inner_dims_on_node(void **) {
    // Slurm cyclic over 2 nodes: ranks alternate nodes.
    auto ranks = layout({0, 1, 0, 1, 0, 1, 0, 1});
    auto p = dsm::topo::place(ranks, true);
    const std::vector<int> expect = {0, 2, 4, 6, 1, 3, 5, 7};
    for (size_t i = 0; i < expect.size(); ++i) assert_int_equal(p.rank_of_position[i], expect[i]);
    for (size_t r = 0; r < 8; ++r) assert_int_equal(p.rank_of_position[static_cast<size_t>(p.position_of_rank[r])], static_cast<int>(r));
    auto within = dsm::topo::dims_within_node({2, 4}, p, ranks);
    assert_false(within[0]);
    assert_true(within[1]);
    within = dsm::topo::dims_within_node({2, 2, 2}, p, ranks);
    assert_false(within[0]);
    assert_true(within[1]);
    assert_true(within[2]);
    // Without placement the same launch splits every inner group across nodes.
    auto plain = dsm::topo::place(ranks, false);
    within = dsm::topo::dims_within_node({2, 4}, plain, ranks);
    assert_false(within[1]);
}

static void test_block_launch_unchanged(void **) {
    auto ranks = layout({0, 0, 0, 0, 1, 1, 1, 1});
    auto p = dsm::topo::place(ranks, true);
    for (int i = 0; i < 8; ++i) assert_int_equal(p.rank_of_position[static_cast<size_t>(i)], i);
    auto within = dsm::topo::dims_within_node({2, 4}, p, ranks);
    assert_false(within[0]);
    assert_true(within[1]);
    // An inner dimension larger than a node cannot stay inside one.
    within = dsm::topo::dims_within_node({1, 8}, p, ranks);
    assert_true(within[0]);
    assert_false(within[1]);
}

static void test_uneven_nodes(void **) {
    // 3 + 3 + 2 ranks: pairs (2,3) straddle nodes 0 and 1.
    auto ranks = layout({0, 0, 0, 1, 1, 1, 2, 2});
    auto p = dsm::topo::place(ranks, true);
    auto within = dsm::topo::dims_within_node({4, 2}, p, ranks);
    assert_false(within[1]);
    within = dsm::topo::dims_within_node({8}, p, ranks);
    assert_false(within[0]);
}

static void test_numa_order_inside_node(void **) {
    auto ranks = layout({0, 0, 0, 0}, {1, 0, 1, 0});
    auto p = dsm::topo::place(ranks, true);
    const std::vector<int> expect = {1, 3, 0, 2};
    for (size_t i = 0; i < expect.size(); ++i) assert_int_equal(p.rank_of_position[i], expect[i]);
    // Unknown NUMA (-1) sorts after known domains, by rank.
    ranks = layout({0, 0, 0}, {-1, 0, -1});
    p = dsm::topo::place(ranks, true);
    assert_int_equal(p.rank_of_position[0], 1);
    assert_int_equal(p.rank_of_position[1], 0);
    assert_int_equal(p.rank_of_position[2], 2);
}

static void test_gpu_assignment(void **) {
    // 4 ranks, 2 GPUs on one node: consecutive positions share a GPU.
    auto ranks = layout({0, 0, 0, 0}, {}, 2);
    auto p = dsm::topo::place(ranks, true);
    const std::vector<int> expect = {0, 0, 1, 1};
    for (size_t r = 0; r < 4; ++r) assert_int_equal(p.gpu_of_rank[r], expect[r]);
    // Fewer ranks than GPUs: one GPU each.
    ranks = layout({0, 0}, {}, 4);
    p = dsm::topo::place(ranks, true);
    assert_int_equal(p.gpu_of_rank[0], 0);
    assert_int_equal(p.gpu_of_rank[1], 1);
    // No GPUs: -1. Cyclic over 2 nodes with 2 GPUs each: per-node order.
    ranks = layout({0, 1, 0, 1});
    p = dsm::topo::place(ranks, true);
    for (size_t r = 0; r < 4; ++r) assert_int_equal(p.gpu_of_rank[r], -1);
    ranks = layout({0, 1, 0, 1}, {}, 2);
    p = dsm::topo::place(ranks, true);
    const std::vector<int> cyc = {0, 0, 1, 1};
    for (size_t r = 0; r < 4; ++r) assert_int_equal(p.gpu_of_rank[r], cyc[r]);
}

// The CPU kernels' threads: what the user set, else the binding, else an
// even share of the node (never 0).
static void test_thread_choice(void **) {
    using dsm::topo::choose_threads;
    using dsm::topo::CoreProbe;
    const CoreProbe unbound{16, 16, false}, bound4{16, 4, true};
    // An even share of an unbound node: 16 cores, 2 ranks -> 8; more ranks than cores -> 1.
    auto c = choose_threads(0, 0, unbound, 2);
    assert_int_equal(c.threads, 8);
    assert_string_equal(c.source.c_str(), "node share");
    assert_int_equal(choose_threads(0, 0, unbound, 3).threads, 5);
    assert_int_equal(choose_threads(0, 0, unbound, 40).threads, 1);
    assert_int_equal(choose_threads(0, 0, unbound, 0).threads, 16);
    // The binding's cores when bound.
    c = choose_threads(0, 0, bound4, 2);
    assert_int_equal(c.threads, 4);
    assert_string_equal(c.source.c_str(), "binding");
    assert_int_equal(choose_threads(0, 0, CoreProbe{16, 0, true}, 2).threads, 1);
    // OMP_NUM_THREADS, then DSM_NUM_THREADS above it.
    c = choose_threads(0, 3, bound4, 2);
    assert_int_equal(c.threads, 3);
    assert_string_equal(c.source.c_str(), "OMP_NUM_THREADS");
    c = choose_threads(6, 3, bound4, 2);
    assert_int_equal(c.threads, 6);
    assert_string_equal(c.source.c_str(), "DSM_NUM_THREADS");
    // This process's probe is sane.
    const CoreProbe p = dsm::topo::probe_cores();
    assert_true(p.node_cores >= 1 && p.bound_cores >= 1 && p.bound_cores <= p.node_cores);
}

// 100,000 ranks over 12,500 nodes of 8 (2 NUMA domains, 8 GPUs each),
// launched round-robin over the nodes: what every rank computes when it
// creates a mesh (the placement over all ranks, which dimensions stay on a
// node) is right at that scale, and its memory is three ints per rank. The
// time is printed for the record (doc/performance.md), never asserted.
static void test_scale_100k_ranks(void **) {
    const int nodes = 12500, per = 8, n = nodes * per;
    std::vector<int> node_of(static_cast<size_t>(n)), numa(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
        node_of[static_cast<size_t>(r)] = r % nodes;       // round-robin launch
        numa[static_cast<size_t>(r)] = (r / nodes) % 2 == 0 ? 1 : 0; // reversed NUMA order inside a node
    }
    const auto ranks = layout(node_of, numa, per);
    const auto t0 = std::chrono::steady_clock::now();
    const auto p = dsm::topo::place(ranks, true);
    const auto w1 = dsm::topo::dims_within_node({nodes, per}, p, ranks);
    const auto w2 = dsm::topo::dims_within_node({n / 4, 4}, p, ranks);
    const auto w3 = dsm::topo::dims_within_node({n / 16, 16}, p, ranks);
    const auto w4 = dsm::topo::dims_within_node({nodes / 5, 5, 2, 4}, p, ranks);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    assert_int_equal(p.rank_of_position.size(), n);
    assert_int_equal(p.position_of_rank.size(), n);
    assert_int_equal(p.gpu_of_rank.size(), n);
    std::vector<int> gpus_seen(static_cast<size_t>(n), 0);
    for (int pos = 0; pos < n; ++pos) {
        const int r = p.rank_of_position[static_cast<size_t>(pos)];
        assert_int_equal(p.position_of_rank[static_cast<size_t>(r)], pos);
        // Eight consecutive positions are one node, its NUMA domain 0 first, and its GPUs 0..7 in order.
        assert_int_equal(node_of[static_cast<size_t>(r)], pos / per);
        assert_int_equal(numa[static_cast<size_t>(r)], pos % per < per / 2 ? 0 : 1);
        assert_int_equal(p.gpu_of_rank[static_cast<size_t>(r)], pos % per);
    }
    assert_false(w1[0]);
    assert_true(w1[1]);
    assert_false(w2[0]);
    assert_true(w2[1]);
    assert_false(w3[1]); // 16 ranks span two nodes
    assert_false(w4[0]);
    assert_false(w4[1]); // 5 x 2 x 4 = 40 ranks a group
    assert_true(w4[2]);  // 2 x 4 = 8: one node
    assert_true(w4[3]);
    const double bytes = 3.0 * n * sizeof(int);
    print_message("100000 ranks on 12500 nodes: placement and 4 within-node checks in %.3f s; placement %.1f MB "
                  "(%zu bytes per rank)\n",
                  s, bytes / 1e6, 3 * sizeof(int));
}

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_thread_choice),
        cmocka_unit_test(test_no_placement_is_identity),
        cmocka_unit_test(test_cyclic_launch_keeps_inner_dims_on_node),
        cmocka_unit_test(test_block_launch_unchanged),
        cmocka_unit_test(test_uneven_nodes),
        cmocka_unit_test(test_numa_order_inside_node),
        cmocka_unit_test(test_gpu_assignment),
        cmocka_unit_test(test_scale_100k_ranks),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
