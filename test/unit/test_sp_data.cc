// The data helpers: shard_batch on odd shapes (seq = 1, fewer positions than
// ranks, padding, custom positions and labels) against the shifted sequence
// it must reproduce when the ranks' chunks are put back together; the
// sampler against a line-by-line transcription of
// torch.utils.data.DistributedSampler's index arithmetic; the shuffle against
// the published splitmix64 values and a reference Fisher-Yates; overflow and
// every bad argument.
#include "sp/data.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <set>

#include "cxx_test.h"

using dsm::sp::Sampler;
using dsm::sp::SamplerOptions;
using dsm::sp::Shard;
using dsm::sp::shard_batch;

static const int64_t kMax = std::numeric_limits<int64_t>::max();

// ---------------------------------------------------------------- sharding

struct Chunk {
    int64_t chunk = 0, valid = 0;
    std::vector<int64_t> tokens, positions, labels;
};

static Chunk shard(int size, int rank, int64_t batch, int64_t seq, const std::vector<int64_t> &tokens,
                   const std::vector<int64_t> *positions, const std::vector<int64_t> *labels, int64_t pad = -7) {
    const int64_t chunk = (seq + size - 1) / size;
    Chunk c;
    const size_t n = static_cast<size_t>(batch * chunk);
    // One element more than needed, which must stay untouched.
    c.tokens.assign(n + 1, 1234);
    c.positions.assign(n + 1, 1234);
    c.labels.assign(n + 1, 1234);
    const Shard s = shard_batch(size, rank, batch, seq, tokens.data(), positions ? positions->data() : nullptr,
                                labels ? labels->data() : nullptr, pad, n, c.tokens.data(), c.positions.data(),
                                c.labels.data());
    assert_int_equal(s.chunk, chunk);
    assert_int_equal(c.tokens[n], 1234);
    assert_int_equal(c.positions[n], 1234);
    assert_int_equal(c.labels[n], 1234);
    c.tokens.pop_back();
    c.positions.pop_back();
    c.labels.pop_back();
    c.chunk = s.chunk;
    c.valid = s.valid;
    return c;
}

// What the ranks' chunks must add up to: every row shifted by one label,
// padded to size * chunk.
static void check_reassembled(int size, int64_t batch, int64_t seq, const std::vector<int64_t> &tokens,
                              const std::vector<int64_t> *positions, const std::vector<int64_t> *labels) {
    const int64_t chunk = (seq + size - 1) / size, padded = chunk * size, pad = -7;
    std::vector<int64_t> t(static_cast<size_t>(batch * padded)), p(t.size()), l(t.size());
    int64_t valid = 0;
    for (int r = 0; r < size; ++r) {
        const Chunk c = shard(size, r, batch, seq, tokens, positions, labels, pad);
        int64_t v = 0;
        for (int64_t b = 0; b < batch; ++b)
            for (int64_t k = 0; k < chunk; ++k) {
                const auto from = static_cast<size_t>(b * chunk + k);
                const auto to = static_cast<size_t>(b * padded + r * chunk + k);
                t[to] = c.tokens[from];
                p[to] = c.positions[from];
                l[to] = c.labels[from];
                v += c.labels[from] != DSM_IGNORE_INDEX;
            }
        assert_int_equal(c.valid, v);
        valid += c.valid;
    }
    const std::vector<int64_t> &lab = labels ? *labels : tokens;
    int64_t want_valid = 0;
    for (int64_t b = 0; b < batch; ++b) {
        const int64_t last_pos = positions ? (*positions)[static_cast<size_t>(b * seq + seq - 1)] : seq - 1;
        for (int64_t i = 0; i < padded; ++i) {
            const size_t at = static_cast<size_t>(b * padded + i), in = static_cast<size_t>(b * seq + i);
            if (i < seq) {
                assert_int_equal(t[at], tokens[in]);
                assert_int_equal(p[at], positions ? (*positions)[in] : i);
                assert_int_equal(l[at], i + 1 < seq ? lab[in + 1] : DSM_IGNORE_INDEX);
            } else {
                assert_int_equal(t[at], pad);
                assert_int_equal(p[at], last_pos + (i - seq + 1));
                assert_int_equal(l[at], DSM_IGNORE_INDEX);
            }
            want_valid += l[at] != DSM_IGNORE_INDEX;
        }
    }
    assert_int_equal(valid, want_valid);
    if (!labels) assert_int_equal(valid, batch * (seq - 1)); // token ids here are never -100
}

static std::vector<int64_t> iota(int64_t n, int64_t from) {
    std::vector<int64_t> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = from + i;
    return v;
}

static void test_shard_example(void **) {
    // 2 rows of 5 tokens over 2 ranks: chunk 3, one padding position.
    const std::vector<int64_t> tok = {10, 11, 12, 13, 14, 20, 21, 22, 23, 24};
    Chunk c0 = shard(2, 0, 2, 5, tok, nullptr, nullptr);
    Chunk c1 = shard(2, 1, 2, 5, tok, nullptr, nullptr);
    assert_true(c0.tokens == (std::vector<int64_t>{10, 11, 12, 20, 21, 22}));
    assert_true(c0.positions == (std::vector<int64_t>{0, 1, 2, 0, 1, 2}));
    assert_true(c0.labels == (std::vector<int64_t>{11, 12, 13, 21, 22, 23}));
    assert_int_equal(c0.valid, 6);
    // The last chunk: the last real position and the padding are ignored.
    assert_true(c1.tokens == (std::vector<int64_t>{13, 14, -7, 23, 24, -7}));
    assert_true(c1.positions == (std::vector<int64_t>{3, 4, 5, 3, 4, 5}));
    assert_true(c1.labels == (std::vector<int64_t>{14, -100, -100, 24, -100, -100}));
    assert_int_equal(c1.valid, 2);
}

static void test_shard_seq_one(void **) {
    // One position: rank 0 holds it with nothing to predict; the other ranks hold padding.
    const std::vector<int64_t> tok = {5, 6, 7};
    for (int size : {1, 2, 3}) {
        for (int r = 0; r < size; ++r) {
            Chunk c = shard(size, r, 3, 1, tok, nullptr, nullptr, 99);
            assert_int_equal(c.chunk, 1);
            assert_int_equal(c.valid, 0);
            for (int b = 0; b < 3; ++b) {
                assert_int_equal(c.tokens[static_cast<size_t>(b)], r == 0 ? tok[static_cast<size_t>(b)] : 99);
                assert_int_equal(c.positions[static_cast<size_t>(b)], r);
                assert_int_equal(c.labels[static_cast<size_t>(b)], DSM_IGNORE_INDEX);
            }
        }
        check_reassembled(size, 3, 1, tok, nullptr, nullptr);
    }
}

static void test_shard_fewer_positions_than_ranks(void **) {
    // seq 3 over 8 ranks: chunk 1; ranks 3..7 get only padding, rank 2 the last token.
    const std::vector<int64_t> tok = {1, 2, 3};
    for (int r = 0; r < 8; ++r) {
        Chunk c = shard(8, r, 1, 3, tok, nullptr, nullptr, 0);
        assert_int_equal(c.chunk, 1);
        assert_int_equal(c.valid, r < 2 ? 1 : 0);
        assert_int_equal(c.tokens[0], r < 3 ? tok[static_cast<size_t>(r)] : 0);
        assert_int_equal(c.positions[0], r);
        assert_int_equal(c.labels[0], r < 2 ? tok[static_cast<size_t>(r + 1)] : DSM_IGNORE_INDEX);
    }
    // seq 5 over 4 ranks: chunk 2, rank 3 holds padding only (positions 6 and 7).
    const std::vector<int64_t> five = iota(5, 40);
    Chunk c = shard(4, 3, 1, 5, five, nullptr, nullptr, -1);
    assert_true(c.tokens == (std::vector<int64_t>{-1, -1}));
    assert_true(c.positions == (std::vector<int64_t>{6, 7}));
    assert_true(c.labels == (std::vector<int64_t>{-100, -100}));
    assert_int_equal(c.valid, 0);
}

static void test_shard_custom_positions_and_labels(void **) {
    // Packed documents: positions restart, labels mask a prompt with -100.
    const int64_t batch = 2, seq = 7;
    const std::vector<int64_t> tok = iota(batch * seq, 100);
    const std::vector<int64_t> pos = {0, 1, 2, 0, 1, 2, 3, 10, 11, 12, 13, 14, 15, 16};
    std::vector<int64_t> lab = iota(batch * seq, 500);
    lab[1] = DSM_IGNORE_INDEX;
    lab[2] = DSM_IGNORE_INDEX;
    lab[8] = DSM_IGNORE_INDEX;
    // Rank 2 of 3: chunk 3, positions 6, 7, 8 of each row (two of padding).
    Chunk c = shard(3, 2, batch, seq, tok, &pos, &lab, 0);
    assert_true(c.tokens == (std::vector<int64_t>{106, 0, 0, 113, 0, 0}));
    assert_true(c.positions == (std::vector<int64_t>{3, 4, 5, 16, 17, 18}));
    assert_true(c.labels == (std::vector<int64_t>{-100, -100, -100, -100, -100, -100}));
    assert_int_equal(c.valid, 0);
    // Rank 0: positions 0, 1, 2; labels 1, 2, 3 of each row (two masked in row 0, one in row 1).
    c = shard(3, 0, batch, seq, tok, &pos, &lab, 0);
    assert_true(c.labels == (std::vector<int64_t>{-100, -100, 503, -100, 509, 510}));
    assert_int_equal(c.valid, 3);
    // Labels given, positions not, and the other way round.
    for (int size : {1, 2, 3, 4, 7, 8, 9, 16}) {
        check_reassembled(size, batch, seq, tok, &pos, &lab);
        check_reassembled(size, batch, seq, tok, nullptr, &lab);
        check_reassembled(size, batch, seq, tok, &pos, nullptr);
        check_reassembled(size, batch, seq, tok, nullptr, nullptr);
    }
}

static void test_shard_reassembles(void **) {
    for (int64_t seq = 1; seq <= 23; ++seq)
        for (int64_t batch : {1, 3})
            for (int size = 1; size <= 9; ++size) {
                const std::vector<int64_t> tok = iota(batch * seq, 1000);
                const std::vector<int64_t> pos = iota(batch * seq, 7);
                check_reassembled(size, batch, seq, tok, nullptr, nullptr);
                check_reassembled(size, batch, seq, tok, &pos, &tok);
            }
}

static void test_shard_bad_arguments(void **) {
    int64_t tok[8] = {0}, ot[8], op[8], ol[8];
    const auto call = [&](int size, int rank, int64_t batch, int64_t seq, size_t len) {
        return [=, &tok, &ot, &op, &ol] {
            shard_batch(size, rank, batch, seq, tok, nullptr, nullptr, 0, len, ot, op, ol);
        };
    };
    expect_error_at(call(0, 0, 1, 4, 8), DSM_ERR_INVALID_ARGUMENT, {"size is 0"}, __LINE__);
    expect_error_at(call(-2, 0, 1, 4, 8), DSM_ERR_INVALID_ARGUMENT, {"size is -2"}, __LINE__);
    expect_error_at(call(2, 2, 1, 4, 8), DSM_ERR_INVALID_ARGUMENT, {"rank is 2", "[0, 2)"}, __LINE__);
    expect_error_at(call(2, -1, 1, 4, 8), DSM_ERR_INVALID_ARGUMENT, {"rank is -1"}, __LINE__);
    expect_error_at(call(2, 0, 0, 4, 8), DSM_ERR_INVALID_ARGUMENT, {"batch is 0"}, __LINE__);
    expect_error_at(call(2, 0, 1, 0, 8), DSM_ERR_INVALID_ARGUMENT, {"seq is 0"}, __LINE__);
    expect_error_at(call(2, 0, 1, -5, 8), DSM_ERR_INVALID_ARGUMENT, {"seq is -5"}, __LINE__);
    // 2 rows of 7 over 2 ranks: chunk 4, 8 elements.
    expect_error_at(call(2, 1, 2, 7, 7), DSM_ERR_INVALID_ARGUMENT, {"out_len is 7", "needs 8"}, __LINE__);
    shard_batch(2, 1, 1, 7, tok, nullptr, nullptr, 0, 4, ot, op, ol); // exactly enough
    // Counts whose product overflows: the input cannot exist.
    expect_error_at(call(1, 0, kMax / 2, 4, 8), DSM_ERR_INVALID_ARGUMENT, {"batch 4611686018427387903", "seq 4"},
                    __LINE__);
    expect_error_at(call(4, 0, 3, kMax, static_cast<size_t>(-1)), DSM_ERR_INVALID_ARGUMENT, {"overflow"},
                    __LINE__);
    // A capacity too small for batch * chunk where the product is large.
    expect_error_at(call(2, 1, int64_t{1} << 30, int64_t{1} << 28, 8), DSM_ERR_INVALID_ARGUMENT,
                    {"out_len is 8", "needs 144115188075855872"}, __LINE__);
    expect_error_at([&] { shard_batch(1, 0, 1, 4, nullptr, nullptr, nullptr, 0, 8, ot, op, ol); },
                    DSM_ERR_NULL_POINTER, {"tokens is NULL"}, __LINE__);
    expect_error_at([&] { shard_batch(1, 0, 1, 4, tok, nullptr, nullptr, 0, 8, nullptr, op, ol); },
                    DSM_ERR_NULL_POINTER, {"out_tokens is NULL"}, __LINE__);
    expect_error_at([&] { shard_batch(1, 0, 1, 4, tok, nullptr, nullptr, 0, 8, ot, nullptr, ol); },
                    DSM_ERR_NULL_POINTER, {"out_positions is NULL"}, __LINE__);
    expect_error_at([&] { shard_batch(1, 0, 1, 4, tok, nullptr, nullptr, 0, 8, ot, op, nullptr); },
                    DSM_ERR_NULL_POINTER, {"out_labels is NULL"}, __LINE__);
    // Padding positions that would run past INT64_MAX.
    const int64_t pos[3] = {kMax - 2, kMax - 1, kMax};
    expect_error_at([&] { shard_batch(2, 1, 1, 3, tok, pos, nullptr, 0, 8, ot, op, ol); },
                    DSM_ERR_INVALID_ARGUMENT, {"positions[2]", "9223372036854775807", "overflow"}, __LINE__);
    shard_batch(2, 0, 1, 3, tok, pos, nullptr, 0, 8, ot, op, ol); // rank 0 has no padding
    assert_int_equal(op[1], kMax - 1);
}

// ---------------------------------------------------------------- shuffling

// The reference generator, written from the papers: splitmix64, and a
// uniform draw in [0, bound) by Lemire's multiply-and-reject.
struct RefRng {
    uint64_t s;
    uint64_t next() {
        uint64_t z = (s += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    uint64_t below(uint64_t bound) {
        const uint64_t threshold = (0 - bound) % bound;
        for (;;) {
            const unsigned __int128 m = static_cast<unsigned __int128>(next()) * bound;
            if (static_cast<uint64_t>(m) >= threshold) return static_cast<uint64_t>(m >> 64);
        }
    }
};

static std::vector<int64_t> ref_permutation(int64_t n, uint64_t seed, int64_t epoch) {
    RefRng mix{static_cast<uint64_t>(epoch) - 0x9e3779b97f4a7c15ull}; // one next() = mix64(epoch)
    RefRng rng{seed ^ mix.next()};
    std::vector<int64_t> p = iota(n, 0);
    for (int64_t i = n - 1; i > 0; --i)
        std::swap(p[static_cast<size_t>(i)], p[rng.below(static_cast<uint64_t>(i) + 1)]);
    return p;
}

static void test_splitmix64(void **) {
    // The published first outputs of splitmix64.c from state 0.
    dsm::sp::SplitMix64 g(0);
    assert_true(g.next() == 0xe220a8397b1dcdafull);
    assert_true(g.next() == 0x6e789e6aa1b965f4ull);
    assert_true(g.next() == 0x06c45d188009454full);
    assert_true(g.next() == 0xf88bb8a8724c81ecull);
    assert_true(dsm::sp::mix64(0) == 0);
    assert_true(dsm::sp::shuffle_state(42, 0) == 42);
    assert_true(dsm::sp::shuffle_state(42, 3) == (42 ^ dsm::sp::mix64(3)));
    // below(): in range, against the reference, and unbiased enough to see.
    for (uint64_t bound : {uint64_t{1}, uint64_t{2}, uint64_t{3}, uint64_t{7}, uint64_t{1} << 40,
                           (uint64_t{1} << 63) + 1, ~uint64_t{0}}) {
        dsm::sp::SplitMix64 a(bound);
        RefRng b{bound};
        for (int i = 0; i < 1000; ++i) {
            const uint64_t x = a.below(bound);
            assert_true(x < bound);
            assert_true(x == b.below(bound));
        }
    }
    dsm::sp::SplitMix64 c(5);
    int hist[3] = {0, 0, 0};
    for (int i = 0; i < 30000; ++i) ++hist[c.below(3)];
    for (int h : hist) assert_true(h > 9500 && h < 10500);
}

static void test_permutation(void **) {
    for (int64_t n : {1, 2, 3, 10, 101, 1000})
        for (uint64_t seed : {uint64_t{0}, uint64_t{1}, uint64_t{0xdeadbeef}})
            for (int64_t epoch : {0, 1, 2, 1000000007})
                assert_true(dsm::sp::permutation(n, seed, epoch) == ref_permutation(n, seed, epoch));
    // Pinned: a change here changes which samples a resumed run sees.
    assert_true(dsm::sp::permutation(10, 0, 0) == (std::vector<int64_t>{4, 9, 2, 5, 1, 7, 6, 0, 3, 8}));
    assert_true(dsm::sp::permutation(10, 1, 1) == (std::vector<int64_t>{8, 1, 2, 3, 9, 4, 6, 7, 0, 5}));
    const std::vector<int64_t> p = dsm::sp::permutation(1000, 7, 3);
    std::vector<int64_t> sorted = p;
    std::sort(sorted.begin(), sorted.end());
    assert_true(sorted == iota(1000, 0));
    assert_true(p != iota(1000, 0));
    assert_true(p == dsm::sp::permutation(1000, 7, 3));
    assert_true(p != dsm::sp::permutation(1000, 7, 4));
    assert_true(p != dsm::sp::permutation(1000, 8, 3));
    assert_true(dsm::sp::permutation(1, 7, 3) == std::vector<int64_t>{0});
}

// ---------------------------------------------------------------- sampler

// torch.utils.data.DistributedSampler.__iter__, transcribed: `order` is the
// (shuffled or not) list of indices.
static std::vector<int64_t> ref_distributed(const std::vector<int64_t> &order, int64_t replicas, int64_t rank,
                                            bool drop_last) {
    const auto len = static_cast<int64_t>(order.size());
    int64_t num_samples;
    if (drop_last && len % replicas != 0)
        num_samples = len - replicas <= 0 ? 0 : (len - replicas + replicas - 1) / replicas; // math.ceil((len - R) / R)
    else
        num_samples = (len + replicas - 1) / replicas; // math.ceil(len / R)
    const int64_t total_size = num_samples * replicas;
    std::vector<int64_t> indices = order;
    if (!drop_last) {
        const int64_t padding_size = total_size - len;
        if (padding_size <= len) {
            indices.insert(indices.end(), order.begin(), order.begin() + padding_size);
        } else {
            std::vector<int64_t> rep;
            for (int64_t k = 0; k < (padding_size + len - 1) / len; ++k)
                rep.insert(rep.end(), order.begin(), order.end());
            indices.insert(indices.end(), rep.begin(), rep.begin() + padding_size);
        }
    } else {
        indices.resize(static_cast<size_t>(total_size));
    }
    assert_int_equal(static_cast<int64_t>(indices.size()), total_size);
    std::vector<int64_t> mine;
    for (int64_t i = rank; i < total_size; i += replicas) mine.push_back(indices[static_cast<size_t>(i)]);
    assert_int_equal(static_cast<int64_t>(mine.size()), num_samples);
    return mine;
}

// The micro-batches of a rank's list: short last one kept, or dropped with drop_last.
static std::vector<std::vector<int64_t>> ref_batches(const std::vector<int64_t> &mine, int64_t mb, bool drop_last) {
    std::vector<std::vector<int64_t>> out;
    for (size_t i = 0; i < mine.size(); i += static_cast<size_t>(mb)) {
        const size_t end = std::min(mine.size(), i + static_cast<size_t>(mb));
        std::vector<int64_t> b(mine.begin() + static_cast<std::ptrdiff_t>(i),
                               mine.begin() + static_cast<std::ptrdiff_t>(end));
        if (drop_last && static_cast<int64_t>(b.size()) < mb) break;
        out.push_back(b);
    }
    return out;
}

static std::vector<int64_t> get_batch(Sampler &s, int64_t epoch, int64_t b) {
    std::vector<int64_t> v(static_cast<size_t>(s.micro_batch()) + 1, -1);
    const int64_t n = s.batch(epoch, b, v.data(), v.size() - 1);
    assert_int_equal(v.back(), -1);
    assert_int_equal(n, s.batch_count(epoch, b));
    v.resize(static_cast<size_t>(n));
    return v;
}

static void test_sampler_matches_distributed_sampler(void **) {
    for (int64_t n = 1; n <= 31; ++n)
        for (int replicas = 1; replicas <= 9; ++replicas)
            for (int64_t mb = 1; mb <= 4; ++mb)
                for (int flags = 0; flags < 4; ++flags) {
                    SamplerOptions o;
                    o.shuffle = flags & 1;
                    o.drop_last = flags & 2;
                    o.seed = static_cast<uint64_t>(n * 131 + replicas);
                    for (int rank = 0; rank < replicas; ++rank) {
                        const int64_t epochs[2] = {0, 5};
                        for (int64_t epoch : epochs) {
                            const std::vector<int64_t> order =
                                o.shuffle ? ref_permutation(n, o.seed, epoch) : iota(n, 0);
                            const auto want =
                                ref_batches(ref_distributed(order, replicas, rank, o.drop_last), mb, o.drop_last);
                            if (want.empty()) {
                                expect_error_at([&] { Sampler s(n, replicas, rank, mb, o); }, DSM_ERR_INVALID_ARGUMENT,
                                                {"no micro-batch", "drop_last"}, __LINE__);
                                continue;
                            }
                            Sampler s(n, replicas, rank, mb, o);
                            assert_int_equal(s.num_batches(), static_cast<int64_t>(want.size()));
                            for (size_t b = 0; b < want.size(); ++b)
                                if (get_batch(s, epoch, static_cast<int64_t>(b)) != want[b])
                                    fail_msg("n %lld replicas %d rank %d mb %lld shuffle %d drop_last %d epoch %lld: "
                                             "micro-batch %zu differs",
                                             (long long)n, replicas, rank, (long long)mb, o.shuffle, o.drop_last,
                                             (long long)epoch, b);
                        }
                    }
                }
}

// Counts of every index over all ranks' micro-batches of one epoch.
static std::map<int64_t, int> epoch_counts(int64_t n, int replicas, int64_t mb, const SamplerOptions &o,
                                           int64_t epoch) {
    std::map<int64_t, int> counts;
    int64_t nb = -1;
    for (int r = 0; r < replicas; ++r) {
        Sampler s(n, replicas, r, mb, o);
        if (nb >= 0) assert_int_equal(s.num_batches(), nb); // the same on every rank
        nb = s.num_batches();
        for (int64_t b = 0; b < nb; ++b)
            for (int64_t i : get_batch(s, epoch, b)) {
                assert_true(i >= 0 && i < n);
                ++counts[i];
            }
    }
    return counts;
}

static void test_sampler_coverage(void **) {
    for (int shuffle = 0; shuffle <= 1; ++shuffle) {
        SamplerOptions o;
        o.shuffle = shuffle;
        o.seed = 11;
        // Divisible: every index exactly once, with and without drop_last.
        for (int drop = 0; drop <= 1; ++drop) {
            o.drop_last = drop;
            auto c = epoch_counts(48, 4, 3, o, 2);
            assert_int_equal(c.size(), 48);
            for (const auto &kv : c) assert_int_equal(kv.second, 1);
        }
        // drop_last: 50 over 4 ranks keeps 48 positions (12 per rank), micro-batches of 5 keep 10 per rank.
        o.drop_last = true;
        auto c = epoch_counts(50, 4, 5, o, 1);
        assert_int_equal(c.size(), 40);
        for (const auto &kv : c) assert_int_equal(kv.second, 1);
        // Padding: 50 over 4 ranks is 52 positions; the first 2 of the epoch's order come twice.
        o.drop_last = false;
        c = epoch_counts(50, 4, 5, o, 1);
        assert_int_equal(c.size(), 50);
        const std::vector<int64_t> order = shuffle ? ref_permutation(50, 11, 1) : iota(50, 0);
        for (const auto &kv : c)
            assert_int_equal(kv.second, kv.first == order[0] || kv.first == order[1] ? 2 : 1);
        // More ranks than samples: 3 samples over 8 ranks repeat as 0 1 2 0 1 2 0 1.
        c = epoch_counts(3, 8, 2, o, 0);
        const std::vector<int64_t> three = shuffle ? ref_permutation(3, 11, 0) : iota(3, 0);
        assert_int_equal(c.size(), 3);
        assert_int_equal(c[three[0]], 3);
        assert_int_equal(c[three[1]], 3);
        assert_int_equal(c[three[2]], 2);
    }
}

static void test_sampler_shuffle(void **) {
    SamplerOptions o;
    o.seed = 3;
    Sampler a(1000, 2, 1, 500, o), b(1000, 2, 1, 500, o);
    const auto e0 = get_batch(a, 0, 0), e1 = get_batch(a, 1, 0);
    assert_true(e0 == get_batch(b, 0, 0)); // deterministic
    assert_true(e0 != e1);                 // another epoch, another order
    assert_true(get_batch(a, 0, 0) == e0); // the cache moves back to epoch 0
    assert_true(get_batch(b, 1, 0) == e1);
    o.seed = 4;
    Sampler c(1000, 2, 1, 500, o);
    assert_true(get_batch(c, 0, 0) != e0); // another seed
    o.shuffle = false;
    Sampler d(1000, 2, 1, 500, o);
    assert_true(get_batch(d, 0, 0) == get_batch(d, 7, 0)); // no shuffle: every epoch alike
    assert_int_equal(get_batch(d, 0, 0)[3], 7);
    // Two ranks of one sequence-parallel group pass the same data-parallel rank: same samples.
    o.shuffle = true;
    Sampler p(77, 3, 2, 4, o), q(77, 3, 2, 4, o);
    for (int64_t epoch = 0; epoch < 3; ++epoch)
        for (int64_t bt = 0; bt < p.num_batches(); ++bt)
            assert_true(get_batch(p, epoch, bt) == get_batch(q, epoch, bt));
}

static void test_sampler_locate(void **) {
    for (int flags = 0; flags < 4; ++flags) {
        SamplerOptions o;
        o.shuffle = flags & 1;
        o.drop_last = flags & 2;
        Sampler s(103, 4, 3, 5, o);
        const int64_t nb = s.num_batches();
        assert_int_equal(nb, o.drop_last ? 5 : 6); // 25 or 26 samples per rank
        for (int64_t steps = 0; steps < 4 * nb + 3; ++steps) {
            int64_t epoch = -1, batch = -1;
            s.locate(steps, &epoch, &batch);
            assert_true(batch >= 0 && batch < nb);
            assert_int_equal(epoch * nb + batch, steps);
            get_batch(s, epoch, batch); // a valid micro-batch
        }
        int64_t epoch = 0, batch = 0;
        s.locate(kMax, &epoch, &batch);
        assert_int_equal(epoch, kMax / nb);
        assert_int_equal(batch, kMax % nb);
    }
}

static void test_sampler_huge(void **) {
    // num_samples near INT64_MAX without shuffle: positions past the end wrap to the start.
    SamplerOptions o;
    o.shuffle = false;
    Sampler s(kMax, 3, 2, 7, o); // 2^63 - 1 = 3 * 3074457345618258602 + 1
    const int64_t per_rank = kMax / 3 + 1;
    assert_int_equal(s.per_rank(), per_rank);
    assert_int_equal(s.num_batches(), per_rank / 7 + (per_rank % 7 != 0));
    const int64_t last = s.num_batches() - 1;
    const auto v = get_batch(s, 0, last);
    assert_int_equal(static_cast<int64_t>(v.size()), per_rank - last * 7);
    // The rank's final sample is at position 2 + 3 * (per_rank - 1) = kMax + 1: index 1.
    assert_int_equal(v.back(), 1);
    assert_int_equal(v[v.size() - 2], kMax - 2);
    Sampler r0(kMax, 3, 0, 7, o);
    assert_int_equal(get_batch(r0, 0, last).back(), kMax - 1);
    o.drop_last = true;
    Sampler t(kMax, 3, 2, 7, o);
    assert_int_equal(t.per_rank(), kMax / 3);
    assert_int_equal(t.num_batches(), kMax / 3 / 7);
    assert_int_equal(get_batch(t, 0, t.num_batches() - 1).back(), 2 + 3 * (t.num_batches() * 7 - 1));
    // A permutation of that many cannot be held.
    o.shuffle = true;
    expect_error_at([&] { Sampler u(kMax, 3, 2, 7, o); }, DSM_ERR_OUT_OF_MEMORY,
                    {"num_samples 9223372036854775807", "shuffle"}, __LINE__);
    // micro_batch near INT64_MAX: one short micro-batch.
    o.shuffle = false;
    o.drop_last = false;
    Sampler m(10, 2, 1, kMax, o);
    assert_int_equal(m.num_batches(), 1);
    assert_int_equal(m.batch_count(0, 0), 5);
}

static void test_sampler_bad_arguments(void **) {
    SamplerOptions o;
    expect_error_at([&] { Sampler s(0, 1, 0, 1, o); }, DSM_ERR_INVALID_ARGUMENT, {"num_samples is 0"}, __LINE__);
    expect_error_at([&] { Sampler s(-4, 1, 0, 1, o); }, DSM_ERR_INVALID_ARGUMENT, {"num_samples is -4"}, __LINE__);
    expect_error_at([&] { Sampler s(8, 0, 0, 1, o); }, DSM_ERR_INVALID_ARGUMENT, {"replicas is 0"}, __LINE__);
    expect_error_at([&] { Sampler s(8, 2, 2, 1, o); }, DSM_ERR_INVALID_ARGUMENT, {"rank is 2", "[0, 2)"}, __LINE__);
    expect_error_at([&] { Sampler s(8, 2, -1, 1, o); }, DSM_ERR_INVALID_ARGUMENT, {"rank is -1"}, __LINE__);
    expect_error_at([&] { Sampler s(8, 2, 0, 0, o); }, DSM_ERR_INVALID_ARGUMENT, {"micro_batch is 0"}, __LINE__);
    o.drop_last = true;
    expect_error_at([&] { Sampler s(3, 4, 0, 1, o); }, DSM_ERR_INVALID_ARGUMENT,
                    {"no micro-batch", "num_samples 3", "replicas 4", "0 samples"}, __LINE__);
    expect_error_at([&] { Sampler s(9, 4, 0, 3, o); }, DSM_ERR_INVALID_ARGUMENT,
                    {"2 samples per rank", "micro_batch 3"}, __LINE__);
    Sampler s(10, 2, 0, 2, o); // 5 per rank, 2 micro-batches
    int64_t buf[4], epoch, batch;
    expect_error_at([&] { s.batch(-1, 0, buf, 4); }, DSM_ERR_INVALID_ARGUMENT, {"epoch is -1"}, __LINE__);
    expect_error_at([&] { s.batch(0, 2, buf, 4); }, DSM_ERR_INVALID_ARGUMENT, {"batch is 2", "[0, 2)"}, __LINE__);
    expect_error_at([&] { s.batch(0, -1, buf, 4); }, DSM_ERR_INVALID_ARGUMENT, {"batch is -1"}, __LINE__);
    expect_error_at([&] { s.batch(0, 0, buf, 1); }, DSM_ERR_INVALID_ARGUMENT, {"len is 1", "2 indices"}, __LINE__);
    expect_error_at([&] { s.batch(0, 0, nullptr, 4); }, DSM_ERR_NULL_POINTER, {"indices is NULL"}, __LINE__);
    expect_error_at([&] { s.locate(-1, &epoch, &batch); }, DSM_ERR_INVALID_ARGUMENT, {"micro_steps is -1"},
                    __LINE__);
    expect_error_at([&] { s.locate(0, nullptr, &batch); }, DSM_ERR_NULL_POINTER, {"epoch is NULL"}, __LINE__);
    expect_error_at([&] { s.locate(0, &epoch, nullptr); }, DSM_ERR_NULL_POINTER, {"batch is NULL"}, __LINE__);
    assert_int_equal(s.batch(0, 1, buf, 2), 2);
    // position() and resume().
    expect_error_at([&] { (void)s.position(-1, 0); }, DSM_ERR_INVALID_ARGUMENT, {"epoch is -1"}, __LINE__);
    expect_error_at([&] { (void)s.position(0, 2); }, DSM_ERR_INVALID_ARGUMENT, {"batch is 2", "of epoch 0"},
                    __LINE__);
    expect_error_at([&] { (void)s.position(kMax / 10, 0); }, DSM_ERR_INVALID_ARGUMENT,
                    {"epoch 922337203685477580 of 10 samples", "int64_t"}, __LINE__);
    expect_error_at([&] { (void)s.resume(-1); }, DSM_ERR_INVALID_ARGUMENT, {"samples is -1"}, __LINE__);
    expect_error_at([&] { (void)s.epoch_batches(-2); }, DSM_ERR_INVALID_ARGUMENT, {"epoch is -2"}, __LINE__);
}

// Every rank's micro-batches of one epoch, in order (ranks in turn within a micro-batch).
static std::vector<std::vector<int64_t>> epoch_batches_of(int64_t n, int replicas, int64_t mb,
                                                          const SamplerOptions &o, int64_t resume_at,
                                                          int64_t *epoch) {
    std::vector<std::vector<int64_t>> out(static_cast<size_t>(replicas));
    for (int r = 0; r < replicas; ++r) {
        Sampler s(n, replicas, r, mb, o);
        const int64_t e = resume_at >= 0 ? s.resume(resume_at) : *epoch;
        if (r == 0) *epoch = e;
        assert_int_equal(e, *epoch);
        for (int64_t b = 0; b < s.epoch_batches(e); ++b)
            for (int64_t i : get_batch(s, e, b)) out[static_cast<size_t>(r)].push_back(i);
    }
    return out;
}

// A run stopped after micro-batch b of an epoch, at one data-parallel size and
// micro-batch, resumed from its position at another: the samples taken
// before and the samples served after are the epoch's list split at one
// point, so none is repeated and none is lost (beyond what padding repeats
// and drop_last drops in the resumed part, as it would in a whole epoch).
static void test_sampler_resume_any_size(void **) {
    for (int flags = 0; flags < 4; ++flags) {
        SamplerOptions o;
        o.shuffle = flags & 1;
        o.drop_last = flags & 2;
        o.seed = 11;
        for (int64_t n : {7, 24, 50, 101})
            for (int r1 : {1, 2, 3, 4})
                for (int64_t mb1 : {1, 3})
                    for (int r2 : {1, 2, 3, 5})
                        for (int64_t mb2 : {1, 2, 4}) {
                            const int64_t epoch = 2;
                            // Sizes without a micro-batch (drop_last) cannot make a sampler.
                            if (o.drop_last && (n / r1 / mb1 == 0 || n / r2 / mb2 == 0)) continue;
                            Sampler first(n, r1, 0, mb1, o);
                            // The epoch's list: the permutation (or 0..n-1), known from a 1-replica sampler.
                            Sampler whole(n, 1, 0, n, o);
                            const std::vector<int64_t> list = get_batch(whole, epoch, 0);
                            for (int64_t b = 0; b < first.num_batches(); ++b) {
                                const int64_t pos = first.position(epoch, b);
                                // Taken before: every rank's micro-batches 0..b.
                                std::multiset<int64_t> before;
                                for (int r = 0; r < r1; ++r) {
                                    Sampler s(n, r1, r, mb1, o);
                                    for (int64_t k = 0; k <= b; ++k)
                                        for (int64_t i : get_batch(s, epoch, k)) before.insert(i);
                                }
                                int64_t e2 = -1;
                                auto after = epoch_batches_of(n, r2, mb2, o, pos, &e2);
                                if (b == first.num_batches() - 1) {
                                    // The end of the epoch: the next one, whole.
                                    assert_int_equal(pos, (epoch + 1) * n);
                                    assert_int_equal(e2, epoch + 1);
                                    int64_t e3 = epoch + 1;
                                    assert_true(after == epoch_batches_of(n, r2, mb2, o, -1, &e3));
                                    continue;
                                }
                                const int64_t off = pos - epoch * n;
                                assert_int_equal(off, (b + 1) * mb1 * r1);
                                assert_true(off < n);
                                // Before: exactly the list's first `off` entries.
                                assert_true(before == std::multiset<int64_t>(list.begin(), list.begin() + off));
                                if (o.drop_last && (n - off) / r2 / mb2 == 0) {
                                    // Nothing of the epoch makes a micro-batch here: the next epoch, whole.
                                    assert_int_equal(e2, epoch + 1);
                                    continue;
                                }
                                assert_int_equal(e2, epoch);
                                // After: the rest of the list, each once, and nothing taken before,
                                // but for the padding that repeats the list's start as a whole
                                // epoch's does (drop_last instead cuts the rest's end).
                                std::multiset<int64_t> served;
                                for (const auto &v : after) served.insert(v.begin(), v.end());
                                const int64_t left = n - off, count = static_cast<int64_t>(served.size());
                                std::multiset<int64_t> want;
                                if (!o.drop_last) {
                                    assert_int_equal(count, (left + r2 - 1) / r2 * r2);
                                    want.insert(list.begin() + off, list.end());
                                    want.insert(list.begin(), list.begin() + (count - left));
                                } else {
                                    assert_int_equal(count, left / r2 / mb2 * mb2 * r2);
                                    want.insert(list.begin() + off, list.begin() + off + count);
                                }
                                if (served != want)
                                    fail_msg("n %lld, %d x %lld then %d x %lld, after micro-batch %lld: the "
                                             "resumed epoch does not serve the rest of the list",
                                             (long long)n, r1, (long long)mb1, r2, (long long)mb2, (long long)b);
                                // At the same size, resuming serves exactly what the run would have.
                                if (r2 == r1 && mb2 == mb1) {
                                    for (int r = 0; r < r1; ++r) {
                                        Sampler s(n, r1, r, mb1, o), t(n, r1, r, mb1, o);
                                        assert_int_equal(t.resume(pos), epoch);
                                        assert_int_equal(t.epoch_batches(epoch), s.num_batches() - b - 1);
                                        for (int64_t k = b + 1; k < s.num_batches(); ++k)
                                            assert_true(get_batch(s, epoch, k) == get_batch(t, epoch, k - b - 1));
                                        assert_true(get_batch(s, epoch + 1, 0) == get_batch(t, epoch + 1, 0));
                                    }
                                }
                            }
                        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shard_example),
        cmocka_unit_test(test_shard_seq_one),
        cmocka_unit_test(test_shard_fewer_positions_than_ranks),
        cmocka_unit_test(test_shard_custom_positions_and_labels),
        cmocka_unit_test(test_shard_reassembles),
        cmocka_unit_test(test_shard_bad_arguments),
        cmocka_unit_test(test_splitmix64),
        cmocka_unit_test(test_permutation),
        cmocka_unit_test(test_sampler_matches_distributed_sampler),
        cmocka_unit_test(test_sampler_coverage),
        cmocka_unit_test(test_sampler_shuffle),
        cmocka_unit_test(test_sampler_locate),
        cmocka_unit_test(test_sampler_huge),
        cmocka_unit_test(test_sampler_bad_arguments),
        cmocka_unit_test(test_sampler_resume_any_size),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
