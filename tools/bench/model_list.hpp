// The parameter lists of real models for dsm-bench zero and optimizer
// (--model): names, shapes and weight-decay flags as the models' reference
// implementations have them (Hugging Face transformers' GPT-2 and LLaMA
// names; decay on every tensor of two or more dimensions, none on biases and
// norms, as nanoGPT and the Hugging Face trainers group them), or a JSON file
// of the same.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dsm {
namespace bench {

struct ModelTensor {
    std::string name;
    std::vector<int64_t> shape;
    bool decay = true;
    int64_t numel() const;
};

struct ModelList {
    std::string name;                 // "gpt2", or the JSON file's path
    std::vector<ModelTensor> tensors; // in the model's order
    int64_t numel() const;
};

// The names --model takes besides a JSON file.
const std::vector<std::string> &model_names();

// `what`: one of model_names(), or a path to a JSON file:
//   {"parameters": [{"name": "wte", "shape": [50257, 768], "decay": true}, ...]}
// ("decay" optional: true for two or more dimensions). Throws
// DSM_ERR_INVALID_ARGUMENT naming the model or the file and the bad entry.
ModelList model_list(const std::string &what);

} // namespace bench
} // namespace dsm
