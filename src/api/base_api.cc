// Status strings, last error, version, features, dtypes: the C API that
// needs no handle.
#include "dsm_config.h"

#include <cstdlib>
#include <cstring>

#include "amp/convert.hpp"
#include "api/api.hpp"
#include "core/dtype.hpp"
#include "core/info.hpp"

namespace dsm::api {

dsm_status_t report(const char *function, dsm_status_t status, const char *message) noexcept {
    try {
        set_last_error(cat(function, ": ", message));
    } catch (...) {
        // No memory for the message: the status still tells what happened.
    }
    return status;
}

} // namespace dsm::api

extern "C" {

DSM_API const char *dsm_status_string(dsm_status_t status) { return dsm::status_text(status); }

DSM_API const char *dsm_last_error(void) { return dsm::last_error().c_str(); }

DSM_API dsm_status_t dsm_report_error(dsm_status_t status, const char *function, const char *message) {
    return dsm::api::report(function != nullptr ? function : "", status, message != nullptr ? message : "");
}

DSM_API dsm_status_t dsm_library_version(int *major, int *minor, int *patch) {
    if (major != nullptr) *major = DSM_VERSION_MAJOR;
    if (minor != nullptr) *minor = DSM_VERSION_MINOR;
    if (patch != nullptr) *patch = DSM_VERSION_PATCH;
    return DSM_SUCCESS;
}

DSM_API dsm_status_t dsm_library_feature(const char *feature, int *enabled) {
    DSM_API_BEGIN
    DSM_ARG_NOT_NULL(feature);
    DSM_ARG_NOT_NULL(enabled);
    *enabled = dsm::feature_enabled(feature);
    DSM_API_END
}

DSM_API dsm_status_t dsm_dtype_size(dsm_dtype_t dtype, size_t *size) {
    DSM_API_BEGIN
    DSM_ARG_NOT_NULL(size);
    const size_t bytes = dsm::dtype_size(dtype);
    if (bytes == 0) DSM_FAIL(DSM_ERR_INVALID_ARGUMENT, "dtype ", static_cast<int>(dtype), " is not a dsm_dtype_t");
    *size = bytes;
    DSM_API_END
}

DSM_API const char *dsm_dtype_name(dsm_dtype_t dtype) { return dsm::dtype_name(dtype); }

DSM_API void dsm_free(void *ptr) { std::free(ptr); }

DSM_API dsm_status_t dsm_info_describe(dsm_format_t format, char **text) {
    DSM_API_BEGIN
    DSM_ARG_NOT_NULL(text);
    *text = nullptr;
    dsm::api::link_params();
    *text = dsm::to_c_string(dsm::describe_build(format));
    DSM_API_END
}

DSM_API dsm_status_t dsm_convert(const void *src, dsm_dtype_t src_dtype, void *dst, dsm_dtype_t dst_dtype,
                                 size_t n) {
    DSM_API_BEGIN
    // Checks the dtypes even when n is 0, and the pointers when n > 0.
    dsm::amp::convert(src, src_dtype, dst, dst_dtype, n);
    DSM_API_END
}

} // extern "C"
