// The N-dimensional named device mesh. A MeshState owns the communicators and
// is shared (shared_ptr) by a mesh and every slice of it; a Mesh is a view of
// some of its dimensions.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/comm.hpp"
#include "dsm.h"
#include "topo/locality.hpp"
#include "topo/placement.hpp"

namespace dsm {

struct FlatGroup {
    std::vector<int> dims; // ascending mesh dimensions
    Comm comm;
};

struct MeshState {
    Comm parent;                        // dup of the caller's communicator
    Comm mesh_comm;                     // ordered by mesh position
    std::vector<int> shape;
    std::vector<std::string> names;
    std::vector<Comm> dim_comms;        // one per dimension
    std::map<std::string, FlatGroup> flat;
    std::vector<topo::RankInfo> ranks;  // indexed by parent rank
    topo::Placement placement;
    std::vector<bool> within_node;      // per dimension
    dsm_placement_t placement_mode = DSM_PLACEMENT_NODE;
    dsm_bind_t bind_mode = DSM_BIND_NONE;
    std::string bound_cpus;             // what this rank bound itself to, if it did
    int rank = 0;                       // parent rank
    int position = 0;                   // linear mesh position

    int coord(int position, int dim) const;
    int stride(int dim) const; // row-major stride of a dimension
    // Free every communicator (collective); the first MPI error code, if any.
    int free_comms() noexcept;
    ~MeshState();
};

// A named group as seen from a handle: its dimensions and communicator.
struct GroupView {
    std::vector<int> dims;
    MPI_Comm comm = MPI_COMM_NULL; // MPI_COMM_NULL: a slice of 2+ dimensions
};

class Mesh {
public:
    // Collective over `comm`; see dsm_mesh_create_with_options(). `have_output`
    // is false when the caller's output pointer is NULL: that rank's error is
    // then agreed like any other bad argument.
    static std::unique_ptr<Mesh> create(MPI_Comm comm, int ndims, const int shape[],
                                        const char *const names[], const dsm_mesh_options_t *options,
                                        bool have_output);

    // Not collective: a view of some dimensions that shares the state.
    std::unique_ptr<Mesh> slice(int nnames, const char *const names[]) const;

    // Collective over the whole mesh.
    MPI_Comm flatten(int nnames, const char *const names[], const char *flat_name);

    int ndims() const { return static_cast<int>(dims_.size()); }
    int dim_size(int dim) const;
    int dim_rank(int dim) const;
    const std::string &dim_name(int dim) const;
    int dim_index(const char *name) const;
    std::vector<int> shape() const;
    std::vector<int> coords() const;
    std::vector<std::string> dim_names() const;

    // A dimension name, a flattened group name, or nullptr for the whole view.
    GroupView group(const char *name) const;
    int group_size(const GroupView &g) const;
    int group_rank(const GroupView &g) const;
    // Parent ranks of the members of the group of the rank at `position`, in group-rank order.
    std::vector<int> group_ranks(const GroupView &g, int position) const;

    std::string describe(dsm_format_t format) const;

    // The roles a client of this view (the engine) works with, each a
    // communicator of the caller's own: `product`, the view's ranks ordered
    // by mesh position (the whole mesh unless the view is a slice);
    // `data_parallel`, every dimension of the view but "sequence_parallel"
    // flattened row-major (group rank = that flat index); `sequence_parallel`,
    // that dimension (group rank = its coordinate; this rank alone without
    // one). Collective over the whole mesh.
    struct Roles {
        Comm product, data_parallel, sequence_parallel;
    };
    Roles roles() const;
    // This rank's node index in the placement (for the backends).
    int node() const;

    const MeshState &state() const { return *state_; }

    // Drop this handle's reference; when it was the last, free the
    // communicators (collective). Returns the first MPI error code, if any.
    int release() noexcept;

private:
    Mesh(std::shared_ptr<MeshState> state, std::vector<int> dims)
        : state_(std::move(state)), dims_(std::move(dims)) {}
    void check_dim(int dim) const;
    std::vector<int> resolve_dims(int nnames, const char *const names[], const char *what) const;

    std::shared_ptr<MeshState> state_;
    std::vector<int> dims_; // indices into state_->shape, ascending
};

// A dimension or group name must be a C identifier of 1..DSM_NAME_MAX characters.
void check_name(const char *name, const std::string &what);

} // namespace dsm

// The C handle.
struct dsm_mesh_s {
    std::unique_ptr<dsm::Mesh> mesh;
};
