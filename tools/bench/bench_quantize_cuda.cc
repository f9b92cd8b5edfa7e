// dsm-bench quantize --device cuda: the CUDA kernels of blockwise
// quantization (src/comm/quantize_cuda.cu, the device-resident engine's
// qwZ and qgZ) on device 0, each timed with CUDA events (median of --iters
// runs after one warm-up), next to a device-to-device cudaMemcpyAsync that
// moves the same bytes (it reads and writes half the kernel's traffic
// each), in turn within each round:
//   quantize      read 4 B, write 1 B (int8) or 0.5 B (int4) per value, plus the scales
//   dequantize    read 1 B (0.5 B), write 4 B
//   accumulate    read 1 B (0.5 B) and 4 B, write 4 B (qgZ's fused add)
// "of bound" = copy time / kernel time. Without the CUDA kernels or a device:
// "no CUDA device: skipped", exit status 0.
#include "dsm_config.h"

#include <cstdio>
#include <string>
#include <vector>

#include "bench_quantize.hpp"
#include "comm/quantize.hpp"
#include "core/error.hpp"

#if DSM_HAVE_CUDA_KERNELS && __has_include(<cuda_runtime_api.h>)
#define DSM_BENCH_QCUDA 1
#include <cuda_runtime_api.h>

#include "comm/quantize_cuda.hpp"
#include "cuda_run.hpp"
#else
#define DSM_BENCH_QCUDA 0
#endif

namespace dsm {
namespace bench {

namespace {

struct Options {
    long long values = 67108864;
    int iters = 20;
    long long block = 0;
};

void usage(FILE *out) {
    std::fprintf(out,
                 "usage: dsm-bench quantize --device cuda [--values N] [--iters N] [--block N] [--json]\n"
                 "  The int8 and int4 blockwise quantization CUDA kernels (ZeRO++ qwZ, qgZ on a device) on\n"
                 "  device 0 over N fp32 values (default 67108864), median of --iters runs (default 20, CUDA\n"
                 "  events), against a device-to-device copy of the same bytes. --block: values per block\n"
                 "  (default 4096 for int8, 1024 for int4). Without a device: skipped, exit status 0.\n");
}

int skipped(const Harness &h, const std::string &why) {
    const std::string line = "no CUDA device: skipped (" + why + ")";
    if (h.json()) h.print(h.result({{"device", "cuda"}, {"skipped", line}}));
    else if (h.rank() == 0) std::printf("dsm-bench quantize: %s\n", line.c_str());
    return 0;
}

} // namespace

int run_quantize_cuda(int argc, char **argv) {
    Harness h("quantize", usage);
    Options o;
    h.choice("device", {"cuda"}, [](const std::string &) {});
    h.integer("values", 1024, 1LL << 32, [&](long long x) { o.values = x; });
    h.integer("iters", 1, 1000, [&](long long x) { o.iters = static_cast<int>(x); });
    h.integer("block", 16, static_cast<long long>(comm::quant::kMaxBlock), [&](long long x) { o.block = x; });
    const int p = h.parse(argc, argv);
    if (p != 0) return p == 1 ? 0 : 2;
    if (const int rc = check_block_option(o.block)) return rc;
#if !DSM_BENCH_QCUDA
    return skipped(h, "libdsm was built without the CUDA kernels");
#else
    int count = 0;
    const cudaError_t ce = cudaGetDeviceCount(&count);
    if (ce != cudaSuccess) return skipped(h, std::string("cudaGetDeviceCount: ") + cudaGetErrorString(ce));
    if (count == 0) return skipped(h, "cudaGetDeviceCount found none");
    if (h.rank() != 0) return 0;
    return h.guard([&] {
        cuda_check(cudaSetDevice(0), "cudaSetDevice");
        cudaDeviceProp prop{};
        cuda_check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
        const size_t n = static_cast<size_t>(o.values);
        CudaRun run;
        float *x = static_cast<float *>(run.alloc(n * 4)), *y = static_cast<float *>(run.alloc(n * 4));
        void *q = run.alloc(comm::quant::packed_bytes(n, 8, 16) + 64);
        const size_t copy_max = (n * 12 + comm::quant::packed_bytes(n, 8, 16)) / 2 + 64;
        void *cs = run.alloc(copy_max), *cd = run.alloc(copy_max);
        std::vector<float> host(n);
        for (size_t i = 0; i < n; ++i) host[i] = static_cast<float>((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
        cuda_check(cudaMemcpy(x, host.data(), n * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
        cuda_check(cudaMemset(y, 0, n * 4), "cudaMemset");
        cuda_check(cudaMemset(cs, 0, copy_max), "cudaMemset");
        cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
        const cudaEvent_t c0 = run.event(), c1 = run.event(), k0 = run.event(), k1 = run.event();
        std::vector<QuantRow> rows;
        for (int bits : {8, 4}) {
            const size_t block = block_of(o.block, bits);
            const double qb = static_cast<double>(comm::quant::packed_bytes(n, bits, block));
            const std::array<QuantOp, 3> ops = quant_ops(n, qb);
            cuda_check(static_cast<cudaError_t>(comm::quant::cuda::launch_quantize(x, n, bits, block, q, run.stream)),
                  "quantize kernel");
            for (int which = 0; which < 3; ++which) {
                const QuantOp &op = ops[which];
                std::vector<double> ks, bs;
                const size_t copy = static_cast<size_t>(op.bytes / 2);
                for (int it = 0; it <= o.iters; ++it) {
                    cuda_check(cudaEventRecord(c0, run.stream), "cudaEventRecord");
                    cuda_check(cudaMemcpyAsync(cd, cs, copy, cudaMemcpyDeviceToDevice, run.stream), "cudaMemcpyAsync");
                    cuda_check(cudaEventRecord(c1, run.stream), "cudaEventRecord");
                    cuda_check(cudaEventRecord(k0, run.stream), "cudaEventRecord");
                    int e = 0;
                    if (which == 0) e = comm::quant::cuda::launch_quantize(x, n, bits, block, q, run.stream);
                    else e = comm::quant::cuda::launch_dequantize(q, n, bits, block, y, which == 2, run.stream);
                    cuda_check(static_cast<cudaError_t>(e), op.name);
                    cuda_check(cudaEventRecord(k1, run.stream), "cudaEventRecord");
                    cuda_check(cudaEventSynchronize(k1), "cudaEventSynchronize");
                    float cms = 0, kms = 0;
                    cuda_check(cudaEventElapsedTime(&cms, c0, c1), "cudaEventElapsedTime");
                    cuda_check(cudaEventElapsedTime(&kms, k0, k1), "cudaEventElapsedTime");
                    if (it > 0) {
                        bs.push_back(cms * 1e-3);
                        ks.push_back(kms * 1e-3);
                    }
                }
                rows.push_back(QuantRow{op.name, "", bits, block, median(ks), median(bs), op.bytes});
            }
        }
        if (h.json()) {
            Json out = Json::array();
            for (const QuantRow &r : rows) out.push_back(row_json(r));
            h.print(h.result({{"device", "cuda"}, {"gpu", prop.name}, {"values", static_cast<long long>(n)},
                              {"results", out}}));
            return 0;
        }
        std::printf("dsm-bench quantize --device cuda: %s, %zu fp32 values, median of %d runs (CUDA events)\n",
                    prop.name, n, o.iters);
        std::printf("%-11s %4s %6s %10s %9s %10s %9s\n", "op", "bits", "block", "ms", "GB/s", "copy ms", "of bound");
        for (const QuantRow &r : rows)
            std::printf("%-11s %4d %6zu %10.3f %9.1f %10.3f %9.2f\n", r.op.c_str(), r.bits, r.block, r.seconds * 1e3,
                        r.bytes / r.seconds / 1e9, r.bound_seconds * 1e3, r.bound_seconds / r.seconds);
        std::printf("bound: a device-to-device cudaMemcpyAsync of half the kernel's bytes (it reads and writes\n"
                    "them: the same traffic); of bound = copy time / kernel time.\n");
        return 0;
    });
#endif
}

} // namespace bench
} // namespace dsm
