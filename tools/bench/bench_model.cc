// dsm-bench zero --model: the engine's step on a real model's parameter list
// (model_list.hpp) at each ZeRO stage, next to two figures measured in the
// same run:
//
// - the bound: the bytes the step must move on this rank, moved by a
//   streaming kernel with the same threads on the same device (every rank at
//   once, as the step runs). Per element of the optimizer's share (all of
//   the model at stage 0, this rank's partition above): the gradient
//   clipping's inspection reads the gradient; AdamW reads the gradient, the
//   fp32 master weight and the two moments and writes the three back; the
//   gradient is zeroed for the next window; with a 16-bit compute dtype the
//   16-bit parameter is written too. fp32: 4 + 16 read + 12 + 4 written = 36
//   bytes; bf16/fp16 (2-byte gradients): 2 + 14 read + 12 + 2 + 2 written =
//   32 bytes. The
//   kernel runs the two passes the step needs (the norm before the update)
//   with next to none of the arithmetic.
// - PyTorch: torch.nn.utils.clip_grad_norm_ + torch.optim.AdamW on the same
//   tensors (the same shapes, weight decay on the same ones), foreach on the
//   host with the ranks' threads together, fused on a GPU, with and without
//   zero_grad (set_to_none=False), run by $DSM_BENCH_PYTHON on rank 0.
//
// The step is dsm_step at the accumulation boundary with every gradient
// released (the releases timed with it: under ZeRO-2/3 they reduce); its
// "update" part is the step less the reduction and gather timers (the
// inspection, the clipping, the optimizer, the conversions, the zeroing):
// the part the bound bounds.
#include "dsm_config.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <unistd.h>
#include <vector>

#include <mpi.h>

#include "api_engine.hpp"
#include "bench_model.hpp"
#include "bounds.hpp"
#include "core/error.hpp"
#include "cuda/device.hpp"
#include "device/space.hpp"
#if DSM_HAVE_CUDA_KERNELS
#include "optim/kernels_cuda.hpp"
#endif
#include "optim/optimizer.hpp"

namespace dsm {
namespace bench {

namespace {

constexpr size_t kChunk = 16384;

double median_of(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
}

// ---------------------------------------------------------------- the bound

// The passes themselves: bounds.hpp (sum*, update*), the widest set the CPU runs.

void *aligned(size_t bytes) {
    void *p = std::aligned_alloc(64, (std::max<size_t>(bytes, 1) + 63) / 64 * 64);
    DSM_REQUIRE(p != nullptr, DSM_ERR_OUT_OF_MEMORY, "the bound's arrays: ", bytes, " bytes");
    return p;
}

} // namespace

HostBound::HostBound(size_t n, bool half, int threads, size_t outside)
    : n_(n), outside_(outside), half_(half), threads_(threads), g_(aligned(n * (half ? 2 : 4))), p_(aligned(n * 4)),
      m_(aligned(n * 4)), v_(aligned(n * 4)), p16_(aligned(half ? n * 2 : 1)),
      z_(aligned(outside * (half ? 2 : 4))) {
    const long long chunks = static_cast<long long>((n + kChunk - 1) / kChunk);
    void *g = g_.get(), *p = p_.get(), *m = m_.get(), *v = v_.get(), *p16 = p16_.get();
    // First touch by the threads that stream the pages later.
#pragma omp parallel for schedule(static) num_threads(threads)
    for (long long c = 0; c < chunks; ++c) {
        const size_t b = static_cast<size_t>(c) * kChunk, e = std::min(n, b + kChunk);
        std::memset(static_cast<char *>(g) + b * (half ? 2 : 4), 0x11, (e - b) * (half ? 2 : 4));
        std::memset(static_cast<float *>(p) + b, 0, (e - b) * 4);
        std::memset(static_cast<float *>(m) + b, 0, (e - b) * 4);
        std::memset(static_cast<float *>(v) + b, 0, (e - b) * 4);
        if (half) std::memset(static_cast<uint16_t *>(p16) + b, 0, (e - b) * 2);
    }
    zero_outside(); // first touch
}

// The gradient elements outside the updated ones, zeroed by the engine's
// own zeroing of host memory.
void HostBound::zero_outside() { device::host().zero(z_.get(), outside_ * (half_ ? 2 : 4)); }

// The bound's variants: the passes without software prefetch, then with a
// prefetch 512, 1024 and 2048 elements ahead.
const size_t HostBound::kAhead[HostBound::kVariants] = {0, 512, 1024, 2048};

double HostBound::run_variant(int k) {
    const size_t n = n_, ahead = kAhead[k];
    const bool half = half_;
    const int threads = threads_;
    const long long chunks = static_cast<long long>((n + kChunk - 1) / kChunk);
    void *g = g_.get(), *p = p_.get(), *m = m_.get(), *v = v_.get(), *p16 = p16_.get();
    const BoundKernels &bk = bounds();
    const double t0 = MPI_Wtime();
    float total = 0;
#pragma omp parallel for schedule(static) num_threads(threads) reduction(+ : total)
    for (long long c = 0; c < chunks; ++c) {
        const size_t b = static_cast<size_t>(c) * kChunk, e = std::min(n, b + kChunk);
        if (ahead == 0)
            total += half ? bk.sum16(static_cast<const uint16_t *>(g), b, e)
                          : bk.sum32(static_cast<const float *>(g), b, e);
        else
            total += half ? bk.sum16_pf(static_cast<const uint16_t *>(g), b, e, ahead)
                          : bk.sum32_pf(static_cast<const float *>(g), b, e, ahead);
    }
    sink_ += total;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (long long c = 0; c < chunks; ++c) {
        const size_t b = static_cast<size_t>(c) * kChunk, e = std::min(n, b + kChunk);
        if (half && ahead == 0)
            bk.update16(static_cast<uint16_t *>(g), static_cast<float *>(p), static_cast<float *>(m),
                        static_cast<float *>(v), static_cast<uint16_t *>(p16), b, e);
        else if (half)
            bk.update16_pf(static_cast<uint16_t *>(g), static_cast<float *>(p), static_cast<float *>(m),
                           static_cast<float *>(v), static_cast<uint16_t *>(p16), b, e, ahead);
        else if (ahead == 0)
            bk.update32(static_cast<float *>(g), static_cast<float *>(p), static_cast<float *>(m),
                        static_cast<float *>(v), b, e);
        else
            bk.update32_pf(static_cast<float *>(g), static_cast<float *>(p), static_cast<float *>(m),
                           static_cast<float *>(v), b, e, ahead);
    }
    zero_outside();
    return MPI_Wtime() - t0;
}

double HostBound::run(MPI_Comm comm) {
    // Every variant in turn, every rank at once; the round's bound is the
    // fastest variant (the slowest rank's time of it).
    double t[kVariants];
    for (int k = 0; k < kVariants; ++k) {
        MPI_Barrier(comm);
        t[k] = run_variant(k);
    }
    MPI_Allreduce(MPI_IN_PLACE, t, kVariants, MPI_DOUBLE, MPI_MAX, comm);
    int best = 0;
    for (int k = 1; k < kVariants; ++k)
        if (t[k] < t[best]) best = k;
    ++wins_[best];
    return t[best];
}

int HostBound::best_variant() const noexcept {
    int best = 0;
    for (int k = 1; k < kVariants; ++k)
        if (wins_[k] > wins_[best]) best = k;
    return best;
}

namespace {
// The bound on a CUDA device: the same two passes as HostBound, as two
// streaming kernels (optim/kernels_cuda.hpp, launch_bound) on arrays of the
// rank's device; run(): seconds of one pass pair, every rank at once, the
// slowest rank's time.
#if DSM_HAVE_CUDA_KERNELS
class DeviceBound {
public:
    DeviceBound(size_t n, bool half, size_t outside)
        : n_(n), outside_bytes_(outside * (half ? 2 : 4)), half_(half),
          z_(std::max<size_t>(outside_bytes_, 1), true), g_(std::max<size_t>(n, 1) * (half ? 2 : 4), true),
          p_(std::max<size_t>(n, 1) * 4, true),
          m_(std::max<size_t>(n, 1) * 4, true), v_(std::max<size_t>(n, 1) * 4, true),
          p16_(half ? std::max<size_t>(n, 1) * 2 : 1, true), partial_(cuda::detail::kBoundBlocks * sizeof(float), true),
          stream_(cuda::Stream::create()) {}
    double run(MPI_Comm comm) {
        const auto fmt = half_ ? cuda::detail::Fmt::BF16 : cuda::detail::Fmt::F32;
        MPI_Barrier(comm);
        const double t0 = MPI_Wtime();
        for (int pass = 0; pass < 2; ++pass)
            cuda::detail::check_launch(cuda::detail::launch_bound(pass, g_.get(), fmt, static_cast<float *>(p_.get()),
                                                                  static_cast<float *>(m_.get()),
                                                                  static_cast<float *>(v_.get()), p16_.get(), n_,
                                                                  static_cast<float *>(partial_.get()), stream_.get()),
                                       "the bound");
        stream_.synchronize();
        if (outside_bytes_ > 0) cuda::zero_bytes(z_.get(), outside_bytes_); // ZeRO-1: the gradients not updated
        double t = MPI_Wtime() - t0;
        MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, comm);
        return t;
    }

private:
    size_t n_, outside_bytes_;
    bool half_;
    cuda::DeviceBuffer z_, g_, p_, m_, v_, p16_, partial_;
    cuda::Stream stream_;
};
#else
class DeviceBound {
public:
    DeviceBound(size_t, bool, size_t) {}
    double run(MPI_Comm) { return -1.0; }
};
#endif

// ---------------------------------------------------------------- PyTorch

const char *kTorchScript = R"PY(
import json, sys, time
import torch
spec = json.load(open(sys.argv[1]))
threads, steps, device = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
torch.set_num_threads(threads)
dev = torch.device("cuda" if device == "cuda" else "cpu")
ps = [torch.nn.Parameter(torch.zeros(t["shape"], device=dev)) for t in spec]
for p in ps:
    p.grad = torch.full_like(p, 1e-3)
decay = [p for p, t in zip(ps, spec) if t["decay"]]
nodecay = [p for p, t in zip(ps, spec) if not t["decay"]]
groups = [{"params": decay, "weight_decay": 0.1}, {"params": nodecay, "weight_decay": 0.0}]
what = []
# The fastest AdamW this PyTorch has: fused (CUDA; the CPU too from 2.4),
# else foreach (1.13). A fused step that fails on the CPU falls back.
try:
    opt = torch.optim.AdamW(groups, lr=1e-4, fused=True)
    opt.step()
    opt.zero_grad(set_to_none=False)
    for p in ps:
        p.grad = torch.full_like(p, 1e-3)
    what.append("AdamW(fused=True)")
except (TypeError, RuntimeError, ValueError):
    opt = torch.optim.AdamW(groups, lr=1e-4, foreach=True)
    what.append("AdamW(foreach=True)")
def clip():
    try:
        return torch.nn.utils.clip_grad_norm_(ps, 1.0, foreach=True)
    except TypeError:
        return torch.nn.utils.clip_grad_norm_(ps, 1.0)
try:
    torch.nn.utils.clip_grad_norm_(ps, 1.0, foreach=True)
    what.append("clip_grad_norm_(foreach=True)")
except TypeError:
    what.append("clip_grad_norm_")
def sync():
    if dev.type == "cuda": torch.cuda.synchronize()
def run(zero):
    times = []
    for s in range(steps + 2):
        if zero:
            for p in ps: p.grad.fill_(1e-3)
        sync()
        t = time.perf_counter()
        clip()
        opt.step()
        if zero: opt.zero_grad(set_to_none=False)
        sync()
        times.append(time.perf_counter() - t)
    times = sorted(times[2:])
    return times[len(times) // 2]
a = run(False)
b = run(True)
print("TORCH " + json.dumps({"version": torch.__version__, "what": " + ".join(reversed(what)), "threads": torch.get_num_threads(), "step": a, "step_zero_grad": b}))
)PY";

// Rank 0 runs the script while the others sleep; every rank gets the result.
void torch_model(const ModelList &list, int threads, int steps, const std::string &device, TorchModel &out,
                 MPI_Comm comm) {
    int rank = 0;
    MPI_Comm_rank(comm, &rank);
    char buf[512] = {0};
    if (rank == 0) {
        char script[] = "/tmp/dsm-bench-model-XXXXXX", spec[] = "/tmp/dsm-bench-spec-XXXXXX";
        const int fs = mkstemp(script), fj = mkstemp(spec);
        if (fs >= 0 && fj >= 0) {
            std::string j = "[";
            for (size_t i = 0; i < list.tensors.size(); ++i) {
                const ModelTensor &t = list.tensors[i];
                j += i ? "," : "";
                j += "{\"shape\": [";
                for (size_t d = 0; d < t.shape.size(); ++d) j += (d ? "," : "") + std::to_string(t.shape[d]);
                j += std::string("], \"decay\": ") + (t.decay ? "true" : "false") + "}";
            }
            j += "]";
            bool ok = write(fs, kTorchScript, std::strlen(kTorchScript)) >= 0;
            ok = ok && write(fj, j.data(), j.size()) >= 0;
            close(fs);
            close(fj);
            const std::string cmd = cat(python_command(), " ", script, " ", spec, " ", threads, " ", steps, " ",
                                        device, " 2>/dev/null");
            if (ok)
                if (FILE *p = popen(cmd.c_str(), "r")) {
                    char line[512];
                    while (std::fgets(line, sizeof line, p))
                        if (std::strncmp(line, "TORCH ", 6) == 0) std::snprintf(buf, sizeof buf, "%s", line + 6);
                    pclose(p);
                }
        }
        if (fs >= 0) unlink(script);
        if (fj >= 0) unlink(spec);
    }
    MPI_Request req;
    MPI_Ibcast(buf, sizeof buf, MPI_CHAR, 0, comm, &req);
    int done = 0;
    while (!done) {
        MPI_Test(&req, &done, MPI_STATUS_IGNORE);
        if (!done) usleep(20000);
    }
    if (buf[0] == 0) return;
    try {
        const auto j = nlohmann::json::parse(buf);
        out.version = j["version"].get<std::string>();
        out.what = j["what"].get<std::string>();
        out.threads = j["threads"].get<int>();
        out.step = j["step"].get<double>();
        out.step_zero_grad = j["step_zero_grad"].get<double>();
    } catch (...) {
    }
}

} // namespace

// ---------------------------------------------------------------- the engine

Json torch_json(const TorchModel &t) {
    if (!(t.step > 0)) return nullptr;
    return {{"version", t.version},
            {"what", t.what},
            {"threads", t.threads},
            {"step_seconds", t.step},
            {"step_zero_grad_seconds", t.step_zero_grad}};
}

void model_option(Harness &h, ModelList &list, std::string &name) {
    h.text("model", [&h, &list, &name](const char *v) {
        try {
            list = model_list(v);
        } catch (const Error &e) {
            return h.refuse("%s", e.message().c_str());
        }
        name = v;
        return true;
    });
}

ModelStage run_model_stage(MPI_Comm world, int stage, const std::string &dtype, const std::string &device,
                           const ModelList &list, int steps) {
    std::vector<dsm_param_desc_t> d(list.tensors.size());
    for (size_t i = 0; i < d.size(); ++i) {
        d[i] = dsm_param_desc_t{};
        d[i].name = list.tensors[i].name.c_str();
        d[i].ndims = static_cast<int>(list.tensors[i].shape.size());
        d[i].shape = list.tensors[i].shape.data();
        d[i].dtype = DSM_FLOAT32;
        d[i].trainable = 1;
        d[i].no_weight_decay = list.tensors[i].decay ? 0 : 1;
    }
    const std::string prec = dtype == "fp16" ? ", \"fp16\": {\"enabled\": true}"
                             : dtype == "bf16" ? ", \"bf16\": {\"enabled\": true}" : "";
    const std::string cfg = cat("{\"train_micro_batch_size_per_gpu\": 1, \"steps_per_print\": 1000000000,"
                                " \"gradient_clipping\": 1.0, \"zero_optimization\": {\"stage\": ", stage,
                                "}, \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-4,"
                                " \"weight_decay\": 0.1}}", prec, "}");
    const dsm_device_t dev =
        device == "cuda" ? DSM_DEVICE_CUDA : device == "sim" ? DSM_DEVICE_SIMULATED : DSM_DEVICE_HOST;
    ApiEngine engine(world, cfg, d.data(), static_cast<int>(d.size()), dev);
    ApiEngine *eng = &engine;
    const size_t esize = eng->dtype() == DSM_FLOAT32 ? 4 : 2;
    // The elements this rank's optimizer updates: its share of the flat layout.
    const auto desc0 = eng->describe();
    const size_t trainable = desc0["trainable_elements"].get<size_t>();
    const size_t elements = stage == 0 ? trainable : desc0["partition_elements"].get<size_t>();
    // ZeRO-1 keeps every gradient whole and zeroes them all at the step.
    const size_t outside = stage == 1 && elements < trainable ? trainable - elements : 0;
    const int threads = optim::num_threads();
    std::unique_ptr<HostBound> bound;
    if (device == "host") bound = std::make_unique<HostBound>(elements, esize == 2, threads, outside);
    std::unique_ptr<DeviceBound> dbound; // the same bytes on the rank's GPU, in the same run
    if (device == "cuda") dbound = std::make_unique<DeviceBound>(elements, esize == 2, outside);
    std::vector<unsigned char> host_grad;
    std::vector<double> total, update, bounds;
    for (int s = 0; s <= steps; ++s) {
        // The backward's gradients (untimed: the model's own work).
        std::vector<void *> grads(d.size());
        for (size_t i = 0; i < d.size(); ++i) {
            grads[i] = eng->grad_acquire(static_cast<int>(i));
            const size_t bytes = static_cast<size_t>(list.tensors[i].numel()) * esize;
            if (dev == DSM_DEVICE_CUDA) {
                host_grad.assign(bytes, 0x11);
                cuda::copy_bytes(grads[i], host_grad.data(), bytes);
            } else {
                std::memset(grads[i], 0x11, bytes); // 16-bit: ~1.1e-28 (bf16) / ~5e-4 (fp16); fp32 ~1.1e-28
            }
        }
        eng->synchronize();
        const StepTimers before = eng->timers();
        MPI_Barrier(world);
        const double t0 = now_seconds();
        for (size_t i = 0; i < d.size(); ++i) eng->grad_release(static_cast<int>(i));
        eng->step();
        eng->synchronize();
        const double t = now_seconds() - t0;
        const StepTimers after = eng->timers();
        const double tb = bound ? bound->run(world) : dbound ? dbound->run(world) : -1.0;
        if (s == 0) continue;
        bounds.push_back(tb);
        total.push_back(t);
        // Less the wait at the step's agreements for a rank whose
        // releases' reductions ended later (timers_seconds.wait).
        update.push_back(t - (after.reduce - before.reduce) - (after.gather - before.gather) -
                         (after.wait - before.wait));
    }
    ModelStage r;
    r.stage = stage;
    r.step = median_of(total);
    r.update = median_of(update);
    double v[2] = {r.step, r.update};
    MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_DOUBLE, MPI_MAX, world);
    r.step = v[0];
    r.update = v[1];
    const auto j = eng->describe();
    r.elements = elements;
    r.outside = outside;
    r.peak_host = j["memory"]["rank_bytes_peak"]["host"].get<size_t>() + j["memory"]["rank_bytes_peak"]["shared"].get<size_t>();
    r.peak_device = j["memory"]["rank_bytes_peak"]["device"].get<size_t>();
    r.threads = threads;
    eng->close();
    r.bound = bound || dbound ? median_of(bounds) : -1.0;
    if (bound) {
        const size_t ahead = HostBound::kAhead[bound->best_variant()];
        r.bound_kernel = ahead ? cat("prefetch ", ahead, " elements ahead") : std::string("no software prefetch");
    } else if (dbound) {
        r.bound_kernel = "two CUDA kernels";
    }
    r.bytes_per_element = HostBound::bytes_per_element(esize == 2);
    return r;
}

void model_torch(const ModelList &list, int threads, int steps, const std::string &device, TorchModel &out,
                 MPI_Comm comm) {
    torch_model(list, threads, steps, device, out, comm);
}

} // namespace bench
} // namespace dsm
