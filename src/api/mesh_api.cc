// extern "C" entry points of the device mesh: argument checks and
// handle <-> object; the work is in src/mesh/.
#include "dsm_config.h"

#include <vector>

#include "api/api.hpp"
#include "config/config_load.hpp"
#include "core/info.hpp"
#include "mesh/mesh.hpp"

namespace {

dsm::Mesh &impl(dsm_mesh_t mesh) {
    DSM_ARG_NOT_NULL(mesh);
    DSM_REQUIRE(mesh->mesh != nullptr, DSM_ERR_INVALID_ARGUMENT, "mesh is not a live mesh handle");
    return *mesh->mesh;
}

dsm_mesh_t wrap(std::unique_ptr<dsm::Mesh> m) {
    auto h = std::make_unique<dsm_mesh_s>();
    h->mesh = std::move(m);
    return h.release();
}

// The body of an entry point that copies a list of the mesh into the
// caller's `out` of `len` entries: `out` (named `name`) must not be NULL,
// then `len` must hold read(mesh) (`what` in the message).
template <typename Read>
void read_list(dsm::Mesh &mesh, int len, int out[], const char *name, const char *what, Read &&read) {
    DSM_REQUIRE(out != nullptr, DSM_ERR_NULL_POINTER, name, " is NULL");
    const std::vector<int> v = read(mesh);
    DSM_REQUIRE(len >= 0 && static_cast<size_t>(len) >= v.size(), DSM_ERR_INVALID_ARGUMENT, "len is ", len,
                ", ", what, " needs ", v.size());
    for (size_t i = 0; i < v.size(); ++i) out[i] = v[i];
}

// A NULL output is reported through the agreement inside Mesh::create(), so
// that every rank fails together; here it only must not be written to.
void create(MPI_Comm comm, int ndims, const int shape[], const char *const names[],
            const dsm_mesh_options_t *options, dsm_mesh_t *mesh) {
    if (mesh != nullptr) *mesh = nullptr;
    std::unique_ptr<dsm::Mesh> m = dsm::Mesh::create(comm, ndims, shape, names, options, mesh != nullptr);
    *mesh = wrap(std::move(m));
}

} // namespace

// The mesh a configuration describes over comm (dsm_mesh_create_for_config,
// dsm_engine_init_comm): (data_parallel, sequence_parallel) when it sets
// sequence_parallel_size > 1, else one "data_parallel" dimension. The
// configuration is read collectively, once, into `*read` when the caller
// wants it for the engine; `bad`/`why` is this rank's argument error, agreed
// with the reading. `out_ok`: false when the caller's output is NULL (agreed
// inside Mesh::create, so every rank fails together).
std::unique_ptr<dsm::Mesh> dsm::api::mesh_for_config(MPI_Comm comm, const char *config, dsm_status_t bad,
                                                     std::string why, bool out_ok, dsm::config::Config *read) {
    DSM_REQUIRE(comm != MPI_COMM_NULL, DSM_ERR_INVALID_ARGUMENT, "comm is MPI_COMM_NULL");
    int size = 0;
    DSM_CHECK_MPI(MPI_Comm_size(comm, &size));
    if (bad == DSM_SUCCESS && config == nullptr) {
        bad = DSM_ERR_NULL_POINTER;
        why = "config is NULL";
    }
    dsm::config::ConfigContext ctx;
    ctx.world_size = size;
    dsm::config::Config cfg =
        dsm::config::load_collective(comm, bad == DSM_SUCCESS ? config : "", ctx, bad, why);
    const int sp = static_cast<int>(cfg.sequence_parallel_size);
    if (read != nullptr) *read = std::move(cfg);
    if (sp > 1) {
        const int shape[2] = {size / sp, sp};
        const char *const names[2] = {"data_parallel", "sequence_parallel"};
        return dsm::Mesh::create(comm, 2, shape, names, nullptr, out_ok);
    }
    const int shape[1] = {size};
    const char *const names[1] = {"data_parallel"};
    return dsm::Mesh::create(comm, 1, shape, names, nullptr, out_ok);
}

extern "C" {

DSM_API dsm_status_t dsm_mesh_create_with_options(MPI_Comm comm, int ndims, const int shape[],
                                                  const char *const names[],
                                                  const dsm_mesh_options_t *options, dsm_mesh_t *mesh) {
    DSM_API_BEGIN
    create(comm, ndims, shape, names, options, mesh);
    DSM_API_END
}

DSM_API dsm_status_t dsm_mesh_create(MPI_Comm comm, int ndims, const int shape[],
                                     const char *const names[], dsm_mesh_t *mesh) {
    DSM_API_BEGIN
    create(comm, ndims, shape, names, nullptr, mesh);
    DSM_API_END
}

DSM_API dsm_status_t dsm_mesh_create_for_config(MPI_Comm comm, const char *config, dsm_mesh_t *mesh) {
    DSM_API_BEGIN
    if (mesh != nullptr) *mesh = nullptr;
    std::unique_ptr<dsm::Mesh> m = dsm::api::mesh_for_config(comm, config, DSM_SUCCESS, "", mesh != nullptr);
    auto h = std::make_unique<dsm_mesh_s>();
    h->mesh = std::move(m);
    *mesh = h.release();
    DSM_API_END
}

DSM_API dsm_status_t dsm_mesh_create_dp_sp(MPI_Comm comm, int dp, int sp, dsm_mesh_t *mesh) {
    DSM_API_BEGIN
    const int shape[2] = {dp, sp};
    const char *const names[2] = {"data_parallel", "sequence_parallel"};
    create(comm, 2, shape, names, nullptr, mesh);
    DSM_API_END
}

DSM_API dsm_status_t dsm_mesh_free(dsm_mesh_t *mesh) {
    DSM_API_BEGIN
    auto h = dsm::api::take_handle(mesh);
    if (!h) return DSM_SUCCESS;
    int rc = h->mesh != nullptr ? h->mesh->release() : MPI_SUCCESS;
    h.reset();
    if (rc != MPI_SUCCESS) dsm::detail::mpi_fail(rc, "MPI_Comm_free", __FILE__, __LINE__);
    DSM_API_END
}

DSM_API dsm_status_t dsm_mesh_ndims(dsm_mesh_t mesh, int *ndims) {
    DSM_API_BEGIN
    dsm::api::read_into(impl(mesh), ndims, "ndims", [&](auto &m) { return m.ndims(); });
    DSM_API_END
}

DSM_API dsm_status_t dsm_mesh_shape(dsm_mesh_t mesh, int len, int shape[]) {
    DSM_API_BEGIN
    read_list(impl(mesh), len, shape, "shape", "the shape", [&](dsm::Mesh &m) { return m.shape(); });
    DSM_API_END
}

DSM_API dsm_status_t dsm_mesh_coords(dsm_mesh_t mesh, int len, int coords[]) {
    DSM_API_BEGIN
    read_list(impl(mesh), len, coords, "coords", "the coordinates", [&](dsm::Mesh &m) { return m.coords(); });
    DSM_API_END
}

DSM_API dsm_status_t dsm_mesh_dim_name(dsm_mesh_t mesh, int dim, const char **name) {
    DSM_API_BEGIN
    dsm::api::read_into(impl(mesh), name, "name", [&](auto &m) { return m.dim_name(dim).c_str(); });
    DSM_API_END
}

DSM_API dsm_status_t dsm_mesh_dim_index(dsm_mesh_t mesh, const char *name, int *dim) {
    DSM_API_BEGIN
    dsm::Mesh &m = impl(mesh);
    DSM_ARG_NOT_NULL(name);
    DSM_ARG_NOT_NULL(dim);
    *dim = m.dim_index(name);
    DSM_API_END
}

DSM_API dsm_status_t dsm_mesh_dim_size(dsm_mesh_t mesh, int dim, int *size) {
    DSM_API_BEGIN
    dsm::api::read_into(impl(mesh), size, "size", [&](auto &m) { return m.dim_size(dim); });
    DSM_API_END
}

DSM_API dsm_status_t dsm_mesh_dim_rank(dsm_mesh_t mesh, int dim, int *rank) {
    DSM_API_BEGIN
    dsm::api::read_into(impl(mesh), rank, "rank", [&](auto &m) { return m.dim_rank(dim); });
    DSM_API_END
}

DSM_API dsm_status_t dsm_mesh_size(dsm_mesh_t mesh, const char *group, int *size) {
    DSM_API_BEGIN
    dsm::api::read_into(impl(mesh), size, "size", [&](auto &m) { return m.group_size(m.group(group)); });
    DSM_API_END
}

DSM_API dsm_status_t dsm_mesh_rank(dsm_mesh_t mesh, const char *group, int *rank) {
    DSM_API_BEGIN
    dsm::api::read_into(impl(mesh), rank, "rank", [&](auto &m) { return m.group_rank(m.group(group)); });
    DSM_API_END
}

DSM_API dsm_status_t dsm_mesh_comm(dsm_mesh_t mesh, const char *group, MPI_Comm *comm) {
    DSM_API_BEGIN
    dsm::Mesh &m = impl(mesh);
    DSM_ARG_NOT_NULL(comm);
    dsm::GroupView g = m.group(group);
    DSM_REQUIRE(g.comm != MPI_COMM_NULL, DSM_ERR_NOT_SUPPORTED, "a slice of ", m.ndims(),
                " dimensions has no communicator of its own: flatten its dimensions with dsm_mesh_flatten");
    *comm = g.comm;
    DSM_API_END
}

DSM_API dsm_status_t dsm_mesh_group_ranks(dsm_mesh_t mesh, const char *group, int len, int ranks[]) {
    DSM_API_BEGIN
    read_list(impl(mesh), len, ranks, "ranks", "the group",
              [&](dsm::Mesh &m) { return m.group_ranks(m.group(group), m.state().position); });
    DSM_API_END
}

DSM_API dsm_status_t dsm_mesh_slice(dsm_mesh_t mesh, int nnames, const char *const names[],
                                    dsm_mesh_t *slice) {
    DSM_API_BEGIN
    DSM_ARG_NOT_NULL(slice);
    *slice = nullptr;
    dsm::Mesh &m = impl(mesh);
    *slice = wrap(m.slice(nnames, names));
    DSM_API_END
}

DSM_API dsm_status_t dsm_mesh_flatten(dsm_mesh_t mesh, int nnames, const char *const names[],
                                      const char *flat_name, MPI_Comm *comm) {
    DSM_API_BEGIN
    MPI_Comm c = impl(mesh).flatten(nnames, names, flat_name);
    if (comm != nullptr) *comm = c;
    DSM_API_END
}

DSM_API dsm_status_t dsm_mesh_describe(dsm_mesh_t mesh, dsm_format_t format, char **text) {
    DSM_API_BEGIN
    DSM_ARG_NOT_NULL(text);
    *text = nullptr;
    *text = dsm::to_c_string(impl(mesh).describe(format));
    DSM_API_END
}

} // extern "C"
