// amp's table for host-addressable spaces (math.hpp), and the choice of table.
#include "amp/math.hpp"

#include "core/error.hpp"

namespace dsm {
namespace amp {

std::unique_ptr<Math> make_cuda_math(device::Space &space); // math_cuda.cc

namespace {

class HostMath final : public Math {
public:
    explicit HostMath(device::Space &space) : space_(space) {}
    void convert(const void *src, dsm_dtype_t st, void *dst, dsm_dtype_t dt, size_t n) override {
        if (n > 0) space_.run([=] { amp::convert(src, st, dst, dt, n); });
    }
    void scale(void *x, dsm_dtype_t t, size_t n, double s) override {
        if (n > 0) space_.run([=] { scale_inplace(x, t, n, s); });
    }
    void accumulate(const void *src, dsm_dtype_t st, float *dst, size_t n, float scale) override {
        if (n > 0) space_.run([=] { amp::accumulate(src, st, dst, n, scale); });
    }
    NormPart inspect(const float *x, size_t n, float scale) override {
        space_.synchronize();
        return norm_part(x, n, scale);
    }
    NormPart inspect(const void *x, dsm_dtype_t t, size_t n, float scale) override {
        space_.synchronize();
        return norm_part(x, t, n, scale);
    }
    bool has_nonfinite(const void *x, dsm_dtype_t t, size_t n) override {
        space_.synchronize();
        return amp::has_nonfinite(x, t, n);
    }
    void accumulate_into(const void *src, dsm_dtype_t st, void *dst, dsm_dtype_t dt, size_t n, float scale) override {
        if (n > 0) space_.run([=] { amp::accumulate_into(src, st, dst, dt, n, scale); });
    }

private:
    device::Space &space_;
};

} // namespace

std::unique_ptr<Math> make_math(device::Space &space) {
    if (space.host_addressable()) return std::make_unique<HostMath>(space);
    return make_cuda_math(space);
}

} // namespace amp
} // namespace dsm
