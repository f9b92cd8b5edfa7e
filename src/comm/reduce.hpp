// Elementwise reductions shared by the backends: the loops that combine
// buffers per dtype and op, and the argument checks that name bad values.
// 16-bit floats are widened to fp32, combined there, and rounded once to
// nearest even when stored.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "comm/backend.hpp"
#include "dsm.h"

namespace dsm {
namespace comm {

// "sum", "max", "min"; "invalid" for a value outside Op.
const char *op_label(Op op) noexcept;

// Whether (dtype, op) can be reduced: FLOAT32, FLOAT64, FLOAT16, BFLOAT16 with
// SUM, MAX, MIN. Throws DSM_ERR_INVALID_ARGUMENT naming the value otherwise.
void check_reduce(dsm_dtype_t dtype, Op op);

// dst[i] = srcs[0][i] op srcs[1][i] op ... op srcs[nsrc-1][i], combined left to
// right (the fixed order that makes results bit-identical everywhere). dst
// may be one of the sources (the very same pointer); otherwise it must not
// overlap them. nsrc >= 1. The types must have passed check_reduce().
void reduce_sources(void *dst, const void *const *srcs, size_t nsrc, size_t count, dsm_dtype_t dtype,
                    Op op) noexcept;

// The instruction set of the loops in use ("avx512", "avx2", "generic";
// memops.hpp's tables, core/simd.hpp's choice, simd::force() forces it).
// Every set gives the same bits; the tests run each.
const char *reduce_isa() noexcept;

// inout[i] = in[i] op inout[i] (the form of an MPI user operation).
void reduce_into(void *inout, const void *in, size_t count, dsm_dtype_t dtype, Op op) noexcept;

} // namespace comm
} // namespace dsm
