// See background.hpp and doc/checkpoint.md ("Asynchronous saves").
#include "dsm_config.h"

#include "ckpt/background.hpp"
#include "ckpt/raw_io.hpp"

#include <algorithm>
#include <functional>
#include <new>

#include "core/error.hpp"
#include "core/log.hpp"
#include "core/watchdog.hpp"

namespace dsm {
namespace ckpt {

BackgroundSave::BackgroundSave(MPI_Comm comm, std::string dir, std::string tag, Content content,
                               std::vector<std::unique_ptr<float[]>> buffers, std::vector<unsigned char> client,
                               size_t client_size, int keep_last, std::vector<Region> live,
                               std::vector<std::unique_ptr<float[]>> copies)
    : comm_(Comm::dup(comm)), dir_(std::move(dir)), tag_(std::move(tag)), path_(dir_ + "/" + tag_ + ".h5"),
      content_(std::move(content)), buffers_(std::move(buffers)), live_(std::move(live)), copies_(std::move(copies)),
      client_(std::move(client)), client_size_(client_size), keep_last_(keep_last) {
    thread_ = std::thread([this] { run(); });
}

// The double buffer: each live region copied (every thread, in blocks) into
// its buffer (allocated by the caller, so that nothing here can fail), and
// every tensor that points into a region pointed into its copy.
void BackgroundSave::copy_live() noexcept {
    for (size_t k = 0; k < live_.size(); ++k) copy_floats(copies_[k].get(), live_[k].data, live_[k].count);
    for (Tensor &t : content_.tensors)
        for (size_t k = 0; k < live_.size(); ++k) {
            const float *b = live_[k].data;
            if (t.count && t.data >= b && t.data + t.count <= b + live_[k].count) {
                t.data = copies_[k].get() + (t.data - b);
                break;
            }
        }
}

void BackgroundSave::run() noexcept {
    const double start = MPI_Wtime();
    try {
#if DSM_HAVE_HDF5
        const watchdog::Context ctx("dsm_engine_save_checkpoint (decoupled writer)");
        const watchdog::WaitScope wait("checkpoint write in the background (collective HDF5)", nullptr);
        std::function<void()> captured = [this] { mark_captured(); };
        if (!live_.empty()) {
            copy_live();
            mark_captured();
            captured = nullptr;
        }
        save_write(comm_.get(), dir_, tag_, content_, client_.empty() ? nullptr : client_.data(), client_size_,
                   keep_last_, captured);
#else
        DSM_FAIL(DSM_ERR_NOT_SUPPORTED, "checkpoints need parallel HDF5: this libdsm was built without it");
#endif
    } catch (const Error &e) {
        status_ = e.status();
        error_ = e.message();
    } catch (const std::bad_alloc &) {
        status_ = DSM_ERR_OUT_OF_MEMORY;
        error_ = "out of memory";
    } catch (...) {
        status_ = DSM_ERR_INTERNAL;
        error_ = "unexpected exception";
    }
    seconds_ = MPI_Wtime() - start;
    mark_captured(); // after a failure too
    done_.store(true, std::memory_order_release);
}

void BackgroundSave::mark_captured() noexcept {
    {
        std::lock_guard<std::mutex> lock(mu_);
        captured_.store(true, std::memory_order_release);
    }
    cv_.notify_all();
}

void BackgroundSave::wait_captured() noexcept {
    if (captured()) return;
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return captured(); });
}

BackgroundSave::~BackgroundSave() {
    if (thread_.joinable()) thread_.join();
    (void)comm_.release();
}

void BackgroundSave::wait() {
    if (thread_.joinable()) thread_.join();
    client_.clear();
    comm_.reset();
    if (status_ != DSM_SUCCESS)
        DSM_FAIL(status_, "the asynchronous save of checkpoint '", path_, "' failed: ", error_,
                 " (DIR/latest still names the previous checkpoint)");
}

} // namespace ckpt
} // namespace dsm
