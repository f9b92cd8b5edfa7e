// What the unit tests of bulk float work (test_convert.cc, test_reduce.cc)
// share: buffers of values in any float dtype and their elements read back.
// No CMocka: include it before cxx_test.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "amp/convert.hpp"
#include "core/half.hpp"
#include "dsm.h"

// Bytes per element of FLOAT32, FLOAT64, FLOAT16 and BFLOAT16.
static inline size_t esize(dsm_dtype_t t) { return t == DSM_FLOAT64 ? 8 : t == DSM_FLOAT32 ? 4 : 2; }

// The values as `t`: fp64 as they are, the others through fp32 (16-bit
// rounded to nearest even by convert(), whose bits test_convert checks
// against core/half.hpp).
static inline std::vector<char> make(dsm_dtype_t t, const std::vector<double> &v) {
    std::vector<float> f(v.begin(), v.end());
    std::vector<char> out(v.size() * esize(t));
    if (t == DSM_FLOAT64)
        std::memcpy(out.data(), v.data(), out.size());
    else
        dsm::amp::convert(f.data(), DSM_FLOAT32, out.data(), t, v.size());
    return out;
}

// Element i of a buffer of `t`, widened exactly.
static inline double value_at(dsm_dtype_t t, const std::vector<char> &buf, size_t i) {
    uint16_t h;
    float f;
    double d;
    switch (t) {
    case DSM_FLOAT32: std::memcpy(&f, buf.data() + 4 * i, 4); return f;
    case DSM_FLOAT64: std::memcpy(&d, buf.data() + 8 * i, 8); return d;
    case DSM_FLOAT16: std::memcpy(&h, buf.data() + 2 * i, 2); return dsm::fp16_to_fp32(h);
    default: std::memcpy(&h, buf.data() + 2 * i, 2); return dsm::bf16_to_fp32(h);
    }
}
