/*
 * libdsm PyTorch bridge, C++ API for TorchScript: put a loaded (or
 * scripted) torch::jit::Module on a libdsm engine. The model handle is then
 * used with <dsm/torch.h> and <dsm/torch.hpp>. TorchScript is deprecated
 * from PyTorch 2.11 on; <dsm/torch.hpp> does not depend on it.
 */
#ifndef DSM_TORCH_JIT_HPP
#define DSM_TORCH_JIT_HPP

#include <dsm/torch.hpp>
#include <torch/script.h>

namespace dsm {
namespace torch {

/**
 * @brief Put a TorchScript module on an engine, as dsm_torch_model_create()
 * does with a file (a top-level nn.Sequential runs block by block under
 * ZeRO-3). The bridge keeps a reference to the module (a torch::jit::Module
 * is a handle: the caller's copy sees the same parameters).
 *
 * Collective over the mesh. @return as dsm_torch_model_create().
 */
DSM_API dsm_status_t model_create(dsm_mesh_t mesh, ::torch::jit::Module module, const char *config,
                                  const dsm_torch_options_t *options, dsm_torch_model_t *model);

} // namespace torch
} // namespace dsm

#endif /* DSM_TORCH_JIT_HPP */
