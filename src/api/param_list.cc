// The files that declare environment parameters (DSM_PARAM). In a shared
// library each registers its parameters at load time; a static link keeps
// an object file only when something refers to it, so dsm_info_describe
// calls this list, and every parameter is listed in both kinds of build.
// A file that declares parameters ends with DSM_PARAM_LINK(tag) and its tag
// is added here.
#include "dsm_config.h"

#include "api/api.hpp"

#define DSM_PARAM_FILES(X)                                                                       \
    X(log)                                                                                       \
    X(config)                                                                                    \
    X(core_watchdog)                                                                             \
    X(core_simd)                                                                                 \
    X(mesh)                                                                                      \
    X(topo_threads)                                                                              \
    X(topo_locality)                                                                             \
    X(comm_backend)                                                                              \
    X(comm_net)                                                                                  \
    X(engine)                                                                                    \
    X(engine_init)                                                                               \
    X(engine_device_mirror)                                                                      \
    X(cuda_device)                                                                               \
    X(ckpt)

namespace dsm::param_link {
#define DSM_DECLARE_LINK(tag) void tag() noexcept;
DSM_PARAM_FILES(DSM_DECLARE_LINK)
#undef DSM_DECLARE_LINK
} // namespace dsm::param_link

namespace dsm::api {

void link_params() noexcept {
#define DSM_CALL_LINK(tag) ::dsm::param_link::tag();
    DSM_PARAM_FILES(DSM_CALL_LINK)
#undef DSM_CALL_LINK
}

} // namespace dsm::api
