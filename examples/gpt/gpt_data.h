/*
 * gpt_data.h: the data of train_gpt: an llm.c token shard (gpt_shard writes
 * one), mapped read-only, and the micro-batches the data-parallel sampler
 * draws from it.
 *
 * Sample i is the T tokens [i T, (i + 1) T); position t predicts token
 * t + 1, the last position predicts nothing (as Hugging Face's
 * GPT2LMHeadModel with labels = input_ids).
 */
#ifndef GPT_DATA_H
#define GPT_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "dsm.h"

/* 256 int32 (magic 20240520, version 1, token count, then zeros), then the
 * uint16 tokens. */
struct gpt_shard {
    const uint16_t *tokens;
    int64_t ntok;
    void *map;
    size_t map_len;
};

/* 1 when path is a shard whose tokens are all below vocab; else 0 with the
 * reason in msg. Close with gpt_shard_close() either way. */
int gpt_shard_open(const char *path, int vocab, struct gpt_shard *s, char *msg, size_t msg_len);
void gpt_shard_close(struct gpt_shard *s);

/* The sampler's walk over the shard's sequences, epoch after epoch. */
struct gpt_loader {
    const struct gpt_shard *data;
    dsm_sampler_t sampler;
    int64_t epoch, batch, epoch_batches;
};

/* The loader at the start, or at the sampler's position `samples` (a
 * checkpoint's) when it is >= 0 (dsm_sampler_resume()). */
dsm_status_t gpt_loader_start(struct gpt_loader *ld, const struct gpt_shard *data, dsm_sampler_t sampler,
                              int64_t samples);

/*
 * The next micro-batch of B sequences of T tokens, and this rank's chunk of
 * each under sequence parallelism of size P (rank sp_rank): N = B T / P
 * tokens, positions and labels shifted by one; *valid: how many labels the
 * SP group counts; *samples: the sampler's position after this micro-batch
 * (what a checkpoint keeps). idx (B) and seqs (B T) are scratch.
 */
dsm_status_t gpt_loader_next(struct gpt_loader *ld, int B, int T, int P, int sp_rank, int64_t *idx,
                             int64_t *seqs, size_t N, int64_t *tok, int64_t *pos, int64_t *lab, int64_t *valid,
                             int64_t *samples);

#endif /* GPT_DATA_H */
