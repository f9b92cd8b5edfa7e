// ZeRO++ qgZ: the gradient reduce-scatter as a hierarchical all-to-all of
// blockwise-quantized values (comm/quantize.hpp), reduced in fp32 at each
// level:
//   1. every member quantizes, for each owner, its block of the owner's
//      values and sends it to the member of its node that collects for that
//      owner; the collector adds the node's blocks in fp32 (its own block at
//      full precision);
//   2. each collector quantizes its node's sums again and sends each to its
//      owner on the other nodes; the owner adds them in fp32.
// So each value crosses the node boundary once per node, quantized, instead
// of once per member at full precision. The collector of owner o on node A
// is A's member number (o's index on its own node) mod (members of A): with
// equal nodes, owner (node n, local l) is collected by local rank l on every
// node, as in ZeRO++; an owner's own node collects for it at the owner
// itself, so step 2 only crosses nodes. Nodes of unequal sizes work alike.
//
// Both steps are alltoall_packed() calls: step 1 over a backend of the
// node's members alone (on a group of the shm backend spanning nodes: its
// shared-memory exchange, which waits for the node's members only, not for
// an agreement and messages across the nodes), step 2 over the group's
// backend (MPI between the nodes); the packing quantizes and the unpacking
// dequantizes and adds (no separate copy; the first block a sum receives is
// added onto this member's own values in the same pass). A step whose every
// block is empty on every member (one node; one member per node) is skipped
// on every member alike. Who collects for whom, what each member packs for
// each peer and the bytes are plan_qgz()'s (qgz_plan.hpp), the plan that the
// device reduction (qgz_device.hpp) runs on too.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "comm/backend.hpp"
#include "comm/qgz_plan.hpp" // QgzTopology, plan_qgz, QuantBytes

namespace dsm {
namespace comm {

class QuantizedReduce {
public:
    // `nodes[r]`: the node of member r of `group` (group->size() entries,
    // the same on every member); `block`: values per block; `bits`: 4 or 8.
    QuantizedReduce(Backend *group, std::vector<int> nodes, size_t block, int bits);

    // Collective over the group: `send` holds sum(counts) values of `dtype`
    // (FLOAT32, FLOAT16 or BFLOAT16), the block for member r first at
    // counts[0] + ... + counts[r-1]; on return `out` (fp32,
    // counts[rank] values) holds the sum over the members of their block for
    // this member. Host memory. `bytes` (may be null) adds what moved.
    void reduce_scatter(const void *send, const std::vector<size_t> &counts, dsm_dtype_t dtype, float *out,
                        QuantBytes *bytes);

    bool spans_nodes() const noexcept { return topo_.nodes() > 1; }

private:
    Backend *group_;
    std::vector<int> nodes_; // the node colors (step 1's backend splits by them)
    QgzTopology topo_;       // who collects for whom (plan_qgz)
    size_t block_;
    int bits_;
    std::vector<float> acc_; // the node's sums of the owners this member collects for
    // Step 1's backend: this member's node (its members in group order), on
    // a shm group spanning several nodes; else null (step 1 over group_).
    std::unique_ptr<Backend> node_;
};

} // namespace comm
} // namespace dsm
