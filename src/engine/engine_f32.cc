// The fp32 helpers: a parameter's values as fp32 in host memory, and an
// fp32 gradient from host memory added into the engine's, whatever the
// compute dtype and wherever the engine keeps them (host, a CUDA device, the
// simulated device, ZeRO-Offload's device copies).
#include "dsm_config.h"

#include <cstring>
#include <vector>

#include "amp/convert.hpp"
#include "core/error.hpp"
#include "engine/engine.hpp"

namespace dsm {
namespace engine {

namespace {

void check_count(const Param &p, int64_t count) {
    DSM_REQUIRE(count >= 0 && static_cast<uint64_t>(count) == p.numel, DSM_ERR_INVALID_ARGUMENT, "count ", count,
                " is not the ", p.numel, " elements of parameter '", p.name, "'");
}

} // namespace

void Engine::param_read_f32(int index, float *out, int64_t count) {
    Param &p = param(index);
    check_count(p, count);
    DSM_REQUIRE(out != nullptr || p.numel == 0, DSM_ERR_NULL_POINTER, "values is NULL");
    // qwZ: a read gathers at full precision (a parameter gathered already
    // gives the values the forward sees).
    struct Exact {
        zero::Stage *s;
        ~Exact() { s->set_exact_gathers(false); }
    } exact{stage_.get()};
    stage_->set_exact_gathers(true);
    const void *v = param_acquire(index); // collective under ZeRO-3, as the acquire
    try {
        device::Space &s = user_space();
        if (dtype_ == DSM_FLOAT32) {
            s.download(out, v, p.numel * sizeof(float));
        } else {
            std::vector<unsigned char> tmp(p.numel * esize_);
            s.download(tmp.data(), v, tmp.size());
            amp::convert(tmp.data(), dtype_, out, DSM_FLOAT32, p.numel);
        }
    } catch (...) {
        param_release(index);
        throw;
    }
    param_release(index);
}

void Engine::grad_add_f32(int index, const float *grad, int64_t count) {
    Param &p = param(index);
    DSM_REQUIRE(p.trainable, DSM_ERR_INVALID_ARGUMENT, "parameter '", p.name,
                "' is frozen (trainable = 0): it has no gradient");
    check_count(p, count);
    DSM_REQUIRE(grad != nullptr || p.numel == 0, DSM_ERR_NULL_POINTER, "grad is NULL");
    void *g = grad_acquire(index);
    try {
        device::Space &s = user_space();
        if (dtype_ == DSM_FLOAT32 && s.kind() == device::Kind::HOST) {
            float *dst = static_cast<float *>(g);
            for (size_t i = 0; i < p.numel; ++i) dst[i] += grad[i];
        } else {
            // The buffer's sum so far, as fp32; plus the gradient; back.
            std::vector<unsigned char> tmp(p.numel * esize_);
            std::vector<float> sum(p.numel);
            s.download(tmp.data(), g, tmp.size());
            amp::convert(tmp.data(), dtype_, sum.data(), DSM_FLOAT32, p.numel);
            for (size_t i = 0; i < p.numel; ++i) sum[i] += grad[i];
            amp::convert(sum.data(), DSM_FLOAT32, tmp.data(), dtype_, p.numel);
            s.upload(g, tmp.data(), tmp.size());
        }
    } catch (...) {
        // The gradient is released either way: a failed copy leaves it as it was.
        grad_release(index);
        throw;
    }
    grad_release(index);
}

} // namespace engine
} // namespace dsm
