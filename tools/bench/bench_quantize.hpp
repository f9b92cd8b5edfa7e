// dsm-bench quantize: what its host run (bench_quantize.cc) and its CUDA
// run (bench_quantize_cuda.cc, --device cuda) share.
#pragma once

#include <array>
#include <cstddef>
#include <string>

#include "harness.hpp"

namespace dsm {
namespace bench {

// dsm-bench quantize --device cuda.
int run_quantize_cuda(int argc, char **argv);

// --block (0: not given) as the kernels check it: 0, else 2 after the message.
int check_block_option(long long block);

// Values per block of `bits`-bit values: --block, else qwZ's int8 block or
// qgZ's int4 one.
size_t block_of(long long option, int bits);

// The operations, each with the bytes it moves over n values whose packed
// form has `packed` bytes: quantize, dequantize and accumulate.
struct QuantOp {
    const char *name;
    double bytes;
};
std::array<QuantOp, 3> quant_ops(size_t n, double packed);

// One result; `isa` empty for the CUDA kernels.
struct QuantRow {
    std::string op, isa;
    int bits;
    size_t block;
    double seconds, bound_seconds, bytes;
};
// op, isa (where set), bits, block, seconds, gbs, bound_seconds, fraction_of_bound.
Json row_json(const QuantRow &r);

} // namespace bench
} // namespace dsm
