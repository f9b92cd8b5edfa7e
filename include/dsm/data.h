/*
 * libdsm C API, part: data, the data-parallel sampler.
 *
 * Included by <dsm.h>, the header programs include; it also compiles on
 * its own. See dsm.h for the conventions every part follows.
 */
#ifndef DSM_DATA_H
#define DSM_DATA_H

#include "dsm/base.h"
#include "dsm/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * @defgroup dsm_sampler Data-parallel sampler
 * @{
 */

/** A data-parallel sampler (an opaque handle). */
typedef struct dsm_sampler_s *dsm_sampler_t;

/**
 * Options of dsm_sampler_create(). Initialize with
 * DSM_SAMPLER_OPTIONS_INITIALIZER.
 */
typedef struct dsm_sampler_options {
    size_t size;   /**< sizeof(dsm_sampler_options_t) as compiled by the caller (a smaller, older struct keeps the defaults of the fields it lacks) */
    int shuffle;   /**< nonzero (default 1): a new permutation of the samples each epoch */
    uint64_t seed; /**< seed of the permutation (default 0); the epoch is mixed in */
    int drop_last; /**< 0 (default): pad as PyTorch's DistributedSampler does; nonzero: drop the tail */
} dsm_sampler_options_t;

/** Initializer of dsm_sampler_options_t. */
#define DSM_SAMPLER_OPTIONS_INITIALIZER { sizeof(dsm_sampler_options_t), 1, 0, 0 }

/**
 * @brief A sampler over a dataset of @p num_samples samples for rank @p rank
 * of @p replicas data-parallel replicas, in micro-batches of @p micro_batch.
 *
 * Not collective. Each epoch the indices 0..num_samples-1 are permuted
 * (options->shuffle; the same permutation on every rank for a seed and an
 * epoch), then, as torch.utils.data.DistributedSampler: without drop_last
 * the list is padded to a multiple of @p replicas by repeating it from its
 * start, with drop_last it is cut to a multiple; rank r takes every
 * replicas-th index from position r. Its indices are cut into micro-batches
 * of @p micro_batch; without drop_last the last one may be shorter, with
 * drop_last a short last micro-batch is dropped. Ranks of one
 * sequence-parallel group pass the same data-parallel rank and so get the
 * same samples.
 * @p options may be NULL (the defaults).
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT
 * (num_samples < 1, replicas < 1, rank outside [0, replicas), micro_batch
 * < 1, options->size smaller than a size_t or larger than this library's
 * struct, or no micro-batch at all with drop_last: naming the value);
 * DSM_ERR_OUT_OF_MEMORY (also for a shuffled dataset whose permutation, 8
 * bytes per sample, cannot be addressed).
 */
DSM_API dsm_status_t dsm_sampler_create(int64_t num_samples, int replicas, int rank, int64_t micro_batch,
                                        const dsm_sampler_options_t *options, dsm_sampler_t *sampler);

/**
 * @brief dsm_sampler_create() with the engine's data-parallel size and rank
 * and its train_micro_batch_size_per_gpu.
 *
 * Not collective. @return as dsm_sampler_create().
 */
DSM_API dsm_status_t dsm_sampler_create_for_engine(dsm_engine_t engine, int64_t num_samples,
                                                   const dsm_sampler_options_t *options, dsm_sampler_t *sampler);

/**
 * @brief Free a sampler and set the handle to NULL. NULL and a pointer to
 * NULL are allowed and do nothing (as every dsm_*_free()). Not collective.
 * @return DSM_SUCCESS.
 */
DSM_API dsm_status_t dsm_sampler_free(dsm_sampler_t *sampler);

/**
 * @brief Micro-batches per epoch on each rank (the same on every rank).
 *
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER.
 */
DSM_API dsm_status_t dsm_sampler_num_batches(dsm_sampler_t sampler, int64_t *num_batches);

/**
 * @brief The sample indices of micro-batch @p batch of epoch @p epoch on this rank.
 *
 * Not collective; the permutation of an epoch is computed once and kept
 * until another epoch is asked for. @p indices has room for @p len
 * elements (micro_batch is always enough); @p count gets how many were
 * written.
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT
 * (epoch < 0, batch outside [0, num_batches), len too small: naming the
 * value); DSM_ERR_OUT_OF_MEMORY.
 */
DSM_API dsm_status_t dsm_sampler_batch(dsm_sampler_t sampler, int64_t epoch, int64_t batch, int64_t *indices,
                                       size_t len, int64_t *count);

/**
 * @brief Where training resumes: the epoch and micro-batch that follow
 * @p micro_steps micro-batches (the engine's micro_steps counter, which a
 * checkpoint restores; dsm_engine_step_info()).
 *
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT for
 * negative micro_steps.
 */
DSM_API dsm_status_t dsm_sampler_locate(dsm_sampler_t sampler, int64_t micro_steps, int64_t *epoch,
                                        int64_t *batch);

/**
 * @brief The samples consumed once micro-batch @p batch of @p epoch has been
 * taken on every rank, a position valid at any number of replicas: give it
 * to dsm_sampler_resume() of a sampler of another data-parallel size.
 *
 * Not collective. @p samples gets epoch x num_samples plus the positions of
 * the epoch's (permuted) list the replicas have taken: (batch + 1) x
 * micro_batch x replicas, or num_samples after the epoch's last
 * micro-batch (its padding or dropped tail included). Store it with the
 * checkpoint (its client state) at the micro-batch the checkpoint follows.
 * dsm_sampler_locate() on a restored micro_steps is right only at the same
 * global batch (train_batch_size), and, where the micro-batch or the
 * data-parallel size changed, when num_samples is a multiple of micro-batch
 * x replicas at both sizes (a load at another gradient accumulation makes
 * micro_steps global_steps x the new accumulation: doc/checkpoint.md).
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT
 * (epoch < 0, batch outside the epoch's micro-batches, an epoch whose
 * position an int64_t cannot count: naming the value).
 */
DSM_API dsm_status_t dsm_sampler_position(dsm_sampler_t sampler, int64_t epoch, int64_t batch, int64_t *samples);

/**
 * @brief Continue after @p samples consumed samples (a dsm_sampler_position()
 * of a sampler over the same dataset, seed and shuffle, at any number of
 * replicas and any micro-batch): @p epoch gets the epoch to continue with,
 * from its micro-batch 0.
 *
 * Not collective; every rank of the data-parallel group passes the same
 * @p samples. The epoch samples / num_samples then serves the rest of its
 * list, from the position samples % num_samples on, split over this
 * sampler's replicas as a whole epoch is (padded by repeating the epoch's
 * list from its start, or cut with drop_last): no sample of the run before
 * is seen again, except as padding, and none is skipped. At the same
 * number of replicas and micro-batch it serves exactly the micro-batches
 * the run would have. dsm_sampler_epoch_batches() gives its
 * (smaller) number of micro-batches; later epochs are whole. When nothing
 * is left of that epoch here (drop_last), @p epoch is the next one. A
 * second call replaces the first.
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT for
 * negative samples.
 */
DSM_API dsm_status_t dsm_sampler_resume(dsm_sampler_t sampler, int64_t samples, int64_t *epoch);

/**
 * @brief Micro-batches of @p epoch on every rank: dsm_sampler_num_batches(),
 * or fewer for the epoch dsm_sampler_resume() starts inside.
 *
 * Not collective. @return DSM_SUCCESS; DSM_ERR_NULL_POINTER;
 * DSM_ERR_INVALID_ARGUMENT for epoch < 0.
 */
DSM_API dsm_status_t dsm_sampler_epoch_batches(dsm_sampler_t sampler, int64_t epoch, int64_t *num_batches);

/** @} */

#ifdef __cplusplus
}
#endif

#endif /* DSM_DATA_H */
