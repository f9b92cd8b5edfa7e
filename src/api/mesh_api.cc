// extern "C" entry points of the device mesh: argument checks and
// handle <-> object; the work is in src/mesh/.
#include "dsm_config.h"

#include <vector>

#include "api/api.hpp"
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

void check_len(int len, size_t needed, const char *what) {
    DSM_REQUIRE(len >= 0 && static_cast<size_t>(len) >= needed, DSM_ERR_INVALID_ARGUMENT, "len is ", len,
                ", ", what, " needs ", needed);
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

DSM_API dsm_status_t dsm_mesh_create_dp_sp(MPI_Comm comm, int dp, int sp, dsm_mesh_t *mesh) {
    DSM_API_BEGIN
    const int shape[2] = {dp, sp};
    const char *const names[2] = {"data_parallel", "sequence_parallel"};
    create(comm, 2, shape, names, nullptr, mesh);
    DSM_API_END
}

DSM_API dsm_status_t dsm_mesh_free(dsm_mesh_t *mesh) {
    DSM_API_BEGIN
    if (mesh == nullptr || *mesh == nullptr) return DSM_SUCCESS;
    std::unique_ptr<dsm_mesh_s> h(*mesh);
    *mesh = nullptr;
    int rc = h->mesh != nullptr ? h->mesh->release() : MPI_SUCCESS;
    h.reset();
    if (rc != MPI_SUCCESS) dsm::detail::mpi_fail(rc, "MPI_Comm_free", __FILE__, __LINE__);
    DSM_API_END
}

DSM_API dsm_status_t dsm_mesh_ndims(dsm_mesh_t mesh, int *ndims) {
    DSM_API_BEGIN
    dsm::Mesh &m = impl(mesh);
    DSM_ARG_NOT_NULL(ndims);
    *ndims = m.ndims();
    DSM_API_END
}

DSM_API dsm_status_t dsm_mesh_shape(dsm_mesh_t mesh, int len, int shape[]) {
    DSM_API_BEGIN
    dsm::Mesh &m = impl(mesh);
    DSM_ARG_NOT_NULL(shape);
    std::vector<int> s = m.shape();
    check_len(len, s.size(), "the shape");
    for (size_t i = 0; i < s.size(); ++i) shape[i] = s[i];
    DSM_API_END
}

DSM_API dsm_status_t dsm_mesh_coords(dsm_mesh_t mesh, int len, int coords[]) {
    DSM_API_BEGIN
    dsm::Mesh &m = impl(mesh);
    DSM_ARG_NOT_NULL(coords);
    std::vector<int> c = m.coords();
    check_len(len, c.size(), "the coordinates");
    for (size_t i = 0; i < c.size(); ++i) coords[i] = c[i];
    DSM_API_END
}

DSM_API dsm_status_t dsm_mesh_dim_name(dsm_mesh_t mesh, int dim, const char **name) {
    DSM_API_BEGIN
    dsm::Mesh &m = impl(mesh);
    DSM_ARG_NOT_NULL(name);
    *name = m.dim_name(dim).c_str();
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
    dsm::Mesh &m = impl(mesh);
    DSM_ARG_NOT_NULL(size);
    *size = m.dim_size(dim);
    DSM_API_END
}

DSM_API dsm_status_t dsm_mesh_dim_rank(dsm_mesh_t mesh, int dim, int *rank) {
    DSM_API_BEGIN
    dsm::Mesh &m = impl(mesh);
    DSM_ARG_NOT_NULL(rank);
    *rank = m.dim_rank(dim);
    DSM_API_END
}

DSM_API dsm_status_t dsm_mesh_size(dsm_mesh_t mesh, const char *group, int *size) {
    DSM_API_BEGIN
    dsm::Mesh &m = impl(mesh);
    DSM_ARG_NOT_NULL(size);
    *size = m.group_size(m.group(group));
    DSM_API_END
}

DSM_API dsm_status_t dsm_mesh_rank(dsm_mesh_t mesh, const char *group, int *rank) {
    DSM_API_BEGIN
    dsm::Mesh &m = impl(mesh);
    DSM_ARG_NOT_NULL(rank);
    *rank = m.group_rank(m.group(group));
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
    dsm::Mesh &m = impl(mesh);
    DSM_ARG_NOT_NULL(ranks);
    std::vector<int> r = m.group_ranks(m.group(group), m.state().position);
    check_len(len, r.size(), "the group");
    for (size_t i = 0; i < r.size(); ++i) ranks[i] = r[i];
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
