// Pure planning of the ZeRO stages' collectives: which elements go into
// which round of a bucketed reduction, packed for which owner; which
// parameters one ZeRO-3 gather fetches (prefetch) and where their pieces
// land. No MPI and no buffers here: the stages (stage.hpp) execute the plans,
// test/unit/test_layout checks them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "zero/layout.hpp"

namespace dsm {
namespace zero {

// Stage 0/1: the flat gradient reduced in regions of at most `want`
// (reduce_bucket_size, at least 1) elements: [begin, end) pairs in order.
std::vector<std::pair<size_t, size_t>> flat_regions(size_t total, int64_t want);

// Elements per reduction round of a stage 2/3 bucket: reduce_bucket_size (at
// least 1), never more than the trainable elements (at least 1).
size_t bucket_capacity(int64_t reduce_bucket_size, size_t used);

// One piece of a released gradient in a reduction round.
struct SendPiece {
    int entry = 0;       // index in the released list
    int part = 0;        // the owner partition
    size_t src = 0;      // first element in the entry's gradient
    size_t flat = 0;     // the same element's flat offset
    size_t count = 0;
};

// One reduce-scatter: `counts` per partition, `pieces` in send order
// (grouped by owner; in release order within an owner).
struct Round {
    std::vector<size_t> counts;
    std::vector<SendPiece> pieces;
    size_t elements() const noexcept;
};

// A released gradient: `count` elements of parameter `param` from element
// `offset` (a whole parameter: offset 0, count numel).
struct Released {
    int param = 0;
    size_t offset = 0, count = 0;
};

// The rounds that reduce `released` (in release order; SendPiece::src is
// relative to the range's first element): every range split into chunks of
// at most `cap` elements, consecutive chunks packed into a round while they
// fit in `cap`.
std::vector<Round> plan_range_rounds(const Layout &layout, const std::vector<Released> &released, size_t cap);

// The rounds that reduce `released` (parameter indices, in release order):
// every gradient split into chunks of at most `cap` elements, consecutive
// chunks packed into a round while they fit in `cap`.
std::vector<Round> plan_rounds(const Layout &layout, const std::vector<int> &released, size_t cap);

// ZeRO-3 prefetch: the parameters one gather of `index` fetches: `index`,
// then those that followed it in the previous micro-step's trace of gathered
// acquisitions (from position `pos`, which advances past `index`), while
// their elements fit in `budget` (prefetch_bucket_size) and skipping those
// `held` already. Only `index` when it is not in the trace.
std::vector<int> prefetch_list(const std::vector<int> &last_trace, size_t &pos, int index, size_t budget,
                               const std::function<size_t(int)> &numel, const std::function<bool(int)> &held);

// One allgatherv of several whole parameters: `counts` per partition and
// every parameter piece in receive order (by owner; in list order within one).
struct GatherPlan {
    std::vector<size_t> counts;
    std::vector<std::pair<int, Piece>> pieces; // (parameter, piece)
};
GatherPlan plan_gather(const Layout &layout, const std::vector<int> &list);

} // namespace zero
} // namespace dsm
