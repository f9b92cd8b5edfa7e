// Errors inside libdsm: one exception type carrying a status and a message,
// thrown by the DSM_CHECK_* macros and caught once at the C boundary
// (src/api/api.hpp).
#pragma once

#include <exception>
#include <sstream>
#include <string>
#include <utility>

#include "dsm.h"

namespace dsm {

class Error : public std::exception {
public:
    Error(dsm_status_t status, std::string message)
        : status_(status), message_(std::move(message)) {}
    dsm_status_t status() const noexcept { return status_; }
    const char *what() const noexcept override { return message_.c_str(); }
    const std::string &message() const noexcept { return message_; }

private:
    dsm_status_t status_;
    std::string message_;
};

// cat(a, b, c): the arguments streamed into one string.
template <typename... Args> std::string cat(Args &&...args) {
    std::ostringstream os;
    (os << ... << std::forward<Args>(args));
    return os.str();
}

// The constant description of a status (dsm_status_string()); never NULL.
const char *status_text(dsm_status_t status) noexcept;

// Throw an Error after leaving a file:line breadcrumb in the debug log.
[[noreturn]] void throw_error(dsm_status_t status, const std::string &message, const char *file,
                       int line);

// The last-error message of this thread (dsm_last_error()).
void set_last_error(const std::string &message);
const std::string &last_error();

namespace detail {
[[noreturn]] void mpi_fail(int code, const char *call, const char *file, int line);
#if DSM_HAVE_HWLOC
[[noreturn]] void hwloc_fail(const char *call, const char *file, int line);
#endif
} // namespace detail

} // namespace dsm

// DSM_FAIL(status, parts...): throw with a message built from the parts.
#define DSM_FAIL(status, ...) ::dsm::throw_error((status), ::dsm::cat(__VA_ARGS__), __FILE__, __LINE__)

// DSM_REQUIRE(cond, status, parts...): throw unless cond holds.
#define DSM_REQUIRE(cond, status, ...)                                                      \
    do {                                                                                     \
        if (!(cond)) DSM_FAIL((status), __VA_ARGS__);                                        \
    } while (0)

// DSM_ARG_NOT_NULL(arg): DSM_ERR_NULL_POINTER naming the argument.
#define DSM_ARG_NOT_NULL(arg)                                                                \
    DSM_REQUIRE((arg) != nullptr, DSM_ERR_NULL_POINTER, #arg " is NULL")

// DSM_CHECK_MPI(call): an MPI error becomes DSM_ERR_MPI with MPI's own message.
#define DSM_CHECK_MPI(call)                                                                  \
    do {                                                                                     \
        int dsm_mpi_rc_ = (call);                                                            \
        if (dsm_mpi_rc_ != MPI_SUCCESS)                                                      \
            ::dsm::detail::mpi_fail(dsm_mpi_rc_, #call, __FILE__, __LINE__);                 \
    } while (0)

// DSM_CHECK_HWLOC(call): hwloc returns a negative value (and sets errno) on error.
#define DSM_CHECK_HWLOC(call)                                                                \
    do {                                                                                     \
        if ((call) < 0) ::dsm::detail::hwloc_fail(#call, __FILE__, __LINE__);                \
    } while (0)
