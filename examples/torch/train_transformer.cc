// train_transformer: a transformer written with the LibTorch C++ frontend
// (torch::nn modules), trained on libdsm with ZeRO-3 block by block and
// bf16 through <dsm/torch.hpp>.
//
//   mpiexec -n 4 ./train_transformer CONFIG.json [--steps N] [--text FILE] [--min-factor F]
//
// The task: next-byte prediction on a text (byte-level language modelling;
// a built-in passage of public-domain English, or --text FILE). Each rank
// trains on its own windows of the text (data parallel over the ranks),
// drawn from a generator that depends only on the step and the rank.
//
// The model is a GPT-style decoder as a torch::nn::Sequential of blocks:
// the embedding (bytes and positions), kLayers transformer blocks
// (pre-LayerNorm causal self-attention and a GELU MLP, each with its
// residual), and the head (LayerNorm, Linear to 256 logits). Handed to the
// engine as a Sequential, it runs block by block under ZeRO-3: each block's
// parameters are gathered around its forward and again around its backward,
// so at most about one block is gathered at a time instead of the whole
// model. The configuration (train_transformer.json) asks for ZeRO-3, bf16
// (the parameters the model computes with are bf16 views of the engine's
// memory, fp32 master weights in the optimizer), AdamW, gradient clipping
// and a warmup-cosine schedule.
//
// Rank 0 prints the ZeRO-3 mode the bridge chose and why, the loss (the
// mean over the ranks) every few steps, and at the end "loss X -> Y (Zx
// lower)": X the first step's, Y the mean of the last 10. Exit status 0
// when the loss fell by at least --min-factor (default 2), 2 when it did
// not, 1 on an error (on every rank: the bridge's calls are collective).

#include <dsm.h>
#include <dsm/torch.hpp>
#include <mpi.h>

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

// ---------------------------------------------------------------- the configuration of the model

constexpr int64_t kVocab = 256;   // bytes
constexpr int64_t kContext = 32;  // tokens per window
constexpr int64_t kDim = 64;      // model width
constexpr int64_t kHeads = 4;
constexpr int64_t kLayers = 4;

// ---------------------------------------------------------------- the blocks

// Bytes and positions to vectors: [B, T] int64 -> [B, T, kDim].
struct EmbeddingImpl : torch::nn::Module {
    torch::nn::Embedding tokens{nullptr}, positions{nullptr};
    EmbeddingImpl() {
        tokens = register_module("tokens", torch::nn::Embedding(kVocab, kDim));
        positions = register_module("positions", torch::nn::Embedding(kContext, kDim));
    }
    torch::Tensor forward(const torch::Tensor &idx) {
        const auto pos = torch::arange(idx.size(1), idx.options().dtype(torch::kLong));
        return tokens(idx) + positions(pos).unsqueeze(0);
    }
};
TORCH_MODULE(Embedding);

// Causal multi-head self-attention: [B, T, C] -> [B, T, C].
struct AttentionImpl : torch::nn::Module {
    torch::nn::Linear qkv{nullptr}, proj{nullptr};
    AttentionImpl() {
        qkv = register_module("qkv", torch::nn::Linear(kDim, 3 * kDim));
        proj = register_module("proj", torch::nn::Linear(kDim, kDim));
    }
    torch::Tensor forward(const torch::Tensor &x) {
        const int64_t B = x.size(0), T = x.size(1), hd = kDim / kHeads;
        auto parts = qkv(x).view({B, T, 3, kHeads, hd}).permute({2, 0, 3, 1, 4}); // [3, B, H, T, hd]
        auto q = parts[0], k = parts[1], v = parts[2];
        auto att = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(hd));
        auto future = torch::ones({T, T}, x.options().dtype(torch::kBool)).triu(1);
        att = torch::softmax(att.masked_fill(future, -INFINITY), -1);
        auto y = torch::matmul(att, v).transpose(1, 2).reshape({B, T, kDim});
        return proj(y);
    }
};
TORCH_MODULE(Attention);

// One transformer block, pre-LayerNorm: x + attn(ln1(x)), then + mlp(ln2(x)).
struct BlockImpl : torch::nn::Module {
    torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
    Attention attn{nullptr};
    torch::nn::Sequential mlp{nullptr};
    BlockImpl() {
        ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDim})));
        attn = register_module("attn", Attention());
        ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDim})));
        mlp = register_module("mlp", torch::nn::Sequential(torch::nn::Linear(kDim, 4 * kDim), torch::nn::GELU(),
                                                           torch::nn::Linear(4 * kDim, kDim)));
    }
    torch::Tensor forward(torch::Tensor x) {
        x = x + attn(ln1(x));
        return x + mlp->forward(ln2(x));
    }
};
TORCH_MODULE(Block);

// The last LayerNorm and the logits: [B, T, C] -> [B, T, kVocab].
struct HeadImpl : torch::nn::Module {
    torch::nn::LayerNorm ln{nullptr};
    torch::nn::Linear out{nullptr};
    HeadImpl() {
        ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDim})));
        out = register_module("out", torch::nn::Linear(kDim, kVocab));
    }
    torch::Tensor forward(const torch::Tensor &x) { return out(ln(x)); }
};
TORCH_MODULE(Head);

torch::nn::Sequential make_model() {
    torch::nn::Sequential seq;
    seq->push_back("embed", Embedding());
    for (int64_t l = 0; l < kLayers; ++l) seq->push_back("block" + std::to_string(l), Block());
    seq->push_back("head", Head());
    return seq;
}

// The loss: cross entropy of the logits against the next bytes, in fp32
// (the logits are bf16 under bf16).
torch::Tensor next_byte_loss(const torch::Tensor &logits, const torch::Tensor &targets) {
    return torch::nn::functional::cross_entropy(logits.reshape({-1, kVocab}).to(torch::kFloat),
                                                targets.reshape({-1}));
}

// ---------------------------------------------------------------- the data

// Public domain: the opening of Charles Dickens, A Tale of Two Cities (1859).
const char *kText =
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
    "foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, "
    "it was the season of Darkness, it was the spring of hope, it was the winter of despair, we had "
    "everything before us, we had nothing before us, we were all going direct to Heaven, we were all going "
    "direct the other way - in short, the period was so far like the present period, that some of its "
    "noisiest authorities insisted on its being received, for good or for evil, in the superlative degree "
    "of comparison only. There were a king with a large jaw and a queen with a plain face, on the throne "
    "of England; there were a king with a large jaw and a queen with a fair face, on the throne of France. "
    "In both countries it was clearer than crystal to the lords of the State preserves of loaves and "
    "fishes, that things in general were settled for ever.";

// A position in the text for window i of rank r at step s: a hash of the
// three (splitmix64), so that no rank needs another's state.
uint64_t mix(uint64_t z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

// This rank's micro-batch of step s: inputs [B, T] and targets [B, T]
// (the inputs shifted by one byte).
void make_batch(const std::string &text, int64_t step, int rank, int64_t batch, torch::Tensor *x,
                torch::Tensor *y) {
    *x = torch::empty({batch, kContext}, torch::kLong);
    *y = torch::empty({batch, kContext}, torch::kLong);
    auto xa = x->accessor<int64_t, 2>();
    auto ya = y->accessor<int64_t, 2>();
    const uint64_t span = text.size() - kContext - 1;
    for (int64_t b = 0; b < batch; ++b) {
        const uint64_t at = mix((static_cast<uint64_t>(step) << 24) ^ (static_cast<uint64_t>(rank) << 12) ^
                                static_cast<uint64_t>(b)) % span;
        for (int64_t t = 0; t < kContext; ++t) {
            xa[b][t] = static_cast<unsigned char>(text[at + t]);
            ya[b][t] = static_cast<unsigned char>(text[at + t + 1]);
        }
    }
}

// A string field of the bridge's JSON description ("zero3_mode": "blocks").
std::string json_string(const std::string &json, const std::string &key) {
    const std::string k = "\"" + key + "\": \"";
    const size_t at = json.find(k);
    if (at == std::string::npos) return "?";
    const size_t from = at + k.size();
    return json.substr(from, json.find('"', from) - from);
}

int fail(int rank, const char *what, dsm_status_t st) {
    std::fprintf(stderr, "rank %d: %s failed (%s): %s\n", rank, what, dsm_status_string(st), dsm_last_error());
    return 1;
}

} // namespace

int main(int argc, char **argv) {
    int provided, rank, world;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);

    const char *config = nullptr, *text_path = nullptr;
    int64_t steps = 40;
    double min_factor = 2.0;
    bool usage = false;
    for (int a = 1; a < argc; ++a) {
        if (!std::strcmp(argv[a], "--steps") && a + 1 < argc) steps = std::atoll(argv[++a]);
        else if (!std::strcmp(argv[a], "--text") && a + 1 < argc) text_path = argv[++a];
        else if (!std::strcmp(argv[a], "--min-factor") && a + 1 < argc) min_factor = std::atof(argv[++a]);
        else if (argv[a][0] != '-' && !config) config = argv[a];
        else usage = true;
    }
    if (usage || !config || steps < 1) {
        if (rank == 0)
            std::fprintf(stderr, "usage: train_transformer CONFIG.json [--steps N] [--text FILE] [--min-factor F]\n");
        MPI_Finalize();
        return 1;
    }
    std::string text = kText;
    if (text_path) { // the same file on every rank
        std::ifstream in(text_path, std::ios::binary);
        std::stringstream ss;
        ss << in.rdbuf();
        text = ss.str();
        int ok = in.good() || in.eof() ? 1 : 0, all_ok = 0;
        if (text.size() < static_cast<size_t>(2 * kContext)) ok = 0;
        MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        if (!all_ok) {
            if (!ok) std::fprintf(stderr, "rank %d: cannot read %s, or it is shorter than %d bytes\n", rank,
                                  text_path, static_cast<int>(2 * kContext));
            MPI_Finalize();
            return 1;
        }
    }
    torch::set_num_threads(1);

    int code = 1;
    dsm_mesh_t mesh = nullptr;
    dsm_torch_model_t model = nullptr;
    do {
        // Every rank builds the same initial weights (the same seed); the
        // bridge checks that they agree.
        torch::manual_seed(0);
        torch::nn::Sequential net = make_model();
        int64_t nparams = 0; // counted here: under ZeRO-3 the module keeps no copy of its own
        for (const auto &p : net->parameters()) nparams += p.numel();

        const int shape[1] = {world};
        const char *names[1] = {"data_parallel"};
        dsm_status_t st = dsm_mesh_create(MPI_COMM_WORLD, 1, shape, names, &mesh);
        if (st != DSM_SUCCESS) { fail(rank, "dsm_mesh_create", st); break; }
        st = dsm::torch::model_create(mesh, net, config, nullptr, &model);
        if (st != DSM_SUCCESS) { fail(rank, "dsm::torch::model_create", st); break; }

        // The batch of the configuration: this rank's micro-batch.
        dsm_config_t cfg = nullptr;
        int64_t train_batch = 0, micro = 0, gas = 0, dp = 0;
        st = dsm_config_load_for_mesh(mesh, config, 0, &cfg);
        if (st == DSM_SUCCESS) st = dsm_config_batch(cfg, &train_batch, &micro, &gas, &dp);
        dsm_config_free(&cfg);
        if (st != DSM_SUCCESS) { fail(rank, "the configuration's batch", st); break; }

        char *desc = nullptr;
        st = dsm_torch_model_describe(model, DSM_FORMAT_JSON, &desc);
        if (st != DSM_SUCCESS) { fail(rank, "dsm_torch_model_describe", st); break; }
        const std::string json = desc;
        dsm_free(desc);
        dsm_engine_t engine = nullptr;
        dsm_torch_model_borrow_engine(model, &engine);
        dsm_dtype_t dtype = DSM_FLOAT32;
        dsm_engine_dtype(engine, &dtype);
        if (rank == 0) {
            std::printf("train_transformer: %d blocks of width %d (%" PRId64 " parameters), %d ranks, "
                        "micro-batch %" PRId64 " x %d bytes, %s compute\n",
                        static_cast<int>(kLayers), static_cast<int>(kDim), nparams, world, micro,
                        static_cast<int>(kContext), dsm_dtype_name(dtype));
            std::printf("ZeRO-3 mode: %s (%s)\n", json_string(json, "zero3_mode").c_str(),
                        json_string(json, "zero3_reason").c_str());
        }

        // The training: one micro-step per call; the optimizer runs at each
        // accumulation boundary.
        double first = -1, last = 0;
        int nlast = 0;
        bool ok = true;
        for (int64_t s = 0; s < steps && ok; ++s) {
            double window = 0;
            dsm_step_info_t info = DSM_STEP_INFO_INITIALIZER;
            for (int64_t m = 0; m < gas; ++m) {
                torch::Tensor x, y;
                make_batch(text, s * gas + m, rank, micro, &x, &y);
                double loss = 0;
                st = dsm::torch::train_step(model, {x}, y, &loss, &info, next_byte_loss);
                if (st != DSM_SUCCESS) { fail(rank, "dsm::torch::train_step", st); ok = false; break; }
                window += loss / gas;
            }
            if (!ok) break;
            double mean = 0;
            MPI_Allreduce(&window, &mean, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
            mean /= world;
            if (first < 0) first = mean;
            if (s >= steps - 10) { last += mean; ++nlast; }
            if (rank == 0 && (s % 10 == 0 || s == steps - 1))
                std::printf("step %4" PRId64 "  loss %.4f  lr %.3e  grad_norm %.3f\n", info.global_steps, mean, info.lr,
                            info.grad_norm);
        }
        if (!ok) break;
        last /= nlast;
        if (rank == 0)
            std::printf("loss %.4f -> %.4f (%.2fx lower; ln 256 = %.4f)\n", first, last, first / last, std::log(256.0));
        code = first / last >= min_factor ? 0 : 2;
        if (code && rank == 0) std::printf("train_transformer: FAIL: the loss fell less than %.2fx\n", min_factor);
    } while (false);

    dsm_torch_model_free(&model);
    dsm_mesh_free(&mesh);
    MPI_Finalize();
    return code;
}
