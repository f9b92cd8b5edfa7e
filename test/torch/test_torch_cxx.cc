// The PyTorch bridge's C++ API (dsm/torch.hpp) on LibTorch C++ frontend
// modules: a torch::nn::Sequential (block by block under ZeRO-3) and a
// module with a forward of its own (whole), trained with the engine on every
// rank's micro-batch, against LibTorch's own training of a copy of the same
// module on the whole global batch with torch::optim::AdamW and
// clip_grad_norm_ (what DistributedDataParallel computes): the final
// parameters within 1e-5 relative. Also: the parameters are the engine's
// memory during a step, and a step with a custom loss.
//   test_torch_cxx STAGE
#include <dsm/torch.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

int rank, world, failures;

void expect(bool ok, const char *what) {
    if (!ok) {
        std::fprintf(stderr, "rank %d: FAIL: %s: %s\n", rank, what, dsm_last_error());
        ++failures;
    }
}

struct Net : torch::nn::Module {
    Net() {
        fc1 = register_module("fc1", torch::nn::Linear(8, 16));
        fc2 = register_module("fc2", torch::nn::Linear(16, 4));
    }
    torch::Tensor forward(const torch::Tensor &x) { return fc2(torch::tanh(fc1(x))); }
    torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

// The reference: the same initial values, the global batch, LibTorch's AdamW.
std::vector<torch::Tensor> reference(const std::vector<torch::Tensor> &init, const std::function<torch::Tensor(
                                     const torch::Tensor &)> &fwd, std::vector<torch::Tensor> params,
                                     const torch::Tensor &X, const torch::Tensor &Y, int steps) {
    {
        torch::NoGradGuard g;
        for (size_t i = 0; i < params.size(); ++i) params[i].copy_(init[i]);
    }
    torch::optim::AdamW opt(params, torch::optim::AdamWOptions(0.01).weight_decay(0.01));
    for (int s = 0; s < steps; ++s) {
        opt.zero_grad();
        auto xs = X.narrow(0, s * 4 * world, 4 * world), ys = Y.narrow(0, s * 4 * world, 4 * world);
        // DDP: the mean over the ranks of each rank's mean loss.
        torch::Tensor loss = torch::zeros({});
        for (int r = 0; r < world; ++r)
            loss = loss + torch::mse_loss(fwd(xs.narrow(0, 4 * r, 4)), ys.narrow(0, 4 * r, 4)) / world;
        loss.backward();
        torch::nn::utils::clip_grad_norm_(params, 0.5);
        opt.step();
    }
    std::vector<torch::Tensor> out;
    for (auto &p : params) out.push_back(p.detach().clone());
    return out;
}

void compare(dsm_torch_model_t model, const std::vector<torch::Tensor> &ref, const char *what) {
    dsm_engine_t engine;
    dsm_torch_model_borrow_engine(model, &engine);
    for (size_t i = 0; i < ref.size(); ++i) {
        torch::Tensor v = torch::empty(ref[i].sizes());
        expect(dsm_engine_param_read_f32(engine, static_cast<int>(i), v.data_ptr<float>(), v.numel()) == DSM_SUCCESS,
               "dsm_engine_param_read_f32");
        const double rel = (v - ref[i]).norm().item<double>() / ref[i].norm().item<double>();
        if (!(rel <= 1e-5)) {
            std::fprintf(stderr, "rank %d: %s: parameter %zu differs from LibTorch's training by %.3g\n", rank, what,
                         i, rel);
            ++failures;
        }
    }
}

} // namespace

int main(int argc, char **argv) {
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    torch::set_num_threads(1);
    const int stage = argc > 1 ? std::atoi(argv[1]) : 3, steps = 10;
    char config[512];
    std::snprintf(config, sizeof config,
                  "{\"train_batch_size\": %d, \"train_micro_batch_size_per_gpu\": 4, \"gradient_clipping\": 0.5,"
                  " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.01}},"
                  " \"zero_optimization\": {\"stage\": %d}}", 4 * world, stage);
    torch::manual_seed(5);
    const torch::Tensor X = torch::randn({4 * world * steps, 8}), Y = torch::randn({4 * world * steps, 4});
    dsm_mesh_t mesh;
    const int shape[1] = {world};
    const char *names[1] = {"data_parallel"};
    dsm_mesh_create(MPI_COMM_WORLD, 1, shape, names, &mesh);

    // A Sequential: block by block under ZeRO-3.
    {
        torch::manual_seed(1);
        torch::nn::Sequential seq(torch::nn::Linear(8, 16), torch::nn::Tanh(), torch::nn::Linear(16, 16),
                                  torch::nn::Tanh(), torch::nn::Linear(16, 4));
        std::vector<torch::Tensor> init;
        for (auto &p : seq->parameters()) init.push_back(p.detach().clone());
        torch::nn::Sequential copy = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(seq->clone());
        dsm_torch_model_t model;
        expect(dsm::torch::model_create(mesh, seq, config, nullptr, &model) == DSM_SUCCESS, "model_create(Sequential)");
        char *text = nullptr;
        dsm_torch_model_describe(model, DSM_FORMAT_TEXT, &text);
        if (stage == 3) expect(std::strstr(text, "ZeRO-3 mode blocks") != nullptr, "a Sequential runs block by block");
        dsm_free(text);
        for (int s = 0; s < steps; ++s) {
            const auto x = X.narrow(0, (s * world + rank) * 4, 4), y = Y.narrow(0, (s * world + rank) * 4, 4);
            double loss = 0;
            expect(dsm::torch::train_step(model, {x}, y, &loss, nullptr) == DSM_SUCCESS, "train_step(Sequential)");
            // Between steps the module holds no copy of the model.
            expect(seq->parameters()[0].numel() == 0, "the parameters are empty between steps");
        }
        const auto ref = reference(init, [&](const torch::Tensor &x) { return copy->forward(x); }, copy->parameters(),
                                   X, Y, steps);
        compare(model, ref, "Sequential");
        torch::Tensor out;
        expect(dsm::torch::inference(model, {X.narrow(0, 0, 4)}, &out) == DSM_SUCCESS, "inference");
        expect(out.dim() == 2 && out.size(0) == 4 && out.size(1) == 4, "the inference output is [4, 4]");
        expect(dsm_torch_model_free(&model) == DSM_SUCCESS && model == nullptr, "free");
    }

    // A module with its own forward: gathered whole; and a custom loss.
    {
        torch::manual_seed(2);
        auto net = std::make_shared<Net>();
        std::vector<torch::Tensor> init;
        for (auto &p : net->parameters()) init.push_back(p.detach().clone());
        auto copy = std::make_shared<Net>();
        dsm_torch_model_t model;
        expect(dsm::torch::model_create(mesh, net, [net](const std::vector<at::Tensor> &in) { return net->forward(in[0]); },
                                        config, nullptr, &model) == DSM_SUCCESS, "model_create(Module)");
        for (int s = 0; s < steps; ++s) {
            const auto x = X.narrow(0, (s * world + rank) * 4, 4), y = Y.narrow(0, (s * world + rank) * 4, 4);
            double loss = 0;
            // Inside the forward the parameters are the engine's memory.
            dsm::torch::Loss mse = [&](const at::Tensor &o, const at::Tensor &l) {
                expect(net->fc1->weight.numel() == 8 * 16, "the parameters are views of the engine's during a step");
                return torch::mse_loss(o, l);
            };
            expect(dsm::torch::train_step(model, {x}, y, &loss, nullptr, mse) == DSM_SUCCESS, "train_step(Module)");
        }
        const auto ref = reference(init, [&](const torch::Tensor &x) { return copy->forward(x); }, copy->parameters(),
                                   X, Y, steps);
        compare(model, ref, "Module");
        expect(dsm_torch_export_torchscript(model, "/tmp/not-used.pt") == DSM_ERR_NOT_SUPPORTED,
               "a C++ module has no TorchScript to export");
        expect(dsm_torch_model_free(&model) == DSM_SUCCESS, "free");
    }
    dsm_mesh_free(&mesh);
    int any = 0;
    MPI_Allreduce(&failures, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0) std::printf("%s: C++ API at ZeRO-%d on %d ranks\n", any ? "FAIL" : "ok", stage, world);
    MPI_Finalize();
    return any ? 1 : 0;
}
