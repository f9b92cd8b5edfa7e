/*
 * libdsm C API, part: statuses and errors, version, data types,
 * descriptions.
 *
 * Included by <dsm.h>, the header programs include; it also compiles on
 * its own. See dsm.h for the conventions every part follows.
 */
#ifndef DSM_BASE_H
#define DSM_BASE_H

#include <stddef.h>
#include <stdint.h>
/* In C++, <mpi.h> without the MPI C++ bindings (removed from the standard in
 * MPI-3.0, and full of warnings): a program that still uses them includes
 * <mpi.h> before dsm.h. */
#if defined(__cplusplus) && !defined(OMPI_SKIP_MPICXX)
#define OMPI_SKIP_MPICXX 1
#endif
#if defined(__cplusplus) && !defined(MPICH_SKIP_MPICXX)
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include "dsm_version.h"

#if defined(DSM_BUILDING_LIBRARY) && defined(__GNUC__)
#define DSM_API __attribute__((visibility("default")))
#else
#define DSM_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/**
 * @defgroup dsm_status Status codes and errors
 * Every libdsm function returns a dsm_status_t, except four that cannot
 * fail: dsm_status_string(), dsm_last_error() and dsm_dtype_name() return a
 * string (never NULL) and dsm_free() returns nothing. The values are pinned:
 * they never change between releases, and new codes are only ever appended.
 * @{
 */

/** Status returned by every libdsm function. */
typedef enum dsm_status {
    DSM_SUCCESS = 0,               /**< The call did what it says. */
    DSM_ERR_INVALID_ARGUMENT = 1,  /**< An argument is out of range or malformed. */
    DSM_ERR_NULL_POINTER = 2,      /**< A required pointer argument is NULL. */
    DSM_ERR_NOT_FOUND = 3,         /**< A name (dimension, group) is not known. */
    DSM_ERR_MISMATCH = 4,          /**< Ranks passed different arguments to a collective call or are in different
                                        calls, or a checkpoint does not match the engine (the message says what). */
    DSM_ERR_OUT_OF_MEMORY = 5,     /**< An allocation failed. */
    DSM_ERR_MPI = 6,               /**< An MPI call failed. */
    DSM_ERR_NOT_SUPPORTED = 7,     /**< The feature is not built in or not possible here. */
    DSM_ERR_IO = 8,                /**< A file could not be read or written. */
    DSM_ERR_CONFIG = 9,            /**< The configuration is invalid. */
    DSM_ERR_HDF5 = 10,             /**< An HDF5 call failed. */
    DSM_ERR_CUDA = 11,             /**< A CUDA call failed. */
    DSM_ERR_NCCL = 12,             /**< An NCCL call failed. */
    DSM_ERR_HWLOC = 13,            /**< An hwloc call failed. */
    DSM_ERR_INTERNAL = 14,         /**< A bug in libdsm: please report it. */
    DSM_ERR_NUMERIC = 15,          /**< Training diverged: the fp16 loss scale is at its minimum and gradients still
                                        overflow, or fp32 gradients are Inf/NaN with fp32_nonfinite_gradients "fail". */
    DSM_ERR_STATE = 16             /**< The call is not valid in the object's current state (a buffer still acquired, released twice). */
} dsm_status_t;

/**
 * @brief A short constant description of a status ("invalid argument").
 *
 * Not collective. Thread safe. Never returns NULL: unknown values give
 * "unknown status".
 */
DSM_API const char *dsm_status_string(dsm_status_t status);

/**
 * @brief The detailed message of the last failed libdsm call in this thread.
 *
 * The message names the function, the bad value and, for collective calls,
 * the rank where the error was found, e.g. "dsm_mesh_create: rank 3: shape[1]
 * is 0, must be positive or -1". It stays until the next failing call in the
 * same thread. Not collective. Thread safe (thread-local). Never returns NULL:
 * "" when no call has failed.
 */
DSM_API const char *dsm_last_error(void);

/**
 * @brief Record an error found outside the library, by a language binding
 * or a layer over libdsm, the way the library records its own: afterwards
 * dsm_last_error() returns "function: message" in this thread, as after a
 * failed libdsm call.
 *
 * Not collective. Thread safe (thread-local). A NULL @p function or
 * @p message counts as "".
 * @return @p status, so that a wrapper can end with
 * `return dsm_report_error(DSM_ERR_INVALID_ARGUMENT, "my_call", why);`.
 */
DSM_API dsm_status_t dsm_report_error(dsm_status_t status, const char *function, const char *message);

/** @} */

/**
 * @defgroup dsm_version Version and build features
 * The version of the headers is in DSM_VERSION_MAJOR, DSM_VERSION_MINOR,
 * DSM_VERSION_PATCH, DSM_VERSION (major * 10000 + minor * 100 + patch) and
 * DSM_VERSION_STRING; these functions tell the version and features of the
 * library that is running.
 * @{
 */

/**
 * @brief The version of the library that is running.
 *
 * Compare with DSM_VERSION_MAJOR/MINOR/PATCH to detect a header/library
 * mismatch. Any output pointer may be NULL. Not collective. Thread safe.
 * @return DSM_SUCCESS.
 */
DSM_API dsm_status_t dsm_library_version(int *major, int *minor, int *patch);

/**
 * @brief Whether a build feature is compiled in.
 *
 * @param feature one of "mpi", "hwloc", "hdf5", "cuda", "nccl", "fortran"
 * @param[out] enabled 1 when built in, 0 when not.
 * Not collective. Thread safe.
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_NOT_FOUND for an unknown feature name.
 */
DSM_API dsm_status_t dsm_library_feature(const char *feature, int *enabled);

/** @} */

/**
 * @defgroup dsm_dtype Data types
 * @{
 */

/** Element types of tensors. Values are pinned. */
typedef enum dsm_dtype {
    DSM_FLOAT32 = 0,  /**< IEEE 754 binary32 */
    DSM_FLOAT16 = 1,  /**< IEEE 754 binary16 */
    DSM_BFLOAT16 = 2, /**< bfloat16: the upper 16 bits of a binary32 */
    DSM_FLOAT64 = 3,  /**< IEEE 754 binary64 */
    DSM_INT8 = 4,     /**< int8_t */
    DSM_UINT8 = 5,    /**< uint8_t */
    DSM_INT32 = 6,    /**< int32_t */
    DSM_INT64 = 7     /**< int64_t */
} dsm_dtype_t;

/**
 * @brief The size in bytes of one element of @p dtype.
 *
 * Not collective. Thread safe.
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT for an unknown dtype.
 */
DSM_API dsm_status_t dsm_dtype_size(dsm_dtype_t dtype, size_t *size);

/**
 * @brief The name of @p dtype ("float32", "bfloat16", ...).
 *
 * Not collective. Thread safe. Never returns NULL: "invalid" for unknown values.
 */
DSM_API const char *dsm_dtype_name(dsm_dtype_t dtype);

/**
 * @brief Convert @p n elements between FLOAT32, FLOAT64, FLOAT16 and
 * BFLOAT16 (round to nearest even; Inf and NaN kept).
 *
 * @p src and @p dst must not overlap, except that @p src == @p dst with the
 * same dtype is allowed (and does nothing): the conversion runs in blocks
 * on several threads, so an in-place change of dtype would read elements
 * another block has already written.
 *
 * Not collective. Thread safe. @return DSM_SUCCESS; DSM_ERR_NULL_POINTER;
 * DSM_ERR_INVALID_ARGUMENT for another dtype, or for @p src and @p dst that
 * overlap (naming both, with their bytes and dtypes).
 */
DSM_API dsm_status_t dsm_convert(const void *src, dsm_dtype_t src_dtype, void *dst,
                                 dsm_dtype_t dst_dtype, size_t n);

/** @} */

/**
 * @defgroup dsm_info Descriptions and memory
 * Text that libdsm writes for the caller, and how to free it.
 * @{
 */

/** Output formats of the describe functions. */
typedef enum dsm_format {
    DSM_FORMAT_TEXT = 0, /**< A table for people. */
    DSM_FORMAT_JSON = 1  /**< One JSON document for scripts (doc/dsm-info.md describes it). */
} dsm_format_t;

/**
 * @brief Describe this build: version, MPI library, build features, and every
 * environment parameter with its type, default, current value and help.
 *
 * Not collective. Thread safe. Free the text with dsm_free(). This is what
 * `dsm-info` and `dsm-info --env` print.
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT for an
 * unknown format; DSM_ERR_OUT_OF_MEMORY.
 */
DSM_API dsm_status_t dsm_info_describe(dsm_format_t format, char **text);

/**
 * @brief Free memory that libdsm allocated for the caller: the text of
 * dsm_info_describe(), dsm_mesh_describe(), dsm_config_describe(),
 * dsm_config_describe_lr(), dsm_engine_describe() and dsm_engine_load_report(), and the client state
 * that dsm_engine_load_checkpoint() returns.
 *
 * NULL is allowed and does nothing. Not collective. Thread safe.
 */
DSM_API void dsm_free(void *ptr);

/** @} */

#ifdef __cplusplus
}
#endif

#endif /* DSM_BASE_H */
