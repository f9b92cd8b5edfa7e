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
// added onto this member's own values in the same pass). A step whose every block is empty on every member (one node; one
// member per node) is skipped on every member alike.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/backend.hpp"

namespace dsm {
namespace comm {

// Bytes one member sent in quantized exchanges, inside its node and to other
// nodes, as sent and as the same exchange would have sent at full precision
// (the communication dtype's size per value).
struct QuantBytes {
    uint64_t sent_on = 0, sent_off = 0;
    uint64_t full_on = 0, full_off = 0;
    QuantBytes &operator+=(const QuantBytes &o) noexcept {
        sent_on += o.sent_on;
        sent_off += o.sent_off;
        full_on += o.full_on;
        full_off += o.full_off;
        return *this;
    }
};

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

    bool spans_nodes() const noexcept { return nodes_count_ > 1; }

private:
    int collector(int node, int owner) const; // the member of `node` that collects for `owner`

    Backend *group_;
    std::vector<int> nodes_;
    std::vector<std::vector<int>> members_; // per node index: its members, ascending
    std::vector<int> node_index_, local_;   // per member: its node's index, its index there
    int nodes_count_ = 0;
    bool all_single_ = true; // every node holds one member
    size_t block_;
    int bits_;
    std::vector<float> acc_; // the node's sums of the owners this member collects for
    // Step 1's backend: this member's node (its members in group order), on
    // a shm group spanning several nodes; else null (step 1 over group_).
    std::unique_ptr<Backend> node_;
};

} // namespace comm
} // namespace dsm
