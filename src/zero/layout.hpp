// The flat layout of the trainable parameters: every parameter at an aligned
// offset of one flat index space, padded so that it splits into `parts`
// equal, aligned partitions (ZeRO's partitions over the data-parallel ranks).
// Partition r is [r * part_size, (r + 1) * part_size).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dsm {
namespace zero {

// Parameter offsets are multiples of this many elements (64 bytes of fp32),
// so every parameter and every partition starts on a cache line and a SIMD
// vector boundary.
constexpr size_t kAlignElems = 16;

struct Slot {
    int param = 0;        // index in the engine's parameter list
    size_t numel = 0;
    size_t offset = 0;    // flat offset, a multiple of kAlignElems
    bool decay = true;
};

// A parameter's elements inside one partition, as the optimizer of that
// partition sees them: offsets relative to the partition's start.
struct Run {
    size_t offset = 0;
    size_t count = 0;
    int param = 0;
    bool decay = true;
};

// A piece of a parameter inside one partition.
struct Piece {
    int part = 0;
    size_t param_offset = 0; // first element of the parameter in this piece
    size_t flat_offset = 0;  // the same element's flat offset
    size_t count = 0;
};

class Layout {
public:
    Layout() = default;
    // `slots` in layout order (param, numel, decay; offsets are computed);
    // parts >= 1. Throws DSM_ERR_INVALID_ARGUMENT when the total does not fit.
    Layout(std::vector<Slot> slots, int parts);

    size_t total() const noexcept { return total_; }      // padded: parts * part_size
    size_t used() const noexcept { return used_; }        // sum of numel
    int parts() const noexcept { return parts_; }
    size_t part_size() const noexcept { return part_size_; }
    size_t part_begin(int part) const noexcept { return part_size_ * static_cast<size_t>(part); }
    const std::vector<Slot> &slots() const noexcept { return slots_; }
    // The slot of a parameter index; nullptr when it is not in the layout.
    const Slot *slot_of(int param) const noexcept;

    // The runs of partition `part` (the optimizer's segments), in flat order.
    std::vector<Run> runs(int part) const;
    // The pieces of [begin, end) of the flat space inside each partition that
    // overlaps it, in flat (= partition) order.
    std::vector<Piece> pieces(size_t begin, size_t end) const;
    // The pieces of one parameter.
    std::vector<Piece> param_pieces(int param) const;
    // Elements of partition p inside [begin, end): per partition, for
    // reduce_scatterv/allgatherv counts.
    std::vector<size_t> counts(size_t begin, size_t end) const;

private:
    std::vector<Slot> slots_;
    std::vector<int> slot_index_; // param -> index in slots_, -1 if absent
    size_t total_ = 0, used_ = 0, part_size_ = 0;
    int parts_ = 1;
};

} // namespace zero
} // namespace dsm
