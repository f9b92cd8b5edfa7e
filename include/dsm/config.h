/*
 * libdsm C API, part: DeepSpeed configurations.
 *
 * Included by <dsm.h>, the header programs include; it also compiles on
 * its own. See dsm.h for the conventions every part follows.
 */
#ifndef DSM_CONFIG_H
#define DSM_CONFIG_H

#include "dsm/base.h"
#include "dsm/mesh.h"

#ifdef __cplusplus
extern "C" {
#endif

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

#ifdef __cplusplus
}
#endif

#endif /* DSM_CONFIG_H */
