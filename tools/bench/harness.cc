// dsm-bench's harness: see harness.hpp and doc/dsm-bench.md.
#include "harness.hpp"

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <unistd.h>

#include "core/error.hpp"

namespace dsm {
namespace bench {

std::string python_command() {
    const char *p = std::getenv("DSM_BENCH_PYTHON");
    return p != nullptr && *p != '\0' ? std::string(p) : std::string("python3");
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t k = v.size();
    return k == 0 ? 0.0 : 0.5 * (v[(k - 1) / 2] + v[k / 2]);
}

double now_seconds() {
    using clock = std::chrono::steady_clock;
    return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

std::unique_ptr<Mesh> data_parallel_mesh(MPI_Comm comm) {
    int size = 0;
    MPI_Comm_size(comm, &size);
    const int shape[1] = {size};
    const char *names[1] = {"data_parallel"};
    return Mesh::create(comm, 1, shape, names, nullptr, true);
}

namespace {

// The thread support main asks MPI for, set before the subcommand runs.
int g_thread_level = MPI_THREAD_FUNNELED;

// Whether the launcher numbers this process other than 0 (before MPI has
// started, the only way to know which process should speak).
bool launched_as_other_rank() {
    for (const char *name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}) {
        const char *v = std::getenv(name);
        if (v != nullptr && *v != '\0') return std::strcmp(v, "0") != 0;
    }
    return false;
}

} // namespace

Harness::Harness(const char *sub, Usage usage) : sub_(sub), usage_(usage) { loud_ = !launched_as_other_rank(); }

void Harness::flag(const char *name, std::function<void()> set) {
    options_.push_back(tools::flag_option(name, std::move(set)));
}

void Harness::integer(const char *name, long long min, long long max, std::function<void(long long)> set) {
    const std::string opt = std::string("--") + name;
    options_.push_back(tools::CliOption{name, true, [this, opt, min, max, set](const char *v) {
                                  long long x = 0;
                                  if (!parse_integer(opt, v, min, max, &x)) return false;
                                  set(x);
                                  return true;
                              }});
}

void Harness::choice(const char *name, std::vector<std::string> values, std::function<void(const std::string &)> set) {
    options_.push_back(tools::CliOption{name, true, [this, name, values, set](const char *v) {
                                  if (std::find(values.begin(), values.end(), v) != values.end()) {
                                      set(v);
                                      return true;
                                  }
                                  return refuse("--%s '%s' is not %s", name, v, tools::one_of(values).c_str());
                              }});
}

void Harness::text(const char *name, std::function<bool(const char *)> check) {
    options_.push_back(tools::CliOption{name, true, std::move(check)});
}

bool Harness::refuse(const char *fmt, ...) const {
    if (!loud_) return false;
    std::fprintf(stderr, "dsm-bench %s: ", sub_);
    va_list ap;
    va_start(ap, fmt);
    std::vfprintf(stderr, fmt, ap);
    va_end(ap);
    std::fputc('\n', stderr);
    return false;
}

int Harness::parse(int argc, char **argv) {
    bool help = false;
    flag("json", [this] { json_ = true; });
    options_.push_back(tools::final_option("help", &help));
    // A wrong shape (an unknown option, a stray argument): the message, then the usage.
    auto say = [this](const std::string &message, bool shape) {
        refuse("%s", message.c_str());
        if (shape && loud_) usage_(stderr);
    };
    const bool ok = tools::parse_command_line(argc, argv, options_, [&say](const char *arg) {
        say(std::string("unexpected argument '") + arg + "'", true);
        return false;
    }, say);
    if (help) {
        if (loud_) usage_(stdout);
        return 1;
    }
    if (!ok) return 2;
    int initialized = 0, provided = 0;
    MPI_Initialized(&initialized);
    if (!initialized) MPI_Init_thread(nullptr, nullptr, g_thread_level, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    loud_ = rank_ == 0;
    return 0;
}

bool Harness::parse_integer(const std::string &opt, const char *text, long long min, long long max,
                            long long *out) const {
    if (tools::parse_integer(text, min, max, out)) return true;
    return refuse("%s '%s' is not an integer from %lld to %lld", opt.c_str(), text, min, max);
}

namespace {

// The machine's physical memory in bytes (0 when unknown).
double physical_memory_bytes() {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0.0;
}

} // namespace

bool Harness::fits_memory(const std::string &what, double bytes_per_rank, MPI_Comm comm) const {
    MPI_Comm node = MPI_COMM_NULL;
    int local = 1;
    if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) == MPI_SUCCESS &&
        node != MPI_COMM_NULL) {
        MPI_Comm_size(node, &local);
        MPI_Comm_free(&node);
    }
    const double have = physical_memory_bytes();
    const double need = bytes_per_rank * local;
    int ok = have <= 0 || need <= have ? 1 : 0;
    const int mine = ok;
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, comm);
    if (ok) return true;
    if (mine) return refuse("%s needs too much memory on another node", what.c_str());
    return refuse("%s needs %.0f bytes per rank (%d rank%s on this node), more than the %.0f bytes of memory of this "
                  "node",
                  what.c_str(), bytes_per_rank, local, local == 1 ? "" : "s", have);
}

double Harness::slowest(double seconds) const {
    MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return seconds;
}

double Harness::time_median(int iters, const std::function<void()> &f) const {
    f();
    std::vector<double> t;
    for (int i = 0; i < iters; ++i) t.push_back(time_once(f));
    return median(t);
}

double Harness::time_once(const std::function<void()> &f) const {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = now_seconds();
    f();
    return slowest(now_seconds() - t0);
}

int Harness::guard(const std::function<int()> &body) const {
    try {
        return body();
    } catch (const Error &e) {
        std::fprintf(stderr, "dsm-bench %s: rank %d: %s\n", sub_, rank_, e.what());
        return 1;
    } catch (const std::exception &e) {
        std::fprintf(stderr, "dsm-bench %s: rank %d: %s\n", sub_, rank_, e.what());
        MPI_Abort(MPI_COMM_WORLD, 1);
        return 1;
    }
}

Json Harness::result(const Json &fields) const {
    Json out = {{"format", std::string("dsm-bench-") + sub_}, {"format_version", 1}};
    for (auto it = fields.begin(); it != fields.end(); ++it) out[it.key()] = it.value();
    return out;
}

void Harness::print(const Json &out) const {
    // Text that is not UTF-8 (a directory name) is written with U+FFFD, not refused.
    if (rank_ == 0) std::printf("%s\n", out.dump(-1, ' ', false, Json::error_handler_t::replace).c_str());
}

namespace {

struct Subcommand {
    const char *name;
    int (*run)(int, char **);
    bool threads; // calls MPI from a second thread
    const char *help;
};

// overlap_comm's progress thread and the asynchronous checkpoint save's
// thread call MPI beside the main thread.
const Subcommand kSubcommands[] = {
    {"optimizer", run_optimizer, false,
     "optimizer throughput (CPU, or --device cuda) next to the memory-bandwidth bound\n"
     "                and PyTorch's torch.optim.Adam (when python3 has torch)"},
    {"collectives", run_collectives, false, "each backend collective next to the raw MPI call on the same bytes"},
    {"zero", run_zero, false, "a ZeRO step split into reduce, optimizer and gather; bytes and memory"},
    {"checkpoint", run_checkpoint, true, "checkpoint save and load next to plain write()/read() of the same bytes"},
    {"alltoall", run_alltoall, false,
     "the sequence-parallel (Ulysses) all-to-alls next to a raw MPI_Alltoall\n"
     "                of the same bytes"},
    {"quantize", run_quantize, false,
     "the ZeRO++ blockwise int8/int4 quantization kernels next to the memory-bandwidth\n"
     "                bound (one thread)"},
    {"overlap", run_overlap, true,
     "overlap_comm on a synthetic model: the step with overlap on and off next to\n"
     "                the ideal max(compute, communication)"},
    {"watchdog", run_watchdog, false, "the watchdog's cost: scopes, collectives and a ZeRO step with it on and off"},
};

void usage(FILE *out) {
    std::fprintf(out, "usage: dsm-bench SUBCOMMAND [options] [--json]\n");
    for (const Subcommand &s : kSubcommands) std::fprintf(out, "  %-13s %s\n", s.name, s.help);
    std::fprintf(out, "Run 'dsm-bench SUBCOMMAND --help' for its options; run the MPI ones under mpiexec.\n");
}

} // namespace

int main(int argc, char **argv) {
    // Line by line even into a pipe or a file (a job's output): each result
    // shows as it is measured, not when the run ends.
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const Subcommand *sub = nullptr;
    for (const Subcommand &s : kSubcommands)
        if (!std::strcmp(argv[1], s.name)) sub = &s;
    if (sub == nullptr) {
        if (!launched_as_other_rank()) {
            std::fprintf(stderr, "dsm-bench: unknown subcommand '%s'\n", argv[1]);
            usage(stderr);
        }
        return 2;
    }
    g_thread_level = sub->threads ? MPI_THREAD_MULTIPLE : MPI_THREAD_FUNNELED;
    const int rc = sub->run(argc - 1, argv + 1);
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) MPI_Finalize();
    return rc;
}

} // namespace bench
} // namespace dsm
