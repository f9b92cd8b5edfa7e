#include "zero/layout.hpp"

#include <algorithm>
#include <limits>

#include "core/error.hpp"

namespace dsm {
namespace zero {

namespace {
size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }
} // namespace

Layout::Layout(std::vector<Slot> slots, int parts) : slots_(std::move(slots)), parts_(parts) {
    DSM_REQUIRE(parts >= 1, DSM_ERR_INVALID_ARGUMENT, "partition count must be >= 1, got ", parts);
    const size_t limit = std::numeric_limits<size_t>::max() / 4;
    size_t off = 0;
    int max_param = -1;
    for (auto &s : slots_) {
        s.offset = off;
        DSM_REQUIRE(s.numel <= limit - off, DSM_ERR_INVALID_ARGUMENT,
                    "the parameters do not fit in one flat index space (parameter ", s.param, ")");
        off = round_up(off + s.numel, kAlignElems);
        used_ += s.numel;
        max_param = std::max(max_param, s.param);
    }
    const size_t unit = kAlignElems * static_cast<size_t>(parts);
    total_ = std::max(round_up(off, unit), unit);
    part_size_ = total_ / static_cast<size_t>(parts);
    slot_index_.assign(static_cast<size_t>(max_param + 1), -1);
    for (size_t i = 0; i < slots_.size(); ++i) slot_index_[static_cast<size_t>(slots_[i].param)] = static_cast<int>(i);
}

const Slot *Layout::slot_of(int param) const noexcept {
    if (param < 0 || static_cast<size_t>(param) >= slot_index_.size()) return nullptr;
    const int i = slot_index_[static_cast<size_t>(param)];
    return i < 0 ? nullptr : &slots_[static_cast<size_t>(i)];
}

std::vector<Piece> Layout::pieces(size_t begin, size_t end) const {
    std::vector<Piece> out;
    end = std::min(end, total_);
    while (begin < end) {
        const int part = static_cast<int>(begin / part_size_);
        const size_t stop = std::min(end, part_begin(part) + part_size_);
        out.push_back(Piece{part, 0, begin, stop - begin});
        begin = stop;
    }
    return out;
}

std::vector<Piece> Layout::param_pieces(int param) const {
    const Slot *s = slot_of(param);
    if (!s || s->numel == 0) return {};
    std::vector<Piece> out = pieces(s->offset, s->offset + s->numel);
    for (auto &p : out) p.param_offset = p.flat_offset - s->offset;
    return out;
}

std::vector<size_t> Layout::counts(size_t begin, size_t end) const {
    std::vector<size_t> c(static_cast<size_t>(parts_), 0);
    for (const auto &p : pieces(begin, end)) c[static_cast<size_t>(p.part)] = p.count;
    return c;
}

std::vector<Run> Layout::runs(int part) const {
    std::vector<Run> out;
    const size_t b = part_begin(part), e = b + part_size_;
    // Slots are in flat order: find the first that ends after b.
    auto it = std::lower_bound(slots_.begin(), slots_.end(), b,
                               [](const Slot &s, size_t x) { return s.offset + s.numel <= x; });
    for (; it != slots_.end() && it->offset < e; ++it) {
        const size_t lo = std::max(b, it->offset), hi = std::min(e, it->offset + it->numel);
        if (lo >= hi) continue;
        out.push_back(Run{lo - b, hi - lo, it->param, it->decay});
    }
    return out;
}

} // namespace zero
} // namespace dsm
