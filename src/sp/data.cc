// Data distribution: the sequence chunk of a rank (shard_batch) and the
// data-parallel sampler with its splitmix64 + Fisher-Yates shuffle.
#include "sp/data.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <new>
#include <utility>

#include "core/error.hpp"

namespace dsm {
namespace sp {

namespace {

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull; // 2^64 / the golden ratio, splitmix64's increment

// The high and low 64 bits of a * b.
inline void mul128(uint64_t a, uint64_t b, uint64_t *hi, uint64_t *lo) noexcept {
#ifdef __SIZEOF_INT128__
    const unsigned __int128 m = static_cast<unsigned __int128>(a) * b;
    *hi = static_cast<uint64_t>(m >> 64);
    *lo = static_cast<uint64_t>(m);
#else
    const uint64_t a0 = a & 0xffffffffu, a1 = a >> 32, b0 = b & 0xffffffffu, b1 = b >> 32;
    const uint64_t p00 = a0 * b0, p01 = a0 * b1, p10 = a1 * b0, p11 = a1 * b1;
    const uint64_t mid = (p00 >> 32) + (p01 & 0xffffffffu) + (p10 & 0xffffffffu);
    *hi = p11 + (p01 >> 32) + (p10 >> 32) + (mid >> 32);
    *lo = (mid << 32) | (p00 & 0xffffffffu);
#endif
}

// The identity 0..n-1 in p, shuffled for (seed, epoch).
void fill_permutation(int64_t *p, int64_t n, uint64_t seed, int64_t epoch) noexcept {
    for (int64_t i = 0; i < n; ++i) p[i] = i;
    SplitMix64 rng(shuffle_state(seed, epoch));
    for (int64_t i = n - 1; i > 0; --i) {
        const auto j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(i) + 1));
        std::swap(p[i], p[j]);
    }
}

} // namespace

// ---------------------------------------------------------------- sharding

int64_t chunk_length(int64_t seq, int size) noexcept { return seq / size + (seq % size != 0 ? 1 : 0); }

Shard shard_batch(int size, int rank, int64_t batch, int64_t seq, const int64_t *tokens, const int64_t *positions,
                  const int64_t *labels, int64_t pad_token, size_t out_len, int64_t *out_tokens,
                  int64_t *out_positions, int64_t *out_labels) {
    DSM_REQUIRE(size >= 1, DSM_ERR_INVALID_ARGUMENT, "size is ", size, ", must be >= 1");
    DSM_REQUIRE(rank >= 0 && rank < size, DSM_ERR_INVALID_ARGUMENT, "rank is ", rank, ", outside [0, ", size,
                ")");
    DSM_REQUIRE(batch >= 1, DSM_ERR_INVALID_ARGUMENT, "batch is ", batch, ", must be >= 1");
    DSM_REQUIRE(seq >= 1, DSM_ERR_INVALID_ARGUMENT, "seq is ", seq, ", must be >= 1");
    DSM_ARG_NOT_NULL(tokens);
    DSM_ARG_NOT_NULL(out_tokens);
    DSM_ARG_NOT_NULL(out_positions);
    DSM_ARG_NOT_NULL(out_labels);
    // The inputs hold batch * seq elements: a count whose bytes overflow
    // cannot describe an array in memory (and would overflow the indexing).
    int64_t in_elems = 0;
    DSM_REQUIRE(!__builtin_mul_overflow(batch, seq, &in_elems) &&
                    in_elems <= std::numeric_limits<int64_t>::max() / static_cast<int64_t>(sizeof(int64_t)),
                DSM_ERR_INVALID_ARGUMENT, "batch ", batch, " * seq ", seq,
                " elements of int64 overflow the address space");
    const int64_t chunk = chunk_length(seq, size);
    const auto need = static_cast<size_t>(batch) * static_cast<size_t>(chunk); // <= batch * seq: no overflow
    DSM_REQUIRE(out_len >= need, DSM_ERR_INVALID_ARGUMENT, "out_len is ", out_len, ", batch ", batch,
                " * chunk ", chunk, " needs ", need);
    const int64_t first = static_cast<int64_t>(rank) * chunk; // < seq + size: no overflow
    const int64_t end = first + chunk;
    if (positions != nullptr && end > seq) {
        // Padding positions continue the last one up to positions[last] + (end - seq).
        for (int64_t b = 0; b < batch; ++b) {
            const int64_t last = positions[b * seq + seq - 1];
            DSM_REQUIRE(last <= std::numeric_limits<int64_t>::max() - (end - seq), DSM_ERR_INVALID_ARGUMENT,
                        "positions[", b * seq + seq - 1, "] (row ", b, ", position ", seq - 1, ") is ", last,
                        ": the padding positions after it overflow int64");
        }
    }
    Shard s;
    s.chunk = chunk;
    for (int64_t b = 0; b < batch; ++b) {
        const int64_t *tok = tokens + b * seq;
        const int64_t *lab = (labels != nullptr ? labels : tokens) + b * seq;
        const int64_t *pos = positions != nullptr ? positions + b * seq : nullptr;
        int64_t *ot = out_tokens + b * chunk, *op = out_positions + b * chunk, *ol = out_labels + b * chunk;
        for (int64_t k = 0; k < chunk; ++k) {
            const int64_t t = first + k;
            if (t < seq) {
                ot[k] = tok[t];
                op[k] = pos != nullptr ? pos[t] : t;
                ol[k] = t + 1 < seq ? lab[t + 1] : DSM_IGNORE_INDEX;
            } else {
                ot[k] = pad_token;
                op[k] = pos != nullptr ? pos[seq - 1] + (t - (seq - 1)) : t;
                ol[k] = DSM_IGNORE_INDEX;
            }
            if (ol[k] != DSM_IGNORE_INDEX) ++s.valid;
        }
    }
    return s;
}

// ---------------------------------------------------------------- shuffling

uint64_t mix64(uint64_t z) noexcept {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t SplitMix64::next() noexcept {
    state_ += kGolden;
    return mix64(state_);
}

uint64_t SplitMix64::below(uint64_t bound) noexcept {
    uint64_t hi = 0, lo = 0;
    mul128(next(), bound, &hi, &lo);
    if (lo < bound) {
        const uint64_t threshold = (0 - bound) % bound; // 2^64 mod bound
        while (lo < threshold) mul128(next(), bound, &hi, &lo);
    }
    return hi;
}

uint64_t shuffle_state(uint64_t seed, int64_t epoch) noexcept { return seed ^ mix64(static_cast<uint64_t>(epoch)); }

std::vector<int64_t> permutation(int64_t n, uint64_t seed, int64_t epoch) {
    std::vector<int64_t> p(static_cast<size_t>(std::max<int64_t>(n, 0)));
    fill_permutation(p.data(), static_cast<int64_t>(p.size()), seed, epoch);
    return p;
}

// ---------------------------------------------------------------- sampler

Sampler::Sampler(int64_t num_samples, int replicas, int rank, int64_t micro_batch, const SamplerOptions &options)
    : num_samples_(num_samples), replicas_(replicas), rank_(rank), micro_batch_(micro_batch), options_(options) {
    DSM_REQUIRE(num_samples >= 1, DSM_ERR_INVALID_ARGUMENT, "num_samples is ", num_samples, ", must be >= 1");
    DSM_REQUIRE(replicas >= 1, DSM_ERR_INVALID_ARGUMENT, "replicas is ", replicas, ", must be >= 1");
    DSM_REQUIRE(rank >= 0 && rank < replicas, DSM_ERR_INVALID_ARGUMENT, "rank is ", rank, ", outside [0, ",
                replicas, ")");
    DSM_REQUIRE(micro_batch >= 1, DSM_ERR_INVALID_ARGUMENT, "micro_batch is ", micro_batch, ", must be >= 1");
    // DistributedSampler: ceil(N / R) samples per rank, padded; floor(N / R) with drop_last.
    const int64_t n = num_samples, r = replicas;
    per_rank_ = n / r + (!options_.drop_last && n % r != 0 ? 1 : 0);
    num_batches_ = per_rank_ / micro_batch + (!options_.drop_last && per_rank_ % micro_batch != 0 ? 1 : 0);
    DSM_REQUIRE(num_batches_ >= 1, DSM_ERR_INVALID_ARGUMENT, "no micro-batch at all with drop_last: num_samples ",
                num_samples, " over replicas ", replicas, " leaves ", per_rank_,
                " samples per rank, fewer than micro_batch ", micro_batch);
    DSM_REQUIRE(!options_.shuffle || static_cast<uint64_t>(num_samples) <= perm_.max_size(),
                DSM_ERR_OUT_OF_MEMORY, "the permutation of num_samples ", num_samples,
                " indices does not fit in memory (shuffle it in the application or pass shuffle = 0)");
}

Sampler::Geometry Sampler::geometry(int64_t epoch) const {
    DSM_REQUIRE(epoch >= 0, DSM_ERR_INVALID_ARGUMENT, "epoch is ", epoch, ", must be >= 0");
    if (epoch != resume_epoch_) return {0, per_rank_, num_batches_};
    // The rest of the list, padded or cut for the replicas as a whole list is.
    const int64_t left = num_samples_ - resume_offset_, r = replicas_;
    const int64_t per = left / r + (!options_.drop_last && left % r != 0 ? 1 : 0);
    return {resume_offset_, per, per / micro_batch_ + (!options_.drop_last && per % micro_batch_ != 0 ? 1 : 0)};
}

int64_t Sampler::epoch_batches(int64_t epoch) const { return geometry(epoch).num_batches; }

int64_t Sampler::batch_count(int64_t epoch, int64_t batch) const {
    const Geometry g = geometry(epoch);
    DSM_REQUIRE(batch >= 0 && batch < g.num_batches, DSM_ERR_INVALID_ARGUMENT, "batch is ", batch,
                ", outside [0, ", g.num_batches, ") of epoch ", epoch);
    return std::min(micro_batch_, g.per_rank - batch * micro_batch_); // batch * micro_batch < per_rank
}

int64_t Sampler::position(int64_t epoch, int64_t batch) const {
    const Geometry g = geometry(epoch);
    (void)batch_count(epoch, batch);
    int64_t base = 0;
    DSM_REQUIRE(!__builtin_mul_overflow(epoch + 1, num_samples_, &base), DSM_ERR_INVALID_ARGUMENT, "epoch ",
                epoch, " of ", num_samples_, " samples is past the samples an int64_t counts");
    if (batch == g.num_batches - 1) return base; // the end of the epoch (a dropped tail included)
    // Before the last micro-batch every rank has taken (batch + 1) * micro_batch
    // samples of the list, all of them before its padding.
    return base - num_samples_ + g.offset + (batch + 1) * micro_batch_ * replicas_;
}

int64_t Sampler::resume(int64_t samples) {
    DSM_REQUIRE(samples >= 0, DSM_ERR_INVALID_ARGUMENT, "samples is ", samples, ", must be >= 0");
    resume_epoch_ = samples / num_samples_;
    resume_offset_ = samples % num_samples_;
    if (resume_offset_ == 0 || geometry(resume_epoch_).num_batches > 0) return resume_epoch_;
    // With drop_last the rest of the list may not make a micro-batch here.
    const int64_t next = resume_epoch_ + 1;
    resume_epoch_ = -1;
    resume_offset_ = 0;
    return next;
}

void Sampler::prepare(int64_t epoch) {
    if (perm_epoch_ == epoch) return;
    perm_epoch_ = -1;
    try {
        perm_.resize(static_cast<size_t>(num_samples_));
    } catch (const std::bad_alloc &) {
        DSM_FAIL(DSM_ERR_OUT_OF_MEMORY, "cannot allocate the permutation of ", num_samples_, " samples (",
                 static_cast<uint64_t>(num_samples_) * sizeof(int64_t), " bytes)");
    }
    fill_permutation(perm_.data(), num_samples_, options_.seed, epoch);
    perm_epoch_ = epoch;
}

int64_t Sampler::batch(int64_t epoch, int64_t batch, int64_t *indices, size_t len) {
    const Geometry g = geometry(epoch);
    const int64_t count = batch_count(epoch, batch);
    DSM_ARG_NOT_NULL(indices);
    DSM_REQUIRE(len >= static_cast<size_t>(count), DSM_ERR_INVALID_ARGUMENT, "len is ", len, ", micro-batch ",
                batch, " has ", count, " indices");
    if (options_.shuffle) prepare(epoch);
    // Sample j of this rank is at position g.offset + rank + j * replicas of
    // the epoch's (permuted) list, taken mod num_samples: the padding
    // repeats the list from its start (DistributedSampler's repetition), so
    // a resumed epoch serves what the whole one would have. Positions stay
    // below 2 * num_samples + replicas, so uint64 holds them.
    const auto n = static_cast<uint64_t>(num_samples_), r = static_cast<uint64_t>(replicas_);
    const auto j0 = static_cast<uint64_t>(batch * micro_batch_);
    for (int64_t i = 0; i < count; ++i) {
        const uint64_t p = (static_cast<uint64_t>(g.offset) + static_cast<uint64_t>(rank_) +
                            (j0 + static_cast<uint64_t>(i)) * r) % n;
        indices[i] = options_.shuffle ? perm_[p] : static_cast<int64_t>(p);
    }
    return count;
}

void Sampler::locate(int64_t micro_steps, int64_t *epoch, int64_t *batch) const {
    DSM_REQUIRE(micro_steps >= 0, DSM_ERR_INVALID_ARGUMENT, "micro_steps is ", micro_steps, ", must be >= 0");
    DSM_ARG_NOT_NULL(epoch);
    DSM_ARG_NOT_NULL(batch);
    *epoch = micro_steps / num_batches_;
    *batch = micro_steps % num_batches_;
}

} // namespace sp
} // namespace dsm
