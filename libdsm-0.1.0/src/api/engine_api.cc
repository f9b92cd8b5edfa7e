// extern "C" entry points of the training engine: argument checks and
// handle <-> object; the work is in src/engine/.
#include "dsm_config.h"

#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "amp/convert.hpp"
#include "api/api.hpp"
#include "config/config_load.hpp"
#include "core/info.hpp"
#include "engine/engine.hpp"
#include "mesh/mesh.hpp"
#include "optim/lr_from_config.hpp"

namespace {

dsm::engine::Engine &impl(dsm_engine_t engine) {
    DSM_ARG_NOT_NULL(engine);
    DSM_REQUIRE(engine->engine != nullptr, DSM_ERR_INVALID_ARGUMENT, "engine is not a live engine handle");
    return *engine->engine;
}

void finish(std::unique_ptr<dsm::Mesh> mesh, const char *config, const dsm_param_desc_t *params, int nparams,
            dsm_engine_t *engine) {
    auto e = dsm::engine::Engine::create(std::move(mesh), config, params, nparams, engine != nullptr);
    auto h = std::make_unique<dsm_engine_s>();
    h->engine = std::move(e);
    *engine = h.release();
}

// dsm_engine_init_comm's work (also dsm_engine_init's with a NULL mesh): a
// mesh over comm shaped by the configuration's sequence_parallel_size.
void init_over_comm(MPI_Comm comm, const char *config, const dsm_param_desc_t *params, int nparams,
                    dsm_engine_t *engine) {
    if (engine != nullptr) *engine = nullptr;
    DSM_REQUIRE(comm != MPI_COMM_NULL, DSM_ERR_INVALID_ARGUMENT, "comm is MPI_COMM_NULL");
    int size = 0;
    DSM_CHECK_MPI(MPI_Comm_size(comm, &size));
    // The mesh's shape comes from the configuration: read it first (agreed).
    dsm_status_t bad = DSM_SUCCESS;
    std::string why;
    try {
        DSM_REQUIRE(engine != nullptr, DSM_ERR_NULL_POINTER, "engine (the output) is NULL");
        DSM_ARG_NOT_NULL(config);
    } catch (const dsm::Error &e) {
        bad = e.status();
        why = e.message();
    }
    dsm::config::ConfigContext ctx;
    ctx.world_size = size;
    const dsm::config::Config cfg =
        dsm::config::load_collective(comm, bad == DSM_SUCCESS ? config : "", ctx, dsm::optim::check_schedule_params, bad, why);
    const int sp = static_cast<int>(cfg.sequence_parallel_size);
    std::unique_ptr<dsm::Mesh> mesh;
    if (sp > 1) {
        const int shape[2] = {size / sp, sp};
        const char *const names[2] = {"data_parallel", "sequence_parallel"};
        mesh = dsm::Mesh::create(comm, 2, shape, names, nullptr, true);
    } else {
        const int shape[1] = {size};
        const char *const names[1] = {"data_parallel"};
        mesh = dsm::Mesh::create(comm, 1, shape, names, nullptr, true);
    }
    finish(std::move(mesh), config, params, nparams, engine);
}

} // namespace

extern "C" {

DSM_API dsm_status_t dsm_engine_init(dsm_mesh_t mesh, const char *config, const dsm_param_desc_t *params,
                                     int nparams, dsm_engine_t *engine) {
    DSM_API_BEGIN
    if (mesh == nullptr) {
        init_over_comm(MPI_COMM_WORLD, config, params, nparams, engine);
        return DSM_SUCCESS;
    }
    if (engine != nullptr) *engine = nullptr;
    DSM_REQUIRE(mesh->mesh != nullptr, DSM_ERR_INVALID_ARGUMENT, "mesh is not a live mesh handle");
    std::vector<std::string> names = mesh->mesh->dim_names();
    std::vector<const char *> cnames;
    for (const auto &n : names) cnames.push_back(n.c_str());
    finish(mesh->mesh->slice(static_cast<int>(cnames.size()), cnames.data()), config, params, nparams, engine);
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_init_comm(MPI_Comm comm, const char *config, const dsm_param_desc_t *params,
                                          int nparams, dsm_engine_t *engine) {
    DSM_API_BEGIN
    init_over_comm(comm, config, params, nparams, engine);
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_free(dsm_engine_t *engine) {
    DSM_API_BEGIN
    if (engine == nullptr || *engine == nullptr) return DSM_SUCCESS;
    std::unique_ptr<dsm_engine_s> h(*engine);
    *engine = nullptr;
    if (h->engine) h->engine->close();
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_num_params(dsm_engine_t engine, int *nparams) {
    DSM_API_BEGIN
    const auto &e = impl(engine);
    DSM_ARG_NOT_NULL(nparams);
    *nparams = e.num_params();
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_param_index(dsm_engine_t engine, const char *name, int *index) {
    DSM_API_BEGIN
    const auto &e = impl(engine);
    DSM_ARG_NOT_NULL(index);
    *index = e.param_index(name);
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_param_numel(dsm_engine_t engine, int index, int64_t *numel) {
    DSM_API_BEGIN
    const auto &e = impl(engine);
    DSM_ARG_NOT_NULL(numel);
    *numel = static_cast<int64_t>(e.numel(index));
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_get_dtype(dsm_engine_t engine, dsm_dtype_t *dtype) {
    DSM_API_BEGIN
    const auto &e = impl(engine);
    DSM_ARG_NOT_NULL(dtype);
    *dtype = e.dtype();
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_param_acquire(dsm_engine_t engine, int index, const void **values) {
    DSM_API_BEGIN
    auto &e = impl(engine);
    DSM_ARG_NOT_NULL(values);
    *values = nullptr;
    *values = e.param_acquire(index);
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_param_release(dsm_engine_t engine, int index) {
    DSM_API_BEGIN
    impl(engine).param_release(index);
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_grad_acquire(dsm_engine_t engine, int index, void **grad) {
    DSM_API_BEGIN
    auto &e = impl(engine);
    DSM_ARG_NOT_NULL(grad);
    *grad = nullptr;
    *grad = e.grad_acquire(index);
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_grad_release(dsm_engine_t engine, int index) {
    DSM_API_BEGIN
    impl(engine).grad_release(index);
    DSM_API_END
}

DSM_API dsm_status_t dsm_step(dsm_engine_t engine, dsm_step_info_t *info) {
    DSM_API_BEGIN
    impl(engine).step(info); // argument errors are agreed inside: dsm_step is collective
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_get_loss_scale(dsm_engine_t engine, double *scale) {
    DSM_API_BEGIN
    const auto &e = impl(engine);
    DSM_ARG_NOT_NULL(scale);
    *scale = e.loss_scale();
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_get_step_info(dsm_engine_t engine, dsm_step_info_t *info) {
    DSM_API_BEGIN
    const auto &e = impl(engine);
    DSM_ARG_NOT_NULL(info);
    e.step_info(info);
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_get_mesh(dsm_engine_t engine, dsm_mesh_t *mesh) {
    DSM_API_BEGIN
    auto &e = impl(engine);
    DSM_ARG_NOT_NULL(mesh);
    *mesh = e.mesh_handle();
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_describe(dsm_engine_t engine, dsm_format_t format, char **text) {
    DSM_API_BEGIN
    DSM_ARG_NOT_NULL(text);
    *text = nullptr;
    const auto &e = impl(engine);
    *text = dsm::to_c_string(e.describe(format));
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_save_checkpoint(dsm_engine_t engine, const char *dir, const char *tag,
                                                const void *client_state, size_t size) {
    DSM_API_BEGIN
    impl(engine).save_checkpoint(dir, tag, client_state, size);
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_load_checkpoint(dsm_engine_t engine, const char *dir, const char *tag,
                                                unsigned flags, void **client_state, size_t *size) {
    DSM_API_BEGIN
    if (client_state != nullptr) *client_state = nullptr;
    if (size != nullptr) *size = 0;
    std::vector<unsigned char> blob;
    impl(engine).load_checkpoint(dir, tag, flags, client_state != nullptr || size != nullptr ? &blob : nullptr);
    if (size != nullptr) *size = blob.size();
    if (client_state != nullptr && !blob.empty()) {
        void *p = std::malloc(blob.size());
        DSM_REQUIRE(p != nullptr, DSM_ERR_OUT_OF_MEMORY, "cannot allocate ", blob.size(),
                    " bytes for the client state");
        std::memcpy(p, blob.data(), blob.size());
        *client_state = p;
    }
    DSM_API_END
}

DSM_API dsm_status_t dsm_convert(const void *src, dsm_dtype_t src_dtype, void *dst, dsm_dtype_t dst_dtype,
                                 size_t n) {
    DSM_API_BEGIN
    // Checks the dtypes even when n is 0, and the pointers when n > 0.
    dsm::amp::convert(src, src_dtype, dst, dst_dtype, n);
    DSM_API_END
}

} // extern "C"
