// The watchdog (watchdog.hpp): per-thread wait records, the watchdog thread,
// the message and the end of the job.
#include "dsm_config.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <sstream>
#include <thread>

#include <unistd.h>

#include "core/param.hpp"
#include "core/watchdog.hpp"

DSM_PARAM_LINK(core_watchdog)

namespace dsm {
namespace watchdog {

namespace {

DSM_PARAM(comm, COMM_TIMEOUT, param::Int(0, 999999999, "a number of seconds (0 for no limit)"), "1800",
          "Seconds one blocking wait of libdsm may last (a collective of any backend, an agreement of the "
          "ranks, a checkpoint's save or load, an operation of the progress thread) before the waiting rank "
          "prints a message naming the wait, the group, the step and the ranks that did not arrive, and ends "
          "the job with MPI_Abort and exit status 75 (a restart resumes from the last checkpoint). Size it above "
          "the slowest checkpoint save and the longest time a rank spends in the program's own code between "
          "two libdsm calls of a step. 0 waits for ever. Replaces DSM_NCCL_TIMEOUT, read when this one is not set.");

DSM_PARAM(comm, NCCL_TIMEOUT, param::Int(0, 999999999, "a number of seconds (0 for no limit)"), "",
          "The former name of DSM_COMM_TIMEOUT, read when DSM_COMM_TIMEOUT is not set (the nccl backend "
          "aborts its communicator when an operation exceeds it, then the job ends as for DSM_COMM_TIMEOUT).");

DSM_PARAM(comm, WATCH_MPI, param::Int(0, 1, "1 or 0"), "",
          "The MPI profiling-interface layer (libdsm_mpiwatch.so, loaded with LD_PRELOAD or linked before the MPI "
          "library): unset or 1, the program's own blocking MPI calls (collectives, MPI_Recv, MPI_Send, MPI_Probe, "
          "MPI_Wait...) are under the watchdog as libdsm's waits are (DSM_COMM_TIMEOUT, the same message); 0 turns "
          "the layer's wrappers off. libdsm itself never loads the layer: scripts/launcher/dsm-run.sh and "
          "examples/slurm/dsm-job.sh preload it in the ranks when this is 1.");

constexpr int kSlots = 64;       // threads that wait at once (the caller, the progress thread, a writer, ...)
constexpr int kGraceSeconds = 5; // after MPI_Abort, _exit; a self-timed wait's head start

// One thread's record. Written by its thread only (relaxed stores; seq with
// release), read by the watchdog thread.
struct alignas(64) Slot {
    std::atomic<bool> used{false};
    std::atomic<uint64_t> seq{0};
    std::atomic<int> depth{0};
    std::atomic<const char *> op{nullptr};
    std::atomic<const Group *> group{nullptr};
    std::atomic<bool> self_timed{false};
    std::atomic<int> ctx_depth{0};
    std::atomic<const char *> what[kLevels] = {};
    std::atomic<const char *> index_name[kLevels] = {};
    std::atomic<int64_t> index[kLevels] = {};
    // Written by the slot's thread before the wait opens (the seq store's
    // release orders it before the watchdog's acquire of seq).
    char note[kLevels][kNote] = {};
};

struct State {
    Slot slots[kSlots];
    std::atomic<bool> running{false};
    pid_t started_by = 0; // the process whose thread runs (a forked child has none)
    std::atomic<int64_t> timeout_s{0};
    std::atomic<bool> fired{false};
    std::atomic<int64_t> step{-1}, micro{-1};
    std::mutex mu; // hosts, start
    std::vector<std::string> hosts;
};

// Never destroyed: the watchdog thread may read it while the process exits.
State &state() {
    static State *s = new State;
    return *s;
}

// Gives the slot back when its thread ends.
struct SlotRelease {
    Slot *slot = nullptr;
    ~SlotRelease() {
        if (slot == nullptr) return;
        slot->depth.store(0, std::memory_order_relaxed);
        slot->used.store(false, std::memory_order_release);
    }
};

thread_local Slot *tl_slot = nullptr;

Slot *claim() {
    State &st = state();
    for (Slot &s : st.slots) {
        bool f = false;
        if (!s.used.load(std::memory_order_relaxed) && s.used.compare_exchange_strong(f, true)) {
            s.depth.store(0, std::memory_order_relaxed);
            s.op.store(nullptr, std::memory_order_relaxed);
            s.group.store(nullptr, std::memory_order_relaxed);
            s.ctx_depth.store(0, std::memory_order_relaxed);
            static thread_local SlotRelease release;
            release.slot = &s;
            return &s;
        }
    }
    return nullptr; // more threads than slots: those are not watched
}

inline Slot *my_slot() noexcept {
    Slot *s = tl_slot;
    if (s == nullptr) s = tl_slot = claim();
    return s;
}

int world_rank_now() {
    int init = 0, fini = 0, r = -1;
    MPI_Initialized(&init);
    MPI_Finalized(&fini);
    if (init && !fini) MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

// Kept at start() (on a thread that may call MPI), for the message.
std::atomic<int> g_world_rank{-1};

std::string host_of(int world) {
    State &st = state();
    std::lock_guard<std::mutex> lock(st.mu);
    if (world >= 0 && static_cast<size_t>(world) < st.hosts.size() && !st.hosts[static_cast<size_t>(world)].empty())
        return st.hosts[static_cast<size_t>(world)];
    return "?";
}

std::string own_host() {
    char h[256] = "?";
    gethostname(h, sizeof h - 1);
    return h;
}

// "rank W (host H)" for member r of g.
std::string member(const Group *g, int r) {
    std::ostringstream o;
    const int w = g != nullptr && r >= 0 && static_cast<size_t>(r) < g->world.size() ? g->world[static_cast<size_t>(r)] : -1;
    if (w >= 0)
        o << "rank " << w << " (group rank " << r << ", host " << host_of(w) << ")";
    else
        o << "group rank " << r;
    return o.str();
}

std::string message(const Slot &s, double waited_s, const std::string &why) {
    State &st = state();
    std::ostringstream o;
    const int me = g_world_rank.load(std::memory_order_relaxed);
    o << "dsm watchdog: rank " << me << " (host " << own_host() << ", pid " << getpid() << ")";
    if (why.empty())
        o << " has waited " << static_cast<long long>(waited_s) << " s (DSM_COMM_TIMEOUT="
          << st.timeout_s.load(std::memory_order_relaxed) << ") in ";
    else
        o << ": " << why << ", in ";
    const int levels = std::min(s.ctx_depth.load(std::memory_order_relaxed), kLevels);
    for (int l = 0; l < levels; ++l) {
        const char *what = s.what[l].load(std::memory_order_relaxed);
        const char *index_name = s.index_name[l].load(std::memory_order_relaxed);
        const int64_t index = s.index[l].load(std::memory_order_relaxed);
        if (what == nullptr) continue;
        o << what;
        if (index_name != nullptr && index >= 0) o << ", " << index_name << " " << index;
        if (s.note[l][0] != '\0') o << " (" << std::string(s.note[l], strnlen(s.note[l], kNote)) << ")";
        o << ": ";
    }
    const Group *g = s.group.load(std::memory_order_relaxed);
    const char *op = s.op.load(std::memory_order_relaxed);
    if (g != nullptr && !g->backend.empty()) o << g->backend << " ";
    o << (op != nullptr ? op : "a wait");
    if (g != nullptr)
        o << " over " << (g->label.empty() ? std::string("a group") : g->label) << " (" << g->size
          << " ranks; this rank is group rank " << g->rank << ")";
    const int64_t step = st.step.load(std::memory_order_relaxed), micro = st.micro.load(std::memory_order_relaxed);
    if (step >= 0) o << ", at step " << step << ", micro-step " << micro;
    o << ".\n";
    std::vector<int> missing;
    std::string note;
    bool known = false;
    if (g != nullptr && g->arrivals) {
        try {
            known = g->arrivals(&missing, &note);
        } catch (...) {
            known = false;
        }
    }
    if (known && !missing.empty()) {
        o << "  ranks that did not arrive";
        if (!note.empty()) o << " (" << note << ")";
        o << ":";
        for (size_t i = 0; i < missing.size(); ++i) o << (i ? ", " : " ") << member(g, missing[i]);
        o << ".\n";
    } else {
        if (known || !note.empty())
            o << "  " << note << ".";
        else if (g != nullptr && !g->backend.empty())
            o << "  The " << g->backend << " backend cannot tell which ranks did not arrive (MPI does not say).";
        else
            o << "  This wait cannot tell which ranks did not arrive (MPI does not say).";
        if (g != nullptr && !g->world.empty()) {
            o << " The other ranks of the group:";
            const size_t shown = std::min<size_t>(g->world.size(), 16);
            for (size_t r = 0; r < shown; ++r)
                if (static_cast<int>(r) != g->rank) o << (r == 0 || (r == 1 && g->rank == 0) ? " " : ", ") << member(g, static_cast<int>(r));
            if (shown < g->world.size()) o << " and " << g->world.size() - shown << " more";
            o << ".";
        }
        o << "\n";
    }
    o << "  A rank busy in the program's own code (outside libdsm) for this long looks the same as a stalled "
         "one: if that is the case, raise DSM_COMM_TIMEOUT.\n"
      << "  Ending the job with MPI_Abort, exit status " << kExitStatus << ".\n";
    return o.str();
}

void write_all(const std::string &text) {
    const char *p = text.data();
    size_t n = text.size();
    while (n > 0) {
        const ssize_t w = ::write(2, p, n);
        if (w <= 0) break;
        p += w;
        n -= static_cast<size_t>(w);
    }
}

[[noreturn]] void end_job(const std::string &text) {
    write_all(text);
    // Should MPI_Abort block (a lock held by the stuck thread), the process
    // still ends.
    std::thread([] {
        std::this_thread::sleep_for(std::chrono::seconds(kGraceSeconds));
        ::_exit(kExitStatus);
    }).detach();
    int init = 0, fini = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fini);
    if (init && !fini) MPI_Abort(MPI_COMM_WORLD, kExitStatus);
    ::_exit(kExitStatus);
}

void loop() {
    State &st = state();
    struct Seen {
        uint64_t seq = 0;
        bool waiting = false;
        std::chrono::steady_clock::time_point since;
    };
    std::vector<Seen> seen(kSlots);
    for (;;) {
        const int64_t t = st.timeout_s.load(std::memory_order_relaxed);
        const int64_t poll_ms = std::max<int64_t>(50, std::min<int64_t>(1000, t * 100));
        std::this_thread::sleep_for(std::chrono::milliseconds(poll_ms));
        if (t <= 0) continue;
        const auto now = std::chrono::steady_clock::now();
        for (int i = 0; i < kSlots; ++i) {
            Slot &s = st.slots[i];
            Seen &v = seen[static_cast<size_t>(i)];
            const bool waiting = s.used.load(std::memory_order_acquire) && s.depth.load(std::memory_order_relaxed) > 0;
            const uint64_t q = s.seq.load(std::memory_order_acquire);
            if (!waiting) {
                v.waiting = false;
                continue;
            }
            if (!v.waiting || v.seq != q) {
                v = Seen{q, true, now};
                continue;
            }
            const double waited = std::chrono::duration<double>(now - v.since).count();
            const double limit = static_cast<double>(t) + (s.self_timed.load(std::memory_order_relaxed) ? kGraceSeconds : 0);
            if (waited < limit) continue;
            bool f = false;
            if (!st.fired.compare_exchange_strong(f, true)) return;
            end_job(message(s, waited, std::string()));
        }
    }
}

} // namespace

int64_t timeout_seconds() {
    if (param_COMM_TIMEOUT().is_set() || !param_NCCL_TIMEOUT().is_set()) return param_COMM_TIMEOUT().value();
    return param_NCCL_TIMEOUT().value();
}

void start() {
    const int64_t t = timeout_seconds();
    State &st = state();
    st.timeout_s.store(t, std::memory_order_relaxed);
    const int r = world_rank_now();
    if (r >= 0) g_world_rank.store(r, std::memory_order_relaxed);
    if (t <= 0) return;
    std::lock_guard<std::mutex> lock(st.mu);
    if (st.running.load(std::memory_order_relaxed) && st.started_by == getpid()) return;
    std::thread(loop).detach();
    st.started_by = getpid();
    st.running.store(true, std::memory_order_release);
}

bool running() noexcept { return state().running.load(std::memory_order_acquire); }

bool watch_mpi() { return !param_WATCH_MPI().is_set() || param_WATCH_MPI().value() != 0; }

void note_hosts(const std::vector<int> &world, const std::vector<std::string> &hosts) {
    State &st = state();
    std::lock_guard<std::mutex> lock(st.mu);
    for (size_t i = 0; i < world.size() && i < hosts.size(); ++i) {
        if (world[i] < 0) continue;
        const size_t w = static_cast<size_t>(world[i]);
        if (st.hosts.size() <= w) st.hosts.resize(w + 1);
        st.hosts[w] = hosts[i];
    }
}

void Group::describe(MPI_Comm comm, std::string label_, std::string backend_) {
    label = std::move(label_);
    backend = std::move(backend_);
    world.clear();
    if (comm == MPI_COMM_NULL) return;
    MPI_Comm_size(comm, &size);
    MPI_Comm_rank(comm, &rank);
    MPI_Group g = MPI_GROUP_NULL, wg = MPI_GROUP_NULL;
    if (MPI_Comm_group(comm, &g) != MPI_SUCCESS) return;
    if (MPI_Comm_group(MPI_COMM_WORLD, &wg) == MPI_SUCCESS) {
        std::vector<int> ranks(static_cast<size_t>(size));
        for (int i = 0; i < size; ++i) ranks[static_cast<size_t>(i)] = i;
        world.assign(static_cast<size_t>(size), -1);
        if (MPI_Group_translate_ranks(g, size, ranks.data(), wg, world.data()) != MPI_SUCCESS) world.clear();
        for (int &w : world)
            if (w == MPI_UNDEFINED) w = -1;
        MPI_Group_free(&wg);
    }
    MPI_Group_free(&g);
}

void set_step(int64_t step, int64_t micro_step) noexcept {
    State &st = state();
    st.step.store(step, std::memory_order_relaxed);
    st.micro.store(micro_step, std::memory_order_relaxed);
}

namespace {

void set_note(char *to, const char *from, size_t n) noexcept {
    if (n >= static_cast<size_t>(kNote)) {
        memcpy(to, from, kNote - 4);
        memcpy(to + kNote - 4, "...", 4);
        return;
    }
    memcpy(to, from, n);
    to[n] = '\0';
}

} // namespace

Context::Context(const char *what, const char *index_name, int64_t index) noexcept {
    Slot *s = my_slot();
    if (s == nullptr) return;
    const int d = s->ctx_depth.load(std::memory_order_relaxed);
    if (d < kLevels) {
        s->what[d].store(what, std::memory_order_relaxed);
        s->index_name[d].store(index_name, std::memory_order_relaxed);
        s->index[d].store(index, std::memory_order_relaxed);
        s->note[d][0] = '\0';
    }
    s->ctx_depth.store(d + 1, std::memory_order_relaxed);
}

Context::Context(const char *what, const char *index_name, int64_t index, const std::string &note) noexcept
    : Context(what, index_name, index) {
    Slot *s = tl_slot;
    if (s == nullptr) return;
    const int d = s->ctx_depth.load(std::memory_order_relaxed) - 1;
    if (d >= 0 && d < kLevels) set_note(s->note[d], note.data(), note.size());
}

Context::Context(const Saved &saved) noexcept : whole_(true) {
    Slot *s = my_slot();
    if (s == nullptr) return;
    prev_ = current();
    for (int l = 0; l < std::min(saved.depth, kLevels); ++l) {
        s->what[l].store(saved.levels[l].what, std::memory_order_relaxed);
        s->index_name[l].store(saved.levels[l].index_name, std::memory_order_relaxed);
        s->index[l].store(saved.levels[l].index, std::memory_order_relaxed);
        memcpy(s->note[l], saved.levels[l].note, kNote);
    }
    s->ctx_depth.store(saved.depth, std::memory_order_relaxed);
}

Context::~Context() {
    Slot *s = tl_slot;
    if (s == nullptr) return;
    if (!whole_) {
        s->ctx_depth.store(std::max(0, s->ctx_depth.load(std::memory_order_relaxed) - 1), std::memory_order_relaxed);
        return;
    }
    for (int l = 0; l < std::min(prev_.depth, kLevels); ++l) {
        s->what[l].store(prev_.levels[l].what, std::memory_order_relaxed);
        s->index_name[l].store(prev_.levels[l].index_name, std::memory_order_relaxed);
        s->index[l].store(prev_.levels[l].index, std::memory_order_relaxed);
        memcpy(s->note[l], prev_.levels[l].note, kNote);
    }
    s->ctx_depth.store(prev_.depth, std::memory_order_relaxed);
}

Context::Saved Context::current() noexcept {
    Saved v;
    Slot *s = tl_slot;
    if (s == nullptr) return v;
    v.depth = s->ctx_depth.load(std::memory_order_relaxed);
    for (int l = 0; l < std::min(v.depth, kLevels); ++l) {
        v.levels[l].what = s->what[l].load(std::memory_order_relaxed);
        v.levels[l].index_name = s->index_name[l].load(std::memory_order_relaxed);
        v.levels[l].index = s->index[l].load(std::memory_order_relaxed);
        memcpy(v.levels[l].note, s->note[l], kNote);
    }
    return v;
}

WaitScope::WaitScope(const char *op, const Group *group, bool self_timed) noexcept
    : slot_(nullptr), prev_op_(nullptr), prev_group_(nullptr), prev_self_(false) {
    // Off (DSM_COMM_TIMEOUT=0, or no start() yet): nothing recorded.
    if (state().timeout_s.load(std::memory_order_relaxed) <= 0) return;
    Slot *s = my_slot();
    if (s == nullptr) return;
    slot_ = s;
    prev_op_ = s->op.load(std::memory_order_relaxed);
    prev_group_ = s->group.load(std::memory_order_relaxed);
    prev_self_ = s->self_timed.load(std::memory_order_relaxed);
    s->op.store(op, std::memory_order_relaxed);
    if (group != nullptr || prev_group_ == nullptr) s->group.store(group, std::memory_order_relaxed);
    s->self_timed.store(self_timed, std::memory_order_relaxed);
    s->depth.store(s->depth.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    s->seq.store(s->seq.load(std::memory_order_relaxed) + 1, std::memory_order_release);
}

WaitScope::~WaitScope() {
    Slot *s = static_cast<Slot *>(slot_);
    if (s == nullptr) return;
    s->op.store(prev_op_, std::memory_order_relaxed);
    s->group.store(prev_group_, std::memory_order_relaxed);
    s->self_timed.store(prev_self_, std::memory_order_relaxed);
    s->depth.store(s->depth.load(std::memory_order_relaxed) - 1, std::memory_order_relaxed);
    s->seq.store(s->seq.load(std::memory_order_relaxed) + 1, std::memory_order_release);
}

void WaitScope::progress() noexcept {
    Slot *s = tl_slot;
    if (s == nullptr || s->depth.load(std::memory_order_relaxed) == 0) return;
    s->seq.store(s->seq.load(std::memory_order_relaxed) + 1, std::memory_order_release);
}

void *open_program_wait(const char *what, const char *index_name, int64_t index, const char *op,
                        const Group *group) noexcept {
    if (state().timeout_s.load(std::memory_order_relaxed) <= 0) return nullptr;
    Slot *s = my_slot();
    if (s == nullptr || s->depth.load(std::memory_order_relaxed) > 0) return nullptr;
    const int d = s->ctx_depth.load(std::memory_order_relaxed);
    if (d < kLevels) {
        s->what[d].store(what, std::memory_order_relaxed);
        s->index_name[d].store(index_name, std::memory_order_relaxed);
        s->index[d].store(index, std::memory_order_relaxed);
        s->note[d][0] = '\0';
    }
    s->ctx_depth.store(d + 1, std::memory_order_relaxed);
    s->op.store(op, std::memory_order_relaxed);
    s->group.store(group, std::memory_order_relaxed);
    s->self_timed.store(false, std::memory_order_relaxed);
    s->depth.store(1, std::memory_order_relaxed);
    s->seq.store(s->seq.load(std::memory_order_relaxed) + 1, std::memory_order_release);
    return s;
}

void close_program_wait(void *token) noexcept {
    Slot *s = static_cast<Slot *>(token);
    if (s == nullptr) return;
    s->op.store(nullptr, std::memory_order_relaxed);
    s->group.store(nullptr, std::memory_order_relaxed);
    s->depth.store(0, std::memory_order_relaxed);
    s->ctx_depth.store(std::max(0, s->ctx_depth.load(std::memory_order_relaxed) - 1), std::memory_order_relaxed);
    s->seq.store(s->seq.load(std::memory_order_relaxed) + 1, std::memory_order_release);
}

void expire(const std::string &why) {
    State &st = state();
    bool f = false;
    if (!st.fired.compare_exchange_strong(f, true)) {
        // The watchdog thread is ending the job already.
        for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    static const Slot empty;
    Slot *s = my_slot();
    end_job(message(s != nullptr ? *s : empty, 0, why));
}

std::string describe_current(double waited_s) {
    Slot *s = tl_slot;
    if (s == nullptr || s->depth.load(std::memory_order_relaxed) == 0) return std::string();
    return message(*s, waited_s, std::string());
}

} // namespace watchdog
} // namespace dsm
