/*
 * libdsm PyTorch bridge, C++ API: hand a LibTorch C++ module to a libdsm
 * engine. Its parameters become the engine's parameters (by their names),
 * are views of the engine's memory during the bridge's calls, and autograd
 * adds their gradients straight into the engine's gradient buffers;
 * dsm_step() updates them in place. Everything else (checkpoints, export,
 * describe, free) is the C API of <dsm/torch.h> on the same handle.
 *
 * Needs LibTorch's headers and flags (pkg-config --variable=torch_cxxflags
 * dsm-torch; CMake: dsm::torch with find_package(Torch)). Does not depend on
 * TorchScript: <dsm/torch_jit.hpp> takes a torch::jit::Module.
 */
#ifndef DSM_TORCH_HPP
#define DSM_TORCH_HPP

#include <dsm/torch.h>
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <vector>

namespace dsm {
namespace torch {

/** A module's forward on the inputs of a step (the inputs passed to train_step(), in order). */
using Forward = std::function<at::Tensor(const std::vector<at::Tensor> &inputs)>;
/** A loss of the output and the labels (a scalar), used instead of the options' loss. */
using Loss = std::function<at::Tensor(const at::Tensor &output, const at::Tensor &labels)>;

/**
 * @brief Put @p module's parameters on an engine; @p forward runs the model.
 *
 * Collective over the mesh, as dsm_torch_model_create() (the parameters of
 * rank 0 initialize the engine; ranks whose parameters differ fail every
 * rank with DSM_ERR_MISMATCH). The module must outlive the model; the
 * bridge keeps a reference. Under ZeRO-3 the model gathers its parameters
 * whole (a torch::nn::Sequential runs block by block: the overload below).
 * @return as dsm_torch_model_create().
 */
DSM_API dsm_status_t model_create(dsm_mesh_t mesh, std::shared_ptr<::torch::nn::Module> module, Forward forward,
                                  const char *config, const dsm_torch_options_t *options,
                                  dsm_torch_model_t *model);

/**
 * @brief Put a torch::nn::Sequential on an engine: its forward is the
 * sequence's, and under ZeRO-3 it runs block by block (each child a block).
 *
 * Collective over the mesh. @return as dsm_torch_model_create().
 */
DSM_API dsm_status_t model_create(dsm_mesh_t mesh, ::torch::nn::Sequential sequential, const char *config,
                                  const dsm_torch_options_t *options, dsm_torch_model_t *model);

/**
 * @brief dsm_torch_train_step() on tensors: one micro-step (forward, loss,
 * backward into the engine's buffers, dsm_step()). @p labels may be
 * undefined with DSM_TORCH_LOSS_MODEL; @p loss_fn, when set, replaces the
 * options' loss.
 *
 * Collective over the engine's ranks. @return as dsm_torch_train_step().
 */
DSM_API dsm_status_t train_step(dsm_torch_model_t model, const std::vector<at::Tensor> &inputs,
                                const at::Tensor &labels, double *loss, dsm_step_info_t *info,
                                const Loss &loss_fn = Loss());

/**
 * @brief dsm_torch_inference() on tensors: the model's output (a tensor of
 * the bridge's, in the engine's compute dtype) into @p output.
 *
 * Collective under ZeRO-3. @return as dsm_torch_inference().
 */
DSM_API dsm_status_t inference(dsm_torch_model_t model, const std::vector<at::Tensor> &inputs, at::Tensor *output);

} // namespace torch
} // namespace dsm

#endif /* DSM_TORCH_HPP */
