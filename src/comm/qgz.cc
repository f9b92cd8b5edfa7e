// ZeRO++ qgZ's hierarchical quantized reduce-scatter (qgz.hpp).
#include "comm/qgz.hpp"

#include <algorithm>
#include <cstring>

#include "comm/quantize.hpp"
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
}

int QuantizedReduce::collector(int node, int owner) const { return topo_.collector(node, owner); }

void QuantizedReduce::reduce_scatter(const void *send, const std::vector<size_t> &counts, dsm_dtype_t dtype,
                                     float *out, QuantBytes *bytes) {
    const int n = group_->size(), me = group_->rank();
    DSM_REQUIRE(static_cast<int>(counts.size()) == n, DSM_ERR_INVALID_ARGUMENT, "qgZ: ", counts.size(),
                " counts for a group of ", n);
    const size_t es = dtype == DSM_FLOAT32 ? 4 : 2;
    std::vector<size_t> off(static_cast<size_t>(n) + 1, 0);
    for (int r = 0; r < n; ++r) off[static_cast<size_t>(r) + 1] = off[static_cast<size_t>(r)] + counts[static_cast<size_t>(r)];
    const int A = topo_.node_of(me);
    const char *src = static_cast<const char *>(send);
    auto qb = [this](size_t c) { return quant::packed_bytes(c, bits_, block_); };

    // The owners this member collects for, and their sums: this member's
    // own block first, at full precision.
    std::vector<int> mine;
    std::vector<size_t> at; // offset of each owner's sum: in out (me) or acc_
    size_t total = 0;
    for (int o = 0; o < n; ++o)
        if (collector(A, o) == me && o != me) {
            mine.push_back(o);
            at.push_back(total);
            total += counts[static_cast<size_t>(o)];
        }
    if (acc_.size() < total) acc_.resize(total);
    auto sum_of = [&](size_t k) { return mine[k] == me ? out : acc_.data() + at[k]; };
    mine.push_back(me);
    at.push_back(0);
    for (size_t k = 0; k < mine.size(); ++k) {
        const int o = mine[k];
        const size_t c = counts[static_cast<size_t>(o)];
        if (c == 0) continue; // an empty block: nothing to copy (and no buffer to copy into)
        const char *b = src + off[static_cast<size_t>(o)] * es;
        float *d = sum_of(k);
        if (dtype == DSM_FLOAT32) std::memcpy(d, b, c * sizeof(float));
        else if (dtype == DSM_FLOAT16)
            for (size_t i = 0; i < c; ++i) d[i] = fp16_to_fp32(reinterpret_cast<const uint16_t *>(b)[i]);
        else
            for (size_t i = 0; i < c; ++i) d[i] = bf16_to_fp32(reinterpret_cast<const uint16_t *>(b)[i]);
    }
    QuantBytes qb_sum;

    // 1. Inside the node: each block to its collector, added in fp32. The
    // plan (qgz_plan.hpp, the device's too): the bytes to and from each peer,
    // the owners packed for each, the bytes counted.
    const QgzPlan plan = plan_qgz(topo_, me, counts, es, bits_, block_);
    qb_sum = plan.bytes;
    if (plan.step1) {
        group_->alltoall_packed(
            plan.send1, plan.recv1,
            [&](int peer, void *buf) {
                char *w = static_cast<char *>(buf);
                for (int o : plan.pack1[static_cast<size_t>(peer)]) {
                    const size_t c = counts[static_cast<size_t>(o)];
                    quant::quantize(src + off[static_cast<size_t>(o)] * es, dtype, c, bits_, block_, w);
                    w += qb(c);
                }
            },
            [&](int, const void *buf) {
                const char *r = static_cast<const char *>(buf);
                // In ascending owner order, as the peers pack them.
                std::vector<size_t> order(mine.size());
                for (size_t k = 0; k < order.size(); ++k) order[k] = k;
                std::sort(order.begin(), order.end(), [&](size_t x, size_t y) { return mine[x] < mine[y]; });
                for (size_t k : order) {
                    const size_t c = counts[static_cast<size_t>(mine[k])];
                    quant::dequantize(r, c, bits_, block_, sum_of(k), DSM_FLOAT32, true);
                    r += qb(c);
                }
            });
    }

    // 2. Between the nodes: each node's sum to its owner, added in fp32.
    if (plan.step2) {
        group_->alltoall_packed(
            plan.send2, plan.recv2,
            [&](int peer, void *buf) {
                for (size_t k = 0; k < mine.size(); ++k)
                    if (mine[k] == peer)
                        quant::quantize(sum_of(k), DSM_FLOAT32, counts[static_cast<size_t>(peer)], bits_, block_, buf);
            },
            [&](int, const void *buf) {
                quant::dequantize(buf, counts[static_cast<size_t>(me)], bits_, block_, out, DSM_FLOAT32, true);
            });
    }
    if (bytes) *bytes += qb_sum;
}

} // namespace comm
} // namespace dsm
