/*
 * libdsm: DeepSpeed's distributed-training runtime for MPI codes.
 *
 * The one public header. C99, usable from C and C++; every name starts with
 * dsm_ or DSM_. Every function returns a dsm_status_t (DSM_SUCCESS = 0) and
 * puts its outputs last, except the few that return a string and say so.
 *
 * Collective calls: a function marked "Collective over C" must be called by
 * every rank of C with matching arguments. If any rank's arguments are bad,
 * every rank returns the same error status, and the message of
 * dsm_last_error() names the rank and the bad value; no rank hangs. A rank
 * that stops answering (stopped, or on a node that dropped off the network)
 * does not hang the others either: a wait of libdsm longer than
 * DSM_COMM_TIMEOUT seconds prints a message naming it and ends the job with
 * MPI_Abort and exit status 75 (doc/environment.md, "The watchdog").
 *
 * Thread safety: functions on different handles may be called concurrently
 * from different threads; calls on the same handle (a mesh and its slices
 * count as one) must be serialized by the caller, and collective calls follow the MPI rules for the communicator
 * (MPI_THREAD_MULTIPLE is needed only if threads call libdsm concurrently).
 * The last-error message is per thread.
 */
#ifndef DSM_H
#define DSM_H

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
 * Every libdsm function returns a dsm_status_t. The values are pinned: they
 * never change between releases, and new codes are only ever appended.
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

/**
 * @defgroup dsm_mesh Device mesh
 *
 * A named N-dimensional grid of the ranks of a communicator. Row-major: the
 * last dimension varies fastest, so in a (data_parallel, sequence_parallel)
 * mesh each sequence-parallel group is a run of consecutive mesh positions.
 * The group of a rank along dimension d is the set of ranks whose coordinates
 * differ only in d; each dimension has its own communicator whose rank is the
 * coordinate along d.
 *
 * With node-aware placement (the default) mesh positions are assigned so that
 * the innermost dimensions stay inside a node whatever order the launcher
 * gave the ranks, and inside a node ranks are ordered by NUMA domain, then
 * rank; the node's GPUs are then handed out in that order, consecutive ranks
 * sharing a GPU when there are more ranks than GPUs.
 * The mesh communicator (dsm_mesh_comm() with group NULL) is ordered by mesh
 * position. "Parent rank" below means the rank in the communicator given to
 * dsm_mesh_create().
 * @{
 */

/** Opaque handle to a mesh or a slice of one. */
typedef struct dsm_mesh_s *dsm_mesh_t;

/** The most dimensions a mesh can have. */
#define DSM_MESH_MAX_DIMS 8
/** The longest dimension or group name, in characters (without the NUL). */
#define DSM_NAME_MAX 63

/** How mesh positions are assigned to ranks. */
typedef enum dsm_placement {
    DSM_PLACEMENT_DEFAULT = 0, /**< DSM_MESH_PLACEMENT from the environment, else DSM_PLACEMENT_NODE. */
    DSM_PLACEMENT_NODE = 1,    /**< Innermost dimensions inside a node; NUMA order inside it. */
    DSM_PLACEMENT_NONE = 2     /**< Mesh position = rank in the communicator. */
} dsm_placement_t;

/** Whether and how each rank binds itself to CPU cores when the mesh is built. */
typedef enum dsm_bind {
    DSM_BIND_DEFAULT = 0, /**< DSM_BIND from the environment, else DSM_BIND_NONE. */
    DSM_BIND_NONE = 1,    /**< Leave the binding the launcher gave. */
    DSM_BIND_SPREAD = 2,  /**< Each rank of a node gets an even share of its cores, in placement order. */
    DSM_BIND_GPU = 3      /**< The cores nearest the rank's GPU (DSM_BIND_SPREAD when the node has none). */
} dsm_bind_t;

/**
 * Options of dsm_mesh_create_with_options(). Initialize with
 * DSM_MESH_OPTIONS_INITIALIZER so that fields added in later versions get
 * their defaults: the library reads only the first @c size bytes.
 */
typedef struct dsm_mesh_options {
    size_t size;               /**< sizeof(dsm_mesh_options_t) as compiled by the caller. */
    dsm_placement_t placement; /**< Rank placement; DSM_PLACEMENT_DEFAULT. */
    dsm_bind_t bind;           /**< CPU binding; DSM_BIND_DEFAULT. */
} dsm_mesh_options_t;

/** Default options: placement and binding from the environment. */
#define DSM_MESH_OPTIONS_INITIALIZER \
    { sizeof(dsm_mesh_options_t), DSM_PLACEMENT_DEFAULT, DSM_BIND_DEFAULT }

/**
 * @brief Build an N-dimensional named mesh over the ranks of @p comm.
 *
 * Collective over @p comm. @p comm is duplicated; the caller keeps ownership
 * of it and may free it at any time. Every communicator the mesh creates has
 * MPI_ERRORS_RETURN and is freed by dsm_mesh_free().
 *
 * @param comm   the ranks of the mesh (not MPI_COMM_NULL)
 * @param ndims  number of dimensions, 1..DSM_MESH_MAX_DIMS
 * @param shape  size of each dimension, outermost first; each positive, or
 *               -1 for one dimension whose size is inferred from the size of
 *               @p comm. The product must equal the size of @p comm.
 * @param names  name of each dimension: unique, non-empty identifiers
 *               ([A-Za-z_][A-Za-z0-9_]*) of at most DSM_NAME_MAX characters
 * @param[out] mesh the new mesh; set to NULL on error
 *
 * Placement and binding follow the environment (DSM_MESH_PLACEMENT,
 * DSM_BIND); dsm_mesh_create_with_options() sets them explicitly.
 *
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT (bad
 * ndims, size, product or name); DSM_ERR_MISMATCH (ranks passed different
 * shapes or names); DSM_ERR_MPI. Every rank returns the same status.
 */
DSM_API dsm_status_t dsm_mesh_create(MPI_Comm comm, int ndims, const int shape[],
                                     const char *const names[], dsm_mesh_t *mesh);

/**
 * @brief dsm_mesh_create() with explicit placement and binding options.
 *
 * Collective over @p comm. @p options may be NULL for the defaults. Options
 * must be the same on every rank.
 * @return as dsm_mesh_create(), and DSM_ERR_INVALID_ARGUMENT for an unknown
 * option value or size.
 */
DSM_API dsm_status_t dsm_mesh_create_with_options(MPI_Comm comm, int ndims, const int shape[],
                                                  const char *const names[],
                                                  const dsm_mesh_options_t *options,
                                                  dsm_mesh_t *mesh);

/**
 * @brief DeepSpeed's mesh_param=(dp, sp): a 2-D mesh named
 * "data_parallel" x "sequence_parallel".
 *
 * Collective over @p comm. One of @p dp and @p sp may be -1 to be inferred.
 * @return as dsm_mesh_create().
 */
DSM_API dsm_status_t dsm_mesh_create_dp_sp(MPI_Comm comm, int dp, int sp, dsm_mesh_t *mesh);

/**
 * @brief The mesh a DeepSpeed configuration describes over @p comm: the
 * explicit form of "the whole job" (pass MPI_COMM_WORLD).
 *
 * A 2-D mesh "data_parallel" x "sequence_parallel" of shape
 * (size / sequence_parallel_size, sequence_parallel_size) when the
 * configuration sets sequence_parallel_size > 1 (data_parallel_size, when
 * given, checked against it), else one "data_parallel" dimension over all of
 * @p comm; placed as dsm_mesh_create() places. dsm_engine_init_comm() is
 * dsm_engine_init() on this mesh.
 *
 * Collective over @p comm: the configuration is read on every rank and every
 * rank returns the same status.
 * @param comm   the ranks of the mesh
 * @param config path of a DeepSpeed JSON file, or inline JSON starting with '{'
 * @param[out] mesh the mesh; NULL on error. Free with dsm_mesh_free().
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT
 * (MPI_COMM_NULL); DSM_ERR_IO; DSM_ERR_CONFIG; DSM_ERR_MISMATCH;
 * DSM_ERR_MPI.
 */
DSM_API dsm_status_t dsm_mesh_create_for_config(MPI_Comm comm, const char *config, dsm_mesh_t *mesh);

/**
 * @brief Free a mesh or a slice and set the handle to NULL.
 *
 * Collective over the mesh communicator: the communicators are freed when the
 * last handle that uses them (the mesh or any slice of it) is freed. NULL and
 * a pointer to NULL are allowed and do nothing.
 * @return DSM_SUCCESS; DSM_ERR_MPI when freeing a communicator failed (the
 * handle is freed anyway).
 */
DSM_API dsm_status_t dsm_mesh_free(dsm_mesh_t *mesh);

/**
 * @brief Number of dimensions of the mesh (or slice).
 *
 * Not collective. @return DSM_SUCCESS; DSM_ERR_NULL_POINTER.
 */
DSM_API dsm_status_t dsm_mesh_ndims(dsm_mesh_t mesh, int *ndims);

/**
 * @brief Size of each dimension, outermost first.
 *
 * Not collective. @p len is the capacity of @p shape and must be at least the
 * number of dimensions.
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT when @p len is too small.
 */
DSM_API dsm_status_t dsm_mesh_shape(dsm_mesh_t mesh, int len, int shape[]);

/**
 * @brief This rank's coordinate along each dimension.
 *
 * Not collective. @p len as in dsm_mesh_shape().
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT when @p len is too small.
 */
DSM_API dsm_status_t dsm_mesh_coords(dsm_mesh_t mesh, int len, int coords[]);

/**
 * @brief The name of dimension @p dim (0 = outermost).
 *
 * Not collective. The string belongs to the mesh and lives as long as it.
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT for @p dim out of range.
 */
DSM_API dsm_status_t dsm_mesh_dim_name(dsm_mesh_t mesh, int dim, const char **name);

/**
 * @brief The index of the dimension called @p name.
 *
 * Not collective.
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_NOT_FOUND (the message lists the known names).
 */
DSM_API dsm_status_t dsm_mesh_dim_index(dsm_mesh_t mesh, const char *name, int *dim);

/**
 * @brief Size of the group along dimension @p dim (= shape[dim]).
 *
 * Not collective.
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT for @p dim out of range.
 */
DSM_API dsm_status_t dsm_mesh_dim_size(dsm_mesh_t mesh, int dim, int *size);

/**
 * @brief This rank's rank in its group along dimension @p dim (= its coordinate).
 *
 * Not collective.
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT for @p dim out of range.
 */
DSM_API dsm_status_t dsm_mesh_dim_rank(dsm_mesh_t mesh, int dim, int *rank);

/**
 * @brief Size of a named group: a dimension, a flattened group, or, for
 * @p group NULL, the whole mesh (or slice).
 *
 * Not collective.
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_NOT_FOUND for an unknown name.
 */
DSM_API dsm_status_t dsm_mesh_size(dsm_mesh_t mesh, const char *group, int *size);

/**
 * @brief This rank's rank in a named group (see dsm_mesh_size()).
 *
 * For @p group NULL: the linear mesh position (row-major) in the mesh or slice.
 * Not collective.
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_NOT_FOUND for an unknown name.
 */
DSM_API dsm_status_t dsm_mesh_rank(dsm_mesh_t mesh, const char *group, int *rank);

/**
 * @brief The communicator of a named group (see dsm_mesh_size()).
 *
 * Not collective. The communicator belongs to the mesh: do not free it; it is
 * valid until the last handle that uses it is freed. Its rank is the rank in
 * the group. @p group NULL gives the whole mesh ordered by mesh position; a
 * slice of two or more dimensions has no communicator of its own (flatten
 * its dimensions for one).
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_NOT_FOUND for an unknown
 * name; DSM_ERR_NOT_SUPPORTED for @p group NULL on a slice of 2+ dimensions.
 */
DSM_API dsm_status_t dsm_mesh_comm(dsm_mesh_t mesh, const char *group, MPI_Comm *comm);

/**
 * @brief The parent ranks of the members of this rank's group, in group-rank
 * order: ranks[i] is the parent rank of the member whose group rank is i.
 *
 * Not collective. @p group as in dsm_mesh_size(); @p len is the capacity of
 * @p ranks and must be at least the group size.
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_NOT_FOUND;
 * DSM_ERR_INVALID_ARGUMENT when @p len is too small.
 */
DSM_API dsm_status_t dsm_mesh_group_ranks(dsm_mesh_t mesh, const char *group, int len,
                                          int ranks[]);

/**
 * @brief A sub-mesh of some of the dimensions, sharing the parent's
 * communicators (no new communicator is created).
 *
 * Not collective. @p names must be dimensions of @p mesh, in ascending mesh
 * order, without repeats. The slice stays valid after @p mesh is freed; free
 * it with dsm_mesh_free().
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_NOT_FOUND for an unknown
 * name; DSM_ERR_INVALID_ARGUMENT for an empty list, a repeated name or names
 * out of mesh order.
 */
DSM_API dsm_status_t dsm_mesh_slice(dsm_mesh_t mesh, int nnames, const char *const names[],
                                    dsm_mesh_t *slice);

/**
 * @brief Flatten several dimensions into one named group with one new
 * communicator, cached by name.
 *
 * Collective over the mesh communicator. @p names: dimensions of @p mesh in
 * ascending mesh order. The group is the set of ranks whose coordinates differ
 * only in those dimensions, ranked row-major over them. Calling it again with
 * the same name and dimensions returns the cached communicator. The name is
 * then usable with dsm_mesh_size(), dsm_mesh_rank(), dsm_mesh_comm() and
 * dsm_mesh_group_ranks() on the mesh and every slice of it.
 *
 * @param mesh      the mesh or a slice of it
 * @param nnames    number of dimensions to flatten, 1..ndims
 * @param names     their names, in ascending mesh order
 * @param flat_name the group's name: an identifier as for dimensions, not
 *                  the name of a dimension
 * @param[out] comm the group's communicator (owned by the mesh); may be NULL.
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_NOT_FOUND;
 * DSM_ERR_INVALID_ARGUMENT (bad or clashing name, names out of order);
 * DSM_ERR_MISMATCH; DSM_ERR_MPI. Every rank returns the same status.
 */
DSM_API dsm_status_t dsm_mesh_flatten(dsm_mesh_t mesh, int nnames, const char *const names[],
                                      const char *flat_name, MPI_Comm *comm);

/**
 * @brief Describe the placement of every rank: parent rank, host, node, NUMA
 * domain, GPU, coordinates and the parent ranks of each of its groups.
 *
 * Not collective: the mesh learned every rank's placement when it was
 * created, so every rank can describe all of them and gets the same text.
 * Free it with dsm_free(). DSM_FORMAT_TEXT gives a table, DSM_FORMAT_JSON a
 * document whose format doc/dsm-info.md specifies.
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT for an
 * unknown format; DSM_ERR_OUT_OF_MEMORY.
 */
DSM_API dsm_status_t dsm_mesh_describe(dsm_mesh_t mesh, dsm_format_t format, char **text);

/** @} */

/**
 * @defgroup dsm_config DeepSpeed configuration
 *
 * libdsm reads DeepSpeed's JSON configuration (ds_config.json): the same
 * keys, defaults, batch arithmetic and checks (doc/configuration.md lists
 * every key and the few differences). A configuration is given as the path
 * of a JSON file, or as inline JSON text when its first non-blank character
 * is '{'. Errors name the full key path and the value found
 * ("zero_optimization.stage: expected 0..3, got 4"); syntax errors give the
 * line and column.
 *
 * The data-parallel size W in train_batch_size == micro_batch * accumulation
 * steps * W is resolved as DeepSpeed does: the mesh's "data_parallel"
 * dimension, else world size / sequence_parallel_size, else the world size.
 * @{
 */

/** Opaque handle to a resolved configuration. */
typedef struct dsm_config_s *dsm_config_t;

/** Flag of dsm_config_load(): keys libdsm does not know are an error, not a warning. */
#define DSM_CONFIG_STRICT 1u

/**
 * @brief Read and resolve a configuration on every rank of @p comm.
 *
 * Collective over @p comm. Every rank reads @p config (so the file must be
 * visible to every rank) and all ranks return the same status: a file that is
 * missing or invalid on one rank is an error on all of them, and a file that
 * resolves differently on some rank gives DSM_ERR_MISMATCH. W is the size of
 * @p comm divided by sequence_parallel_size when the configuration has it.
 *
 * @param comm   the ranks of the job
 * @param config path of a JSON file, or inline JSON text starting with '{'
 * @param flags  0 or DSM_CONFIG_STRICT
 * @param[out] cfg the configuration; NULL on error. Free with dsm_config_free().
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT (unknown
 * flags, MPI_COMM_NULL); DSM_ERR_IO (unreadable file); DSM_ERR_CONFIG (invalid
 * configuration); DSM_ERR_NOT_SUPPORTED (a DeepSpeed feature libdsm does not
 * implement is enabled); DSM_ERR_MISMATCH; DSM_ERR_MPI.
 */
DSM_API dsm_status_t dsm_config_load(MPI_Comm comm, const char *config, unsigned flags,
                                     dsm_config_t *cfg);

/**
 * @brief dsm_config_load() over the ranks of a mesh, with W taken from its
 * "data_parallel" dimension when it has one, and sequence_parallel_size from
 * its "sequence_parallel" dimension when it has one (a configuration that
 * names another size above 1 is DSM_ERR_CONFIG).
 *
 * Collective over the mesh (all ranks of the communicator it was created
 * from, also when @p mesh is a slice).
 * @return as dsm_config_load().
 */
DSM_API dsm_status_t dsm_config_load_for_mesh(dsm_mesh_t mesh, const char *config, unsigned flags,
                                              dsm_config_t *cfg);

/**
 * @brief Resolve a configuration for a job of @p world_size ranks without
 * running it (what `dsm-info config` does).
 *
 * Not collective; needs no MPI initialization.
 * @param config             path of a JSON file, or inline JSON starting with '{'
 * @param world_size         number of ranks, >= 1
 * @param data_parallel_size the mesh's data_parallel size, or 0 when there is
 *                           no mesh (W then follows sequence_parallel_size);
 *                           with a mesh, its other world_size / data_parallel_size
 *                           ranks are the sequence_parallel dimension, which
 *                           the resolved sequence_parallel_size reports (a
 *                           configuration naming another size above 1 is
 *                           DSM_ERR_CONFIG)
 * @param flags              as dsm_config_load()
 * @param[out] cfg           the resolved configuration
 * @return as dsm_config_load(), without DSM_ERR_MISMATCH and DSM_ERR_MPI;
 * DSM_ERR_INVALID_ARGUMENT for a bad size.
 */
DSM_API dsm_status_t dsm_config_resolve(const char *config, int64_t world_size,
                                        int64_t data_parallel_size, unsigned flags,
                                        dsm_config_t *cfg);

/**
 * @brief Free a configuration and set the handle to NULL. NULL and a pointer
 * to NULL are allowed and do nothing.
 *
 * Not collective. @return DSM_SUCCESS.
 */
DSM_API dsm_status_t dsm_config_free(dsm_config_t *cfg);

/**
 * @brief The batch values after DeepSpeed's derivation, and W.
 *
 * Not collective. Any output pointer may be NULL.
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER for a NULL @p cfg.
 */
DSM_API dsm_status_t dsm_config_batch(dsm_config_t cfg, int64_t *train_batch_size,
                                          int64_t *micro_batch_size,
                                          int64_t *gradient_accumulation_steps,
                                          int64_t *data_parallel_size);

/**
 * @brief The resolved configuration: every key with its effective value, the
 * derived batch values and the unknown keys.
 *
 * Not collective. DSM_FORMAT_JSON gives the document doc/configuration.md
 * specifies; DSM_FORMAT_TEXT one "key.path = value" line per key. Free the
 * text with dsm_free().
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT for an
 * unknown format; DSM_ERR_OUT_OF_MEMORY.
 */
DSM_API dsm_status_t dsm_config_describe(dsm_config_t cfg, dsm_format_t format, char **text);

/**
 * @brief The learning rate (and momentum where the schedule cycles it) before
 * the first optimizer step and after each of @p steps optimizer steps, from
 * the configuration's scheduler and optimizer, computed by the code the
 * engine uses.
 *
 * Before the first step: the schedule's value at its start, except for a
 * schedule restored by hand (scheduler.params.last_batch_iteration >= 0),
 * which leaves the optimizer's lr (and beta1) in force until its first step,
 * as the engine and DeepSpeed's schedules do.
 *
 * Not collective. @p steps: 0..10000000. Free the text with dsm_free().
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT (steps,
 * format); DSM_ERR_CONFIG (scheduler parameters; a schedule that needs the
 * optimizer's lr in a configuration without an optimizer type);
 * DSM_ERR_OUT_OF_MEMORY.
 */
DSM_API dsm_status_t dsm_config_describe_lr(dsm_config_t cfg, int64_t steps, dsm_format_t format,
                                            char **text);

/** @} */

/**
 * @defgroup dsm_engine Training engine
 *
 * The engine owns a model's parameters, gradients and optimizer state in
 * flat, aligned buffers partitioned over the mesh's "data_parallel"
 * dimension as the configuration's ZeRO stage says (0: nothing partitioned;
 * 1: optimizer state; 2: and gradients; 3: and parameters), runs the
 * configured optimizer, LR schedule and mixed precision, and reduces
 * gradients over data_parallel x sequence_parallel (summed over SP, averaged
 * over DP: gradient_allreduce_op "mean").
 *
 * A training micro-step, the same for every stage:
 * - forward: dsm_engine_param_acquire() gives a parameter's values (under
 *   ZeRO-3 it gathers them), dsm_engine_param_release() when done;
 * - backward: multiply the loss gradient by dsm_engine_loss_scale(); for
 *   each parameter, dsm_engine_grad_acquire() gives the buffer to add its
 *   gradient into, dsm_engine_grad_release() hands it back (under ZeRO-2/3
 *   the engine reduces it then, in buckets of reduce_bucket_size);
 * - dsm_step(): at the gradient-accumulation boundary, the optimizer step.
 *
 * Collective calls: every rank of the engine makes the same collective calls
 * in the same order. The engine checks that at each of its collective points
 * and fails every rank with DSM_ERR_MISMATCH (or the status of the rank that
 * found the error) instead of hanging. After a collective call fails the
 * engine only accepts dsm_engine_free() (other calls give DSM_ERR_STATE).
 *
 * Values live in the engine's compute dtype (dsm_engine_dtype():
 * FLOAT32, FLOAT16 with fp16.enabled, BFLOAT16 with bf16.enabled);
 * dsm_convert() moves data between dtypes.
 * @{
 */

/** Opaque handle to a training engine. */
typedef struct dsm_engine_s *dsm_engine_t;

/** Largest number of dimensions of a parameter. */
#define DSM_PARAM_MAX_DIMS 8

/**
 * @brief Fills elements [@p offset, @p offset + @p count) of parameter
 * @p index (row-major) into @p values as fp32; returns 0, or nonzero to fail
 * dsm_engine_init() with DSM_ERR_INVALID_ARGUMENT.
 *
 * The engine calls it only for the ranges this rank stores, so under ZeRO-3 no
 * rank ever holds a whole model (DeepSpeed's zero.Init). It must give the same
 * values for the same range on every rank (seed a generator by the element
 * index, not by the rank).
 */
typedef int (*dsm_param_init_fn)(void *user_data, int index, const char *name, int64_t offset,
                                 int64_t count, float *values);

/** Describes one parameter of the model (dsm_engine_init()). */
typedef struct dsm_param_desc {
    /** Unique name, 1..255 characters without spaces ("layer1.weight"); checkpoints use it. */
    const char *name;
    int ndims;              /**< 0 (a scalar) .. DSM_PARAM_MAX_DIMS */
    const int64_t *shape;   /**< ndims sizes, each >= 1 */
    /** dtype of @c init_values: FLOAT32, FLOAT64, FLOAT16 or BFLOAT16. */
    dsm_dtype_t dtype;
    int trainable;          /**< 0: frozen (no gradient, no optimizer state, held whole on every rank) */
    int no_weight_decay;    /**< 1: excluded from weight decay (biases, norms) */
    /** The whole parameter, read on the engine's first rank (rank 0 of its
     *  mesh) and broadcast to the others (which may pass NULL).
     *  NULL there and no @c init_fn: zeros. */
    const void *init_values;
    dsm_param_init_fn init_fn; /**< used when @c init_values is NULL on the first rank */
    void *init_user_data;      /**< passed to @c init_fn */
} dsm_param_desc_t;

/** Initializer of dsm_param_desc_t: a trainable fp32 scalar with decay and
 *  zero initial values; set name, ndims and shape. (A zeroed descriptor is
 *  frozen: trainable = 0.) */
#define DSM_PARAM_DESC_INITIALIZER { NULL, 0, NULL, DSM_FLOAT32, 1, 0, NULL, NULL, NULL }

/** What dsm_step() did, and the engine's counters (dsm_engine_step_info()). */
typedef struct dsm_step_info {
    size_t size;            /**< sizeof(dsm_step_info_t): set by DSM_STEP_INFO_INITIALIZER */
    int boundary;           /**< 1: this micro-step ended an accumulation window */
    int skipped;            /**< 1: gradients overflowed; the update was skipped */
    int64_t global_steps;   /**< accumulation boundaries so far, skipped ones included */
    int64_t micro_steps;    /**< dsm_step() calls so far */
    int64_t skipped_steps;  /**< boundaries skipped for overflow */
    int64_t global_samples; /**< train_batch_size per boundary */
    double lr;              /**< learning rate of the next optimizer step */
    double loss_scale;      /**< loss scale for the next micro-step (1 without fp16) */
    double grad_norm;       /**< global gradient norm of the last boundary, before clipping (-1 before the first) */
} dsm_step_info_t;

/** Initializer of dsm_step_info_t. */
#define DSM_STEP_INFO_INITIALIZER { sizeof(dsm_step_info_t), 0, 0, 0, 0, 0, 0, 0.0, 1.0, -1.0 }

/** Where the engine keeps the model state and runs its math (dsm_engine_options_t::device). */
typedef enum dsm_device {
    /** DSM_ENGINE_DEVICE from the environment; when that is unset or "auto": DSM_DEVICE_CUDA when
     *  NCCL is built, every rank has a CUDA device of its own (no two ranks of a node share
     *  one) and no ZeRO-Offload is configured, else
     *  DSM_DEVICE_HOST. */
    DSM_DEVICE_DEFAULT = 0,
    /** Host memory: the parameters the user reads and the gradients it writes are host memory. */
    DSM_DEVICE_HOST = 1,
    /** Device-resident: parameters, gradients, master weights and optimizer state in the rank's
     *  CUDA device memory; collectives on NCCL; the fused CUDA optimizer. */
    DSM_DEVICE_CUDA = 2,
    /** The device-resident engine on a simulated device: host memory with its own deferred queue
     *  (for tests of the device paths on machines without a GPU; host-addressable). */
    DSM_DEVICE_SIMULATED = 3
} dsm_device_t;

/** The communication backend of the engine's collectives (dsm_engine_options_t::backend). */
typedef enum dsm_backend {
    DSM_BACKEND_DEFAULT = 0, /**< DSM_COMM_BACKEND from the environment, else auto. */
    DSM_BACKEND_AUTO = 1,    /**< nccl for CUDA memory; shm within a node, else mpi, for host memory. */
    DSM_BACKEND_MPI = 2,     /**< MPI collectives. */
    DSM_BACKEND_SHM = 3,     /**< Shared memory within each node, MPI between nodes (host memory). */
    DSM_BACKEND_NCCL = 4     /**< NCCL (CUDA memory). */
} dsm_backend_t;

/**
 * Options of dsm_engine_init_with_options(). Initialize with
 * DSM_ENGINE_OPTIONS_INITIALIZER so that fields added in later versions get
 * their defaults: the library reads only the first @c size bytes.
 */
typedef struct dsm_engine_options {
    size_t size;           /**< sizeof(dsm_engine_options_t) as compiled by the caller. */
    dsm_device_t device;   /**< Where the model state lives; DSM_DEVICE_DEFAULT. */
    dsm_backend_t backend; /**< The collectives' backend; DSM_BACKEND_DEFAULT. */
    int cuda_device;       /**< CUDA device ordinal, or -1: DSM_CUDA_DEVICE, the mesh placement's GPU, the node-local rank. */
} dsm_engine_options_t;

/** Default options: device and backend from the environment. */
#define DSM_ENGINE_OPTIONS_INITIALIZER \
    { sizeof(dsm_engine_options_t), DSM_DEVICE_DEFAULT, DSM_BACKEND_DEFAULT, -1 }

/**
 * @brief Create an engine for a model on the ranks of @p mesh.
 *
 * Collective over the mesh. The configuration is read on every rank as
 * dsm_config_load_for_mesh() does; its "optimizer" section is required. ZeRO
 * partitions over the mesh's "data_parallel" dimension (a mesh without one is
 * all data parallel). Every rank passes the same parameter list (names,
 * shapes, trainable and weight-decay flags): a rank whose list differs fails
 * every rank with DSM_ERR_MISMATCH naming the first difference.
 *
 * With zero_optimization.offload_optimizer (or, at stage 3, offload_param)
 * device "cpu" the engine runs ZeRO-Offload: each rank selects its CUDA
 * device (DSM_CUDA_DEVICE, else the mesh placement's GPU, else the
 * node-local rank) and the parameters and gradients it hands out are device
 * memory; a rank without a usable device fails every rank with
 * DSM_ERR_NOT_SUPPORTED and the reason.
 *
 * With several ranks on a node the engine keeps its flat buffers in shared
 * memory (/dev/shm). When they do not fit there on some node, every rank
 * falls back to the mpi backend (private memory), with a warning on rank 0
 * naming /dev/shm, the bytes needed and the bytes available; the decision is
 * the same on every rank.
 *
 * The model state lives where DSM_DEVICE_DEFAULT says: on a CUDA device
 * (device-resident) when NCCL is built and every rank has one of its own, else in host
 * memory; dsm_engine_init_with_options() chooses explicitly. A program that
 * computes its forward and backward on the host must ask for
 * DSM_DEVICE_HOST (or set DSM_ENGINE_DEVICE=host) to keep working on GPU
 * nodes.
 *
 * @param mesh    the mesh (not NULL: for the mesh a configuration
 *                describes over MPI_COMM_WORLD, use
 *                dsm_mesh_create_for_config() or dsm_engine_init_comm()).
 *                The engine keeps its own reference: the caller may free
 *                @p mesh at once.
 * @param config  path of a DeepSpeed JSON file, or inline JSON starting with '{'
 * @param params  @p nparams parameter descriptions
 * @param nparams number of parameters, 1..1000000
 * @param[out] engine the engine; NULL on error. Free with dsm_engine_free().
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER (a NULL mesh, config, params or
 * engine); DSM_ERR_INVALID_ARGUMENT (a bad
 * descriptor, naming the parameter and the field; an init_fn that failed);
 * DSM_ERR_IO; DSM_ERR_CONFIG; DSM_ERR_NOT_SUPPORTED; DSM_ERR_MISMATCH;
 * DSM_ERR_OUT_OF_MEMORY; DSM_ERR_MPI; DSM_ERR_CUDA. Every rank returns the same status.
 */
DSM_API dsm_status_t dsm_engine_init(dsm_mesh_t mesh, const char *config,
                                     const dsm_param_desc_t *params, int nparams,
                                     dsm_engine_t *engine);

/**
 * @brief dsm_engine_init() on the mesh dsm_mesh_create_for_config() builds
 * over @p comm (MPI_COMM_WORLD for the whole job).
 *
 * Collective over @p comm. @return as dsm_engine_init().
 */
DSM_API dsm_status_t dsm_engine_init_comm(MPI_Comm comm, const char *config,
                                          const dsm_param_desc_t *params, int nparams,
                                          dsm_engine_t *engine);

/**
 * @brief dsm_engine_init_comm() with explicit options (as
 * dsm_engine_init_with_options()): a program that computes on the host
 * passes DSM_DEVICE_HOST without building a mesh of its own.
 *
 * Collective over @p comm. @p options may be NULL for the defaults; the
 * options are checked and agreed as dsm_engine_init_with_options() does.
 * @return as dsm_engine_init_with_options().
 */
DSM_API dsm_status_t dsm_engine_init_comm_with_options(MPI_Comm comm, const char *config,
                                                       const dsm_param_desc_t *params, int nparams,
                                                       const dsm_engine_options_t *options,
                                                       dsm_engine_t *engine);

/**
 * @brief dsm_engine_init() with explicit options: where the model state lives
 * (dsm_engine_options_t::device), the collectives' backend and the CUDA
 * device.
 *
 * Collective over the mesh. @p options may be NULL for the defaults;
 * dsm_engine_init() and dsm_engine_init_comm() are this call with NULL
 * options. Initialize the struct with DSM_ENGINE_OPTIONS_INITIALIZER: a
 * caller compiled against an older, smaller dsm_engine_options_t gets the
 * defaults of the fields it lacks.
 *
 * The options are checked on every rank and agreed before the engine is built:
 * an invalid field on any rank fails every rank with
 * DSM_ERR_INVALID_ARGUMENT naming the rank, the field and its value; a
 * device or backend that differs between the ranks of the mesh fails every
 * rank with DSM_ERR_MISMATCH naming the field and both values.
 * @c cuda_device may differ between ranks (each rank names its own GPU).
 *
 * DSM_DEVICE_HOST: the engine of dsm_engine_init() without a GPU (the
 * parameters handed out are host memory; ZeRO-Offload when the configuration
 * asks for it). DSM_DEVICE_CUDA: device-resident; parameters, gradient
 * buffers, master weights and optimizer state in the rank's CUDA device
 * memory, NCCL collectives per mesh dimension, the fused CUDA optimizer; a
 * rank without a usable CUDA device (or a build without CUDA and NCCL)
 * fails every rank with DSM_ERR_NOT_SUPPORTED and the reason.
 * DSM_DEVICE_SIMULATED: the device-resident engine on host memory with a
 * deferred queue, for tests. dsm_engine_device() tells which device an
 * engine got.
 *
 * @param mesh    the mesh (not NULL)
 * @param config  path of a DeepSpeed JSON file, or inline JSON starting with '{'
 * @param params  @p nparams parameter descriptions
 * @param nparams number of parameters, 1..1000000
 * @param options the options, or NULL for DSM_ENGINE_OPTIONS_INITIALIZER
 * @param[out] engine the engine; NULL on error. Free with dsm_engine_free().
 * @return as dsm_engine_init(); DSM_ERR_INVALID_ARGUMENT also for an
 * options->size below sizeof(size_t) or above sizeof(dsm_engine_options_t),
 * an unknown device or backend value, or a cuda_device below -1;
 * DSM_ERR_MISMATCH for options that differ between ranks;
 * DSM_ERR_NOT_SUPPORTED for a device or backend this build or machine
 * cannot give. Every rank returns the same status.
 */
DSM_API dsm_status_t dsm_engine_init_with_options(dsm_mesh_t mesh, const char *config,
                                                  const dsm_param_desc_t *params, int nparams,
                                                  const dsm_engine_options_t *options,
                                                  dsm_engine_t *engine);

/**
 * @brief Free an engine and set @p *engine to NULL; NULL is a no-op.
 *
 * Collective over the engine's ranks: they first agree that all of them are
 * freeing it; a rank that is in another engine call meanwhile makes every
 * rank fail with DSM_ERR_MISMATCH (the engine is freed anyway on the ranks
 * that called this). After a collective engine call has failed, freeing is
 * local: the engine's shared-memory windows and communicators are then left
 * to MPI_Finalize instead of being freed collectively, so that no rank
 * hangs. Parameter pointers from dsm_engine_param_acquire() become invalid.
 * An asynchronous checkpoint save still writing is waited for first; its
 * failure is returned (the engine is freed all the same).
 * @return DSM_SUCCESS; DSM_ERR_MISMATCH; DSM_ERR_MPI; the failure of an
 * asynchronous save (dsm_engine_checkpoint_wait()). @p *engine is NULL
 * afterwards in every case.
 */
DSM_API dsm_status_t dsm_engine_free(dsm_engine_t *engine);

/**
 * @brief Number of parameters, and the index of a parameter by name.
 *
 * Not collective. Thread safe with other readers.
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_NOT_FOUND for an unknown name.
 */
DSM_API dsm_status_t dsm_engine_num_params(dsm_engine_t engine, int *nparams);
/** @copydoc dsm_engine_num_params */
DSM_API dsm_status_t dsm_engine_param_index(dsm_engine_t engine, const char *name, int *index);

/**
 * @brief The number of elements of parameter @p index.
 *
 * Not collective. @return DSM_SUCCESS; DSM_ERR_NULL_POINTER;
 * DSM_ERR_INVALID_ARGUMENT for an index out of range.
 */
DSM_API dsm_status_t dsm_engine_param_numel(dsm_engine_t engine, int index, int64_t *numel);

/**
 * @brief The shape parameter @p index was declared with (dsm_param_desc_t
 * ndims and shape): its number of dimensions and the size of each,
 * outermost first (row-major, the last dimension varies fastest).
 *
 * Not collective. Thread safe with other readers. @p len is the capacity of
 * @p shape; DSM_PARAM_MAX_DIMS is always enough. With @p len 0 and @p shape
 * NULL only @p ndims is set.
 * @param engine the engine
 * @param index  the parameter, 0-based
 * @param len    the number of elements @p shape has room for
 * @param[out] ndims 0 (a scalar) .. DSM_PARAM_MAX_DIMS
 * @param[out] shape @p ndims sizes
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER (engine, ndims, or shape with
 * @p len > 0); DSM_ERR_INVALID_ARGUMENT for an index out of range or a
 * @p len below the parameter's ndims (naming both; @p ndims is set then).
 */
DSM_API dsm_status_t dsm_engine_param_shape(dsm_engine_t engine, int index, int len, int *ndims, int64_t shape[]);

/**
 * @brief The engine's compute dtype: FLOAT32, FLOAT16 (fp16.enabled) or
 * BFLOAT16 (bf16.enabled). Parameters and gradient buffers use it.
 *
 * Not collective. @return DSM_SUCCESS; DSM_ERR_NULL_POINTER.
 */
DSM_API dsm_status_t dsm_engine_dtype(dsm_engine_t engine, dsm_dtype_t *dtype);

/**
 * @brief Where the engine keeps its model state: DSM_DEVICE_HOST,
 * DSM_DEVICE_CUDA or DSM_DEVICE_SIMULATED, never DSM_DEVICE_DEFAULT (the
 * device DSM_DEVICE_DEFAULT and DSM_ENGINE_DEVICE resolved to).
 *
 * Not collective. Thread safe with other readers. The parameters and
 * gradient buffers the engine hands out are in this device's memory
 * (DSM_DEVICE_HOST with ZeRO-Offload: on the rank's CUDA device, see
 * dsm_engine_param_acquire()).
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT for a
 * handle that is not a live engine.
 */
DSM_API dsm_status_t dsm_engine_device(dsm_engine_t engine, dsm_device_t *device);

/**
 * @brief The engine's batch values after DeepSpeed's derivation (as
 * dsm_config_batch() on its configuration): train_batch_size,
 * train_micro_batch_size_per_gpu, gradient_accumulation_steps and the
 * data-parallel size.
 *
 * Not collective. Any output pointer may be NULL.
 * @return DSM_SUCCESS; DSM_ERR_INVALID_ARGUMENT for a handle that is not a
 * live engine.
 */
DSM_API dsm_status_t dsm_engine_batch(dsm_engine_t engine, int64_t *train_batch_size,
                                          int64_t *micro_batch_size, int64_t *gradient_accumulation_steps,
                                          int64_t *data_parallel_size);

/**
 * @brief Parameter @p index's values as fp32 in host memory @p values
 * (@p count elements, the parameter's numel), whatever the compute dtype
 * and wherever the engine keeps them (host, CUDA device, ZeRO-Offload's
 * device copies): dsm_engine_param_acquire(), a copy converted with the
 * vectorised kernels of dsm_convert(), dsm_engine_param_release().
 *
 * Collective where the acquire is (ZeRO-3 gathers a partitioned parameter).
 * Call it where the acquire would be called, not while the parameter is
 * acquired.
 * @return DSM_SUCCESS; DSM_ERR_INVALID_ARGUMENT for a bad index or a
 * @p count other than the parameter's numel (naming both);
 * DSM_ERR_NULL_POINTER for NULL @p values; DSM_ERR_STATE when the parameter
 * is acquired; the acquire's errors.
 */
DSM_API dsm_status_t dsm_engine_param_read_f32(dsm_engine_t engine, int index, float *values, int64_t count);

/**
 * @brief Add the fp32 gradient @p grad (host memory, @p count elements, the
 * parameter's numel) into parameter @p index's gradient buffer, whatever the
 * compute dtype and wherever the buffer lives: dsm_engine_grad_acquire(), the
 * buffer's sum converted to fp32, @p grad added, converted back,
 * dsm_engine_grad_release() (which starts the bucket's reduction under
 * ZeRO-2/3 as a release does). Multiply the loss gradient by
 * dsm_engine_loss_scale() before, as for the buffer itself.
 *
 * Collective where the release is. Not while the gradient is acquired.
 * @return DSM_SUCCESS; DSM_ERR_INVALID_ARGUMENT for a bad index, a frozen
 * parameter or a @p count other than its numel; DSM_ERR_NULL_POINTER for
 * NULL @p grad; DSM_ERR_STATE when the gradient is acquired; the acquire's
 * and release's errors.
 */
DSM_API dsm_status_t dsm_engine_grad_add_f32(dsm_engine_t engine, int index, const float *grad, int64_t count);

/**
 * @brief Give the engine this micro-step's loss for the metrics files
 * (configuration blocks csv_monitor and tensorboard, doc/engine.md
 * "Metrics"): at each accumulation boundary the mean of the losses given
 * since the last one is written as Train/Samples/train_loss.
 *
 * Local (no communication); only the engine's first rank writes, so the
 * value that counts is that rank's (as DeepSpeed's monitor). Any value,
 * NaN and infinities included, is recorded as given.
 * @return DSM_SUCCESS; DSM_ERR_INVALID_ARGUMENT for a handle that is not a
 * live engine; DSM_ERR_STATE after a failed collective call.
 */
DSM_API dsm_status_t dsm_engine_log_loss(dsm_engine_t engine, double loss);

/**
 * @brief Write one scalar of the program's own to the metrics files, with
 * the global sample count as its step (nothing when no monitor is enabled).
 *
 * Local; only the engine's first rank writes. @p name: 1..255 printable
 * characters without a comma or a double quote ("Eval/accuracy"; the CSV
 * file is named after it with '/' and ' ' as '_').
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER for NULL @p name;
 * DSM_ERR_INVALID_ARGUMENT for a bad name (naming it) or handle;
 * DSM_ERR_STATE after a failed collective call. A file that cannot be
 * written is a warning, and metrics stop; training goes on.
 */
DSM_API dsm_status_t dsm_engine_log_scalar(dsm_engine_t engine, const char *name, double value);

/**
 * @brief The model's FLOPs per training sample (forward and backward, the
 * program's own count, e.g. 6 x parameters x tokens for a transformer) and
 * each rank's peak FLOP/s, for the metrics Train/Samples/tflops (achieved
 * TFLOP/s per rank) and Train/Samples/mfu (their ratio to the peak). 0
 * turns a figure off.
 *
 * Local. @return DSM_SUCCESS; DSM_ERR_INVALID_ARGUMENT for a negative or
 * non-finite figure (naming it) or a bad handle.
 */
DSM_API dsm_status_t dsm_engine_set_flops(dsm_engine_t engine, double flops_per_sample, double peak_flops);

/**
 * @brief Catch signal @p signum as a request to stop training at the next
 * step boundary (0: catch none, the default).
 *
 * Collective over the engine's ranks, with the same @p signum on every
 * rank. The handler only records that the signal arrived: training goes
 * on. Every dsm_step() shares the record among the ranks in the collective
 * it already makes, so a signal delivered to any one rank (as Slurm's
 * `--signal=USR1@120` or a launcher forwarding SIGUSR1 delivers it to all)
 * makes dsm_engine_stop_requested() report 1 on every rank from the
 * dsm_step() that ends the next accumulation boundary on: the program
 * saves a checkpoint and exits cleanly, e.g. before a requeue. The handler
 * replaces the process's handler for the signal while an engine uses it,
 * and the previous one is restored when the last engine that uses it is
 * freed. The DSM_STOP_SIGNAL environment parameter sets the signal of
 * every engine created while it is set. SIGKILL and SIGSTOP cannot be
 * caught; fault signals (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS)
 * are refused.
 * @param engine the engine
 * @param signum a signal number (SIGUSR1, SIGTERM, SIGRTMIN + n, ...) or 0
 * @return DSM_SUCCESS; DSM_ERR_INVALID_ARGUMENT (a signal that does not
 * exist or is refused, naming it: on every rank); DSM_ERR_MISMATCH (ranks
 * passed different signals: on every rank); DSM_ERR_STATE after a failed
 * collective call; DSM_ERR_MPI.
 */
DSM_API dsm_status_t dsm_engine_set_stop_signal(dsm_engine_t engine, int signum);

/**
 * @brief Whether the stop signal (dsm_engine_set_stop_signal(),
 * DSM_STOP_SIGNAL) arrived on some rank before a dsm_step() that ended an
 * accumulation boundary: @p stop gets 1, the same on every rank, else 0.
 *
 * Local: it reads what the last dsm_step() agreed. Once 1, it stays 1.
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT for a bad handle.
 */
DSM_API dsm_status_t dsm_engine_stop_requested(dsm_engine_t engine, int *stop);

/**
 * @brief Get the values of parameter @p index (numel elements of the compute
 * dtype, row-major) until dsm_engine_param_release().
 *
 * Under ZeRO-3 a parameter with more than stage3_param_persistence_threshold
 * elements is gathered from its partitions: then the call is collective over
 * the data-parallel group (every rank acquires the same parameters in the
 * same order), and the engine also gathers the parameters that followed this
 * one in the previous step's order, up to stage3_prefetch_bucket_size
 * elements (and stage3_max_live_parameters gathered at once), in the same
 * collective; with zero_optimization.overlap_comm it gathers this one alone
 * and starts the prefetch of the next ones, which arrive while the caller
 * computes (also collective). A released parameter that the recorded order
 * acquires again within stage3_max_reuse_distance elements stays gathered.
 * Otherwise it is local. With overlap_comm at stages 1 and 2 the call waits
 * for the slice of the allgather after the last step that holds the
 * parameter. Acquiring a parameter twice without release is DSM_ERR_STATE.
 *
 * The values are in host memory, or with ZeRO-Offload
 * (zero_optimization.offload_optimizer / offload_param device "cpu") in
 * device memory on the rank's CUDA device: a copy of the values of the last
 * step or checkpoint load. dsm_step() enqueues the copies of the parameters
 * already acquired once and returns; this call waits for this parameter's
 * copy alone (doc/engine.md, ZeRO-Offload). Those copies overwrite the
 * device copy: kernels reading it must be ordered before them, as work on
 * the legacy default stream is; synchronize other streams before dsm_step().
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT;
 * DSM_ERR_STATE; DSM_ERR_MISMATCH; DSM_ERR_OUT_OF_MEMORY; DSM_ERR_MPI;
 * DSM_ERR_CUDA (ZeRO-Offload).
 */
DSM_API dsm_status_t dsm_engine_param_acquire(dsm_engine_t engine, int index, const void **values);

/**
 * @brief Give back a parameter from dsm_engine_param_acquire(); under ZeRO-3
 * its gathered copy is freed. Not collective.
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT;
 * DSM_ERR_STATE when it is not acquired.
 */
DSM_API dsm_status_t dsm_engine_param_release(dsm_engine_t engine, int index);

/**
 * @brief Get the buffer to add parameter @p index's gradient into (numel
 * elements of the compute dtype).
 *
 * Add (+=) the gradient of the loss multiplied by the loss scale. Under ZeRO-0
 * and 1 the buffer holds the sum of this accumulation window so far; under
 * ZeRO-2 and 3 it starts at zero and its contents are reduced at release.
 * Either way the engine reduces the sum of everything added. Not collective.
 * With ZeRO-Offload the buffer is zeroed device memory on the rank's CUDA
 * device, added into the engine's host gradient at release.
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT (index,
 * or a frozen parameter); DSM_ERR_STATE when already acquired; DSM_ERR_OUT_OF_MEMORY;
 * DSM_ERR_CUDA (ZeRO-Offload).
 */
DSM_API dsm_status_t dsm_engine_grad_acquire(dsm_engine_t engine, int index, void **grad);

/**
 * @brief Hand a gradient buffer back to the engine.
 *
 * Under ZeRO-2 and 3 the gradient joins the current bucket, which is reduced
 * (a reduce-scatter to its owners over the data-parallel group) when it holds
 * reduce_bucket_size elements: the call is then collective, and every rank
 * releases the same gradients in the same order. Otherwise it is local.
 * With zero_optimization.overlap_comm the reduction only starts there and
 * runs while the caller computes (dsm_step() waits for it); at ZeRO-0 and 1
 * the release that completes a reduce_bucket_size region of the flat
 * gradient in the micro-step ending at the accumulation boundary starts that
 * region's reduction the same way (collective too), and acquiring one of its
 * gradients again before dsm_step() is DSM_ERR_STATE. The results have the
 * same bits with overlap_comm on and off (doc/engine.md, Overlap).
 * With ZeRO-Offload the call enqueues the device buffer's copy to host
 * memory and returns; the engine adds it into its host gradient later (by
 * the next bucket flush or dsm_step() at the latest). The writes into the
 * buffer must be complete: work on the legacy default stream is ordered
 * before the copy; synchronize other streams first.
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT;
 * DSM_ERR_STATE when not acquired; DSM_ERR_MISMATCH; DSM_ERR_MPI;
 * DSM_ERR_CUDA (ZeRO-Offload).
 */
DSM_API dsm_status_t dsm_engine_grad_release(dsm_engine_t engine, int index);

/**
 * @brief Get the values of @p count elements of parameter @p index from
 * element @p offset (flat, row-major: a layer's slice of a tensor that stacks
 * the layers) until dsm_engine_param_release_range() with the same offset
 * and count.
 *
 * Under ZeRO-3 a parameter with more than stage3_param_persistence_threshold
 * elements is not held whole: only the range is gathered from the
 * partitions, into a buffer of @p count elements that the release frees.
 * Then the call is collective over the data-parallel group (every rank
 * acquires the same ranges in the same order), and its arguments are agreed:
 * a bad range, a NULL @p values or a range already acquired on any rank
 * fails every rank with that rank's status and message, and the engine stays
 * usable. Otherwise it is local (a pointer into the parameter; with
 * overlap_comm at stages 1 and 2 it waits for the slice of the allgather
 * after the last step that holds it) and a bad argument is this rank's
 * error. Ranges do not prefetch. Several ranges of a parameter, overlapping
 * or not, and the whole parameter may be acquired at once; the same range
 * twice is DSM_ERR_STATE. ZeRO-Offload: DSM_ERR_NOT_SUPPORTED.
 *
 * @param engine the engine
 * @param index  the parameter
 * @param offset first element, 0 <= offset
 * @param count  elements, 1 <= count, offset + count <= numel
 * @param[out] values the range's @p count values (compute dtype, host or
 *               device memory as dsm_engine_param_acquire())
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT (the
 * index; a range outside the parameter, naming offset, count and numel);
 * DSM_ERR_STATE (the range is already acquired); DSM_ERR_NOT_SUPPORTED;
 * DSM_ERR_MISMATCH (ranks acquiring different ranges); DSM_ERR_OUT_OF_MEMORY;
 * DSM_ERR_MPI; DSM_ERR_CUDA.
 */
DSM_API dsm_status_t dsm_engine_param_acquire_range(dsm_engine_t engine, int index, int64_t offset,
                                                    int64_t count, const void **values);

/**
 * @brief Give back a range from dsm_engine_param_acquire_range() (the same
 * @p offset and @p count); a gathered range's buffer is freed. Not
 * collective.
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT (the
 * index); DSM_ERR_STATE when that range is not acquired.
 */
DSM_API dsm_status_t dsm_engine_param_release_range(dsm_engine_t engine, int index, int64_t offset,
                                                    int64_t count);

/**
 * @brief Get the buffer to add the gradient of @p count elements of
 * parameter @p index from element @p offset into, until
 * dsm_engine_grad_release_range() with the same offset and count.
 *
 * As dsm_engine_grad_acquire() for a part of the parameter: under ZeRO-0
 * and 1 a pointer into the whole gradient (the window's sum so far); under
 * ZeRO-2 and 3 a buffer of @p count elements that starts at zero, reduced
 * at its release, so that the gradient of a stacked tensor is reduced layer
 * by layer and never held whole. Ranges of one parameter may be acquired one
 * after the other, overlapping or not (what is added is summed); the same
 * range twice at once is DSM_ERR_STATE. Not collective: a bad range is this
 * rank's error (and a rank that then releases different gradients fails
 * every rank with DSM_ERR_MISMATCH at the next bucket reduction).
 * ZeRO-Offload: DSM_ERR_NOT_SUPPORTED.
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT (the
 * index, a frozen parameter, a range outside the parameter);
 * DSM_ERR_STATE; DSM_ERR_NOT_SUPPORTED; DSM_ERR_OUT_OF_MEMORY; DSM_ERR_CUDA.
 */
DSM_API dsm_status_t dsm_engine_grad_acquire_range(dsm_engine_t engine, int index, int64_t offset,
                                                   int64_t count, void **grad);

/**
 * @brief Hand a gradient range from dsm_engine_grad_acquire_range() (the
 * same @p offset and @p count) back to the engine.
 *
 * Under ZeRO-2 and 3 the range joins the current bucket as a gradient of
 * its own (@p count elements), and the call is collective when the bucket
 * then holds reduce_bucket_size elements, as dsm_engine_grad_release() is.
 * Under ZeRO-0 and 1 it is local and the range is reduced at dsm_step()
 * (with overlap_comm, a bucket whose gradients were released by ranges
 * starts its reduction there, not at the release).
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT (the
 * index); DSM_ERR_STATE when that range is not acquired; DSM_ERR_MISMATCH;
 * DSM_ERR_MPI; DSM_ERR_CUDA.
 */
DSM_API dsm_status_t dsm_engine_grad_release_range(dsm_engine_t engine, int index, int64_t offset,
                                                   int64_t count);

/**
 * @brief One micro-step.
 *
 * Collective over the engine's ranks. Every gradient and parameter must be
 * released. At the gradient-accumulation boundary (every
 * gradient_accumulation_steps calls): finish the reductions, unscale, check
 * for Inf/NaN on every rank (fp16, bf16 with check_grad_overflow: one rank's
 * overflow makes every rank skip; fp32: as fp32_nonfinite_gradients says,
 * apply and warn once, skip, or fail on every rank),
 * compute the global gradient norm (fp64), clip to gradient_clipping, run the
 * optimizer on this rank's partition of the fp32 master weights, gather the
 * updated parameters where the stage needs them, step the LR schedule (not
 * after a skipped step) and the loss scaler. Gradients are summed over the
 * window and divided by its length.
 *
 * @param engine   the engine
 * @param[out] info what happened (may be NULL); initialize with DSM_STEP_INFO_INITIALIZER.
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_STATE (a buffer still
 * acquired: every rank fails); DSM_ERR_MISMATCH; DSM_ERR_NUMERIC (fp16 loss
 * scale at its minimum and still overflowing, or Inf/NaN fp32 gradients with
 * fp32_nonfinite_gradients "fail"); DSM_ERR_MPI. The first dsm_step()
 * after an asynchronous save (checkpoint.writer.decoupled) has ended on every
 * rank returns that save's failure instead, if it failed (DSM_ERR_IO,
 * DSM_ERR_HDF5, ..., naming the checkpoint; every rank alike): that call
 * does nothing else and the engine stays usable, so calling dsm_step()
 * again goes on.
 */
DSM_API dsm_status_t dsm_step(dsm_engine_t engine, dsm_step_info_t *info);

/**
 * @brief The loss scale to multiply the loss gradient by before backward
 * (fp16; 1.0 otherwise). Not collective.
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER.
 */
DSM_API dsm_status_t dsm_engine_loss_scale(dsm_engine_t engine, double *scale);

/**
 * @brief The engine's counters, learning rate, loss scale and last gradient
 * norm (the fields of dsm_step_info_t; boundary and skipped describe the last
 * dsm_step()). Not collective.
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT when
 * info->size is too small.
 */
DSM_API dsm_status_t dsm_engine_step_info(dsm_engine_t engine, dsm_step_info_t *info);

/**
 * @brief Borrow the engine's mesh: a handle the engine owns, valid until
 * dsm_engine_free(). Do not free it (the _borrow_ in the name says so; every
 * other function that returns a handle gives one the caller frees). Not
 * collective.
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER.
 */
DSM_API dsm_status_t dsm_engine_borrow_mesh(dsm_engine_t engine, dsm_mesh_t *mesh);

/**
 * @brief Describe the engine: ZeRO stage, dtypes, optimizer, the flat layout
 * and this rank's memory by buffer next to the ZeRO paper's bytes per
 * parameter, and the communication counters.
 *
 * The memory part also gives what libdsm holds on this rank by kind (host
 * memory, device memory, node-shared memory), now and at its high-water mark
 * since the engine was created (memory.rank_bytes_now, rank_bytes_peak): the
 * peak of a micro-step with gathered parameters, gradient buffers and
 * ranges in flight. The counts are the process's: with several engines
 * alive at once, the peaks restart at each engine's creation.
 *
 * Not collective. The JSON form is specified in doc/engine.md. Free the
 * text with dsm_free().
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT for an
 * unknown format; DSM_ERR_OUT_OF_MEMORY.
 */
DSM_API dsm_status_t dsm_engine_describe(dsm_engine_t engine, dsm_format_t format, char **text);

/** dsm_engine_load_checkpoint() flag: load the parameters only (the module's
 *  weights); optimizer state, counters, loss scaler and LR schedule stay. */
#define DSM_CKPT_LOAD_MODULE_ONLY 0x1u
/** dsm_engine_load_checkpoint() flag: keep the engine's optimizer state. */
#define DSM_CKPT_LOAD_NO_OPTIMIZER 0x2u
/** dsm_engine_load_checkpoint() flag: keep the engine's LR schedule position. */
#define DSM_CKPT_LOAD_NO_LR_SCHEDULE 0x4u
/** dsm_engine_load_checkpoint() flag: non-strict. Load the tensors whose
 *  name and shape match the engine's; parameters missing from the file or
 *  of another shape keep their values, tensors of the file the engine lacks
 *  are ignored, and dsm_engine_load_report() lists all of them (a WARN too). */
#define DSM_CKPT_LOAD_NON_STRICT 0x8u
/** dsm_engine_load_checkpoint() flag: fall back. When the checkpoint asked
 *  for (the tag, or the one `latest` names) does not verify (missing,
 *  truncated, corrupt), load the newest checkpoint of the directory that
 *  does, with a WARN for each one skipped and why; dsm_engine_load_report()
 *  lists them. */
#define DSM_CKPT_LOAD_FALLBACK 0x10u

/**
 * @brief Save a checkpoint: DIR/TAG.h5, one parallel HDF5 file holding every
 * parameter's fp32 values and the optimizer state as full-shape tensors, and
 * the training state (doc/checkpoint.md), then DIR/latest naming TAG.
 *
 * Collective over the engine's ranks, at an accumulation boundary (after
 * the dsm_step() that ends a window, or before the first) with every buffer
 * released. Each rank writes the part it owns. The commit is atomic: the
 * file is written under a temporary name, flushed, and renamed by rank 0
 * only when every rank succeeded; `latest` is rewritten last (write, flush,
 * rename). A job killed at any point leaves the previous checkpoint and
 * `latest` loadable; a failed save returns the same error on every rank,
 * never leaves a rank waiting (a write that fails on one rank, such as a
 * full disk, stops every rank), and leaves no file under the final name,
 * except a failure after the rename (flushing the directory, rewriting
 * `latest`), which leaves the complete new file with `latest` on the
 * previous tag.
 *
 * With checkpoint.writer.decoupled true and MPI at MPI_THREAD_MULTIPLE, the
 * save is asynchronous: this call checks the arguments and the directory,
 * copies the state it saves into host memory of its own (one more copy of
 * this rank's master weights and optimizer states) and returns; a thread of
 * the library writes and commits the file while training goes on. The next
 * save, load, dsm_engine_checkpoint_wait() or dsm_engine_free() waits for it,
 * and its failure is returned by the first of these calls or by the first
 * dsm_step() after it ended (every rank alike, naming the checkpoint);
 * `latest` moves only when the file is complete. Below MPI_THREAD_MULTIPLE
 * the save is synchronous (a WARN says so once). While a save runs in the
 * background the application must not call HDF5 itself unless HDF5 is
 * thread-safe. With checkpoint.keep_last N > 0, a successful save then
 * removes the complete checkpoints of the directory beyond the N newest,
 * never the one `latest` names (doc/checkpoint.md).
 *
 * @p dir must name one directory that every rank sees: a
 * node-local directory or a different path on some ranks is DSM_ERR_IO on
 * every rank naming the rank and host. A file system without room for the
 * file is DSM_ERR_IO before anything is written. Temporaries of earlier
 * saves that were killed are removed.
 *
 * @param engine       the engine
 * @param dir          the checkpoint directory, created if missing
 * @param tag          the tag (1..200 characters of A-Z a-z 0-9 . _ -, not
 *                     starting with '.'), or NULL: "global_step<N>" with N
 *                     the global step count. Ranks passing different tags:
 *                     see checkpoint.tag_validation; rank 0's tag is used.
 * @param client_state bytes stored with the checkpoint and given back by
 *                     the load (rank 0's are stored); NULL when @p size is 0
 * @param size         bytes of @p client_state
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT (a
 * bad tag or directory); DSM_ERR_STATE (between boundaries, or a buffer
 * acquired); DSM_ERR_MISMATCH (tags differ and tag_validation is Fail);
 * DSM_ERR_IO; DSM_ERR_HDF5; DSM_ERR_NOT_SUPPORTED (built without HDF5);
 * DSM_ERR_MPI. Every rank returns the same status. A save that failed on
 * every rank leaves the engine usable; DSM_ERR_MISMATCH because the ranks
 * are in different engine calls (one saves while another steps) leaves the
 * engine failed on every rank: only dsm_engine_free(), then local, is left.
 */
DSM_API dsm_status_t dsm_engine_save_checkpoint(dsm_engine_t engine, const char *dir, const char *tag,
                                                const void *client_state, size_t size);

/**
 * @brief Load a checkpoint saved by dsm_engine_save_checkpoint() at any
 * data-parallel size, sequence-parallel size and ZeRO stage: each rank reads
 * the part it owns now.
 *
 * Collective over the engine's ranks, at an accumulation boundary with every
 * buffer released. The file's parameters must be exactly the engine's (names
 * and shapes); every tensor's checksum is verified. On any error every rank
 * returns it and the engine is unchanged. Loading at the sizes it was saved
 * at continues fp32 training bit for bit.
 *
 * @param engine  the engine
 * @param dir     the checkpoint directory
 * @param tag     the tag, or NULL: the one DIR/latest names
 * @param flags   0 or DSM_CKPT_LOAD_MODULE_ONLY, DSM_CKPT_LOAD_NO_OPTIMIZER,
 *                DSM_CKPT_LOAD_NO_LR_SCHEDULE, DSM_CKPT_LOAD_NON_STRICT,
 *                DSM_CKPT_LOAD_FALLBACK or'ed
 * @param[out] client_state the stored client bytes, to free with dsm_free()
 *                (NULL when none were stored); may be NULL to ignore them
 * @param[out] size their count; may be NULL
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT (bad
 * tag or flags); DSM_ERR_STATE; DSM_ERR_IO (missing file or `latest`, not
 * HDF5, truncated, wrong format or version, checksum mismatch);
 * DSM_ERR_MISMATCH (tensors that differ from the engine's parameters, all
 * listed, the message saying what differs); DSM_ERR_HDF5;
 * DSM_ERR_NOT_SUPPORTED; DSM_ERR_OUT_OF_MEMORY; DSM_ERR_MPI. Every rank
 * returns the same status. DSM_ERR_MISMATCH because the ranks are in
 * different engine calls (one loads while another steps) leaves the engine
 * failed on every rank: only dsm_engine_free(), then local, is left. An
 * asynchronous save still writing is waited for first; if it failed, its
 * failure is returned and nothing is loaded (call again to load). With
 * DSM_CKPT_LOAD_FALLBACK, DSM_ERR_IO when no checkpoint of the directory
 * verifies, naming each one tried and why; DSM_ERR_MISMATCH is never skipped.
 */
DSM_API dsm_status_t dsm_engine_load_checkpoint(dsm_engine_t engine, const char *dir, const char *tag,
                                                unsigned flags, void **client_state, size_t *size);

/**
 * @brief Initialize the engine's parameters, by tensor name, from a
 * checkpoint file or a safetensors file.
 *
 * The file is a checkpoint file written by dsm_engine_save_checkpoint()
 * (`DIR/TAG.h5`, saved at any rank count and ZeRO stage; its /params only)
 * or a safetensors file (F32, BF16 or F16 tensors, such as `dsm-ckpt
 * export` and Hugging Face write).
 *
 * Collective over the engine's ranks, at an accumulation boundary with every
 * buffer released. The kind of file is told by its bytes (the HDF5
 * signature, at byte 0 or after a user block; else safetensors). Every rank reads its own part of each
 * parameter (its ZeRO partition; frozen parameters whole); values become
 * the fp32 master weights exactly (BF16 and F16 widened exactly) and the
 * compute parameters are republished from them (rounded to nearest even
 * for fp16/bf16 compute). Only the parameters change: the optimizer state,
 * the step counters, the loss scaler and the LR schedule stay as they are
 * (fresh after dsm_engine_init()), and the gradients are cleared. A
 * checkpoint's checksums are verified; a safetensors file is validated
 * whole (header length against the file, JSON, every entry's dtype, shape
 * and data offsets) before any value is read. On any error every rank
 * returns it and the engine is unchanged.
 *
 * Strict by default: every parameter of the engine (trainable and frozen)
 * must be in the file with the same shape and the file must hold no other
 * tensor; the error names each difference (the tensor and both shapes).
 * With DSM_CKPT_LOAD_NON_STRICT the tensors that match by name and shape
 * are loaded, the other parameters keep their values, and
 * dsm_engine_load_report() lists what is missing, unexpected and of another
 * shape (a WARN too); its "weights" names the file.
 *
 * @param engine the engine
 * @param path   the checkpoint .h5 file or the .safetensors file; every
 *               rank must see the same file
 * @param flags  0 or DSM_CKPT_LOAD_NON_STRICT
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT (an
 * empty path, a directory, unknown flags); DSM_ERR_STATE; DSM_ERR_IO (a
 * missing or unreadable file, a truncated or corrupt file, an unknown
 * dtype, a checksum mismatch, ranks seeing different files);
 * DSM_ERR_MISMATCH (parameters missing, unexpected or of another shape,
 * all listed); DSM_ERR_NOT_SUPPORTED (a parameter stored in a dtype other
 * than F32, BF16 and F16, or libdsm built without HDF5); DSM_ERR_HDF5;
 * DSM_ERR_OUT_OF_MEMORY; DSM_ERR_MPI. Every rank returns the same status.
 */
DSM_API dsm_status_t dsm_engine_load_weights(dsm_engine_t engine, const char *path, unsigned flags);

/**
 * @brief Wait for the asynchronous checkpoint save (checkpoint.writer.
 * decoupled) to be written and committed, and return its outcome.
 *
 * Collective over the engine's ranks, anywhere between engine calls (no
 * accumulation boundary needed). Returns at once when no save is running.
 * After DSM_SUCCESS the checkpoint is complete on disk and `latest` names it.
 * A failure is reported once (by this call, or by the engine call that
 * reported it first) and leaves the engine usable.
 *
 * @param engine the engine
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_STATE (a failed
 * engine); DSM_ERR_MISMATCH (the ranks are in different engine calls); the
 * failure of the save: DSM_ERR_IO, DSM_ERR_HDF5, DSM_ERR_OUT_OF_MEMORY or
 * DSM_ERR_MPI with a message naming the checkpoint file. Every rank returns
 * the same status.
 */
DSM_API dsm_status_t dsm_engine_checkpoint_wait(dsm_engine_t engine);

/**
 * @brief What the last successful dsm_engine_load_checkpoint() or
 * dsm_engine_load_weights() did: the
 * checkpoint it loaded, those it skipped (DSM_CKPT_LOAD_FALLBACK) and why,
 * and with DSM_CKPT_LOAD_NON_STRICT the tensors missing from the file, the
 * tensors of the file the engine lacks, and those of another shape.
 *
 * Not collective (every rank holds the same report). The JSON form:
 * `{"loaded", "dir", "tag", "weights", "skipped": [{"tag", "reason"}], "missing",
 * "unexpected", "mismatched"}` (doc/checkpoint.md; "weights" is the file of
 * dsm_engine_load_weights(), "" after a checkpoint load); before any load,
 * "loaded" is false. Free the text with dsm_free().
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT for an
 * unknown format; DSM_ERR_OUT_OF_MEMORY.
 */
DSM_API dsm_status_t dsm_engine_load_report(dsm_engine_t engine, dsm_format_t format, char **text);

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
 * @defgroup dsm_sp Sequence parallelism (Ulysses)
 *
 * DeepSpeed-Ulysses (arXiv 2309.14509): the ranks of a sequence-parallel
 * group of size P each hold s/P consecutive tokens of every sequence; around
 * attention one all-to-all per tensor swaps "my tokens, all heads" for "all
 * tokens, my heads" (dsm_sp_seq_to_head()) and back (dsm_sp_head_to_seq()).
 *
 * Heads are split as evenly as possible: with H heads over P ranks, rank j
 * holds H/P heads, plus one more when j < H mod P (7 heads over 4 ranks:
 * 2, 2, 2, 1), starting at head j*(H/P) + min(j, H mod P); see
 * dsm_sp_head_range(). A tensor with DSM_SP_REPLICATE (the keys and values of
 * grouped-query attention when they have fewer heads than P) gives every rank
 * one head, head j*H/P, which needs P to be a multiple of H; with H >= P it
 * needs H to be a multiple of P. Each rank's key/value heads are then the
 * ones its query heads use provided the query heads are split evenly too (a
 * query head count that is a multiple of P and of the key/value head count):
 * the library does not know which query heads go with which key/value heads,
 * so it cannot check this; with an uneven query split (6 query and 2
 * key/value heads over 4 ranks) some rank would hold a query head without
 * its key/value head.
 *
 * Tensors are dense, row-major, in one of two layouts (dsm_sp_layout_t), of
 * any dtype (bytes are moved, never combined, except when head-to-sequence
 * sums the replicas of a DSM_SP_REPLICATE tensor: FLOAT32, FLOAT64, FLOAT16
 * and BFLOAT16 only, added in fp32 or fp64 and rounded once).
 * @{
 */

/** A sequence-parallel group (an opaque handle). */
typedef struct dsm_sp_s *dsm_sp_t;

/** Layouts of an attention tensor (b: batch, s: sequence, H: heads, d: head dim). */
typedef enum dsm_sp_layout {
    DSM_SP_BATCH_FIRST = 0, /**< [b, s, H, d] */
    DSM_SP_SEQ_FIRST = 1    /**< [s, b, H, d] */
} dsm_sp_layout_t;

/** dsm_sp_tensor_t::flags: replicate the heads over the ranks when there are fewer heads than ranks (GQA keys/values). */
#define DSM_SP_REPLICATE 1u

/**
 * The global shape of an attention tensor: the whole sequence and every
 * head, as the single-rank computation sees it.
 */
typedef struct dsm_sp_tensor {
    int64_t batch;          /**< b >= 1 */
    int64_t seq;            /**< s: the whole sequence, a multiple of the group size */
    int64_t heads;          /**< H >= 1 */
    int64_t head_dim;       /**< d >= 1 */
    dsm_sp_layout_t layout; /**< DSM_SP_BATCH_FIRST or DSM_SP_SEQ_FIRST */
    dsm_dtype_t dtype;      /**< element type */
    unsigned flags;         /**< 0 or DSM_SP_REPLICATE */
} dsm_sp_tensor_t;

/**
 * @brief Create the sequence-parallel context of a group of the mesh.
 *
 * Collective over the mesh. @p group names a dimension or a flattened group
 * (see dsm_mesh_size()); NULL means "sequence_parallel". The context owns
 * a communication backend over the group (shared memory inside a node, MPI
 * across nodes, as the engine's) and must be freed with dsm_sp_free()
 * before the mesh.
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_NOT_FOUND for an
 * unknown group; DSM_ERR_MISMATCH when ranks name different groups;
 * DSM_ERR_OUT_OF_MEMORY; DSM_ERR_MPI. Every rank returns the same status.
 */
DSM_API dsm_status_t dsm_sp_create(dsm_mesh_t mesh, const char *group, dsm_sp_t *sp);

/**
 * @brief Free a context and set the handle to NULL. NULL and a pointer to
 * NULL are allowed and do nothing (as every dsm_*_free()).
 *
 * Collective over the group. Memory from dsm_sp_alloc() that is still
 * allocated is released with it.
 * @return DSM_SUCCESS; DSM_ERR_MPI.
 */
DSM_API dsm_status_t dsm_sp_free(dsm_sp_t *sp);

/** @brief The group's size P. Not collective. @return DSM_SUCCESS; DSM_ERR_NULL_POINTER. */
DSM_API dsm_status_t dsm_sp_size(dsm_sp_t sp, int *size);

/** @brief This rank's rank in the group. Not collective. @return DSM_SUCCESS; DSM_ERR_NULL_POINTER. */
DSM_API dsm_status_t dsm_sp_rank(dsm_sp_t sp, int *rank);

/**
 * @brief Memory for the inputs of the transforms that the ranks of a node
 * can read directly: with it, a transform inside a node is one copy from the
 * peers' inputs into each rank's output.
 *
 * Collective over the group: every rank calls it in the same order (sizes
 * may differ, e.g. for head-sharded tensors with uneven heads). The memory is
 * 64-byte aligned and zeroed; inside a node it lies in a shared window
 * (MPI_Win_allocate_shared) of the group's backend, across nodes (or with
 * the plain MPI backend) it is private memory and the transforms work as
 * with any other memory. Tensors passed as the @p in of dsm_sp_seq_to_head()
 * and the other transforms that lie in such memory on every rank of a node
 * are read in place by the peers: no packing, no intermediate buffer, no
 * kernel copy; others go through the node's shared window or MPI.
 * The shared window lives in /dev/shm: when the node's ranks together ask
 * for more than it has room for (one rank's request is enough), every rank
 * returns DSM_ERR_OUT_OF_MEMORY, with a message naming /dev/shm, the bytes
 * needed and the bytes available, and nothing is allocated.
 * @param bytes 0 is allowed (a valid pointer to no bytes)
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_OUT_OF_MEMORY (on
 * every rank when one fails); DSM_ERR_MPI.
 */
DSM_API dsm_status_t dsm_sp_alloc(dsm_sp_t sp, size_t bytes, void **ptr);

/**
 * @brief Free memory from dsm_sp_alloc() and set @p *ptr to NULL, as the
 * other free functions do (a NULL @p *ptr is accepted and does nothing, so a
 * second free through the same variable is harmless).
 *
 * Collective over the group, in the same order on every rank (every rank
 * passes a block of its own, or every rank NULL).
 * @param ptr the address of the pointer dsm_sp_alloc() returned:
 *            dsm_sp_free_memory(sp, (void **)&buf)
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER (sp, ptr); DSM_ERR_INVALID_ARGUMENT
 * for a pointer that dsm_sp_alloc() of this context did not return (or a
 * copy of one freed already); DSM_ERR_MISMATCH (NULL on some ranks only);
 * DSM_ERR_MPI. On error @p *ptr is left as it was.
 */
DSM_API dsm_status_t dsm_sp_free_memory(dsm_sp_t sp, void **ptr);

/**
 * @brief The heads rank @p rank of a group of @p size holds after
 * dsm_sp_seq_to_head(): heads [*first, *first + *count).
 *
 * Not collective; needs no context. @p flags as dsm_sp_tensor_t::flags.
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT
 * (heads < 1, size < 1, rank outside [0, size), or DSM_SP_REPLICATE with
 * heads and size that do not divide, naming them).
 */
DSM_API dsm_status_t dsm_sp_head_range(int64_t heads, unsigned flags, int size, int rank, int64_t *first,
                                       int64_t *count);

/**
 * @brief Element counts of this rank's two forms of @p t: sequence-sharded
 * (b * s/P * H * d) and head-sharded (b * s * count * d, count from
 * dsm_sp_head_range()).
 *
 * Not collective. @return DSM_SUCCESS; DSM_ERR_NULL_POINTER;
 * DSM_ERR_INVALID_ARGUMENT for a bad shape (naming the field and value).
 */
DSM_API dsm_status_t dsm_sp_counts(dsm_sp_t sp, const dsm_sp_tensor_t *t, size_t *seq_sharded,
                                   size_t *head_sharded);

/**
 * @brief Sequence-to-head all-to-all: [b, s/P, H, d] (this rank's tokens,
 * every head) becomes [b, s, count, d] (every token in rank order, this
 * rank's heads), or the same in the sequence-first layout.
 *
 * Collective over the group: every rank passes the same @p t. One
 * all-to-all; the layout permutation is done while packing and unpacking.
 * @p in holds @p in_count elements (the sequence-sharded count of
 * dsm_sp_counts()), @p out @p out_count (the head-sharded count); they must
 * not overlap (DSM_ERR_INVALID_ARGUMENT "in and out overlap").
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT (a bad
 * shape, s not a multiple of P, a wrong count: naming the value and the
 * expected one; overlapping in and out); DSM_ERR_MISMATCH when ranks pass different shapes
 * (detected before any data moves); DSM_ERR_MPI. Every rank returns the
 * same status.
 */
DSM_API dsm_status_t dsm_sp_seq_to_head(dsm_sp_t sp, const dsm_sp_tensor_t *t, const void *in,
                                        size_t in_count, void *out, size_t out_count);

/**
 * @brief Head-to-sequence all-to-all, the inverse of dsm_sp_seq_to_head():
 * [b, s, count, d] becomes [b, s/P, H, d] (used for the attention output and
 * for gradients in the backward pass).
 *
 * For a DSM_SP_REPLICATE tensor the copies of a head are summed (the
 * gradient of the replication), so that a round trip multiplies such a
 * tensor by the number of copies of each head (P/H when H < P).
 * Counts, errors and collectiveness as dsm_sp_seq_to_head(), with the roles
 * of the two counts swapped.
 */
DSM_API dsm_status_t dsm_sp_head_to_seq(dsm_sp_t sp, const dsm_sp_tensor_t *t, const void *in,
                                        size_t in_count, void *out, size_t out_count);

/**
 * @brief dsm_sp_seq_to_head() of @p n tensors in one all-to-all (q, k and v
 * of attention together: n = 3, the shapes may differ, e.g. in heads).
 *
 * @p in, @p in_count, @p out, @p out_count are arrays of @p n. Each output
 * must be disjoint from every input and from every other output (the
 * outputs are written while the inputs are still read, in any order); the
 * inputs may share memory (the same tensor sent twice). Errors as
 * dsm_sp_seq_to_head(), naming the tensor's index; overlapping buffers are
 * DSM_ERR_INVALID_ARGUMENT naming both ("in[1] and out[0] overlap",
 * "out[0] and out[1] overlap").
 */
DSM_API dsm_status_t dsm_sp_seq_to_head_n(dsm_sp_t sp, int n, const dsm_sp_tensor_t t[],
                                          const void *const in[], const size_t in_count[],
                                          void *const out[], const size_t out_count[]);

/**
 * @brief dsm_sp_head_to_seq() of @p n tensors in one all-to-all; arrays,
 * disjoint outputs and errors as dsm_sp_seq_to_head_n().
 */
DSM_API dsm_status_t dsm_sp_head_to_seq_n(dsm_sp_t sp, int n, const dsm_sp_tensor_t t[],
                                          const void *const in[], const size_t in_count[],
                                          void *const out[], const size_t out_count[]);

/** The ignore index of the labels: positions whose loss does not count. */
#define DSM_IGNORE_INDEX (-100)

/**
 * @brief This rank's chunk of a batch of sequences for causal language
 * modelling.
 *
 * Not collective; needs no context. @p tokens, @p positions and @p labels
 * are [batch, seq] (row-major); @p positions NULL means 0..seq-1, @p labels
 * NULL means the tokens. The labels are shifted: position t is labelled with
 * labels[t + 1], and the last position with DSM_IGNORE_INDEX. A sequence is
 * cut into @p size chunks of chunk = ceil(seq / size) positions; rank @p rank
 * gets positions [rank * chunk, (rank + 1) * chunk), and positions past the
 * end of the sequence are padding: token @p pad_token, label
 * DSM_IGNORE_INDEX, and a position that continues the row's count (the
 * row's last position plus one, plus two, ...; with @p positions NULL simply
 * its index). Outputs are [batch, chunk] and must not overlap the inputs;
 * @p out_len is their capacity in elements (at least batch * chunk). @p
 * valid (may be NULL) gets the number of labels of the chunk that are not
 * DSM_IGNORE_INDEX, for dsm_sp_loss().
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT (batch
 * or seq < 1, size < 1, rank outside [0, size), out_len too small, batch *
 * seq too large to address, a padding position past INT64_MAX: naming the
 * value).
 */
DSM_API dsm_status_t dsm_sp_shard_batch(int size, int rank, int64_t batch, int64_t seq, const int64_t *tokens,
                                        const int64_t *positions, const int64_t *labels, int64_t pad_token,
                                        size_t out_len, int64_t *out_tokens, int64_t *out_positions,
                                        int64_t *out_labels, int64_t *chunk, int64_t *valid);

/**
 * @brief The token-weighted mean loss over the group and the scale of this
 * rank's gradients.
 *
 * Collective over the group. Each rank passes the sum of its per-token
 * losses and the number of tokens that count (labels not
 * DSM_IGNORE_INDEX). @p mean gets sum(loss_sum) / sum(tokens) over the
 * group; @p grad_scale gets 1 / sum(tokens): a rank that multiplies the
 * gradient of its local loss sum by it makes the engine's sum over the group
 * (see dsm_engine_init()) the gradient of the whole sequence's mean loss.
 * When no token of the group counts, both are 0.
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT
 * (negative tokens, non-finite loss sum: on every rank); DSM_ERR_MPI.
 */
DSM_API dsm_status_t dsm_sp_loss(dsm_sp_t sp, double loss_sum, int64_t tokens, double *mean, double *grad_scale);

/** @} */

/**
 * @defgroup dsm_sampler Data-parallel sampler
 * @{
 */

/** A data-parallel sampler (an opaque handle). */
typedef struct dsm_sampler_s *dsm_sampler_t;

/**
 * Options of dsm_sampler_create(). Initialize with
 * DSM_SAMPLER_OPTIONS_INITIALIZER.
 */
typedef struct dsm_sampler_options {
    size_t size;   /**< sizeof(dsm_sampler_options_t) as compiled by the caller (a smaller, older struct keeps the defaults of the fields it lacks) */
    int shuffle;   /**< nonzero (default 1): a new permutation of the samples each epoch */
    uint64_t seed; /**< seed of the permutation (default 0); the epoch is mixed in */
    int drop_last; /**< 0 (default): pad as PyTorch's DistributedSampler does; nonzero: drop the tail */
} dsm_sampler_options_t;

/** Initializer of dsm_sampler_options_t. */
#define DSM_SAMPLER_OPTIONS_INITIALIZER { sizeof(dsm_sampler_options_t), 1, 0, 0 }

/**
 * @brief A sampler over a dataset of @p num_samples samples for rank @p rank
 * of @p replicas data-parallel replicas, in micro-batches of @p micro_batch.
 *
 * Not collective. Each epoch the indices 0..num_samples-1 are permuted
 * (options->shuffle; the same permutation on every rank for a seed and an
 * epoch), then, as torch.utils.data.DistributedSampler: without drop_last
 * the list is padded to a multiple of @p replicas by repeating it from its
 * start, with drop_last it is cut to a multiple; rank r takes every
 * replicas-th index from position r. Its indices are cut into micro-batches
 * of @p micro_batch; without drop_last the last one may be shorter, with
 * drop_last a short last micro-batch is dropped. Ranks of one
 * sequence-parallel group pass the same data-parallel rank and so get the
 * same samples.
 * @p options may be NULL (the defaults).
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT
 * (num_samples < 1, replicas < 1, rank outside [0, replicas), micro_batch
 * < 1, options->size smaller than a size_t or larger than this library's
 * struct, or no micro-batch at all with drop_last: naming the value);
 * DSM_ERR_OUT_OF_MEMORY (also for a shuffled dataset whose permutation, 8
 * bytes per sample, cannot be addressed).
 */
DSM_API dsm_status_t dsm_sampler_create(int64_t num_samples, int replicas, int rank, int64_t micro_batch,
                                        const dsm_sampler_options_t *options, dsm_sampler_t *sampler);

/**
 * @brief dsm_sampler_create() with the engine's data-parallel size and rank
 * and its train_micro_batch_size_per_gpu.
 *
 * Not collective. @return as dsm_sampler_create().
 */
DSM_API dsm_status_t dsm_sampler_create_for_engine(dsm_engine_t engine, int64_t num_samples,
                                                   const dsm_sampler_options_t *options, dsm_sampler_t *sampler);

/**
 * @brief Free a sampler and set the handle to NULL. NULL and a pointer to
 * NULL are allowed and do nothing (as every dsm_*_free()). Not collective.
 * @return DSM_SUCCESS.
 */
DSM_API dsm_status_t dsm_sampler_free(dsm_sampler_t *sampler);

/**
 * @brief Micro-batches per epoch on each rank (the same on every rank).
 *
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER.
 */
DSM_API dsm_status_t dsm_sampler_num_batches(dsm_sampler_t sampler, int64_t *num_batches);

/**
 * @brief The sample indices of micro-batch @p batch of epoch @p epoch on this rank.
 *
 * Not collective; the permutation of an epoch is computed once and kept
 * until another epoch is asked for. @p indices has room for @p len
 * elements (micro_batch is always enough); @p count gets how many were
 * written.
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT
 * (epoch < 0, batch outside [0, num_batches), len too small: naming the
 * value); DSM_ERR_OUT_OF_MEMORY.
 */
DSM_API dsm_status_t dsm_sampler_batch(dsm_sampler_t sampler, int64_t epoch, int64_t batch, int64_t *indices,
                                       size_t len, int64_t *count);

/**
 * @brief Where training resumes: the epoch and micro-batch that follow
 * @p micro_steps micro-batches (the engine's micro_steps counter, which a
 * checkpoint restores; dsm_engine_step_info()).
 *
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT for
 * negative micro_steps.
 */
DSM_API dsm_status_t dsm_sampler_locate(dsm_sampler_t sampler, int64_t micro_steps, int64_t *epoch,
                                        int64_t *batch);

/**
 * @brief The samples consumed once micro-batch @p batch of @p epoch has been
 * taken on every rank, a position valid at any number of replicas: give it
 * to dsm_sampler_resume() of a sampler of another data-parallel size.
 *
 * Not collective. @p samples gets epoch x num_samples plus the positions of
 * the epoch's (permuted) list the replicas have taken: (batch + 1) x
 * micro_batch x replicas, or num_samples after the epoch's last
 * micro-batch (its padding or dropped tail included). Store it with the
 * checkpoint (its client state) at the micro-batch the checkpoint follows.
 * dsm_sampler_locate() on a restored micro_steps is right only at the same
 * data-parallel size and micro-batch.
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT
 * (epoch < 0, batch outside the epoch's micro-batches, an epoch whose
 * position an int64_t cannot count: naming the value).
 */
DSM_API dsm_status_t dsm_sampler_position(dsm_sampler_t sampler, int64_t epoch, int64_t batch, int64_t *samples);

/**
 * @brief Continue after @p samples consumed samples (a dsm_sampler_position()
 * of a sampler over the same dataset, seed and shuffle, at any number of
 * replicas and any micro-batch): @p epoch gets the epoch to continue with,
 * from its micro-batch 0.
 *
 * Not collective; every rank of the data-parallel group passes the same
 * @p samples. The epoch samples / num_samples then serves the rest of its
 * list, from the position samples % num_samples on, split over this
 * sampler's replicas as a whole epoch is (padded by repeating the epoch's
 * list from its start, or cut with drop_last): no sample of the run before
 * is seen again, except as padding, and none is skipped. At the same
 * number of replicas and micro-batch it serves exactly the micro-batches
 * the run would have. dsm_sampler_epoch_batches() gives its
 * (smaller) number of micro-batches; later epochs are whole. When nothing
 * is left of that epoch here (drop_last), @p epoch is the next one. A
 * second call replaces the first.
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT for
 * negative samples.
 */
DSM_API dsm_status_t dsm_sampler_resume(dsm_sampler_t sampler, int64_t samples, int64_t *epoch);

/**
 * @brief Micro-batches of @p epoch on every rank: dsm_sampler_num_batches(),
 * or fewer for the epoch dsm_sampler_resume() starts inside.
 *
 * Not collective. @return DSM_SUCCESS; DSM_ERR_NULL_POINTER;
 * DSM_ERR_INVALID_ARGUMENT for epoch < 0.
 */
DSM_API dsm_status_t dsm_sampler_epoch_batches(dsm_sampler_t sampler, int64_t epoch, int64_t *num_batches);

/** @} */

#ifdef __cplusplus
}
#endif

#endif /* DSM_H */
