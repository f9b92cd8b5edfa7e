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

#include "harness.hpp"
#include "comm/backend.hpp"
#include "comm/common.hpp"
#include "comm/mpi_backend.hpp"
#include "comm/nccl_backend.hpp"
#include "comm/shm_backend.hpp"
#include "comm/reduce.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/half.hpp"

namespace dsm {
namespace bench {

namespace {

struct Options {
    size_t count = 16777216;
    int iters = 5;
    dsm_dtype_t dtype = DSM_FLOAT32;
    std::string dtype_name = "fp32";
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

void fill(void *p, size_t count, dsm_dtype_t t, int rank) {
    for (size_t i = 0; i < count; ++i) {
        const float v = static_cast<float>((i * 7 + static_cast<size_t>(rank) * 13) % 101) / 101.0f;
        char *at = static_cast<char *>(p) + i * require_dtype_size(t);
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

int run(const Harness &h, const Options &o) {
    MPI_Comm world = MPI_COMM_WORLD;
    const int rank = h.rank(), size = h.size();
    const size_t es = require_dtype_size(o.dtype);
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
    double bound = h.time_median(o.iters, copy);

    comm::AlignedPtr hs = comm::aligned_bytes(bytes, true), hr = comm::aligned_bytes(bytes, true);
    Shared ss(*shm, bytes), sr(*shm, bytes);
    fill(hs.get(), n, o.dtype, rank);
    fill(ss.get(), n, o.dtype, rank);
    auto timed = [&](const char *coll, comm::Backend *be, const std::function<void()> &f) {
        if (be) be->reset_stats();
        const double s = h.time_median(o.iters, f);
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

    bound = std::min(bound, h.time_median(o.iters, copy));

    if (rank != 0) return 0;
    auto raw_time = [&](const char *coll) {
        for (const Row &r : rows)
            if (!std::strcmp(r.collective, coll) && !r.has_bytes) return r.seconds;
        return 0.0;
    };
    const double gb = static_cast<double>(bytes) / 1e9;
    if (h.json()) {
        Json results = Json::array();
        for (const Row &r : rows)
            results.push_back({{"collective", r.collective},
                               {"backend", r.backend},
                               {"seconds", r.seconds},
                               {"gbs", gb / r.seconds},
                               {"speedup_vs_mpi", raw_time(r.collective) / r.seconds},
                               {"ratio_to_bound", r.seconds / bound},
                               {"bytes_sent_per_rank", r.has_bytes ? Json(r.bytes_sent) : Json(nullptr)}});
        h.print(h.result({{"ranks", size},
                         {"nodes", nodes},
                         {"count", n},
                         {"dtype", o.dtype_name},
                         {"bytes", bytes},
                         {"iters", o.iters},
                         {"bandwidth_bound_seconds", bound},
                         {"bandwidth_bound_gbs", gb / bound},
                         {"results", results}}));
        return 0;
    }
    std::printf("dsm-bench collectives: %d ranks on %d node%s, %zu %s elements (%.1f MiB), median of %d\n", size,
                nodes, nodes == 1 ? "" : "s", n, o.dtype_name.c_str(), static_cast<double>(bytes) / (1 << 20), o.iters);
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
    Harness h("collectives", usage);
    Options o;
    // --count: the raw MPI calls take an int count; --iters: a bound on the run.
    h.integer("count", 1, INT_MAX, [&](long long v) { o.count = static_cast<size_t>(v); });
    h.integer("iters", 1, 1000000, [&](long long v) { o.iters = static_cast<int>(v); });
    h.choice("dtype", {"fp32", "fp16", "bf16", "fp64"}, [&](const std::string &d) {
        o.dtype = d == "fp32" ? DSM_FLOAT32 : d == "fp16" ? DSM_FLOAT16 : d == "bf16" ? DSM_BFLOAT16 : DSM_FLOAT64;
        o.dtype_name = d;
    });
    const int p = h.parse(argc, argv);
    if (p != 0) return p == 1 ? 0 : 2;
    if (o.count < static_cast<size_t>(h.size())) {
        h.refuse("--count %zu is less than the %d ranks (reduce-scatter and allgather need a block per rank)", o.count,
                 h.size());
        return 2;
    }
    // Six buffers of COUNT elements per rank: the bound's two, the mpi and raw
    // calls' two, the shm backend's two.
    const double need = 6.0 * static_cast<double>(o.count) * static_cast<double>(require_dtype_size(o.dtype));
    if (!h.fits_memory("--count " + std::to_string(o.count) + " --dtype " + o.dtype_name, need)) return 2;
    return h.guard([&] { return run(h, o); });
}

} // namespace bench
} // namespace dsm
