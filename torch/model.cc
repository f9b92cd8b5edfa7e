// A PyTorch model on a libdsm engine, through libdsm's public C API only.
//
// The model's parameters are the engine's: during a call the parameter
// tensors are views (set_data over from_blob) of what
// dsm_engine_param_acquire() hands out, and their pre-set gradients
// (mutable_grad()) are views of the buffers of dsm_engine_grad_acquire(),
// into which autograd adds in place. Between calls the parameter tensors are
// empty placeholders, so that no rank holds a second copy of the model.
// Under ZeRO-3 a sequence of blocks runs block by block: each block's
// parameters are gathered around its forward (run without a graph, its
// input kept) and again around its backward (the forward recomputed from
// that input with the same random state and buffers, then backward).
#include "bridge.hpp"

#include <dsm/torch.hpp>
#include <dsm_torch_ops.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <nlohmann/json.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cerrno>
#include <mutex>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

using dsm_torch::Error;
using dsm_torch::fail;
using dsm_torch::Named;

struct dsm_torch_model_s {
    struct Param {
        std::string name;
        at::Tensor tensor;        // the module's parameter
        std::vector<int64_t> shape;
        int index = -1;           // in the engine
        bool trainable = false;
    };
    std::unique_ptr<dsm_torch::Module> module;
    dsm_engine_t engine = nullptr;
    MPI_Comm comm = MPI_COMM_NULL; // a duplicate of the mesh's communicator
    int rank = 0, size = 1;
    std::vector<Param> params;
    Named buffers;
    dsm_torch_loss_t loss = DSM_TORCH_LOSS_MSE;
    int zero_stage = 0;
    bool blocks = false;          // ZeRO-3 block by block
    std::string mode_reason;
    std::vector<std::vector<int>> block_params;   // indices into params
    std::vector<std::vector<int>> block_buffers;  // indices into buffers
    at::ScalarType dtype = at::kFloat;            // the engine's compute dtype
    at::Device device = at::kCPU;
    // Training steps so far, their seconds, and the seconds spent in libdsm's
    // calls during them (acquire, release, dsm_step).
    int64_t steps = 0;
    double step_seconds = 0.0, libdsm_seconds = 0.0;
    bool ops_set = false;         // dsm_torch_ops_set_mesh() was called for this model

    ~dsm_torch_model_s() {
        if (ops_set) dsm_torch_ops_clear();
        if (engine) dsm_engine_free(&engine);
        if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
    }
};

namespace {

using Model = dsm_torch_model_s;

// ---------------------------------------------------------------- helpers

std::string shape_str(at::IntArrayRef s) {
    std::ostringstream os;
    os << "[";
    for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
    os << "]";
    return os.str();
}

std::string tensor_str(const at::Tensor &t) {
    return std::string(c10::toString(t.scalar_type())) + " " + shape_str(t.sizes());
}

// A c10::Error's message without its C++ backtrace, at most a few lines.
// A TorchScript error's reason is its last line ("RuntimeError: mat1 and
// mat2 shapes cannot be multiplied (4x7 and 8x16)"), after the traceback.
std::string torch_message(const std::exception &e) {
    std::string m;
    if (auto *c = dynamic_cast<const c10::Error *>(&e)) m = c->what_without_backtrace();
    else m = e.what();
    std::istringstream in(m);
    std::string line;
    std::vector<std::string> lines;
    while (std::getline(in, line))
        if (line.find_first_not_of(" \t") != std::string::npos) lines.push_back(line);
    if (lines.empty()) return m;
    if (m.find("Traceback of TorchScript") != std::string::npos) {
        std::string last = lines.back();
        last.erase(0, last.find_first_not_of(" \t"));
        return last + " (in " + lines.front() + ")";
    }
    std::string out;
    for (size_t i = 0; i < lines.size() && i < 6; ++i) out += (i ? " | " : "") + lines[i];
    return out;
}

// The status of an error a model's forward or backward threw: the Ulysses
// operators of libdsm_torch_ops (torch.ops.dsm.*) throw c10::Error with a
// message that starts with the operator's name and names the bad value; a
// missing group is a state error, anything else the operator rejected is
// a bad argument (a wrong input, or an input that differs between ranks).
dsm_status_t status_of(const std::exception &e, dsm_status_t otherwise) {
    const std::string m = e.what();
    if (m.find("dsm::seq_to_head") == std::string::npos && m.find("dsm::head_to_seq") == std::string::npos)
        return otherwise;
    if (m.find("no sequence-parallel group is set") != std::string::npos) return DSM_ERR_STATE;
    return DSM_ERR_INVALID_ARGUMENT;
}

at::ScalarType to_scalar(dsm_dtype_t d) {
    switch (d) {
    case DSM_FLOAT32: return at::kFloat;
    case DSM_FLOAT16: return at::kHalf;
    case DSM_BFLOAT16: return at::kBFloat16;
    case DSM_FLOAT64: return at::kDouble;
    case DSM_INT8: return at::kChar;
    case DSM_UINT8: return at::kByte;
    case DSM_INT32: return at::kInt;
    case DSM_INT64: return at::kLong;
    }
    fail(DSM_ERR_INVALID_ARGUMENT, "unknown dtype " + std::to_string(static_cast<int>(d)));
}

// Agree on a status over the model's ranks: the first rank that failed
// (lowest rank) gives its status and message to every rank, prefixed with
// its rank. Throws on every rank when some rank failed.
void agree(MPI_Comm comm, int rank, int size, dsm_status_t status, const std::string &message) {
    int mine = status == DSM_SUCCESS ? size : rank, first = size;
    if (MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm) != MPI_SUCCESS)
        fail(DSM_ERR_MPI, "MPI_Allreduce of the ranks' statuses failed");
    if (first == size) return;
    int head[2] = {static_cast<int>(status), static_cast<int>(message.size())};
    MPI_Bcast(head, 2, MPI_INT, first, comm);
    std::string text(static_cast<size_t>(head[1]), '\0');
    if (rank == first) text = message;
    if (head[1] > 0) MPI_Bcast(&text[0], head[1], MPI_CHAR, first, comm);
    if (size > 1) text = "rank " + std::to_string(first) + ": " + text;
    throw Error(static_cast<dsm_status_t>(head[0]), text);
}

void agree(Model &m, dsm_status_t status, const std::string &message) {
    agree(m.comm, m.rank, m.size, status, message);
}

void check(dsm_status_t st) { // a libdsm call's failure (agreed by the engine where collective)
    if (st != DSM_SUCCESS) fail(st, dsm_last_error());
}

// A libdsm call, its time added to the model's libdsm_seconds.
template <class F> dsm_status_t timed(Model &m, F &&call) {
    const double t0 = MPI_Wtime();
    const dsm_status_t st = call();
    m.libdsm_seconds += MPI_Wtime() - t0;
    return st;
}

at::TensorOptions engine_options(const Model &m) { return at::TensorOptions().dtype(m.dtype).device(m.device); }

// The parameters and gradients a call holds, given back on every path.
class Held {
  public:
    explicit Held(Model &m) : m_(m) {}
    ~Held() {
        while (!grads_.empty()) {
            drop_grad(grads_.back(), false);
            grads_.pop_back();
        }
        while (!params_.empty()) {
            drop_param(params_.back());
            params_.pop_back();
        }
    }
    Held(const Held &) = delete;
    Held &operator=(const Held &) = delete;

    void param(int i) {
        auto &p = m_.params[static_cast<size_t>(i)];
        const void *v = nullptr;
        check(timed(m_, [&] { return dsm_engine_param_acquire(m_.engine, p.index, &v); }));
        params_.push_back(i);
        p.tensor.set_data(at::from_blob(const_cast<void *>(v), p.shape, engine_options(m_)));
    }
    void grad(int i) {
        auto &p = m_.params[static_cast<size_t>(i)];
        if (!p.trainable) return;
        void *g = nullptr;
        check(timed(m_, [&] { return dsm_engine_grad_acquire(m_.engine, p.index, &g); }));
        at::Tensor buf = at::from_blob(g, p.shape, engine_options(m_));
        grads_.push_back({i, buf});
        p.tensor.mutable_grad() = buf;
    }
    // Hand back the gradient of parameter i now, if held (collective under
    // ZeRO-2/3 as release_grads()).
    void release_grad(int i) {
        for (size_t k = 0; k < grads_.size(); ++k)
            if (grads_[k].first == i) {
                const auto g = grads_[k];
                grads_.erase(grads_.begin() + static_cast<std::ptrdiff_t>(k));
                drop_grad(g, true);
                return;
            }
    }
    // Hand back the gradients (collective under ZeRO-2/3: every rank in the same order).
    void release_grads() {
        while (!grads_.empty()) {
            auto g = grads_.back();
            grads_.pop_back();
            drop_grad(g, true);
        }
    }
    void release_params() {
        while (!params_.empty()) {
            const int i = params_.back();
            params_.pop_back();
            drop_param(i);
        }
    }

  private:
    void drop_grad(const std::pair<int, at::Tensor> &g, bool checked) {
        auto &p = m_.params[static_cast<size_t>(g.first)];
        const at::Tensor grad = p.tensor.grad();
        // Autograd adds into the pre-set gradient in place; should it ever
        // have replaced it (a LibTorch that does), its sum is copied into
        // the engine's buffer.
        if (checked && grad.defined() && grad.data_ptr() != g.second.data_ptr()) g.second.copy_(grad);
        p.tensor.mutable_grad() = at::Tensor();
        const dsm_status_t st = timed(m_, [&] { return dsm_engine_grad_release(m_.engine, p.index); });
        if (checked) check(st);
    }
    void drop_param(int i) {
        auto &p = m_.params[static_cast<size_t>(i)];
        p.tensor.set_data(at::empty({0}, engine_options(m_)));
        timed(m_, [&] { return dsm_engine_param_release(m_.engine, p.index); });
    }
    Model &m_;
    std::vector<int> params_;
    std::vector<std::pair<int, at::Tensor>> grads_;
};

// Each trainable parameter's gradient handed back to the engine as soon as
// autograd has added into it (a post hook on the parameter's
// AccumulateGrad node, where DistributedDataParallel hooks its reducer
// too), not after the whole backward: the engine starts a bucket's
// reduction when its last gradient comes back (overlap_comm), so the
// reduction of the last layers runs while the backward of the first ones
// goes on. Every rank runs the same graph, so the releases come in the
// same order on every rank. The hooks are removed when this goes.
class ReleaseOnAccumulate {
  public:
    ReleaseOnAccumulate(Model &m, Held &held) {
        for (size_t i = 0; i < m.params.size(); ++i) {
            if (!m.params[i].trainable) continue;
            std::shared_ptr<torch::autograd::Node> acc = torch::autograd::impl::try_get_grad_accumulator(m.params[i].tensor);
            if (!acc) continue; // not in this graph: released with the others
            const uintptr_t key = acc->add_post_hook(std::make_unique<Hook>(held, static_cast<int>(i)));
            hooks_.emplace_back(std::move(acc), key);
        }
    }
    ~ReleaseOnAccumulate() {
        for (auto &h : hooks_) h.first->del_post_hook(h.second);
    }
    ReleaseOnAccumulate(const ReleaseOnAccumulate &) = delete;
    ReleaseOnAccumulate &operator=(const ReleaseOnAccumulate &) = delete;

  private:
    struct Hook : torch::autograd::FunctionPostHook {
        Hook(Held &held, int index) : held_(held), index_(index) {}
        torch::autograd::variable_list operator()(const torch::autograd::variable_list &outputs,
                                                  const torch::autograd::variable_list &) override {
            held_.release_grad(index_);
            return outputs;
        }
        Held &held_;
        int index_;
    };
    std::vector<std::pair<std::shared_ptr<torch::autograd::Node>, uintptr_t>> hooks_;
};

// ---------------------------------------------------------------- tensors of the caller

at::Tensor from_desc(const char *what, const dsm_torch_tensor_t &d) {
    if (d.ndim < 0 || d.ndim > DSM_TORCH_MAX_DIMS)
        fail(DSM_ERR_INVALID_ARGUMENT, std::string(what) + ".ndim is " + std::to_string(d.ndim) + ", must be 0.." +
                                           std::to_string(DSM_TORCH_MAX_DIMS));
    std::vector<int64_t> shape(static_cast<size_t>(d.ndim));
    int64_t numel = 1;
    for (int i = 0; i < d.ndim; ++i) {
        if (d.shape[i] < 0)
            fail(DSM_ERR_INVALID_ARGUMENT, std::string(what) + ".shape[" + std::to_string(i) + "] is " +
                                               std::to_string(d.shape[i]) + ", must be >= 0");
        shape[static_cast<size_t>(d.column_major ? d.ndim - 1 - i : i)] = d.shape[i];
        numel *= d.shape[i];
    }
    if (d.memory != DSM_TORCH_MEMORY_HOST && d.memory != DSM_TORCH_MEMORY_CUDA)
        fail(DSM_ERR_INVALID_ARGUMENT, std::string(what) + ".memory is " + std::to_string(static_cast<int>(d.memory)) +
                                           ", must be DSM_TORCH_MEMORY_HOST or DSM_TORCH_MEMORY_CUDA");
    if (d.memory == DSM_TORCH_MEMORY_CUDA && !at::hasCUDA())
        fail(DSM_ERR_NOT_SUPPORTED, std::string(what) + " is CUDA memory, but this LibTorch has no CUDA");
    if (!d.data && numel > 0) fail(DSM_ERR_NULL_POINTER, std::string(what) + ".data is NULL");
    const at::ScalarType st = to_scalar(d.dtype);
    return at::from_blob(d.data, shape, at::TensorOptions().dtype(st).device(
                                            d.memory == DSM_TORCH_MEMORY_CUDA ? at::kCUDA : at::kCPU));
}

// ---------------------------------------------------------------- buffers

void broadcast_buffers(Model &m) {
    if (m.size == 1) return;
    for (auto &b : m.buffers) {
        at::Tensor t = b.second;
        if (!t.defined() || t.numel() == 0) continue;
        at::Tensor host = t.is_contiguous() && t.device().is_cpu() ? t : t.contiguous().to(at::kCPU);
        const size_t bytes = static_cast<size_t>(host.numel()) * host.element_size();
        if (bytes > static_cast<size_t>(INT32_MAX)) fail(DSM_ERR_NOT_SUPPORTED, "buffer '" + b.first + "' is too large");
        if (MPI_Bcast(host.data_ptr(), static_cast<int>(bytes), MPI_BYTE, 0, m.comm) != MPI_SUCCESS)
            fail(DSM_ERR_MPI, "MPI_Bcast of buffer '" + b.first + "' failed");
        if (!host.is_same(t)) t.copy_(host);
    }
}

// ---------------------------------------------------------------- the loss

at::Tensor compute_loss(Model &m, const at::Tensor &out, const at::Tensor *labels, const dsm::torch::Loss *custom) {
    if (custom && *custom) {
        if (!labels || !labels->defined()) fail(DSM_ERR_NULL_POINTER, "labels are NULL");
        return (*custom)(out, *labels);
    }
    if (m.loss == DSM_TORCH_LOSS_MODEL) {
        if (out.numel() != 1)
            fail(DSM_ERR_INVALID_ARGUMENT, "loss \"model\": forward returned " + tensor_str(out) + ", not a scalar loss");
        return out.reshape({});
    }
    if (!labels || !labels->defined()) fail(DSM_ERR_NULL_POINTER, "labels are NULL (the loss needs them)");
    const at::Tensor &lab = *labels;
    if (m.loss == DSM_TORCH_LOSS_MSE) {
        if (!at::isFloatingType(lab.scalar_type()))
            fail(DSM_ERR_INVALID_ARGUMENT, "labels are " + tensor_str(lab) + ": loss \"mse\" needs floating-point labels");
        if (lab.numel() != out.numel())
            fail(DSM_ERR_INVALID_ARGUMENT, "labels " + tensor_str(lab) + " do not match the model's output " +
                                               tensor_str(out) + " (loss \"mse\")");
        return at::mse_loss(out, lab.to(out.device(), out.scalar_type()).reshape(out.sizes()));
    }
    // cross entropy
    if (at::isFloatingType(lab.scalar_type()) || lab.scalar_type() == at::kBool)
        fail(DSM_ERR_INVALID_ARGUMENT, "labels are " + tensor_str(lab) + ": loss \"cross_entropy\" needs integer class labels");
    if (out.dim() < 2 || lab.dim() != out.dim() - 1 || lab.size(0) != out.size(0))
        fail(DSM_ERR_INVALID_ARGUMENT, "labels " + tensor_str(lab) + " do not match the model's output " + tensor_str(out) +
                                           " (loss \"cross_entropy\": output [N, C, ...], labels [N, ...])");
    return at::cross_entropy_loss(out, lab.to(out.device(), at::kLong), {}, at::Reduction::Mean, -100, 0.0);
}

std::vector<at::Tensor> prepare_inputs(Model &m, const std::vector<at::Tensor> &inputs) {
    std::vector<at::Tensor> out;
    out.reserve(inputs.size());
    for (const auto &t : inputs) {
        at::Tensor x = t;
        if (at::isFloatingType(x.scalar_type()) && x.scalar_type() != m.dtype) x = x.to(m.dtype);
        if (x.device() != m.device) x = x.to(m.device);
        out.push_back(x);
    }
    return out;
}

std::vector<int> all_params(const Model &m) {
    std::vector<int> v(m.params.size());
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int>(i);
    return v;
}

// The saved state of a block's forward, to recompute it for its backward.
struct BlockRun {
    at::Tensor input;
    at::Generator rng; // the CPU generator's state before the forward
    std::vector<at::Tensor> buffers_after;
};

// ---------------------------------------------------------------- the step

double train_step_(Model &m, const char *fn, const std::vector<at::Tensor> &raw_inputs, const at::Tensor *labels,
                   const dsm::torch::Loss *custom, dsm_step_info_t *info);

double train_step(Model &m, const char *fn, const std::vector<at::Tensor> &raw_inputs, const at::Tensor *labels,
                  const dsm::torch::Loss *custom, dsm_step_info_t *info) {
    const double t0 = MPI_Wtime();
    const double loss = train_step_(m, fn, raw_inputs, labels, custom, info);
    m.step_seconds += MPI_Wtime() - t0;
    ++m.steps;
    return loss;
}

double train_step_(Model &m, const char *fn, const std::vector<at::Tensor> &raw_inputs, const at::Tensor *labels,
                   const dsm::torch::Loss *custom, dsm_step_info_t *info) {
    m.module->train(true);
    broadcast_buffers(m);
    double scale = 1.0;
    check(dsm_engine_loss_scale(m.engine, &scale));
    dsm_status_t st = DSM_SUCCESS;
    std::string msg;
    std::vector<at::Tensor> inputs;
    try {
        inputs = prepare_inputs(m, raw_inputs);
        if (m.loss == DSM_TORCH_LOSS_MODEL && labels && labels->defined()) inputs.push_back(*labels);
    } catch (const std::exception &e) {
        st = DSM_ERR_INVALID_ARGUMENT;
        msg = torch_message(e);
    }
    agree(m, st, msg);
    double loss_value = 0.0;
    const bool blocks = m.blocks && inputs.size() == 1 && !custom;
    if (!blocks) {
        Held held(m);
        for (int i : all_params(m)) held.param(i);
        at::Tensor loss;
        try {
            at::Tensor out = m.module->forward(inputs);
            loss = compute_loss(m, out, labels, custom);
        } catch (const Error &e) {
            st = e.status();
            msg = e.what();
        } catch (const std::exception &e) {
            st = status_of(e, DSM_ERR_INVALID_ARGUMENT);
            std::string in;
            for (size_t i = 0; i < raw_inputs.size(); ++i)
                in += (i ? ", " : "") + std::string("inputs[") + std::to_string(i) + "] " + tensor_str(raw_inputs[i]);
            msg = "the model rejected " + in + ": " + torch_message(e);
        }
        agree(m, st, msg);
        loss_value = loss.detach().to(at::kDouble).item<double>();
        for (int i : all_params(m)) held.grad(i);
        if (loss.requires_grad()) {
            ReleaseOnAccumulate early(m, held);
            try {
                loss.backward(at::full_like(loss, scale));
            } catch (const Error &) {
                throw;
            } catch (const std::exception &e) { // every rank of an operator's group throws alike
                fail(status_of(e, DSM_ERR_INTERNAL), "the model's backward failed: " + torch_message(e));
            }
        }
        held.release_grads();
        held.release_params();
    } else {
        const size_t nb = m.module->num_blocks();
        std::vector<BlockRun> runs(nb);
        auto gen = at::detail::getDefaultCPUGenerator();
        at::Tensor x = inputs[0];
        for (size_t b = 0; b < nb; ++b) {
            runs[b].input = x;
            runs[b].rng = gen.clone();
            Held held(m);
            for (int i : m.block_params[b]) held.param(i);
            try {
                at::NoGradGuard no_grad;
                x = m.module->forward_block(b, x);
            } catch (const std::exception &e) {
                st = status_of(e, DSM_ERR_INVALID_ARGUMENT);
                msg = "the model rejected inputs[0] " + tensor_str(raw_inputs[0]) + " in block " + std::to_string(b) +
                      ": " + torch_message(e);
            }
            held.release_params();
            agree(m, st, msg);
            for (int k : m.block_buffers[b]) runs[b].buffers_after.push_back(m.buffers[static_cast<size_t>(k)].second.clone());
        }
        at::Tensor out = x.detach().requires_grad_(at::isFloatingType(x.scalar_type()));
        at::Tensor loss;
        try {
            loss = compute_loss(m, out, labels, custom);
        } catch (const Error &e) {
            st = e.status();
            msg = e.what();
        } catch (const std::exception &e) {
            st = DSM_ERR_INVALID_ARGUMENT;
            msg = torch_message(e);
        }
        agree(m, st, msg);
        loss_value = loss.detach().to(at::kDouble).item<double>();
        at::Tensor gy;
        if (loss.requires_grad()) {
            loss.backward(at::full_like(loss, scale));
            gy = out.grad();
        }
        const at::Generator end_state = gen.clone();
        for (size_t r = nb; r-- > 0;) {
            Held held(m);
            for (int i : m.block_params[r]) held.param(i);
            at::Tensor xin = runs[r].input.detach();
            if (r > 0 && at::isFloatingType(xin.scalar_type())) xin.requires_grad_(true);
            {
                std::lock_guard<std::mutex> lock(gen.mutex());
                gen.set_state(runs[r].rng.get_state());
            }
            at::Tensor y = m.module->forward_block(r, xin);
            for (size_t k = 0; k < m.block_buffers[r].size(); ++k)
                m.buffers[static_cast<size_t>(m.block_buffers[r][k])].second.copy_(runs[r].buffers_after[k]);
            for (int i : m.block_params[r]) held.grad(i);
            if (gy.defined() && y.requires_grad()) torch::autograd::backward({y}, {gy});
            gy = r > 0 && xin.requires_grad() ? xin.grad() : at::Tensor();
            held.release_grads();
            held.release_params();
            runs[r].input = at::Tensor();
        }
        std::lock_guard<std::mutex> lock(gen.mutex());
        gen.set_state(end_state.get_state());
    }
    check(timed(m, [&] { return dsm_step(m.engine, info); }));
    return loss_value;
}

at::Tensor inference(Model &m, const std::vector<at::Tensor> &raw_inputs) {
    m.module->train(false);
    dsm_status_t st = DSM_SUCCESS;
    std::string msg;
    std::vector<at::Tensor> inputs;
    try {
        inputs = prepare_inputs(m, raw_inputs);
    } catch (const std::exception &e) {
        st = DSM_ERR_INVALID_ARGUMENT;
        msg = torch_message(e);
    }
    agree(m, st, msg);
    at::NoGradGuard no_grad;
    at::Tensor out;
    if (m.blocks && inputs.size() == 1) {
        at::Tensor x = inputs[0];
        for (size_t b = 0; b < m.module->num_blocks(); ++b) {
            Held held(m);
            for (int i : m.block_params[b]) held.param(i);
            try {
                x = m.module->forward_block(b, x);
            } catch (const std::exception &e) {
                st = status_of(e, DSM_ERR_INVALID_ARGUMENT);
                msg = "the model rejected inputs[0] " + tensor_str(raw_inputs[0]) + " in block " + std::to_string(b) +
                      ": " + torch_message(e);
            }
            held.release_params();
            agree(m, st, msg);
        }
        out = x;
    } else {
        Held held(m);
        for (int i : all_params(m)) held.param(i);
        try {
            out = m.module->forward(inputs).clone();
        } catch (const std::exception &e) {
            st = status_of(e, DSM_ERR_INVALID_ARGUMENT);
            std::string in;
            for (size_t i = 0; i < raw_inputs.size(); ++i)
                in += (i ? ", " : "") + std::string("inputs[") + std::to_string(i) + "] " + tensor_str(raw_inputs[i]);
            msg = "the model rejected " + in + ": " + torch_message(e);
        }
        held.release_params();
        agree(m, st, msg);
    }
    return out;
}

// ---------------------------------------------------------------- creation

struct TorchConfig {
    std::string engine_config; // what the engine reads
    std::string loss;          // "" when not given
};

TorchConfig read_config(const char *config) {
    TorchConfig tc;
    tc.engine_config = config;
    std::string text;
    const char *p = config;
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') ++p;
    if (*p == '{') {
        text = config;
    } else {
        std::ifstream in(config, std::ios::binary);
        if (!in) return tc; // the engine reports the file
        std::ostringstream ss;
        ss << in.rdbuf();
        text = ss.str();
    }
    nlohmann::json j = nlohmann::json::parse(text, nullptr, false, true);
    if (j.is_discarded() || !j.is_object() || !j.contains("torch")) return tc; // the engine reports bad JSON
    const nlohmann::json t = j["torch"];
    if (!t.is_object()) fail(DSM_ERR_CONFIG, std::string("configuration ") + config + ": \"torch\" must be an object");
    for (auto it = t.begin(); it != t.end(); ++it) {
        if (it.key() == "loss") {
            if (!it.value().is_string())
                fail(DSM_ERR_CONFIG, std::string("configuration ") + config + ": torch.loss must be a string");
            tc.loss = it.value().get<std::string>();
            if (tc.loss != "mse" && tc.loss != "cross_entropy" && tc.loss != "model")
                fail(DSM_ERR_CONFIG, std::string("configuration ") + config + ": torch.loss is \"" + tc.loss +
                                         "\", must be \"mse\", \"cross_entropy\" or \"model\"");
        } else {
            fail(DSM_ERR_CONFIG, std::string("configuration ") + config + ": unknown key torch." + it.key() +
                                     " (known: loss)");
        }
    }
    j.erase("torch");
    tc.engine_config = j.dump();
    return tc;
}

// Every rank's parameters (names, shapes, values) against rank 0's.
void check_same_parameters(Model &m, const std::vector<at::Tensor> &values) {
    std::ostringstream os;
    for (size_t i = 0; i < m.params.size(); ++i) os << m.params[i].name << shape_str(m.params[i].shape) << ";";
    std::string mine = os.str(), root = mine;
    int len = static_cast<int>(root.size());
    MPI_Bcast(&len, 1, MPI_INT, 0, m.comm);
    root.resize(static_cast<size_t>(len));
    MPI_Bcast(&root[0], len, MPI_CHAR, 0, m.comm);
    dsm_status_t st = DSM_SUCCESS;
    std::string msg;
    if (root != mine) {
        st = DSM_ERR_MISMATCH;
        msg = "the model's parameters (names and shapes) differ from rank 0's: rank 0 has " +
              root.substr(0, 400) + " this rank has " + mine.substr(0, 400);
    }
    agree(m, st, msg);
    for (size_t i = 0; i < m.params.size() && st == DSM_SUCCESS; ++i) {
        at::Tensor mine_v = values[i];
        at::Tensor r = m.rank == 0 ? mine_v.clone() : at::empty_like(mine_v);
        const int64_t n = r.numel();
        for (int64_t off = 0; off < n; off += (1 << 28)) {
            const int c = static_cast<int>(std::min<int64_t>(n - off, 1 << 28));
            MPI_Bcast(static_cast<float *>(r.data_ptr()) + off, c, MPI_FLOAT, 0, m.comm);
        }
        const float *a = static_cast<const float *>(mine_v.data_ptr()), *b = static_cast<const float *>(r.data_ptr());
        for (int64_t k = 0; k < n; ++k) {
            if (std::memcmp(a + k, b + k, sizeof(float)) != 0) {
                char buf[160];
                std::snprintf(buf, sizeof buf, "element %lld is %.9g on rank %d and %.9g on rank 0",
                              static_cast<long long>(k), static_cast<double>(a[k]), m.rank, static_cast<double>(b[k]));
                st = DSM_ERR_MISMATCH;
                msg = "parameter '" + m.params[i].name + "' differs between ranks: " + buf +
                      " (load the same file on every rank, or seed every rank's generator alike)";
                break;
            }
        }
        agree(m, st, msg);
    }
}

void create(Model &m, dsm_mesh_t mesh, const std::function<std::unique_ptr<dsm_torch::Module>()> &load,
            const char *config, const dsm_torch_options_t *opts_in) {
    MPI_Comm mesh_comm = MPI_COMM_NULL;
    check(dsm_mesh_comm(mesh, nullptr, &mesh_comm));
    if (MPI_Comm_dup(mesh_comm, &m.comm) != MPI_SUCCESS) fail(DSM_ERR_MPI, "MPI_Comm_dup failed");
    MPI_Comm_set_errhandler(m.comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(m.comm, &m.rank);
    MPI_Comm_size(m.comm, &m.size);

    dsm_status_t st = DSM_SUCCESS;
    std::string msg;
    dsm_torch_options_t opts = DSM_TORCH_OPTIONS_INITIALIZER;
    TorchConfig tc;
    std::vector<at::Tensor> values; // fp32 contiguous, the module's own
    try {
        if (opts_in) {
            if (opts_in->size < sizeof(size_t) || opts_in->size > sizeof(dsm_torch_options_t))
                fail(DSM_ERR_INVALID_ARGUMENT, "options->size is " + std::to_string(opts_in->size) + ", must be " +
                                                   std::to_string(sizeof(size_t)) + ".." +
                                                   std::to_string(sizeof(dsm_torch_options_t)) +
                                                   " (initialize with DSM_TORCH_OPTIONS_INITIALIZER)");
            std::memcpy(&opts, opts_in, opts_in->size);
            opts.size = sizeof opts;
        }
        if (opts.loss < DSM_TORCH_LOSS_CONFIG || opts.loss > DSM_TORCH_LOSS_MODEL)
            fail(DSM_ERR_INVALID_ARGUMENT, "options->loss is " + std::to_string(static_cast<int>(opts.loss)) +
                                               ", must be a dsm_torch_loss_t");
        if (opts.zero3_mode < DSM_TORCH_ZERO3_AUTO || opts.zero3_mode > DSM_TORCH_ZERO3_BLOCKS)
            fail(DSM_ERR_INVALID_ARGUMENT, "options->zero3_mode is " + std::to_string(static_cast<int>(opts.zero3_mode)) +
                                               ", must be a dsm_torch_zero3_mode_t");
        tc = read_config(config);
        m.loss = opts.loss;
        if (m.loss == DSM_TORCH_LOSS_CONFIG)
            m.loss = tc.loss == "cross_entropy" ? DSM_TORCH_LOSS_CROSS_ENTROPY
                     : tc.loss == "model"       ? DSM_TORCH_LOSS_MODEL
                                                : DSM_TORCH_LOSS_MSE;
        m.module = load();
        for (auto &p : m.module->parameters()) {
            dsm_torch_model_s::Param q;
            q.name = p.first;
            q.tensor = p.second;
            q.shape = p.second.sizes().vec();
            q.trainable = p.second.requires_grad();
            if (!at::isFloatingType(p.second.scalar_type()))
                fail(DSM_ERR_NOT_SUPPORTED, "parameter '" + q.name + "' is " + tensor_str(p.second) +
                                                ": only floating-point parameters can be trained");
            values.push_back(p.second.detach().to(at::kCPU, at::kFloat).contiguous());
            m.params.push_back(std::move(q));
        }
        if (m.params.empty())
            fail(DSM_ERR_INVALID_ARGUMENT, "the model (" + m.module->kind() + ") has no parameters: nothing to train");
        m.buffers = m.module->buffers();
    } catch (const Error &e) {
        st = e.status();
        msg = e.what();
    } catch (const std::exception &e) {
        st = DSM_ERR_INVALID_ARGUMENT;
        msg = torch_message(e);
    }
    agree(m, st, msg);
    check_same_parameters(m, values);

    // The engine, initialized from rank 0's values.
    std::vector<dsm_param_desc_t> descs(m.params.size());
    for (size_t i = 0; i < m.params.size(); ++i) {
        dsm_param_desc_t d = DSM_PARAM_DESC_INITIALIZER;
        d.name = m.params[i].name.c_str();
        d.ndims = static_cast<int>(m.params[i].shape.size());
        d.shape = m.params[i].shape.data();
        d.dtype = DSM_FLOAT32;
        d.trainable = m.params[i].trainable ? 1 : 0;
        d.init_values = values[i].data_ptr();
        descs[i] = d;
    }
    dsm_engine_options_t eopts = DSM_ENGINE_OPTIONS_INITIALIZER;
    if (!at::hasCUDA()) eopts.device = DSM_DEVICE_HOST;
    check(dsm_engine_init_with_options(mesh, tc.engine_config.c_str(), descs.data(), static_cast<int>(descs.size()),
                                       opts.engine_options ? opts.engine_options : &eopts, &m.engine));
    // The Ulysses operators a model's attention calls (torch.ops.dsm.*) work
    // on the mesh's "sequence_parallel" group (none: the identity).
    check(dsm_torch_ops_set_mesh(mesh, nullptr));
    m.ops_set = true;
    values.clear();
    for (size_t i = 0; i < m.params.size(); ++i) {
        check(dsm_engine_param_index(m.engine, m.params[i].name.c_str(), &m.params[i].index));
        m.params[i].tensor.set_data(at::empty({0}, at::kFloat)); // the module's copy is freed
    }
    dsm_dtype_t dt = DSM_FLOAT32;
    check(dsm_engine_dtype(m.engine, &dt));
    m.dtype = to_scalar(dt);
    dsm_device_t dev = DSM_DEVICE_HOST;
    check(dsm_engine_device(m.engine, &dev));
    m.device = dev == DSM_DEVICE_CUDA ? at::Device(at::kCUDA) : at::Device(at::kCPU);
    for (auto &p : m.params) p.tensor.set_data(at::empty({0}, engine_options(m)));
    char *text = nullptr;
    check(dsm_engine_describe(m.engine, DSM_FORMAT_JSON, &text));
    const nlohmann::json d = nlohmann::json::parse(text, nullptr, false);
    dsm_free(text);
    m.zero_stage = d.is_object() && d.contains("zero_stage") ? d["zero_stage"].get<int>() : 0;
    broadcast_buffers(m);

    // ZeRO-3: block by block?
    const size_t nb = m.module->num_blocks();
    std::string why;
    if (m.zero_stage != 3) why = "ZeRO stage " + std::to_string(m.zero_stage) + " keeps the parameters whole";
    else if (opts.zero3_mode == DSM_TORCH_ZERO3_WHOLE) why = "options->zero3_mode is DSM_TORCH_ZERO3_WHOLE";
    else if (nb == 0) why = m.module->why_not_blocks();
    else if (m.loss == DSM_TORCH_LOSS_MODEL) why = "the model computes its own loss from the labels (not a sequence of blocks)";
    if (why.empty()) {
        std::vector<int> owner(m.params.size(), -1);
        m.block_params.assign(nb, {});
        m.block_buffers.assign(nb, {});
        for (size_t b = 0; b < nb; ++b) {
            for (const auto &name : m.module->block_members(b)) {
                for (size_t i = 0; i < m.params.size(); ++i)
                    if (m.params[i].name == name) {
                        owner[i] = static_cast<int>(b);
                        m.block_params[b].push_back(static_cast<int>(i));
                    }
                for (size_t k = 0; k < m.buffers.size(); ++k)
                    if (m.buffers[k].first == name) m.block_buffers[b].push_back(static_cast<int>(k));
            }
        }
        for (size_t i = 0; i < m.params.size() && why.empty(); ++i)
            if (owner[i] < 0) why = "parameter '" + m.params[i].name + "' belongs to no block";
    }
    if (why.empty()) {
        m.blocks = true;
        m.mode_reason = "a sequence of " + std::to_string(nb) + " blocks: each block's parameters are gathered around "
                        "its forward and its backward";
    } else {
        m.mode_reason = why;
        if (opts.zero3_mode == DSM_TORCH_ZERO3_BLOCKS)
            fail(DSM_ERR_NOT_SUPPORTED, "options->zero3_mode is DSM_TORCH_ZERO3_BLOCKS but the model cannot run block "
                                        "by block: " + why);
    }
}

// ---------------------------------------------------------------- checkpoints and export

const char kBlobMagic[8] = {'D', 'S', 'M', 'T', 'O', 'R', 'C', 'H'};

std::string pack_buffers(Model &m) {
    std::string out(kBlobMagic, 8);
    auto put = [&](const void *p, size_t n) { out.append(static_cast<const char *>(p), n); };
    const uint64_t count = m.buffers.size();
    put(&count, 8);
    for (auto &b : m.buffers) {
        const at::Tensor t = b.second.contiguous().to(at::kCPU);
        const uint64_t nlen = b.first.size();
        put(&nlen, 8);
        put(b.first.data(), nlen);
        const int32_t type = static_cast<int32_t>(t.scalar_type()), ndim = static_cast<int32_t>(t.dim());
        put(&type, 4);
        put(&ndim, 4);
        for (int64_t s : t.sizes()) put(&s, 8);
        const uint64_t bytes = static_cast<uint64_t>(t.numel()) * t.element_size();
        put(&bytes, 8);
        put(t.data_ptr(), bytes);
    }
    return out;
}

void unpack_buffers(Model &m, const char *data, size_t size) {
    size_t pos = 0;
    auto get = [&](void *p, size_t n) {
        if (pos + n > size) fail(DSM_ERR_IO, "the checkpoint's client state is truncated (buffers of the model)");
        std::memcpy(p, data + pos, n);
        pos += n;
    };
    char magic[8];
    get(magic, 8);
    if (std::memcmp(magic, kBlobMagic, 8) != 0)
        fail(DSM_ERR_IO, "the checkpoint's client state is not the PyTorch bridge's (no model buffers)");
    uint64_t count = 0;
    get(&count, 8);
    if (count != m.buffers.size())
        fail(DSM_ERR_IO, "the checkpoint holds " + std::to_string(count) + " buffers, the model has " +
                             std::to_string(m.buffers.size()));
    for (uint64_t i = 0; i < count; ++i) {
        uint64_t nlen = 0;
        get(&nlen, 8);
        if (nlen > 4096) fail(DSM_ERR_IO, "the checkpoint's buffer list is corrupt");
        std::string name(nlen, '\0');
        get(&name[0], nlen);
        int32_t type = 0, ndim = 0;
        get(&type, 4);
        get(&ndim, 4);
        if (ndim < 0 || ndim > 64) fail(DSM_ERR_IO, "the checkpoint's buffer '" + name + "' is corrupt");
        std::vector<int64_t> shape(static_cast<size_t>(ndim));
        for (auto &s : shape) get(&s, 8);
        uint64_t bytes = 0;
        get(&bytes, 8);
        at::Tensor *t = nullptr;
        for (auto &b : m.buffers)
            if (b.first == name) t = &b.second;
        if (!t) fail(DSM_ERR_IO, "the checkpoint's buffer '" + name + "' is not a buffer of the model");
        if (static_cast<int32_t>(t->scalar_type()) != type || t->sizes().vec() != shape)
            fail(DSM_ERR_IO, "the checkpoint's buffer '" + name + "' is " +
                                 std::string(c10::toString(static_cast<at::ScalarType>(type))) + " " + shape_str(shape) +
                                 ", the model's is " + tensor_str(*t));
        if (pos + bytes > size) fail(DSM_ERR_IO, "the checkpoint's client state is truncated (buffer '" + name + "')");
        at::Tensor src = at::from_blob(const_cast<char *>(data + pos), shape, at::TensorOptions().dtype(t->scalar_type()));
        t->copy_(src);
        pos += bytes;
    }
}

// Each parameter's fp32 values, in turn, on every rank (collective under ZeRO-3).
template <class F> void for_each_value(Model &m, F &&f) {
    for (auto &p : m.params) {
        int64_t n = 1;
        for (int64_t s : p.shape) n *= s;
        at::Tensor v = at::empty(p.shape, at::kFloat);
        check(dsm_engine_param_read_f32(m.engine, p.index, v.data_ptr<float>(), n));
        f(p, v);
    }
}

const char *safetensors_dtype(at::ScalarType t) {
    switch (t) {
    case at::kFloat: return "F32";
    case at::kDouble: return "F64";
    case at::kHalf: return "F16";
    case at::kBFloat16: return "BF16";
    case at::kLong: return "I64";
    case at::kInt: return "I32";
    case at::kShort: return "I16";
    case at::kChar: return "I8";
    case at::kByte: return "U8";
    case at::kBool: return "BOOL";
    default: return nullptr;
    }
}

void export_safetensors(Model &m, const std::string &path) {
    // Header: parameters (F32) then buffers, offsets in that order.
    nlohmann::ordered_json h;
    h["__metadata__"] = {{"format", "pt"}, {"producer", "libdsm_torch"}};
    uint64_t off = 0;
    for (auto &p : m.params) {
        uint64_t bytes = 4;
        for (int64_t s : p.shape) bytes *= static_cast<uint64_t>(s);
        h[p.name] = {{"dtype", "F32"}, {"shape", p.shape}, {"data_offsets", {off, off + bytes}}};
        off += bytes;
    }
    std::vector<at::Tensor> bufs;
    for (auto &b : m.buffers) {
        at::Tensor t = b.second.detach().contiguous().to(at::kCPU);
        const char *dt = safetensors_dtype(t.scalar_type());
        if (!dt) continue;
        const uint64_t bytes = static_cast<uint64_t>(t.numel()) * t.element_size();
        h[b.first] = {{"dtype", dt}, {"shape", t.sizes().vec()}, {"data_offsets", {off, off + bytes}}};
        off += bytes;
        bufs.push_back(t);
    }
    std::string header = h.dump();
    while ((header.size() + 8) % 8) header.push_back(' ');
    const std::string tmp = path + ".tmp";
    FILE *f = nullptr;
    dsm_status_t st = DSM_SUCCESS;
    std::string msg;
    if (m.rank == 0) {
        f = std::fopen(tmp.c_str(), "wb");
        if (!f) {
            st = DSM_ERR_IO;
            msg = "cannot write " + tmp + ": " + std::strerror(errno);
        } else {
            const uint64_t n = header.size();
            std::fwrite(&n, 8, 1, f);
            std::fwrite(header.data(), 1, header.size(), f);
        }
    }
    agree(m, st, msg);
    for_each_value(m, [&](dsm_torch_model_s::Param &, const at::Tensor &v) {
        if (f) std::fwrite(v.data_ptr(), 4, static_cast<size_t>(v.numel()), f);
    });
    if (f) {
        for (auto &t : bufs) std::fwrite(t.data_ptr(), t.element_size(), static_cast<size_t>(t.numel()), f);
        const bool bad = std::ferror(f) != 0;
        if (std::fclose(f) != 0 || bad || std::rename(tmp.c_str(), path.c_str()) != 0) {
            st = DSM_ERR_IO;
            msg = "cannot write " + path + ": " + std::strerror(errno);
            std::remove(tmp.c_str());
        }
    }
    agree(m, st, msg);
}

void export_torchscript(Model &m, const std::string &path) {
    // Every rank gathers; rank 0 puts the values into its module and saves it.
    dsm_status_t st = DSM_SUCCESS;
    std::string msg;
    std::vector<at::Tensor> held;
    for_each_value(m, [&](dsm_torch_model_s::Param &p, const at::Tensor &v) {
        if (m.rank == 0) {
            p.tensor.set_data(v);
            held.push_back(v);
        }
    });
    if (m.rank == 0) {
        try {
            m.module->save_torchscript(path + ".tmp");
            if (std::rename((path + ".tmp").c_str(), path.c_str()) != 0)
                fail(DSM_ERR_IO, "cannot write " + path + ": " + std::strerror(errno));
        } catch (const Error &e) {
            st = e.status();
            msg = e.what();
        } catch (const std::exception &e) {
            st = DSM_ERR_IO;
            msg = "cannot write " + path + ": " + torch_message(e);
        }
        for (auto &p : m.params) p.tensor.set_data(at::empty({0}, engine_options(m)));
    } else if (m.module->kind() != "TorchScript") {
        st = DSM_ERR_NOT_SUPPORTED;
        msg = "the model is a " + m.module->kind() + ", not TorchScript: export it with dsm_torch_export_safetensors()";
    }
    agree(m, st, msg);
}

std::string describe(Model &m, dsm_format_t format) {
    char *text = nullptr;
    check(dsm_engine_describe(m.engine, DSM_FORMAT_JSON, &text));
    nlohmann::json eng = nlohmann::json::parse(text, nullptr, false);
    dsm_free(text);
    static const char *losses[] = {"config", "mse", "cross_entropy", "model"};
    nlohmann::ordered_json j;
    j["libtorch"] = dsm_torch::libtorch_version();
    j["module"] = m.module->kind();
    j["loss"] = losses[m.loss];
    j["zero3_mode"] = m.zero_stage != 3 ? "none" : m.blocks ? "blocks" : "whole";
    j["zero3_reason"] = m.mode_reason;
    j["blocks"] = m.blocks ? m.block_params.size() : 0;
    j["parameters"] = nlohmann::json::array();
    for (auto &p : m.params)
        j["parameters"].push_back({{"name", p.name}, {"shape", p.shape}, {"trainable", p.trainable}});
    j["buffers"] = nlohmann::json::array();
    for (auto &b : m.buffers)
        j["buffers"].push_back({{"name", b.first}, {"shape", b.second.sizes().vec()},
                                {"dtype", std::string(c10::toString(b.second.scalar_type()))},
                                {"policy", "replicated, broadcast from rank 0 before each training step, in the "
                                           "checkpoint's client state"}});
    j["timers"] = {{"steps", m.steps}, {"step_seconds", m.step_seconds}, {"libdsm_seconds", m.libdsm_seconds}};
    j["engine"] = eng;
    if (format == DSM_FORMAT_JSON) return j.dump(2);
    std::ostringstream os;
    os << "PyTorch model (" << m.module->kind() << ", LibTorch " << dsm_torch::libtorch_version() << ")\n"
       << "  parameters  " << m.params.size() << ", buffers " << m.buffers.size() << "\n"
       << "  loss        " << losses[m.loss] << "\n"
       << "  ZeRO-3 mode " << j["zero3_mode"].get<std::string>() << ": " << m.mode_reason << "\n";
    return os.str();
}

// ---------------------------------------------------------------- the C++ frontend module

class CxxModule : public dsm_torch::Module {
  public:
    CxxModule(std::shared_ptr<torch::nn::Module> m, dsm::torch::Forward f) : m_(std::move(m)), f_(std::move(f)) {}
    explicit CxxModule(torch::nn::Sequential s) : m_(s.ptr()), seq_(s) {
        f_ = [this](const std::vector<at::Tensor> &in) {
            if (in.size() != 1)
                fail(DSM_ERR_INVALID_ARGUMENT, "a torch::nn::Sequential takes 1 input, not " + std::to_string(in.size()));
            return seq_->forward(in[0]);
        };
    }
    std::string kind() const override { return "C++ torch::nn::Module"; }
    Named parameters() override {
        Named out;
        for (auto &p : m_->named_parameters(true)) out.emplace_back(p.key(), p.value());
        return out;
    }
    Named buffers() override {
        Named out;
        for (auto &b : m_->named_buffers(true)) out.emplace_back(b.key(), b.value());
        return out;
    }
    void train(bool on) override { m_->train(on); }
    at::Tensor forward(const std::vector<at::Tensor> &inputs) override { return f_(inputs); }
    size_t num_blocks() const override { return seq_ ? seq_->size() : 0; }
    std::string why_not_blocks() const override {
        return "a C++ module with a forward function of its own (pass a torch::nn::Sequential to run block by block)";
    }
    at::Tensor forward_block(size_t b, const at::Tensor &x) override { return (seq_->begin() + static_cast<long>(b))->forward(x); }
    std::vector<std::string> block_members(size_t b) const override {
        std::vector<std::string> out;
        const auto child = seq_->named_children()[b];
        for (auto &p : child.value()->named_parameters(true)) out.push_back(child.key() + "." + p.key());
        for (auto &p : child.value()->named_buffers(true)) out.push_back(child.key() + "." + p.key());
        return out;
    }

  private:
    std::shared_ptr<torch::nn::Module> m_;
    dsm::torch::Forward f_;
    torch::nn::Sequential seq_{nullptr};
};

// ---------------------------------------------------------------- the C boundary

template <class F> dsm_status_t guarded(const char *fn, F &&f) {
    try {
        f();
        return DSM_SUCCESS;
    } catch (const Error &e) {
        return dsm_report_error(e.status(), fn, e.what());
    } catch (const std::bad_alloc &) {
        return dsm_report_error(DSM_ERR_OUT_OF_MEMORY, fn, "out of memory");
    } catch (const std::exception &e) {
        return dsm_report_error(DSM_ERR_INTERNAL, fn, torch_message(e).c_str());
    }
}

#define DSM_TORCH_NOT_NULL(p)                                                                                         \
    do {                                                                                                              \
        if (!(p)) return dsm_report_error(DSM_ERR_NULL_POINTER, fn, #p " is NULL");                                   \
    } while (0)

std::vector<at::Tensor> inputs_of(const dsm_torch_tensor_t *inputs, int ninputs) {
    std::vector<at::Tensor> v;
    for (int i = 0; i < ninputs; ++i) v.push_back(from_desc(("inputs[" + std::to_string(i) + "]").c_str(), inputs[i]));
    return v;
}

// Local checks of a step's arguments, agreed over the ranks.
template <class F> std::vector<at::Tensor> agreed_inputs(Model &m, F &&make) {
    dsm_status_t st = DSM_SUCCESS;
    std::string msg;
    std::vector<at::Tensor> v;
    try {
        v = make();
    } catch (const Error &e) {
        st = e.status();
        msg = e.what();
    }
    agree(m, st, msg);
    return v;
}

} // namespace

const char *dsm_torch::libtorch_version() { return TORCH_VERSION; }

dsm_status_t dsm_torch::create_model(const char *fn, dsm_mesh_t mesh,
                                     const std::function<std::unique_ptr<Module>()> &load, const char *config,
                                     const dsm_torch_options_t *options, dsm_torch_model_t *model) {
    DSM_TORCH_NOT_NULL(model);
    *model = nullptr;
    DSM_TORCH_NOT_NULL(mesh);
    DSM_TORCH_NOT_NULL(config);
    auto m = std::make_unique<Model>();
    const dsm_status_t st = guarded(fn, [&] { create(*m, mesh, load, config, options); });
    if (st == DSM_SUCCESS) *model = m.release();
    return st;
}

extern "C" {

DSM_API dsm_status_t dsm_torch_model_free(dsm_torch_model_t *model) {
    const char *fn = "dsm_torch_model_free";
    if (!model || !*model) return DSM_SUCCESS;
    dsm_status_t st = DSM_SUCCESS;
    if ((*model)->ops_set) {
        (*model)->ops_set = false;
        st = dsm_torch_ops_clear();
        if (st != DSM_SUCCESS) dsm_report_error(st, fn, dsm_last_error());
    }
    if ((*model)->engine) {
        const dsm_status_t est = dsm_engine_free(&(*model)->engine);
        if (est != DSM_SUCCESS) dsm_report_error(est, fn, dsm_last_error());
        if (st == DSM_SUCCESS) st = est;
    }
    delete *model;
    *model = nullptr;
    return st;
}

DSM_API dsm_status_t dsm_torch_model_borrow_engine(dsm_torch_model_t model, dsm_engine_t *engine) {
    const char *fn = "dsm_torch_model_borrow_engine";
    DSM_TORCH_NOT_NULL(model);
    DSM_TORCH_NOT_NULL(engine);
    *engine = model->engine;
    return DSM_SUCCESS;
}

DSM_API dsm_status_t dsm_torch_train_step(dsm_torch_model_t model, const dsm_torch_tensor_t *inputs, int ninputs,
                                          const dsm_torch_tensor_t *labels, double *loss, dsm_step_info_t *info) {
    const char *fn = "dsm_torch_train_step";
    DSM_TORCH_NOT_NULL(model);
    return guarded(fn, [&] {
        at::Tensor lab;
        auto in = agreed_inputs(*model, [&] {
            if (!inputs) fail(DSM_ERR_NULL_POINTER, "inputs is NULL");
            if (ninputs < 1 || ninputs > 64)
                fail(DSM_ERR_INVALID_ARGUMENT, "ninputs is " + std::to_string(ninputs) + ", must be 1..64");
            if (!labels && model->loss != DSM_TORCH_LOSS_MODEL)
                fail(DSM_ERR_NULL_POINTER, "labels is NULL (only the loss \"model\" goes without labels)");
            if (labels) lab = from_desc("labels", *labels);
            return inputs_of(inputs, ninputs);
        });
        const double l = train_step(*model, fn, in, labels ? &lab : nullptr, nullptr, info);
        if (loss) *loss = l;
    });
}

DSM_API dsm_status_t dsm_torch_inference(dsm_torch_model_t model, const dsm_torch_tensor_t *inputs, int ninputs,
                                         dsm_torch_tensor_t *output) {
    const char *fn = "dsm_torch_inference";
    DSM_TORCH_NOT_NULL(model);
    return guarded(fn, [&] {
        at::Tensor dst;
        auto in = agreed_inputs(*model, [&] {
            if (!inputs) fail(DSM_ERR_NULL_POINTER, "inputs is NULL");
            if (!output) fail(DSM_ERR_NULL_POINTER, "output is NULL");
            if (ninputs < 1 || ninputs > 64)
                fail(DSM_ERR_INVALID_ARGUMENT, "ninputs is " + std::to_string(ninputs) + ", must be 1..64");
            dst = from_desc("output", *output);
            return inputs_of(inputs, ninputs);
        });
        at::Tensor out = inference(*model, in);
        dsm_status_t st = DSM_SUCCESS;
        std::string msg;
        if (out.numel() != dst.numel()) {
            st = DSM_ERR_INVALID_ARGUMENT;
            msg = "output " + tensor_str(dst) + " does not match the model's output " + tensor_str(out);
        }
        agree(*model, st, msg);
        dst.view(out.sizes()).copy_(out);
    });
}

DSM_API dsm_status_t dsm_torch_save_checkpoint(dsm_torch_model_t model, const char *dir, const char *tag) {
    const char *fn = "dsm_torch_save_checkpoint";
    DSM_TORCH_NOT_NULL(model);
    return guarded(fn, [&] {
        const std::string blob = pack_buffers(*model);
        check(dsm_engine_save_checkpoint(model->engine, dir, tag, blob.data(), blob.size()));
    });
}

DSM_API dsm_status_t dsm_torch_load_checkpoint(dsm_torch_model_t model, const char *dir, const char *tag,
                                               unsigned flags) {
    const char *fn = "dsm_torch_load_checkpoint";
    DSM_TORCH_NOT_NULL(model);
    return guarded(fn, [&] {
        void *blob = nullptr;
        size_t size = 0;
        check(dsm_engine_load_checkpoint(model->engine, dir, tag, flags, &blob, &size));
        dsm_status_t st = DSM_SUCCESS;
        std::string msg;
        try {
            if (blob) unpack_buffers(*model, static_cast<const char *>(blob), size);
        } catch (const Error &e) {
            st = e.status();
            msg = e.what();
        }
        dsm_free(blob);
        agree(*model, st, msg);
    });
}

DSM_API dsm_status_t dsm_torch_export_safetensors(dsm_torch_model_t model, const char *path) {
    const char *fn = "dsm_torch_export_safetensors";
    DSM_TORCH_NOT_NULL(model);
    DSM_TORCH_NOT_NULL(path);
    return guarded(fn, [&] { export_safetensors(*model, path); });
}

DSM_API dsm_status_t dsm_torch_export_torchscript(dsm_torch_model_t model, const char *path) {
    const char *fn = "dsm_torch_export_torchscript";
    DSM_TORCH_NOT_NULL(model);
    DSM_TORCH_NOT_NULL(path);
    return guarded(fn, [&] { export_torchscript(*model, path); });
}

DSM_API dsm_status_t dsm_torch_model_describe(dsm_torch_model_t model, dsm_format_t format, char **text) {
    const char *fn = "dsm_torch_model_describe";
    DSM_TORCH_NOT_NULL(model);
    DSM_TORCH_NOT_NULL(text);
    *text = nullptr;
    if (format != DSM_FORMAT_TEXT && format != DSM_FORMAT_JSON)
        return dsm_report_error(DSM_ERR_INVALID_ARGUMENT, fn,
                                ("format is " + std::to_string(static_cast<int>(format)) +
                                 ", must be DSM_FORMAT_TEXT or DSM_FORMAT_JSON").c_str());
    return guarded(fn, [&] {
        const std::string s = describe(*model, format);
        // dsm_free() frees it: the C allocator.
        char *out = static_cast<char *>(std::malloc(s.size() + 1));
        if (!out) fail(DSM_ERR_OUT_OF_MEMORY, "out of memory");
        std::memcpy(out, s.c_str(), s.size() + 1);
        *text = out;
    });
}

DSM_API dsm_status_t dsm_torch_version(const char **libtorch_version, int *cuda) {
    if (libtorch_version) *libtorch_version = TORCH_VERSION;
    if (cuda) *cuda = at::hasCUDA() ? 1 : 0;
    return DSM_SUCCESS;
}

} // extern "C"

// ---------------------------------------------------------------- C++ API

dsm_status_t dsm::torch::model_create(dsm_mesh_t mesh, std::shared_ptr<::torch::nn::Module> module, Forward forward,
                                      const char *config, const dsm_torch_options_t *options,
                                      dsm_torch_model_t *model) {
    const char *fn = "dsm::torch::model_create";
    DSM_TORCH_NOT_NULL(module);
    if (!forward) return dsm_report_error(DSM_ERR_NULL_POINTER, fn, "forward is empty");
    return dsm_torch::create_model(
        fn, mesh, [&] { return std::make_unique<CxxModule>(module, forward); }, config, options, model);
}

dsm_status_t dsm::torch::model_create(dsm_mesh_t mesh, ::torch::nn::Sequential sequential, const char *config,
                                      const dsm_torch_options_t *options, dsm_torch_model_t *model) {
    const char *fn = "dsm::torch::model_create";
    if (sequential.is_empty()) return dsm_report_error(DSM_ERR_NULL_POINTER, fn, "sequential is empty");
    return dsm_torch::create_model(
        fn, mesh, [&] { return std::make_unique<CxxModule>(sequential); }, config, options, model);
}

dsm_status_t dsm::torch::train_step(dsm_torch_model_t model, const std::vector<at::Tensor> &inputs,
                                    const at::Tensor &labels, double *loss, dsm_step_info_t *info, const Loss &loss_fn) {
    const char *fn = "dsm::torch::train_step";
    DSM_TORCH_NOT_NULL(model);
    return guarded(fn, [&] {
        agreed_inputs(*model, [&] {
            if (inputs.empty()) fail(DSM_ERR_INVALID_ARGUMENT, "no inputs");
            for (size_t i = 0; i < inputs.size(); ++i)
                if (!inputs[i].defined()) fail(DSM_ERR_INVALID_ARGUMENT, "inputs[" + std::to_string(i) + "] is undefined");
            return inputs;
        });
        const double l = ::train_step(*model, fn, inputs, &labels, loss_fn ? &loss_fn : nullptr, info);
        if (loss) *loss = l;
    });
}

dsm_status_t dsm::torch::inference(dsm_torch_model_t model, const std::vector<at::Tensor> &inputs, at::Tensor *output) {
    const char *fn = "dsm::torch::inference";
    DSM_TORCH_NOT_NULL(model);
    DSM_TORCH_NOT_NULL(output);
    return guarded(fn, [&] { *output = ::inference(*model, inputs); });
}
