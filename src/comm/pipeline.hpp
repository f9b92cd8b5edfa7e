// Communication overlapped with the caller's work (zero_optimization.
// overlap_comm): an ordered queue of tasks, each a closure that makes
// collective calls on backends and moves bytes (a bucket's reduction, a
// ZeRO-3 gather, a slice of the allgather after the step). Tasks run one at a
// time in submission order, so the collectives on a backend keep the order
// every rank submitted them in, and a task runs exactly the calls the
// blocking path makes: the results have the same bits with overlap on or off.
//
// Modes:
//   INLINE    submit() runs the task before returning (overlap off).
//   THREAD    a progress thread runs the tasks while the caller goes on; the
//             blocking MPI calls inside a task make MPI's progress. Needs
//             MPI_THREAD_MULTIPLE (the caller and the user may call MPI at
//             the same time) and host memory (a device space's queue is the
//             caller's).
//   DEFERRED  the tasks wait until the caller waits for them (or submits
//             beyond the in-flight limit) and run on the caller's thread:
//             no overlap, the same results. What overlap_comm does below
//             MPI_THREAD_MULTIPLE and on device spaces; it also makes a
//             missing wait visible in the tests (the work has not happened).
//
// The rules for the caller: a buffer a task reads or writes is the task's
// until a wait for its ticket returns; a backend a task uses is used only by
// tasks until wait_all() returns. Bookkeeping (which buffer, which round)
// stays on the caller's thread; tasks only move bytes.
//
// Errors: the first exception of a task is kept; the tasks after it are
// dropped (they would make collective calls the failed one did not finish);
// the next wait rethrows it, once.
//
// The watchdog (core/watchdog.hpp) names a wait inside a task with the
// contexts of the thread that submitted it.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include "core/watchdog.hpp"

namespace dsm {
namespace comm {

class Pipeline {
public:
    enum class Mode { INLINE, DEFERRED, THREAD };
    using Task = std::function<void()>;
    using Ticket = uint64_t; // 1, 2, ... in submission order; 0: none

    explicit Pipeline(Mode mode = Mode::INLINE);
    // Waits for the tasks (their errors dropped) and joins the thread.
    ~Pipeline();
    Pipeline(const Pipeline &) = delete;
    Pipeline &operator=(const Pipeline &) = delete;

    Mode mode() const noexcept { return mode_; }
    static const char *mode_name(Mode mode) noexcept;

    // Adds `task` after those submitted before; INLINE runs it now (its
    // exception propagates). With `limit` > 0, first waits until fewer than
    // `limit` tasks are outstanding (DEFERRED: runs the oldest).
    Ticket submit(Task task, size_t limit = 0);
    // Whether ticket `t` (and every one before it) has completed; never
    // waits. 0 is always done.
    bool done(Ticket t);
    // Waits for `t` and every task before it (DEFERRED: runs them here);
    // rethrows a task's error.
    void wait(Ticket t);
    void wait_all() { wait(last_); }
    // The ticket of the last task submitted (0: none).
    Ticket last() const noexcept { return last_; }

private:
    void loop();
    bool run_one(std::unique_lock<std::mutex> &lock); // DEFERRED: the oldest, on this thread

    Mode mode_;
    std::mutex mu_;
    std::condition_variable more_, finished_;
    // Each task with the watchdog contexts it was submitted under, so that a
    // wait inside it is named as the submitter's would be.
    struct Entry {
        Task task;
        watchdog::Context::Saved context;
    };
    std::deque<Entry> queue_;
    Ticket last_ = 0, done_ = 0;
    std::exception_ptr error_;
    bool stop_ = false;
    std::thread thread_;
};

} // namespace comm
} // namespace dsm
