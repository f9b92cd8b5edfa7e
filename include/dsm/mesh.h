/*
 * libdsm C API, part: the device mesh.
 *
 * Included by <dsm.h>, the header programs include; it also compiles on
 * its own. See dsm.h for the conventions every part follows.
 */
#ifndef DSM_MESH_H
#define DSM_MESH_H

#include "dsm/base.h"

#ifdef __cplusplus
extern "C" {
#endif

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

#ifdef __cplusplus
}
#endif

#endif /* DSM_MESH_H */
