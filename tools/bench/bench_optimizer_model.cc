// dsm-bench optimizer --model: the optimizer step alone on a real model's
// tensors (bench_optimizer.cc has the command line and the kernel runs).
#include "dsm_config.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <mpi.h>

#include "amp/math.hpp"
#include "bench_model.hpp"
#include "bench_optimizer.hpp"
#include "core/error.hpp"
#include "device/space.hpp"
#include "harness.hpp"
#include "model_list.hpp"
#include "optim/optimizer.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace dsm {
namespace bench {
namespace optimizer {

namespace {

// ---------------------------------------------------------------- --model

// The step alone on a model's list: every tensor one segment of a flat
// partition (offsets in the model's order), as the engine's stage-0 layout
// on one rank has them, without the engine around it.
struct ModelRun {
    double step = 0, bound = -1, bytes_per_element = 36.0;
    int threads = 1;
    std::string where;
};

dsm_dtype_t dtype_of(const std::string &d) {
    return d == "bf16" ? DSM_BFLOAT16 : d == "fp16" ? DSM_FLOAT16 : DSM_FLOAT32;
}

// A gradient value per dtype that the clipping does not clip to nothing:
// 1e-3 in fp32, its 16-bit rounding otherwise (bf16 0x3a83, fp16 0x1419).
void fill_grads(device::Space &space, void *g, size_t n, dsm_dtype_t t, int threads) {
    const size_t es = t == DSM_FLOAT32 ? 4 : 2;
    const uint16_t h = t == DSM_BFLOAT16 ? 0x3a83 : 0x1419;
    const float f = 1e-3f;
    auto fill = [&](void *dst, size_t b, size_t e) {
        if (es == 4) std::fill(static_cast<float *>(dst) + b, static_cast<float *>(dst) + e, f);
        else std::fill(static_cast<uint16_t *>(dst) + b, static_cast<uint16_t *>(dst) + e, h);
    };
    if (space.kind() == device::Kind::HOST) {
#pragma omp parallel for schedule(static) num_threads(threads)
        for (long long c = 0; c < chunks_of(n); ++c) {
            const size_t b = static_cast<size_t>(c) * kChunk;
            fill(g, b, std::min(n, b + kChunk));
        }
        return;
    }
    std::vector<unsigned char> host(n * es);
    fill(host.data(), 0, n);
    space.upload(g, host.data(), n * es);
}

ModelRun time_model(const Options &o, const ModelList &list, device::Space &space, int threads) {
    const bool host = space.kind() == device::Kind::HOST;
    const dsm_dtype_t t = dtype_of(o.dtype);
    const bool half = t != DSM_FLOAT32;
    std::vector<optim::Segment> segs;
    size_t n = 0;
    for (size_t i = 0; i < list.tensors.size(); ++i) {
        optim::Segment s;
        s.offset = n;
        s.count = static_cast<size_t>(list.tensors[i].numel());
        s.param = static_cast<int>(i);
        s.decay = list.tensors[i].decay;
        segs.push_back(s);
        n += s.count;
    }
    optim::Hyper hy;
    hy.type = optim::OptimizerType::ADAMW;
    hy.lr = 1e-4;
    hy.weight_decay = 0.1;
    optim::Optimizer opt(hy, n, space); // the moments, first touched by the step's threads
    auto math = amp::make_math(space);
    // The fp32 master (first touched as the moments), the gradients, and the
    // 16-bit parameters.
    device::Buffer p(space, n * 4, false), g(space, n * (half ? 2 : 4), false);
    device::Buffer p16(space, half ? n * 2 : 1, false), g32(space, half && !host ? n * 4 : 1, false);
    if (host) {
        first_touch(static_cast<float *>(p.data()), n, 0.02f, threads);
        if (half) {
            auto *q = static_cast<uint16_t *>(p16.data());
#pragma omp parallel for schedule(static) num_threads(threads)
            for (long long c = 0; c < chunks_of(n); ++c) {
                const size_t b = static_cast<size_t>(c) * kChunk;
                std::fill(q + b, q + std::min(n, b + kChunk), uint16_t{0});
            }
        }
    } else {
        std::vector<float> init(n, 0.02f);
        space.upload(p.data(), init.data(), n * 4);
        space.zero(p16.data(), p16.bytes());
    }
    // The bound: on the host the streaming kernel; on a device a copy of as
    // many bytes (half read, half written).
    const double bpe = HostBound::bytes_per_element(half);
    std::unique_ptr<HostBound> hb;
    device::Buffer csrc, cdst;
    const size_t copy_bytes = static_cast<size_t>(bpe / 2) * n;
    if (host) hb = std::make_unique<HostBound>(n, half, threads);
    else {
        csrc = device::Buffer(space, copy_bytes, true);
        cdst = device::Buffer(space, copy_bytes, false);
    }
    std::vector<double> steps, bounds;
    for (long long s = 0; s <= o.iters; ++s) {
        fill_grads(space, g.data(), n, t, threads); // the backward's (untimed)
        space.synchronize();
        const double t0 = now_seconds();
        // The clipping: the norm of the gradients (read in place), then
        // AdamW with the clipping coefficient folded into its scale.
        amp::NormPart part;
        if (half && !host) { // a device step reads fp32 gradients: converted first, as the engine does
            math->convert(g.data(), t, g32.data(), DSM_FLOAT32, n);
            part = math->inspect(static_cast<float *>(g32.data()), n, 1.0f);
        } else {
            part = math->inspect(g.data(), t, n, 1.0f); // in place, in its dtype
        }
        const double norm = std::sqrt(part.sumsq);
        optim::StepArgs a;
        a.step = s + 1;
        a.lr = hy.lr;
        a.beta1 = hy.beta1;
        a.grad_scale = static_cast<float>(norm + 1e-6 > 1.0 ? 1.0 / (norm + 1e-6) : 1.0);
        if (host) {
            optim::Fused f; // the engine's host step: one pass per work item
            f.zero_grads = true;
            if (half) {
                f.grad16 = g.data();
                f.param16 = p16.data();
                f.dtype = t;
            }
            opt.step(static_cast<float *>(p.data()), half ? nullptr : static_cast<float *>(g.data()), segs, a, {},
                     &f);
        } else {
            opt.step(static_cast<float *>(p.data()), static_cast<float *>(half ? g32.data() : g.data()), segs, a);
            if (half) math->convert(p.data(), DSM_FLOAT32, p16.data(), t, n);
            space.zero(g.data(), g.bytes());
        }
        space.synchronize();
        const double ts = now_seconds() - t0;
        double tb;
        if (hb) {
            tb = hb->run(MPI_COMM_SELF);
        } else {
            const double c0 = now_seconds();
            space.copy(cdst.data(), csrc.data(), copy_bytes);
            space.synchronize();
            tb = now_seconds() - c0;
        }
        if (s == 0) continue; // warm-up
        steps.push_back(ts);
        bounds.push_back(tb);
    }
    ModelRun r;
    r.step = median(steps);
    r.bound = median(bounds);
    r.bytes_per_element = bpe;
    r.threads = threads;
    r.where = space.name();
    return r;
}

} // namespace

int run_model(const Harness &h, const Options &o, const ModelList &list) {
    std::unique_ptr<device::Space> cuda;
    int threads = 1;
    if (o.device == "cuda") {
        try {
            cuda = device::make_cuda(0);
        } catch (const Error &e) {
            const std::string line = "no CUDA device: skipped (" + e.message() + ")";
            if (h.json())
                h.print(h.result({{"model", list.name}, {"device", "cuda"}, {"dtype", o.dtype}, {"skipped", line}}));
            else
                std::printf("dsm-bench optimizer: %s\n", line.c_str());
            return 0;
        }
    } else {
        if (const int rc = set_threads_isa(o)) return rc;
        threads = optim::num_threads();
#ifdef _OPENMP
        omp_set_num_threads(threads); // the norm's loops
#endif
    }
    const ModelRun r = time_model(o, list, cuda ? *cuda : device::host(), threads);
    cuda.reset();
    TorchModel torch;
    if (o.torch) model_torch(list, threads, static_cast<int>(o.iters), o.device, torch, MPI_COMM_SELF);
    auto ratio = [](double a, double b) { return a > 0 && b > 0 ? Json(a / b) : Json(nullptr); };
    const long long params = static_cast<long long>(list.numel());
    if (h.json()) {
        const Json t = torch_json(torch);
        h.print(h.result({{"model", list.name},
                         {"tensors", list.tensors.size()},
                         {"params", params},
                         {"dtype", o.dtype},
                         {"device", o.device},
                         {"space", r.where},
                         {"threads", r.threads},
                         {"isa", o.device == "cuda" ? Json(nullptr) : Json(optim::active_isa())},
                         {"iters", o.iters},
                         {"step_seconds", r.step},
                         {"bound_seconds", r.bound},
                         {"bound_bytes_per_element", r.bytes_per_element},
                         {"bound_over_step", ratio(r.bound, r.step)},
                         {"torch_over_step", ratio(torch.step, r.step)},
                         {"torch_zero_grad_over_step", ratio(torch.step_zero_grad, r.step)},
                         {"torch", t}}));
        return 0;
    }
    std::printf("dsm-bench optimizer --model %s: %zu tensors, %lld parameters, %s, clipping 1.0 + AdamW, %s, "
                "%d threads (median of %lld steps)\n",
                list.name.c_str(), list.tensors.size(), params, o.dtype.c_str(), r.where.c_str(), r.threads,
                o.iters);
    std::printf("  step (norm, clipping, AdamW, zeroing)  %9.2f ms\n", 1e3 * r.step);
    std::printf("  bound (%2.0f B/element%s)      %9.2f ms   bound/step %.2f (target >= 0.85)\n",
                r.bytes_per_element, o.device == "cuda" ? ", device copy" : ", same threads", 1e3 * r.bound,
                r.bound / r.step);
    if (torch.step > 0)
        std::printf("  torch %s, %s, %d threads: %.2f ms per step (torch/step %.2fx), %.2f ms with "
                    "zero_grad(set_to_none=False) (%.2fx)\n",
                    torch.version.c_str(), torch.what.c_str(), torch.threads, 1e3 * torch.step, torch.step / r.step,
                    1e3 * torch.step_zero_grad, torch.step_zero_grad / r.step);
    else
        std::printf("  torch: not measured (no python3 with torch, or --no-torch)\n");
    return 0;
}

} // namespace optimizer
} // namespace bench
} // namespace dsm
