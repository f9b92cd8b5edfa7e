// The watchdog: no blocking wait of libdsm lasts for ever. A peer that stops
// answering (a stalled or stopped rank, a node whose link went down) would
// leave the others inside a collective with no message at all; instead,
// after DSM_COMM_TIMEOUT seconds in one wait, the waiting rank prints one
// message naming the wait and ends the job through the launcher with exit
// status kExitStatus (MPI_Abort), so that a requeue restarts it from the last
// checkpoint.
//
// Cost on the hot path: none that the collectives would notice. A wait marks
// itself in a record of its own thread (WaitScope: a few stores into memory
// only that thread writes, and one counter bumped), with no clock read, no
// system call and no message. One watchdog thread per process, started by
// start(), looks at the records every poll interval (a tenth of the timeout,
// at most one second): a record whose counter has not moved since the
// watchdog first saw it waiting, for the timeout, has timed out. So the
// timestamp is the watchdog's, and a wait is ended between timeout and
// timeout + one interval after it began.
//
// What the message says (one block on stderr):
//   - the rank (in MPI_COMM_WORLD), its host and process id;
//   - the call, as the layers above named it (Context: "dsm_step: gradient
//     reduce-scatter, bucket 3") and the backend's operation (WaitScope:
//     "shm reduce_scatterv");
//   - the group (Group: the mesh dimension or role, its size, this rank's
//     place in it) and the step and micro-step (set_step);
//   - the ranks that did not arrive, where the backend knows them (the shm
//     backend's arrival counters in node-shared memory), else that MPI does
//     not say, with the members; with the host of each rank named;
//   - that a rank busy in the program's own code for this long looks the same
//     as a stalled rank.
//
// Ending the job: a wait blocked inside MPI cannot be interrupted from
// inside, so the watchdog thread itself calls MPI_Abort(MPI_COMM_WORLD,
// kExitStatus). At MPI_THREAD_MULTIPLE that call from a second thread is
// what the standard allows; below it (the examples ask for
// MPI_THREAD_FUNNELED) the standard does not cover it, and Open MPI and MPICH
// hand the abort to the launcher's PMIx server, which ends every process of
// the job. Either way, in case MPI_Abort itself blocks (a lock the stuck
// thread holds), a second thread calls _exit(kExitStatus) after a grace of 5
// seconds, so the process always ends; its launcher then ends the others.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <mpi.h>

namespace dsm {
namespace watchdog {

// The exit status of a job the watchdog ended (EX_TEMPFAIL of sysexits.h: a
// temporary failure, worth a restart).
constexpr int kExitStatus = 75;

// DSM_COMM_TIMEOUT in seconds (0: no limit); the old name DSM_NCCL_TIMEOUT
// is read when DSM_COMM_TIMEOUT is not set. DSM_ERR_INVALID_ARGUMENT for a
// malformed value (naming the variable).
int64_t timeout_seconds();

// Reads the timeout (throws as timeout_seconds()) and starts the watchdog
// thread once per process when it is not 0. Local; called where the groups
// are made (mesh creation, backend creation), so that a malformed value
// fails there, on every rank alike.
void start();

// Whether the watchdog runs (start() found a timeout).
bool running() noexcept;

// DSM_WATCH_MPI: whether the MPI profiling layer should watch the program's
// calls (unset or 1). Throws DSM_ERR_INVALID_ARGUMENT for a malformed value.
bool watch_mpi();

// The host of each rank of MPI_COMM_WORLD as far as known (from a mesh's
// discovery, by its parent's ranks: `world` translates them). Local.
void note_hosts(const std::vector<int> &world, const std::vector<std::string> &hosts);

// The members of a group, for the message. Made once, where the group is
// made (describe(): local calls only). `arrivals`, when set (the shm
// backend), returns the group ranks that have not arrived at the wait this
// rank is in, and whether it could tell; it runs on the watchdog thread and
// reads only memory.
struct Group {
    std::string label;          // what the group is: "data_parallel", "hpZ group", ...
    std::string backend;        // "mpi", "shm", "nccl"
    int size = 0, rank = 0;     // the group's size and this rank's place in it
    std::vector<int> world;     // the world rank of each member, by group rank
    std::function<bool(std::vector<int> *missing, std::string *note)> arrivals;

    // Fills size, rank and world from `comm` (MPI_Comm_group and
    // MPI_Group_translate_ranks: no communication).
    void describe(MPI_Comm comm, std::string label, std::string backend);
};

// The step and micro-step the messages name (the engine sets them at each
// dsm_step: two stores).
void set_step(int64_t step, int64_t micro_step) noexcept;

// What the layers above a backend are doing on this thread ("dsm_step",
// then inside it "gradient reduce-scatter" with index_name "bucket" and
// index 3: the message says "dsm_step: gradient reduce-scatter, bucket 3").
// Contexts nest (up to kLevels deep; deeper ones are not named) and each
// restores the outer one when it ends. `what` and `index_name` must be
// static strings; index_name NULL: no index.
constexpr int kLevels = 4;
constexpr int kNote = 160; // a level's note: up to kNote - 1 characters (longer ones are cut with "...")
class Context {
public:
    explicit Context(const char *what, const char *index_name = nullptr, int64_t index = -1) noexcept;
    // With a note the message adds after the index in parentheses (a
    // bucket's parameters: "parameters 3 [0+64], 4"); copied.
    Context(const char *what, const char *index_name, int64_t index, const std::string &note) noexcept;
    ~Context();
    Context(const Context &) = delete;
    Context &operator=(const Context &) = delete;

    // The contexts of this thread, to carry to another thread (the progress
    // thread runs a task under the contexts it was submitted in).
    struct Level {
        const char *what = nullptr, *index_name = nullptr;
        int64_t index = -1;
        char note[kNote] = {};
    };
    struct Saved {
        int depth = 0;
        Level levels[kLevels];
    };
    static Saved current() noexcept;
    // Runs under `saved` (replacing this thread's contexts) until it ends.
    explicit Context(const Saved &saved) noexcept;

private:
    Saved prev_;
    bool whole_ = false; // this object replaced the whole stack
};

// A blocking wait of this thread on `group` (NULL: not known), named `op` (a
// static string: "reduce_scatterv", "agreement"). While one is open the
// watchdog watches this thread; progress() tells it that the wait moved on
// (a phase completed). Nested scopes name the innermost operation and group.
// `self_timed`: the wait ends itself at the timeout (the nccl backend aborts
// its communicator, then calls expire()); the watchdog then only steps in
// 5 seconds later.
class WaitScope {
public:
    WaitScope(const char *op, const Group *group, bool self_timed = false) noexcept;
    ~WaitScope();
    WaitScope(const WaitScope &) = delete;
    WaitScope &operator=(const WaitScope &) = delete;

    static void progress() noexcept;

private:
    void *slot_;
    const char *prev_op_;
    const Group *prev_group_;
    bool prev_self_;
};

// For the MPI profiling-interface layer (watch_mpi.cc): a wait of the
// program's own MPI call, opened and closed by calls rather than a scope: a
// Context level (`what`, `index_name`, `index`) and a wait named `op` on
// `group`. Opens nothing and returns NULL when the watchdog is off or a
// wait of libdsm is open on this thread (its own record names it); else a
// token for close_program_wait() (this thread's record).
void *open_program_wait(const char *what, const char *index_name, int64_t index, const char *op,
                        const Group *group) noexcept;
void close_program_wait(void *token) noexcept;

// Ends the job from this thread as the watchdog does for a timed-out wait
// (the message names this thread's wait and `why`). Does not return.
[[noreturn]] void expire(const std::string &why);

// The message the watchdog prints for the open wait of this thread (for the
// tests; empty when none is open).
std::string describe_current(double waited_s);

} // namespace watchdog
} // namespace dsm
