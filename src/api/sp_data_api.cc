// extern "C" entry points of the data helpers: the sequence-parallel shard of
// a batch and the data-parallel sampler; the work is in src/sp/data.cc.
#include "dsm_config.h"

#include <cstring>
#include <memory>

#include "api/api.hpp"
#include "engine/engine.hpp"
#include "sp/data.hpp"

namespace {

dsm::sp::Sampler &impl(dsm_sampler_t sampler) {
    DSM_ARG_NOT_NULL(sampler);
    DSM_REQUIRE(sampler->sampler != nullptr, DSM_ERR_INVALID_ARGUMENT, "sampler is not a live sampler handle");
    return *sampler->sampler;
}

// The caller's options, versioned by their size as dsm_mesh_options_t: a
// smaller (older) struct keeps the defaults for the fields it lacks; a larger
// one has fields this library cannot honour.
dsm::sp::SamplerOptions read_options(const dsm_sampler_options_t *options) {
    dsm_sampler_options_t o = DSM_SAMPLER_OPTIONS_INITIALIZER;
    if (options != nullptr) {
        DSM_REQUIRE(options->size >= sizeof(size_t) && options->size <= sizeof(dsm_sampler_options_t),
                    DSM_ERR_INVALID_ARGUMENT, "options->size is ", options->size, ", expected at most ",
                    sizeof(dsm_sampler_options_t), " (initialize options with DSM_SAMPLER_OPTIONS_INITIALIZER)");
        std::memcpy(&o, options, options->size);
        o.size = sizeof o;
    }
    dsm::sp::SamplerOptions s;
    s.shuffle = o.shuffle != 0;
    s.seed = o.seed;
    s.drop_last = o.drop_last != 0;
    return s;
}

void create(int64_t num_samples, int replicas, int rank, int64_t micro_batch, const dsm_sampler_options_t *options,
            dsm_sampler_t *sampler) {
    DSM_REQUIRE(sampler != nullptr, DSM_ERR_NULL_POINTER, "sampler (the output) is NULL");
    auto s = std::make_unique<dsm::sp::Sampler>(num_samples, replicas, rank, micro_batch, read_options(options));
    auto h = std::make_unique<dsm_sampler_s>();
    h->sampler = std::move(s);
    *sampler = h.release();
}

} // namespace

extern "C" {

DSM_API dsm_status_t dsm_sp_shard_batch(int size, int rank, int64_t batch, int64_t seq, const int64_t *tokens,
                                        const int64_t *positions, const int64_t *labels, int64_t pad_token,
                                        size_t out_len, int64_t *out_tokens, int64_t *out_positions,
                                        int64_t *out_labels, int64_t *chunk, int64_t *valid) {
    DSM_API_BEGIN
    if (chunk != nullptr) *chunk = 0;
    if (valid != nullptr) *valid = 0;
    DSM_ARG_NOT_NULL(chunk);
    const dsm::sp::Shard s = dsm::sp::shard_batch(size, rank, batch, seq, tokens, positions, labels, pad_token,
                                                  out_len, out_tokens, out_positions, out_labels);
    *chunk = s.chunk;
    if (valid != nullptr) *valid = s.valid;
    DSM_API_END
}

DSM_API dsm_status_t dsm_sampler_create(int64_t num_samples, int replicas, int rank, int64_t micro_batch,
                                        const dsm_sampler_options_t *options, dsm_sampler_t *sampler) {
    DSM_API_BEGIN
    if (sampler != nullptr) *sampler = nullptr;
    create(num_samples, replicas, rank, micro_batch, options, sampler);
    DSM_API_END
}

DSM_API dsm_status_t dsm_sampler_create_for_engine(dsm_engine_t engine, int64_t num_samples,
                                                   const dsm_sampler_options_t *options, dsm_sampler_t *sampler) {
    DSM_API_BEGIN
    if (sampler != nullptr) *sampler = nullptr;
    DSM_ARG_NOT_NULL(engine);
    DSM_REQUIRE(engine->engine != nullptr, DSM_ERR_INVALID_ARGUMENT, "engine is not a live engine handle");
    const dsm::engine::Engine &e = *engine->engine;
    create(num_samples, e.dp_size(), e.dp_rank(), e.config().train_micro_batch_size_per_gpu, options, sampler);
    DSM_API_END
}

DSM_API dsm_status_t dsm_sampler_free(dsm_sampler_t *sampler) {
    DSM_API_BEGIN
    dsm::api::take_handle(sampler);
    DSM_API_END
}

DSM_API dsm_status_t dsm_sampler_num_batches(dsm_sampler_t sampler, int64_t *num_batches) {
    DSM_API_BEGIN
    dsm::api::read_into(impl(sampler), num_batches, "num_batches", [&](auto &s) { return s.num_batches(); });
    DSM_API_END
}

DSM_API dsm_status_t dsm_sampler_batch(dsm_sampler_t sampler, int64_t epoch, int64_t batch, int64_t *indices,
                                       size_t len, int64_t *count) {
    DSM_API_BEGIN
    if (count != nullptr) *count = 0;
    dsm::api::read_into(impl(sampler), count, "count", [&](auto &s) { return s.batch(epoch, batch, indices, len); });
    DSM_API_END
}

DSM_API dsm_status_t dsm_sampler_locate(dsm_sampler_t sampler, int64_t micro_steps, int64_t *epoch,
                                        int64_t *batch) {
    DSM_API_BEGIN
    impl(sampler).locate(micro_steps, epoch, batch);
    DSM_API_END
}

DSM_API dsm_status_t dsm_sampler_position(dsm_sampler_t sampler, int64_t epoch, int64_t batch, int64_t *samples) {
    DSM_API_BEGIN
    dsm::api::read_into_cleared(impl(sampler), samples, "samples", [&](auto &s) { return s.position(epoch, batch); });
    DSM_API_END
}

DSM_API dsm_status_t dsm_sampler_resume(dsm_sampler_t sampler, int64_t samples, int64_t *epoch) {
    DSM_API_BEGIN
    dsm::api::read_into_cleared(impl(sampler), epoch, "epoch", [&](auto &s) { return s.resume(samples); });
    DSM_API_END
}

DSM_API dsm_status_t dsm_sampler_epoch_batches(dsm_sampler_t sampler, int64_t epoch, int64_t *num_batches) {
    DSM_API_BEGIN
    dsm::api::read_into_cleared(impl(sampler), num_batches, "num_batches",
                                [&](auto &s) { return s.epoch_batches(epoch); });
    DSM_API_END
}

} // extern "C"
