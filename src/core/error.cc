#include "dsm_config.h"

#include "core/error.hpp"

#include <cerrno>
#include <cstring>

#include "core/log.hpp"

namespace dsm {

namespace {
thread_local std::string tls_last_error;
}

const char *status_text(dsm_status_t status) noexcept {
    switch (status) {
    case DSM_SUCCESS: return "success";
    case DSM_ERR_INVALID_ARGUMENT: return "invalid argument";
    case DSM_ERR_NULL_POINTER: return "NULL pointer argument";
    case DSM_ERR_NOT_FOUND: return "name not found";
    case DSM_ERR_MISMATCH: return "mismatch across ranks or with a checkpoint";
    case DSM_ERR_OUT_OF_MEMORY: return "out of memory";
    case DSM_ERR_MPI: return "MPI error";
    case DSM_ERR_NOT_SUPPORTED: return "not supported";
    case DSM_ERR_IO: return "I/O error";
    case DSM_ERR_CONFIG: return "invalid configuration";
    case DSM_ERR_HDF5: return "HDF5 error";
    case DSM_ERR_CUDA: return "CUDA error";
    case DSM_ERR_NCCL: return "NCCL error";
    case DSM_ERR_HWLOC: return "hwloc error";
    case DSM_ERR_INTERNAL: return "internal error";
    case DSM_ERR_NUMERIC: return "numerical failure";
    case DSM_ERR_STATE: return "invalid state";
    }
    return "unknown status";
}

void set_last_error(const std::string &message) { tls_last_error = message; }
const std::string &last_error() { return tls_last_error; }

void throw_error(dsm_status_t status, const std::string &message, const char *file, int line) {
    DSM_INFO(ERROR, "%s:%d: %s: %s", file, line, status_text(status),
            message.c_str());
    throw Error(status, message);
}

namespace detail {

void mpi_fail(int code, const char *call, const char *file, int line) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) len = 0;
    text[len] = '\0';
    throw_error(DSM_ERR_MPI, cat(call, " failed: ", len > 0 ? text : "unknown MPI error", " (code ", code, ")"),
         file, line);
}

#if DSM_HAVE_HWLOC
void hwloc_fail(const char *call, const char *file, int line) {
    int err = errno;
    throw_error(DSM_ERR_HWLOC, cat(call, " failed: ", std::strerror(err)), file, line);
}
#endif

} // namespace detail
} // namespace dsm
