// The PyTorch bridge's inside: a Module is what the bridge needs from a
// model (its named parameters and buffers, its forward, and its blocks when
// it is a sequence of blocks), whatever kind of module it is. Two kinds:
// a LibTorch C++ torch::nn::Module (model.cc) and a TorchScript module
// (torchscript.cc, the one seam that knows TorchScript: PyTorch deprecates
// it from 2.11 on in favour of torch.export, and nothing else here depends
// on it). The model (model.cc) puts a Module's parameters on a libdsm engine
// through the public C API only.
#pragma once

#include <dsm/torch.h>

#include <ATen/ATen.h>

#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace dsm_torch {

// One error of the bridge, carrying its status; caught once at the C boundary.
class Error : public std::exception {
  public:
    Error(dsm_status_t status, std::string message) : status_(status), message_(std::move(message)) {}
    const char *what() const noexcept override { return message_.c_str(); }
    dsm_status_t status() const noexcept { return status_; }

  private:
    dsm_status_t status_;
    std::string message_;
};

[[noreturn]] inline void fail(dsm_status_t status, const std::string &message) { throw Error(status, message); }

using Named = std::vector<std::pair<std::string, at::Tensor>>;

class Module {
  public:
    virtual ~Module() = default;
    // "TorchScript" or "C++ torch::nn::Module".
    virtual std::string kind() const = 0;
    // Parameters and buffers with their full names, in the module's order.
    virtual Named parameters() = 0;
    virtual Named buffers() = 0;
    virtual void train(bool on) = 0;
    // The whole model's forward on the inputs (with the labels appended
    // when the model computes its own loss); its result must be a tensor.
    virtual at::Tensor forward(const std::vector<at::Tensor> &inputs) = 0;
    // A sequence of blocks: their number (0: not a sequence, and why in
    // why_not_blocks()), each block's forward on one tensor, and the full
    // names of the parameters and buffers of block b.
    virtual size_t num_blocks() const { return 0; }
    virtual std::string why_not_blocks() const { return "the model is not a sequence of blocks"; }
    virtual at::Tensor forward_block(size_t, const at::Tensor &) { fail(DSM_ERR_INTERNAL, "forward_block"); }
    virtual std::vector<std::string> block_members(size_t) const { return {}; }
    // Write the module as a TorchScript file (with its current parameters).
    virtual void save_torchscript(const std::string &) {
        fail(DSM_ERR_NOT_SUPPORTED, "the model is a " + kind() + ", not TorchScript: export it with "
                                    "dsm_torch_export_safetensors()");
    }
};

// torchscript.cc: load a TorchScript file (DSM_ERR_IO for a missing or
// corrupt file, DSM_ERR_NOT_SUPPORTED for an operator this LibTorch lacks,
// naming it and the versions).
std::unique_ptr<Module> load_torchscript(const std::string &path);

// model.cc: a model created from the Module @p load gives (called on every
// rank; its failure on any rank fails every rank).
dsm_status_t create_model(const char *function, dsm_mesh_t mesh, const std::function<std::unique_ptr<Module>()> &load,
                          const char *config, const dsm_torch_options_t *options, dsm_torch_model_t *model);

// The version of LibTorch built against ("1.13.0").
const char *libtorch_version();

} // namespace dsm_torch
