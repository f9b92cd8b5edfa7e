// The plan of qgZ's hierarchical reduce-scatter (qgz_plan.hpp).
#include "comm/qgz_plan.hpp"

#include <algorithm>
#include <map>

#include "comm/quantize.hpp"
#include "core/error.hpp"

namespace dsm {
namespace comm {

QgzTopology::QgzTopology(const std::vector<int> &nodes) {
    std::map<int, int> index;
    for (int c : nodes)
        if (!index.count(c)) index.emplace(c, static_cast<int>(index.size()));
    members_.assign(index.size(), {});
    node_index_.resize(nodes.size());
    local_.resize(nodes.size());
    for (size_t r = 0; r < nodes.size(); ++r) {
        const int a = index[nodes[r]];
        node_index_[r] = a;
        local_[r] = static_cast<int>(members_[static_cast<size_t>(a)].size());
        members_[static_cast<size_t>(a)].push_back(static_cast<int>(r));
    }
    for (const auto &m : members_) all_single_ = all_single_ && m.size() == 1;
}

int QgzTopology::collector(int node, int owner) const {
    const std::vector<int> &m = members_[static_cast<size_t>(node)];
    return m[static_cast<size_t>(local_[static_cast<size_t>(owner)]) % m.size()];
}

size_t QgzPlan::slot(int o) const {
    const auto it = std::lower_bound(collected.begin(), collected.end(), o);
    DSM_REQUIRE(it != collected.end() && *it == o, DSM_ERR_INTERNAL, "qgZ: owner ", o, " is not collected here");
    return static_cast<size_t>(it - collected.begin());
}

QgzPlan plan_qgz(const QgzTopology &topo, int me, const std::vector<size_t> &counts, size_t esize, int bits,
                 size_t block) {
    const int n = topo.size();
    DSM_REQUIRE(static_cast<int>(counts.size()) == n, DSM_ERR_INVALID_ARGUMENT, "qgZ: ", counts.size(),
                " counts for a group of ", n);
    DSM_REQUIRE(me >= 0 && me < n, DSM_ERR_INVALID_ARGUMENT, "qgZ: member ", me, " of a group of ", n);
    const size_t N = static_cast<size_t>(n);
    auto qb = [&](int o) { return quant::packed_bytes(counts[static_cast<size_t>(o)], bits, block); };
    QgzPlan p;
    p.off.assign(N + 1, 0);
    for (size_t r = 0; r < N; ++r) p.off[r + 1] = p.off[r] + counts[r];
    const int A = topo.node_of(me);
    for (int o = 0; o < n; ++o)
        if (topo.collector(A, o) == me) {
            p.collected.push_back(o);
            p.acc_at.push_back(o == me ? 0 : p.acc_values);
            if (o != me) p.acc_values += counts[static_cast<size_t>(o)];
        }
    p.step1 = !topo.all_single();
    p.step2 = topo.nodes() > 1;
    p.send1.assign(N, 0);
    p.recv1.assign(N, 0);
    p.pack1.assign(N, {});
    p.send2.assign(N, 0);
    p.recv2.assign(N, 0);
    if (p.step1) {
        size_t mine_bytes = 0; // what each peer of the node sends here
        for (int o : p.collected) mine_bytes += qb(o);
        for (int q : topo.members(A)) {
            if (q == me) continue;
            for (int o = 0; o < n; ++o)
                if (topo.collector(A, o) == q) {
                    p.pack1[static_cast<size_t>(q)].push_back(o);
                    p.send1[static_cast<size_t>(q)] += qb(o);
                    p.bytes.full_on += counts[static_cast<size_t>(o)] * esize;
                }
            p.bytes.sent_on += p.send1[static_cast<size_t>(q)];
            p.recv1[static_cast<size_t>(q)] = mine_bytes;
        }
    }
    if (p.step2) {
        for (int o : p.collected)
            if (o != me) {
                p.send2[static_cast<size_t>(o)] = qb(o);
                p.bytes.sent_off += qb(o);
                p.bytes.full_off += counts[static_cast<size_t>(o)] * esize;
            }
        for (int B = 0; B < topo.nodes(); ++B)
            if (B != A) p.recv2[static_cast<size_t>(topo.collector(B, me))] = qb(me);
    }
    return p;
}

} // namespace comm
} // namespace dsm
