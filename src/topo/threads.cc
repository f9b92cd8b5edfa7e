// The threads of a rank's CPU kernels: DSM_NUM_THREADS, OMP_NUM_THREADS,
// the CPU binding, or an even share of the node's cores.
#include "dsm_config.h"

#include "topo/threads.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <string>

#include <sched.h>
#include <unistd.h>


#include "core/error.hpp"
#include "core/log.hpp"
#include "core/param.hpp"
#include "topo/hwloc_topology.hpp"

namespace dsm::topo {

namespace {

DSM_PARAM(topo, NUM_THREADS, param::Int(1, 65536, "a thread count 1..65536"), "",
          "Threads of each rank's CPU kernels (optimizer, conversions, checksums) and of OpenMP in the "
          "program, set at engine creation. Empty: OMP_NUM_THREADS when it is set, else the cores of the "
          "rank's CPU binding, else the node's cores divided by the ranks on the node.");

// CPUs in the process's affinity mask (the binding without hwloc).
int affinity_cpus() {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) != 0) return -1;
    return CPU_COUNT(&set);
}

// The first number of OMP_NUM_THREADS ("8" or "8,2"), 0 when unset or not a
// number. OpenMP's variable, not one of libdsm's: the parameter registry
// holds DSM_ names only (test_param), so this one read stays outside it.
int omp_env_threads() {
    const char *v = std::getenv("OMP_NUM_THREADS");
    if (v == nullptr) return 0;
    const long n = std::strtol(v, nullptr, 10);
    return n > 0 && n <= 65536 ? static_cast<int>(n) : 0;
}

} // namespace

CoreProbe probe_cores() {
    CoreProbe p;
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    p.node_cores = online > 0 ? static_cast<int>(online) : 1;
    const int mine = affinity_cpus();
    p.bound_cores = mine > 0 ? mine : p.node_cores;
    p.bound = mine > 0 && mine < p.node_cores;
#if DSM_HAVE_HWLOC
    try {
        // Cores, not hardware threads: one compute thread per core.
        const Topology topo(false);
        const int cores = hwloc_get_nbobjs_by_type(topo.get(), HWLOC_OBJ_CORE);
        Bitmap set;
        if (cores > 0) {
            p.node_cores = cores;
            if (hwloc_get_cpubind(topo.get(), set.get(), HWLOC_CPUBIND_PROCESS) == 0) {
                const int in = hwloc_get_nbobjs_inside_cpuset_by_type(topo.get(), set.get(), HWLOC_OBJ_CORE);
                // A binding to part of a core still has that core.
                p.bound_cores = std::max(1, in);
                p.bound = !hwloc_bitmap_isincluded(hwloc_topology_get_topology_cpuset(topo.get()), set.get());
                if (p.bound && in == 0) p.bound_cores = 1;
            }
        }
    } catch (const Error &) {
        // No topology: the counts above stand.
    }
#endif
    return p;
}

ThreadChoice choose_threads(int dsm_threads, int omp_threads, const CoreProbe &cores, int local_size) {
    if (dsm_threads > 0) return {dsm_threads, "DSM_NUM_THREADS"};
    if (omp_threads > 0) return {omp_threads, "OMP_NUM_THREADS"};
    if (cores.bound) return {std::max(1, cores.bound_cores), "binding"};
    return {std::max(1, cores.node_cores / std::max(1, local_size)), "node share"};
}

ThreadChoice decide_threads(int local_size, bool warn) {
    const int dsm_threads = static_cast<int>(param_NUM_THREADS().value());
    const CoreProbe cores = probe_cores();
    const ThreadChoice c = choose_threads(dsm_threads, omp_env_threads(), cores, local_size);
    DSM_INFO(INIT, "threads: %d per rank (%s; %d ranks on a node of %d cores%s)", c.threads, c.source.c_str(),
             local_size, cores.node_cores,
             cores.bound ? (", bound to " + std::to_string(cores.bound_cores) + " cores").c_str() : "");
    static std::atomic<bool> warned{false};
    // (One thread per rank on more ranks than cores is the launch's
    // oversubscription, not the threads'.)
    if (warn && c.threads > 1 && static_cast<long>(local_size) * c.threads > cores.node_cores &&
        !warned.exchange(true))
        DSM_WARN(INIT,
                 "threads: %d ranks x %d threads (%s) on a node of %d cores: the threads oversubscribe the cores "
                 "(unset it, or set DSM_NUM_THREADS or OMP_NUM_THREADS to at most %d)",
                 local_size, c.threads, c.source.c_str(), cores.node_cores,
                 std::max(1, cores.node_cores / std::max(1, local_size)));
    return c;
}

} // namespace dsm::topo

DSM_PARAM_LINK(topo_threads)
