// The ordered task queue of overlap_comm (pipeline.hpp).
#include "comm/pipeline.hpp"

#include <utility>

namespace dsm {
namespace comm {

Pipeline::Pipeline(Mode mode) : mode_(mode) {
    if (mode_ == Mode::THREAD) thread_ = std::thread([this] { loop(); });
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
        else
            finished_.wait(lock, [&] { return last_ - done_ < limit; });
    }
    queue_.push_back(Entry{std::move(task), watchdog::Context::current()});
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
    else
        finished_.wait(lock, [&] { return done_ >= t; });
    if (error_) {
        std::exception_ptr e = std::move(error_);
        error_ = nullptr;
        std::rethrow_exception(e);
    }
}

// Runs the oldest task with the lock released; false when none is queued.
bool Pipeline::run_one(std::unique_lock<std::mutex> &lock) {
    if (queue_.empty()) return false;
    Task task = std::move(queue_.front().task);
    const watchdog::Context::Saved context = queue_.front().context;
    queue_.pop_front();
    const bool skip = static_cast<bool>(error_);
    lock.unlock();
    std::exception_ptr e;
    if (!skip) {
        const watchdog::Context named(context);
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
