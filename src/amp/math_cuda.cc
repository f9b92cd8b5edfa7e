// amp's table for the CUDA space (math.hpp): src/optim/*_cuda.cu on the
// space's stream; inspect's result comes back in one small copy.
#include "dsm_config.h"

#include "amp/math.hpp"

#include "core/error.hpp"

#if DSM_HAVE_CUDA_KERNELS
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/device.hpp"
#include "optim/kernels_cuda.hpp"
#endif

namespace dsm {
namespace amp {

#if DSM_HAVE_CUDA_KERNELS

namespace {

class CudaMath final : public Math {
public:
    explicit CudaMath(device::Space &space)
        : space_(space), reduction_(sizeof(cuda::Reduction)), result_(sizeof(cuda::ReduceResult)) {}
    void convert(const void *src, dsm_dtype_t st, void *dst, dsm_dtype_t dt, size_t n) override {
        cuda::convert(src, st, dst, dt, n, stream());
    }
    void scale(void *x, dsm_dtype_t t, size_t n, double s) override {
        check(cuda::detail::launch_scale(x, cuda::detail::fmt_of(t, "scale", true), n, static_cast<float>(s),
                                         stream()),
              "scale");
    }
    void accumulate(const void *src, dsm_dtype_t st, float *dst, size_t n, float scale) override {
        check(cuda::detail::launch_axpy(src, cuda::detail::fmt_of(st, "accumulate", true), dst, n, scale, stream()),
              "accumulate");
    }
    NormPart inspect(const float *x, size_t n, float scale) override {
        const cuda::ReduceResult r = reduce(x, DSM_FLOAT32, n, scale);
        NormPart np;
        np.sumsq = r.sum[0];
        np.nonfinite = r.nonfinite != 0;
        return np;
    }
    NormPart inspect(const void *x, dsm_dtype_t t, size_t n, float scale) override {
        const cuda::ReduceResult r = reduce(x, t, n, scale);
        NormPart np;
        np.sumsq = r.sum[0];
        np.nonfinite = r.nonfinite != 0;
        return np;
    }
    bool accumulate_pieces(const std::vector<Piece> &pieces, dsm_dtype_t st, void *dst, dsm_dtype_t dt,
                           float scale) override {
        const cuda::detail::Fmt sf = cuda::detail::fmt_of(st, "accumulate source", true);
        const cuda::detail::Fmt df = cuda::detail::fmt_of(dt, "accumulate destination", true);
        std::vector<cuda::MtEntry> entries;
        entries.reserve(pieces.size());
        for (const Piece &p : pieces) {
            if (p.count > 0) {
                cuda::detail::need(p.src, cuda::detail::fmt_size(sf), "accumulate source");
                cuda::detail::need(dst, cuda::detail::fmt_size(df), "accumulate destination");
            }
            entries.push_back(cuda::MtEntry{p.offset, p.count, reinterpret_cast<uintptr_t>(p.src)});
        }
        // Batches without overlaps, in order; each in launches of at most
        // kMtParamSegs segments (the table travels in the launch).
        size_t begin = 0;
        for (const size_t end : cuda::mt_batches(entries)) {
            for (size_t b = begin; b < end; b += cuda::detail::kMtParamSegs) {
                const size_t e = std::min(end, b + cuda::detail::kMtParamSegs);
                const cuda::MtTable t =
                    cuda::mt_plan(std::vector<cuda::MtEntry>(entries.begin() + static_cast<std::ptrdiff_t>(b),
                                                             entries.begin() + static_cast<std::ptrdiff_t>(e)));
                check(cuda::detail::launch_mt_axpy(sf, dst, df, t.segs.data(), static_cast<unsigned>(t.segs.size()),
                                                   scale, stream()),
                      "accumulate_pieces");
            }
            begin = end;
        }
        return true;
    }
    // A 16-bit dst: one multi-tensor launch of one piece, widened, added in
    // fp32 and rounded once in registers (the host's bits).
    void accumulate_into(const void *src, dsm_dtype_t st, void *dst, dsm_dtype_t dt, size_t n, float scale) override {
        if (dt == DSM_FLOAT32) return accumulate(src, st, static_cast<float *>(dst), n, scale);
        if (n > 0) accumulate_pieces({Piece{src, 0, n}}, st, dst, dt, scale);
    }
    bool has_nonfinite(const void *x, dsm_dtype_t t, size_t n) override {
        return reduce(x, t, n, 1.0f).nonfinite != 0;
    }

private:
    cudaStream_t stream() const noexcept { return static_cast<cudaStream_t>(space_.queue().handle()); }
    static void check(const char *err, const char *what) {
        if (err != nullptr) DSM_FAIL(DSM_ERR_CUDA, "amp::", what, " on the device: ", err);
    }
    // One inspect pass (overflow flag and sum of squares together) and the
    // one small copy of its result.
    cuda::ReduceResult reduce(const void *x, dsm_dtype_t t, size_t n, float scale) {
        auto *red = static_cast<cuda::Reduction *>(reduction_.get());
        cuda::inspect(x, t, n, scale, red, stream());
        DSM_CHECK_CUDA(cudaMemcpyAsync(result_.get(), red, sizeof(cuda::ReduceResult), cudaMemcpyDeviceToHost,
                                       stream()));
        space_.synchronize();
        return *static_cast<const cuda::ReduceResult *>(result_.get());
    }

    device::Space &space_;
    cuda::DeviceBuffer reduction_;
    cuda::PinnedBuffer result_;
};

} // namespace

std::unique_ptr<Math> make_cuda_math(device::Space &space) { return std::make_unique<CudaMath>(space); }

#else

std::unique_ptr<Math> make_cuda_math(device::Space &space) {
    DSM_FAIL(DSM_ERR_NOT_SUPPORTED, "amp on ", space.name(), ": libdsm was built without the CUDA kernels");
}

#endif

} // namespace amp
} // namespace dsm
