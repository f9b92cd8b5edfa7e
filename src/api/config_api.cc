// extern "C" entry points of the configuration: argument checks and
// handle <-> object; the work is in src/config/ and src/optim/.
#include "dsm_config.h"

#include <memory>

#include "api/api.hpp"
#include "config/config_load.hpp"
#include "core/info.hpp"
#include "mesh/mesh.hpp"
#include "config/settings.hpp"

namespace {

const dsm::config::Config &impl(dsm_config_t cfg) {
    DSM_ARG_NOT_NULL(cfg);
    return cfg->cfg;
}

dsm::config::ConfigContext context(unsigned flags, int64_t world, int64_t dp, int64_t sp = 0) {
    DSM_REQUIRE((flags & ~DSM_CONFIG_STRICT) == 0, DSM_ERR_INVALID_ARGUMENT, "flags is ", flags,
                ", only DSM_CONFIG_STRICT (1) is defined");
    dsm::config::ConfigContext ctx;
    ctx.world_size = world;
    ctx.mesh_data_parallel = dp;
    ctx.mesh_sequence_parallel = sp;
    ctx.strict = (flags & DSM_CONFIG_STRICT) != 0;
    return ctx;
}

dsm_config_t wrap(dsm::config::Config cfg) {
    auto h = std::make_unique<dsm_config_s>();
    h->cfg = std::move(cfg);
    return h.release();
}

// Collective load with argument checks agreed like every other collective.
void load(MPI_Comm comm, int64_t dp, int64_t sp, const char *config, unsigned flags, dsm_config_t *cfg) {
    if (cfg != nullptr) *cfg = nullptr;
    DSM_REQUIRE(comm != MPI_COMM_NULL, DSM_ERR_INVALID_ARGUMENT, "comm is MPI_COMM_NULL");
    int size = 0;
    DSM_CHECK_MPI(MPI_Comm_size(comm, &size));
    // Argument errors must fail every rank: they are agreed with the verdicts
    // of the other ranks instead of being thrown here.
    dsm_status_t bad = DSM_SUCCESS;
    std::string why;
    try {
        DSM_REQUIRE(cfg != nullptr, DSM_ERR_NULL_POINTER, "cfg (the output) is NULL");
        DSM_ARG_NOT_NULL(config);
        (void)context(flags, size, dp);
    } catch (const dsm::Error &e) {
        bad = e.status();
        why = e.message();
    }
    dsm::config::Config c = dsm::config::load_collective(comm, bad == DSM_SUCCESS ? config : "",
                                                         context(flags & DSM_CONFIG_STRICT, size, dp, sp), bad, why);
    *cfg = wrap(std::move(c));
}

} // namespace

extern "C" {

DSM_API dsm_status_t dsm_config_load(MPI_Comm comm, const char *config, unsigned flags, dsm_config_t *cfg) {
    DSM_API_BEGIN
    load(comm, 0, 0, config, flags, cfg);
    DSM_API_END
}

DSM_API dsm_status_t dsm_config_load_for_mesh(dsm_mesh_t mesh, const char *config, unsigned flags,
                                              dsm_config_t *cfg) {
    DSM_API_BEGIN
    if (cfg != nullptr) *cfg = nullptr;
    DSM_ARG_NOT_NULL(mesh);
    DSM_REQUIRE(mesh->mesh != nullptr, DSM_ERR_INVALID_ARGUMENT, "mesh is not a live mesh handle");
    const dsm::MeshState &st = mesh->mesh->state();
    int64_t dp = 0, sp = 0;
    for (size_t d = 0; d < st.names.size(); ++d) {
        if (st.names[d] == "data_parallel") dp = st.shape[d];
        if (st.names[d] == "sequence_parallel") sp = st.shape[d];
    }
    load(st.mesh_comm.get(), dp, sp, config, flags, cfg);
    DSM_API_END
}

DSM_API dsm_status_t dsm_config_resolve(const char *config, int64_t world_size, int64_t data_parallel_size,
                                        unsigned flags, dsm_config_t *cfg) {
    DSM_API_BEGIN
    DSM_ARG_NOT_NULL(cfg);
    *cfg = nullptr;
    DSM_ARG_NOT_NULL(config);
    DSM_REQUIRE(world_size >= 1, DSM_ERR_INVALID_ARGUMENT, "world_size is ", world_size, ", must be >= 1");
    DSM_REQUIRE(data_parallel_size >= 0 && data_parallel_size <= world_size && (data_parallel_size == 0 || world_size % data_parallel_size == 0),
                DSM_ERR_INVALID_ARGUMENT, "data_parallel_size is ", data_parallel_size,
                ", must be 0 (no mesh) or divide world_size ", world_size);
    // The engine's mesh is data parallel x sequence parallel: the ranks outside the data-parallel dimension.
    const int64_t sp = data_parallel_size > 0 ? world_size / data_parallel_size : 0;
    dsm::config::Config c = dsm::config::parse_config(config, context(flags, world_size, data_parallel_size, sp));
    *cfg = wrap(std::move(c));
    DSM_API_END
}

DSM_API dsm_status_t dsm_config_free(dsm_config_t *cfg) {
    DSM_API_BEGIN
    dsm::api::take_handle(cfg);
    DSM_API_END
}

DSM_API dsm_status_t dsm_config_batch(dsm_config_t cfg, int64_t *train_batch_size, int64_t *micro_batch_size,
                                          int64_t *gradient_accumulation_steps, int64_t *data_parallel_size) {
    DSM_API_BEGIN
    const dsm::config::Config &c = impl(cfg);
    if (train_batch_size != nullptr) *train_batch_size = c.train_batch_size;
    if (micro_batch_size != nullptr) *micro_batch_size = c.train_micro_batch_size_per_gpu;
    if (gradient_accumulation_steps != nullptr) *gradient_accumulation_steps = c.gradient_accumulation_steps;
    if (data_parallel_size != nullptr) *data_parallel_size = c.data_parallel_world_size;
    DSM_API_END
}

DSM_API dsm_status_t dsm_config_describe(dsm_config_t cfg, dsm_format_t format, char **text) {
    DSM_API_BEGIN
    DSM_ARG_NOT_NULL(text);
    *text = nullptr;
    const dsm::config::Config &c = impl(cfg);
    DSM_REQUIRE(format == DSM_FORMAT_TEXT || format == DSM_FORMAT_JSON, DSM_ERR_INVALID_ARGUMENT, "format ",
                static_cast<int>(format), " is not DSM_FORMAT_TEXT or DSM_FORMAT_JSON");
    *text = dsm::to_c_string(format == DSM_FORMAT_JSON ? dsm::config::config_to_json(c) + "\n"
                                                       : dsm::config::config_to_text(c));
    DSM_API_END
}

DSM_API dsm_status_t dsm_config_describe_lr(dsm_config_t cfg, int64_t steps, dsm_format_t format, char **text) {
    DSM_API_BEGIN
    DSM_ARG_NOT_NULL(text);
    *text = nullptr;
    const dsm::config::Config &c = impl(cfg);
    DSM_REQUIRE(format == DSM_FORMAT_TEXT || format == DSM_FORMAT_JSON, DSM_ERR_INVALID_ARGUMENT, "format ",
                static_cast<int>(format), " is not DSM_FORMAT_TEXT or DSM_FORMAT_JSON");
    *text = dsm::to_c_string(dsm::config::describe_lr(c, steps, format == DSM_FORMAT_JSON));
    DSM_API_END
}

} // extern "C"
