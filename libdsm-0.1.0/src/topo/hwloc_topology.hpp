// RAII wrapper of an hwloc topology of this host, with the few queries the
// placement needs. Only built with hwloc.
#pragma once

#include "dsm_config.h"

#if DSM_HAVE_HWLOC
#include <hwloc.h>

#include <vector>

namespace dsm::topo {

class Topology {
public:
    // Load this host's topology; with `io` also the PCI devices (for GPUs).
    explicit Topology(bool io);
    ~Topology();
    Topology(const Topology &) = delete;
    Topology &operator=(const Topology &) = delete;

    hwloc_topology_t get() const noexcept { return topo_; }

    // Logical index of the one NUMA node the process is bound to, -1 when
    // its binding spans several (or none).
    int bound_numa() const;
    // NVIDIA GPUs (PCI display/3D controllers), in PCI bus order, as the
    // cpusets nearest each (owned by the topology).
    std::vector<hwloc_const_cpuset_t> gpu_cpusets() const;

private:
    hwloc_topology_t topo_ = nullptr;
};

// RAII bitmap.
class Bitmap {
public:
    Bitmap() : b_(hwloc_bitmap_alloc()) {}
    ~Bitmap() { hwloc_bitmap_free(b_); }
    Bitmap(const Bitmap &) = delete;
    Bitmap &operator=(const Bitmap &) = delete;
    hwloc_bitmap_t get() const noexcept { return b_; }

private:
    hwloc_bitmap_t b_;
};

} // namespace dsm::topo
#endif
