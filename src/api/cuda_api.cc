// extern "C" entry points of the CUDA interop header include/dsm/cuda.h,
// built with or without CUDA: a cudaStream_t is a CUstream_st *, declared
// here as CUDA's driver_types.h declares it, so that the library needs no
// CUDA header for them. A build with CUDA includes dsm/cuda.h as well, so
// that the compiler checks these definitions against its declarations.
#include "dsm_config.h"

#if DSM_HAVE_CUDA
#include "dsm/cuda.h"
#else
struct CUstream_st;
typedef struct CUstream_st *cudaStream_t;
#endif

#include "api/api.hpp"
#include "engine/engine.hpp"

extern "C" {

DSM_API dsm_status_t dsm_engine_set_stream(dsm_engine_t engine, cudaStream_t stream) {
    DSM_API_BEGIN
    // DSM_ERR_NOT_SUPPORTED naming the device on an engine that is not DSM_DEVICE_CUDA.
    dsm::api::engine_impl(engine).set_stream(static_cast<void *>(stream));
    DSM_API_END
}

DSM_API dsm_status_t dsm_engine_stream(dsm_engine_t engine, cudaStream_t *stream) {
    DSM_API_BEGIN
    auto &e = dsm::api::engine_impl(engine);
    DSM_ARG_NOT_NULL(stream);
    *stream = static_cast<cudaStream_t>(e.stream());
    DSM_API_END
}

} // extern "C"
