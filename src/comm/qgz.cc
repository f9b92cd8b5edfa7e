// ZeRO++ qgZ's hierarchical quantized reduce-scatter (qgz.hpp).
#include "comm/qgz.hpp"

#include <cstring>
#include <string>

#include "comm/quantize.hpp"
#include "core/comm.hpp"
#include "core/error.hpp"
#include "core/half.hpp"

namespace dsm {
namespace comm {

QuantizedReduce::QuantizedReduce(Backend *group, std::vector<int> nodes, size_t block, int bits)
    : group_(group), nodes_(std::move(nodes)), topo_(nodes_), block_(block), bits_(bits) {
    DSM_REQUIRE(group_ != nullptr, DSM_ERR_NULL_POINTER, "qgZ: no group");
    DSM_REQUIRE(static_cast<int>(nodes_.size()) == group_->size(), DSM_ERR_INVALID_ARGUMENT, "qgZ: ",
                nodes_.size(), " node colors for a group of ", group_->size());
    quant::check_block(block_, "qgZ");
    quant::check_bits(bits_);
    // Collective over the group alike on every member: the same backend,
    // node colors and sizes everywhere.
    if (topo_.nodes() > 1 && !topo_.all_single() && std::string(group_->name()) == "shm") {
        const int me = group_->rank();
        MPI_Comm c = MPI_COMM_NULL;
        DSM_CHECK_MPI(MPI_Comm_split(group_->comm(), nodes_[static_cast<size_t>(me)], me, &c));
        const Comm node(c); // create_backend() keeps a duplicate
        node_ = create_backend(c, Kind::SHM, nodes_[static_cast<size_t>(me)]);
        DSM_REQUIRE(node_->size() == static_cast<int>(topo_.members(topo_.node_of(me)).size()), DSM_ERR_INTERNAL,
                    "qgZ: a node backend of ", node_->size(), " members");
    }
}

void QuantizedReduce::reduce_scatter(const void *send, const std::vector<size_t> &counts, dsm_dtype_t dtype,
                                     float *out, QuantBytes *bytes) {
    const int me = group_->rank();
    const size_t es = dtype == DSM_FLOAT32 ? 4 : 2;
    const QgzPlan p = plan_qgz(topo_, me, counts, es, bits_, block_);
    if (acc_.size() < p.acc_values) acc_.resize(p.acc_values);
    const char *src = static_cast<const char *>(send);
    auto qb = [this](size_t c) { return quant::packed_bytes(c, bits_, block_); };
    auto block_of = [&](int o) { return src + p.off[static_cast<size_t>(o)] * es; };
    // The sum of each owner this member collects for (p.collected, ascending):
    // in out (this member's own) or acc_.
    auto sum_of = [&](size_t k) { return p.collected[k] == me ? out : acc_.data() + p.acc_at[k]; };
    auto own = [&](size_t k) { return reinterpret_cast<const float *>(block_of(p.collected[k])); };

    // Each sum starts as this member's own block in fp32. In fp32 the first
    // peer's block is dequantized onto it in the same pass (the same bits as
    // a copy and then an accumulate); the sums no peer adds to are copied
    // after step 1. 16-bit blocks are converted now.
    std::vector<char> started(p.collected.size(), dtype != DSM_FLOAT32);
    for (size_t k = 0; k < p.collected.size() && dtype != DSM_FLOAT32; ++k) {
        const size_t c = counts[static_cast<size_t>(p.collected[k])];
        if (c == 0) continue; // an empty block: nothing to copy (and no buffer to copy into)
        const uint16_t *b = reinterpret_cast<const uint16_t *>(block_of(p.collected[k]));
        float *d = sum_of(k);
        if (dtype == DSM_FLOAT16)
            for (size_t i = 0; i < c; ++i) d[i] = fp16_to_fp32(b[i]);
        else
            for (size_t i = 0; i < c; ++i) d[i] = bf16_to_fp32(b[i]);
    }

    // 1. Inside the node: each block to its collector, added in fp32.
    if (p.step1) {
        // Over the node's backend, peers by their index in the node (its
        // members in group order).
        const std::vector<int> &node = topo_.members(topo_.node_of(me));
        auto member = [&](int peer) { return node_ ? node[static_cast<size_t>(peer)] : peer; };
        std::vector<size_t> nsb, nrb;
        if (node_)
            for (int q : node) {
                nsb.push_back(p.send1[static_cast<size_t>(q)]);
                nrb.push_back(p.recv1[static_cast<size_t>(q)]);
            }
        const Stats before = node_ ? node_->stats() : Stats{};
        (node_ ? node_.get() : group_)->alltoall_packed(
            node_ ? nsb : p.send1, node_ ? nrb : p.recv1,
            [&](int local_peer, void *buf) {
                char *w = static_cast<char *>(buf);
                for (int o : p.pack1[static_cast<size_t>(member(local_peer))]) {
                    const size_t c = counts[static_cast<size_t>(o)];
                    quant::quantize(block_of(o), dtype, c, bits_, block_, w);
                    w += qb(c);
                }
            },
            [&](int, const void *buf) {
                // In ascending owner order, as the peers pack them.
                const char *r = static_cast<const char *>(buf);
                for (size_t k = 0; k < p.collected.size(); ++k) {
                    const size_t c = counts[static_cast<size_t>(p.collected[k])];
                    if (c) quant::dequantize_add(r, c, bits_, block_, started[k] ? sum_of(k) : own(k), sum_of(k));
                    started[k] = 1;
                    r += qb(c);
                }
            });
        if (node_) {
            const Stats &after = node_->stats();
            group_->add_stats(Stats{after.bytes_sent - before.bytes_sent, after.bytes_off_node - before.bytes_off_node,
                                    after.calls - before.calls});
        }
    }
    for (size_t k = 0; k < p.collected.size(); ++k) {
        const size_t c = counts[static_cast<size_t>(p.collected[k])];
        if (!started[k] && c) std::memcpy(sum_of(k), own(k), c * sizeof(float));
    }

    // 2. Between the nodes: each node's sum to its owner, added in fp32.
    if (p.step2)
        group_->alltoall_packed(
            p.send2, p.recv2,
            [&](int peer, void *buf) {
                quant::quantize(sum_of(p.slot(peer)), DSM_FLOAT32, counts[static_cast<size_t>(peer)], bits_, block_,
                                buf);
            },
            [&](int, const void *buf) {
                quant::dequantize(buf, counts[static_cast<size_t>(me)], bits_, block_, out, DSM_FLOAT32, true);
            });
    if (bytes) *bytes += p.bytes;
}

} // namespace comm
} // namespace dsm
