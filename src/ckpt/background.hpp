// A checkpoint save whose writing runs on a thread of its own
// (checkpoint.writer.decoupled, doc/checkpoint.md): the caller has already
// made save_prepare(), and the thread runs save_write() on a duplicate of
// the communicator while the caller goes on. The tensors are either a
// snapshot the save owns, or the caller's live state: then the caller must
// not change that state before wait_captured() returns. With `live`
// regions (the caller's state, each a range of floats the tensors point
// into) the thread first copies each region into its buffer in `copies`
// (the double buffer: as many floats as the region, allocated by the
// caller and handed back by take_copies() for the next save), which is all that
// wait_captured() waits for, and writes the file from the copies; without
// them, captured means that the thread has handed the data to the file
// system and checksummed it (the file's flush and commit go on after).
// Needs MPI_THREAD_MULTIPLE: the caller's MPI calls and the
// thread's run at the same time. Only one thread uses HDF5 at a time as long
// as the caller waits for the save before its next checkpoint call.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <mpi.h>

#include "ckpt/checkpoint.hpp"
#include "core/comm.hpp"
#include "dsm.h"

namespace dsm {
namespace ckpt {

class BackgroundSave {
public:
    struct Region {
        const float *data = nullptr;
        size_t count = 0;
    };
    // Collective over `comm` (duplicated here, on the calling thread). The
    // save owns `content`'s data (`buffers`) and the client bytes.
    // `client_size`: the bytes of rank 0's client state, on every rank
    // (`client` holds them on rank 0 only).
    BackgroundSave(MPI_Comm comm, std::string dir, std::string tag, Content content,
                   std::vector<std::unique_ptr<float[]>> buffers, std::vector<unsigned char> client,
                   size_t client_size, int keep_last, std::vector<Region> live = {},
                   std::vector<std::unique_ptr<float[]>> copies = {});
    // Waits for the thread; the communicator is dropped, not freed (the
    // ranks may be elsewhere). Never throws.
    ~BackgroundSave();
    BackgroundSave(const BackgroundSave &) = delete;
    BackgroundSave &operator=(const BackgroundSave &) = delete;

    // Blocks until the tensors' data is no longer read by the save (on this
    // rank). Never throws.
    void wait_captured() noexcept;
    bool captured() const noexcept { return captured_.load(std::memory_order_acquire); }
    // The thread has finished on this rank (not blocking).
    bool done() const noexcept { return done_.load(std::memory_order_acquire); }
    // Collective: wait for the thread and free the communicator; throws the
    // save's error, the same on every rank, naming the checkpoint.
    void wait();
    const std::string &dir() const noexcept { return dir_; }
    const std::string &tag() const noexcept { return tag_; }
    // The snapshot's buffers, for the next save to reuse (after wait()).
    std::vector<std::unique_ptr<float[]>> take_buffers() noexcept { return std::move(buffers_); }
    // The double buffer of the live regions, one per region (after wait()).
    std::vector<std::unique_ptr<float[]>> take_copies() noexcept { return std::move(copies_); }
    // Seconds the writing took (after wait()).
    double seconds() const noexcept { return seconds_; }

private:
    void run() noexcept;
    void copy_live() noexcept; // the live regions into copies_, the tensors pointed there

    Comm comm_;
    std::string dir_, tag_, path_;
    Content content_;
    std::vector<std::unique_ptr<float[]>> buffers_;
    std::vector<Region> live_;
    std::vector<std::unique_ptr<float[]>> copies_;
    std::vector<unsigned char> client_;
    size_t client_size_ = 0;
    int keep_last_ = 0;
    std::atomic<bool> done_{false}, captured_{false};
    std::mutex mu_;
    std::condition_variable cv_;
    void mark_captured() noexcept;
    dsm_status_t status_ = DSM_SUCCESS;
    std::string error_;
    double seconds_ = 0.0;
    std::thread thread_;
};

} // namespace ckpt
} // namespace dsm
