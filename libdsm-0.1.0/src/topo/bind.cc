#include "dsm_config.h"

#include "topo/bind.hpp"

#include <cstdlib>

#include "core/error.hpp"
#include "core/log.hpp"
#include "topo/hwloc_topology.hpp"
#include "topo/locality.hpp"

namespace dsm::topo {

#if DSM_HAVE_HWLOC

SelfProbe probe_self() {
    Topology topo(true);
    SelfProbe p;
    p.numa = topo.bound_numa();
    p.gpus = static_cast<int>(topo.gpu_cpusets().size());
    return p;
}

std::string bind_self(dsm_bind_t mode, int index, int count, int gpu) {
    Topology topo(mode == DSM_BIND_GPU);
    Bitmap set;
    std::vector<hwloc_const_cpuset_t> gpus;
    if (mode == DSM_BIND_GPU) gpus = topo.gpu_cpusets();
    if (mode == DSM_BIND_GPU && gpu >= 0 && gpu < static_cast<int>(gpus.size())) {
        hwloc_bitmap_copy(set.get(), gpus[static_cast<size_t>(gpu)]);
    } else {
        if (mode == DSM_BIND_GPU)
            DSM_INFO(TOPO, "DSM_BIND_GPU: no GPU for this rank; binding to an even share of the node");
        int ncores = hwloc_get_nbobjs_by_type(topo.get(), HWLOC_OBJ_CORE);
        hwloc_obj_type_t type = HWLOC_OBJ_CORE;
        if (ncores <= 0) {
            type = HWLOC_OBJ_PU;
            ncores = hwloc_get_nbobjs_by_type(topo.get(), type);
        }
        DSM_REQUIRE(ncores > 0, DSM_ERR_HWLOC, "hwloc found no cores to bind to");
        int first = 0, last = 0; // [first, last)
        if (count <= ncores) {
            first = static_cast<int>(static_cast<long>(index) * ncores / count);
            last = static_cast<int>(static_cast<long>(index + 1) * ncores / count);
        } else {
            first = index % ncores;
            last = first + 1;
        }
        for (int c = first; c < last; ++c) {
            hwloc_obj_t core = hwloc_get_obj_by_type(topo.get(), type, static_cast<unsigned>(c));
            if (core != nullptr && core->cpuset != nullptr) hwloc_bitmap_or(set.get(), set.get(), core->cpuset);
        }
    }
    DSM_CHECK_HWLOC(hwloc_set_cpubind(topo.get(), set.get(), HWLOC_CPUBIND_PROCESS));
    char *text = nullptr;
    hwloc_bitmap_list_asprintf(&text, set.get());
    std::string out = text != nullptr ? text : "?";
    std::free(text);
    return out;
}

#else

SelfProbe probe_self() { return SelfProbe(); }

std::string bind_self(dsm_bind_t mode, int, int, int) {
    DSM_FAIL(DSM_ERR_NOT_SUPPORTED, "CPU binding (", mode == DSM_BIND_GPU ? "gpu" : "spread",
             ") needs hwloc: rebuild libdsm --with-hwloc");
}

#endif

} // namespace dsm::topo
