// The CUDA space (space.hpp): device memory of one GPU and one stream, the
// engine's own or the user's (dsm_engine_set_stream), built on the CUDA
// runtime layer (src/cuda/device.hpp; README.md in this folder says which
// folder holds what). Every call enqueues on
// the stream and returns, except download and synchronize, which wait.
#include "dsm_config.h"

#include "device/space.hpp"

#include "core/error.hpp"

#if DSM_HAVE_CUDA_KERNELS
#include <cuda_runtime.h>

#include <vector>

#include "cuda/device.hpp"
#endif

namespace dsm {
namespace device {

#if DSM_HAVE_CUDA_KERNELS

namespace {

class CudaSpace final : public Space {
public:
    explicit CudaSpace(int device) : device_(device) {
        const cuda::DeviceGuard on(device_);
        own_ = cuda::Stream::create();
        stream_ = own_.get();
    }
    ~CudaSpace() override {
        if (stream_ != nullptr) (void)cudaStreamSynchronize(stream_);
    }
    Kind kind() const noexcept override { return Kind::CUDA; }
    std::string name() const override { return "cuda:" + std::to_string(device_); }
    Queue queue() const noexcept override { return Queue(stream_); }

    void set_stream(cudaStream_t s) {
        // Work already on the old stream comes before work on the new one.
        DSM_CHECK_CUDA(cudaStreamSynchronize(stream_));
        stream_ = s != nullptr ? s : own_.get();
    }

    void *alloc(size_t bytes) override {
        const cuda::DeviceGuard on(device_);
        return cuda::DeviceBuffer(bytes).release();
    }
    void free(void *p) noexcept override {
        if (p == nullptr) return;
        (void)cudaStreamSynchronize(stream_); // the queue may still use it
        cuda::free_device(p);
    }
    void *alloc_host(size_t bytes) override { return cuda::PinnedBuffer(bytes).release(); }
    void free_host(void *p) noexcept override {
        (void)cudaStreamSynchronize(stream_);
        cuda::free_pinned(p);
    }

    void zero(void *p, size_t bytes) override {
        if (bytes > 0) DSM_CHECK_CUDA(cudaMemsetAsync(p, 0, bytes, stream_));
    }
    void copy(void *dst, const void *src, size_t bytes) override {
        if (bytes > 0 && dst != src) DSM_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_));
    }
    void upload(void *dst, const void *h, size_t bytes) override {
        // Pageable memory: cudaMemcpyAsync returns once the source is staged.
        if (bytes > 0) DSM_CHECK_CUDA(cudaMemcpyAsync(dst, h, bytes, cudaMemcpyDefault, stream_));
    }
    void download(void *h, const void *src, size_t bytes) override {
        if (bytes > 0) DSM_CHECK_CUDA(cudaMemcpyAsync(h, src, bytes, cudaMemcpyDefault, stream_));
        synchronize();
    }
    void synchronize() override { DSM_CHECK_CUDA(cudaStreamSynchronize(stream_)); }

    struct EventMark final : Mark {
        cuda::Event event;
    };
    std::unique_ptr<Mark> mark() override {
        const cuda::DeviceGuard on(device_);
        auto m = std::make_unique<EventMark>();
        m->event = cuda::Event::create();
        return m;
    }
    void record(Mark &m) override { static_cast<EventMark &>(m).event.record(stream_); }
    void wait_mark(Mark &m) override { static_cast<EventMark &>(m).event.synchronize(); }
    bool idle() override { return cudaStreamQuery(stream_) == cudaSuccess; }
    bool pin(void *host, size_t bytes, std::string &why) override {
        cuda::HostRegistration r(host, bytes);
        if (!r.registered()) {
            why = r.reason();
            return false;
        }
        pinned_.push_back(std::move(r));
        return true;
    }
    void run(std::function<void()>) override {
        DSM_FAIL(DSM_ERR_INTERNAL, "host code cannot run on ", name(), " memory");
    }

private:
    int device_;
    std::vector<cuda::HostRegistration> pinned_; // unregistered after the stream is idle
    cuda::Stream own_;
    cudaStream_t stream_ = nullptr;
};

} // namespace

std::unique_ptr<Space> make_cuda(int device) { return std::make_unique<CudaSpace>(device); }

void set_stream(Space &space, void *stream) {
    auto *c = dynamic_cast<CudaSpace *>(&space);
    DSM_REQUIRE(c != nullptr, DSM_ERR_NOT_SUPPORTED, "a stream orders work on a CUDA device; this memory is ",
                space.name());
    c->set_stream(static_cast<cudaStream_t>(stream));
}

#else // no CUDA kernels

std::unique_ptr<Space> make_cuda(int device) {
    DSM_FAIL(DSM_ERR_NOT_SUPPORTED, "CUDA device ", device,
             ": libdsm was built without the CUDA kernels (configure found no nvcc)");
}

void set_stream(Space &space, void *) {
    DSM_FAIL(DSM_ERR_NOT_SUPPORTED, "a stream orders work on a CUDA device; this memory is ", space.name());
}

#endif

} // namespace device
} // namespace dsm
