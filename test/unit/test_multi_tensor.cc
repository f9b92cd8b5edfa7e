// The host side of the multi-tensor launches (optim/multi_tensor.hpp), on the
// CPU: the table of segments (empty entries dropped, chunks counted), the
// lookup of a chunk's segment and elements, which must cover every element
// of every segment exactly once, the launch size, and the cut into batches
// without overlapping destinations (a gradient released twice in a flush).
// The kernels that read these tables are checked on a device by
// test_cuda_kernels.
#include <cstdint>
#include <vector>

#include "optim/multi_tensor.hpp"

#include "cxx_test.h" // last: CMocka's fail() macro would break the C++ headers

using dsm::cuda::kMtChunk;
using dsm::cuda::MtEntry;
using dsm::cuda::MtTable;

namespace {

// Every chunk of t mapped back: each element of each segment once, in order.
void check_cover(const MtTable &t, const std::vector<MtEntry> &entries) {
    std::vector<MtEntry> live;
    for (const MtEntry &e : entries)
        if (e.count > 0) live.push_back(e);
    assert_int_equal(t.segs.size(), live.size());
    uint64_t chunks = 0;
    for (size_t s = 0; s < live.size(); ++s) {
        assert_int_equal(t.segs[s].offset, live[s].offset);
        assert_int_equal(t.segs[s].count, live[s].count);
        assert_int_equal(t.segs[s].aux, live[s].aux);
        assert_int_equal(t.segs[s].first_chunk, chunks);
        chunks += (live[s].count + kMtChunk - 1) / kMtChunk;
    }
    assert_int_equal(t.chunks, chunks);
    std::vector<uint64_t> seen(live.size(), 0); // elements of each segment seen so far
    for (uint64_t c = 0; c < t.chunks; ++c) {
        const dsm::cuda::MtChunk k = dsm::cuda::mt_chunk(t, c);
        assert_true(k.seg < live.size());
        assert_true(k.count > 0 && k.count <= kMtChunk);
        assert_int_equal(k.begin, live[k.seg].offset + seen[k.seg]); // contiguous, in order
        seen[k.seg] += k.count;
        assert_true(seen[k.seg] <= live[k.seg].count);
    }
    for (size_t s = 0; s < live.size(); ++s) assert_int_equal(seen[s], live[s].count);
    // The per-chunk index gives the search's segment for every chunk.
    const std::vector<uint32_t> index = dsm::cuda::mt_chunk_index(t);
    assert_int_equal(index.size(), t.chunks);
    for (uint64_t c = 0; c < t.chunks; ++c) assert_int_equal(index[c], dsm::cuda::mt_chunk(t, c).seg);
}

void test_plan_many_tiny(void **) {
    // 600 tensors of 1..7 elements, some empty, packed with odd offsets.
    std::vector<MtEntry> e;
    uint64_t at = 3;
    for (int i = 0; i < 600; ++i) {
        const uint64_t n = i % 9 == 0 ? 0 : 1 + static_cast<uint64_t>(i % 7);
        e.push_back(MtEntry{at, n, static_cast<uint64_t>(i % 2)});
        at += n + static_cast<uint64_t>(i % 3);
    }
    const MtTable t = dsm::cuda::mt_plan(e);
    check_cover(t, e);
    // One chunk per non-empty tensor: one block each, all in one launch.
    assert_int_equal(t.chunks, t.segs.size());
    assert_int_equal(dsm::cuda::mt_blocks(t.chunks), t.chunks);
}

void test_plan_sizes(void **) {
    // Sizes around the chunk, large ones and the sizes of a GPT-2 block.
    const uint64_t sizes[] = {1,        kMtChunk - 1,      kMtChunk,       kMtChunk + 1, 3 * kMtChunk + 5,
                              768,      2304 * 768,        768 * 4 * 768,  50257 * 768,  0,
                              1000003,  2 * kMtChunk};
    std::vector<MtEntry> e;
    uint64_t at = 0;
    for (const uint64_t n : sizes) {
        e.push_back(MtEntry{at, n, n % 2});
        at += n + 1;
    }
    check_cover(dsm::cuda::mt_plan(e), e);
    assert_int_equal(dsm::cuda::mt_plan({}).chunks, 0);
    assert_int_equal(dsm::cuda::mt_plan({MtEntry{5, 0, 0}}).segs.size(), 0);
}

void test_blocks(void **) {
    assert_int_equal(dsm::cuda::mt_blocks(0), 0);
    assert_int_equal(dsm::cuda::mt_blocks(1), 1);
    assert_int_equal(dsm::cuda::mt_blocks(dsm::cuda::kMtMaxBlocks + 10), dsm::cuda::kMtMaxBlocks);
}

void test_batches(void **) {
    using dsm::cuda::mt_batches;
    // Disjoint: one batch.
    std::vector<size_t> b = mt_batches({MtEntry{0, 10, 0}, MtEntry{20, 5, 0}, MtEntry{10, 10, 0}});
    assert_int_equal(b.size(), 1);
    assert_int_equal(b[0], 3);
    // Touching ranges do not overlap.
    b = mt_batches({MtEntry{0, 10, 0}, MtEntry{10, 10, 0}, MtEntry{20, 1, 0}});
    assert_int_equal(b.size(), 1);
    // The same destination twice: the second starts a batch; a third overlap a third.
    b = mt_batches({MtEntry{0, 10, 0}, MtEntry{30, 5, 0}, MtEntry{5, 2, 0}, MtEntry{40, 1, 0}, MtEntry{35, 3, 0}});
    assert_int_equal(b.size(), 2);
    assert_int_equal(b[0], 2);
    assert_int_equal(b[1], 5);
    b = mt_batches({MtEntry{0, 10, 0}, MtEntry{0, 10, 0}, MtEntry{9, 1, 0}});
    assert_int_equal(b.size(), 3);
    assert_int_equal(b[0], 1);
    assert_int_equal(b[1], 2);
    assert_int_equal(b[2], 3);
    // Empty entries never overlap; no entries: one empty batch.
    b = mt_batches({MtEntry{0, 10, 0}, MtEntry{5, 0, 0}});
    assert_int_equal(b.size(), 1);
    b = mt_batches({});
    assert_int_equal(b.size(), 1);
    assert_int_equal(b[0], 0);
    // A range that overlaps one far back in a long batch is found (the search).
    std::vector<MtEntry> e;
    for (uint64_t i = 0; i < 500; ++i) e.push_back(MtEntry{1000 - 2 * i, 1, 0});
    e.push_back(MtEntry{500, 3, 0}); // covers 500..502: overlaps the entry at 500 and 502
    b = mt_batches(e);
    assert_int_equal(b.size(), 2);
    assert_int_equal(b[0], 500);
    // Within every batch no two destinations overlap (brute force).
    size_t begin = 0;
    for (const size_t end : b) {
        for (size_t i = begin; i < end; ++i)
            for (size_t j = i + 1; j < end; ++j)
                assert_false(e[i].offset < e[j].offset + e[j].count && e[j].offset < e[i].offset + e[i].count &&
                             e[i].count > 0 && e[j].count > 0);
        begin = end;
    }
}

} // namespace

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_many_tiny),
        cmocka_unit_test(test_plan_sizes),
        cmocka_unit_test(test_blocks),
        cmocka_unit_test(test_batches),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
