// Rank placement: which rank takes which mesh position.
#pragma once

#include <vector>

#include "topo/locality.hpp"

namespace dsm::topo {

struct Placement {
    std::vector<int> rank_of_position;  // parent rank at each linear mesh position
    std::vector<int> position_of_rank;  // the inverse
    std::vector<int> gpu_of_rank;       // GPU index on its node, -1 when the node has none
};

// Node-aware: positions run over the nodes in node order and, inside a node,
// over its ranks ordered by (NUMA domain, rank), so consecutive positions (the
// innermost mesh dimensions) share a node and then a NUMA domain. Otherwise
// position = rank. GPUs: the i-th of n ranks of a node (in placement order)
// gets GPU i*g/n of the node's g GPUs when n >= g, else GPU i.
Placement place(const std::vector<RankInfo> &ranks, bool node_aware);

// For each dimension of `shape` (row-major over positions): whether every
// group along it lies on one node.
std::vector<bool> dims_within_node(const std::vector<int> &shape, const Placement &p,
                                   const std::vector<RankInfo> &ranks);

} // namespace dsm::topo
