// Data distribution for training: this rank's chunk of a batch of sequences
// under sequence parallelism (causal-LM labels shifted before the cut), and
// the data-parallel sampler (torch.utils.data.DistributedSampler's index
// arithmetic, then micro-batches) with its deterministic shuffle.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "dsm.h"

namespace dsm {
namespace sp {

// ---------------------------------------------------------------- sharding

// ceil(seq / size) without overflow; seq >= 1, size >= 1.
int64_t chunk_length(int64_t seq, int size) noexcept;

struct Shard {
    int64_t chunk = 0; // positions per rank
    int64_t valid = 0; // labels of this rank's chunk that are not DSM_IGNORE_INDEX
};

// dsm_sp_shard_batch(): rank `rank` of `size` gets positions
// [rank * chunk, (rank + 1) * chunk) of each of the `batch` rows of `seq`
// tokens. `positions` NULL: 0..seq-1; `labels` NULL: the tokens. Position t
// is labelled with labels[t + 1]; the last one and the padding past the end
// with DSM_IGNORE_INDEX; padding has token `pad_token` and positions that
// continue the row's last position by one per step (t itself when
// `positions` is NULL). Outputs are [batch, chunk] in `out_len` elements.
// Throws DSM_ERR_NULL_POINTER / DSM_ERR_INVALID_ARGUMENT naming the value.
Shard shard_batch(int size, int rank, int64_t batch, int64_t seq, const int64_t *tokens, const int64_t *positions,
                  const int64_t *labels, int64_t pad_token, size_t out_len, int64_t *out_tokens,
                  int64_t *out_positions, int64_t *out_labels);

// ---------------------------------------------------------------- shuffling

// splitmix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number
// generators", OOPSLA 2014; Vigna's splitmix64.c): the state advances by
// 0x9e3779b97f4a7c15 and each output is mix64() of the new state.
uint64_t mix64(uint64_t z) noexcept;

class SplitMix64 {
public:
    explicit SplitMix64(uint64_t state) noexcept : state_(state) {}
    uint64_t next() noexcept;
    // Uniform in [0, bound), bound >= 1, without modulo bias (Lemire, "Fast
    // random integer generation in an interval", ACM TOMACS 2019): the high
    // 64 bits of next() * bound, drawing again while the low 64 bits fall
    // below 2^64 mod bound.
    uint64_t below(uint64_t bound) noexcept;

private:
    uint64_t state_;
};

// The generator's starting state for a seed and an epoch: seed ^ mix64(epoch).
// mix64 is a bijection, so for one seed every epoch starts elsewhere.
uint64_t shuffle_state(uint64_t seed, int64_t epoch) noexcept;

// The permutation of 0..n-1 of (seed, epoch): Fisher-Yates (Durstenfeld)
// from the identity, for i = n-1 down to 1 swapping element i with element
// below(i + 1) of SplitMix64(shuffle_state(seed, epoch)).
std::vector<int64_t> permutation(int64_t n, uint64_t seed, int64_t epoch);

// ---------------------------------------------------------------- sampler

struct SamplerOptions {
    bool shuffle = true;
    uint64_t seed = 0;
    bool drop_last = false;
};

// dsm_sampler_create(): each epoch the sample indices (permuted when
// shuffling) are padded by repeating them from the start to a multiple of
// `replicas` (or cut to one with drop_last); rank r takes positions
// r, r + replicas, ...; its samples are cut into micro-batches of
// `micro_batch`, the last one short (or dropped with drop_last).
class Sampler {
public:
    // Throws DSM_ERR_INVALID_ARGUMENT naming the bad value, and
    // DSM_ERR_OUT_OF_MEMORY when the permutation cannot be held.
    Sampler(int64_t num_samples, int replicas, int rank, int64_t micro_batch, const SamplerOptions &options);

    int64_t num_samples() const noexcept { return num_samples_; }
    int replicas() const noexcept { return replicas_; }
    int rank() const noexcept { return rank_; }
    int64_t micro_batch() const noexcept { return micro_batch_; }
    const SamplerOptions &options() const noexcept { return options_; }
    // Samples of one rank per epoch (DistributedSampler's num_samples).
    int64_t per_rank() const noexcept { return per_rank_; }
    // Micro-batches of a whole epoch.
    int64_t num_batches() const noexcept { return num_batches_; }
    // Micro-batches of `epoch` (fewer for the epoch resume() starts inside).
    int64_t epoch_batches(int64_t epoch) const;
    // Indices in micro-batch `batch` of `epoch`.
    int64_t batch_count(int64_t epoch, int64_t batch) const;

    // Writes micro-batch `batch` of `epoch` into `indices` (room for `len`)
    // and returns the count. Computes the epoch's permutation unless it is
    // the one kept.
    int64_t batch(int64_t epoch, int64_t batch, int64_t *indices, size_t len);

    // The epoch and micro-batch that follow `micro_steps` micro-batches.
    void locate(int64_t micro_steps, int64_t *epoch, int64_t *batch) const;

    // The samples consumed, at any replica count, once micro-batch `batch`
    // of `epoch` is taken on every rank: epoch * num_samples plus the
    // positions of the epoch's list taken (num_samples at its last batch).
    int64_t position(int64_t epoch, int64_t batch) const;
    // Continue after `samples` consumed samples (a position() of any
    // sampler over the same dataset, seed and shuffle): the epoch
    // samples / num_samples serves the rest of its list from the position
    // samples % num_samples on. Returns the epoch to continue with (the next
    // one when nothing is left of that epoch here).
    int64_t resume(int64_t samples);

private:
    void prepare(int64_t epoch);
    // The epoch's first list position, samples per rank and micro-batches.
    struct Geometry {
        int64_t offset, per_rank, num_batches;
    };
    Geometry geometry(int64_t epoch) const;

    int64_t num_samples_;
    int replicas_;
    int rank_;
    int64_t micro_batch_;
    SamplerOptions options_;
    int64_t per_rank_ = 0;
    int64_t num_batches_ = 0;
    std::vector<int64_t> perm_; // the permutation of perm_epoch_ (shuffle only)
    int64_t perm_epoch_ = -1;
    int64_t resume_epoch_ = -1, resume_offset_ = 0; // resume(): the epoch that starts inside its list
};

} // namespace sp
} // namespace dsm

// The C handle.
struct dsm_sampler_s {
    std::unique_ptr<dsm::sp::Sampler> sampler;
};
