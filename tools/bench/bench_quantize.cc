// dsm-bench quantize: the blockwise quantization kernels of ZeRO++'s
// quantized communication (src/comm/quantize.hpp) on one thread, per
// instruction set, next to a memory-bandwidth bound that moves the same
// bytes on the same thread with almost none of the arithmetic:
//   quantize      read 4 B, write 1 B (int8) or 0.5 B (int4) per value
//   dequantize    read 1 B (0.5 B), write 4 B
//   accumulate    read 1 B (0.5 B) and 4 B, write 4 B (qgZ's fused add)
// with full-width AVX-512 loads and stores and an xor (the bound needs
// AVX-512). The scales (4 B per block) are counted in the kernels' bytes only. The
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

#include "bench_quantize.hpp"
#include "bounds.hpp"
#include "core/simd.hpp"
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

// The bounds: the kernels' traffic with no arithmetic but an xor, in the
// widest vectors this CPU has (n a multiple of 64): each reads its inputs
// and writes its output once, with full-width loads and stores.
// The bounds: the kernels' traffic with no arithmetic but an xor
// (bounds.hpp's quant_in, quant_out), with full-width AVX-512 loads and
// stores: measured where this CPU has AVX-512.
bool bounds_usable() { return bounds().quant_in != nullptr; }

} // namespace

int check_block_option(long long block) {
    if (block) {
        try {
            comm::quant::check_block(static_cast<size_t>(block), "--block");
        } catch (const Error &e) {
            std::fprintf(stderr, "dsm-bench quantize: %s\n", e.what());
            return 2;
        }
    }
    return 0;
}

size_t block_of(long long option, int bits) {
    return option ? static_cast<size_t>(option) : (bits == 8 ? comm::quant::kWeightBlock : comm::quant::kGradientBlock);
}

std::array<QuantOp, 3> quant_ops(size_t n, double packed) {
    return {{{"quantize", 4.0 * n + packed}, {"dequantize", packed + 4.0 * n}, {"accumulate", packed + 8.0 * n}}};
}

Json row_json(const QuantRow &r) {
    Json j = {{"op", r.op}};
    if (!r.isa.empty()) j["isa"] = r.isa;
    j["bits"] = r.bits;
    j["block"] = r.block;
    j["seconds"] = r.seconds;
    j["gbs"] = r.bytes / r.seconds / 1e9;
    j["bound_seconds"] = r.bound_seconds;
    j["fraction_of_bound"] = r.bound_seconds / r.seconds;
    return j;
}

int run_quantize(int argc, char **argv) {
    for (int i = 1; i < argc; ++i) // --device (cuda; another value is refused there)
        if (std::strcmp(argv[i], "--device") == 0 || std::strncmp(argv[i], "--device=", 9) == 0)
            return run_quantize_cuda(argc, argv);
    Harness h("quantize", usage);
    Options o;
    h.integer("values", 1024, 1LL << 34, [&](long long x) { o.values = x; });
    h.integer("rounds", 1, 1000, [&](long long x) { o.rounds = static_cast<int>(x); });
    h.integer("block", 16, static_cast<long long>(comm::quant::kMaxBlock), [&](long long x) { o.block = x; });
    const int p = h.parse(argc, argv);
    if (p != 0) return p == 1 ? 0 : 2;
    if (const int rc = check_block_option(o.block)) return rc;
    if (h.rank() != 0) return 0;
    if (!bounds_usable()) {
        std::fprintf(stderr, "dsm-bench quantize: the bandwidth bound needs AVX-512 (not on this CPU)\n");
        return 1;
    }
    const size_t n = static_cast<size_t>(o.values) / 64 * 64;
    std::vector<float> x(n), y(n);
    std::vector<uint8_t> q(comm::quant::packed_bytes(n, 8, 16) + 64), b(n);
    for (size_t i = 0; i < n; ++i) x[i] = 1e-3f * static_cast<float>(static_cast<int>(i % 2001) - 1000);
    std::fill(y.begin(), y.end(), 0.0f);
    std::fill(b.begin(), b.end(), 3);
    const std::vector<std::string> isas = dsm::simd::available();
    std::vector<QuantRow> rows;
    for (int bits : {8, 4}) {
        const size_t block = block_of(o.block, bits);
        const double qb = static_cast<double>(comm::quant::packed_bytes(n, bits, block));
        const std::array<QuantOp, 3> what = quant_ops(n, qb);
        struct Op {
            QuantOp what;
            std::function<void()> bound, kernel;
        };
        std::vector<Op> ops = {
            {what[0],
             [&] { bounds().quant_in(x.data(), b.data(), n, bits); },
             [&] { comm::quant::quantize(x.data(), DSM_FLOAT32, n, bits, block, q.data()); }},
            {what[1],
             [&] { bounds().quant_out(b.data(), y.data(), n, bits, false); },
             [&] { comm::quant::dequantize(q.data(), n, bits, block, y.data(), DSM_FLOAT32, false); }},
            {what[2],
             [&] { bounds().quant_out(b.data(), y.data(), n, bits, true); },
             [&] { comm::quant::dequantize(q.data(), n, bits, block, y.data(), DSM_FLOAT32, true); }},
        };
        comm::quant::quantize(x.data(), DSM_FLOAT32, n, bits, block, q.data());
        for (Op &op : ops) {
            std::vector<double> best(isas.size(), 1e30);
            double bound = 1e30;
            for (int r = 0; r <= o.rounds; ++r) {
                const double t = seconds_of(op.bound);
                if (r > 0) bound = std::min(bound, t);
                for (size_t k = 0; k < isas.size(); ++k) {
                    dsm::simd::force(isas[k]);
                    const double s = seconds_of(op.kernel);
                    if (r > 0) best[k] = std::min(best[k], s);
                }
            }
            dsm::simd::force("auto");
            for (size_t k = 0; k < isas.size(); ++k)
                rows.push_back(QuantRow{op.what.name, isas[k], bits, block, best[k], bound, op.what.bytes});
        }
    }
    const std::string selected = comm::quant::active_isa();
    if (h.json()) {
        Json out = Json::array();
        for (const QuantRow &r : rows) out.push_back(row_json(r));
        h.print(h.result({{"values", static_cast<long long>(n)}, {"threads", 1}, {"selected_isa", selected},
                          {"results", out}}));
        return 0;
    }
    std::printf("dsm-bench quantize: %zu fp32 values, 1 thread, fastest of %d rounds\n", n, o.rounds);
    std::printf("%-11s %4s %6s %-8s %10s %9s %10s %9s\n", "op", "bits", "block", "isa", "ms", "GB/s", "bound ms",
                "of bound");
    for (const QuantRow &r : rows)
        std::printf("%-11s %4d %6zu %-8s %10.3f %9.2f %10.3f %9.2f%s\n", r.op.c_str(), r.bits, r.block, r.isa.c_str(),
                    r.seconds * 1e3, r.bytes / r.seconds / 1e9, r.bound_seconds * 1e3, r.bound_seconds / r.seconds,
                    r.isa == selected ? "  <- selected" : "");
    std::printf("bound: the same bytes (less the scales) on the same thread with full-width AVX-512 loads and\n"
                "stores and an xor; of bound = bound time / kernel time (target >= 0.8).\n");
    return 0;
}

} // namespace bench
} // namespace dsm
