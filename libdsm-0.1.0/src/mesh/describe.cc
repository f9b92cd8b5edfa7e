// dsm_mesh_describe(): the placement of every rank as a table or as JSON.
// The JSON format is specified in doc/dsm-info.md; change both together.
#include "dsm_config.h"

#include <algorithm>
#include <iomanip>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "mesh/mesh.hpp"

namespace dsm {

namespace {

struct NamedGroup {
    std::string name;
    GroupView view;
};

// The handle's dimensions, then the flattened groups it can see.
std::vector<NamedGroup> visible_groups(const Mesh &m) {
    std::vector<NamedGroup> out;
    for (int i = 0; i < m.ndims(); ++i) out.push_back({m.dim_name(i), m.group(m.dim_name(i).c_str())});
    for (const auto &kv : m.state().flat) {
        try {
            out.push_back({kv.first, m.group(kv.first.c_str())});
        } catch (const Error &) {
            // Not over this slice's dimensions.
        }
    }
    return out;
}

std::vector<int> coords_at(const Mesh &m, int position) {
    const MeshState &st = m.state();
    std::vector<int> c;
    for (int i = 0; i < m.ndims(); ++i) c.push_back(st.coord(position, m.group(m.dim_name(i).c_str()).dims[0]));
    return c;
}

} // namespace

std::string Mesh::describe(dsm_format_t format) const {
    DSM_REQUIRE(format == DSM_FORMAT_TEXT || format == DSM_FORMAT_JSON, DSM_ERR_INVALID_ARGUMENT,
                "format ", static_cast<int>(format), " is not DSM_FORMAT_TEXT or DSM_FORMAT_JSON");
    const MeshState &st = *state_;
    const std::vector<NamedGroup> groups = visible_groups(*this);
    const int size = static_cast<int>(st.ranks.size());
    int nnodes = 0;
    for (const auto &ri : st.ranks) nnodes = std::max(nnodes, ri.node + 1);
    const char *placement = st.placement_mode == DSM_PLACEMENT_NODE ? "node" : "none";

    if (format == DSM_FORMAT_JSON) {
        using json = nlohmann::ordered_json;
        json j;
        j["format"] = "dsm-mesh";
        j["format_version"] = 1;
        j["ndims"] = ndims();
        j["shape"] = shape();
        j["names"] = dim_names();
        if (dims_.size() != st.shape.size())
            j["slice_of"] = {{"shape", st.shape}, {"names", st.names}};
        j["size"] = size;
        j["placement"] = placement;
        j["nnodes"] = nnodes;
        json within = json::object();
        for (int i = 0; i < ndims(); ++i)
            within[dim_name(i)] = static_cast<bool>(st.within_node[static_cast<size_t>(dims_[static_cast<size_t>(i)])]);
        j["within_node"] = within;
        json gnames = json::array();
        for (const auto &g : groups) gnames.push_back(g.name);
        j["groups"] = gnames;
        json ranks = json::array();
        for (int r = 0; r < size; ++r) {
            const topo::RankInfo &ri = st.ranks[static_cast<size_t>(r)];
            int pos = st.placement.position_of_rank[static_cast<size_t>(r)];
            json e;
            e["rank"] = r;
            e["host"] = ri.host;
            e["node"] = ri.node;
            e["local_rank"] = ri.local_rank;
            e["numa"] = ri.numa;
            e["gpu"] = st.placement.gpu_of_rank[static_cast<size_t>(r)];
            e["position"] = pos;
            e["coords"] = coords_at(*this, pos);
            json gr = json::object();
            for (const auto &g : groups) {
                std::vector<int> members = group_ranks(g.view, pos);
                std::sort(members.begin(), members.end());
                gr[g.name] = members;
            }
            e["groups"] = gr;
            ranks.push_back(e);
        }
        j["ranks"] = ranks;
        return j.dump(2) + "\n";
    }

    std::ostringstream os;
    os << "mesh";
    for (int i = 0; i < ndims(); ++i)
        os << (i ? " x " : " ") << dim_name(i) << "=" << dim_size(i);
    if (dims_.size() != st.shape.size()) {
        os << " (slice of";
        for (size_t d = 0; d < st.shape.size(); ++d) os << (d ? " x " : " ") << st.names[d] << "=" << st.shape[d];
        os << ")";
    }
    os << ", " << size << " ranks on " << nnodes << (nnodes == 1 ? " node" : " nodes")
       << ", placement " << placement << "\n";
    // Cells first, so that every column can be as wide as its widest cell.
    std::vector<std::vector<std::string>> cells(static_cast<size_t>(size));
    std::vector<size_t> width;
    for (const auto &g : groups) width.push_back(g.name.size());
    for (int r = 0; r < size; ++r) {
        int pos = st.placement.position_of_rank[static_cast<size_t>(r)];
        for (size_t k = 0; k < groups.size(); ++k) {
            std::vector<int> members = group_ranks(groups[k].view, pos);
            std::sort(members.begin(), members.end());
            std::string list = "[";
            for (size_t i = 0; i < members.size(); ++i) list += (i ? "," : "") + std::to_string(members[i]);
            list += "]";
            width[k] = std::max(width[k], list.size());
            cells[static_cast<size_t>(r)].push_back(list);
        }
    }
    os << std::setw(5) << "rank" << "  " << std::left << std::setw(16) << "host" << std::right
       << std::setw(5) << "node" << std::setw(5) << "numa" << std::setw(5) << "gpu" << "  "
       << std::left << std::setw(12) << "coords";
    for (size_t k = 0; k < groups.size(); ++k)
        os << "  " << std::setw(static_cast<int>(width[k])) << groups[k].name;
    os << std::right << "\n";
    for (int r = 0; r < size; ++r) {
        const topo::RankInfo &ri = st.ranks[static_cast<size_t>(r)];
        int pos = st.placement.position_of_rank[static_cast<size_t>(r)];
        std::string coords = "(";
        std::vector<int> c = coords_at(*this, pos);
        for (size_t i = 0; i < c.size(); ++i) coords += (i ? "," : "") + std::to_string(c[i]);
        coords += ")";
        auto opt = [](int v) { return v < 0 ? std::string("-") : std::to_string(v); };
        os << std::setw(5) << r << "  " << std::left << std::setw(16) << ri.host << std::right
           << std::setw(5) << ri.node << std::setw(5) << opt(ri.numa) << std::setw(5)
           << opt(st.placement.gpu_of_rank[static_cast<size_t>(r)]) << "  " << std::left
           << std::setw(12) << coords;
        for (size_t k = 0; k < groups.size(); ++k)
            os << "  " << std::setw(static_cast<int>(width[k])) << cells[static_cast<size_t>(r)][k];
        os << std::right << "\n";
    }
    return os.str();
}

} // namespace dsm
