// The queue a memory space's work is ordered on, and that collectives on its
// memory take (comm/backend.hpp): an opaque handle, null for the host queue
// (work completes before the call returns). For CUDA the handle is a
// cudaStream_t (cudaStreamLegacy or cudaStreamPerThread for the default
// streams: the null handle is the host queue, not stream 0).
//
// A queue that is not a CUDA stream (the simulated device of space.hpp)
// carries the function that waits for it: host backends call it instead of
// cudaStreamSynchronize; stream-ordered backends do not take such queues.
#pragma once

namespace dsm {
namespace device {

class Queue {
public:
    using WaitFn = void (*)(void *handle);
    constexpr Queue() noexcept = default;
    constexpr explicit Queue(void *stream) noexcept : stream_(stream) {}
    constexpr Queue(void *handle, WaitFn wait) noexcept : stream_(handle), wait_(wait) {}
    static constexpr Queue host() noexcept { return Queue(); }
    constexpr void *handle() const noexcept { return stream_; }
    constexpr WaitFn wait_fn() const noexcept { return wait_; }
    constexpr bool is_host() const noexcept { return stream_ == nullptr; }
    constexpr bool operator==(const Queue &o) const noexcept { return stream_ == o.stream_; }
    constexpr bool operator!=(const Queue &o) const noexcept { return stream_ != o.stream_; }

private:
    void *stream_ = nullptr;
    WaitFn wait_ = nullptr;
};

} // namespace device
} // namespace dsm
