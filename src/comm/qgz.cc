// ZeRO++ qgZ's hierarchical quantized reduce-scatter (qgz.hpp).
#include "comm/qgz.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>

#include "comm/quantize.hpp"
#include "core/comm.hpp"
#include "core/error.hpp"
#include "core/half.hpp"

namespace dsm {
namespace comm {

QuantizedReduce::QuantizedReduce(Backend *group, std::vector<int> nodes, size_t block, int bits)
    : group_(group), nodes_(std::move(nodes)), block_(block), bits_(bits) {
    DSM_REQUIRE(group_ != nullptr, DSM_ERR_NULL_POINTER, "qgZ: no group");
    DSM_REQUIRE(static_cast<int>(nodes_.size()) == group_->size(), DSM_ERR_INVALID_ARGUMENT, "qgZ: ",
                nodes_.size(), " node colors for a group of ", group_->size());
    quant::check_block(block_, "qgZ");
    quant::check_bits(bits_);
    std::map<int, int> index;
    for (int c : nodes_)
        if (!index.count(c)) index.emplace(c, static_cast<int>(index.size()));
    nodes_count_ = static_cast<int>(index.size());
    members_.assign(static_cast<size_t>(nodes_count_), {});
    node_index_.resize(nodes_.size());
    local_.resize(nodes_.size());
    for (size_t r = 0; r < nodes_.size(); ++r) {
        const int a = index[nodes_[r]];
        node_index_[r] = a;
        local_[r] = static_cast<int>(members_[static_cast<size_t>(a)].size());
        members_[static_cast<size_t>(a)].push_back(static_cast<int>(r));
    }
    for (const auto &m : members_) all_single_ = all_single_ && m.size() == 1;
    // Collective over the group alike on every member: the same backend,
    // node colors and sizes everywhere.
    if (nodes_count_ > 1 && !all_single_ && std::string(group_->name()) == "shm") {
        const int me = group_->rank();
        MPI_Comm c = MPI_COMM_NULL;
        DSM_CHECK_MPI(MPI_Comm_split(group_->comm(), nodes_[static_cast<size_t>(me)], me, &c));
        const Comm node(c); // create_backend() keeps a duplicate
        node_ = create_backend(c, Kind::SHM, nodes_[static_cast<size_t>(me)]);
        DSM_REQUIRE(node_->size() == static_cast<int>(members_[static_cast<size_t>(node_index_[static_cast<size_t>(me)])].size()),
                    DSM_ERR_INTERNAL, "qgZ: a node backend of ", node_->size(), " members");
    }
}

int QuantizedReduce::collector(int node, int owner) const {
    const std::vector<int> &m = members_[static_cast<size_t>(node)];
    return m[static_cast<size_t>(local_[static_cast<size_t>(owner)]) % m.size()];
}

void QuantizedReduce::reduce_scatter(const void *send, const std::vector<size_t> &counts, dsm_dtype_t dtype,
                                     float *out, QuantBytes *bytes) {
    const int n = group_->size(), me = group_->rank();
    DSM_REQUIRE(static_cast<int>(counts.size()) == n, DSM_ERR_INVALID_ARGUMENT, "qgZ: ", counts.size(),
                " counts for a group of ", n);
    const size_t es = dtype == DSM_FLOAT32 ? 4 : 2;
    std::vector<size_t> off(static_cast<size_t>(n) + 1, 0);
    for (int r = 0; r < n; ++r) off[static_cast<size_t>(r) + 1] = off[static_cast<size_t>(r)] + counts[static_cast<size_t>(r)];
    const int A = node_index_[static_cast<size_t>(me)];
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
    // Each sum starts as this member's own block in fp32. In fp32 the first
    // peer's block is dequantized onto it in the same pass (the same bits as
    // a copy and then an accumulate); the sums no peer adds to are copied
    // after step 1. 16-bit blocks are converted now.
    std::vector<char> started(mine.size(), dtype != DSM_FLOAT32);
    auto own = [&](size_t k) { return reinterpret_cast<const float *>(src + off[static_cast<size_t>(mine[k])] * es); };
    for (size_t k = 0; k < mine.size() && dtype != DSM_FLOAT32; ++k) {
        const int o = mine[k];
        const size_t c = counts[static_cast<size_t>(o)];
        if (c == 0) continue; // an empty block: nothing to copy (and no buffer to copy into)
        const uint16_t *b = reinterpret_cast<const uint16_t *>(src + off[static_cast<size_t>(o)] * es);
        float *d = sum_of(k);
        if (dtype == DSM_FLOAT16)
            for (size_t i = 0; i < c; ++i) d[i] = fp16_to_fp32(b[i]);
        else
            for (size_t i = 0; i < c; ++i) d[i] = bf16_to_fp32(b[i]);
    }
    QuantBytes qb_sum;

    // 1. Inside the node: each block to its collector, added in fp32.
    if (!all_single_) {
        std::vector<size_t> sb(static_cast<size_t>(n), 0), rb(static_cast<size_t>(n), 0);
        size_t mine_bytes = 0; // what each peer of the node sends here: the blocks of the owners collected here
        for (int o : mine) mine_bytes += qb(counts[static_cast<size_t>(o)]);
        for (int p : members_[static_cast<size_t>(A)]) {
            if (p == me) continue;
            for (int o = 0; o < n; ++o)
                if (collector(A, o) == p) {
                    sb[static_cast<size_t>(p)] += qb(counts[static_cast<size_t>(o)]);
                    qb_sum.full_on += counts[static_cast<size_t>(o)] * es;
                }
            rb[static_cast<size_t>(p)] = mine_bytes;
        }
        for (int p = 0; p < n; ++p) qb_sum.sent_on += sb[static_cast<size_t>(p)];
        // Over the node's backend, peers by their index in the node.
        const std::vector<int> &node = members_[static_cast<size_t>(A)];
        auto member = [&](int peer) { return node_ ? node[static_cast<size_t>(peer)] : peer; };
        if (node_) {
            std::vector<size_t> nsb(node.size()), nrb(node.size());
            for (size_t l = 0; l < node.size(); ++l) {
                nsb[l] = sb[static_cast<size_t>(node[l])];
                nrb[l] = rb[static_cast<size_t>(node[l])];
            }
            sb.swap(nsb);
            rb.swap(nrb);
        }
        const Stats before = node_ ? node_->stats() : Stats{};
        (node_ ? node_.get() : group_)->alltoall_packed(
            sb, rb,
            [&](int local_peer, void *buf) {
                const int peer = member(local_peer);
                char *w = static_cast<char *>(buf);
                for (int o = 0; o < n; ++o)
                    if (collector(A, o) == peer) {
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
    for (size_t k = 0; k < mine.size(); ++k) {
        const size_t c = counts[static_cast<size_t>(mine[k])];
        if (!started[k] && c) std::memcpy(sum_of(k), own(k), c * sizeof(float));
    }

    // 2. Between the nodes: each node's sum to its owner, added in fp32.
    if (nodes_count_ > 1) {
        std::vector<size_t> sb(static_cast<size_t>(n), 0), rb(static_cast<size_t>(n), 0);
        for (size_t k = 0; k < mine.size(); ++k)
            if (mine[k] != me) {
                sb[static_cast<size_t>(mine[k])] = qb(counts[static_cast<size_t>(mine[k])]);
                qb_sum.sent_off += sb[static_cast<size_t>(mine[k])];
                qb_sum.full_off += counts[static_cast<size_t>(mine[k])] * es;
            }
        for (int B = 0; B < nodes_count_; ++B)
            if (B != A) rb[static_cast<size_t>(collector(B, me))] = qb(counts[static_cast<size_t>(me)]);
        group_->alltoall_packed(
            sb, rb,
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
