// extern "C" entry points of sequence parallelism: the Ulysses transforms and
// the loss over the group (the work is in src/sp/transform.cc).
#include "dsm_config.h"

#include <memory>
#include <string>

#include "api/api.hpp"
#include "core/agree.hpp"
#include "mesh/mesh.hpp"
#include "sp/transform.hpp"

struct dsm_sp_s {
    std::unique_ptr<dsm::sp::Context> ctx;
};

namespace {

dsm::sp::Context &impl(dsm_sp_t sp) {
    DSM_ARG_NOT_NULL(sp);
    DSM_REQUIRE(sp->ctx != nullptr, DSM_ERR_INVALID_ARGUMENT, "sp is not a live sequence-parallel handle");
    return *sp->ctx;
}

} // namespace

extern "C" {

DSM_API dsm_status_t dsm_sp_create(dsm_mesh_t mesh, const char *group, dsm_sp_t *sp) {
    DSM_API_BEGIN
    if (sp != nullptr) *sp = nullptr;
    DSM_ARG_NOT_NULL(mesh);
    DSM_REQUIRE(mesh->mesh != nullptr, DSM_ERR_INVALID_ARGUMENT, "mesh is not a live mesh handle");
    dsm::Mesh &m = *mesh->mesh;
    const dsm::MeshState &st = m.state();
    const std::string name = group != nullptr ? group : "sequence_parallel";
    MPI_Comm comm = MPI_COMM_NULL;
    dsm::agree(st.mesh_comm.get(), [&] {
        DSM_ARG_NOT_NULL(sp);
        const dsm::GroupView g = m.group(name.c_str());
        DSM_REQUIRE(g.comm != MPI_COMM_NULL, DSM_ERR_INVALID_ARGUMENT, "group '", name,
                    "' spans several dimensions without a communicator: flatten them with dsm_mesh_flatten");
        comm = g.comm;
    });
    dsm::agree_same(st.mesh_comm.get(), "the sequence-parallel group names", name);
    auto h = std::make_unique<dsm_sp_s>();
    h->ctx = std::make_unique<dsm::sp::Context>(comm, st.ranks[static_cast<size_t>(st.rank)].node);
    *sp = h.release();
    DSM_API_END
}

DSM_API dsm_status_t dsm_sp_free(dsm_sp_t *sp) {
    DSM_API_BEGIN
    auto h = dsm::api::take_handle(sp);
    if (h && h->ctx) h->ctx->close();
    DSM_API_END
}

DSM_API dsm_status_t dsm_sp_size(dsm_sp_t sp, int *size) {
    DSM_API_BEGIN
    dsm::api::read_into(impl(sp), size, "size", [&](auto &c) { return c.size(); });
    DSM_API_END
}

DSM_API dsm_status_t dsm_sp_rank(dsm_sp_t sp, int *rank) {
    DSM_API_BEGIN
    dsm::api::read_into(impl(sp), rank, "rank", [&](auto &c) { return c.rank(); });
    DSM_API_END
}

DSM_API dsm_status_t dsm_sp_alloc(dsm_sp_t sp, size_t bytes, void **ptr) {
    DSM_API_BEGIN
    if (ptr != nullptr) *ptr = nullptr;
    dsm::sp::Context &c = impl(sp);
    void *p = c.alloc(bytes, ptr != nullptr);
    *ptr = p;
    DSM_API_END
}

DSM_API dsm_status_t dsm_sp_free_memory(dsm_sp_t sp, void **ptr) {
    DSM_API_BEGIN
    impl(sp).free(ptr);
    DSM_API_END
}

DSM_API dsm_status_t dsm_sp_head_range(int64_t heads, unsigned flags, int size, int rank, int64_t *first,
                                       int64_t *count) {
    DSM_API_BEGIN
    DSM_ARG_NOT_NULL(first);
    DSM_ARG_NOT_NULL(count);
    const dsm::sp::HeadRange r = dsm::sp::head_range(heads, flags, size, rank);
    *first = r.first;
    *count = r.count;
    DSM_API_END
}

DSM_API dsm_status_t dsm_sp_counts(dsm_sp_t sp, const dsm_sp_tensor_t *t, size_t *seq_sharded,
                                   size_t *head_sharded) {
    DSM_API_BEGIN
    dsm::sp::Context &c = impl(sp);
    DSM_ARG_NOT_NULL(t);
    DSM_ARG_NOT_NULL(seq_sharded);
    DSM_ARG_NOT_NULL(head_sharded);
    const dsm::sp::Counts n = dsm::sp::counts(*t, c.size(), c.rank());
    *seq_sharded = n.seq_sharded;
    *head_sharded = n.head_sharded;
    DSM_API_END
}

DSM_API dsm_status_t dsm_sp_seq_to_head(dsm_sp_t sp, const dsm_sp_tensor_t *t, const void *in, size_t in_count,
                                        void *out, size_t out_count) {
    DSM_API_BEGIN
    impl(sp).transform(dsm::sp::Direction::SEQ_TO_HEAD, 1, t, &in, &in_count, &out, &out_count);
    DSM_API_END
}

DSM_API dsm_status_t dsm_sp_head_to_seq(dsm_sp_t sp, const dsm_sp_tensor_t *t, const void *in, size_t in_count,
                                        void *out, size_t out_count) {
    DSM_API_BEGIN
    impl(sp).transform(dsm::sp::Direction::HEAD_TO_SEQ, 1, t, &in, &in_count, &out, &out_count);
    DSM_API_END
}

DSM_API dsm_status_t dsm_sp_seq_to_head_n(dsm_sp_t sp, int n, const dsm_sp_tensor_t t[], const void *const in[],
                                          const size_t in_count[], void *const out[], const size_t out_count[]) {
    DSM_API_BEGIN
    impl(sp).transform(dsm::sp::Direction::SEQ_TO_HEAD, n, t, in, in_count, out, out_count);
    DSM_API_END
}

DSM_API dsm_status_t dsm_sp_head_to_seq_n(dsm_sp_t sp, int n, const dsm_sp_tensor_t t[], const void *const in[],
                                          const size_t in_count[], void *const out[], const size_t out_count[]) {
    DSM_API_BEGIN
    impl(sp).transform(dsm::sp::Direction::HEAD_TO_SEQ, n, t, in, in_count, out, out_count);
    DSM_API_END
}

DSM_API dsm_status_t dsm_sp_loss(dsm_sp_t sp, double loss_sum, int64_t tokens, double *mean, double *grad_scale) {
    DSM_API_BEGIN
    impl(sp).loss(loss_sum, tokens, mean, grad_scale);
    DSM_API_END
}

} // extern "C"
