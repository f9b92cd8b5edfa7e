// The plan of ZeRO++ qgZ's hierarchical reduce-scatter (qgz.hpp), pure: who
// collects for whom, what each member packs for each peer at each step, the
// bytes it sends and receives, and what it counts as sent on and off the
// node. No communication and no memory of a space: both reductions, the
// host's (qgz.hpp) and the device's (qgz_device.hpp), run on it, and
// test_quantize_device checks it on the CPU (each member's contribution
// reaches its owner once, what one member sends is what its peer expects),
// for any layout of nodes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

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

class QgzTopology {
public:
    // `nodes[r]`: the node (any color) of member r.
    explicit QgzTopology(const std::vector<int> &nodes);
    int size() const noexcept { return static_cast<int>(node_index_.size()); }
    int nodes() const noexcept { return static_cast<int>(members_.size()); }
    int node_of(int member) const { return node_index_[static_cast<size_t>(member)]; }
    const std::vector<int> &members(int node) const { return members_[static_cast<size_t>(node)]; }
    bool all_single() const noexcept { return all_single_; }
    // The member of `node` that collects for `owner`: its member number
    // (owner's index on its own node) mod (members of `node`).
    int collector(int node, int owner) const;

private:
    std::vector<std::vector<int>> members_; // per node index: its members, ascending
    std::vector<int> node_index_, local_;
    bool all_single_ = true;
};

// One reduce_scatter of member `me`, the block for owner o being counts[o]
// values of `esize` bytes, quantized to `bits` in blocks of `block`.
struct QgzPlan {
    std::vector<size_t> off;      // per owner: its first value in the send buffer (size + 1 entries)
    std::vector<int> collected;   // the owners `me` collects for, ascending (`me` among them)
    std::vector<size_t> acc_at;   // per collected owner: its sum's offset in the accumulator (me: unused)
    size_t acc_values = 0;        // the accumulator's values (the collected owners but `me`)
    bool step1 = false, step2 = false; // whether each exchange runs (the same on every member)
    // Step 1, inside the node: bytes per peer, and the owners packed for each
    // peer, ascending (the peer unpacks its collected owners in that order).
    std::vector<size_t> send1, recv1;
    std::vector<std::vector<int>> pack1;
    // Step 2, between nodes: the node's sum of each collected owner to its
    // owner (one owner per peer), and what `me` receives from each node's collector.
    std::vector<size_t> send2, recv2;
    QuantBytes bytes; // what this member sends (full_*: at `esize` bytes per value)
    // The index in `collected` of owner o (step 2 sends peer o that sum);
    // DSM_ERR_INTERNAL where `me` does not collect for o.
    size_t slot(int o) const;
};

QgzPlan plan_qgz(const QgzTopology &topo, int me, const std::vector<size_t> &counts, size_t esize, int bits,
                 size_t block);

} // namespace comm
} // namespace dsm
