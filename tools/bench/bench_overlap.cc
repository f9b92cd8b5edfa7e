// dsm-bench overlap: overlap_comm measured on a synthetic model. L layers of
// one fp32 parameter each; the forward reads each layer's parameter and does
// W/2 multiply-adds per element, the backward reads it again and writes its
// gradient after W multiply-adds per element, layer by layer in reverse, as
// a model's hooks would; then dsm_step. Measured in the same run, per stage:
//   compute        the model's loops alone (no engine)
//   communication  the engine's step with no compute: the reductions,
//                  gathers and the optimizer (the faster of overlap off and
//                  on, so the ideal is the strictest)
//   ideal          max(compute, communication)
//   off, on        the step with overlap_comm false and true
// and whether the two give the same parameter bits. --work auto picks W so
// that compute equals communication, where hiding one behind the other is
// hardest and pays the most.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <mpi.h>

#include "api_engine.hpp"
#include "harness.hpp"
#include "core/error.hpp"
#include "core/hash.hpp"

namespace dsm {
namespace bench {

namespace {

struct Options {
    long long layers = 16, params = 1048576, work = -1; // -1: auto
    long long bucket = 0, allgather = 0, prefetch = 0;  // 0: one layer
    int steps = 5;
    std::vector<int> stages{2};
};

void usage(FILE *out) {
    std::fprintf(out,
                 "usage: mpiexec -n N dsm-bench overlap [--layers L] [--params N] [--work W|auto] [--stage S|all]\n"
                 "                                      [--steps N] [--bucket N] [--allgather-bucket N]\n"
                 "                                      [--prefetch N] [--json]\n"
                 "  A synthetic model of L layers (default 16) of one fp32 parameter of N elements each\n"
                 "  (default 1048576): the forward does W/2 multiply-adds per parameter element, the backward\n"
                 "  W and releases each layer's gradient as it is done. Per stage (default 2), the median\n"
                 "  step time (slowest rank) with overlap_comm false and true, next to the model's compute\n"
                 "  alone, the engine's step with no compute, and the ideal max(compute, communication);\n"
                 "  and whether overlap on and off give the same parameter bits. --work auto (default)\n"
                 "  makes compute equal communication. --bucket: reduce_bucket_size, --allgather-bucket:\n"
                 "  allgather_bucket_size, --prefetch: stage3_prefetch_bucket_size (each default one layer).\n");
}

// W multiply-adds per element of `x` into y (in blocks that stay in L1 so
// the work, not memory, sets the time); returns a checksum.
float work(const float *x, float *y, size_t n, long long w) {
    constexpr size_t B = 1024;
    float sum = 0;
    for (size_t b = 0; b < n; b += B) {
        const size_t m = std::min(B, n - b);
        for (size_t i = 0; i < m; ++i) y[b + i] = x[b + i];
        for (long long k = 0; k < w; ++k)
            for (size_t i = 0; i < m; ++i) y[b + i] = y[b + i] * 0.5f + x[b + i];
        sum += y[b];
    }
    return sum;
}

struct Model {
    const Options &o;
    long long w;
    std::vector<float> scratch, local; // local: the parameter values of the compute-only run
    volatile float sink = 0;
    Model(const Options &opt, long long work_) : o(opt), w(work_), scratch(static_cast<size_t>(opt.params)),
                                                 local(static_cast<size_t>(opt.params), 0.01f) {}
    // One step; eng null: the compute alone.
    void step(ApiEngine *eng) {
        const size_t n = static_cast<size_t>(o.params);
        const int L = static_cast<int>(o.layers);
        for (int l = 0; l < L; ++l) {
            const float *p = eng ? static_cast<const float *>(eng->param_acquire(l)) : local.data();
            sink = sink + work(p, scratch.data(), n, w / 2);
            if (eng) eng->param_release(l);
        }
        for (int l = L - 1; l >= 0; --l) {
            const float *p = eng ? static_cast<const float *>(eng->param_acquire(l)) : local.data();
            float *g = eng ? static_cast<float *>(eng->grad_acquire(l)) : scratch.data();
            sink = sink + work(p, g, n, w);
            for (size_t i = 0; i < n; ++i) g[i] *= 1e-3f;
            if (eng) {
                eng->grad_release(l);
                eng->param_release(l);
            }
        }
        if (eng) eng->step();
    }
};

std::unique_ptr<ApiEngine> make_engine(MPI_Comm world, int stage, bool overlap, const Options &o) {
    std::vector<std::string> names(static_cast<size_t>(o.layers));
    std::vector<dsm_param_desc_t> d(static_cast<size_t>(o.layers));
    const int64_t shape[1] = {o.params};
    for (size_t l = 0; l < d.size(); ++l) {
        names[l] = cat("layer", l, ".weight");
        d[l] = dsm_param_desc_t{};
        d[l].name = names[l].c_str();
        d[l].ndims = 1;
        d[l].shape = shape;
        d[l].dtype = DSM_FLOAT32;
        d[l].trainable = 1;
    }
    const long long bucket = o.bucket ? o.bucket : o.params, ag = o.allgather ? o.allgather : o.params,
                    pf = o.prefetch ? o.prefetch : o.params;
    const std::string cfg =
        cat("{\"train_micro_batch_size_per_gpu\": 1, \"steps_per_print\": 1000000000, \"gradient_clipping\": 0,"
            " \"zero_optimization\": {\"stage\": ", stage, ", \"overlap_comm\": ", overlap ? "true" : "false",
            ", \"reduce_bucket_size\": ", bucket, ", \"allgather_bucket_size\": ", ag,
            ", \"stage3_prefetch_bucket_size\": ", pf,
            ", \"stage3_param_persistence_threshold\": 0}, \"optimizer\": {\"type\": \"AdamW\"}}");
    return std::make_unique<ApiEngine>(world, cfg, d.data(), static_cast<int>(d.size()));
}

// One step on every rank, timed (slowest rank); eng null: the compute alone.
double timed_step(const Harness &h, Model &m, ApiEngine *eng) {
    return h.time_once([&] { m.step(eng); });
}

// A hash of the engine's parameters.
unsigned long long param_hash(ApiEngine &eng) {
    uint64_t h = dsm::kFnv1aOffset;
    for (int l = 0; l < eng.num_params(); ++l) {
        h = dsm::fnv1a(eng.param_acquire(l), static_cast<size_t>(eng.numel(l)) * 4, h);
        eng.param_release(l);
    }
    return h;
}

struct Result {
    int stage;
    long long work;
    double compute, comm, off, on;
    bool same;
};

// The four measurements interleaved step by step (communication, compute,
// overlap off, overlap on), so that a change of the machine's load (other
// jobs on shared cores) touches them alike; medians after one warm-up round.
Result run_stage(const Harness &h, MPI_Comm world, int stage, const Options &o) {
    Result r{};
    r.stage = stage;
    Model none(o, 0);
    auto comm = make_engine(world, stage, false, o), comm_on = make_engine(world, stage, true, o);
    long long w = o.work;
    if (w < 0) { // auto: compute = communication (as the comm column measures it)
        Model probe(o, 16);
        std::vector<double> c, c2, p;
        for (int s = 0; s < 4; ++s) {
            c.push_back(timed_step(h, none, comm.get()));
            c2.push_back(timed_step(h, none, comm_on.get()));
            p.push_back(timed_step(h, probe, nullptr));
        }
        c.erase(c.begin());
        c2.erase(c2.begin());
        p.erase(p.begin());
        const double m = std::min(median(c), median(c2));
        w = std::max(1LL, std::llround(16.0 * m / std::max(median(p), 1e-9)));
        MPI_Bcast(&w, 1, MPI_LONG_LONG, 0, world);
    }
    r.work = w;
    Model m(o, w);
    auto off = make_engine(world, stage, false, o), on = make_engine(world, stage, true, o);
    std::vector<double> tc, tco, tm, toff, ton;
    for (int s = 0; s <= o.steps; ++s) {
        const double a = timed_step(h, none, comm.get());
        const double a2 = timed_step(h, none, comm_on.get());
        const double b = timed_step(h, m, nullptr);
        const double c = timed_step(h, m, off.get());
        const double d = timed_step(h, m, on.get());
        if (s == 0) continue;
        tc.push_back(a);
        tco.push_back(a2);
        tm.push_back(b);
        toff.push_back(c);
        ton.push_back(d);
    }
    r.comm = std::min(median(tc), median(tco));
    r.compute = median(tm);
    r.off = median(toff);
    r.on = median(ton);
    int same = param_hash(*off) == param_hash(*on) ? 1 : 0;
    MPI_Allreduce(MPI_IN_PLACE, &same, 1, MPI_INT, MPI_MIN, world);
    r.same = same != 0;
    comm_on->close();
    on->close();
    off->close();
    comm->close();
    return r;
}

} // namespace

int run_overlap(int argc, char **argv) {
    Harness h("overlap", usage);
    Options o;
    // "auto" for --work, "all" for --stage, else an integer.
    auto or_word = [&h](const char *opt, const char *word, long long lo, long long hi, std::function<void(long long)> set) {
        h.text(opt + 2, [&h, opt, word, lo, hi, set](const char *v) {
            long long x = -1;
            if (std::strcmp(v, word) != 0 && !h.parse_integer(opt, v, lo, hi, &x)) return false;
            set(x);
            return true;
        });
    };
    h.integer("layers", 1, 100000, [&](long long x) { o.layers = x; });
    h.integer("params", 1, 1LL << 40, [&](long long x) { o.params = x; });
    or_word("--work", "auto", 0, 1LL << 40, [&](long long x) { o.work = x; });
    or_word("--stage", "all", 0, 3, [&](long long x) {
        o.stages = x < 0 ? std::vector<int>{0, 1, 2, 3} : std::vector<int>{static_cast<int>(x)};
    });
    h.integer("steps", 1, 1000, [&](long long x) { o.steps = static_cast<int>(x); });
    h.integer("bucket", 1, 1LL << 40, [&](long long x) { o.bucket = x; });
    h.integer("allgather-bucket", 1, 1LL << 40, [&](long long x) { o.allgather = x; });
    h.integer("prefetch", 1, 1LL << 40, [&](long long x) { o.prefetch = x; });
    const int p = h.parse(argc, argv);
    if (p != 0) return p == 1 ? 0 : 2;
    const int rank = h.rank(), size = h.size();
    int level = 0;
    MPI_Query_thread(&level);
    // Parameters, gradients, AdamW's moments, the scratch and the gathers: 24 bytes per element at most.
    const double need = 24.0 * static_cast<double>(o.params) * static_cast<double>(o.layers);
    if (!h.fits_memory(cat("--layers ", o.layers, " --params ", o.params), need)) return 2;
    std::vector<Result> results;
    const int rc = h.guard([&] {
        for (int s : o.stages) results.push_back(run_stage(h, MPI_COMM_WORLD, s, o));
        return 0;
    });
    if (rc != 0) return rc;
    if (rank != 0) return 0;
    const char *how = level == MPI_THREAD_MULTIPLE ? "progress thread" : "deferred (MPI below MPI_THREAD_MULTIPLE)";
    if (h.json()) {
        Json rows = Json::array();
        for (const Result &r : results) {
            const double ideal = std::max(r.compute, r.comm);
            rows.push_back({{"stage", r.stage},
                            {"work", r.work},
                            {"compute_seconds", r.compute},
                            {"communication_seconds", r.comm},
                            {"ideal_seconds", ideal},
                            {"off_seconds", r.off},
                            {"on_seconds", r.on},
                            {"on_over_ideal", r.on / ideal},
                            {"off_over_on", r.off / r.on},
                            {"same_bits", r.same}});
        }
        h.print(h.result({{"ranks", size},
                         {"layers", o.layers},
                         {"params_per_layer", o.params},
                         {"overlap", how},
                         {"results", rows}}));
        return 0;
    }
    std::printf("dsm-bench overlap: %d ranks, %lld layers x %lld fp32 parameters, AdamW, overlap_comm by %s\n"
                "(median of %d steps, slowest rank)\n",
                size, o.layers, o.params, how, o.steps);
    std::printf("%5s %6s %10s %10s %9s %9s %9s %9s %9s %5s\n", "stage", "work", "compute s", "comm s", "ideal s",
                "off s", "on s", "on/ideal", "off/on", "bits");
    for (const Result &r : results) {
        const double ideal = std::max(r.compute, r.comm);
        std::printf("%5d %6lld %10.4f %10.4f %9.4f %9.4f %9.4f %8.2fx %8.2fx %5s\n", r.stage, r.work, r.compute,
                    r.comm, ideal, r.off, r.on, r.on / ideal, r.off / r.on, r.same ? "same" : "DIFF");
    }
    std::printf("compute: the model alone; comm: the engine's step with no compute (the faster of overlap off and on); ideal:\n"
                "max(compute, comm); off/on: the step with overlap_comm false/true; bits: the parameters after\n"
                "the same steps with overlap on and off.\n");
    return 0;
}

} // namespace bench
} // namespace dsm
