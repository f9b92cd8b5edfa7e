// Multi-tensor launches on a CUDA device: the host side.
//
// A step over many tensors (the segments of a partition, the gradients of a
// flush) runs as one kernel over a table of segments instead of one launch
// per tensor. Each segment is cut into chunks of kMtChunk elements; block b
// of the launch takes chunks b, b + grid, b + 2 grid, ... and finds each
// chunk's segment by a binary search of the segments' first chunks. So a
// launch costs the same whatever the number of tensors, a tiny tensor costs
// one block instead of one launch, and the work of a chunk is what the
// per-tensor kernel does on the same elements (an element's arithmetic
// never depends on where its chunk starts: see optim/optimizer_cuda.cu).
//
// This header is plain C++ (no CUDA include): the table's planning is
// unit-tested on the CPU (test/unit/test_multi_tensor.cc), and
// optimizer_cuda.cu and space_cuda.cu read the same MtSeg layout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dsm {
namespace cuda {

// Elements per chunk: 256 threads x 4 elements x 4 iterations.
constexpr uint64_t kMtChunk = 4096;

// MtSeg::aux of an update: the segment has weight decay (its constants are
// the "on" ones, else the "off" ones).
constexpr uint64_t kMtDecay = 1;

// One segment of a launch, as the device reads it (32 bytes).
struct MtSeg {
    uint64_t offset;      // first element, an index into every array of the launch
    uint64_t count;       // elements (> 0)
    uint64_t first_chunk; // chunks of the segments before this one
    uint64_t aux;         // update: kMtDecay or 0; accumulate: the source's address
};

// What a segment is made of, before planning.
struct MtEntry {
    uint64_t offset = 0;
    uint64_t count = 0;
    uint64_t aux = 0;
};

// The table of one launch: segments in the entries' order, empty entries
// dropped, first_chunk the running sum of the chunks; `chunks` in all.
struct MtTable {
    std::vector<MtSeg> segs;
    uint64_t chunks = 0;
};

inline uint64_t mt_chunks_of(uint64_t count) noexcept { return (count + kMtChunk - 1) / kMtChunk; }

inline MtTable mt_plan(const std::vector<MtEntry> &entries) {
    MtTable t;
    t.segs.reserve(entries.size());
    for (const MtEntry &e : entries) {
        if (e.count == 0) continue;
        t.segs.push_back(MtSeg{e.offset, e.count, t.chunks, e.aux});
        t.chunks += mt_chunks_of(e.count);
    }
    return t;
}

// The chunk c of a table (c < chunks): its segment's index, first element
// and element count. The device's lookup (kernels_cuda_common.cuh's mt_find) is this search.
struct MtChunk {
    size_t seg;
    uint64_t begin, count;
};
inline MtChunk mt_chunk(const MtTable &t, uint64_t c) noexcept {
    size_t lo = 0, hi = t.segs.size() - 1;
    while (lo < hi) {
        const size_t mid = (lo + hi + 1) / 2;
        if (t.segs[mid].first_chunk <= c) lo = mid;
        else hi = mid - 1;
    }
    const MtSeg &s = t.segs[lo];
    const uint64_t local = (c - s.first_chunk) * kMtChunk;
    const uint64_t left = s.count - local;
    return MtChunk{lo, s.offset + local, left < kMtChunk ? left : kMtChunk};
}

// Each chunk's segment index, chunk by chunk: the lookup the update kernel
// reads (one load per chunk instead of a search), kept on the device with
// the table.
inline std::vector<uint32_t> mt_chunk_index(const MtTable &t) {
    std::vector<uint32_t> out;
    out.reserve(t.chunks);
    for (size_t s = 0; s < t.segs.size(); ++s)
        out.insert(out.end(), mt_chunks_of(t.segs[s].count), static_cast<uint32_t>(s));
    return out;
}

// Blocks of a launch over `chunks` chunks (blocks loop beyond the cap).
constexpr uint64_t kMtMaxBlocks = 1u << 20;
inline unsigned mt_blocks(uint64_t chunks) noexcept {
    return static_cast<unsigned>(chunks < kMtMaxBlocks ? chunks : kMtMaxBlocks);
}

// Entries whose destinations [offset, offset + count) may overlap (a
// gradient released twice in one flush) must not run in one launch: blocks
// run in no fixed order. The entries cut into consecutive batches, each
// free of overlaps, in order; returns each batch's end index. The order of
// the additions into any element is then the entries' order.
inline std::vector<size_t> mt_batches(const std::vector<MtEntry> &entries) {
    std::vector<size_t> ends;
    std::vector<std::pair<uint64_t, uint64_t>> taken; // sorted, disjoint [begin, end)
    for (size_t i = 0; i < entries.size(); ++i) {
        const uint64_t b = entries[i].offset, e = b + entries[i].count;
        if (b == e) continue;
        // The first taken range that ends after b.
        size_t lo = 0, hi = taken.size();
        while (lo < hi) {
            const size_t mid = (lo + hi) / 2;
            if (taken[mid].second <= b) lo = mid + 1;
            else hi = mid;
        }
        if (lo < taken.size() && taken[lo].first < e) { // overlaps: a new batch from i
            ends.push_back(i);
            taken.clear();
            lo = 0;
        }
        taken.insert(taken.begin() + static_cast<std::ptrdiff_t>(lo), {b, e});
    }
    ends.push_back(entries.size());
    return ends;
}

} // namespace cuda
} // namespace dsm
