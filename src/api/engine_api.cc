// extern "C" entry points of the training engine: argument checks and
// handle <-> object; the work is in src/engine/.
#include "dsm_config.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "amp/convert.hpp"
#include "api/api.hpp"
#include "config/config_load.hpp"
#include "core/agree.hpp"
#include "core/info.hpp"
#include "engine/engine.hpp"
#include "mesh/mesh.hpp"

namespace dsm::api {

engine::Engine &engine_impl(dsm_engine_t engine) {
    DSM_ARG_NOT_NULL(engine);
    DSM_REQUIRE(engine->engine != nullptr, DSM_ERR_INVALID_ARGUMENT, "engine is not a live engine handle");
    return *engine->engine;
}

} // namespace dsm::api

namespace {

dsm::engine::Engine &impl(dsm_engine_t engine) { return dsm::api::engine_impl(engine); }

const char *device_name(int d) {
    switch (d) {
    case DSM_DEVICE_DEFAULT: return "DSM_DEVICE_DEFAULT";
    case DSM_DEVICE_HOST: return "DSM_DEVICE_HOST";
    case DSM_DEVICE_CUDA: return "DSM_DEVICE_CUDA";
    case DSM_DEVICE_SIMULATED: return "DSM_DEVICE_SIMULATED";
    default: return nullptr;
    }
}

const char *backend_name(int b) {
    switch (b) {
    case DSM_BACKEND_DEFAULT: return "DSM_BACKEND_DEFAULT";
    case DSM_BACKEND_AUTO: return "DSM_BACKEND_AUTO";
    case DSM_BACKEND_MPI: return "DSM_BACKEND_MPI";
    case DSM_BACKEND_SHM: return "DSM_BACKEND_SHM";
    case DSM_BACKEND_NCCL: return "DSM_BACKEND_NCCL";
    default: return nullptr;
    }
}

// The caller's options (NULL: the defaults), read as far as its size goes
// (an older, smaller struct keeps the defaults of the fields it lacks) and
// checked. Local.
dsm::engine::Options read_options(const dsm_engine_options_t *options) {
    dsm_engine_options_t o = DSM_ENGINE_OPTIONS_INITIALIZER;
    if (options != nullptr) {
        DSM_REQUIRE(options->size >= sizeof(size_t) && options->size <= sizeof(dsm_engine_options_t),
                    DSM_ERR_INVALID_ARGUMENT, "options->size is ", options->size, ", expected ",
                    sizeof(dsm_engine_options_t), " (initialize options with DSM_ENGINE_OPTIONS_INITIALIZER)");
        std::memcpy(&o, options, options->size);
    }
    // Read the enums as the ints the caller stored: a value outside the enum
    // must be reported, and loading it as the enum type would be undefined.
    int device = 0, backend = 0;
    std::memcpy(&device, &o.device, sizeof device);
    std::memcpy(&backend, &o.backend, sizeof backend);
    DSM_REQUIRE(device_name(device) != nullptr, DSM_ERR_INVALID_ARGUMENT, "options->device is ", device,
                ", not a dsm_device_t");
    DSM_REQUIRE(backend_name(backend) != nullptr, DSM_ERR_INVALID_ARGUMENT, "options->backend is ", backend,
                ", not a dsm_backend_t");
    DSM_REQUIRE(o.cuda_device >= -1, DSM_ERR_INVALID_ARGUMENT, "options->cuda_device is ", o.cuda_device,
                ", must be -1 (chosen by the library) or a CUDA device ordinal >= 0");
    dsm::engine::Options checked;
    checked.device = static_cast<dsm_device_t>(device);
    checked.backend = static_cast<dsm_backend_t>(backend);
    checked.cuda_device = o.cuda_device;
    return checked;
}

// read_options() on every rank of the mesh, agreed: one rank's invalid
// options fail every rank, and so does a device or backend that differs
// between ranks. The agreement is over the whole mesh, whose every rank
// takes part in creating an engine (on a slice too: Mesh::roles() is
// collective over the whole mesh). cuda_device may differ: each rank names
// its own GPU.
dsm::engine::Options agree_options(const dsm::Mesh &mesh, const dsm_engine_options_t *options) {
    MPI_Comm comm = mesh.state().mesh_comm.get();
    dsm::engine::Options o;
    dsm::agree(comm, [&] { o = read_options(options); });
    dsm::agree_same(comm, "the options->device values", device_name(o.device));
    dsm::agree_same(comm, "the options->backend values", backend_name(o.backend));
    return o;
}

// The engine on `mesh` from a configuration's text or path (read once, by
// the engine) or from one already read (`text` false; adopted, not read).
void finish(std::unique_ptr<dsm::Mesh> mesh, bool text, const char *config, const dsm::config::Config *read,
            const dsm_param_desc_t *params, int nparams, const dsm_engine_options_t *options, dsm_engine_t *engine) {
    const dsm::engine::Options o = agree_options(*mesh, options);
    auto e = text ? dsm::engine::Engine::create(std::move(mesh), config, params, nparams, engine != nullptr, o)
                  : dsm::engine::Engine::create(std::move(mesh), read, params, nparams, engine != nullptr, o);
    auto h = std::make_unique<dsm_engine_s>();
    h->engine = std::move(e);
    *engine = h.release();
}

// dsm_engine_init_comm's work: the engine on mesh_for_config(comm), with the
// configuration that read (one read per call).
void init_over_comm(MPI_Comm comm, const char *config, const dsm_param_desc_t *params, int nparams,
                    const dsm_engine_options_t *options, dsm_engine_t *engine) {
    if (engine != nullptr) *engine = nullptr;
    dsm_status_t bad = DSM_SUCCESS;
    std::string why;
    if (engine == nullptr) {
        bad = DSM_ERR_NULL_POINTER;
        why = "engine (the output) is NULL";
    }
    dsm::config::Config read;
    std::unique_ptr<dsm::Mesh> mesh = dsm::api::mesh_for_config(comm, config, bad, why, true, &read);
    finish(std::move(mesh), false, nullptr, &read, params, nparams, options, engine);
}

// dsm_engine_init_with_options' and dsm_engine_init_with_config's work: on a
// slice of the caller's mesh that the engine keeps.
void init(dsm_mesh_t mesh, bool text, const char *config, const dsm::config::Config *read,
          const dsm_param_desc_t *params, int nparams, const dsm_engine_options_t *options, dsm_engine_t *engine) {
    if (engine != nullptr) *engine = nullptr;
    DSM_REQUIRE(mesh != nullptr, DSM_ERR_NULL_POINTER,
                "mesh is NULL (for the mesh a configuration describes over MPI_COMM_WORLD, create it with "
                "dsm_mesh_create_for_config() or call dsm_engine_init_comm())");
    DSM_REQUIRE(mesh->mesh != nullptr, DSM_ERR_INVALID_ARGUMENT, "mesh is not a live mesh handle");
    std::vector<std::string> names = mesh->mesh->dim_names();
    std::vector<const char *> cnames;
    for (const auto &n : names) cnames.push_back(n.c_str());
    finish(mesh->mesh->slice(static_cast<int>(cnames.size()), cnames.data()), text, config, read, params, nparams,
           options, engine);
}

// A text of the engine for the caller to dsm_free (describe, load report),
// in `format`. The format is checked here, as the caller's value: an
// out-of-range enum is never loaded where it is stored as dsm_format_t.
template <typename F> void engine_text(dsm_engine_t engine, char **text, dsm_format_t format, F &&make) {
    DSM_ARG_NOT_NULL(text);
    *text = nullptr;
    const auto &e = static_cast<const dsm::engine::Engine &>(impl(engine));
    DSM_REQUIRE(format == DSM_FORMAT_TEXT || format == DSM_FORMAT_JSON, DSM_ERR_INVALID_ARGUMENT, "format ",
                static_cast<int>(format), " is not DSM_FORMAT_TEXT or DSM_FORMAT_JSON");
    const dsm_format_t f = format == DSM_FORMAT_JSON ? DSM_FORMAT_JSON : DSM_FORMAT_TEXT;
    *text = dsm::to_c_string(make(e, f));
}

// A load's client state to the caller: its size, and a copy to dsm_free
// (none when empty). Either output may be NULL.
void give_client_state(const std::vector<unsigned char> &blob, void **client_state, size_t *size) {
    if (size != nullptr) *size = blob.size();
    if (client_state == nullptr || blob.empty()) return;
    void *p = std::malloc(blob.size());
    DSM_REQUIRE(p != nullptr, DSM_ERR_OUT_OF_MEMORY, "cannot allocate ", blob.size(), " bytes for the client state");
    std::memcpy(p, blob.data(), blob.size());
    *client_state = p;
}

} // namespace

extern "C" {

DSM_API dsm_status_t dsm_engine_init_with_options(dsm_mesh_t mesh, const char *config,
                                                  const dsm_param_desc_t *params, int nparams,
                                                  const dsm_engine_options_t *options, dsm_engine_t *engine) {
    DSM_API_BEGIN
    init(mesh, true, config, nullptr, params, nparams, options, engine);
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_init_with_config(dsm_mesh_t mesh, dsm_config_t config,
                                                 const dsm_param_desc_t *params, int nparams,
                                                 const dsm_engine_options_t *options, dsm_engine_t *engine) {
    DSM_API_BEGIN
    init(mesh, false, nullptr, config != nullptr ? &config->cfg : nullptr, params, nparams, options, engine);
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_init(dsm_mesh_t mesh, const char *config, const dsm_param_desc_t *params,
                                     int nparams, dsm_engine_t *engine) {
    DSM_API_BEGIN
    init(mesh, true, config, nullptr, params, nparams, nullptr, engine);
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_init_comm(MPI_Comm comm, const char *config, const dsm_param_desc_t *params,
                                          int nparams, dsm_engine_t *engine) {
    DSM_API_BEGIN
    init_over_comm(comm, config, params, nparams, nullptr, engine);
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_init_comm_with_options(MPI_Comm comm, const char *config,
                                                       const dsm_param_desc_t *params, int nparams,
                                                       const dsm_engine_options_t *options, dsm_engine_t *engine) {
    DSM_API_BEGIN
    init_over_comm(comm, config, params, nparams, options, engine);
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_free(dsm_engine_t *engine) {
    DSM_API_BEGIN
    auto h = dsm::api::take_handle(engine);
    if (h && h->engine) h->engine->close();
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_num_params(dsm_engine_t engine, int *nparams) {
    DSM_API_BEGIN
    dsm::api::read_into(impl(engine), nparams, "nparams", [&](auto &e) { return e.num_params(); });
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_param_index(dsm_engine_t engine, const char *name, int *index) {
    DSM_API_BEGIN
    dsm::api::read_into(impl(engine), index, "index", [&](auto &e) { return e.param_index(name); });
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_param_numel(dsm_engine_t engine, int index, int64_t *numel) {
    DSM_API_BEGIN
    dsm::api::read_into(impl(engine), numel, "numel", [&](auto &e) { return static_cast<int64_t>(e.numel(index)); });
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_param_shape(dsm_engine_t engine, int index, int len, int *ndims, int64_t shape[]) {
    DSM_API_BEGIN
    const std::vector<int64_t> &dims = impl(engine).shape(index);
    DSM_ARG_NOT_NULL(ndims);
    const int n = static_cast<int>(dims.size());
    *ndims = n;
    DSM_REQUIRE(len >= n, DSM_ERR_INVALID_ARGUMENT, "len is ", len, ", parameter ", index, " has ", n,
                " dimensions");
    DSM_REQUIRE(shape != nullptr || len == 0, DSM_ERR_NULL_POINTER, "shape is NULL with len ", len);
    std::copy(dims.begin(), dims.end(), shape);
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_dtype(dsm_engine_t engine, dsm_dtype_t *dtype) {
    DSM_API_BEGIN
    dsm::api::read_into(impl(engine), dtype, "dtype", [&](auto &e) { return e.dtype(); });
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_device(dsm_engine_t engine, dsm_device_t *device) {
    DSM_API_BEGIN
    dsm::api::read_into(impl(engine), device, "device", [&](auto &e) { return e.device(); });
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_batch(dsm_engine_t engine, int64_t *train_batch_size, int64_t *micro_batch_size,
                                          int64_t *gradient_accumulation_steps, int64_t *data_parallel_size) {
    DSM_API_BEGIN
    const dsm::config::Config &c = impl(engine).config();
    if (train_batch_size != nullptr) *train_batch_size = c.train_batch_size;
    if (micro_batch_size != nullptr) *micro_batch_size = c.train_micro_batch_size_per_gpu;
    if (gradient_accumulation_steps != nullptr) *gradient_accumulation_steps = c.gradient_accumulation_steps;
    if (data_parallel_size != nullptr) *data_parallel_size = c.data_parallel_world_size;
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_param_read_f32(dsm_engine_t engine, int index, float *values, int64_t count) {
    DSM_API_BEGIN
    impl(engine).param_read_f32(index, values, count);
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_grad_add_f32(dsm_engine_t engine, int index, const float *grad, int64_t count) {
    DSM_API_BEGIN
    impl(engine).grad_add_f32(index, grad, count);
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_log_loss(dsm_engine_t engine, double loss) {
    DSM_API_BEGIN
    impl(engine).log_loss(loss);
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_log_scalar(dsm_engine_t engine, const char *name, double value) {
    DSM_API_BEGIN
    impl(engine).log_scalar(name, value);
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_set_flops(dsm_engine_t engine, double flops_per_sample, double peak_flops) {
    DSM_API_BEGIN
    impl(engine).set_flops(flops_per_sample, peak_flops);
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_set_stop_signal(dsm_engine_t engine, int signum) {
    DSM_API_BEGIN
    impl(engine).set_stop_signal(signum);
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_stop_requested(dsm_engine_t engine, int *stop) {
    DSM_API_BEGIN
    DSM_ARG_NOT_NULL(stop);
    *stop = 0;
    *stop = impl(engine).stop_requested() ? 1 : 0;
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_param_acquire(dsm_engine_t engine, int index, const void **values) {
    DSM_API_BEGIN
    dsm::api::read_into_cleared(impl(engine), values, "values", [&](auto &e) { return e.param_acquire(index); });
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_param_release(dsm_engine_t engine, int index) {
    DSM_API_BEGIN
    impl(engine).param_release(index);
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_grad_acquire(dsm_engine_t engine, int index, void **grad) {
    DSM_API_BEGIN
    dsm::api::read_into_cleared(impl(engine), grad, "grad", [&](auto &e) { return e.grad_acquire(index); });
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_grad_release(dsm_engine_t engine, int index) {
    DSM_API_BEGIN
    impl(engine).grad_release(index);
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_param_acquire_range(dsm_engine_t engine, int index, int64_t offset, int64_t count,
                                                    const void **values) {
    DSM_API_BEGIN
    if (values != nullptr) *values = nullptr;
    const void *v = impl(engine).param_acquire_range(index, offset, count, values != nullptr);
    if (values != nullptr) *values = v;
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_param_release_range(dsm_engine_t engine, int index, int64_t offset, int64_t count) {
    DSM_API_BEGIN
    impl(engine).param_release_range(index, offset, count);
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_grad_acquire_range(dsm_engine_t engine, int index, int64_t offset, int64_t count,
                                                   void **grad) {
    DSM_API_BEGIN
    dsm::api::read_into_cleared(impl(engine), grad, "grad",
                                [&](auto &e) { return e.grad_acquire_range(index, offset, count); });
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_grad_release_range(dsm_engine_t engine, int index, int64_t offset, int64_t count) {
    DSM_API_BEGIN
    impl(engine).grad_release_range(index, offset, count);
    DSM_API_END
}

DSM_API dsm_status_t dsm_step(dsm_engine_t engine, dsm_step_info_t *info) {
    DSM_API_BEGIN
    impl(engine).step(info); // argument errors are agreed inside: dsm_step is collective
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_loss_scale(dsm_engine_t engine, double *scale) {
    DSM_API_BEGIN
    dsm::api::read_into(impl(engine), scale, "scale", [&](auto &e) { return e.loss_scale(); });
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_mean_loss(dsm_engine_t engine, double loss, double weight, double *mean) {
    DSM_API_BEGIN
    if (mean != nullptr) *mean = 0.0;
    const double m = impl(engine).mean_loss(loss, weight, mean != nullptr); // a NULL mean is agreed inside
    *mean = m;
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_step_info(dsm_engine_t engine, dsm_step_info_t *info) {
    DSM_API_BEGIN
    const auto &e = impl(engine);
    DSM_ARG_NOT_NULL(info);
    e.step_info(info);
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_borrow_mesh(dsm_engine_t engine, dsm_mesh_t *mesh) {
    DSM_API_BEGIN
    dsm::api::read_into(impl(engine), mesh, "mesh", [&](auto &e) { return e.mesh_handle(); });
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_describe(dsm_engine_t engine, dsm_format_t format, char **text) {
    DSM_API_BEGIN
    engine_text(engine, text, format, [](const dsm::engine::Engine &e, dsm_format_t f) { return e.describe(f); });
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_memory(dsm_engine_t engine, dsm_engine_memory_t *memory) {
    DSM_API_BEGIN
    const auto &e = static_cast<const dsm::engine::Engine &>(impl(engine));
    DSM_ARG_NOT_NULL(memory);
    DSM_REQUIRE(memory->size >= sizeof(size_t), DSM_ERR_INVALID_ARGUMENT, "memory->size is ", memory->size,
                ", must be at least ", sizeof(size_t), " (initialize with DSM_ENGINE_MEMORY_INITIALIZER)");
    const dsm_engine_memory_t m = e.memory();
    const size_t n = memory->size < sizeof m ? memory->size : sizeof m;
    std::memcpy(reinterpret_cast<char *>(memory) + sizeof(size_t), reinterpret_cast<const char *>(&m) + sizeof(size_t),
                n - sizeof(size_t));
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
    give_client_state(blob, client_state, size);
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_resume(dsm_engine_t engine, const char *dir, unsigned flags, int *resumed,
                                       void **client_state, size_t *size) {
    DSM_API_BEGIN
    if (resumed != nullptr) *resumed = 0;
    if (client_state != nullptr) *client_state = nullptr;
    if (size != nullptr) *size = 0;
    auto &e = impl(engine);
    // A NULL resumed is this rank's argument error: agreed inside.
    std::vector<unsigned char> blob;
    const bool loaded = e.resume(dir, flags, resumed != nullptr,
                                 client_state != nullptr || size != nullptr ? &blob : nullptr);
    *resumed = loaded ? 1 : 0;
    give_client_state(blob, client_state, size);
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_load_weights(dsm_engine_t engine, const char *path, unsigned flags) {
    DSM_API_BEGIN
    impl(engine).load_weights(path, flags);
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_checkpoint_wait(dsm_engine_t engine) {
    DSM_API_BEGIN
    impl(engine).checkpoint_wait();
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_load_report(dsm_engine_t engine, dsm_format_t format, char **text) {
    DSM_API_BEGIN
    engine_text(engine, text, format,
                [](const dsm::engine::Engine &e, dsm_format_t f) { return e.load_report(f); });
    DSM_API_END
}

} // extern "C"
