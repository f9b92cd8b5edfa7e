// The group behind dsm_torch_ops_set_mesh(): a libdsm sequence-parallel
// context over one group of the mesh, and a duplicate of the group's
// communicator on which the ranks exchange the message of an error found by
// the operators before the library's transform (see ops.cc).
#include "group.hpp"

#include <climits>
#include <cstring>
#include <vector>

namespace dsm_torch_ops {

namespace {

std::mutex g_lock;
Group g_group; // guarded by g_lock

// Free the context and the communicator (collective over the group).
dsm_status_t release(Group &g) {
    dsm_status_t st = DSM_SUCCESS;
    if (g.sp != nullptr) st = dsm_sp_free(&g.sp);
    if (g.comm != MPI_COMM_NULL) MPI_Comm_free(&g.comm);
    g = Group{};
    return st;
}

} // namespace

Held::Held() : group(g_group), lock_(g_lock) {}

int ranks_without_group(const Group &g) {
    if (g.set) return 0;
    int init = 0, fin = 0, n = 1;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (init && !fin) MPI_Comm_size(MPI_COMM_WORLD, &n);
    return n > 1 ? n : 0;
}

std::string agreed_failure(const Group &g, const std::string &local, const std::string &library) {
    int mine = local.empty() ? INT_MAX : g.rank, lowest = INT_MAX;
    if (MPI_Allreduce(&mine, &lowest, 1, MPI_INT, MPI_MIN, g.comm) != MPI_SUCCESS)
        return local.empty() ? library : local;
    if (lowest == INT_MAX) return library;
    std::vector<char> text(1024, '\0');
    if (g.rank == lowest) {
        const std::string m = "rank " + std::to_string(g.rank) + " of " + std::to_string(g.size) + ": " + local;
        std::strncpy(text.data(), m.c_str(), text.size() - 1);
    }
    if (MPI_Bcast(text.data(), static_cast<int>(text.size()), MPI_CHAR, lowest, g.comm) != MPI_SUCCESS)
        return local.empty() ? library : local;
    return std::string(text.data());
}

} // namespace dsm_torch_ops

using dsm_torch_ops::g_group;
using dsm_torch_ops::g_lock;

extern "C" {

DSM_TORCH_OPS_API dsm_status_t dsm_torch_ops_set_mesh(dsm_mesh_t mesh, const char *group) {
    static const char *fn = "dsm_torch_ops_set_mesh";
    std::lock_guard<std::mutex> lock(g_lock);
    dsm_status_t st = dsm_torch_ops::release(g_group);
    if (st != DSM_SUCCESS) return st;
    if (mesh == nullptr) { // no sequence parallelism
        g_group.set = true;
        return DSM_SUCCESS;
    }
    const char *name = group != nullptr ? group : "sequence_parallel";
    int size = 0;
    st = dsm_mesh_size(mesh, name, &size);
    if (st == DSM_ERR_NOT_FOUND && group == nullptr) { // a mesh without sequence parallelism
        g_group.set = true;
        return DSM_SUCCESS;
    }
    if (st == DSM_ERR_NOT_FOUND)
        return dsm_report_error(st, fn, (std::string("the mesh has no group '") + name + "'").c_str());
    if (st != DSM_SUCCESS) return st;
    dsm_torch_ops::Group g;
    st = dsm_sp_create(mesh, name, &g.sp);
    if (st != DSM_SUCCESS) return st;
    MPI_Comm comm = MPI_COMM_NULL;
    if ((st = dsm_mesh_comm(mesh, name, &comm)) == DSM_SUCCESS && (st = dsm_sp_size(g.sp, &g.size)) == DSM_SUCCESS &&
        (st = dsm_sp_rank(g.sp, &g.rank)) == DSM_SUCCESS) {
        if (MPI_Comm_dup(comm, &g.comm) != MPI_SUCCESS) {
            g.comm = MPI_COMM_NULL;
            st = dsm_report_error(DSM_ERR_MPI, fn, (std::string("MPI_Comm_dup of group '") + name + "' failed").c_str());
        } else {
            MPI_Comm_set_errhandler(g.comm, MPI_ERRORS_RETURN);
        }
    }
    if (st != DSM_SUCCESS) {
        dsm_torch_ops::release(g);
        return st;
    }
    g.set = true;
    g_group = g;
    return DSM_SUCCESS;
}

DSM_TORCH_OPS_API dsm_status_t dsm_torch_ops_clear(void) {
    std::lock_guard<std::mutex> lock(g_lock);
    return dsm_torch_ops::release(g_group);
}

DSM_TORCH_OPS_API dsm_status_t dsm_torch_ops_group_size(int *size) {
    if (size == nullptr) return dsm_report_error(DSM_ERR_NULL_POINTER, "dsm_torch_ops_group_size", "size is NULL");
    std::lock_guard<std::mutex> lock(g_lock);
    *size = g_group.size;
    return DSM_SUCCESS;
}

} // extern "C"
