// The CPU optimizers: per-step constants, the choice of kernels and the
// threading around them (the kernels themselves are in kernels.hpp).
//
// A step cuts every segment at multiples of kChunk elements of the partition
// into work items, and one OpenMP loop with a static schedule runs the items.
// An element's arithmetic depends only on its item (which lanes are vector
// body, which scalar tail), never on which thread runs it, so results are
// the same for every thread count. Lamb's sums are per item, combined in item
// order after the loop.
#include "optim/optimizer.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/simd.hpp"
#include "core/error.hpp"
#include "core/half.hpp"
#include "dsm.h"
#include "dsm_config.h"
#include "optim/kernels.hpp"
#if DSM_HAVE_CUDA_KERNELS
#include <cuda_runtime.h>

#include "cuda/device.hpp"
#include "optim/kernels_cuda.hpp"
#endif

namespace dsm {
namespace optim {


namespace {

// Elements per work item: 16K fp32 = 64 KiB per array, large enough to
// amortize the loop and small enough to balance threads.
constexpr size_t kChunk = 16384;

// ---------------------------------------------------------------- ISA choice

simd::Dispatch<Kernels> g_isa{kernels<simd::Isa::generic>, kernels<simd::Isa::avx2>, kernels<simd::Isa::avx512>};
std::atomic<int> g_threads{0};

const Kernels &active() noexcept { return g_isa.active(); }


// ---------------------------------------------------------------- work items

struct Item {
    size_t begin = 0, count = 0;
    const Segment *seg = nullptr;
};

// Segments cut at multiples of kChunk; checks that they fit and do not overlap.
std::vector<Item> items_of(const std::vector<Segment> &segments, size_t n) {
    for (size_t i = 0; i < segments.size(); ++i) {
        const Segment &s = segments[i];
        DSM_REQUIRE(s.offset <= n && s.count <= n - s.offset, DSM_ERR_INVALID_ARGUMENT, "segment ", i,
                    " [", s.offset, ", ", s.offset + s.count, ") lies outside the partition of ", n,
                    " elements");
        DSM_REQUIRE(s.param >= 0, DSM_ERR_INVALID_ARGUMENT, "segment ", i, " has parameter index ",
                    s.param, " (expected >= 0)");
    }
    std::vector<const Segment *> sorted;
    sorted.reserve(segments.size());
    for (const Segment &s : segments)
        if (s.count > 0) sorted.push_back(&s);
    std::sort(sorted.begin(), sorted.end(),
              [](const Segment *a, const Segment *b) { return a->offset < b->offset; });
    for (size_t i = 1; i < sorted.size(); ++i)
        DSM_REQUIRE(sorted[i - 1]->offset + sorted[i - 1]->count <= sorted[i]->offset,
                    DSM_ERR_INVALID_ARGUMENT, "segments [", sorted[i - 1]->offset, ", ",
                    sorted[i - 1]->offset + sorted[i - 1]->count, ") and [", sorted[i]->offset, ", ",
                    sorted[i]->offset + sorted[i]->count, ") overlap");

    std::vector<Item> items;
    for (const Segment &s : segments) { // caller's order: Lamb's sums combine in this order
        size_t b = s.offset;
        const size_t e = s.offset + s.count;
        while (b < e) {
            const size_t stop = std::min(e, (b / kChunk + 1) * kChunk);
            items.push_back(Item{b, stop - b, &s});
            b = stop;
        }
    }
    return items;
}

int threads_for(size_t work_items) noexcept {
    const int t = num_threads();
    return static_cast<int>(std::min<size_t>(static_cast<size_t>(t), std::max<size_t>(work_items, 1)));
}

// f(i) for every item i in one parallel region. f must not throw.
template <class F> void for_items(size_t count, const F &f) {
    const int t = threads_for(count);
    const long long n = static_cast<long long>(count);
    if (t <= 1) {
        for (long long i = 0; i < n; ++i) f(static_cast<size_t>(i));
        return;
    }
#pragma omp parallel for schedule(static) num_threads(t)
    for (long long i = 0; i < n; ++i) f(static_cast<size_t>(i));
}

// ---------------------------------------------------------------- constants

// The beta2 of this step: StepArgs::beta2 when set, else the configured one.
inline double beta2_of(const Hyper &h, const StepArgs &a) { return a.beta2 >= 0 ? a.beta2 : h.beta2; }

double bias(double beta, int64_t step, bool on) {
    return on ? 1.0 - std::pow(beta, static_cast<double>(step)) : 1.0;
}

float f32(double x) { return static_cast<float>(x); }

AdamK adam_k(const Hyper &h, const StepArgs &a, bool decay) {
    const double wd = decay ? h.weight_decay : 0.0;
    const double bc1 = bias(a.beta1, a.step, h.bias_correction);
    const double bc2 = bias(beta2_of(h, a), a.step, h.bias_correction);
    AdamK k{};
    k.b1 = f32(a.beta1);
    k.omb1 = f32(1.0 - a.beta1);
    k.b2 = f32(beta2_of(h, a));
    k.omb2 = f32(1.0 - beta2_of(h, a));
    k.eps = f32(h.eps);
    k.step = f32(-a.lr / bc1);
    k.ibc2 = f32(1.0 / std::sqrt(bc2));
    k.l2 = h.adam_w_mode ? 0.0f : f32(wd);
    k.decay = h.adam_w_mode ? f32(-a.lr * wd) : 0.0f;
    k.scale = a.grad_scale;
    // PyTorch: p.mul_(1 - lr * weight_decay), step_size = lr / bc1,
    // bias_correction2_sqrt = sqrt(bc2), each a Python float (double) that
    // the tensor operation rounds to float.
    k.torch = h.torch_adam ? 1 : 0;
    k.keep = h.adam_w_mode ? f32(1.0 - a.lr * wd) : 1.0f;
    k.bc2s = f32(std::sqrt(bc2));
    return k;
}

SgdK sgd_k(const Hyper &h, const StepArgs &a, bool decay) {
    SgdK k{};
    k.wd = decay ? f32(h.weight_decay) : 0.0f;
    k.neg_lr = f32(-a.lr);
    k.scale = a.grad_scale;
    k.mode = h.momentum == 0.0 ? 0 : (h.nesterov ? 2 : 1);
    const bool first = a.step == 1; // torch: the buffer starts as a copy of g
    k.mom = first ? 0.0f : f32(h.momentum);
    k.damp = first ? 1.0f : f32(1.0 - h.dampening);
    k.nesterov = f32(h.momentum);
    return k;
}

LionK lion_k(const Hyper &h, const StepArgs &a, bool decay) {
    LionK k{};
    k.b1 = f32(a.beta1);
    k.omb1 = f32(1.0 - a.beta1);
    k.b2 = f32(beta2_of(h, a));
    k.omb2 = f32(1.0 - beta2_of(h, a));
    k.neg_lr = f32(-a.lr);
    k.keep = f32(1.0 - a.lr * (decay ? h.weight_decay : 0.0));
    k.scale = a.grad_scale;
    return k;
}

AdagradK adagrad_k(const Hyper &h, const StepArgs &a, bool decay) {
    AdagradK k{};
    k.wd = decay ? f32(h.weight_decay) : 0.0f;
    k.eps = f32(h.eps);
    k.neg_clr = f32(-a.lr / (1.0 + static_cast<double>(a.step - 1) * h.lr_decay));
    k.scale = a.grad_scale;
    return k;
}

LambK lamb_k(const Hyper &h, const StepArgs &a, bool decay) {
    LambK k{};
    k.b1 = f32(a.beta1);
    k.omb1 = f32(1.0 - a.beta1);
    k.b2 = f32(beta2_of(h, a));
    k.omb2 = f32(1.0 - beta2_of(h, a));
    k.eps = f32(h.eps);
    k.wd = decay ? f32(h.weight_decay) : 0.0f;
    k.scale = a.grad_scale;
    return k;
}

// Constants for segments with and without decay, picked per item.
template <class K> struct Pair {
    K on, off;
    const K &of(const Segment &s) const { return s.decay ? on : off; }
};
template <class K>
Pair<K> pair(K (*make)(const Hyper &, const StepArgs &, bool), const Hyper &h, const StepArgs &a) {
    return Pair<K>{make(h, a, true), make(h, a, false)};
}

// Lamb pass 2's coefficient of parameter q from the summed norms:
// -lr * sqrt(bc2) / bc1 * trust ratio.
float lamb_neg_coef(const Hyper &h, const StepArgs &a, const std::vector<double> &sums, size_t q) {
    const double step_size = h.bias_correction ? a.lr * std::sqrt(bias(beta2_of(h, a), a.step, true)) /
                                                     bias(a.beta1, a.step, true)
                                               : a.lr;
    const double w = std::sqrt(sums[2 * q]), u = std::sqrt(sums[2 * q + 1]);
    double ratio = 1.0;
    if (w != 0.0 && u != 0.0) ratio = std::min(std::max(w / u, h.min_coeff), h.max_coeff);
    return f32(-step_size * ratio);
}

// Lamb: pass 1 over the items, per-parameter sums, `sum`, trust ratios, pass 2.
void lamb_step(const Kernels &kern, const Hyper &h, const StepArgs &a, float *p, const float *g,
               float *m, float *v, const std::vector<Item> &items, const std::vector<Segment> &segments,
               const SumFn &sum) {
    const Pair<LambK> k = pair(lamb_k, h, a);
    std::vector<double> partial(2 * items.size(), 0.0);
    for_items(items.size(), [&](size_t i) {
        const Item &it = items[i];
        kern.lamb1(k.of(*it.seg), p + it.begin, g + it.begin, m + it.begin, v + it.begin, it.count,
                   &partial[2 * i]);
    });

    int top = -1;
    for (const Segment &s : segments) top = std::max(top, s.param);
    const size_t need = 2 * static_cast<size_t>(top + 1);
    std::vector<double> sums(need, 0.0);
    for (size_t i = 0; i < items.size(); ++i) { // item order: fixed, whatever the thread count
        sums[2 * static_cast<size_t>(items[i].seg->param)] += partial[2 * i];
        sums[2 * static_cast<size_t>(items[i].seg->param) + 1] += partial[2 * i + 1];
    }
    if (sum) sum(sums);
    DSM_REQUIRE(sums.size() >= need, DSM_ERR_INTERNAL, "Lamb's sum function left ", sums.size(),
                " values; parameters up to ", top, " need ", need);

    std::vector<float> neg_coef(static_cast<size_t>(top + 1), 0.0f);
    for (size_t q = 0; q < neg_coef.size(); ++q) neg_coef[q] = lamb_neg_coef(h, a, sums, q);
    for_items(items.size(), [&](size_t i) {
        const Item &it = items[i];
        kern.lamb2(k.of(*it.seg), neg_coef[static_cast<size_t>(it.seg->param)], p + it.begin,
                   m + it.begin, v + it.begin, it.count);
    });
}

} // namespace

// ---------------------------------------------------------------- types

int state_count(OptimizerType type, double momentum) {
    switch (type) {
    case OptimizerType::ADAM:
    case OptimizerType::ADAMW:
    case OptimizerType::LAMB: return 2;
    case OptimizerType::SGD: return momentum != 0.0 ? 1 : 0; // torch.optim.SGD: no buffer without momentum
    case OptimizerType::LION:
    case OptimizerType::ADAGRAD: return 1;
    case OptimizerType::NONE: return 0;
    }
    return 0;
}

int state_count(const Hyper &hyper) { return state_count(hyper.type, hyper.momentum); }

const char *state_name(OptimizerType type, int index) {
    const int most = state_count(type, 1.0);
    DSM_REQUIRE(index >= 0 && index < most, DSM_ERR_INVALID_ARGUMENT, "state index ", index,
                " out of range for optimizer ", optimizer_name(type), " (", most, " states)");
    switch (type) {
    case OptimizerType::SGD: return "momentum_buffer";
    case OptimizerType::ADAGRAD: return "sum";
    case OptimizerType::LION: return "exp_avg";
    default: return index == 0 ? "exp_avg" : "exp_avg_sq";
    }
}

const char *active_isa() noexcept { return active().name; }

void set_num_threads(int n) {
    DSM_REQUIRE(n >= 0, DSM_ERR_INVALID_ARGUMENT, "optimizer thread count ", n,
                " (expected >= 0; 0 = OpenMP's default)");
    g_threads.store(n, std::memory_order_relaxed);
}

int num_threads() noexcept {
    const int n = g_threads.load(std::memory_order_relaxed);
    if (n > 0) return n;
#ifdef _OPENMP
    return std::max(1, omp_get_max_threads());
#else
    return 1;
#endif
}

// ---------------------------------------------------------------- Optimizer

static void fill_device(device::Space &space, float *d, size_t n, float v); // below

Optimizer::Optimizer(const Hyper &hyper, size_t n, device::Space &space) : hyper_(hyper), n_(n), space_(&space) {
    const int count = state_count(hyper);
    DSM_REQUIRE(hyper.type != OptimizerType::NONE, DSM_ERR_INVALID_ARGUMENT, "optimizer type ",
                optimizer_name(hyper.type), " has no update rule");
    DSM_REQUIRE(n <= (SIZE_MAX - 64) / sizeof(float), DSM_ERR_INVALID_ARGUMENT, "optimizer size ", n,
                " elements is too large");
    const size_t bytes = std::max<size_t>(n, 1) * sizeof(float);
    const float init =
        hyper.type == OptimizerType::ADAGRAD ? static_cast<float>(hyper.initial_accumulator_value) : 0.0f;
    for (int s = 0; s < count; ++s) {
        try {
            states_.emplace_back(space, bytes, false);
        } catch (const Error &e) {
            DSM_FAIL(e.status(), "optimizer state \"", state_name(hyper.type, s), "\": ", e.message());
        }
        float *d = state(s);
        if (space.kind() == device::Kind::HOST) {
            // First touch in the threads and chunks of the steps (NUMA placement).
            for_items((n + kChunk - 1) / kChunk, [&](size_t c) {
                const size_t b = c * kChunk, e = std::min(n, b + kChunk);
                std::fill(d + b, d + e, init);
            });
        } else if (space.host_addressable()) {
            space.run([d, n, init] { std::fill(d, d + std::max<size_t>(n, 1), init); });
        } else {
            fill_device(space, d, std::max<size_t>(n, 1), init);
        }
    }
}

Optimizer::~Optimizer() = default;

size_t Optimizer::grain() noexcept { return kChunk; }

std::vector<Segment> within(const std::vector<Segment> &segments, size_t lo, size_t hi) {
    std::vector<Segment> out;
    for (const Segment &s : segments) {
        const size_t b = std::max(s.offset, lo), e = std::min(s.offset + s.count, hi);
        if (b >= e) continue;
        Segment c = s;
        c.offset = b;
        c.count = e - b;
        out.push_back(c);
    }
    return out;
}

void Optimizer::step_upto(float *p, const float *g, const std::vector<Segment> &segments, const StepArgs &args,
                          size_t *done, size_t upto, const Fused *fused) {
    DSM_REQUIRE(piecewise(), DSM_ERR_INTERNAL, "the optimizer's update cannot run in pieces");
    const size_t end = std::min(n_, (upto + kChunk - 1) / kChunk * kChunk);
    if (end <= *done) return;
    if (*done == 0 && end == n_) step(p, g, segments, args, SumFn(), fused); // the whole update at once
    else step(p, g, within(segments, *done, end), args, SumFn(), fused);
    *done = end;
}

bool Optimizer::fuses() const noexcept {
    return (space_->kind() == device::Kind::HOST || !space_->host_addressable()) && piecewise();
}

void Optimizer::step(float *p, const float *g, const std::vector<Segment> &segments, const StepArgs &args,
                     const SumFn &sum, const Fused *fused) {
    if (fused != nullptr) {
        DSM_REQUIRE(fuses(), DSM_ERR_INTERNAL, "a fused step on ", space_->name(), " with ",
                    optimizer_name(hyper_.type));
        DSM_REQUIRE(args.step >= 1, DSM_ERR_INVALID_ARGUMENT, "optimizer step ", args.step, " (expected >= 1)");
        if (!space_->host_addressable()) {
            (void)items_of(segments, n_); // the checks, before anything is enqueued
            cuda_step(p, g, segments, args, sum, fused);
            return;
        }
        host_step(p, g, segments, args, sum, fused);
        return;
    }
    DSM_REQUIRE(args.step >= 1, DSM_ERR_INVALID_ARGUMENT, "optimizer step ", args.step, " (expected >= 1)");
    // On the host, and Lamb anywhere host-addressable (its sums come back to
    // the host between its passes): now, checked once by host_step.
    const bool now = hyper_.type == OptimizerType::LAMB || space_->kind() == device::Kind::HOST;
    if (space_->host_addressable() && now) {
        space_->synchronize();
        host_step(p, g, segments, args, sum);
        return;
    }
    (void)items_of(segments, n_); // the checks, before anything is enqueued
    if (!space_->host_addressable()) cuda_step(p, g, segments, args, sum);
    else space_->run([this, p, g, segments, args] { host_step(p, g, segments, args, SumFn()); });
}

void Optimizer::host_step(float *p, const float *g, const std::vector<Segment> &segments, const StepArgs &args,
                          const SumFn &sum, const Fused *fused) {
    const std::vector<Item> items = items_of(segments, n_);
    if (items.empty() && hyper_.type != OptimizerType::LAMB) return;
    const Fused none;
    const Fused &f = fused != nullptr ? *fused : none;
    if (!items.empty()) {
        DSM_ARG_NOT_NULL(p);
        if (f.grad16 == nullptr) DSM_ARG_NOT_NULL(g);
    }
    DSM_REQUIRE((f.grad16 == nullptr && f.param16 == nullptr) || f.dtype == DSM_BFLOAT16 || f.dtype == DSM_FLOAT16,
                DSM_ERR_INTERNAL, "fused step: 16-bit dtype ", f.dtype);
    const Kernels &kern = active();
    float *s0 = states_.empty() ? nullptr : state(0); // none: SGD without momentum
    // One work item: the gradient it reads (g's, or grad16's converted into
    // the thread's buffer), the kernel, then the 16-bit parameters and the
    // zeroing while the item's elements are in the cache.
    const bool bf16 = f.dtype == DSM_BFLOAT16;
    auto item = [&](const Item &it, auto &&kernel) {
        const float *gi = g != nullptr ? g + it.begin : nullptr;
        if (f.grad16 != nullptr) {
            thread_local std::vector<float> buf;
            if (buf.size() < kChunk) buf.resize(kChunk);
            const auto *h = static_cast<const uint16_t *>(f.grad16) + it.begin;
            float *b = buf.data();
            if (bf16)
                kern.bf16_to_f32(h, b, it.count);
            else
                for (size_t i = 0; i < it.count; ++i) b[i] = fp16_to_fp32(h[i]);
            gi = b;
        }
        kernel(gi);
        if (f.param16 != nullptr) {
            auto *h = static_cast<uint16_t *>(f.param16) + it.begin;
            const float *x = p + it.begin;
            if (bf16)
                kern.f32_to_bf16(x, h, it.count);
            else
                for (size_t i = 0; i < it.count; ++i) h[i] = fp32_to_fp16(x[i]);
        }
        if (f.zero_grads) {
            if (f.grad16 != nullptr)
                std::memset(static_cast<uint16_t *>(const_cast<void *>(f.grad16)) + it.begin, 0, it.count * 2);
            else
                std::memset(const_cast<float *>(g) + it.begin, 0, it.count * sizeof(float));
        }
    };
    switch (hyper_.type) {
    case OptimizerType::ADAM:
    case OptimizerType::ADAMW: {
        const Pair<AdamK> k = pair(adam_k, hyper_, args);
        float *s1 = state(1);
        if (bf16 && f.grad16 != nullptr && f.param16 != nullptr) {
            // bf16 gradients widened, parameters rounded and gradients zeroed
            // in the kernel's registers: one pass, no conversion buffer.
            auto *g16 = static_cast<uint16_t *>(const_cast<void *>(f.grad16));
            auto *p16 = static_cast<uint16_t *>(f.param16);
            for_items(items.size(), [&](size_t i) {
                const Item &it = items[i];
                kern.adam_bf16(k.of(*it.seg), p + it.begin, g16 + it.begin, s0 + it.begin, s1 + it.begin,
                               p16 + it.begin, it.count, f.zero_grads);
            });
            break;
        }
        if (f.grad16 == nullptr && f.param16 == nullptr && f.zero_grads) {
            // fp32: the gradients zeroed by the kernel as it reads them.
            float *gz = const_cast<float *>(g);
            for_items(items.size(), [&](size_t i) {
                const Item &it = items[i];
                kern.adam_zero(k.of(*it.seg), p + it.begin, gz + it.begin, s0 + it.begin, s1 + it.begin, it.count);
            });
            break;
        }
        for_items(items.size(), [&](size_t i) {
            const Item &it = items[i];
            item(it, [&](const float *gi) {
                kern.adam(k.of(*it.seg), p + it.begin, gi, s0 + it.begin, s1 + it.begin, it.count);
            });
        });
        break;
    }
    case OptimizerType::SGD: {
        const Pair<SgdK> k = pair(sgd_k, hyper_, args);
        for_items(items.size(), [&](size_t i) {
            const Item &it = items[i];
            item(it, [&](const float *gi) { kern.sgd(k.of(*it.seg), p + it.begin, gi, s0 ? s0 + it.begin : nullptr, it.count); });
        });
        break;
    }
    case OptimizerType::LION: {
        const Pair<LionK> k = pair(lion_k, hyper_, args);
        for_items(items.size(), [&](size_t i) {
            const Item &it = items[i];
            item(it, [&](const float *gi) { kern.lion(k.of(*it.seg), p + it.begin, gi, s0 + it.begin, it.count); });
        });
        break;
    }
    case OptimizerType::ADAGRAD: {
        const Pair<AdagradK> k = pair(adagrad_k, hyper_, args);
        for_items(items.size(), [&](size_t i) {
            const Item &it = items[i];
            item(it, [&](const float *gi) {
                kern.adagrad(k.of(*it.seg), p + it.begin, gi, s0 + it.begin, it.count);
            });
        });
        break;
    }
    case OptimizerType::LAMB:
        // Two parallel regions: `sum` (an MPI collective) runs between them on
        // the calling thread, and may throw.
        lamb_step(kern, hyper_, args, p, g, s0, state(1), items, segments, sum);
        break;
    case OptimizerType::NONE: break;
    }
}

// The states' initial value on a CUDA space.
#if DSM_HAVE_CUDA_KERNELS
static void fill_device(device::Space &space, float *d, size_t n, float v) {
    const char *err = cuda::detail::launch_fill(d, n, v, static_cast<cudaStream_t>(space.queue().handle()));
    if (err != nullptr) DSM_FAIL(DSM_ERR_CUDA, "optimizer state initialization on ", space.name(), ": ", err);
}
#else
static void fill_device(device::Space &space, float *, size_t, float) {
    DSM_FAIL(DSM_ERR_NOT_SUPPORTED, "the optimizer on ", space.name(), ": libdsm was built without the CUDA kernels");
}
#endif

// The CUDA space: one multi-tensor launch over the segments' table (each
// segment's constants by its weight decay), with the Fused work in the same
// pass; Lamb's pass 1 writes one Reduction per segment, whose results come
// back in one strided copy.
#if DSM_HAVE_CUDA_KERNELS
void Optimizer::cuda_step(float *p, const float *g, const std::vector<Segment> &segments, const StepArgs &args,
                          const SumFn &sum, const Fused *fused) {
    auto *stream = static_cast<cudaStream_t>(space_->queue().handle());
    auto flat = [&](const Segment &sg) {
        cuda::Flat f;
        f.p = p + sg.offset;
        f.g = g + sg.offset;
        f.n = sg.count;
        return f;
    };
    float *s0 = states_.empty() ? nullptr : state(0); // none: SGD without momentum
    float *s1 = states_.size() > 1 ? state(1) : nullptr;
    // The multi-tensor arrays: the table (cached while the segments stay the
    // same), p, the gradient (fp32 g, or Fused's 16-bit one), the states.
    auto arrays = [&]() {
        cuda::detail::MtArrays a;
        std::vector<cuda::MtEntry> entries;
        entries.reserve(segments.size());
        size_t total = 0;
        for (const Segment &sg : segments) {
            entries.push_back(cuda::MtEntry{sg.offset, sg.count, sg.decay ? cuda::kMtDecay : 0});
            total += sg.count;
        }
        if (total == 0) return a;
        const Fused none;
        const Fused &f = fused != nullptr ? *fused : none;
        a.p = p;
        a.g = f.grad16 != nullptr ? f.grad16 : g;
        a.g_fmt = f.grad16 != nullptr ? cuda::detail::fmt_of(static_cast<dsm_dtype_t>(f.dtype), "gradient", false)
                                      : cuda::detail::Fmt::F32;
        cuda::detail::need(a.p, 4, "p");
        cuda::detail::need(a.g, cuda::detail::fmt_size(a.g_fmt), "g");
        if (f.param16 != nullptr) {
            a.p16 = f.param16;
            a.p16_fmt = cuda::detail::fmt_of(static_cast<dsm_dtype_t>(f.dtype), "p16", false);
            cuda::detail::aligned(a.p16, 2, "p16");
        }
        a.zero_grads = f.zero_grads;
        a.s0 = s0;
        a.s1 = s1;
        if (!mt_) mt_ = std::make_shared<cuda::MtTables>();
        a.segs = static_cast<cuda::MtTables *>(mt_.get())->get(entries, stream, &a.nsegs, &a.chunks, &a.chunk_seg);
        return a;
    };
    auto check = [](const char *err, const char *what) { cuda::detail::check_launch(err, what); };
    switch (hyper_.type) {
    case OptimizerType::ADAM:
    case OptimizerType::ADAMW: {
        const Pair<AdamK> k = pair(adam_k, hyper_, args);
        check(cuda::detail::launch_mt_adam(k.on, k.off, arrays(), stream), "adam");
        break;
    }
    case OptimizerType::SGD: {
        const Pair<SgdK> k = pair(sgd_k, hyper_, args);
        DSM_REQUIRE(k.on.mode >= 0 && k.on.mode <= 2, DSM_ERR_INVALID_ARGUMENT, "sgd: mode ", k.on.mode,
                    " (0: no momentum, 1: momentum, 2: nesterov)");
        check(cuda::detail::launch_mt_sgd(k.on, k.off, arrays(), stream), "sgd");
        break;
    }
    case OptimizerType::LION: {
        const Pair<LionK> k = pair(lion_k, hyper_, args);
        check(cuda::detail::launch_mt_lion(k.on, k.off, arrays(), stream), "lion");
        break;
    }
    case OptimizerType::ADAGRAD: {
        const Pair<AdagradK> k = pair(adagrad_k, hyper_, args);
        check(cuda::detail::launch_mt_adagrad(k.on, k.off, arrays(), stream), "adagrad");
        break;
    }
    case OptimizerType::LAMB: {
        const Pair<LambK> k = pair(lamb_k, hyper_, args);
        const size_t ns = segments.size();
        device::Buffer red(*space_, std::max<size_t>(ns, 1) * sizeof(cuda::Reduction), false);
        auto *r = static_cast<cuda::Reduction *>(red.data());
        for (size_t i = 0; i < ns; ++i)
            cuda::lamb1(k.of(segments[i]), flat(segments[i]), s0 + segments[i].offset, s1 + segments[i].offset, r + i,
                        stream);
        std::vector<cuda::ReduceResult> res(ns);
        if (ns > 0)
            DSM_CHECK_CUDA(cudaMemcpy2DAsync(res.data(), sizeof(cuda::ReduceResult), r, sizeof(cuda::Reduction),
                                             sizeof(cuda::ReduceResult), ns, cudaMemcpyDeviceToHost, stream));
        space_->synchronize();
        int top = -1;
        for (const Segment &sg : segments) top = std::max(top, sg.param);
        const size_t need = 2 * static_cast<size_t>(top + 1);
        std::vector<double> sums(need, 0.0);
        for (size_t i = 0; i < ns; ++i) {
            sums[2 * static_cast<size_t>(segments[i].param)] += res[i].sum[0];
            sums[2 * static_cast<size_t>(segments[i].param) + 1] += res[i].sum[1];
        }
        if (sum) sum(sums);
        DSM_REQUIRE(sums.size() >= need, DSM_ERR_INTERNAL, "Lamb's sum function left ", sums.size(),
                    " values; parameters up to ", top, " need ", need);
        for (const Segment &sg : segments)
            cuda::lamb2(k.of(sg), lamb_neg_coef(hyper_, args, sums, static_cast<size_t>(sg.param)), flat(sg),
                        s0 + sg.offset, s1 + sg.offset, stream);
        space_->synchronize(); // `red` is freed here
        break;
    }
    case OptimizerType::NONE: break;
    }
}
#else
void Optimizer::cuda_step(float *, const float *, const std::vector<Segment> &, const StepArgs &, const SumFn &,
                          const Fused *) {
    DSM_FAIL(DSM_ERR_NOT_SUPPORTED, "the optimizer on ", space_->name(),
             ": libdsm was built without the CUDA kernels");
}
#endif

void adam_update(float *p, const float *g, float *m, float *v, size_t n, const Hyper &h, const StepArgs &a,
                 bool decay) {
    DSM_REQUIRE(a.step >= 1, DSM_ERR_INVALID_ARGUMENT, "optimizer step ", a.step, " (expected >= 1)");
    if (n == 0) return;
    DSM_ARG_NOT_NULL(p);
    DSM_ARG_NOT_NULL(g);
    DSM_ARG_NOT_NULL(m);
    DSM_ARG_NOT_NULL(v);
    const Kernels &kern = active();
    const AdamK k = adam_k(h, a, decay);
    for_items((n + kChunk - 1) / kChunk, [&](size_t c) {
        const size_t b = c * kChunk, count = std::min(n - b, kChunk);
        kern.adam(k, p + b, g + b, m + b, v + b, count);
    });
}

} // namespace optim
} // namespace dsm
