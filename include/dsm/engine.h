/*
 * libdsm C API, part: the training engine.
 *
 * Included by <dsm.h>, the header programs include; it also compiles on
 * its own. See dsm.h for the conventions every part follows.
 */
#ifndef DSM_ENGINE_H
#define DSM_ENGINE_H

#include "dsm/base.h"
#include "dsm/config.h"
#include "dsm/mesh.h"

#ifdef __cplusplus
extern "C" {
#endif

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
 * dsm_convert() (dsm/base.h) moves data between dtypes. Checkpoints of the
 * engine: dsm/checkpoint.h.
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
 * @brief dsm_engine_init_with_options() with a configuration already read
 * by dsm_config_load(), dsm_config_load_for_mesh() or dsm_config_resolve():
 * the engine reads no file.
 *
 * The text and path forms (dsm_engine_init(), dsm_engine_init_with_options(),
 * dsm_engine_init_comm()) read their configuration once and build the
 * engine as this call does. The batch values and the data-parallel size are
 * resolved again for @p mesh from the keys the text gave (a configuration
 * loaded over the world and an engine on a mesh with a "data_parallel"
 * dimension give that dimension's size). The ranks agree that they hold the
 * same resolved configuration. @p config stays the caller's: free it with
 * dsm_config_free() when it is no longer needed (at once is fine).
 *
 * Collective over the mesh.
 * @param mesh    the mesh (not NULL)
 * @param config  the configuration (not NULL)
 * @param params  @p nparams parameter descriptions
 * @param nparams number of parameters, 1..1000000
 * @param options the options, or NULL for DSM_ENGINE_OPTIONS_INITIALIZER
 * @param[out] engine the engine; NULL on error. Free with dsm_engine_free().
 * @return as dsm_engine_init_with_options() (DSM_ERR_NULL_POINTER for a NULL
 * @p config; DSM_ERR_CONFIG for batch values that do not divide for this
 * mesh; DSM_ERR_MISMATCH for configurations that differ between ranks,
 * naming the first key that differs). Every rank returns the same status.
 */
DSM_API dsm_status_t dsm_engine_init_with_config(dsm_mesh_t mesh, dsm_config_t config,
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
 *
 * The one line of the backward pass: the gradient of the micro-batch's mean
 * loss, times this scale, is what a program adds into the gradients
 * (dsm_engine_grad_add_f32(), dsm_engine_grad_acquire()). Do not divide by
 * gradient_accumulation_steps: dsm_step() divides the accumulated gradients
 * by loss scale x gradient_accumulation_steps itself. Read the scale before
 * each micro-step's backward: it changes after an overflow.
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER.
 */
DSM_API dsm_status_t dsm_engine_loss_scale(dsm_engine_t engine, double *scale);

/**
 * @brief The loss of a step averaged over the engine's ranks: over the
 * data-parallel ranks, and over the sequence-parallel ranks that each hold a
 * part of the sequence.
 *
 * @p *mean = sum(loss x weight) / sum(weight) over every rank of the engine,
 * where @p weight is how many samples or tokens this rank's @p loss averages
 * (1 on every rank when all average the same number: the plain mean of the
 * ranks' losses). A rank with weight 0 adds nothing. Every rank gets the
 * same value. The sum goes through libdsm, under the watchdog
 * (DSM_COMM_TIMEOUT): a rank that stops answering ends the job with a
 * message naming this wait, as in every engine collective.
 *
 * Collective over the engine's ranks (an engine call like dsm_step(): every
 * rank calls it at the same point).
 * @param engine the engine
 * @param loss   this rank's loss (a NaN or Inf loss makes the mean NaN or Inf)
 * @param weight how many samples or tokens @p loss averages: finite, >= 0
 * @param[out] mean the mean over the engine's ranks
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER (engine, mean);
 * DSM_ERR_INVALID_ARGUMENT (a negative or non-finite weight, naming it;
 * weights that are 0 on every rank); DSM_ERR_STATE (a failed engine);
 * DSM_ERR_MISMATCH (ranks in different engine calls); DSM_ERR_MPI. Every
 * rank returns the same status.
 */
DSM_API dsm_status_t dsm_engine_mean_loss(dsm_engine_t engine, double loss, double weight, double *mean);

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

/**
 * This rank's memory of an engine by what it holds (dsm_engine_memory()):
 * the model state it owns, and the transient buffers of a micro-step now and
 * at their high-water marks since the engine was created. Bytes. Initialize
 * with DSM_ENGINE_MEMORY_INITIALIZER: the library writes only the first
 * @c size bytes.
 */
typedef struct dsm_engine_memory {
    size_t size;                   /**< sizeof(dsm_engine_memory_t) as compiled by the caller */
    /** The partitions this rank owns, allocated at creation: its parameters (whole at stages 0-2;
     *  at stage 3 its partition and the persistent ones), its gradient partition or the flat
     *  gradient, master weights, optimizer state, frozen parameters, hpZ's secondary partition. */
    uint64_t partitions;
    uint64_t gathered_params;      /**< ZeRO-3 parameters gathered now (acquired, prefetched, ranges) */
    uint64_t gathered_params_peak; /**< their high-water mark */
    uint64_t grad_buffers;         /**< ZeRO-2/3 gradient buffers handed out and gradients waiting for their bucket, now */
    uint64_t grad_buffers_peak;    /**< their high-water mark */
    uint64_t staging;              /**< the reduction buckets and the collectives' staging, now */
    uint64_t staging_peak;         /**< their high-water mark */
    uint64_t total;                /**< everything libdsm holds on this rank (host, device, node-shared memory), now */
    uint64_t total_peak;           /**< its high-water mark */
} dsm_engine_memory_t;

/** Initializer of dsm_engine_memory_t. */
#define DSM_ENGINE_MEMORY_INITIALIZER { sizeof(dsm_engine_memory_t), 0, 0, 0, 0, 0, 0, 0, 0, 0 }

/**
 * @brief This rank's memory by what it holds: the partitions it owns, the
 * gathered ZeRO-3 parameters, the gradient buffers and the staging, each
 * now and at its high-water mark since the engine was created, and the
 * total (dsm_engine_describe()'s memory.rank_bytes_now and rank_bytes_peak
 * summed over the kinds of memory).
 *
 * The model-state memory of a micro-step is at most partitions +
 * gathered_params_peak + grad_buffers_peak (the peaks may fall at different
 * times). Idle buffers the engine keeps for reuse count in the total only.
 * The counts are the process's: with several engines alive at once, the
 * transient counts and the peaks are those of all of them.
 *
 * Not collective. Thread safe with other readers.
 * @param engine the engine
 * @param[out] memory the figures; memory->size must be set (DSM_ENGINE_MEMORY_INITIALIZER)
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT for a
 * bad handle or a memory->size below sizeof(size_t) (naming it).
 */
DSM_API dsm_status_t dsm_engine_memory(dsm_engine_t engine, dsm_engine_memory_t *memory);

/** @} */

#ifdef __cplusplus
}
#endif

/* The engine's checkpoints are declared in their own part; a program that
 * includes this part alone (or dsm/torch.h) still sees them. */
#include "dsm/checkpoint.h"

#endif /* DSM_ENGINE_H */
