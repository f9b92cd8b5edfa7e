/*
 * libdsm CUDA interop: the stream a device-resident engine orders its work on.
 *
 * Include it after, or instead of, dsm.h in code compiled with the CUDA
 * runtime headers (nvcc, or -I$CUDA_HOME/include): it takes cudaStream_t,
 * which dsm.h keeps out. The functions are in libdsm whether or not it was
 * built with CUDA; on an engine that is not device-resident they return
 * DSM_ERR_NOT_SUPPORTED.
 */
#ifndef DSM_CUDA_H
#define DSM_CUDA_H

#include <dsm.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/**
 * @defgroup dsm_cuda CUDA interop (dsm/cuda.h)
 *
 * A device-resident engine (DSM_DEVICE_CUDA, see
 * dsm_engine_init_with_options()) enqueues its kernels, copies and NCCL
 * collectives on a CUDA stream of its own. dsm_engine_set_stream() puts
 * them on the application's stream instead, so that the application's
 * forward and backward kernels and the engine's work are ordered on one
 * stream without synchronizing: a gradient written by a kernel on that
 * stream before dsm_engine_grad_release() is complete when the engine's
 * reduction of it runs, and the parameters updated by dsm_step() are
 * complete for the kernels enqueued after it.
 *
 * Include <dsm/cuda.h> (it includes <dsm.h> and <cuda_runtime_api.h>);
 * link with libdsm as usual.
 * @{
 */

/**
 * @brief Order the engine's work on @p stream: its kernels, copies and NCCL
 * collectives are enqueued there from the next engine call on.
 *
 * Not collective: each rank sets its own stream (each rank has its own
 * device). Calls on the same engine must be serialized with the engine's
 * other calls. The stream must stay valid until it is replaced or the
 * engine is freed; the engine does not destroy it. NULL restores the
 * engine's own stream (to order on the legacy default stream, pass
 * cudaStreamLegacy).
 *
 * @param engine a device-resident engine (dsm_engine_device() gives
 *               DSM_DEVICE_CUDA)
 * @param stream a stream of the rank's CUDA device, or NULL
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER (engine); DSM_ERR_INVALID_ARGUMENT
 * (a handle that is not a live engine); DSM_ERR_NOT_SUPPORTED on an engine
 * whose device is not DSM_DEVICE_CUDA (the message names its device:
 * "host", "simulated"); DSM_ERR_CUDA.
 */
DSM_API dsm_status_t dsm_engine_set_stream(dsm_engine_t engine, cudaStream_t stream);

/**
 * @brief The stream set with dsm_engine_set_stream(), or NULL when the
 * engine uses its own stream (always NULL on an engine that is not
 * device-resident).
 *
 * Not collective. Thread safe with other readers.
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT (a
 * handle that is not a live engine).
 */
DSM_API dsm_status_t dsm_engine_stream(dsm_engine_t engine, cudaStream_t *stream);

/** @} */

#ifdef __cplusplus
}
#endif

#endif /* DSM_CUDA_H */
