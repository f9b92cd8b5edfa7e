// dsm-bench optimizer: the fused Adam kernel (optim::adam_update) on one
// process, next to two baselines measured in the same run with the same
// threads: a STREAM-like kernel that moves the same 28 bytes per parameter
// (read p, g, m, v; write p, m, v), which bounds any Adam from above, and
// PyTorch's torch.optim.Adam on the same parameter count (when python3 on
// PATH has torch). Every instruction set the CPU has is measured; the
// headline is the selected one (--isa, default the widest).
//
// Each kernel's time is the best of --iters steps (as STREAM reports), and
// the bound and the instruction sets are timed in turn within each round, so
// that a noisy neighbour or a frequency change hits them alike.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

#include <mpi.h>
#include <nlohmann/json.hpp>

#include "bench.hpp"
#include "core/error.hpp"
#include "optim/optimizer.hpp"

namespace dsm {
namespace bench {

namespace {

constexpr double kBytesPerParam = 28.0; // read p, g, m, v (16), write p, m, v (12)
// The optimizer's work-item size: the bandwidth kernel and the first touch
// split the arrays the same way, so each thread streams the pages it placed.
constexpr size_t kChunk = 16384;

struct Options {
    long long params = 16777216;
    long long iters = 10;
    int threads = 0; // 0: OpenMP's default
    std::string isa = "auto";
    bool torch = true;
    bool json = false;
};

void usage(FILE *out) {
    std::fprintf(out,
                 "usage: dsm-bench optimizer [--params N] [--iters N] [--threads N] [--isa NAME]\n"
                 "                           [--no-torch] [--json]\n"
                 "  Times the fused Adam update of N fp32 parameters (default 16777216) over\n"
                 "  --iters steps (default 10, best of) on every instruction set this CPU has,\n"
                 "  next to a memory-bandwidth bound that moves the same 28 bytes per parameter\n"
                 "  with the same threads, and next to torch.optim.Adam (default and foreach)\n"
                 "  run by python3 ($DSM_BENCH_PYTHON) with the same thread count. --isa: avx512, avx2, generic or\n"
                 "  auto (default: the widest) picks the headline. Runs on rank 0 only.\n");
}

bool parse_count(const char *s, long long min, long long &out) {
    char *end = nullptr;
    const long long v = std::strtoll(s, &end, 10);
    if (end == s || *end != '\0' || v < min) return false;
    out = v;
    return true;
}

// 0 ok, 2 usage error, -1 --help; messages only where `loud` (rank 0).
int parse(int argc, char **argv, Options &o, bool loud) {
    FILE *err = loud ? stderr : nullptr;
    auto say = [&](const char *fmt, const char *x, const char *y = "", int z = 0) {
        if (err) std::fprintf(err, fmt, x, y, z);
    };
    for (int i = 0; i < argc; ++i) {
        const std::string a = argv[i];
        auto value = [&](const char *name) -> const char * {
            if (i + 1 >= argc) {
                say("dsm-bench optimizer: %s needs a value\n", name);
                return nullptr;
            }
            return argv[++i];
        };
        long long n = 0;
        if (a == "--help" || a == "-h") {
            if (loud) usage(stdout);
            return -1;
        } else if (a == "--json") {
            o.json = true;
        } else if (a == "--no-torch") {
            o.torch = false;
        } else if (a == "--params" || a == "--iters" || a == "--threads") {
            const char *v = value(a.c_str());
            if (v == nullptr) return 2;
            if (!parse_count(v, a == "--threads" ? 0 : 1, n) || (a == "--threads" && n > 100000)) {
                say("dsm-bench optimizer: %s '%s' is not a count >= %d\n", a.c_str(), v, a == "--threads" ? 0 : 1);
                return 2;
            }
            if (a == "--params") o.params = n;
            if (a == "--iters") o.iters = n;
            if (a == "--threads") o.threads = static_cast<int>(n);
        } else if (a == "--isa") {
            const char *v = value("--isa");
            if (v == nullptr) return 2;
            o.isa = v;
        } else {
            say("dsm-bench optimizer: unknown option '%s'\n", a.c_str());
            if (err) usage(err);
            return 2;
        }
    }
    return 0;
}

struct Free {
    void operator()(float *p) const noexcept { std::free(p); }
};
using Array = std::unique_ptr<float[], Free>;

Array alloc(size_t n) {
    return Array(static_cast<float *>(std::aligned_alloc(64, ((n * sizeof(float) + 63) / 64) * 64)));
}

long long chunks_of(size_t n) { return static_cast<long long>((n + kChunk - 1) / kChunk); }

void first_touch(float *a, size_t n, float value, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (long long c = 0; c < chunks_of(n); ++c) {
        const size_t b = static_cast<size_t>(c) * kChunk, e = std::min(n, b + kChunk);
        for (size_t i = b; i < e; ++i) a[i] = value + 1e-3f * static_cast<float>(i % 17);
    }
}

// The bound: Adam's memory traffic with almost none of its arithmetic, in
// the widest vectors this CPU has (the clones) so that it is not slower than
// the Adam kernels themselves.
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void bandwidth_chunk(float *__restrict p, const float *__restrict g, float *__restrict m, float *__restrict v,
                     size_t b, size_t e) {
#pragma omp simd
    for (size_t i = b; i < e; ++i) {
        const float gi = g[i];
        p[i] += 1e-6f * gi;
        m[i] = 0.9f * m[i] + gi;
        v[i] = 0.9f * v[i] + gi * gi;
    }
}

void bandwidth_kernel(float *p, const float *g, float *m, float *v, size_t n, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (long long c = 0; c < chunks_of(n); ++c) {
        const size_t b = static_cast<size_t>(c) * kChunk;
        bandwidth_chunk(p, g, m, v, b, std::min(n, b + kChunk));
    }
}

double seconds_of(const std::function<void()> &f) {
    const double t0 = now_seconds();
    f();
    return now_seconds() - t0;
}

std::vector<std::string> available_isas() {
    std::vector<std::string> out;
    for (const char *name : {"generic", "avx2", "avx512"}) {
        try {
            optim::set_isa(name);
            out.push_back(name);
        } catch (const Error &) {
        }
    }
    return out;
}

// torch.optim.Adam on n parameters, default and foreach, best of iters
// steps after one untimed step; one JSON line on stdout.
const char *kTorchScript = R"PY(
import json, sys, time
try:
    import torch
except Exception as e:
    print(json.dumps({"error": "python3 cannot import torch: %s" % e}))
    sys.exit(0)
n, iters, threads = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(threads)
def run(**kw):
    p = torch.nn.Parameter(torch.ones(n))
    p.grad = torch.full((n,), 1e-3)
    try:
        opt = torch.optim.Adam([p], lr=1e-3, **kw)
    except TypeError:
        return None
    opt.step()
    t = []
    for _ in range(iters):
        t0 = time.perf_counter()
        opt.step()
        t.append(time.perf_counter() - t0)
    return min(t)
default = run()
foreach = run(foreach=True)
print(json.dumps({"version": torch.__version__, "python": sys.executable,
                  "threads": torch.get_num_threads(), "default": default, "foreach": foreach}))
)PY";

// The script's JSON, or null with `why` set.
nlohmann::json run_torch(long long n, long long iters, int threads, std::string &why) {
    char path[] = "/tmp/dsm-bench-torch-XXXXXX";
    const int fd = mkstemp(path);
    if (fd < 0) {
        why = "cannot create a temporary file for the torch script";
        return nullptr;
    }
    const size_t len = std::strlen(kTorchScript);
    const bool written = write(fd, kTorchScript, len) == static_cast<ssize_t>(len);
    close(fd);
    std::string out;
    int status = -1;
    if (written) {
        const std::string cmd = python_command() + " " + std::string(path) + " " + std::to_string(n) + " " +
                                std::to_string(iters) + " " + std::to_string(threads) + " 2>/dev/null";
        if (FILE *f = popen(cmd.c_str(), "r")) {
            char buf[512];
            while (std::fgets(buf, sizeof buf, f)) out += buf;
            status = pclose(f);
        }
    }
    unlink(path);
    nlohmann::json j = nlohmann::json::parse(out, nullptr, false);
    if (j.is_object() && j.contains("error")) {
        why = j["error"].get<std::string>();
        return nullptr;
    }
    if (!j.is_object() || !j.contains("version") || !j["default"].is_number()) {
        const int code = status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        why = code == 127 ? "python3 is not on PATH" : "python3 failed (exit status " + std::to_string(code) + ")";
        return nullptr;
    }
    return j;
}

struct Measured {
    std::string isa;
    double seconds = 0;
};

} // namespace

int run_optimizer(int argc, char **argv) {
    int initialized = 0, rank = 0;
    MPI_Initialized(&initialized);
    if (initialized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    Options o;
    const int rc = parse(argc, argv, o, rank == 0);
    if (rc != 0) return rc < 0 ? 0 : rc;
    if (rank != 0) return 0; // a one-process benchmark: the other ranks wait in MPI_Finalize

    try {
        optim::set_num_threads(o.threads);
        optim::set_isa(o.isa);
    } catch (const Error &e) {
        std::fprintf(stderr, "dsm-bench optimizer: %s\n", e.what());
        return e.status() == DSM_ERR_INVALID_ARGUMENT ? 2 : 1;
    }
    const std::string selected = optim::active_isa();
    const int threads = optim::num_threads();
    const size_t n = static_cast<size_t>(o.params);

    Array p = alloc(n), g = alloc(n), m = alloc(n), v = alloc(n);
    if (!p || !g || !m || !v) {
        std::fprintf(stderr, "dsm-bench optimizer: cannot allocate 4 x %zu bytes\n", n * sizeof(float));
        return 1;
    }
    first_touch(p.get(), n, 1.0f, threads);
    first_touch(g.get(), n, 1e-3f, threads);
    first_touch(m.get(), n, 0.0f, threads);
    first_touch(v.get(), n, 0.0f, threads);

    optim::Hyper h; // AdamW with weight_decay 0: torch.optim.Adam's defaults
    optim::StepArgs a;
    a.step = 0;
    const std::vector<std::string> isas = available_isas();
    auto bound = [&] { bandwidth_kernel(p.get(), g.get(), m.get(), v.get(), n, threads); };
    auto adam = [&] {
        ++a.step;
        optim::adam_update(p.get(), g.get(), m.get(), v.get(), n, h, a);
    };
    // Round 0 is a warm-up; then per round the bound and each instruction set.
    double bound_s = 0;
    std::vector<double> best(isas.size(), 0.0);
    for (long long round = 0; round <= o.iters; ++round) {
        const double b = seconds_of(bound);
        if (round > 0) bound_s = round == 1 ? b : std::min(bound_s, b);
        for (size_t k = 0; k < isas.size(); ++k) {
            optim::set_isa(isas[k]);
            const double s = seconds_of(adam);
            if (round > 0) best[k] = round == 1 ? s : std::min(best[k], s);
        }
    }
    std::vector<Measured> runs;
    for (size_t k = 0; k < isas.size(); ++k) runs.push_back({isas[k], best[k]});
    optim::set_isa(selected);

    std::string why = "--no-torch";
    nlohmann::json torch = o.torch ? run_torch(o.params, o.iters, threads, why) : nlohmann::json(nullptr);

    const double bytes = kBytesPerParam * static_cast<double>(n);
    const double bound_gbs = bytes / bound_s / 1e9;
    const Measured &head = *std::find_if(runs.begin(), runs.end(), [&](const Measured &r) { return r.isa == selected; });
    double torch_s = 0;
    if (!torch.is_null()) {
        torch_s = torch["default"].get<double>();
        if (torch["foreach"].is_number()) torch_s = std::min(torch_s, torch["foreach"].get<double>());
    }

    if (o.json) {
        nlohmann::json out = nlohmann::json::object();
        out["format"] = "dsm-bench-optimizer";
        out["format_version"] = 1;
        out["params"] = o.params;
        out["threads"] = threads;
        out["isa"] = selected;
        out["bytes_per_param"] = 28;
        out["iters"] = o.iters;
        out["seconds_per_step"] = head.seconds;
        out["params_per_s"] = static_cast<double>(n) / head.seconds;
        out["gbs"] = bytes / head.seconds / 1e9;
        out["bandwidth_bound_gbs"] = bound_gbs;
        out["fraction_of_bound"] = bound_s / head.seconds;
        if (torch.is_null()) {
            out["torch"] = nullptr;
            out["torch_skipped"] = why;
        } else {
            // seconds_per_step: the faster of torch's default and foreach steps.
            out["torch"] = {{"version", torch["version"]},
                            {"python", torch["python"]},
                            {"threads", torch["threads"]},
                            {"seconds_per_step", torch_s},
                            {"default_seconds_per_step", torch["default"]},
                            {"foreach_seconds_per_step", torch["foreach"]},
                            {"speedup", torch_s / head.seconds}};
        }
        nlohmann::json isas = nlohmann::json::array();
        for (const Measured &r : runs)
            isas.push_back({{"isa", r.isa},
                            {"seconds_per_step", r.seconds},
                            {"params_per_s", static_cast<double>(n) / r.seconds},
                            {"gbs", bytes / r.seconds / 1e9},
                            {"fraction_of_bound", bound_s / r.seconds}});
        out["isas"] = isas;
        std::printf("%s\n", out.dump().c_str());
        return 0;
    }

    std::printf("dsm-bench optimizer: Adam on %lld fp32 parameters, %d threads, best of %lld steps\n",
                o.params, threads, o.iters);
    std::printf("  bandwidth bound        %9.3f ms/step  %8.1f GB/s  (28 B/param: read p,g,m,v, write p,m,v)\n",
                bound_s * 1e3, bound_gbs);
    for (const Measured &r : runs)
        std::printf("  adam_update %-8s   %9.3f ms/step  %8.1f GB/s  %6.3f Gparam/s  %5.2f of bound%s\n",
                    r.isa.c_str(), r.seconds * 1e3, bytes / r.seconds / 1e9, n / r.seconds / 1e9,
                    bound_s / r.seconds, r.isa == selected ? "  <- selected" : "");
    if (torch.is_null()) {
        std::printf("  torch.optim.Adam       not measured: %s\n", why.c_str());
    } else {
        std::printf("  torch.optim.Adam %s (%s, %d threads): default %.3f ms/step",
                    torch["version"].get<std::string>().c_str(), torch["python"].get<std::string>().c_str(),
                    torch["threads"].get<int>(), torch["default"].get<double>() * 1e3);
        if (torch["foreach"].is_number()) std::printf(", foreach %.3f ms/step", torch["foreach"].get<double>() * 1e3);
        std::printf("\n  speedup over torch (its faster step): %.1fx (target >= 5x)\n", torch_s / head.seconds);
    }
    std::printf("  %s: %.2f of the bandwidth bound (target >= 0.8)\n", selected.c_str(), bound_s / head.seconds);
    return 0;
}

} // namespace bench
} // namespace dsm
