// dsm-bench watchdog: what the watchdog (DSM_COMM_TIMEOUT) costs, with it on
// and off in the same run, alternating call by call so that both see the
// same machine: the bookkeeping of one wait alone (a Context and a
// WaitScope entered and left), a small allreduce through the shm and mpi
// backends, and a ZeRO-2 engine step.
#include "dsm_config.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <dlfcn.h>
#include <mpi.h>

#include "api_engine.hpp"
#include "harness.hpp"
#include "comm/backend.hpp"
#include "core/error.hpp"
#include "core/watchdog.hpp"

namespace dsm {
namespace bench {

namespace {

struct Options {
    size_t count = 1024;
    int iters = 2000;
    long long params = 1 << 20;
    int steps = 40;
};

void usage(FILE *out) {
    std::fprintf(out,
                 "usage: mpiexec -n N dsm-bench watchdog [--count N] [--iters N] [--params N] [--steps N] [--json]\n"
                 "  The watchdog's cost: each row timed with DSM_COMM_TIMEOUT=1800 (on) and 0 (off),\n"
                 "  the two alternating call by call in this one run.\n"
                 "  scope: a watchdog Context and WaitScope entered and left (what every collective\n"
                 "  adds), nanoseconds per pair, on this rank alone (median of 21 rounds of 10^6);\n"
                 "  allreduce shm|mpi: COUNT fp32 elements (default 1024), the median over --iters\n"
                 "  calls (default 2000) of the slowest rank; zero step: one parameter of --params\n"
                 "  elements (default 1048576), ZeRO stage 2, AdamW, the median over --steps steps\n"
                 "  (default 40) of the slowest rank; program allreduce: the program's own\n"
                 "  MPI_Allreduce of COUNT fp32 elements (on) against PMPI_Allreduce (off): with\n"
                 "  LD_PRELOAD=libdsm_mpiwatch.so (row 'program allreduce+layer') the cost of the\n"
                 "  MPI profiling layer. on/off: the ratio of the medians.\n");
}

// The watchdog on (a timeout of 1800 s) or off (0), as DSM_COMM_TIMEOUT would set it.
void watchdog(bool on) {
    setenv("DSM_COMM_TIMEOUT", on ? "1800" : "0", 1);
    watchdog::start();
}

struct Pair {
    std::vector<double> off, on;
};

// f timed with the watchdog off and on in turn (which first alternates),
// `n` times each, after one warm-up of each; the slowest rank's time.
Pair alternate(const Harness &h, int n, const std::function<void()> &f) {
    Pair p;
    for (int i = -1; i < n; ++i)
        for (int k = 0; k < 2; ++k) {
            const bool on = (k == 0) == (i % 2 == 0);
            watchdog(on);
            const double s = h.time_once(f);
            if (i >= 0) (on ? p.on : p.off).push_back(s);
        }
    return p;
}

// Nanoseconds per Context + WaitScope pair, on this rank.
double scope_ns(const comm::Backend &be) {
    constexpr int kPairs = 1000000;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kPairs; ++i) {
        const watchdog::Context c("bench", "bucket", i);
        const watchdog::WaitScope w("allreduce", &be.watch());
        asm volatile("" ::: "memory");
    }
    return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / kPairs;
}

int run(Harness &h, const Options &o) {
    const bool had = std::getenv("DSM_COMM_TIMEOUT") != nullptr;
    const std::string before = had ? std::getenv("DSM_COMM_TIMEOUT") : "";
    Json rows = Json::array();
    const auto row = [&](const std::string &what, const std::string &unit, double off, double on) {
        rows.push_back({{"what", what}, {"unit", unit}, {"off", off}, {"on", on}, {"on_over_off", on / off}});
        if (!h.json() && h.rank() == 0)
            std::printf("%-22s %12.4g %12.4g %-3s %8.3f\n", what.c_str(), off, on, unit.c_str(), on / off);
    };
    if (!h.json() && h.rank() == 0)
        std::printf("%-22s %12s %12s %-3s %8s\n", "watchdog", "off", "on", "", "on/off");

    auto shm = comm::create_backend(MPI_COMM_WORLD, comm::Kind::AUTO);
    auto mpi = comm::create_backend(MPI_COMM_WORLD, comm::Kind::MPI);
    {
        std::vector<double> off, on;
        for (int r = 0; r < 21; ++r) {
            watchdog(r % 2 == 0);
            (r % 2 == 0 ? on : off).push_back(scope_ns(*shm));
            watchdog(r % 2 != 0);
            (r % 2 != 0 ? on : off).push_back(scope_ns(*shm));
        }
        row("scope", "ns", median(off), median(on));
    }
    for (comm::Backend *be : {shm.get(), mpi.get()}) {
        float *buf = static_cast<float *>(be->alloc_shared(o.count * sizeof(float)));
        std::fill(buf, buf + o.count, 1.0f);
        const Pair p = alternate(h, o.iters, [&] { be->allreduce(buf, buf, o.count, DSM_FLOAT32, comm::Op::MAX); });
        row(std::string("allreduce ") + be->name(), "s", median(p.off), median(p.on));
        be->free_shared(buf);
    }

    // The program's own MPI_Allreduce through the MPI profiling layer
    // (libdsm_mpiwatch.so preloaded: MPI_Allreduce is its wrapper) against
    // PMPI_Allreduce, which no layer sees: off = PMPI_Allreduce, on =
    // MPI_Allreduce, alternating call by call. Without the layer both are
    // the MPI library's and the row says so.
    {
        const bool layer = dlsym(RTLD_DEFAULT, "MPI_Allreduce") != dlsym(RTLD_DEFAULT, "PMPI_Allreduce");
        std::vector<float> a(o.count, 1.0f), b(o.count);
        const int n = static_cast<int>(std::min<size_t>(o.count, 1 << 30));
        Pair p;
        for (int i = -1; i < o.iters; ++i)
            for (int k = 0; k < 2; ++k) {
                const bool on = (k == 0) == (i % 2 == 0);
                const double t = h.time_once([&] {
                    if (on) MPI_Allreduce(a.data(), b.data(), n, MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD);
                    else PMPI_Allreduce(a.data(), b.data(), n, MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD);
                });
                if (i >= 0) (on ? p.on : p.off).push_back(t);
            }
        row(layer ? "program allreduce+layer" : "program allreduce", "s", median(p.off), median(p.on));
    }

    // The engine: one parameter, ZeRO-2, a gradient written and dsm_step.
    dsm_param_desc_t d{};
    const int64_t shape[1] = {o.params};
    d.name = "w";
    d.ndims = 1;
    d.shape = shape;
    d.dtype = DSM_FLOAT32;
    d.trainable = 1;
    const char *cfg = "{\"train_micro_batch_size_per_gpu\": 1, \"steps_per_print\": 1000000000,"
                      " \"zero_optimization\": {\"stage\": 2}, \"optimizer\": {\"type\": \"AdamW\"}}";
    ApiEngine engine(MPI_COMM_WORLD, cfg, &d, 1, DSM_DEVICE_HOST);
    ApiEngine *eng = &engine;
    const size_t bytes = static_cast<size_t>(o.params) * sizeof(float);
    const Pair p = alternate(h, o.steps, [&] {
        (void)eng->param_acquire(0);
        eng->param_release(0);
        std::memset(eng->grad_acquire(0), 0x11, bytes);
        eng->grad_release(0);
        eng->step();
    });
    row("zero step (stage 2)", "s", median(p.off), median(p.on));
    eng->close();

    if (had)
        setenv("DSM_COMM_TIMEOUT", before.c_str(), 1);
    else
        unsetenv("DSM_COMM_TIMEOUT");
    watchdog::start();
    if (h.json())
        h.print(h.result({{"ranks", h.size()},
                          {"count", o.count},
                          {"iters", o.iters},
                          {"params", o.params},
                          {"steps", o.steps},
                          {"results", rows}}));
    return 0;
}

} // namespace

int run_watchdog(int argc, char **argv) {
    Harness h("watchdog", usage);
    Options o;
    h.integer("count", 1, 1 << 28, [&](long long v) { o.count = static_cast<size_t>(v); });
    h.integer("iters", 1, 1000000, [&](long long v) { o.iters = static_cast<int>(v); });
    h.integer("params", 1, 1LL << 32, [&](long long v) { o.params = v; });
    h.integer("steps", 1, 1000, [&](long long v) { o.steps = static_cast<int>(v); });
    const int p = h.parse(argc, argv);
    if (p != 0) return p == 1 ? 0 : 2;
    const double need = static_cast<double>(o.count) * 4 * 2 + static_cast<double>(o.params) * 4 * 6;
    if (!h.fits_memory("--count " + std::to_string(o.count) + " --params " + std::to_string(o.params), need)) return 2;
    return h.guard([&] { return run(h, o); });
}

} // namespace bench
} // namespace dsm
