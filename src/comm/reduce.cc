#include "dsm_config.h"

#include "comm/reduce.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "comm/memops.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/simd.hpp"

namespace dsm {
namespace comm {

const char *op_label(Op op) noexcept {
    switch (op) {
    case Op::SUM: return "sum";
    case Op::MAX: return "max";
    case Op::MIN: return "min";
    }
    return "invalid";
}

void check_reduce(dsm_dtype_t dtype, Op op) {
    require_dtype_size(dtype); // names an unknown value
    DSM_REQUIRE(dtype == DSM_FLOAT32 || dtype == DSM_FLOAT64 || dtype == DSM_FLOAT16 || dtype == DSM_BFLOAT16,
                DSM_ERR_INVALID_ARGUMENT, "reductions of dtype ", dtype_name(dtype), " (",
                static_cast<int>(dtype), ") are not supported: use float32, float64, float16 or bfloat16");
    DSM_REQUIRE(op == Op::SUM || op == Op::MAX || op == Op::MIN, DSM_ERR_INVALID_ARGUMENT, "reduction op ",
                static_cast<int>(op), " is not SUM, MAX or MIN");
}

namespace {

simd::Dispatch<memops::Kernels> g_isa{memops::kernels<simd::Isa::generic>, memops::kernels<simd::Isa::avx2>,
                                      memops::kernels<simd::Isa::avx512>};

int op_index(Op op) noexcept { return op == Op::SUM ? 0 : op == Op::MAX ? 1 : 2; }

} // namespace

void reduce_sources(void *dst, const void *const *srcs, size_t nsrc, size_t count, dsm_dtype_t dtype,
                    Op op) noexcept {
    if (count == 0 || nsrc == 0) return;
    if (nsrc == 1) {
        // One member: its values, bit for bit.
        if (dst != srcs[0]) std::memcpy(dst, srcs[0], count * (dtype == DSM_FLOAT64 ? 8 : dtype == DSM_FLOAT32 ? 4 : 2));
        return;
    }
    int t;
    switch (dtype) {
    case DSM_FLOAT32: t = 0; break;
    case DSM_FLOAT64: t = 1; break;
    case DSM_FLOAT16: t = 2; break;
    case DSM_BFLOAT16: t = 3; break;
    default: return; // excluded by check_reduce()
    }
    g_isa.active().reduce[t][op_index(op)](dst, srcs, nsrc, count);
}

const char *reduce_isa() noexcept { return g_isa.active().name; }

const memops::Kernels &memops::active() noexcept { return g_isa.active(); }

void reduce_into(void *inout, const void *in, size_t count, dsm_dtype_t dtype, Op op) noexcept {
    const void *srcs[2] = {in, inout};
    reduce_sources(inout, srcs, 2, count, dtype, op);
}

} // namespace comm
} // namespace dsm
