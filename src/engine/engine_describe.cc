// The engine's description (dsm_engine_describe, dsm-bench): configuration,
// ranks, memory by kind next to the ZeRO formula, communication and timers.
#include "dsm_config.h"

#include "engine/engine.hpp"

#include <cstdio>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/memstat.hpp"

namespace dsm {
namespace engine {

// ---------------------------------------------------------------- describe

uint64_t Engine::bytes_sent() const noexcept {
    return (dp_ ? dp_->stats().bytes_sent : 0) + (sp_ ? sp_->stats().bytes_sent : 0) +
           (hpz_ ? hpz_->stats().bytes_sent : 0);
}

uint64_t Engine::bytes_off_node() const noexcept {
    const auto off = [](const comm::Backend *b, bool one_node) -> uint64_t {
        return b != nullptr && !one_node ? b->stats().bytes_off_node : 0;
    };
    return off(dp_.get(), dp_one_node_) + off(sp_.get(), sp_one_node_) + off(hpz_.get(), hpz_one_node_);
}

double Engine::zero_formula_bytes_per_param() const {
    // The ZeRO paper's bytes per parameter: K = 12 for fp16 with fp32 Adam
    // (master 4 + two moments 8); with fp32 the master is the parameter.
    const double dp = dp_size_;
    const int nstate = optim::state_count(optimizer_->hyper());
    const double pw = static_cast<double>(esize_);
    const double K = (dtype_ == DSM_FLOAT32 ? 0.0 : 4.0) + 4.0 * nstate;
    return stage_->formula(pw, K, dp);
}

size_t Engine::model_state_bytes() const {
    const zero::StageMemory m = stage_->memory();
    return m.params + m.grads + master_own_.bytes() +
           optimizer_->size() * sizeof(float) * static_cast<size_t>(optimizer_->num_states());
}

dsm_engine_memory_t Engine::memory() const {
    const zero::StageMemory m = stage_->memory();
    size_t frozen = 0;
    for (const Param &p : params_) frozen += p.frozen.bytes();
    dsm_engine_memory_t r = DSM_ENGINE_MEMORY_INITIALIZER;
    r.partitions = model_state_bytes() + frozen + m.secondary + grad32_.bytes();
    r.gathered_params = memstat::use_current(memstat::Use::GATHERED);
    r.gathered_params_peak = memstat::use_peak(memstat::Use::GATHERED);
    r.grad_buffers = memstat::use_current(memstat::Use::GRADIENTS);
    r.grad_buffers_peak = memstat::use_peak(memstat::Use::GRADIENTS);
    r.staging = m.buckets + memstat::use_current(memstat::Use::STAGING);
    r.staging_peak = m.buckets + memstat::use_peak(memstat::Use::STAGING);
    for (int k = 0; k < memstat::kKinds; ++k) {
        r.total += memstat::current(static_cast<memstat::Kind>(k));
        r.total_peak += memstat::peak(static_cast<memstat::Kind>(k));
    }
    return r;
}

std::string Engine::describe(dsm_format_t format) const {
    DSM_REQUIRE(format == DSM_FORMAT_TEXT || format == DSM_FORMAT_JSON, DSM_ERR_INVALID_ARGUMENT, "format ",
                static_cast<int>(format), " is not DSM_FORMAT_TEXT or DSM_FORMAT_JSON");
    using nlohmann::json;
    const double N = static_cast<double>(layout_.used());
    const double formula = zero_formula_bytes_per_param();
    json buffers = json::object();
    auto add = [&](const char *name, size_t bytes) {
        if (bytes) buffers[name] = bytes;
    };
    const zero::StageMemory m = stage_->memory();
    add("parameters", m.params);
    add("gradients", m.grads);
    add("master_weights", master_own_.bytes());
    add("optimizer_state", optimizer_->size() * sizeof(float) * static_cast<size_t>(optimizer_->num_states()));
    add("fp32_gradient_scratch", grad32_.bytes());
    add("hpz_secondary_partition", m.secondary);
    add("reduction_buckets", m.buckets);
    size_t frozen = 0;
    for (const Param &p : params_) frozen += p.frozen.bytes();
    add("frozen_parameters", frozen);
    add("gathered_and_staging", m.live); // gathered parameters and gradient staging held now
    add("idle_reuse_pool", m.idle);
    const size_t model_state = model_state_bytes();
    // This rank's memory by kind now and at its high-water mark since the
    // engine was created (core/memstat.hpp).
    json now = json::object(), peak = json::object();
    for (int k = 0; k < memstat::kKinds; ++k) {
        const auto kind = static_cast<memstat::Kind>(k);
        now[memstat::kind_name(kind)] = memstat::current(kind);
        peak[memstat::kind_name(kind)] = memstat::peak(kind);
    }
    size_t total = 0;
    for (auto &kv : buffers.items()) total += kv.value().get<size_t>();
    const dsm_engine_memory_t use = memory();
    json j = {
        {"format", "dsm-engine"},
        {"format_version", 1},
        {"zero_stage", stage_->number()},
        {"compute_dtype", dtype_name(dtype_)},
        {"communication_dtype", dtype_name(comm_dtype_)},
        {"optimizer", config::optimizer_name(cfg_.optimizer.type)},
        {"optimizer_isa", optim::active_isa()},
        {"backend", dp_->name()},
        {"device", space_->name()},
        {"data_parallel_size", dp_size_},
        {"sequence_parallel_size", sp_size_},
        {"parameters", num_params()},
        {"trainable_elements", layout_.used()},
        {"flat_elements", layout_.total()},
        {"partition_elements", layout_.part_size()},
        {"partition", part_},
        {"memory",
         {{"buffers", buffers},
          {"model_state_bytes", model_state},
          {"total_bytes", total},
          {"bytes_per_parameter", N > 0 ? static_cast<double>(model_state) / N : 0.0},
          {"zero_formula_bytes_per_parameter", formula},
          {"rank_bytes_now", now},
          {"rank_bytes_peak", peak},
          {"by_use",
           {{"partitions", use.partitions},
            {"gathered_params", use.gathered_params},
            {"gathered_params_peak", use.gathered_params_peak},
            {"grad_buffers", use.grad_buffers},
            {"grad_buffers_peak", use.grad_buffers_peak},
            {"staging", use.staging},
            {"staging_peak", use.staging_peak}}}}},
        {"communication",
         {{"bytes_sent", bytes_sent()},
          {"bytes_off_node", bytes_off_node()},
          {"calls", dp_->stats().calls + (sp_ ? sp_->stats().calls : 0) + (hpz_ ? hpz_->stats().calls : 0)},
          {"last_step", {{"bytes_sent", last_step_sent_}, {"bytes_off_node", last_step_off_}}}}},
        {"hpz",
         {{"partition_size", hpz_size_},
          {"group_within_node", hpz_one_node_},
          {"secondary_partition_bytes", m.secondary}}},
        {"zeropp_quantization", quant_json()},
        {"timers_seconds",
         {{"reduce", timers_.reduce},
          {"optimizer", timers_.optimizer},
          {"gather", timers_.gather},
          {"wait", timers_.wait}}},
    };
    std::ostringstream offload;
    compute_->describe(j, offload); // ZeRO-Offload: "offload" and its line
    if (format == DSM_FORMAT_JSON) return j.dump() + "\n";
    std::ostringstream os;
    os << "engine: ZeRO stage " << stage_->number() << ", " << dtype_name(dtype_) << " compute, "
       << dtype_name(comm_dtype_) << " reductions, optimizer " << config::optimizer_name(cfg_.optimizer.type)
       << " (" << (space_->host_addressable() ? optim::active_isa() : "cuda") << "), backend " << dp_->name()
       << ", model state in " << space_->name() << " memory\n";
    os << "ranks: " << dp_size_ << " data-parallel x " << sp_size_ << " sequence-parallel; partition " << part_
       << " of " << layout_.parts() << "\n";
    os << "parameters: " << num_params() << " (" << layout_.used() << " trainable elements, flat "
       << layout_.total() << ", partition " << layout_.part_size() << ")\n";
    os << offload.str();
    if (hpz_size_ > 1)
        os << "hpZ: secondary partitions over " << hpz_size_ << " data-parallel ranks ("
           << (hpz_one_node_ ? "inside one node" : "spanning nodes") << "), " << m.secondary << " bytes here\n";
    if (qwz_block_ > 0 || qgz_block_ > 0) {
        const zero::QuantStats &q = last_quant_;
        os << "ZeRO++ quantized communication:" << (qwz_block_ ? " weights int8 in blocks of " : "")
           << (qwz_block_ ? std::to_string(qwz_block_) : "") << (qwz_block_ && qgz_block_ ? "," : "")
           << (qgz_block_ ? " gradients int4 in blocks of " : "") << (qgz_block_ ? std::to_string(qgz_block_) : "")
           << "; last step quantized " << q.gather.sent_on + q.reduce.sent_on << " bytes on the node ("
           << q.gather.full_on + q.reduce.full_on << " at full precision), "
           << q.gather.sent_off + q.reduce.sent_off << " off the node (" << q.gather.full_off + q.reduce.full_off
           << " at full precision)\n";
    }
    os << "communication: " << bytes_sent() << " bytes sent, " << bytes_off_node() << " off the node; last step "
       << last_step_sent_ << " sent, " << last_step_off_ << " off the node\n";
    os << "memory on this rank:\n";
    for (auto &kv : buffers.items()) os << "  " << kv.key() << ": " << kv.value().get<size_t>() << " bytes\n";
    char line[160];
    std::snprintf(line, sizeof line, "  model state: %.2f bytes per parameter (ZeRO formula %.2f)\n",
                  N > 0 ? static_cast<double>(model_state) / N : 0.0, formula);
    os << line;
    os << "  this rank now / peak since the engine's creation:";
    for (int k = 0; k < memstat::kKinds; ++k) {
        const auto kind = static_cast<memstat::Kind>(k);
        os << (k ? "," : "") << " " << memstat::kind_name(kind) << " " << memstat::current(kind) << " / "
           << memstat::peak(kind) << " bytes";
    }
    os << "\n";
    return os.str();
}

} // namespace engine
} // namespace dsm
