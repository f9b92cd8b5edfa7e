// dsm-bench collectives: allreduce, reduce-scatter and allgather through the
// "shm" backend (buffers from alloc_shared, as the engine uses them), the
// "mpi" backend, and the raw MPI call on the same bytes, next to a memory
// bandwidth bound measured in the same run.
#include "dsm_config.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <mpi.h>

#include "bench.hpp"
#include "comm/backend.hpp"
#include "comm/common.hpp"
#include "comm/mpi_backend.hpp"
#include "comm/nccl_backend.hpp"
#include "comm/shm_backend.hpp"
#include "comm/reduce.hpp"
#include "core/error.hpp"
#include "core/half.hpp"

namespace dsm {
namespace bench {

namespace {

struct Options {
    size_t count = 16777216;
    int iters = 5;
    dsm_dtype_t dtype = DSM_FLOAT32;
    const char *dtype_name = "fp32";
    bool json = false;
};

void usage(FILE *out) {
    std::fprintf(out,
                 "usage: mpiexec -n N dsm-bench collectives [--count N] [--iters N] [--dtype fp32|fp16|bf16|fp64] [--json]\n"
                 "  Times allreduce, reduce-scatter and allgather of COUNT elements (default 16777216)\n"
                 "  through the shm backend (alloc_shared buffers), the mpi backend and the raw MPI call\n"
                 "  (MPI_Allreduce, MPI_Reduce_scatter_block, MPI_Allgather) on the same bytes.\n"
                 "  seconds: the median over --iters calls (default 5, after one warm-up) of the slowest\n"
                 "  rank; GB/s: buffer bytes (COUNT elements) per second; vs mpi: raw MPI time / time;\n"
                 "  vs bound: time / the memory-bandwidth bound, a memcpy of the same bytes on every\n"
                 "  rank at once (the faster of a run before and one after the collectives);\n"
                 "  sent/rank: bytes each rank sent per call (backend Stats; '-' for raw MPI).\n");
}

// 0: run; 1: --help; 2: usage error (printed on rank 0).
int parse(int argc, char **argv, int rank, Options *o) {
    for (int i = 0; i < argc; ++i) {
        const std::string a = argv[i];
        const bool has_value = i + 1 < argc;
        if (a == "--help" || a == "-h") {
            if (rank == 0) usage(stdout);
            return 1;
        }
        if (a == "--json") {
            o->json = true;
        } else if ((a == "--count" || a == "--iters") && has_value) {
            // --count: the raw MPI calls take an int count; --iters: a bound on the run.
            long long v = 0;
            if (!parse_integer("collectives", a, argv[++i], 1, a == "--count" ? INT_MAX : 1000000, rank == 0, &v))
                return 2;
            if (a == "--count")
                o->count = static_cast<size_t>(v);
            else
                o->iters = static_cast<int>(v);
        } else if (a == "--dtype" && has_value) {
            const std::string d = argv[++i];
            if (d == "fp32") o->dtype = DSM_FLOAT32;
            else if (d == "fp16") o->dtype = DSM_FLOAT16;
            else if (d == "bf16") o->dtype = DSM_BFLOAT16;
            else if (d == "fp64") o->dtype = DSM_FLOAT64;
            else {
                if (rank == 0) std::fprintf(stderr, "dsm-bench collectives: dtype '%s' is not fp32, fp16, bf16 or fp64\n", d.c_str());
                return 2;
            }
            o->dtype_name = argv[i];
        } else {
            if (rank == 0) {
                std::fprintf(stderr, "dsm-bench collectives: unknown or incomplete option '%s'\n", a.c_str());
                usage(stderr);
            }
            return 2;
        }
    }
    return 0;
}

// The median over iterations of the slowest rank's time, after one warm-up.
template <typename F> double time_call(MPI_Comm comm, int iters, F &&f) {
    f();
    std::vector<double> t;
    for (int i = 0; i < iters; ++i) {
        MPI_Barrier(comm);
        const double t0 = now_seconds();
        f();
        double dt = now_seconds() - t0, slowest = 0;
        MPI_Allreduce(&dt, &slowest, 1, MPI_DOUBLE, MPI_MAX, comm);
        t.push_back(slowest);
    }
    std::sort(t.begin(), t.end());
    const size_t m = t.size() / 2;
    return t.size() % 2 ? t[m] : 0.5 * (t[m - 1] + t[m]);
}

void fill(void *p, size_t count, dsm_dtype_t t, int rank) {
    for (size_t i = 0; i < count; ++i) {
        const float v = static_cast<float>((i * 7 + static_cast<size_t>(rank) * 13) % 101) / 101.0f;
        char *at = static_cast<char *>(p) + i * comm::dtype_size(t);
        if (t == DSM_FLOAT32) std::memcpy(at, &v, 4);
        else if (t == DSM_FLOAT64) {
            const double d = v;
            std::memcpy(at, &d, 8);
        } else {
            const uint16_t h = t == DSM_FLOAT16 ? fp32_to_fp16(v) : fp32_to_bf16(v);
            std::memcpy(at, &h, 2);
        }
    }
}

struct Row {
    const char *collective, *backend;
    double seconds;
    bool has_bytes;
    double bytes_sent;
};

// A buffer from a backend's alloc_shared, freed collectively.
class Shared {
public:
    Shared(comm::Backend &be, size_t bytes) : be_(be), p_(be.alloc_shared(bytes)) {}
    ~Shared() {
        try {
            be_.free_shared(p_);
        } catch (...) {
        }
    }
    Shared(const Shared &) = delete;
    Shared &operator=(const Shared &) = delete;
    void *get() const { return p_; }

private:
    comm::Backend &be_;
    void *p_;
};

int run(const Options &o) {
    MPI_Comm world = MPI_COMM_WORLD;
    int rank = 0, size = 1;
    MPI_Comm_rank(world, &rank);
    MPI_Comm_size(world, &size);
    const size_t es = comm::dtype_size(o.dtype);
    const size_t n = o.count, bytes = n * es;
    const size_t block = n / static_cast<size_t>(size); // reduce-scatter and allgather blocks

    auto shm = comm::create_backend(world, comm::Kind::SHM);
    auto mpi = comm::create_backend(world, comm::Kind::MPI);
    const int nodes = static_cast<const comm::ShmBackend &>(*shm).nodes();
    comm::MpiTypes types;
    const MPI_Datatype type = types.type(o.dtype);
    const MPI_Op sum = types.op(o.dtype, comm::Op::SUM);

    // Memory-bandwidth bound: every rank copies the same bytes at once (as
    // every rank works at once in the collectives), timed before and after
    // the collectives; the faster of the two, so that a busy moment does not
    // flatter the ratios.
    std::vector<Row> rows;
    comm::AlignedPtr ca = comm::aligned_bytes(bytes, true), cb = comm::aligned_bytes(bytes, true);
    fill(ca.get(), n, o.dtype, rank);
    auto copy = [&] { std::memcpy(cb.get(), ca.get(), bytes); };
    double bound = time_call(world, o.iters, copy);

    comm::AlignedPtr hs = comm::aligned_bytes(bytes, true), hr = comm::aligned_bytes(bytes, true);
    Shared ss(*shm, bytes), sr(*shm, bytes);
    fill(hs.get(), n, o.dtype, rank);
    fill(ss.get(), n, o.dtype, rank);
    auto timed = [&](const char *coll, comm::Backend *be, const std::function<void()> &f) {
        if (be) be->reset_stats();
        const double s = time_call(world, o.iters, f);
        double sent = 0;
        if (be && be->stats().calls) sent = static_cast<double>(be->stats().bytes_sent) / be->stats().calls;
        rows.push_back(Row{coll, be ? be->name() : "raw-mpi", s, be != nullptr, sent});
    };
    const std::vector<size_t> blocks(static_cast<size_t>(size), block);
    void *s_in = ss.get(), *s_out = sr.get(), *h_in = hs.get(), *h_out = hr.get();
    char *s_own = static_cast<char *>(s_out) + static_cast<size_t>(rank) * block * es;

    timed("allreduce", shm.get(), [&] { shm->allreduce(s_in, s_out, n, o.dtype, comm::Op::SUM); });
    timed("allreduce", mpi.get(), [&] { mpi->allreduce(h_in, h_out, n, o.dtype, comm::Op::SUM); });
    timed("allreduce", nullptr, [&] {
        DSM_CHECK_MPI(MPI_Allreduce(h_in, h_out, static_cast<int>(n), type, sum, world));
    });
    timed("reduce_scatter", shm.get(), [&] { shm->reduce_scatter(s_in, s_out, block, o.dtype, comm::Op::SUM); });
    timed("reduce_scatter", mpi.get(), [&] { mpi->reduce_scatter(h_in, h_out, block, o.dtype, comm::Op::SUM); });
    timed("reduce_scatter", nullptr, [&] {
        DSM_CHECK_MPI(MPI_Reduce_scatter_block(h_in, h_out, static_cast<int>(block), type, sum, world));
    });
    // The engine gathers its partitions in place.
    timed("allgather", shm.get(), [&] { shm->allgather(s_own, s_out, block, o.dtype); });
    timed("allgather", mpi.get(), [&] { mpi->allgather(h_in, h_out, block, o.dtype); });
    timed("allgather", nullptr, [&] {
        DSM_CHECK_MPI(MPI_Allgather(h_in, static_cast<int>(block), type, h_out, static_cast<int>(block), type, world));
    });

    bound = std::min(bound, time_call(world, o.iters, copy));

    if (rank != 0) return 0;
    auto raw_time = [&](const char *coll) {
        for (const Row &r : rows)
            if (!std::strcmp(r.collective, coll) && !r.has_bytes) return r.seconds;
        return 0.0;
    };
    const double gb = static_cast<double>(bytes) / 1e9;
    if (o.json) {
        std::printf("{\"format\":\"dsm-bench-collectives\",\"format_version\":1,\"ranks\":%d,\"nodes\":%d,"
                    "\"count\":%zu,\"dtype\":\"%s\",\"bytes\":%zu,\"iters\":%d,\"bandwidth_bound_seconds\":%.6g,"
                    "\"bandwidth_bound_gbs\":%.4g,\"results\":[",
                    size, nodes, n, o.dtype_name, bytes, o.iters, bound, gb / bound);
        for (size_t i = 0; i < rows.size(); ++i) {
            const Row &r = rows[i];
            std::printf("%s{\"collective\":\"%s\",\"backend\":\"%s\",\"seconds\":%.6g,\"gbs\":%.4g,"
                        "\"speedup_vs_mpi\":%.4g,\"ratio_to_bound\":%.4g,\"bytes_sent_per_rank\":",
                        i ? "," : "", r.collective, r.backend, r.seconds, gb / r.seconds,
                        raw_time(r.collective) / r.seconds, r.seconds / bound);
            if (r.has_bytes)
                std::printf("%.0f}", r.bytes_sent);
            else
                std::printf("null}");
        }
        std::printf("]}\n");
        return 0;
    }
    std::printf("dsm-bench collectives: %d ranks on %d node%s, %zu %s elements (%.1f MiB), median of %d\n", size,
                nodes, nodes == 1 ? "" : "s", n, o.dtype_name, static_cast<double>(bytes) / (1 << 20), o.iters);
    std::printf("memory-bandwidth bound (memcpy of the same bytes on every rank at once): %.4f s, %.2f GB/s\n\n",
                bound, gb / bound);
    std::printf("%-15s %-8s %10s %9s %8s %9s %14s\n", "collective", "backend", "seconds", "GB/s", "vs mpi",
                "vs bound", "sent/rank");
    for (const Row &r : rows) {
        char sent[32] = "-";
        if (r.has_bytes) std::snprintf(sent, sizeof sent, "%.0f", r.bytes_sent);
        std::printf("%-15s %-8s %10.5f %9.2f %7.1fx %8.2fx %14s\n", r.collective, r.backend, r.seconds,
                    gb / r.seconds, raw_time(r.collective) / r.seconds, r.seconds / bound, sent);
    }
    return 0;
}

} // namespace

int run_collectives(int argc, char **argv) {
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    Options o;
    const int p = parse(argc, argv, rank, &o);
    if (p == 1) return 0;
    if (p == 2) return 2;
    if (o.count < static_cast<size_t>(size)) {
        if (rank == 0)
            std::fprintf(stderr, "dsm-bench collectives: --count %zu is less than the %d ranks (reduce-scatter and "
                                 "allgather need a block per rank)\n", o.count, size);
        return 2;
    }
    // Six buffers of COUNT elements per rank: the bound's two, the mpi and raw
    // calls' two, the shm backend's two.
    const double need = 6.0 * static_cast<double>(o.count) * static_cast<double>(comm::dtype_size(o.dtype));
    if (!fits_memory("collectives", "--count " + std::to_string(o.count) + " --dtype " + o.dtype_name, need,
                     MPI_COMM_WORLD, rank == 0))
        return 2;
    try {
        return run(o);
    } catch (const Error &e) {
        std::fprintf(stderr, "dsm-bench collectives: rank %d: %s\n", rank, e.what());
        return 1;
    } catch (const std::exception &e) {
        std::fprintf(stderr, "dsm-bench collectives: rank %d: %s\n", rank, e.what());
        MPI_Abort(MPI_COMM_WORLD, 1); // the others may wait in a collective for this rank
        return 1;
    }
}

} // namespace bench
} // namespace dsm
