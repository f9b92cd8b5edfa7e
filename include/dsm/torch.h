/*
 * libdsm PyTorch bridge (libdsm_torch): train a PyTorch model on the engine
 * from C, C++ and Fortran.
 *
 * Not included by <dsm.h>: include <dsm/torch.h> and link -ldsm_torch -ldsm
 * (pkg-config dsm-torch; CMake: find_package(dsm COMPONENTS Torch), target
 * dsm::torch). The bridge is built when configure finds LibTorch
 * (--with-libtorch); it is written against the public C API of libdsm only.
 * C++ programs with a LibTorch C++ module use <dsm/torch.hpp> beside it.
 * The conventions are dsm.h's: every function returns a dsm_status_t,
 * outputs come last, dsm_last_error() gives the message of a failure.
 */
#ifndef DSM_TORCH_H
#define DSM_TORCH_H

#include "dsm/base.h"
#include "dsm/mesh.h"
#include "dsm/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * @defgroup dsm_torch PyTorch bridge
 *
 * A model is a TorchScript file (torch.jit.script(...).save() in Python) or
 * a LibTorch C++ module (<dsm/torch.hpp>) handed to a libdsm engine: the
 * model's named parameters become the engine's parameters with the same
 * names ("0.weight", "encoder.layers.1.linear1.bias"), the ones that do not
 * require a gradient frozen. The parameter tensors of the model are views of
 * the memory the engine hands out (dsm_engine_param_acquire()), and autograd
 * adds the gradients straight into the engine's gradient buffers
 * (dsm_engine_grad_acquire()): no copy in either direction. Everything the
 * DeepSpeed configuration says applies: ZeRO 0-3, mixed precision and loss
 * scaling, clipping, LR schedules, overlap, checkpoints that load on any
 * rank count and stage.
 *
 * Buffers (tensors registered as buffers, such as BatchNorm's running
 * statistics) are not engine parameters: every rank keeps its own copy in
 * the model, rank 0's values are broadcast to every rank at creation and
 * before each training step's forward (as DistributedDataParallel's
 * broadcast_buffers), and they are saved in the checkpoint's client state
 * and restored by dsm_torch_load_checkpoint().
 *
 * Under ZeRO-3 a model that is a sequence of blocks (a TorchScript
 * nn.Sequential at the top, or a C++ torch::nn::Sequential) runs block by
 * block: each block's parameters are gathered around its forward and again
 * around its backward (the block's forward is recomputed from its saved
 * input there), so at most about one block is gathered at a time. Other
 * models gather all their parameters for the step. dsm_torch_model_describe()
 * says which mode a model got and why; dsm_torch_options_t::zero3_mode
 * chooses.
 *
 * Thread safety: a model is used by one thread at a time; different models
 * may be used by different threads as their engines allow.
 * @{
 */

/** Opaque handle to a model on an engine. */
typedef struct dsm_torch_model_s *dsm_torch_model_t;

/** Largest number of dimensions of a dsm_torch_tensor_t. */
#define DSM_TORCH_MAX_DIMS 8

/** Where the memory of a dsm_torch_tensor_t lives. Values are pinned. */
typedef enum dsm_torch_memory {
    DSM_TORCH_MEMORY_HOST = 0,  /**< host memory */
    DSM_TORCH_MEMORY_CUDA = 1   /**< CUDA device memory (a CUDA LibTorch and a device-resident engine) */
} dsm_torch_memory_t;

/**
 * One array of the caller, seen by the model as a tensor without a copy
 * when its dtype is the one the model expects.
 *
 * Row-major (C order) by default: shape[0] is the outermost dimension, the
 * last one varies fastest, as in PyTorch. With @c column_major 1 the shape
 * is given in Fortran order (shape[0] varies fastest, what Fortran's
 * shape(a) returns) and the model sees the dimensions reversed: a Fortran
 * array x(features, batch) is the tensor [batch, features] (the same memory;
 * nothing is transposed). The Fortran module dsm_torch sets it.
 */
typedef struct dsm_torch_tensor {
    void *data;                          /**< the first element */
    dsm_dtype_t dtype;                   /**< its element type */
    int ndim;                            /**< 0 .. DSM_TORCH_MAX_DIMS */
    int64_t shape[DSM_TORCH_MAX_DIMS];   /**< ndim sizes, each >= 0 */
    dsm_torch_memory_t memory;           /**< DSM_TORCH_MEMORY_HOST */
    int column_major;                    /**< 1: shape in Fortran order (reversed for the model) */
} dsm_torch_tensor_t;

/** Initializer of dsm_torch_tensor_t: an fp32 scalar in host memory, row-major. */
#define DSM_TORCH_TENSOR_INITIALIZER { NULL, DSM_FLOAT32, 0, {0, 0, 0, 0, 0, 0, 0, 0}, DSM_TORCH_MEMORY_HOST, 0 }

/** The loss a training step computes (dsm_torch_options_t::loss). Values are pinned. */
typedef enum dsm_torch_loss {
    /** The configuration's "torch": {"loss": "mse" | "cross_entropy" | "model"}; "mse" when absent. */
    DSM_TORCH_LOSS_CONFIG = 0,
    /** Mean squared error of the model's output against the labels (torch.nn.functional.mse_loss, mean). */
    DSM_TORCH_LOSS_MSE = 1,
    /** Cross entropy of the output's logits [N, C] (or [N, C, d...]) against int64 class labels [N]
     *  (torch.nn.functional.cross_entropy, mean). */
    DSM_TORCH_LOSS_CROSS_ENTROPY = 2,
    /** The model returns its loss: forward(inputs..., labels) (labels only when given) returns a scalar. */
    DSM_TORCH_LOSS_MODEL = 3
} dsm_torch_loss_t;

/** How ZeRO-3 gathers the parameters (dsm_torch_options_t::zero3_mode). Values are pinned. */
typedef enum dsm_torch_zero3_mode {
    DSM_TORCH_ZERO3_AUTO = 0,   /**< block by block for a sequence of blocks, else whole */
    DSM_TORCH_ZERO3_WHOLE = 1,  /**< gather every parameter for the step */
    DSM_TORCH_ZERO3_BLOCKS = 2  /**< block by block; DSM_ERR_NOT_SUPPORTED for a model that is not a sequence */
} dsm_torch_zero3_mode_t;

/**
 * Options of dsm_torch_model_create(). Initialize with
 * DSM_TORCH_OPTIONS_INITIALIZER so that fields added in later versions get
 * their defaults: the library reads only the first @c size bytes.
 */
typedef struct dsm_torch_options {
    size_t size;                        /**< sizeof(dsm_torch_options_t) as compiled by the caller */
    dsm_torch_loss_t loss;              /**< DSM_TORCH_LOSS_CONFIG */
    dsm_torch_zero3_mode_t zero3_mode;  /**< DSM_TORCH_ZERO3_AUTO */
    /** The engine's options (device, backend, CUDA device), or NULL: DSM_DEVICE_HOST for a CPU
     *  LibTorch, DSM_DEVICE_DEFAULT for a CUDA one. */
    const dsm_engine_options_t *engine_options;
} dsm_torch_options_t;

/** Default options. */
#define DSM_TORCH_OPTIONS_INITIALIZER { sizeof(dsm_torch_options_t), DSM_TORCH_LOSS_CONFIG, DSM_TORCH_ZERO3_AUTO, NULL }

/**
 * @brief Load a TorchScript model and create an engine for its parameters.
 *
 * Collective over the mesh. Every rank loads @p model_path; the parameters
 * of rank 0's file initialize the engine (dsm_engine_init(): broadcast), and
 * every rank checks that its own file holds the same values: a rank whose
 * parameters differ fails every rank with DSM_ERR_MISMATCH naming the
 * parameter, the rank and the first element that differs (seed the
 * generator the same way on every rank, or save one file). The buffers are
 * broadcast from rank 0.
 *
 * The configuration is a DeepSpeed JSON file or inline JSON, read as
 * dsm_engine_init() reads it; an optional top-level "torch" block (taken
 * out before the engine sees the rest) names the loss: {"loss": "mse"}.
 *
 * @param mesh       the mesh (not NULL); the engine keeps its own reference
 * @param model_path a TorchScript file (torch.jit.save)
 * @param config     path of a DeepSpeed JSON file, or inline JSON starting with '{'
 * @param options    the options, or NULL for DSM_TORCH_OPTIONS_INITIALIZER
 * @param[out] model the model; NULL on error. Free with dsm_torch_model_free().
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT (bad
 * options, naming the field; a model without parameters); DSM_ERR_IO (a
 * missing or unreadable file, naming it and why); DSM_ERR_NOT_SUPPORTED (a
 * file that needs an operator this LibTorch lacks, naming the operator, the
 * LibTorch version and the PyTorch version that wrote the file; zero3_mode
 * DSM_TORCH_ZERO3_BLOCKS for a model that is not a sequence of blocks);
 * DSM_ERR_MISMATCH (parameters that differ between ranks); the errors of
 * dsm_engine_init_with_options(). Every rank returns the same status.
 */
DSM_API dsm_status_t dsm_torch_model_create(dsm_mesh_t mesh, const char *model_path, const char *config,
                                            const dsm_torch_options_t *options, dsm_torch_model_t *model);

/**
 * @brief Free a model, its engine and the loaded module, and set @p *model
 * to NULL; NULL is a no-op.
 *
 * Collective over the engine's ranks (dsm_engine_free()).
 * @return DSM_SUCCESS; the errors of dsm_engine_free(). @p *model is NULL
 * afterwards in every case.
 */
DSM_API dsm_status_t dsm_torch_model_free(dsm_torch_model_t *model);

/**
 * @brief Borrow the model's engine (owned by the model, valid until
 * dsm_torch_model_free()): for dsm_engine_describe(), dsm_engine_memory(),
 * the stop signal, the metrics. Do not free it, and do not acquire its
 * parameters while a bridge call runs.
 *
 * Not collective. Thread safe with other readers.
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER.
 */
DSM_API dsm_status_t dsm_torch_model_borrow_engine(dsm_torch_model_t model, dsm_engine_t *engine);

/**
 * @brief One training micro-step on this rank's micro-batch: forward, the
 * loss, backward into the engine's gradient buffers, then dsm_step() (the
 * optimizer runs at the gradient-accumulation boundary, every
 * gradient_accumulation_steps calls).
 *
 * Collective over the engine's ranks (every rank calls it with its own
 * data). The inputs are passed to forward() in order; floating-point inputs
 * in another dtype than the model's parameters are converted (a copy),
 * others are viewed as they are. The loss is the configured one
 * (dsm_torch_loss_t); its gradient is multiplied by the loss scale. The
 * engine averages the gradients over the data-parallel ranks and over the
 * accumulation window, as DistributedDataParallel with the loss divided by
 * the accumulation steps does.
 *
 * Bad arguments (a NULL pointer, an ndim or dtype out of range, inputs whose
 * shape or dtype the model rejects, labels whose shape does not match the
 * output) fail every rank with the status of the rank that found them and
 * a message naming the argument, its shape and dtype and the model's
 * complaint; the engine stays usable.
 *
 * @param model   the model
 * @param inputs  @p ninputs arrays
 * @param ninputs 1 .. 64
 * @param labels  the labels (NULL only with DSM_TORCH_LOSS_MODEL)
 * @param[out] loss this rank's loss of the micro-batch (before scaling); may be NULL
 * @param[out] info what dsm_step() did; may be NULL (initialize with DSM_STEP_INFO_INITIALIZER)
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT;
 * DSM_ERR_MISMATCH; the errors of dsm_step(). Every rank returns the same status.
 */
DSM_API dsm_status_t dsm_torch_train_step(dsm_torch_model_t model, const dsm_torch_tensor_t *inputs, int ninputs,
                                          const dsm_torch_tensor_t *labels, double *loss, dsm_step_info_t *info);

/**
 * @brief Run the model's forward on this rank's inputs without gradients
 * and write its output into @p output.
 *
 * Collective over the engine's ranks under ZeRO-3 (the parameters are
 * gathered), local otherwise; call it on every rank all the same. @p output
 * describes the caller's array: its element count must equal the output's
 * (the shape is not checked beyond that; the values are written row-major,
 * or in Fortran order with column_major), and its dtype is converted to.
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT (bad
 * inputs as dsm_torch_train_step(); an output of another size, naming both
 * shapes); DSM_ERR_MISMATCH. Every rank returns the same status.
 */
DSM_API dsm_status_t dsm_torch_inference(dsm_torch_model_t model, const dsm_torch_tensor_t *inputs, int ninputs,
                                         dsm_torch_tensor_t *output);

/**
 * @brief Save a checkpoint through the engine (dsm_engine_save_checkpoint():
 * DIR/TAG.h5 with the parameters and optimizer state as full tensors, that
 * loads on any rank count and ZeRO stage), with the model's buffers in its
 * client state.
 *
 * Collective over the engine's ranks, between training steps at an
 * accumulation boundary. @p tag NULL: "global_step<N>".
 * @return as dsm_engine_save_checkpoint().
 */
DSM_API dsm_status_t dsm_torch_save_checkpoint(dsm_torch_model_t model, const char *dir, const char *tag);

/**
 * @brief Load a checkpoint of dsm_torch_save_checkpoint() (or of
 * dsm_engine_save_checkpoint() with the same parameter names: then the
 * buffers keep their values) at any rank count and ZeRO stage.
 *
 * Collective over the engine's ranks. @p tag NULL: the one DIR/latest names.
 * @p flags: as dsm_engine_load_checkpoint().
 * @return as dsm_engine_load_checkpoint(); DSM_ERR_IO for a client state
 * that is not the bridge's, or buffers that do not match the model's (naming
 * the buffer).
 */
DSM_API dsm_status_t dsm_torch_load_checkpoint(dsm_torch_model_t model, const char *dir, const char *tag,
                                               unsigned flags);

/**
 * @brief Write the trained parameters and buffers as a safetensors file
 * (fp32 parameters; buffers in their own dtype), readable by
 * safetensors.torch.load_file() and by dsm_engine_load_weights().
 *
 * Collective over the engine's ranks (ZeRO-3 gathers each parameter); rank
 * 0 writes the file (under a temporary name, renamed when complete).
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_IO (naming the file);
 * the errors of dsm_engine_param_read_f32(). Every rank returns the same status.
 */
DSM_API dsm_status_t dsm_torch_export_safetensors(dsm_torch_model_t model, const char *path);

/**
 * @brief Write the model with the trained parameters (fp32) as a
 * TorchScript file that torch.jit.load() reads.
 *
 * Collective over the engine's ranks; rank 0 writes. Only for models
 * created from TorchScript (dsm_torch_model_create(), or the C++ API with a
 * torch::jit::Module).
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_NOT_SUPPORTED (a C++
 * torch::nn::Module); DSM_ERR_IO. Every rank returns the same status.
 */
DSM_API dsm_status_t dsm_torch_export_torchscript(dsm_torch_model_t model, const char *path);

/**
 * @brief Describe the model: its parameters and buffers, the loss, the
 * ZeRO-3 mode it runs in and why, the LibTorch version, and the engine's own
 * description (dsm_engine_describe()) under "engine".
 *
 * Not collective. Free the text with dsm_free().
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT (format);
 * DSM_ERR_OUT_OF_MEMORY.
 */
DSM_API dsm_status_t dsm_torch_model_describe(dsm_torch_model_t model, dsm_format_t format, char **text);

/**
 * @brief The LibTorch version the bridge was built with and runs on
 * ("1.13.0"), and whether it is a CUDA build. Any output may be NULL.
 *
 * Not collective. Thread safe.
 * @return DSM_SUCCESS.
 */
DSM_API dsm_status_t dsm_torch_version(const char **libtorch_version, int *cuda);

/** @} */

#ifdef __cplusplus
}
#endif

#endif /* DSM_TORCH_H */
