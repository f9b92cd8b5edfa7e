// The CUDA space (space.hpp): device memory of one GPU and one stream, the
// engine's own or the user's (dsm_engine_set_stream). Every call enqueues on
// the stream and returns, except those that return host values, which wait
// for one small device-to-host copy. The math is src/cuda/kernels.cu's.
#include "dsm_config.h"

#include "device/space.hpp"

#include "core/error.hpp"

#if DSM_HAVE_CUDA_KERNELS
#include <cuda_runtime.h>

#include "cuda/device.hpp"
#include "cuda/kernels.hpp"
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
        reduction_ = cuda::DeviceBuffer(sizeof(cuda::Reduction));
        result_ = cuda::PinnedBuffer(sizeof(cuda::ReduceResult));
    }
    ~CudaSpace() override {
        if (stream_ != nullptr) (void)cudaStreamSynchronize(stream_);
    }
    Kind kind() const noexcept override { return Kind::CUDA; }
    std::string name() const override { return "cuda:" + std::to_string(device_); }
    comm::Queue queue() const noexcept override { return comm::Queue(stream_); }

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
    void fill(float *p, size_t n, float v) override {
        check(cuda::detail::launch_fill(p, n, v, stream_), "fill");
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

    void convert(const void *src, dsm_dtype_t st, void *dst, dsm_dtype_t dt, size_t n) override {
        cuda::convert(src, st, dst, dt, n, stream_);
    }
    void scale(void *x, dsm_dtype_t t, size_t n, double s) override {
        check(cuda::detail::launch_scale(x, cuda::detail::fmt_of(t, "scale", true), n, static_cast<float>(s), stream_),
              "scale");
    }
    void accumulate(const void *src, dsm_dtype_t st, float *dst, size_t n, float scale) override {
        check(cuda::detail::launch_axpy(src, cuda::detail::fmt_of(st, "accumulate", true), dst, n, scale, stream_),
              "accumulate");
    }
    amp::NormPart inspect(const float *x, size_t n, float scale) override {
        const cuda::ReduceResult r = reduce(x, DSM_FLOAT32, n, scale);
        amp::NormPart np;
        np.sumsq = r.sum[0];
        np.nonfinite = r.nonfinite != 0;
        return np;
    }
    bool has_nonfinite(const void *x, dsm_dtype_t t, size_t n) override {
        return reduce(x, t, n, 1.0f).nonfinite != 0;
    }
    void run(std::function<void()>) override {
        DSM_FAIL(DSM_ERR_INTERNAL, "host code cannot run on ", name(), " memory");
    }

private:
    static void check(const char *err, const char *what) {
        if (err != nullptr) DSM_FAIL(DSM_ERR_CUDA, "dsm::device::cuda ", what, ": ", err);
    }
    // One inspect pass and the one small copy of its result.
    cuda::ReduceResult reduce(const void *x, dsm_dtype_t t, size_t n, float scale) {
        auto *red = static_cast<cuda::Reduction *>(reduction_.get());
        cuda::inspect(x, t, n, scale, red, stream_);
        DSM_CHECK_CUDA(cudaMemcpyAsync(result_.get(), red, sizeof(cuda::ReduceResult), cudaMemcpyDeviceToHost,
                                       stream_));
        synchronize();
        return *static_cast<const cuda::ReduceResult *>(result_.get());
    }

    int device_;
    cuda::Stream own_;
    cudaStream_t stream_ = nullptr;
    cuda::DeviceBuffer reduction_;
    cuda::PinnedBuffer result_;
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
