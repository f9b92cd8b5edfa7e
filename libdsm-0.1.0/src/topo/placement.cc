#include "dsm_config.h"

#include "topo/placement.hpp"

#include <algorithm>
#include <climits>
#include <numeric>

namespace dsm::topo {

Placement place(const std::vector<RankInfo> &ranks, bool node_aware) {
    const int size = static_cast<int>(ranks.size());
    Placement p;
    p.rank_of_position.resize(static_cast<size_t>(size));
    std::iota(p.rank_of_position.begin(), p.rank_of_position.end(), 0);
    if (node_aware) {
        auto numa_key = [](int numa) { return numa < 0 ? INT_MAX : numa; };
        std::stable_sort(p.rank_of_position.begin(), p.rank_of_position.end(), [&](int a, int b) {
            const RankInfo &x = ranks[static_cast<size_t>(a)], &y = ranks[static_cast<size_t>(b)];
            if (x.node != y.node) return x.node < y.node;
            if (numa_key(x.numa) != numa_key(y.numa)) return numa_key(x.numa) < numa_key(y.numa);
            return a < b;
        });
    }
    p.position_of_rank.resize(static_cast<size_t>(size));
    for (int pos = 0; pos < size; ++pos) p.position_of_rank[static_cast<size_t>(p.rank_of_position[static_cast<size_t>(pos)])] = pos;

    // GPUs by the order of the ranks inside their node.
    p.gpu_of_rank.assign(static_cast<size_t>(size), -1);
    std::vector<int> seen_on_node(static_cast<size_t>(size), 0);
    for (int pos = 0; pos < size; ++pos) {
        int r = p.rank_of_position[static_cast<size_t>(pos)];
        const RankInfo &ri = ranks[static_cast<size_t>(r)];
        int i = seen_on_node[static_cast<size_t>(ri.node)]++;
        int n = ri.local_size, g = ri.node_gpus;
        if (g > 0) p.gpu_of_rank[static_cast<size_t>(r)] = n >= g ? static_cast<int>(static_cast<long>(i) * g / n) : i;
    }
    return p;
}

std::vector<bool> dims_within_node(const std::vector<int> &shape, const Placement &p,
                                   const std::vector<RankInfo> &ranks) {
    const int ndims = static_cast<int>(shape.size());
    const int size = static_cast<int>(p.rank_of_position.size());
    std::vector<bool> out(static_cast<size_t>(ndims), true);
    int stride = 1;
    for (int d = ndims - 1; d >= 0; --d) {
        const int extent = shape[static_cast<size_t>(d)];
        for (int pos = 0; pos < size && out[static_cast<size_t>(d)]; ++pos) {
            int coord = (pos / stride) % extent;
            int base = pos - coord * stride;
            int node = ranks[static_cast<size_t>(p.rank_of_position[static_cast<size_t>(pos)])].node;
            int base_node = ranks[static_cast<size_t>(p.rank_of_position[static_cast<size_t>(base)])].node;
            if (node != base_node) out[static_cast<size_t>(d)] = false;
        }
        stride *= extent;
    }
    return out;
}

} // namespace dsm::topo
