#include "dsm_config.h"

#include "topo/hwloc_topology.hpp"

#if DSM_HAVE_HWLOC
#include <new>

#include "core/error.hpp"

namespace dsm::topo {

Topology::Topology(bool io) {
    DSM_CHECK_HWLOC(hwloc_topology_init(&topo_));
    if (io) hwloc_topology_set_io_types_filter(topo_, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    if (hwloc_topology_load(topo_) < 0) {
        hwloc_topology_destroy(topo_);
        DSM_FAIL(DSM_ERR_HWLOC, "hwloc_topology_load failed");
    }
}

Topology::~Topology() { hwloc_topology_destroy(topo_); }

int Topology::bound_numa() const {
    Bitmap set;
    if (hwloc_get_cpubind(topo_, set.get(), HWLOC_CPUBIND_PROCESS) < 0) return -1;
    int found = -1;
    hwloc_obj_t numa = nullptr;
    while ((numa = hwloc_get_next_obj_by_type(topo_, HWLOC_OBJ_NUMANODE, numa)) != nullptr) {
        if (numa->cpuset == nullptr || !hwloc_bitmap_intersects(numa->cpuset, set.get())) continue;
        if (found >= 0) return -1; // spans several domains
        found = static_cast<int>(numa->logical_index);
    }
    return found;
}

std::vector<hwloc_const_cpuset_t> Topology::gpu_cpusets() const {
    std::vector<hwloc_const_cpuset_t> out;
    hwloc_obj_t pci = nullptr;
    while ((pci = hwloc_get_next_pcidev(topo_, pci)) != nullptr) {
        unsigned cls = pci->attr->pcidev.class_id >> 8;
        if (pci->attr->pcidev.vendor_id != 0x10de || cls != 0x03) continue;
        hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(topo_, pci);
        out.push_back(anc != nullptr ? anc->cpuset : hwloc_topology_get_topology_cpuset(topo_));
    }
    return out;
}

} // namespace dsm::topo
#endif
