#include "dsm_config.h"

#include "topo/locality.hpp"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>

#include "core/agree.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/param.hpp"

namespace dsm::topo {

namespace {

DSM_PARAM(sim, SIM_NODES, param::Text(), "",
          "Testing: pretend the ranks run on these nodes. A node name per rank, comma separated "
          "(a,a,b,b), or COUNT:block or COUNT:cyclic for COUNT nodes filled as Slurm's block or cyclic "
          "distribution would.");
DSM_PARAM(sim, SIM_NUMA, param::Text(), "",
          "Testing: pretend each rank is bound to this NUMA domain; a domain number per rank, comma "
          "separated.");
DSM_PARAM(sim, SIM_GPUS, param::Int(0, INT_MAX, "an integer >= 0", -1), "",
          "Testing: pretend every node has this many GPUs.");

constexpr int kHostMax = 64;

struct Exchange {
    int key;   // node key: lowest rank of the node (real nodes) or -1 (simulated)
    int numa;
    int gpus;
    char host[kHostMax];
};

std::vector<std::string> split_commas(const std::string &s) {
    std::vector<std::string> out;
    size_t pos = 0;
    while (true) {
        size_t end = s.find(',', pos);
        out.push_back(s.substr(pos, end == std::string::npos ? std::string::npos : end - pos));
        if (end == std::string::npos) break;
        pos = end + 1;
    }
    return out;
}

int parse_int(const std::string &text, const char *var, int min) {
    errno = 0;
    char *end = nullptr;
    long v = std::strtol(text.c_str(), &end, 10);
    DSM_REQUIRE(!text.empty() && *end == '\0' && errno == 0 && v >= min && v <= INT_MAX,
                DSM_ERR_INVALID_ARGUMENT, "environment ", var, ": \"", text,
                "\" is not an integer >= ", min);
    return static_cast<int>(v);
}

// The simulated node name of `rank`, from DSM_SIM_NODES.
std::string sim_node(const std::string &spec, int rank, int size) {
    size_t colon = spec.find(':');
    if (colon != std::string::npos) {
        int count = parse_int(spec.substr(0, colon), "DSM_SIM_NODES count", 1);
        std::string order = spec.substr(colon + 1);
        int node = 0;
        if (order == "block") {
            // As Slurm's block distribution: consecutive ranks, the first
            // size % count nodes one rank more than the others.
            int base = size / count, extra = size % count, boundary = extra * (base + 1);
            node = rank < boundary ? rank / (base + 1) : extra + (base > 0 ? (rank - boundary) / base : 0);
        } else if (order == "cyclic") {
            node = rank % count;
        } else {
            DSM_FAIL(DSM_ERR_INVALID_ARGUMENT, "environment DSM_SIM_NODES=\"", spec,
                     "\": expected COUNT:block or COUNT:cyclic, got order \"", order, "\"");
        }
        return cat("simnode", node);
    }
    std::vector<std::string> names = split_commas(spec);
    DSM_REQUIRE(static_cast<int>(names.size()) == size, DSM_ERR_INVALID_ARGUMENT,
                "environment DSM_SIM_NODES=\"", spec, "\" names ", names.size(),
                " nodes, one per rank is needed: ", size);
    const std::string &n = names[static_cast<size_t>(rank)];
    DSM_REQUIRE(!n.empty() && n.size() < kHostMax, DSM_ERR_INVALID_ARGUMENT,
                "environment DSM_SIM_NODES: the node name of rank ", rank, " (\"", n,
                "\") must have 1 to ", kHostMax - 1, " characters");
    return n;
}

} // namespace

std::vector<RankInfo> discover(MPI_Comm comm) {
    int rank = 0, size = 0;
    DSM_CHECK_MPI(MPI_Comm_rank(comm, &rank));
    DSM_CHECK_MPI(MPI_Comm_size(comm, &size));

    // Real node key: the lowest rank sharing memory with this one.
    int key = rank;
    {
        MPI_Comm shared = MPI_COMM_NULL;
        DSM_CHECK_MPI(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &shared));
        int rc = MPI_Allreduce(&rank, &key, 1, MPI_INT, MPI_MIN, shared);
        MPI_Comm_free(&shared);
        DSM_CHECK_MPI(rc);
    }

    Exchange mine{};
    bool simulated = param_SIM_NODES().is_set();
    agree(comm, [&] {
        std::string host;
        if (simulated) {
            host = sim_node(param_SIM_NODES().value(), rank, size);
            mine.key = -1;
        } else {
            char name[MPI_MAX_PROCESSOR_NAME];
            int len = 0;
            DSM_CHECK_MPI(MPI_Get_processor_name(name, &len));
            host.assign(name, static_cast<size_t>(len));
            mine.key = key;
        }
        std::strncpy(mine.host, host.c_str(), kHostMax - 1);
        SelfProbe probe;
        const bool sim_numa = param_SIM_NUMA().is_set(), sim_gpus = param_SIM_GPUS().is_set();
        if (!sim_numa || !sim_gpus) probe = probe_self();
        if (sim_numa) {
            const std::string spec = param_SIM_NUMA().value();
            std::vector<std::string> numa = split_commas(spec);
            DSM_REQUIRE(static_cast<int>(numa.size()) == size, DSM_ERR_INVALID_ARGUMENT,
                        "environment DSM_SIM_NUMA=\"", spec, "\" gives ",
                        numa.size(), " domains, one per rank is needed: ", size);
            mine.numa = parse_int(numa[static_cast<size_t>(rank)], "DSM_SIM_NUMA", 0);
        } else {
            mine.numa = probe.numa;
        }
        mine.gpus = sim_gpus ? static_cast<int>(param_SIM_GPUS().value()) : probe.gpus;
    });

    std::vector<Exchange> all(static_cast<size_t>(size));
    DSM_CHECK_MPI(MPI_Allgather(&mine, sizeof(Exchange), MPI_BYTE, all.data(), sizeof(Exchange),
                                MPI_BYTE, comm));

    std::vector<RankInfo> out(static_cast<size_t>(size));
    std::map<std::string, int> first_of_host;
    for (int r = 0; r < size; ++r) {
        Exchange &e = all[static_cast<size_t>(r)];
        e.host[kHostMax - 1] = '\0';
        if (simulated) {
            auto it = first_of_host.emplace(e.host, r).first;
            e.key = it->second;
        }
    }
    // Nodes numbered by their lowest rank; local ranks by rank.
    std::map<int, int> node_of_key, count_of_key;
    for (int r = 0; r < size; ++r) {
        const Exchange &e = all[static_cast<size_t>(r)];
        node_of_key.emplace(e.key, 0);
    }
    int n = 0;
    for (auto &kv : node_of_key) kv.second = n++;
    for (int r = 0; r < size; ++r) {
        const Exchange &e = all[static_cast<size_t>(r)];
        RankInfo &ri = out[static_cast<size_t>(r)];
        ri.rank = r;
        ri.host = e.host;
        ri.node = node_of_key[e.key];
        ri.local_rank = count_of_key[e.key]++;
        ri.numa = e.numa;
        ri.node_gpus = e.gpus;
    }
    for (RankInfo &ri : out) ri.local_size = count_of_key[all[static_cast<size_t>(ri.rank)].key];
    DSM_TRACE(TOPO, "rank %d: host %s node %d local %d/%d numa %d gpus %d", rank,
              out[static_cast<size_t>(rank)].host.c_str(), out[static_cast<size_t>(rank)].node,
              out[static_cast<size_t>(rank)].local_rank, out[static_cast<size_t>(rank)].local_size,
              mine.numa, mine.gpus);
    return out;
}

} // namespace dsm::topo

DSM_PARAM_LINK(topo_locality)
