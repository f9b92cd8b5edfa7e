// The flat ZeRO layout: aligned offsets, equal aligned partitions, and the
// pieces/segments/counts that the engine's reductions and gathers use, on
// awkward sizes (primes, parameters smaller than the number of partitions, a
// parameter spanning several partitions, empty partitions).
#include "zero/layout.hpp"

#include "cxx_test.h"

using dsm::zero::Layout;
using dsm::zero::Slot;
using dsm::zero::kAlignElems;

static Layout make(const std::vector<size_t> &numels, int parts) {
    std::vector<Slot> slots;
    for (size_t i = 0; i < numels.size(); ++i) {
        Slot s;
        s.param = static_cast<int>(i);
        s.numel = numels[i];
        s.decay = i % 2 == 0;
        slots.push_back(s);
    }
    return Layout(slots, parts);
}

// Every element of every parameter is in exactly one piece of exactly one
// partition, and the segments of all partitions cover the parameters once.
static void check_cover(const Layout &L, const std::vector<size_t> &numels) {
    assert_int_equal(L.total() % (kAlignElems * static_cast<size_t>(L.parts())), 0);
    assert_int_equal(L.part_size() * static_cast<size_t>(L.parts()), L.total());
    assert_int_equal(L.part_size() % kAlignElems, 0);
    size_t used = 0, end = 0;
    for (size_t i = 0; i < numels.size(); ++i) {
        const Slot *s = L.slot_of(static_cast<int>(i));
        assert_non_null(s);
        assert_int_equal(s->offset % kAlignElems, 0);
        assert_true(s->offset >= end); // no overlap, in order
        end = s->offset + s->numel;
        used += numels[i];
        size_t covered = 0, expect_offset = 0;
        for (const auto &pc : L.param_pieces(static_cast<int>(i))) {
            assert_int_equal(pc.param_offset, expect_offset);
            assert_int_equal(pc.flat_offset, s->offset + pc.param_offset);
            assert_true(pc.flat_offset >= L.part_begin(pc.part));
            assert_true(pc.flat_offset + pc.count <= L.part_begin(pc.part) + L.part_size());
            expect_offset += pc.count;
            covered += pc.count;
        }
        assert_int_equal(covered, numels[i]);
    }
    assert_int_equal(L.used(), used);
    assert_true(end <= L.total());
    size_t seg_total = 0;
    for (int r = 0; r < L.parts(); ++r) {
        size_t prev_end = 0;
        for (const auto &seg : L.segments(r)) {
            assert_true(seg.offset >= prev_end);
            assert_true(seg.offset + seg.count <= L.part_size());
            const Slot *s = L.slot_of(seg.param);
            assert_true(L.part_begin(r) + seg.offset >= s->offset);
            assert_true(L.part_begin(r) + seg.offset + seg.count <= s->offset + s->numel);
            assert_int_equal(seg.decay, s->decay);
            prev_end = seg.offset + seg.count;
            seg_total += seg.count;
        }
    }
    assert_int_equal(seg_total, used);
}

static void test_awkward_sizes(void **) {
    const std::vector<std::vector<size_t>> models = {
        {1}, {2, 3, 5, 7, 11, 13}, {1000003}, {7, 1000, 1, 1, 17, 65537}, {16, 16, 16}, {0, 5, 0},
    };
    for (const auto &m : models)
        for (int parts : {1, 2, 3, 4, 7, 8, 64}) check_cover(make(m, parts), m);
}

static void test_counts_and_pieces(void **) {
    // 3 parameters of 5, 40 and 3 elements over 4 partitions.
    Layout L = make({5, 40, 3}, 4);
    assert_int_equal(L.slot_of(0)->offset, 0);
    assert_int_equal(L.slot_of(1)->offset, 16);
    assert_int_equal(L.slot_of(2)->offset, 64);
    assert_int_equal(L.total(), 128); // 67 rounded up to 4 * 16 * k
    assert_int_equal(L.part_size(), 32);
    // Parameter 1 = flat [16, 56): 16 in partition 0, 24 in partition 1.
    auto pcs = L.param_pieces(1);
    assert_int_equal(pcs.size(), 2);
    assert_int_equal(pcs[0].part, 0);
    assert_int_equal(pcs[0].count, 16);
    assert_int_equal(pcs[1].part, 1);
    assert_int_equal(pcs[1].count, 24);
    auto c = L.counts(16, 56);
    assert_int_equal(c[0], 16);
    assert_int_equal(c[1], 24);
    assert_int_equal(c[2], 0);
    assert_int_equal(c[3], 0);
    // Partition 3 holds only padding.
    assert_true(L.segments(3).empty());
    // Partition 2 holds parameter 2.
    auto segs = L.segments(2);
    assert_int_equal(segs.size(), 1);
    assert_int_equal(segs[0].param, 2);
    assert_int_equal(segs[0].offset, 0);
    assert_int_equal(segs[0].count, 3);
    assert_null(L.slot_of(3));
    assert_null(L.slot_of(-1));
}

static void test_empty_and_bad(void **) {
    Layout L(std::vector<Slot>{}, 3);
    assert_int_equal(L.used(), 0);
    assert_int_equal(L.total(), 3 * kAlignElems);
    expect_error_at([] { Layout bad(std::vector<Slot>{}, 0); }, DSM_ERR_INVALID_ARGUMENT, {"partition count", "0"},
                    __LINE__);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_awkward_sizes),
        cmocka_unit_test(test_counts_and_pieces),
        cmocka_unit_test(test_empty_and_bad),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
