// The ordered task queue of overlap_comm (pipeline.hpp).
#include "dsm_config.h"

#include "comm/pipeline.hpp"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>

#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "core/error.hpp"
#include "core/param.hpp"

namespace dsm {
namespace comm {

namespace {

DSM_PARAM(comm, COMM_PROGRESS_WAIT, param::Choice({"sleep", "poll"}), "sleep",
          "How overlap_comm's progress thread waits for the messages of a collective while the model computes: "
          "sleep (test, then sleep 4 to 128 microseconds, doubling, so that the model keeps the cores) or poll "
          "(MPI_Wait, which polls: for a core set aside for communication). While the caller waits for the "
          "collective the thread polls either way. Read when an engine is created.");

// The progress thread's count of blocked callers (null on other threads)
// and whether it sleeps between tests.
thread_local const std::atomic<int> *t_waiters = nullptr;

} // namespace

struct Pipeline::Waiting {
    std::atomic<int> &n;
    explicit Waiting(Pipeline &p) : n(p.waiters_) { n.fetch_add(1, std::memory_order_relaxed); }
    ~Waiting() { n.fetch_sub(1, std::memory_order_relaxed); }
};

bool progress_wait_sleeps() { return param_COMM_PROGRESS_WAIT().value() == "sleep"; }

void wait_request(MPI_Request *r) {
    if (t_waiters == nullptr) {
        DSM_CHECK_MPI(MPI_Wait(r, MPI_STATUS_IGNORE));
        return;
    }
    constexpr std::chrono::microseconds first(4), most(128);
    std::chrono::microseconds nap = first;
    for (;;) {
        int flag = 0;
        DSM_CHECK_MPI(MPI_Test(r, &flag, MPI_STATUS_IGNORE));
        if (flag) return;
        if (t_waiters->load(std::memory_order_relaxed) > 0) {
            nap = first; // the caller waits: poll
            continue;
        }
        std::this_thread::sleep_for(nap);
        nap = std::min(nap * 2, most);
    }
}

void wait_requests(std::vector<MPI_Request> *reqs) {
    if (reqs->empty()) return;
    if (t_waiters == nullptr) {
        DSM_CHECK_MPI(MPI_Waitall(static_cast<int>(reqs->size()), reqs->data(), MPI_STATUSES_IGNORE));
    } else {
        for (MPI_Request &r : *reqs) wait_request(&r);
    }
    reqs->clear();
}

Pipeline::Pipeline(Mode mode) : mode_(mode) {
    if (mode_ == Mode::THREAD) {
        const bool sleep = progress_wait_sleeps();
        thread_ = std::thread([this, sleep] {
            if (sleep) {
                t_waiters = &waiters_;
#ifdef __linux__
                (void)prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL); // wake within ~1 us of a nap's end
#endif
            }
            loop();
        });
    }
}

Pipeline::~Pipeline() {
    try {
        wait_all();
    } catch (...) {
    }
    if (thread_.joinable()) {
        {
            std::lock_guard<std::mutex> lock(mu_);
            stop_ = true;
        }
        more_.notify_all();
        thread_.join();
    }
}

const char *Pipeline::mode_name(Mode mode) noexcept {
    switch (mode) {
    case Mode::INLINE: return "off";
    case Mode::DEFERRED: return "deferred";
    case Mode::THREAD: return "progress thread";
    }
    return "?";
}

Pipeline::Ticket Pipeline::submit(Task task, size_t limit) {
    if (mode_ == Mode::INLINE) {
        task();
        ++done_;
        return ++last_;
    }
    std::unique_lock<std::mutex> lock(mu_);
    if (limit > 0) {
        if (mode_ == Mode::DEFERRED)
            while (last_ - done_ >= limit && run_one(lock)) {
            }
        else {
            const Waiting w(*this);
            finished_.wait(lock, [&] { return last_ - done_ < limit; });
        }
    }
    queue_.push_back(std::move(task));
    const Ticket t = ++last_;
    lock.unlock();
    more_.notify_one();
    return t;
}

bool Pipeline::done(Ticket t) {
    std::lock_guard<std::mutex> lock(mu_);
    return done_ >= t;
}

void Pipeline::wait(Ticket t) {
    std::unique_lock<std::mutex> lock(mu_);
    if (mode_ == Mode::DEFERRED)
        while (done_ < t && run_one(lock)) {
        }
    else if (done_ < t) {
        const Waiting w(*this);
        finished_.wait(lock, [&] { return done_ >= t; });
    }
    if (error_) {
        std::exception_ptr e = std::move(error_);
        error_ = nullptr;
        std::rethrow_exception(e);
    }
}

// Runs the oldest task with the lock released; false when none is queued.
bool Pipeline::run_one(std::unique_lock<std::mutex> &lock) {
    if (queue_.empty()) return false;
    Task task = std::move(queue_.front());
    queue_.pop_front();
    const bool skip = static_cast<bool>(error_);
    lock.unlock();
    std::exception_ptr e;
    if (!skip) {
        try {
            task();
        } catch (...) {
            e = std::current_exception();
        }
    }
    task = nullptr; // what it holds is released before it counts as done
    lock.lock();
    if (e && !error_) error_ = e;
    ++done_;
    finished_.notify_all();
    return true;
}

void Pipeline::loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
        more_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return; // stop_ and nothing left
        run_one(lock);
    }
}

} // namespace comm
} // namespace dsm

DSM_PARAM_LINK(comm_pipeline)
