// The watchdog's table for the MPI profiling-interface layer
// (watch_hooks.h): the program's own blocking MPI calls as waits of the
// watchdog, each on the group of its communicator (described once per
// communicator and kept until MPI_Comm_free).
#include "dsm_config.h"

#include <atomic>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/watch_hooks.h"
#include "core/watchdog.hpp"
#include "dsm.h"

namespace dsm {
namespace watchdog {
namespace {

struct Groups {
    std::mutex mu;
    std::map<MPI_Comm, std::unique_ptr<Group>> by_comm;
    std::atomic<uint64_t> epoch{1}; // bumped by forget(): the threads' one-entry caches are stale then
};

Groups &groups() {
    static Groups *g = new Groups; // never destroyed: the watchdog thread may read a Group at exit
    return *g;
}

// What the program calls the communicator: its MPI name, else its size.
std::string comm_label(MPI_Comm comm, int size) {
    if (comm == MPI_COMM_WORLD) return "MPI_COMM_WORLD";
    if (comm == MPI_COMM_SELF) return "MPI_COMM_SELF";
    char name[MPI_MAX_OBJECT_NAME] = "";
    int len = 0;
    if (MPI_Comm_get_name(comm, name, &len) == MPI_SUCCESS && len > 0) return std::string(name, static_cast<size_t>(len));
    return cat("a communicator of ", size, " ranks");
}

// The last communicator this thread waited on (one thread-local lookup).
struct LastGroup {
    MPI_Comm comm = MPI_COMM_NULL;
    const Group *group = nullptr;
    uint64_t epoch = 0;
};
thread_local LastGroup tl_last;

const Group *group_of(MPI_Comm comm) {
    if (comm == MPI_COMM_NULL) return nullptr;
    LastGroup &last = tl_last;
    Groups &gs = groups();
    const uint64_t epoch = gs.epoch.load(std::memory_order_acquire);
    if (comm == last.comm && epoch == last.epoch) return last.group;
    std::lock_guard<std::mutex> lock(gs.mu);
    std::unique_ptr<Group> &g = gs.by_comm[comm];
    if (!g) {
        int inter = 0;
        g.reset(new Group);
        if (MPI_Comm_test_inter(comm, &inter) == MPI_SUCCESS && !inter) {
            g->describe(comm, std::string(), std::string());
            g->label = comm_label(comm, g->size);
        } else {
            g->label = "an intercommunicator";
        }
    }
    last = LastGroup{comm, g.get(), epoch};
    return last.group;
}

int hook_start(void) {
    try {
        if (!watch_mpi()) return 0; // DSM_WATCH_MPI=0: the wrappers stay off (running() says whether the watchdog runs)
        start();
        return 0;
    } catch (const Error &e) {
        std::fprintf(stderr, "libdsm_mpiwatch: %s\n", e.what());
        return -1;
    }
}

int hook_running(void) {
    try {
        return running() && watch_mpi() ? 1 : 0;
    } catch (const Error &) {
        return 0;
    }
}

void *hook_enter(const char *call, MPI_Comm comm, const char *peer_role, int peer) {
    if (!running()) return nullptr;
    const bool named_peer = peer_role != nullptr && peer >= 0;
    return open_program_wait("the program's own MPI call (outside libdsm)", named_peer ? peer_role : nullptr,
                             named_peer ? peer : -1, call, group_of(comm));
}

void hook_leave(void *token) { close_program_wait(token); }

void hook_forget(MPI_Comm comm) {
    Groups &gs = groups();
    std::lock_guard<std::mutex> lock(gs.mu);
    auto it = gs.by_comm.find(comm);
    if (it == gs.by_comm.end()) return;
    // Kept alive (a record may still point at it): moved aside, never freed.
    static std::vector<std::unique_ptr<Group>> *retired = new std::vector<std::unique_ptr<Group>>;
    retired->push_back(std::move(it->second));
    gs.by_comm.erase(it);
    gs.epoch.fetch_add(1, std::memory_order_acq_rel);
}

} // namespace
} // namespace watchdog
} // namespace dsm

extern "C" DSM_API const struct dsm_watch_hooks dsm_watch_hooks_v1 = {
    DSM_WATCH_HOOKS_VERSION,   dsm::watchdog::hook_start, dsm::watchdog::hook_running,
    dsm::watchdog::hook_enter, dsm::watchdog::hook_leave, dsm::watchdog::hook_forget,
};
