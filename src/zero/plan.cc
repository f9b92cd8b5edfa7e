#include "zero/plan.hpp"

#include <algorithm>

namespace dsm {
namespace zero {

std::vector<std::pair<size_t, size_t>> flat_regions(size_t total, int64_t want) {
    const size_t bucket = std::min<size_t>(static_cast<size_t>(std::max<int64_t>(want, 1)), total);
    std::vector<std::pair<size_t, size_t>> out;
    for (size_t b = 0; b < total; b += bucket) out.emplace_back(b, std::min(total, b + bucket));
    return out;
}

size_t bucket_capacity(int64_t reduce_bucket_size, size_t used) {
    return std::min<size_t>(static_cast<size_t>(std::max<int64_t>(reduce_bucket_size, 1)), std::max<size_t>(used, 1));
}

size_t Round::elements() const noexcept {
    size_t n = 0;
    for (size_t c : counts) n += c;
    return n;
}

std::vector<Round> plan_rounds(const Layout &layout, const std::vector<int> &released, size_t cap) {
    std::vector<Released> whole;
    for (int j : released) whole.push_back(Released{j, 0, layout.slot_of(j)->numel});
    return plan_range_rounds(layout, whole, cap);
}

std::vector<Round> plan_range_rounds(const Layout &layout, const std::vector<Released> &released, size_t cap) {
    struct Chunk {
        int entry;
        size_t begin, end; // element range of the released range
    };
    std::vector<Chunk> chunks;
    for (size_t e = 0; e < released.size(); ++e) {
        const size_t n = released[e].count;
        for (size_t b = 0; b < n; b += cap) chunks.push_back({static_cast<int>(e), b, std::min(n, b + cap)});
    }
    const size_t parts = static_cast<size_t>(layout.parts());
    std::vector<Round> rounds;
    size_t c = 0;
    while (c < chunks.size()) {
        size_t round_elems = 0, c_end = c;
        while (c_end < chunks.size() && round_elems + (chunks[c_end].end - chunks[c_end].begin) <= cap)
            round_elems += chunks[c_end].end - chunks[c_end].begin, ++c_end;
        Round r;
        r.counts.assign(parts, 0);
        std::vector<SendPiece> pcs;
        for (size_t k = c; k < c_end; ++k) {
            const Released &rel = released[static_cast<size_t>(chunks[k].entry)];
            const size_t off = layout.slot_of(rel.param)->offset + rel.offset;
            for (const auto &piece : layout.pieces(off + chunks[k].begin, off + chunks[k].end)) {
                pcs.push_back({chunks[k].entry, piece.part, piece.flat_offset - off, piece.flat_offset, piece.count});
                r.counts[static_cast<size_t>(piece.part)] += piece.count;
            }
        }
        std::stable_sort(pcs.begin(), pcs.end(), [](const SendPiece &a, const SendPiece &b) { return a.part < b.part; });
        r.pieces = std::move(pcs);
        rounds.push_back(std::move(r));
        c = c_end;
    }
    return rounds;
}

std::vector<int> prefetch_list(const std::vector<int> &last_trace, size_t &pos, int index, size_t budget,
                               const std::function<size_t(int)> &numel, const std::function<bool(int)> &held) {
    std::vector<int> list{index};
    size_t p = pos;
    while (p < last_trace.size() && last_trace[p] != index) ++p;
    if (p == last_trace.size()) return list; // not in the trace: no prefetch
    pos = p + 1;
    size_t used = numel(index);
    for (size_t k = p + 1; k < last_trace.size(); ++k) {
        const int j = last_trace[k];
        if (held(j) || std::find(list.begin(), list.end(), j) != list.end()) continue;
        if (used + numel(j) > budget) break;
        used += numel(j);
        list.push_back(j);
    }
    return list;
}

GatherPlan plan_gather(const Layout &layout, const std::vector<int> &list) {
    GatherPlan g;
    g.counts.assign(static_cast<size_t>(layout.parts()), 0);
    for (int r = 0; r < layout.parts(); ++r)
        for (int j : list)
            for (const auto &pc : layout.param_pieces(j))
                if (pc.part == r) {
                    g.pieces.emplace_back(j, pc);
                    g.counts[static_cast<size_t>(r)] += pc.count;
                }
    return g;
}

} // namespace zero
} // namespace dsm
