// dsm-bench zero: a ZeRO step of the engine split into reduce, optimizer and
// gather; the bytes this rank sent next to the parameter bytes; this rank's
// model-state memory next to the ZeRO paper's formula; and, in the same run,
// PyTorch's DDP-style gradient allreduce + ZeroRedundancyOptimizer(Adam) on
// gloo for the same parameter count and ranks (when python3 has torch).
#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unistd.h>
#include <vector>

#include <mpi.h>

#include "api_engine.hpp"
#include "bench_model.hpp"
#include "harness.hpp"
#include "core/error.hpp"
#include "cuda/device.hpp"

namespace dsm {
namespace bench {

namespace {

// The largest --params: the engine's int64 element counts and their byte
// sizes stay far from overflow (the memory check against the node comes after).
constexpr long long kMaxParams = 1LL << 50;

struct Options {
    long long params = 16777216;
    int steps = 5;
    std::vector<int> stages{0, 1, 2, 3};
    std::string dtype = "fp32";
    std::string device = "host"; // host, cuda, sim
    bool torch = true;
    int hpz = 1;          // zero_hpz_partition_size (ZeRO-3)
    long long reuse = -1; // stage3_max_reuse_distance; -1: DeepSpeed's default
    std::string model;    // --model: a real model's parameter list (bench_model.cc)
    bool qwz = false, qgz = false; // zero_quantized_weights, zero_quantized_gradients
    bool zeropp = false;           // plain ZeRO-3, then hpZ + qwZ + qgZ, in the same run
};

void usage(FILE *out) {
    std::fprintf(out,
                 "usage: mpiexec -n N dsm-bench zero [--params N] [--steps N] [--stage S|all]\n"
                 "                                   [--dtype fp32|fp16|bf16] [--device host|cuda|sim]\n"
                 "                                   [--hpz N] [--reuse-distance N] [--qwz] [--qgz] [--zeropp]\n"
                 "                                   [--no-torch] [--json]\n"
                 "       mpiexec -n N dsm-bench zero --model gpt2|gpt2-medium|gpt2-large|gpt2-xl|llama-7b|FILE.json\n"
                 "                                   [--steps N] [--stage S|all] [--dtype ...] [--device ...] [--no-torch]\n"
                 "  One parameter of N elements (default 16777216) trained with AdamW; a step reads\n"
                 "  the parameter twice (forward, backward), adds its gradient and calls dsm_step.\n"
                 "  Per stage the median step time split into reduce, optimizer and gather, the bytes each rank\n"
                 "  sent per step over the parameter bytes, and the model-state bytes per parameter\n"
                 "  next to the ZeRO formula. With torch in python3 ($DSM_BENCH_PYTHON), rank 0 also times PyTorch's\n"
                 "  allreduce + ZeroRedundancyOptimizer(Adam) on gloo with the same ranks.\n"
                 "  --device: where the engine keeps the model state (host; cuda: device-resident on\n"
                 "  the rank's GPU with NCCL; sim: the device-resident engine on the simulated device).\n"
                 "  --hpz N: zero_hpz_partition_size (ZeRO++ hpZ, stage 3; N divides the ranks).\n"
                 "  --qwz, --qgz: zero_quantized_weights (stage 3), zero_quantized_gradients (stages 2, 3).\n"
                 "  --zeropp: stage 3 twice in the same run: plain ZeRO-3, then ZeRO++ (hpZ of --hpz ranks,\n"
                 "  qwZ and qgZ), with the speedup and the ratio of the off-node bytes.\n"
                 "  --reuse-distance N: stage3_max_reuse_distance (0: the backward gathers the parameter\n"
                 "  again, as a model larger than the distance does). off/param: the bytes each rank sent\n"
                 "  off its node in the last step over the parameter bytes.\n"
                 "  --model: the parameter list of a real model (names, shapes, weight decay on tensors of\n"
                 "  two or more dimensions), or a JSON file {\"parameters\": [{\"name\", \"shape\", \"decay\"}]},\n"
                 "  trained with AdamW and gradient clipping 1.0: per stage the step (every gradient\n"
                 "  released, then dsm_step), its update part (less the reduction and gather), the bound\n"
                 "  (the fastest of a streaming kernel's variants, without and with software prefetch, moving\n"
                 "  the bytes per updated element the step must move: 36 fp32, 32 with 16-bit gradients and\n"
                 "  parameters; same threads, every rank at once) and torch's clip_grad_norm_ + AdamW (fused\n"
                 "  where the PyTorch has it, foreach otherwise) on the same tensors with the ranks' threads\n"
                 "  together; each with its effective bandwidth.\n");
}

// A line of a /proc/self file ("VmHWM:" of status, "Pss:" of smaps_rollup)
// in bytes, 0 if unknown.
size_t status_bytes(const char *file, const char *key) {
    FILE *f = std::fopen(file, "r");
    if (!f) return 0;
    char line[256];
    size_t kb = 0;
    const size_t len = std::strlen(key);
    while (std::fgets(line, sizeof line, f))
        if (std::strncmp(line, key, len) == 0) kb = std::strtoull(line + len, nullptr, 10);
    std::fclose(f);
    return kb * 1024;
}
// Peak resident memory of this process (VmHWM), and its current
// proportional share (Pss: a page shared by k processes, such as the node's
// shared-memory windows, counts 1/k to each), which adds up over the ranks.
size_t peak_rss() { return status_bytes("/proc/self/status", "VmHWM:"); }
size_t current_rss() { return status_bytes("/proc/self/smaps_rollup", "Pss:"); }

const char *kTorchScript = R"PY(
import os, sys, time, tempfile
import torch, torch.distributed as dist, torch.multiprocessing as mp
from torch.distributed.optim import ZeroRedundancyOptimizer
def run(rank, world, n, steps, path, q):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + path, rank=rank, world_size=world)
    p = torch.nn.Parameter(torch.zeros(n))
    opt = ZeroRedundancyOptimizer([p], optimizer_class=torch.optim.Adam, lr=1e-3)
    times = []
    for s in range(steps + 1):
        p.grad = torch.full((n,), 1e-3 * (rank + 1))
        dist.barrier()
        t = time.perf_counter()
        dist.all_reduce(p.grad)
        p.grad /= world
        opt.step()
        times.append(time.perf_counter() - t)
    if rank == 0:
        q.put(sorted(times[1:])[len(times[1:]) // 2])
    dist.destroy_process_group()
if __name__ == "__main__":
    world, n, steps = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    path = tempfile.mktemp(prefix="dsm-bench-torch-")
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=run, args=(r, world, n, steps, path, q)) for r in range(world)]
    for p in procs: p.start()
    t = q.get()
    for p in procs: p.join()
    print("TORCH", torch.__version__, t)
)PY";

// Runs the PyTorch reference on rank 0 while the other ranks sleep (not
// spin) so that they do not take the cores from it. Returns seconds per
// step, or -1 (version empty) when torch is not available.
double torch_reference(int world, long long n, int steps, std::string &version, MPI_Comm comm) {
    int rank = 0;
    MPI_Comm_rank(comm, &rank);
    double t = -1;
    if (rank == 0) {
        char path[] = "/tmp/dsm-bench-zero-XXXXXX";
        int fd = mkstemp(path);
        if (fd >= 0) {
            if (write(fd, kTorchScript, std::strlen(kTorchScript)) < 0) t = -1;
            close(fd);
            const std::string cmd = cat(python_command(), " ", path, " ", world, " ", n, " ", steps, " 2>/dev/null");
            if (FILE *p = popen(cmd.c_str(), "r")) {
                char line[256], ver[64];
                double v;
                while (std::fgets(line, sizeof line, p))
                    if (std::sscanf(line, "TORCH %63s %lf", ver, &v) == 2) t = v, version = ver;
                pclose(p);
            }
            unlink(path);
        }
    }
    // Others wait without spinning.
    MPI_Request req;
    MPI_Ibcast(&t, 1, MPI_DOUBLE, 0, comm, &req);
    int done = 0;
    while (!done) {
        MPI_Test(&req, &done, MPI_STATUS_IGNORE);
        if (!done) usleep(20000);
    }
    return t;
}

struct Result {
    std::string variant;
    int stage;
    double step, reduce, optimizer, gather;
    double bytes_ratio; // bytes sent per step / parameter bytes
    double off_ratio;   // bytes sent off the node in the last step / parameter bytes
    double state_per_param, formula;
    size_t peak;
    double rss_per_param; // resident growth of the stage's engine / parameters
};

Result run_stage(MPI_Comm world, int stage, const Options &o) {
    const int64_t shape[1] = {o.params};
    dsm_param_desc_t d{};
    d.name = "weight";
    d.ndims = 1;
    d.shape = shape;
    d.dtype = DSM_FLOAT32;
    d.trainable = 1;
    const std::string prec = o.dtype == "fp16" ? ", \"fp16\": {\"enabled\": true}"
                             : o.dtype == "bf16" ? ", \"bf16\": {\"enabled\": true}" : "";
    const std::string cfg = cat("{\"train_micro_batch_size_per_gpu\": 1, \"steps_per_print\": 1000000000,"
                                " \"gradient_clipping\": 0, \"zero_optimization\": {\"stage\": ", stage,
                                ", \"stage3_param_persistence_threshold\": 0, \"zero_hpz_partition_size\": ", o.hpz,
                                ", \"zero_quantized_weights\": ", o.qwz ? "true" : "false",
                                ", \"zero_quantized_gradients\": ", o.qgz ? "true" : "false",
                                o.reuse >= 0 ? cat(", \"stage3_max_reuse_distance\": ", o.reuse) : std::string(),
                                "}, \"optimizer\": {\"type\": \"AdamW\"}", prec, "}");
    const size_t rss0 = current_rss();
    const dsm_device_t device =
        o.device == "cuda" ? DSM_DEVICE_CUDA : o.device == "sim" ? DSM_DEVICE_SIMULATED : DSM_DEVICE_HOST;
    ApiEngine engine(world, cfg, &d, 1, device);
    ApiEngine *eng = &engine;
    const size_t esize = eng->dtype() == DSM_FLOAT32 ? 4 : 2;
    // The gradient the "backward" writes: a small positive value in every dtype.
    const size_t gbytes = static_cast<size_t>(o.params) * esize;
    std::vector<unsigned char> grad_host(device == DSM_DEVICE_CUDA ? gbytes : 0, 0x11);
    std::vector<double> total, red, opt, gat;
    uint64_t bytes0 = 0, bytes1 = 0;
    for (int s = 0; s <= o.steps; ++s) {
        const StepTimers before = eng->timers();
        bytes0 = before.bytes_sent;
        MPI_Barrier(world);
        // Forward and backward each read the parameter (ZeRO-3 gathers it
        // twice, as DeepSpeed does), then backward writes the gradient
        // (untimed: the model's own work).
        const double t0 = now_seconds();
        for (int pass = 0; pass < 2; ++pass) {
            (void)eng->param_acquire(0);
            eng->param_release(0);
        }
        const double ta = now_seconds();
        void *g = eng->grad_acquire(0);
        if (device == DSM_DEVICE_CUDA) cuda::copy_bytes(g, grad_host.data(), gbytes);
        else std::memset(g, 0x11, gbytes);
        const double tb = now_seconds();
        eng->grad_release(0);
        eng->step();
        eng->synchronize(); // a device-resident step is done when its queue is
        const double t1 = now_seconds();
        const StepTimers after = eng->timers();
        bytes1 = after.bytes_sent;
        if (s == 0) continue; // warm-up
        total.push_back((ta - t0) + (t1 - tb));
        red.push_back(after.reduce - before.reduce);
        opt.push_back(after.optimizer - before.optimizer);
        gat.push_back(after.gather - before.gather);
    }
    const uint64_t bytes_step = bytes1 - bytes0;
    auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v.empty() ? 0.0 : v[v.size() / 2];
    };
    Result r;
    r.variant = o.hpz > 1 || o.qwz || o.qgz
                    ? cat(o.hpz > 1 ? cat("hpZ", o.hpz) : std::string(), o.qwz ? (o.hpz > 1 ? "+qwZ" : "qwZ") : "",
                          o.qgz ? (o.hpz > 1 || o.qwz ? "+qgZ" : "qgZ") : "")
                    : "plain";
    r.stage = stage;
    r.step = median(total);
    r.reduce = median(red);
    r.optimizer = median(opt);
    r.gather = median(gat);
    r.bytes_ratio = static_cast<double>(bytes_step) / (static_cast<double>(o.params) * esize);
    const nlohmann::json desc = eng->describe();
    r.off_ratio = static_cast<double>(desc["communication"]["last_step"]["bytes_off_node"].get<uint64_t>()) /
                  (static_cast<double>(o.params) * esize);
    r.state_per_param =
        static_cast<double>(desc["memory"]["model_state_bytes"].get<size_t>()) / static_cast<double>(o.params);
    r.formula = desc["memory"]["zero_formula_bytes_per_parameter"].get<double>();
    r.peak = peak_rss();
    const size_t rss1 = current_rss();
    r.rss_per_param = rss1 > rss0 ? static_cast<double>(rss1 - rss0) / static_cast<double>(o.params) : 0.0;
    eng->close();
    return r;
}

// --model: the model's list at each stage (bench_model.cc).
int run_model(Harness &h, const Options &o, const ModelList &list) {
    const int size = h.size();
    const double n = static_cast<double>(list.numel());
    // Stage 0 holds everything: fp32 parameter, gradient and two moments (16
    // bytes), a 16-bit copy and gradient besides (20), and the bound's arrays.
    const double need = (o.dtype == "fp32" ? 32.0 : 36.0) * n;
    if (!h.fits_memory("--model " + o.model, need)) return 2;
    std::vector<ModelStage> results;
    const int rc = h.guard([&] {
        for (int s : o.stages) results.push_back(run_model_stage(MPI_COMM_WORLD, s, o.dtype, o.device, list, o.steps));
        return 0;
    });
    if (rc != 0) return rc;
    TorchModel torch;
    const int threads = results.empty() ? 1 : results.front().threads * size;
    if (o.torch) model_torch(list, threads, o.steps, o.device, torch, MPI_COMM_WORLD);
    if (h.rank() != 0) return 0;
    auto ratio = [](double a, double b) { return a > 0 && b > 0 ? Json(a / b) : Json(nullptr); };
    // Effective bandwidth: bytes per element x elements / seconds.
    auto gbs = [](double bytes, size_t elements, double s) {
        return s > 0 ? bytes * static_cast<double>(elements) / s / 1e9 : 0.0;
    };
    const double numel = static_cast<double>(list.numel());
    if (h.json()) {
        Json rows = Json::array();
        for (const ModelStage &r : results)
            rows.push_back({{"stage", r.stage},
                            {"step_seconds", r.step},
                            {"update_seconds", r.update},
                            {"bound_seconds", r.bound > 0 ? Json(r.bound) : Json(nullptr)},
                            {"bound_bytes_per_element", r.bytes_per_element},
                            {"bound_kernel", r.bound_kernel},
                            {"bound_gbs", r.bound > 0 ? Json(gbs(r.bytes_per_element, r.elements, r.bound)) : Json(nullptr)},
                            {"update_gbs", gbs(r.bytes_per_element, r.elements, r.update)},
                            {"elements_per_rank", r.elements},
                            {"zeroed_elements_per_rank", r.outside},
                            {"bound_over_update", ratio(r.bound, r.update)},
                            {"bound_over_step", ratio(r.bound, r.step)},
                            {"torch_over_step", ratio(torch.step, r.step)},
                            {"torch_zero_grad_over_step", ratio(torch.step_zero_grad, r.step)},
                            {"peak_host_bytes", r.peak_host},
                            {"peak_device_bytes", r.peak_device}});
        const Json t = torch_json(torch);
        h.print(h.result({{"model", list.name},
                         {"tensors", list.tensors.size()},
                         {"params", list.numel()},
                         {"ranks", size},
                         {"threads_per_rank", results.empty() ? 0 : results.front().threads},
                         {"dtype", o.dtype},
                         {"device", o.device},
                         {"results", rows},
                         {"torch", t}}));
        return 0;
    }
    std::printf("dsm-bench zero --model %s: %zu tensors, %lld parameters, %s, AdamW + clipping 1.0, %d ranks x %d "
                "threads, model state on %s (median of %d steps, slowest rank)\n",
                list.name.c_str(), list.tensors.size(), static_cast<long long>(list.numel()), o.dtype.c_str(), size,
                results.empty() ? 0 : results.front().threads, o.device.c_str(), o.steps);
    std::printf("%5s %10s %10s %10s %12s %12s %10s %10s\n", "stage", "step ms", "update ms", "bound ms",
                "bound/update", "bound/step", "torch/step", "+zero_grad");
    for (const ModelStage &r : results) {
        char b[32] = "-", bu[32] = "-", bs[32] = "-", ts[32] = "-", tz[32] = "-";
        if (r.bound > 0) {
            std::snprintf(b, sizeof b, "%.2f", 1e3 * r.bound);
            std::snprintf(bu, sizeof bu, "%.2f", r.bound / r.update);
            std::snprintf(bs, sizeof bs, "%.2f", r.bound / r.step);
        }
        if (torch.step > 0) {
            std::snprintf(ts, sizeof ts, "%.2fx", torch.step / r.step);
            std::snprintf(tz, sizeof tz, "%.2fx", torch.step_zero_grad / r.step);
        }
        std::printf("%5d %10.2f %10.2f %10s %12s %12s %10s %10s\n", r.stage, 1e3 * r.step, 1e3 * r.update, b, bu, bs,
                    ts, tz);
    }
    std::printf("step: every gradient released, then dsm_step; update: the step less its reduction, gather and\n"
                "wait for the other ranks (timers_seconds);\n"
                "bound: the fastest of a streaming kernel's variants (without software prefetch, with it 512, 1024\n"
                "and 2048 elements ahead), each moving the %.0f bytes per element the update must move (gradient read by\n"
                "the clipping's norm; gradient, master and moments read, master and moments written; gradient\n"
                "zeroed; the 16-bit parameter written) over the elements each rank updates, and (stage 1, which\n"
                "keeps whole gradients) zeros written over the gradient elements it does not update, same threads\n"
                "(cuda: two kernels and a memset on the rank's GPU), all ranks at once; torch/step > 1: libdsm is\n"
                "faster.\n",
                results.empty() ? 36.0 : results.front().bytes_per_element);
    for (const ModelStage &r : results)
        if (r.bound > 0)
            std::printf("stage %d effective bandwidth: bound %.1f GB/s (fastest variant: %s), update %.1f GB/s "
                        "(%.0f bytes per element)\n",
                        r.stage, gbs(r.bytes_per_element, r.elements, r.bound), r.bound_kernel.c_str(),
                        gbs(r.bytes_per_element, r.elements, r.update), r.bytes_per_element);
    if (torch.step > 0)
        std::printf("torch %s, %s, %d threads: %.2f ms per step, %.2f ms with zero_grad(set_to_none=False);\n"
                    "effective bandwidth %.1f GB/s (40 bytes per element: the norm reads the gradient, the clipping\n"
                    "reads and writes it, AdamW reads gradient, parameter and moments and writes the three back),\n"
                    "%.1f GB/s with zero_grad (44: the gradient written once more)\n",
                    torch.version.c_str(), torch.what.c_str(), torch.threads, 1e3 * torch.step,
                    1e3 * torch.step_zero_grad, 40.0 * numel / torch.step / 1e9, 44.0 * numel / torch.step_zero_grad / 1e9);
    else
        std::printf("torch: not measured (no python3 with torch, or --no-torch)\n");
    return 0;
}

} // namespace

int run_zero(int argc, char **argv) {
    Harness h("zero", usage);
    Options o;
    h.flag("no-torch", [&] { o.torch = false; });
    h.integer("params", 1, kMaxParams, [&](long long x) { o.params = x; });
    h.integer("steps", 1, 1000, [&](long long x) { o.steps = static_cast<int>(x); });
    h.text("stage", [&](const char *v) {
        long long x = 0;
        if (!std::strcmp(v, "all")) o.stages = {0, 1, 2, 3};
        else if (h.parse_integer("--stage", v, 0, 3, &x)) o.stages = {static_cast<int>(x)};
        else return false;
        return true;
    });
    h.choice("dtype", {"fp32", "fp16", "bf16"}, [&](const std::string &v) { o.dtype = v; });
    h.choice("device", {"host", "cuda", "sim"}, [&](const std::string &v) { o.device = v; });
    h.integer("hpz", 1, INT_MAX, [&](long long x) { o.hpz = static_cast<int>(x); });
    h.integer("reuse-distance", 0, kMaxParams, [&](long long x) { o.reuse = x; });
    ModelList list;
    model_option(h, list, o.model);
    h.flag("qwz", [&] { o.qwz = true; });
    h.flag("qgz", [&] { o.qgz = true; });
    h.flag("zeropp", [&] { o.zeropp = true; });
    const int p = h.parse(argc, argv);
    if (p != 0) return p == 1 ? 0 : 2;
    const int rank = h.rank(), size = h.size();
    // The ranks are known once MPI has started.
    if (o.hpz > size) {
        h.refuse("--hpz '%d' is not an integer from 1 to %d", o.hpz, size);
        return 2;
    }
    if (!o.model.empty()) return run_model(h, o, list);
    // A rank's model state at stage 0, the most: the fp32 parameter, its
    // gradient and AdamW's two moments, plus a 16-bit copy and gradient.
    const double need = (o.dtype == "fp32" ? 16.0 : 20.0) * static_cast<double>(o.params);
    if (!h.fits_memory("--params " + std::to_string(o.params), need)) return 2;
    std::vector<Result> results;
    const int rc = h.guard([&] {
        if (o.zeropp) {
            Options plain = o, pp = o;
            plain.hpz = 1;
            plain.qwz = plain.qgz = false;
            pp.qwz = pp.qgz = true;
            results.push_back(run_stage(MPI_COMM_WORLD, 3, plain));
            results.push_back(run_stage(MPI_COMM_WORLD, 3, pp));
            return 0;
        }
        for (int s : o.stages) results.push_back(run_stage(MPI_COMM_WORLD, s, o));
        return 0;
    });
    if (rc != 0) return rc;
    std::string torch_version;
    const double torch_t = o.torch ? torch_reference(size, o.params, o.steps, torch_version, MPI_COMM_WORLD) : -1;
    // The slowest rank's times.
    for (Result &r : results) {
        double v[4] = {r.step, r.reduce, r.optimizer, r.gather};
        MPI_Allreduce(MPI_IN_PLACE, v, 4, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        r.step = v[0], r.reduce = v[1], r.optimizer = v[2], r.gather = v[3];
    }
    if (rank != 0) return 0;
    // Bytes sent in units of the ZeRO paper, which counts a reduce-scatter or
    // an allgather of the parameters as 1x (the ring's (n-1)/n taken as 1).
    auto volume = [size](double ratio) { return size > 1 ? ratio * size / (size - 1) : 0.0; };
    if (h.json()) {
        Json rows = Json::array();
        for (const Result &r : results)
            rows.push_back({{"variant", r.variant},
                            {"stage", r.stage},
                            {"step_seconds", r.step},
                            {"reduce_seconds", r.reduce},
                            {"optimizer_seconds", r.optimizer},
                            {"gather_seconds", r.gather},
                            {"bytes_sent_per_param_byte", r.bytes_ratio},
                            {"bytes_off_node_per_param_byte", r.off_ratio},
                            {"model_state_bytes_per_param", r.state_per_param},
                            {"zero_formula_bytes_per_param", r.formula},
                            {"volume_per_param_byte", volume(r.bytes_ratio)},
                            {"resident_bytes_per_param", r.rss_per_param},
                            {"peak_rss_bytes", r.peak},
                            {"speedup_vs_torch", torch_t > 0 ? Json(torch_t / r.step) : Json(nullptr)}});
        Json torch = nullptr;
        if (torch_t > 0)
            torch = {{"version", torch_version},
                     {"what", "allreduce + ZeroRedundancyOptimizer(Adam), gloo"},
                     {"step_seconds", torch_t}};
        h.print(h.result({{"ranks", size},
                         {"params", o.params},
                         {"dtype", o.dtype},
                         {"device", o.device},
                         {"optimizer", "adamw"},
                         {"results", rows},
                         {"torch", torch}}));
        return 0;
    }
    std::printf("dsm-bench zero: %d ranks, %lld parameters, %s, AdamW, model state on %s (median of %d steps, "
                "slowest rank)\n", size, o.params, o.dtype.c_str(), o.device.c_str(), o.steps);
    std::printf("%-16s %5s %9s %9s %9s %9s %11s %7s %10s %14s %8s %11s %9s\n", "variant", "stage", "step s", "reduce s", "optim s",
                "gather s", "sent/param", "volume", "off/param", "state B/param", "formula", "PSS B/param",
                "vs torch");
    for (const Result &r : results) {
        char vs[32] = "-";
        if (torch_t > 0) std::snprintf(vs, sizeof vs, "%.1fx", torch_t / r.step);
        std::printf("%-16s %5d %9.4f %9.4f %9.4f %9.4f %11.3f %6.2fx %10.3f %14.2f %8.2f %11.2f %9s\n",
                    r.variant.c_str(), r.stage, r.step,
                    r.reduce, r.optimizer, r.gather, r.bytes_ratio, volume(r.bytes_ratio), r.off_ratio, r.state_per_param,
                    r.formula, r.rss_per_param, vs);
    }
    std::printf("sent/param: bytes each rank sent per step / parameter bytes; volume: the same in the ZeRO\n"
                "paper's units (a reduce-scatter or allgather of the parameters = 1x); PSS: growth of this\n"
                "rank's proportional resident memory while the stage's engine lived, per parameter.\n");
    if (o.zeropp && results.size() == 2 && results[1].step > 0 && results[0].off_ratio > 0)
        std::printf("ZeRO++ (%s) vs plain ZeRO-3: %.2fx the step speed, %.3fx the off-node bytes\n",
                    results[1].variant.c_str(), results[0].step / results[1].step,
                    results[1].off_ratio / results[0].off_ratio);
    if (torch_t > 0)
        std::printf("torch %s allreduce + ZeroRedundancyOptimizer(Adam) on gloo: %.4f s per step\n",
                    torch_version.c_str(), torch_t);
    else
        std::printf("torch: not measured (no python3 with torch, or --no-torch)\n");
    return 0;
}

} // namespace bench
} // namespace dsm
