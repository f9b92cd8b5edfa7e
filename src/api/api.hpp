// The C boundary: every extern "C" entry point wraps its body in
// DSM_API_BEGIN / DSM_API_END, which turn exceptions into a status and the
// thread's last-error message ("function: message").
#pragma once

#include <new>

#include "core/error.hpp"
#include "core/log.hpp"

namespace dsm::engine {
class Engine;
}

namespace dsm::api {
dsm_status_t report(const char *function, dsm_status_t status, const char *message) noexcept;
// The engine behind a handle: DSM_ERR_NULL_POINTER for NULL,
// DSM_ERR_INVALID_ARGUMENT for a handle that is not a live engine.
engine::Engine &engine_impl(dsm_engine_t engine);
// Keeps every file that declares environment parameters in a static link
// that lists them (dsm_info_describe): see param_list.cc.
void link_params() noexcept;
}

#define DSM_API_BEGIN try {
#define DSM_API_END                                                                          \
    return DSM_SUCCESS;                                                                      \
    }                                                                                        \
    catch (const ::dsm::Error &e) {                                                          \
        return ::dsm::api::report(__func__, e.status(), e.what());                           \
    }                                                                                        \
    catch (const std::bad_alloc &) {                                                         \
        return ::dsm::api::report(__func__, DSM_ERR_OUT_OF_MEMORY, "out of memory");         \
    }                                                                                        \
    catch (const std::exception &e) {                                                        \
        return ::dsm::api::report(__func__, DSM_ERR_INTERNAL, e.what());                     \
    }                                                                                        \
    catch (...) {                                                                            \
        return ::dsm::api::report(__func__, DSM_ERR_INTERNAL, "unknown exception");          \
    }
