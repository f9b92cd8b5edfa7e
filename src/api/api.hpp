// The C boundary: every extern "C" entry point wraps its body in
// DSM_API_BEGIN / DSM_API_END, which turn exceptions into a status and the
// thread's last-error message ("function: message").
#pragma once

#include <memory>
#include <new>
#include <string>
#include <utility>

#include "core/error.hpp"
#include "core/log.hpp"

namespace dsm::engine {
class Engine;
}

namespace dsm::config {
struct Config;
}
namespace dsm {
class Mesh;
}

namespace dsm::api {
// The mesh a configuration describes over comm (mesh_api.cc:
// dsm_mesh_create_for_config, and dsm_engine_init_comm, which keeps the
// configuration read in `*read`).
std::unique_ptr<Mesh> mesh_for_config(MPI_Comm comm, const char *config, dsm_status_t bad, std::string why,
                                      bool out_ok, config::Config *read = nullptr);
dsm_status_t report(const char *function, dsm_status_t status, const char *message) noexcept;
// The engine behind a handle: DSM_ERR_NULL_POINTER for NULL,
// DSM_ERR_INVALID_ARGUMENT for a handle that is not a live engine.
engine::Engine &engine_impl(dsm_engine_t engine);
// Keeps every file that declares environment parameters in a static link
// that lists them (dsm_info_describe): see param_list.cc.
void link_params() noexcept;

// The body of an entry point that reads one value of an object: `object` is
// the caller's handle looked up (so a bad handle is reported first), then
// `out`, named `name` in the message, must not be NULL; *out = read(object).
template <typename Object, typename T, typename Read>
void read_into(Object &object, T *out, const char *name, Read &&read) {
    DSM_REQUIRE(out != nullptr, DSM_ERR_NULL_POINTER, name, " is NULL");
    *out = read(object);
}

// read_into() with *out cleared before read() runs, so that it holds no
// stale value when read() fails.
template <typename Object, typename T, typename Read>
void read_into_cleared(Object &object, T *out, const char *name, Read &&read) {
    DSM_REQUIRE(out != nullptr, DSM_ERR_NULL_POINTER, name, " is NULL");
    *out = T{};
    *out = read(object);
}

// The handle a *_free entry point frees, owned, and *handle set to NULL;
// empty when handle or *handle is NULL (freeing nothing is no error).
template <typename Handle> std::unique_ptr<Handle> take_handle(Handle **handle) noexcept {
    if (handle == nullptr || *handle == nullptr) return nullptr;
    return std::unique_ptr<Handle>(std::exchange(*handle, nullptr));
}
} // namespace dsm::api

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
