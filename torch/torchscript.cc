// The one seam that knows TorchScript: loading a TorchScript file (with
// errors that name the file, and the operator a newer PyTorch's file needs),
// a torch::jit::Module as a bridge Module (its top-level nn.Sequential as a
// sequence of blocks), and saving it back. PyTorch deprecates TorchScript
// from 2.11 on in favour of torch.export: a loader for that format is one
// more file beside this one, and nothing else in the bridge changes.
#include "bridge.hpp"

#include <dsm/torch_jit.hpp>
#include <caffe2/serialize/inline_container.h>
#include <torch/version.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <regex>

using dsm_torch::fail;
using dsm_torch::Named;

namespace {

// Operators of newer PyTorch versions that TorchScript files call, with the
// version that added them (for the message when this LibTorch lacks one).
const std::map<std::string, std::string> &operator_versions() {
    static const std::map<std::string, std::string> v = {
        {"aten::scaled_dot_product_attention", "2.0"},
        {"aten::_scaled_dot_product_attention", "2.0"},
        {"aten::_native_multi_head_attention", "1.13"},
        {"aten::rms_norm", "2.4"},
        {"aten::_fused_sdp_choice", "2.0"},
        {"aten::unflatten.int", "2.0"},
    };
    return v;
}

class JitModule : public dsm_torch::Module {
  public:
    explicit JitModule(torch::jit::Module m) : m_(std::move(m)) {
        const auto type = m_.type()->name();
        // "__torch__.torch.nn.modules.container.Sequential", or with a
        // "___torch_mangle_N." before the class name when the file holds
        // several Sequential classes (nested ones).
        static const std::regex mangle("___torch_mangle_[0-9]+\\.");
        const std::string name = std::regex_replace(type ? type->qualifiedName() : "", mangle, "");
        static const std::string seq = "torch.nn.modules.container.Sequential";
        is_sequential_ = name.size() >= seq.size() && name.compare(name.size() - seq.size(), seq.size(), seq) == 0;
        if (is_sequential_) {
            for (const auto &c : m_.named_children()) {
                children_.push_back(c.value);
                names_.push_back(c.name);
            }
            if (children_.empty()) is_sequential_ = false;
        }
        type_name_ = name;
    }
    std::string kind() const override { return "TorchScript"; }
    Named parameters() override {
        Named out;
        for (const auto &p : m_.named_parameters(true)) out.emplace_back(p.name, p.value);
        return out;
    }
    Named buffers() override {
        Named out;
        for (const auto &b : m_.named_buffers(true)) out.emplace_back(b.name, b.value);
        return out;
    }
    void train(bool on) override { m_.train(on); }
    at::Tensor forward(const std::vector<at::Tensor> &inputs) override {
        std::vector<c10::IValue> args(inputs.begin(), inputs.end());
        return tensor_of(m_.forward(args));
    }
    size_t num_blocks() const override { return is_sequential_ ? children_.size() : 0; }
    std::string why_not_blocks() const override {
        return "the model (" + type_name_ + ") is not a torch.nn.Sequential: its forward may use its parameters in "
               "any order, so they are gathered whole (wrap a stack of blocks in nn.Sequential to run it block by block)";
    }
    at::Tensor forward_block(size_t b, const at::Tensor &x) override {
        return tensor_of(children_[b].forward({x}));
    }
    std::vector<std::string> block_members(size_t b) const override {
        std::vector<std::string> out;
        for (const auto &p : children_[b].named_parameters(true)) out.push_back(names_[b] + "." + p.name);
        for (const auto &p : children_[b].named_buffers(true)) out.push_back(names_[b] + "." + p.name);
        return out;
    }
    void save_torchscript(const std::string &path) override { m_.save(path); }

  private:
    static at::Tensor tensor_of(const c10::IValue &v) {
        if (v.isTensor()) return v.toTensor();
        if (v.isTuple() && !v.toTupleRef().elements().empty() && v.toTupleRef().elements()[0].isTensor())
            return v.toTupleRef().elements()[0].toTensor();
        fail(DSM_ERR_INVALID_ARGUMENT, "the model's forward returned a " + v.tagKind() + ", not a tensor");
    }
    torch::jit::Module m_;
    bool is_sequential_ = false;
    std::vector<torch::jit::Module> children_;
    std::vector<std::string> names_;
    std::string type_name_;
};

// The first line of a message that has text.
std::string first_line(const std::string &s) {
    const auto b = s.find_first_not_of(" \t\n");
    if (b == std::string::npos) return s;
    const auto n = s.find('\n', b);
    return n == std::string::npos ? s.substr(b) : s.substr(b, n - b);
}

} // namespace

std::unique_ptr<dsm_torch::Module> dsm_torch::load_torchscript(const std::string &path) {
    {
        std::ifstream in(path, std::ios::binary);
        if (!in) fail(DSM_ERR_IO, "cannot open the model file '" + path + "': " + std::strerror(errno));
    }
    // The archive's format version, for the messages.
    std::string file_version = "unknown";
    try {
        caffe2::serialize::PyTorchStreamReader reader(path);
        file_version = std::to_string(reader.version());
    } catch (const std::exception &e) {
        fail(DSM_ERR_IO, "the model file '" + path + "' is not a TorchScript archive (torch.jit.save): " +
                             first_line(dynamic_cast<const c10::Error *>(&e)
                                            ? static_cast<const c10::Error &>(e).what_without_backtrace()
                                            : e.what()));
    }
    try {
        return std::make_unique<JitModule>(torch::jit::load(path, at::kCPU));
    } catch (const std::exception &e) {
        const std::string what = dynamic_cast<const c10::Error *>(&e)
                                     ? static_cast<const c10::Error &>(e).what_without_backtrace()
                                     : e.what();
        std::smatch match;
        static const std::regex unknown_op("Unknown builtin op: ([A-Za-z0-9_]+::[A-Za-z0-9_.]+)");
        if (std::regex_search(what, match, unknown_op)) {
            std::string op = match[1];
            while (!op.empty() && op.back() == '.') op.pop_back(); // the sentence's full stop
            const auto it = operator_versions().find(op);
            const std::string since = it != operator_versions().end() ? "PyTorch " + it->second + " or newer"
                                                                      : "a newer PyTorch";
            fail(DSM_ERR_NOT_SUPPORTED, "the model file '" + path + "' needs the operator " + op + ", which LibTorch " +
                                            TORCH_VERSION + " lacks: the file was written by " + since +
                                            " (archive format version " + file_version + "); script the model with "
                                            "PyTorch " + TORCH_VERSION + ", or build libdsm_torch against a newer "
                                            "LibTorch (--with-libtorch=DIR)");
        }
        fail(DSM_ERR_IO, "cannot load the model file '" + path + "' (archive format version " + file_version +
                             ") with LibTorch " + TORCH_VERSION + ": " + first_line(what));
    }
}

dsm_status_t dsm::torch::model_create(dsm_mesh_t mesh, ::torch::jit::Module module, const char *config,
                                      const dsm_torch_options_t *options, dsm_torch_model_t *model) {
    return dsm_torch::create_model(
        "dsm::torch::model_create", mesh, [&] { return std::make_unique<JitModule>(module); }, config, options, model);
}

extern "C" DSM_API dsm_status_t dsm_torch_model_create(dsm_mesh_t mesh, const char *model_path, const char *config,
                                                       const dsm_torch_options_t *options, dsm_torch_model_t *model) {
    const char *fn = "dsm_torch_model_create";
    if (!model_path) {
        if (model) *model = nullptr;
        return dsm_report_error(DSM_ERR_NULL_POINTER, fn, "model_path is NULL");
    }
    const std::string path = model_path;
    return dsm_torch::create_model(fn, mesh, [&] { return dsm_torch::load_torchscript(path); }, config, options, model);
}
