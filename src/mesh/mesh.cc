#include "dsm_config.h"

#include "mesh/mesh.hpp"

#include <algorithm>
#include <cctype>
#include <cstring>

#include "core/agree.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/param.hpp"
#include "core/watchdog.hpp"
#include "topo/bind.hpp"

namespace dsm {

namespace {

DSM_PARAM(mesh, MESH_PLACEMENT, param::Choice({"node", "none"}), "node",
          "Rank placement of dsm_mesh_create when the caller leaves it to the environment: node "
          "(innermost mesh dimensions inside a node, ranks ordered by NUMA domain and rank inside it) "
          "or none (mesh position = rank).");
DSM_PARAM(mesh, BIND, param::Choice({"none", "spread", "gpu"}), "none",
          "CPU binding at mesh creation when the caller leaves it to the environment: none, spread "
          "(an even share of the node's cores per rank) or gpu (the cores nearest the rank's GPU).");

std::string join(const std::vector<std::string> &v, const char *sep = ",") {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
    return s;
}

std::string join(const std::vector<int> &v, const char *sep = ",") {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + std::to_string(v[i]);
    return s;
}

struct Resolved {
    std::vector<int> shape;
    std::vector<std::string> names;
    dsm_placement_t placement = DSM_PLACEMENT_NODE;
    dsm_bind_t bind = DSM_BIND_NONE;
};

dsm_mesh_options_t read_options(const dsm_mesh_options_t *options) {
    dsm_mesh_options_t o = DSM_MESH_OPTIONS_INITIALIZER;
    if (options == nullptr) return o;
    DSM_REQUIRE(options->size >= sizeof(size_t) && options->size <= sizeof(dsm_mesh_options_t),
                DSM_ERR_INVALID_ARGUMENT, "options->size is ", options->size, ", expected ",
                sizeof(dsm_mesh_options_t),
                " (initialize options with DSM_MESH_OPTIONS_INITIALIZER)");
    std::memcpy(&o, options, options->size);
    return o;
}

Resolved resolve(int size, int ndims, const int shape[], const char *const names[],
                 const dsm_mesh_options_t *options) {
    DSM_ARG_NOT_NULL(shape);
    DSM_ARG_NOT_NULL(names);
    DSM_REQUIRE(ndims >= 1 && ndims <= DSM_MESH_MAX_DIMS, DSM_ERR_INVALID_ARGUMENT, "ndims is ", ndims,
                ", must be 1..", DSM_MESH_MAX_DIMS);
    Resolved r;
    int infer = -1;
    long long product = 1;
    for (int d = 0; d < ndims; ++d) {
        if (shape[d] == -1) {
            DSM_REQUIRE(infer < 0, DSM_ERR_INVALID_ARGUMENT, "shape[", infer, "] and shape[", d,
                        "] are both -1: only one dimension can be inferred");
            infer = d;
            continue;
        }
        DSM_REQUIRE(shape[d] > 0, DSM_ERR_INVALID_ARGUMENT, "shape[", d, "] is ", shape[d],
                    ", must be positive or -1");
        product *= shape[d];
        DSM_REQUIRE(product <= size, DSM_ERR_INVALID_ARGUMENT, "the product of the shape exceeds the communicator size ",
                    size, " at shape[", d, "] = ", shape[d]);
    }
    r.shape.assign(shape, shape + ndims);
    if (infer >= 0) {
        DSM_REQUIRE(size % product == 0, DSM_ERR_INVALID_ARGUMENT, "cannot infer shape[", infer,
                    "]: the communicator size ", size, " is not divisible by ", product,
                    " (the product of the other dimensions)");
        r.shape[static_cast<size_t>(infer)] = static_cast<int>(size / product);
        product = size;
    }
    DSM_REQUIRE(product == size, DSM_ERR_INVALID_ARGUMENT, "the product of the shape [",
                join(r.shape), "] is ", product, ", must equal the communicator size ", size);
    for (int d = 0; d < ndims; ++d) {
        DSM_REQUIRE(names[d] != nullptr, DSM_ERR_NULL_POINTER, "names[", d, "] is NULL");
        check_name(names[d], cat("names[", d, "]"));
        for (int e = 0; e < d; ++e)
            DSM_REQUIRE(std::strcmp(names[e], names[d]) != 0, DSM_ERR_INVALID_ARGUMENT,
                        "names[", e, "] and names[", d, "] are both \"", names[d],
                        "\": dimension names must be unique");
        r.names.emplace_back(names[d]);
    }
    dsm_mesh_options_t o = read_options(options);
    // Read the enums as the ints the caller stored: a value outside the enum
    // must be reported, and loading it as the enum type would be undefined.
    int placement = 0, bind = 0;
    std::memcpy(&placement, &o.placement, sizeof placement);
    std::memcpy(&bind, &o.bind, sizeof bind);
    switch (placement) {
    case DSM_PLACEMENT_DEFAULT:
        r.placement = param_MESH_PLACEMENT().value() == "node"
                          ? DSM_PLACEMENT_NODE : DSM_PLACEMENT_NONE;
        break;
    case DSM_PLACEMENT_NODE:
    case DSM_PLACEMENT_NONE: r.placement = static_cast<dsm_placement_t>(placement); break;
    default:
        DSM_FAIL(DSM_ERR_INVALID_ARGUMENT, "options->placement is ", placement,
                 ", not a dsm_placement_t");
    }
    switch (bind) {
    case DSM_BIND_DEFAULT: {
        const std::string b = param_BIND().value();
        r.bind = b == "none" ? DSM_BIND_NONE : b == "spread" ? DSM_BIND_SPREAD : DSM_BIND_GPU;
        break;
    }
    case DSM_BIND_NONE:
    case DSM_BIND_SPREAD:
    case DSM_BIND_GPU: r.bind = static_cast<dsm_bind_t>(bind); break;
    default:
        DSM_FAIL(DSM_ERR_INVALID_ARGUMENT, "options->bind is ", bind,
                 ", not a dsm_bind_t");
    }
    return r;
}

const char *bind_name(dsm_bind_t b) {
    return b == DSM_BIND_SPREAD ? "spread" : b == DSM_BIND_GPU ? "gpu" : "none";
}

} // namespace

void check_name(const char *name, const std::string &what) {
    size_t len = std::strlen(name);
    DSM_REQUIRE(len > 0, DSM_ERR_INVALID_ARGUMENT, what, " is empty");
    DSM_REQUIRE(len <= DSM_NAME_MAX, DSM_ERR_INVALID_ARGUMENT, what, " \"", name, "\" has ", len,
                " characters, at most ", DSM_NAME_MAX, " are allowed");
    bool ok = std::isalpha(static_cast<unsigned char>(name[0])) || name[0] == '_';
    for (size_t i = 1; ok && i < len; ++i)
        ok = std::isalnum(static_cast<unsigned char>(name[i])) || name[i] == '_';
    DSM_REQUIRE(ok, DSM_ERR_INVALID_ARGUMENT, what, " \"", name,
                "\" is not an identifier (letters, digits and _, not starting with a digit)");
}

int MeshState::stride(int dim) const {
    int s = 1;
    for (size_t d = shape.size(); d-- > static_cast<size_t>(dim) + 1;) s *= shape[d];
    return s;
}

int MeshState::coord(int pos, int dim) const {
    return (pos / stride(dim)) % shape[static_cast<size_t>(dim)];
}

int MeshState::free_comms() noexcept {
    // Reverse order of creation.
    int first = MPI_SUCCESS;
    auto keep = [&first](int rc) {
        if (first == MPI_SUCCESS) first = rc;
    };
    for (auto &kv : flat) keep(kv.second.comm.reset());
    flat.clear();
    for (size_t d = dim_comms.size(); d-- > 0;) keep(dim_comms[d].reset());
    dim_comms.clear();
    keep(mesh_comm.reset());
    keep(parent.reset());
    return first;
}

MeshState::~MeshState() { free_comms(); }

int Mesh::release() noexcept {
    int rc = MPI_SUCCESS;
    if (state_ && state_.use_count() == 1) rc = state_->free_comms();
    state_.reset();
    return rc;
}

std::unique_ptr<Mesh> Mesh::create(MPI_Comm comm, int ndims, const int shape[],
                                   const char *const names[], const dsm_mesh_options_t *options,
                                   bool have_output) {
    DSM_REQUIRE(comm != MPI_COMM_NULL, DSM_ERR_INVALID_ARGUMENT, "comm is MPI_COMM_NULL");
    int inter = 0;
    DSM_CHECK_MPI(MPI_Comm_test_inter(comm, &inter));
    DSM_REQUIRE(!inter, DSM_ERR_INVALID_ARGUMENT, "comm is an intercommunicator");

    auto st = std::make_shared<MeshState>();
    st->parent = Comm::dup(comm);
    MPI_Comm parent = st->parent.get();
    int size = 0;
    DSM_CHECK_MPI(MPI_Comm_rank(parent, &st->rank));
    DSM_CHECK_MPI(MPI_Comm_size(parent, &size));

    Resolved r;
    agree(parent, [&] {
        DSM_REQUIRE(have_output, DSM_ERR_NULL_POINTER, "mesh (the output) is NULL");
        r = resolve(size, ndims, shape, names, options);
        watchdog::start(); // DSM_COMM_TIMEOUT: a malformed value fails every rank here
    });
    agree_same(parent, "mesh arguments",
               cat("shape [", join(std::vector<int>(shape, shape + ndims)), "] names [", join(r.names),
                   "] placement ", r.placement == DSM_PLACEMENT_NODE ? "node" : "none", " bind ",
                   bind_name(r.bind)));
    st->shape = r.shape;
    st->names = r.names;
    st->placement_mode = r.placement;
    st->bind_mode = r.bind;

    st->ranks = topo::discover(parent);
    {
        // The hosts, for the watchdog's messages about these ranks.
        watchdog::Group g;
        g.describe(parent, std::string(), std::string());
        std::vector<std::string> hosts;
        for (const topo::RankInfo &ri : st->ranks) hosts.push_back(ri.host);
        watchdog::note_hosts(g.world, hosts);
    }
    st->placement = topo::place(st->ranks, r.placement == DSM_PLACEMENT_NODE);
    st->position = st->placement.position_of_rank[static_cast<size_t>(st->rank)];
    st->mesh_comm = Comm::split(parent, 0, st->position);
    for (int d = 0; d < ndims; ++d) {
        int c = st->coord(st->position, d);
        st->dim_comms.push_back(Comm::split(st->mesh_comm.get(), st->position - c * st->stride(d), c));
    }

    st->within_node = topo::dims_within_node(st->shape, st->placement, st->ranks);
    if (st->rank == 0) {
        DSM_INFO(INIT, "libdsm %s: mesh of %d ranks, placement %s", DSM_VERSION_STRING, size,
                 r.placement == DSM_PLACEMENT_NODE ? "node" : "none");
        int nnodes = 0, per_node = 0;
        for (const auto &ri : st->ranks) {
            nnodes = std::max(nnodes, ri.node + 1);
            per_node = std::max(per_node, ri.local_size);
        }
        // Without placement, the groups node-aware placement would keep
        // inside a node: there the launch order, not the nodes, is the cause.
        const std::vector<bool> placed_within =
            r.placement == DSM_PLACEMENT_NODE ? st->within_node
                                              : topo::dims_within_node(st->shape, topo::place(st->ranks, true), st->ranks);
        for (int d = 0; d < ndims; ++d) {
            const char *name = st->names[static_cast<size_t>(d)].c_str();
            const int extent = st->shape[static_cast<size_t>(d)];
            // Ranks a group of d and the dimensions inside it need on one node.
            const long need = static_cast<long>(extent) * st->stride(d);
            if (st->within_node[static_cast<size_t>(d)]) {
                DSM_INFO(MESH, "dimension %s (size %d): every group inside one node", name, extent);
            } else if (need > per_node) {
                DSM_INFO(MESH,
                         "dimension %s (size %d) cannot stay inside a node: with the dimensions inside "
                         "it a group needs %ld ranks, nodes have at most %d",
                         name, extent, need, per_node);
            } else if (placed_within[static_cast<size_t>(d)]) {
                DSM_WARN(MESH,
                         "dimension %s (size %d) does not stay inside a node: placement none keeps the "
                         "launch order of the ranks, which puts its groups across nodes (node-aware "
                         "placement would keep them inside one); its collectives cross the network",
                         name, extent);
            } else {
                DSM_WARN(MESH,
                         "dimension %s (size %d) cannot stay inside a node: its groups need %ld ranks "
                         "and nodes have up to %d, but the %d nodes' sizes do not fit the shape; its "
                         "collectives cross the network",
                         name, extent, need, per_node, nnodes);
            }
        }
    }

    if (r.bind != DSM_BIND_NONE) {
        const topo::RankInfo &me = st->ranks[static_cast<size_t>(st->rank)];
        // Index of this rank among its node's ranks, in placement order.
        int index = 0;
        for (int pos = 0; pos < st->position; ++pos)
            if (st->ranks[static_cast<size_t>(st->placement.rank_of_position[static_cast<size_t>(pos)])].node == me.node) ++index;
        agree(parent, [&] {
            st->bound_cpus = topo::bind_self(r.bind, index, me.local_size,
                                             st->placement.gpu_of_rank[static_cast<size_t>(st->rank)]);
        });
        DSM_INFO(TOPO, "bound to cpus %s (%s)", st->bound_cpus.c_str(), bind_name(r.bind));
    }

    std::vector<int> all(static_cast<size_t>(ndims));
    for (int d = 0; d < ndims; ++d) all[static_cast<size_t>(d)] = d;
    return std::unique_ptr<Mesh>(new Mesh(std::move(st), std::move(all)));
}

void Mesh::check_dim(int dim) const {
    DSM_REQUIRE(dim >= 0 && dim < ndims(), DSM_ERR_INVALID_ARGUMENT, "dim is ", dim,
                ", the mesh has dimensions 0..", ndims() - 1);
}

int Mesh::dim_size(int dim) const {
    check_dim(dim);
    return state_->shape[static_cast<size_t>(dims_[static_cast<size_t>(dim)])];
}

int Mesh::dim_rank(int dim) const {
    check_dim(dim);
    return state_->coord(state_->position, dims_[static_cast<size_t>(dim)]);
}

const std::string &Mesh::dim_name(int dim) const {
    check_dim(dim);
    return state_->names[static_cast<size_t>(dims_[static_cast<size_t>(dim)])];
}

int Mesh::dim_index(const char *name) const {
    std::vector<std::string> known;
    for (int i = 0; i < ndims(); ++i) {
        if (dim_name(i) == name) return i;
        known.push_back(dim_name(i));
    }
    DSM_FAIL(DSM_ERR_NOT_FOUND, "no dimension named \"", name, "\" (dimensions: ", join(known, ", "), ")");
}

std::vector<int> Mesh::shape() const {
    std::vector<int> s;
    for (int d : dims_) s.push_back(state_->shape[static_cast<size_t>(d)]);
    return s;
}

std::vector<std::string> Mesh::dim_names() const {
    std::vector<std::string> v;
    for (int d : dims_) v.push_back(state_->names[static_cast<size_t>(d)]);
    return v;
}

std::vector<int> Mesh::coords() const {
    std::vector<int> c;
    for (int d : dims_) c.push_back(state_->coord(state_->position, d));
    return c;
}

Mesh::Roles Mesh::roles() const {
    const MeshState &st = *state_;
    Roles r;
    // The view's group: the ranks that share the coordinates outside the view.
    int color = 0;
    for (size_t d = 0; d < st.shape.size(); ++d)
        if (std::find(dims_.begin(), dims_.end(), static_cast<int>(d)) == dims_.end())
            color = color * st.shape[d] + st.coord(st.position, static_cast<int>(d));
    r.product = Comm::split(st.mesh_comm.get(), color, st.position);
    // Data parallel: row-major over the view's dimensions but sequence_parallel.
    int sp_dim = -1, dp_index = 0;
    for (int d : dims_)
        if (st.names[static_cast<size_t>(d)] == "sequence_parallel") sp_dim = d;
    for (int d : dims_)
        if (d != sp_dim) dp_index = dp_index * st.shape[static_cast<size_t>(d)] + st.coord(st.position, d);
    const int sp_index = sp_dim >= 0 ? st.coord(st.position, sp_dim) : 0;
    r.data_parallel = Comm::split(r.product.get(), sp_index, dp_index);
    r.sequence_parallel = Comm::split(r.product.get(), dp_index, sp_index);
    return r;
}

int Mesh::node() const { return state_->ranks[static_cast<size_t>(state_->rank)].node; }

GroupView Mesh::group(const char *name) const {
    GroupView g;
    if (name == nullptr) {
        g.dims = dims_;
        if (dims_.size() == state_->shape.size()) g.comm = state_->mesh_comm.get();
        else if (dims_.size() == 1) g.comm = state_->dim_comms[static_cast<size_t>(dims_[0])].get();
        return g;
    }
    std::vector<std::string> known;
    for (int d : dims_) {
        if (state_->names[static_cast<size_t>(d)] == name) {
            g.dims = {d};
            g.comm = state_->dim_comms[static_cast<size_t>(d)].get();
            return g;
        }
        known.push_back(state_->names[static_cast<size_t>(d)]);
    }
    for (const auto &kv : state_->flat) {
        const std::vector<int> &fd = kv.second.dims;
        if (!std::includes(dims_.begin(), dims_.end(), fd.begin(), fd.end())) continue;
        if (kv.first == name) {
            g.dims = fd;
            g.comm = kv.second.comm.get();
            return g;
        }
        known.push_back(kv.first);
    }
    DSM_FAIL(DSM_ERR_NOT_FOUND, "no dimension or flattened group named \"", name, "\" (known: ",
             join(known, ", "), ")");
}

int Mesh::group_size(const GroupView &g) const {
    int s = 1;
    for (int d : g.dims) s *= state_->shape[static_cast<size_t>(d)];
    return s;
}

int Mesh::group_rank(const GroupView &g) const {
    int r = 0;
    for (int d : g.dims) r = r * state_->shape[static_cast<size_t>(d)] + state_->coord(state_->position, d);
    return r;
}

std::vector<int> Mesh::group_ranks(const GroupView &g, int position) const {
    // Zero the group's coordinates, then enumerate them row-major.
    int base = position;
    for (int d : g.dims) base -= state_->coord(position, d) * state_->stride(d);
    std::vector<int> out;
    const int n = group_size(g);
    for (int i = 0; i < n; ++i) {
        int rest = i, pos = base;
        for (size_t k = g.dims.size(); k-- > 0;) {
            int d = g.dims[k], extent = state_->shape[static_cast<size_t>(d)];
            pos += (rest % extent) * state_->stride(d);
            rest /= extent;
        }
        out.push_back(state_->placement.rank_of_position[static_cast<size_t>(pos)]);
    }
    return out;
}

std::vector<int> Mesh::resolve_dims(int nnames, const char *const names[], const char *what) const {
    DSM_ARG_NOT_NULL(names);
    DSM_REQUIRE(nnames >= 1 && nnames <= ndims(), DSM_ERR_INVALID_ARGUMENT, "nnames is ", nnames,
                ", must be 1..", ndims(), " (the dimensions of the mesh)");
    std::vector<int> out;
    for (int i = 0; i < nnames; ++i) {
        DSM_REQUIRE(names[i] != nullptr, DSM_ERR_NULL_POINTER, "names[", i, "] is NULL");
        int local = dim_index(names[i]);
        int d = dims_[static_cast<size_t>(local)];
        if (!out.empty()) {
            DSM_REQUIRE(d != out.back() && std::find(out.begin(), out.end(), d) == out.end(),
                        DSM_ERR_INVALID_ARGUMENT, what, ": \"", names[i], "\" is named twice");
            DSM_REQUIRE(d > out.back(), DSM_ERR_INVALID_ARGUMENT, what,
                        ": names must follow the mesh order (", join(dim_names(), ", "), "): \"",
                        names[i], "\" comes before \"", state_->names[static_cast<size_t>(out.back())], "\"");
        }
        out.push_back(d);
    }
    return out;
}

std::unique_ptr<Mesh> Mesh::slice(int nnames, const char *const names[]) const {
    return std::unique_ptr<Mesh>(new Mesh(state_, resolve_dims(nnames, names, "slice")));
}

MPI_Comm Mesh::flatten(int nnames, const char *const names[], const char *flat_name) {
    MPI_Comm mc = state_->mesh_comm.get();
    std::vector<int> fd;
    agree(mc, [&] {
        fd = resolve_dims(nnames, names, "flatten");
        DSM_ARG_NOT_NULL(flat_name);
        check_name(flat_name, "flat_name");
        for (const std::string &n : state_->names)
            DSM_REQUIRE(n != flat_name, DSM_ERR_INVALID_ARGUMENT, "flat_name \"", flat_name,
                        "\" clashes with a dimension of the mesh");
        auto it = state_->flat.find(flat_name);
        if (it != state_->flat.end()) {
            std::vector<std::string> had;
            for (int d : it->second.dims) had.push_back(state_->names[static_cast<size_t>(d)]);
            DSM_REQUIRE(it->second.dims == fd, DSM_ERR_INVALID_ARGUMENT, "flat_name \"", flat_name,
                        "\" clashes with the flattened group of the same name over (", join(had, ", "), ")");
        }
    });
    std::vector<std::string> fnames;
    for (int d : fd) fnames.push_back(state_->names[static_cast<size_t>(d)]);
    agree_same(mc, "dsm_mesh_flatten arguments", cat("[", join(fnames), "] as ", flat_name));
    auto it = state_->flat.find(flat_name);
    if (it != state_->flat.end()) return it->second.comm.get();

    GroupView g;
    g.dims = fd;
    int color = state_->position;
    for (int d : fd) color -= state_->coord(state_->position, d) * state_->stride(d);
    FlatGroup fg;
    fg.dims = fd;
    fg.comm = Comm::split(mc, color, group_rank(g));
    MPI_Comm out = fg.comm.get();
    state_->flat.emplace(flat_name, std::move(fg));
    DSM_INFO(MESH, "flattened (%s) into group %s", join(fnames, ", ").c_str(), flat_name);
    return out;
}

} // namespace dsm

DSM_PARAM_LINK(mesh)
