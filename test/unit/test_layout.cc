// The flat ZeRO layout: aligned offsets, equal aligned partitions, and the
// pieces/segments/counts that the engine's reductions and gathers use, on
// awkward sizes (primes, parameters smaller than the number of partitions, a
// parameter spanning several partitions, empty partitions), and the pure
// planning of the stages' collectives on it (zero/plan.hpp).
#include "zero/layout.hpp"
#include "zero/plan.hpp"

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
        for (const auto &seg : L.runs(r)) {
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
    assert_true(L.runs(3).empty());
    // Partition 2 holds parameter 2.
    auto segs = L.runs(2);
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

// Stage 0/1 regions and the stage 2/3 bucket capacity.
static void test_regions(void **) {
    auto r = dsm::zero::flat_regions(100, 40);
    assert_int_equal(r.size(), 3);
    assert_int_equal(r[2].first, 80);
    assert_int_equal(r[2].second, 100);
    assert_int_equal(dsm::zero::flat_regions(100, 0).size(), 100); // at least 1 element
    assert_int_equal(dsm::zero::flat_regions(16, 500000000).size(), 1);
    assert_int_equal(dsm::zero::bucket_capacity(500000000, 1000), 1000);
    assert_int_equal(dsm::zero::bucket_capacity(64, 1000), 64);
    assert_int_equal(dsm::zero::bucket_capacity(0, 0), 1);
}

// Every released element is sent exactly once, grouped by owner, each round
// within the capacity; a lone parameter is sent in flat order.
static void check_rounds(const Layout &L, const std::vector<int> &released, size_t cap) {
    std::vector<std::vector<int>> seen(released.size());
    for (size_t e = 0; e < released.size(); ++e) seen[e].assign(L.slot_of(released[e])->numel, 0);
    for (const auto &r : dsm::zero::plan_rounds(L, released, cap)) {
        assert_true(r.elements() <= cap);
        assert_int_equal(r.counts.size(), static_cast<size_t>(L.parts()));
        int last_part = 0;
        std::vector<size_t> per(static_cast<size_t>(L.parts()), 0);
        for (const auto &pc : r.pieces) {
            assert_true(pc.part >= last_part);
            last_part = pc.part;
            const Slot *s = L.slot_of(released[static_cast<size_t>(pc.entry)]);
            assert_int_equal(pc.flat, s->offset + pc.src);
            assert_true(pc.flat >= L.part_begin(pc.part) && pc.flat + pc.count <= L.part_begin(pc.part) + L.part_size());
            for (size_t k = 0; k < pc.count; ++k) ++seen[static_cast<size_t>(pc.entry)][pc.src + k];
            per[static_cast<size_t>(pc.part)] += pc.count;
        }
        for (int p = 0; p < L.parts(); ++p) assert_int_equal(per[static_cast<size_t>(p)], r.counts[static_cast<size_t>(p)]);
    }
    for (const auto &v : seen)
        for (int x : v) assert_int_equal(x, 1);
}

static void test_rounds(void **) {
    const Layout one = make({1000}, 2);
    auto r = dsm::zero::plan_rounds(one, {0}, 1000);
    assert_int_equal(r.size(), 1);
    size_t at = 0;
    for (const auto &pc : r[0].pieces) { // the parameter's own order
        assert_int_equal(pc.src, at);
        at += pc.count;
    }
    check_rounds(one, {0}, 1000);
    check_rounds(one, {0}, 7);
    const Layout many = make({5, 1, 33, 17, 64, 3}, 4);
    check_rounds(many, {3, 0, 5, 2, 1, 4}, 40);
    check_rounds(many, {4, 2}, 1);
    check_rounds(many, {0, 1, 2, 3, 4, 5}, 1000);
}

// Ranges of parameters (stacked tensors reduced slice by slice): every
// element of every range is sent once, to the partition that owns its flat
// offset, and `src` counts from the range's first element.
static void test_range_rounds(void **) {
    const Layout L = make({100, 37, 64}, 4);
    const std::vector<dsm::zero::Released> rel{{0, 30, 40}, {2, 0, 64}, {1, 36, 1}, {0, 0, 30}};
    for (size_t cap : {size_t(1), size_t(7), size_t(50), size_t(1000)}) {
        const auto rounds = dsm::zero::plan_range_rounds(L, rel, cap);
        std::vector<std::vector<int>> seen(rel.size());
        for (size_t e = 0; e < rel.size(); ++e) seen[e].assign(rel[e].count, 0);
        for (const auto &r : rounds) {
            size_t elems = 0;
            for (const auto &pc : r.pieces) {
                const auto &x = rel[static_cast<size_t>(pc.entry)];
                assert_true(pc.src + pc.count <= x.count);
                assert_int_equal(pc.flat, L.slot_of(x.param)->offset + x.offset + pc.src);
                assert_true(pc.flat >= L.part_begin(pc.part) && pc.flat + pc.count <= L.part_begin(pc.part) + L.part_size());
                for (size_t k = 0; k < pc.count; ++k) ++seen[static_cast<size_t>(pc.entry)][pc.src + k];
                elems += pc.count;
            }
            assert_true(elems <= cap);
        }
        for (const auto &v : seen)
            for (int c : v) assert_int_equal(c, 1);
    }
    // A whole parameter as a range plans as plan_rounds does.
    const auto a = dsm::zero::plan_rounds(L, std::vector<int>{1, 0}, 50);
    const auto b = dsm::zero::plan_range_rounds(L, {{1, 0, 37}, {0, 0, 100}}, 50);
    assert_int_equal(a.size(), b.size());
    for (size_t k = 0; k < a.size(); ++k) {
        assert_true(a[k].counts == b[k].counts);
        assert_int_equal(a[k].pieces.size(), b[k].pieces.size());
        for (size_t q = 0; q < a[k].pieces.size(); ++q) {
            assert_int_equal(a[k].pieces[q].flat, b[k].pieces[q].flat);
            assert_int_equal(a[k].pieces[q].src, b[k].pieces[q].src);
        }
    }
}

static void test_prefetch_and_gather(void **) {
    const Layout L = make({10, 20, 30, 40}, 3);
    auto numel = [&](int j) { return L.slot_of(j)->numel; };
    auto none = [](int) { return false; };
    const std::vector<int> trace{0, 1, 2, 3};
    size_t pos = 0;
    auto list = dsm::zero::prefetch_list(trace, pos, 1, 60, numel, none);
    assert_int_equal(list.size(), 2); // 1 and 2 (20 + 30), not 3
    assert_int_equal(list[1], 2);
    assert_int_equal(pos, 2);
    list = dsm::zero::prefetch_list(trace, pos, 0, 1000, numel, none); // behind the position: alone
    assert_int_equal(list.size(), 1);
    pos = 0;
    list = dsm::zero::prefetch_list(trace, pos, 0, 1000, numel, [](int j) { return j == 2; });
    assert_int_equal(list.size(), 3); // 0, 1, 3
    assert_int_equal(list[2], 3);
    const auto g = dsm::zero::plan_gather(L, {3, 1});
    size_t total = 0, last = 0;
    for (const auto &jp : g.pieces) {
        assert_true(static_cast<size_t>(jp.second.part) >= last);
        last = static_cast<size_t>(jp.second.part);
        total += jp.second.count;
    }
    assert_int_equal(total, 60);
    size_t sum = 0;
    for (size_t c : g.counts) sum += c;
    assert_int_equal(sum, 60);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_awkward_sizes),
        cmocka_unit_test(test_counts_and_pieces),
        cmocka_unit_test(test_empty_and_bad),
        cmocka_unit_test(test_regions),
        cmocka_unit_test(test_rounds),
        cmocka_unit_test(test_range_rounds),
        cmocka_unit_test(test_prefetch_and_gather),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
