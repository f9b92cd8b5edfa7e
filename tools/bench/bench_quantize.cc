// dsm-bench quantize: the blockwise quantization kernels of ZeRO++'s
// quantized communication (src/comm/quantize.hpp) on one thread, per
// instruction set, next to a memory-bandwidth bound that moves the same
// bytes on the same thread with almost none of the arithmetic:
//   quantize      read 4 B, write 1 B (int8) or 0.5 B (int4) per value
//   dequantize    read 1 B (0.5 B), write 4 B
//   accumulate    read 1 B (0.5 B) and 4 B, write 4 B (qgZ's fused add)
// The scales (4 B per block) are counted in the kernels' bytes only. The
// arrays are larger than the caches; the bound and each instruction set are
// timed in turn within each round, and the fastest round of each is kept.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "harness.hpp"
#include "comm/quantize.hpp"
#include "core/error.hpp"

namespace dsm {
namespace bench {

namespace {

struct Options {
    long long values = 33554432;
    int rounds = 5;
    long long block = 0; // 0: the default of each width
};

void usage(FILE *out) {
    std::fprintf(out,
                 "usage: dsm-bench quantize [--values N] [--rounds N] [--block N] [--json]\n"
                 "  The int8 and int4 blockwise quantization kernels (ZeRO++ qwZ, qgZ) on one thread, per\n"
                 "  instruction set, over N fp32 values (default 33554432), against a memory-bandwidth bound\n"
                 "  that moves the same bytes on the same thread. --block: values per block (default 4096\n"
                 "  for int8, 1024 for int4). Fastest of --rounds rounds (default 5).\n");
}

double seconds_of(const std::function<void()> &f) {
    const double t0 = now_seconds();
    f();
    return now_seconds() - t0;
}

// The bounds: the kernels' traffic, a shift or a conversion per value, in the
// widest vectors this CPU has.
#if defined(__x86_64__) && defined(__GNUC__)
#define DSM_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define DSM_CLONES
#endif
DSM_CLONES void bound_q8(const uint32_t *__restrict x, uint8_t *__restrict o, size_t n) {
    for (size_t i = 0; i < n; ++i) o[i] = static_cast<uint8_t>(x[i] >> 24);
}
DSM_CLONES void bound_q4(const uint32_t *__restrict x, uint8_t *__restrict o, size_t n) {
    for (size_t i = 0; i < n / 2; ++i)
        o[i] = static_cast<uint8_t>((x[2 * i] >> 28) | ((x[2 * i + 1] >> 24) & 0xF0u));
}
DSM_CLONES void bound_d8(const int8_t *__restrict q, float *__restrict o, size_t n) {
    for (size_t i = 0; i < n; ++i) o[i] = static_cast<float>(q[i]);
}
DSM_CLONES void bound_a8(const int8_t *__restrict q, float *__restrict o, size_t n) {
    for (size_t i = 0; i < n; ++i) o[i] += static_cast<float>(q[i]);
}
DSM_CLONES void bound_a4(const uint8_t *__restrict q, float *__restrict o, size_t n) {
    for (size_t i = 0; i < n / 2; ++i) {
        o[2 * i] += static_cast<float>(q[i] & 0x0F);
        o[2 * i + 1] += static_cast<float>(q[i] >> 4);
    }
}

struct Row {
    std::string op, isa;
    int bits;
    size_t block;
    double seconds, bound_seconds, bytes;
};

} // namespace

int run_quantize(int argc, char **argv) {
    Harness h("quantize", usage);
    Options o;
    h.integer("values", 1024, 1LL << 34, [&](long long x) { o.values = x; });
    h.integer("rounds", 1, 1000, [&](long long x) { o.rounds = static_cast<int>(x); });
    h.integer("block", 16, static_cast<long long>(comm::quant::kMaxBlock), [&](long long x) { o.block = x; });
    const int p = h.parse(argc, argv);
    if (p != 0) return p == 1 ? 0 : 2;
    if (o.block) {
        try {
            comm::quant::check_block(static_cast<size_t>(o.block), "--block");
        } catch (const Error &e) {
            std::fprintf(stderr, "dsm-bench quantize: %s\n", e.what());
            return 2;
        }
    }
    if (h.rank() != 0) return 0;
    const size_t n = static_cast<size_t>(o.values) / 32 * 32;
    std::vector<float> x(n), y(n);
    std::vector<uint8_t> q(comm::quant::packed_bytes(n, 8, 16) + 64), b(n);
    for (size_t i = 0; i < n; ++i) x[i] = 1e-3f * static_cast<float>(static_cast<int>(i % 2001) - 1000);
    std::fill(y.begin(), y.end(), 0.0f);
    std::fill(b.begin(), b.end(), 3);
    const std::vector<std::string> isas = comm::quant::available_isas();
    std::vector<Row> rows;
    for (int bits : {8, 4}) {
        const size_t block = o.block ? static_cast<size_t>(o.block)
                                     : (bits == 8 ? comm::quant::kWeightBlock : comm::quant::kGradientBlock);
        const double qb = static_cast<double>(comm::quant::packed_bytes(n, bits, block));
        struct Op {
            const char *name;
            double bytes;
            std::function<void()> bound, kernel;
        };
        const uint32_t *xi = reinterpret_cast<const uint32_t *>(x.data());
        std::vector<Op> ops = {
            {"quantize", 4.0 * n + qb,
             [&] { bits == 8 ? bound_q8(xi, b.data(), n) : bound_q4(xi, b.data(), n); },
             [&] { comm::quant::quantize(x.data(), DSM_FLOAT32, n, bits, block, q.data()); }},
            {"dequantize", qb + 4.0 * n,
             [&] { bits == 8 ? bound_d8(reinterpret_cast<const int8_t *>(b.data()), y.data(), n)
                             : bound_a4(b.data(), y.data(), n); },
             [&] { comm::quant::dequantize(q.data(), n, bits, block, y.data(), DSM_FLOAT32, false); }},
            {"accumulate", qb + 8.0 * n,
             [&] { bits == 8 ? bound_a8(reinterpret_cast<const int8_t *>(b.data()), y.data(), n)
                             : bound_a4(b.data(), y.data(), n); },
             [&] { comm::quant::dequantize(q.data(), n, bits, block, y.data(), DSM_FLOAT32, true); }},
        };
        // int4's dequantize bound reads and writes as its accumulate does (a
        // pure overwrite of two values per byte would read less): it bounds
        // from above only where it is not slower; say so by its bytes.
        comm::quant::quantize(x.data(), DSM_FLOAT32, n, bits, block, q.data());
        for (Op &op : ops) {
            std::vector<double> best(isas.size(), 1e30);
            double bound = 1e30;
            for (int r = 0; r <= o.rounds; ++r) {
                const double t = seconds_of(op.bound);
                if (r > 0) bound = std::min(bound, t);
                for (size_t k = 0; k < isas.size(); ++k) {
                    comm::quant::set_isa(isas[k]);
                    const double s = seconds_of(op.kernel);
                    if (r > 0) best[k] = std::min(best[k], s);
                }
            }
            comm::quant::set_isa("auto");
            for (size_t k = 0; k < isas.size(); ++k)
                rows.push_back(Row{op.name, isas[k], bits, block, best[k], bound, op.bytes});
        }
    }
    const std::string selected = comm::quant::active_isa();
    if (h.json()) {
        Json out = Json::array();
        for (const Row &r : rows)
            out.push_back({{"op", r.op},
                           {"isa", r.isa},
                           {"bits", r.bits},
                           {"block", r.block},
                           {"seconds", r.seconds},
                           {"gbs", r.bytes / r.seconds / 1e9},
                           {"bound_seconds", r.bound_seconds},
                           {"fraction_of_bound", r.bound_seconds / r.seconds}});
        h.print(h.result({{"values", static_cast<long long>(n)}, {"threads", 1}, {"selected_isa", selected},
                          {"results", out}}));
        return 0;
    }
    std::printf("dsm-bench quantize: %zu fp32 values, 1 thread, fastest of %d rounds\n", n, o.rounds);
    std::printf("%-11s %4s %6s %-8s %10s %9s %10s %9s\n", "op", "bits", "block", "isa", "ms", "GB/s", "bound ms",
                "of bound");
    for (const Row &r : rows)
        std::printf("%-11s %4d %6zu %-8s %10.3f %9.2f %10.3f %9.2f%s\n", r.op.c_str(), r.bits, r.block, r.isa.c_str(),
                    r.seconds * 1e3, r.bytes / r.seconds / 1e9, r.bound_seconds * 1e3, r.bound_seconds / r.seconds,
                    r.isa == selected ? "  <- selected" : "");
    std::printf("bound: the same bytes on the same thread with a shift or a conversion per value (int4's\n"
                "dequantize bound also reads the output, as the accumulate does); of bound = bound / kernel time.\n");
    return 0;
}

} // namespace bench
} // namespace dsm
