// Parameter lists of real models (model_list.hpp).
#include "model_list.hpp"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "../common/cli.hpp"
#include "core/error.hpp"

namespace dsm {
namespace bench {

int64_t ModelTensor::numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
}

int64_t ModelList::numel() const {
    int64_t n = 0;
    for (const ModelTensor &t : tensors) n += t.numel();
    return n;
}

namespace {

void add(ModelList &m, std::string name, std::vector<int64_t> shape) {
    const bool decay = shape.size() >= 2;
    m.tensors.push_back(ModelTensor{std::move(name), std::move(shape), decay});
}

// GPT-2 (transformers' GPT2LMHeadModel: Conv1D weights are in x out, the
// output head shares wte): 2 + 12 per layer + 2 tensors.
ModelList gpt2(const char *name, int64_t layers, int64_t d) {
    const int64_t vocab = 50257, ctx = 1024;
    ModelList m;
    m.name = name;
    add(m, "transformer.wte.weight", {vocab, d});
    add(m, "transformer.wpe.weight", {ctx, d});
    for (int64_t l = 0; l < layers; ++l) {
        const std::string h = "transformer.h." + std::to_string(l) + ".";
        add(m, h + "ln_1.weight", {d});
        add(m, h + "ln_1.bias", {d});
        add(m, h + "attn.c_attn.weight", {d, 3 * d});
        add(m, h + "attn.c_attn.bias", {3 * d});
        add(m, h + "attn.c_proj.weight", {d, d});
        add(m, h + "attn.c_proj.bias", {d});
        add(m, h + "ln_2.weight", {d});
        add(m, h + "ln_2.bias", {d});
        add(m, h + "mlp.c_fc.weight", {d, 4 * d});
        add(m, h + "mlp.c_fc.bias", {4 * d});
        add(m, h + "mlp.c_proj.weight", {4 * d, d});
        add(m, h + "mlp.c_proj.bias", {d});
    }
    add(m, "transformer.ln_f.weight", {d});
    add(m, "transformer.ln_f.bias", {d});
    return m;
}

// LLaMA 7B (transformers' LlamaForCausalLM): 32 layers, 4096 wide, MLP
// 11008, vocabulary 32000, an untied output head, RMSNorm weights.
ModelList llama7b() {
    const int64_t layers = 32, d = 4096, ff = 11008, vocab = 32000;
    ModelList m;
    m.name = "llama-7b";
    add(m, "model.embed_tokens.weight", {vocab, d});
    for (int64_t l = 0; l < layers; ++l) {
        const std::string h = "model.layers." + std::to_string(l) + ".";
        add(m, h + "self_attn.q_proj.weight", {d, d});
        add(m, h + "self_attn.k_proj.weight", {d, d});
        add(m, h + "self_attn.v_proj.weight", {d, d});
        add(m, h + "self_attn.o_proj.weight", {d, d});
        add(m, h + "mlp.gate_proj.weight", {ff, d});
        add(m, h + "mlp.up_proj.weight", {ff, d});
        add(m, h + "mlp.down_proj.weight", {d, ff});
        add(m, h + "input_layernorm.weight", {d});
        add(m, h + "post_attention_layernorm.weight", {d});
    }
    add(m, "model.norm.weight", {d});
    add(m, "lm_head.weight", {vocab, d});
    return m;
}

ModelList from_json(const std::string &path) {
    std::ifstream in(path);
    DSM_REQUIRE(in.good(), DSM_ERR_INVALID_ARGUMENT, "--model '", path, "' is not ",
                tools::one_of(model_names()), ", and no file of that name can be read");
    std::stringstream ss;
    ss << in.rdbuf();
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(ss.str());
    } catch (const std::exception &e) {
        DSM_FAIL(DSM_ERR_INVALID_ARGUMENT, "--model ", path, ": not JSON (", e.what(), ")");
    }
    DSM_REQUIRE(j.is_object() && j.contains("parameters") && j["parameters"].is_array() && !j["parameters"].empty(),
                DSM_ERR_INVALID_ARGUMENT, "--model ", path,
                ": expected {\"parameters\": [{\"name\": ..., \"shape\": [...], \"decay\": true|false}, ...]}");
    ModelList m;
    m.name = path;
    size_t k = 0;
    for (const auto &p : j["parameters"]) {
        DSM_REQUIRE(p.is_object() && p.contains("name") && p["name"].is_string() && p.contains("shape") &&
                        p["shape"].is_array(),
                    DSM_ERR_INVALID_ARGUMENT, "--model ", path, ": parameters[", k,
                    "] needs a \"name\" (string) and a \"shape\" (array of integers >= 1)");
        ModelTensor t;
        t.name = p["name"].get<std::string>();
        for (const auto &d : p["shape"]) {
            DSM_REQUIRE(d.is_number_integer() && d.get<int64_t>() >= 1 && d.get<int64_t>() <= (int64_t(1) << 40),
                        DSM_ERR_INVALID_ARGUMENT, "--model ", path, ": parameters[", k, "] ('", t.name,
                        "'): shape extent ", d.dump(), " is not an integer from 1 to 2^40");
            t.shape.push_back(d.get<int64_t>());
        }
        DSM_REQUIRE(!t.shape.empty() && t.shape.size() <= 8, DSM_ERR_INVALID_ARGUMENT, "--model ", path,
                    ": parameters[", k, "] ('", t.name, "'): a shape has 1 to 8 extents");
        t.decay = t.shape.size() >= 2;
        if (p.contains("decay")) {
            DSM_REQUIRE(p["decay"].is_boolean(), DSM_ERR_INVALID_ARGUMENT, "--model ", path, ": parameters[", k,
                        "] ('", t.name, "'): \"decay\" is not true or false");
            t.decay = p["decay"].get<bool>();
        }
        m.tensors.push_back(std::move(t));
        ++k;
    }
    return m;
}

} // namespace

const std::vector<std::string> &model_names() {
    static const std::vector<std::string> names{"gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "llama-7b"};
    return names;
}

ModelList model_list(const std::string &what) {
    if (what == "gpt2") return gpt2("gpt2", 12, 768);
    if (what == "gpt2-medium") return gpt2("gpt2-medium", 24, 1024);
    if (what == "gpt2-large") return gpt2("gpt2-large", 36, 1280);
    if (what == "gpt2-xl") return gpt2("gpt2-xl", 48, 1600);
    if (what == "llama-7b") return llama7b();
    return from_json(what);
}

} // namespace bench
} // namespace dsm
