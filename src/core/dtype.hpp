// Element sizes and names of dsm_dtype_t, for every layer (the public
// dsm_dtype_size / dsm_dtype_name are thin wrappers over these).
#pragma once

#include <cstddef>

#include "core/error.hpp"
#include "dsm.h"

namespace dsm {

// Bytes of one element; 0 for a value that is not a dsm_dtype_t.
constexpr size_t dtype_size(dsm_dtype_t dtype) noexcept {
    switch (dtype) {
    case DSM_FLOAT32: return 4;
    case DSM_FLOAT16: return 2;
    case DSM_BFLOAT16: return 2;
    case DSM_FLOAT64: return 8;
    case DSM_INT8: return 1;
    case DSM_UINT8: return 1;
    case DSM_INT32: return 4;
    case DSM_INT64: return 8;
    }
    return 0;
}

// Lower-case name ("float32", "bfloat16", ...); "invalid" otherwise.
constexpr const char *dtype_name(dsm_dtype_t dtype) noexcept {
    switch (dtype) {
    case DSM_FLOAT32: return "float32";
    case DSM_FLOAT16: return "float16";
    case DSM_BFLOAT16: return "bfloat16";
    case DSM_FLOAT64: return "float64";
    case DSM_INT8: return "int8";
    case DSM_UINT8: return "uint8";
    case DSM_INT32: return "int32";
    case DSM_INT64: return "int64";
    }
    return "invalid";
}

// dtype_size() of a value that must be a dsm_dtype_t: DSM_ERR_INVALID_ARGUMENT
// naming the value otherwise.
inline size_t require_dtype_size(dsm_dtype_t dtype) {
    const size_t bytes = dtype_size(dtype);
    if (bytes == 0) DSM_FAIL(DSM_ERR_INVALID_ARGUMENT, "dtype ", static_cast<int>(dtype), " is not a dsm_dtype_t");
    return bytes;
}

} // namespace dsm
