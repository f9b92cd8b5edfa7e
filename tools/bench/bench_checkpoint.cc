// dsm-bench checkpoint: the engine's checkpoint save and load (parallel HDF5,
// doc/checkpoint.md) of N fp32 parameters with AdamW, next to plain
// sequential POSIX I/O of the same bytes on the same disk by rank 0, and the
// asynchronous save (checkpoint.writer.decoupled) of the same model: the time
// it blocks at the step boundary and the time until it is complete. All are
// timed in turn within each round so that a noisy neighbour hits them alike.
#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <string>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

#include <mpi.h>

#include "api_engine.hpp"
#include "harness.hpp"
#include "core/error.hpp"

namespace dsm {
namespace bench {

namespace {

const char *const kTag = "dsm-bench";                       // the checkpoint: DIR/dsm-bench.h5
const char *const kAsyncTag = "dsm-bench-async";            // the asynchronous save's
const char *const kBaseline = ".dsm-bench-baseline.tmp";    // rank 0's plain file in DIR
const size_t kChunk = size_t(8) << 20;                      // baseline write()/read() size

struct Options {
    long long params = 16777216;
    int iters = 3;
    int stage = 1;
    bool torch = true;
    std::string dir; // empty: a temporary directory, removed at the end
};

void usage(FILE *out) {
    std::fprintf(out,
                 "usage: mpiexec -n N dsm-bench checkpoint [--params N] [--dir DIR] [--iters N] [--stage S] [--json]\n"
                 "  One fp32 parameter of N elements (default 16777216) trained one step with AdamW at ZeRO\n"
                 "  stage S (default 1), so that a checkpoint holds 12 bytes per parameter (params, exp_avg,\n"
                 "  exp_avg_sq). Times dsm_engine_save_checkpoint and dsm_engine_load_checkpoint (slowest\n"
                 "  rank, median of --iters, default 3) next to rank 0 writing the same bytes with write() in\n"
                 "  8 MiB chunks + fsync and reading them back with read(), in the same directory. Before each\n"
                 "  read the page cache of both files is dropped (posix_fadvise DONTNEED, best-effort).\n"
                 "  A second engine of the same model with checkpoint.writer.decoupled saves asynchronously\n"
                 "  under the tag 'dsm-bench-async': the time the save call blocks (the copy of the state) and\n"
                 "  the time until dsm_engine_checkpoint_wait returns (the file complete).\n"
                 "  --dir: where to save (kept, under the tag 'dsm-bench'); default a new temporary directory\n"
                 "  under $TMPDIR or /tmp, removed at the end.\n"
                 "  With torch in python3 ($DSM_BENCH_PYTHON), rank 0 also times torch.save (+ fsync) and\n"
                 "  torch.load of the same three tensors in the same directory, page cache dropped before each\n"
                 "  load (--no-torch: not).\n");
}

// Rank 0 runs f (which returns an error message, empty on success) while the
// others sleep (not spin, so that they leave the cores to it); every rank
// returns whether it succeeded. Rank 0 prints the message.
template <typename F> bool on_rank0(MPI_Comm comm, int rank, F &&f) {
    int ok = 1;
    if (rank == 0) {
        const std::string err = f();
        if (!err.empty()) {
            std::fprintf(stderr, "dsm-bench checkpoint: %s\n", err.c_str());
            ok = 0;
        }
    }
    MPI_Request req;
    MPI_Ibcast(&ok, 1, MPI_INT, 0, comm, &req);
    int done = 0;
    while (!done) {
        MPI_Test(&req, &done, MPI_STATUS_IGNORE);
        if (!done) usleep(2000);
    }
    return ok != 0;
}

std::string errno_text(const char *what, const std::string &path) {
    return cat(what, " '", path, "': ", std::strerror(errno));
}

// Baseline: `bytes` written to a new file with write() in 8 MiB chunks, then
// fsync and close; returns an error message or "".
std::string plain_write(const std::string &path, const std::vector<char> &chunk, uint64_t bytes, double *seconds) {
    ::unlink(path.c_str()); // a new file, as every checkpoint save makes (untimed)
    const double t0 = now_seconds();
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return errno_text("cannot create", path);
    uint64_t left = bytes;
    while (left > 0) {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(left, chunk.size()));
        const ssize_t w = ::write(fd, chunk.data(), n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            const std::string e = errno_text("cannot write", path);
            ::close(fd);
            return e;
        }
        left -= static_cast<uint64_t>(w);
    }
    if (::fsync(fd) != 0) {
        const std::string e = errno_text("cannot fsync", path);
        ::close(fd);
        return e;
    }
    if (::close(fd) != 0) return errno_text("cannot close", path);
    *seconds = now_seconds() - t0;
    return "";
}

// Baseline: the file read back with read() in 8 MiB chunks.
std::string plain_read(const std::string &path, std::vector<char> &chunk, uint64_t bytes, double *seconds) {
    const double t0 = now_seconds();
    const int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) return errno_text("cannot open", path);
    uint64_t got = 0;
    for (;;) {
        const ssize_t r = ::read(fd, chunk.data(), chunk.size());
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            const std::string e = errno_text("cannot read", path);
            ::close(fd);
            return e;
        }
        if (r == 0) break;
        got += static_cast<uint64_t>(r);
    }
    ::close(fd);
    *seconds = now_seconds() - t0;
    if (got != bytes) return cat("read ", got, " bytes of '", path, "', expected ", bytes);
    return "";
}

// Best-effort: flush the file and ask the kernel to drop its cached pages, so
// that the next read comes from the disk.
void drop_cache(const std::string &path) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) return;
    (void)::fsync(fd);
    (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
}

// torch.save (+ fsync) and torch.load of the checkpoint's three tensors
// (parameters, exp_avg, exp_avg_sq) in the same directory, the page cache
// dropped before each load; "TORCH version bytes save_s load_s" (medians).
const char *kTorchScript = R"PY(
import os, sys, time
import torch
path, n, iters = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
g = torch.Generator().manual_seed(1)
state = {"params": {"weight": torch.randn(n, generator=g)},
         "optimizer": {"exp_avg": torch.randn(n, generator=g), "exp_avg_sq": torch.rand(n, generator=g)}}
def drop(p):
    fd = os.open(p, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
def med(v):
    v = sorted(v)
    return 0.5 * (v[(len(v) - 1) // 2] + v[len(v) // 2])
saves, loads = [], []
for i in range(iters):
    if os.path.exists(path):
        os.unlink(path)
    t = time.perf_counter()
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    saves.append(time.perf_counter() - t)
    drop(path)
    t = time.perf_counter()
    s = torch.load(path)
    loads.append(time.perf_counter() - t)
    del s
size = os.path.getsize(path)
os.unlink(path)
print("TORCH", torch.__version__, size, med(saves), med(loads))
)PY";

struct TorchResult {
    std::string version;
    unsigned long long bytes = 0;
    double save = -1, load = -1; // median seconds; -1: not measured
};

// Rank 0 runs the script (the others sleep); every rank returns.
void torch_checkpoint(MPI_Comm comm, int rank, const std::string &dir, long long n, int iters, TorchResult *out) {
    char line[256] = {0};
    if (rank == 0) {
        char script[] = "/tmp/dsm-bench-ckpt-torch-XXXXXX";
        const int fd = ::mkstemp(script);
        if (fd >= 0) {
            const bool ok = ::write(fd, kTorchScript, std::strlen(kTorchScript)) >= 0;
            ::close(fd);
            const std::string cmd = cat(python_command(), " ", script, " ", dir, "/.dsm-bench-torch.pt ", n, " ",
                                        iters, " 2>/dev/null");
            if (ok)
                if (FILE *p = ::popen(cmd.c_str(), "r")) {
                    char buf[256];
                    while (std::fgets(buf, sizeof buf, p))
                        if (std::strncmp(buf, "TORCH ", 6) == 0) std::snprintf(line, sizeof line, "%s", buf);
                    ::pclose(p);
                }
            ::unlink(script);
        }
    }
    MPI_Request req;
    MPI_Ibcast(line, sizeof line, MPI_CHAR, 0, comm, &req);
    int done = 0;
    while (!done) {
        MPI_Test(&req, &done, MPI_STATUS_IGNORE);
        if (!done) usleep(20000);
    }
    char ver[64];
    unsigned long long bytes = 0;
    double s = 0, l = 0;
    if (std::sscanf(line, "TORCH %63s %llu %lf %lf", ver, &bytes, &s, &l) == 4) {
        out->version = ver;
        out->bytes = bytes;
        out->save = s;
        out->load = l;
    }
}

struct Result {
    uint64_t bytes = 0;
    double save = 0, load = 0, write = 0, read = 0; // median seconds
    double async_block = 0, async_done = 0;         // the asynchronous save: blocking, until complete
    double async_captured = 0; // until the writer no longer reads the state (what a dsm_step right after waits for)
    bool background = false;                        // it ran in the background (MPI_THREAD_MULTIPLE)
};

// The rounds: save, baseline write, drop caches, load, drop caches, baseline
// read. Returns false on a failure already reported; throws dsm::Error for a
// failure of the engine (agreed by every rank).
bool measure(const Harness &h, MPI_Comm world, int rank, const Options &o, const std::string &dir, Result *res) {
    const int64_t shape[1] = {o.params};
    dsm_param_desc_t d{};
    d.name = "weight";
    d.ndims = 1;
    d.shape = shape;
    d.dtype = DSM_FLOAT32;
    d.trainable = 1;
    const std::string cfg = cat("{\"train_micro_batch_size_per_gpu\": 1, \"steps_per_print\": 1000000000,"
                                " \"gradient_clipping\": 0, \"zero_optimization\": {\"stage\": ", o.stage,
                                ", \"stage3_param_persistence_threshold\": 0}, \"optimizer\": {\"type\": \"AdamW\"}}");
    ApiEngine engine(world, cfg, &d, 1);
    const std::string async_cfg = cfg.substr(0, cfg.size() - 1) + ", \"checkpoint\": {\"writer\": {\"decoupled\": true}}}";
    ApiEngine async_engine(world, async_cfg, &d, 1);
    ApiEngine *eng = &engine, *async_eng = &async_engine;
    // One step, so that the optimizer state exists (and is not all zeros).
    for (ApiEngine *e : {eng, async_eng}) {
        for (int pass = 0; pass < 2; ++pass) {
            (void)e->param_acquire(0);
            e->param_release(0);
        }
        float *g = static_cast<float *>(e->grad_acquire(0));
        for (long long i = 0; i < o.params; ++i) g[i] = 1e-3f * static_cast<float>(1 + (i & 7));
        e->grad_release(0);
        e->step();
    }
    int level = MPI_THREAD_SINGLE;
    MPI_Query_thread(&level);
    res->background = level == MPI_THREAD_MULTIPLE;

    const std::string file = dir + "/" + kTag + ".h5";
    const std::string plain = dir + "/" + kBaseline;
    std::vector<char> chunk;
    if (rank == 0) {
        chunk.resize(kChunk);
        for (size_t i = 0; i < chunk.size(); ++i) chunk[i] = static_cast<char>((i * 2654435761u) >> 13);
    }
    auto slowest = [&h](double t) { return h.slowest(t); };
    std::vector<double> save, load, wr, rd, ablock, adone, acapt;
    bool ok = true;
    for (int it = 0; it < o.iters && ok; ++it) {
        MPI_Barrier(world);
        double t0 = now_seconds();
        eng->save_checkpoint(dir, kTag);
        save.push_back(slowest(now_seconds() - t0));

        // The asynchronous save: what the step boundary waits for, then the
        // whole save (the wait returns when the file is complete).
        MPI_Barrier(world);
        t0 = now_seconds();
        async_eng->save_checkpoint(dir, kAsyncTag);
        const double blocked = now_seconds() - t0;
        async_eng->checkpoint_captured_wait();
        const double captured = now_seconds() - t0;
        async_eng->checkpoint_wait();
        const double done = now_seconds() - t0;
        ablock.push_back(slowest(blocked));
        acapt.push_back(slowest(captured));
        adone.push_back(slowest(done));
        if (it == 0) {
            unsigned long long bytes = 0;
            ok = on_rank0(world, rank, [&]() -> std::string {
                struct stat st;
                if (::stat(file.c_str(), &st) != 0) return errno_text("cannot stat", file);
                bytes = static_cast<unsigned long long>(st.st_size);
                return "";
            });
            if (!ok) break;
            MPI_Bcast(&bytes, 1, MPI_UNSIGNED_LONG_LONG, 0, world);
            res->bytes = bytes;
        }
        double t = 0;
        ok = on_rank0(world, rank, [&] { return plain_write(plain, chunk, res->bytes, &t); });
        if (!ok) break;
        wr.push_back(t);

        drop_cache(file); // every rank: on several nodes, each node's cache
        if (rank == 0) drop_cache(plain);
        MPI_Barrier(world);
        t0 = now_seconds();
        eng->load_checkpoint(dir, kTag);
        load.push_back(slowest(now_seconds() - t0));

        drop_cache(file);
        ok = on_rank0(world, rank, [&] {
            drop_cache(plain);
            return plain_read(plain, chunk, res->bytes, &t);
        });
        if (!ok) break;
        rd.push_back(t);
    }
    eng->close();
    async_eng->close();
    res->async_block = median(ablock);
    res->async_done = median(adone);
    res->async_captured = median(acapt);
    res->save = median(save);
    res->load = median(load);
    res->write = median(wr);
    res->read = median(rd);
    return ok;
}

} // namespace

int run_checkpoint(int argc, char **argv) {
    Harness h("checkpoint", usage);
    Options o;
    h.integer("params", 1, 1LL << 50, [&](long long x) { o.params = x; });
    h.integer("iters", 1, 1000, [&](long long x) { o.iters = static_cast<int>(x); });
    h.integer("stage", 0, 3, [&](long long x) { o.stage = static_cast<int>(x); });
    h.flag("no-torch", [&] { o.torch = false; });
    h.text("dir", [&](const char *v) {
        if (*v == '\0') return h.refuse("--dir '' is empty");
        o.dir = v;
        return true;
    });
    const int p = h.parse(argc, argv);
    if (p != 0) return p == 1 ? 0 : 2;
    const int rank = h.rank(), size = h.size();
    // A rank's engine at stage 0 or 1: the fp32 parameter and its gradient,
    // AdamW's moments; the load reads as much again.
    // The asynchronous save's engine as much again, and its copy of the state.
    const double need = 60.0 * static_cast<double>(o.params);
    if (!h.fits_memory("--params " + std::to_string(o.params), need)) return 2;

    // The directory: --dir, or a new one from mkdtemp on rank 0.
    const bool temporary = o.dir.empty();
    std::string dir = o.dir;
    if (temporary) {
        const bool ok = on_rank0(MPI_COMM_WORLD, rank, [&]() -> std::string {
            const char *t = std::getenv("TMPDIR");
            std::string tmpl = cat(t != nullptr && *t != '\0' ? t : "/tmp", "/dsm-bench-ckpt-XXXXXX");
            std::vector<char> buf(tmpl.begin(), tmpl.end());
            buf.push_back('\0');
            if (::mkdtemp(buf.data()) == nullptr) return errno_text("cannot create a directory", tmpl);
            dir = buf.data();
            return "";
        });
        if (!ok) return 1;
        int len = static_cast<int>(dir.size());
        MPI_Bcast(&len, 1, MPI_INT, 0, MPI_COMM_WORLD);
        dir.resize(static_cast<size_t>(len));
        MPI_Bcast(&dir[0], len, MPI_CHAR, 0, MPI_COMM_WORLD);
    }

    Result r;
    const bool ok = h.guard([&] { return measure(h, MPI_COMM_WORLD, rank, o, dir, &r) ? 0 : 1; }) == 0;
    TorchResult tr;
    if (ok && o.torch) torch_checkpoint(MPI_COMM_WORLD, rank, dir, o.params, o.iters, &tr);
    // Clean up: our baseline file always; the checkpoint and the directory
    // only when they are ours.
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        ::unlink((dir + "/" + kBaseline).c_str());
        if (temporary) {
            for (const std::string &f : {cat(kTag, ".h5"), cat(".", kTag, ".h5.tmp"), cat(kAsyncTag, ".h5"),
                                         cat(".", kAsyncTag, ".h5.tmp"), std::string("latest"), std::string(".latest.tmp")})
                ::unlink((dir + "/" + f).c_str());
            if (::rmdir(dir.c_str()) != 0)
                std::fprintf(stderr, "dsm-bench checkpoint: cannot remove '%s': %s\n", dir.c_str(),
                             std::strerror(errno));
        }
    }
    if (!ok) return 1;
    if (rank != 0) return 0;

    const double gb = static_cast<double>(r.bytes) / 1e9;
    auto gbs = [gb](double s) { return gb / std::max(s, 1e-9); };
    const double save_gbs = gbs(r.save), write_gbs = gbs(r.write), load_gbs = gbs(r.load), read_gbs = gbs(r.read);
    const double save_ratio = save_gbs / write_gbs, load_ratio = load_gbs / read_gbs;
    const double load_over_torch =
        tr.load > 0 ? (static_cast<double>(r.bytes) / std::max(r.load, 1e-9)) / (static_cast<double>(tr.bytes) / tr.load)
                    : 0.0;
    Json torch_json = nullptr;
    if (tr.save > 0) {
        torch_json = Json::object();
        torch_json["version"] = tr.version;
        torch_json["bytes"] = tr.bytes;
        torch_json["save_seconds"] = tr.save;
        torch_json["save_gbs"] = static_cast<double>(tr.bytes) / 1e9 / tr.save;
        torch_json["load_seconds"] = tr.load;
        torch_json["load_gbs"] = static_cast<double>(tr.bytes) / 1e9 / tr.load;
        torch_json["load_speed_ratio"] = load_over_torch; // libdsm's load GB/s over torch.load's
    }
    if (h.json()) {
        h.print(h.result({{"ranks", size},
                         {"params", o.params},
                         {"stage", o.stage},
                         {"bytes", r.bytes},
                         {"iters", o.iters},
                         {"save_seconds", r.save},
                         {"save_gbs", save_gbs},
                         {"write_gbs", write_gbs},
                         {"save_ratio", save_ratio},
                         {"load_seconds", r.load},
                         {"load_gbs", load_gbs},
                         {"read_gbs", read_gbs},
                         {"load_ratio", load_ratio},
                         {"async_background", r.background},
                         {"async_block_seconds", r.async_block},
                         {"async_complete_seconds", r.async_done},
                         {"async_block_ratio", r.async_block / std::max(r.save, 1e-9)},
                         {"async_captured_seconds", r.async_captured},
                         {"torch", torch_json},
                         {"dir", dir}}));
        return 0;
    }
    std::printf("dsm-bench checkpoint: %d ranks, %lld parameters, fp32, AdamW, ZeRO stage %d (median of %d, slowest "
                "rank)\n",
                size, o.params, o.stage, o.iters);
    std::printf("checkpoint %s/%s.h5: %llu bytes (%.2f per parameter)%s\n", dir.c_str(), kTag,
                static_cast<unsigned long long>(r.bytes), static_cast<double>(r.bytes) / static_cast<double>(o.params),
                temporary ? ", removed" : "");
    std::printf("%-5s %10s %9s %14s %7s\n", "", "seconds", "GB/s", "baseline GB/s", "ratio");
    std::printf("%-5s %10.4f %9.3f %14.3f %7.2f\n", "save", r.save, save_gbs, write_gbs, save_ratio);
    std::printf("%-5s %10.4f %9.3f %14.3f %7.2f\n", "load", r.load, load_gbs, read_gbs, load_ratio);
    if (tr.save > 0) {
        const double tgb = static_cast<double>(tr.bytes) / 1e9;
        std::printf("%-5s %10.4f %9.3f %14s %7s  (torch %s torch.save + fsync, %llu bytes)\n", "torch", tr.save,
                    tgb / tr.save, "", "", tr.version.c_str(), tr.bytes);
        std::printf("%-5s %10.4f %9.3f %14s %7s  (torch.load; libdsm's load: %.2fx its GB/s)\n", "torch", tr.load,
                    tgb / tr.load, "", "", load_over_torch);
    } else {
        std::printf("torch: not measured (no python3 with torch, or --no-torch)\n");
    }
    std::printf("async save%s: %.4f s blocking (%.1f%% of the save above), %.4f s until the state is no longer read\n"
                "(%.1f%%: the most a dsm_step right after the save waits), %.4f s until complete\n",
                r.background ? "" : " (MPI below MPI_THREAD_MULTIPLE: synchronous)", r.async_block,
                100.0 * r.async_block / std::max(r.save, 1e-9), r.async_captured,
                100.0 * r.async_captured / std::max(r.save, 1e-9), r.async_done);
    std::printf("save: dsm_engine_save_checkpoint (parallel HDF5, fsync, rename, latest); baseline: rank 0\n"
                "write() of the same bytes in 8 MiB chunks + fsync. load: dsm_engine_load_checkpoint (checksums\n"
                "verified); baseline: rank 0 read() in 8 MiB chunks. The page cache of both files is dropped\n"
                "before each read (posix_fadvise DONTNEED, best-effort). ratio: throughput / baseline's.\n");
    return 0;
}

} // namespace bench
} // namespace dsm
