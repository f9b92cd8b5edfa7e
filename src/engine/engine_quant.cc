// ZeRO++ quantized communication in the engine: qwZ (zero_quantized_weights,
// stage 3: int8 gathers of the partitioned parameters) and qgZ
// (zero_quantized_gradients, stages 2 and 3: the hierarchical int4
// reduction of the gradients). The stage does the work (zero/stage.hpp);
// the engine checks the configuration, agrees the block sizes, gives the
// stage the nodes of the data-parallel ranks and reports the bytes.
#include "engine/engine.hpp"

#include <string>

#include "dsm_config.h"

#include "comm/quantize.hpp"
#include "core/agree.hpp"
#include "core/error.hpp"

namespace dsm {
namespace engine {

// In setup()'s agreed checks of the configuration: a bad stage or block
// size fails every rank with this rank's message.
void Engine::check_quantized(const config::Config &c) {
    const auto &z = c.zero;
    DSM_REQUIRE(!z.zero_quantized_weights || z.stage == 3, DSM_ERR_CONFIG,
                "zero_optimization.zero_quantized_weights: true needs ZeRO stage 3 (qwZ quantizes the gathers of "
                "partitioned parameters), stage is ", z.stage);
    DSM_REQUIRE(!z.zero_quantized_gradients || z.stage >= 2, DSM_ERR_CONFIG,
                "zero_optimization.zero_quantized_gradients: true needs ZeRO stage 2 or 3 (qgZ reduces the "
                "gradients to their partitions), stage is ", z.stage);
    qwz_block_ = z.zero_quantized_weights ? comm::quant::weight_block() : 0;
    qgz_block_ = z.zero_quantized_gradients ? comm::quant::gradient_block() : 0;
}

// After the backends: the space's kernels must exist (the host's, or the
// CUDA ones of a build with nvcc) and, on CUDA memory, qgZ's exchanges
// need the nccl backend (its staging is device memory, ordered on the
// stream); the block sizes the same on every rank, and the stage learns the
// node of each data-parallel rank. Collective over the world.
void Engine::bind_quantized() {
    if (qwz_block_ == 0 && qgz_block_ == 0) return;
    agree(world_, [&] {
        if (space_->host_addressable()) return;
        DSM_REQUIRE(DSM_HAVE_CUDA_KERNELS, DSM_ERR_NOT_SUPPORTED, "zero_optimization.",
                    qwz_block_ ? "zero_quantized_weights" : "zero_quantized_gradients", " on ", space_->name(),
                    " memory needs the CUDA quantization kernels, which this build lacks (nvcc was not found)");
        DSM_REQUIRE(qgz_block_ == 0 || dp_->capabilities().stream_ordered, DSM_ERR_NOT_SUPPORTED,
                    "zero_optimization.zero_quantized_gradients on ", space_->name(),
                    " memory needs the nccl backend for the data-parallel group, which uses ", dp_->name(),
                    " (two ranks share a GPU, or DSM_COMM_BACKEND chose it)");
    });
    agree_same(world_, "the quantization block sizes (DSM_QWZ_BLOCK, DSM_QGZ_BLOCK)",
               std::to_string(qwz_block_) + "," + std::to_string(qgz_block_));
    stage_->bind_nodes(comm::allgather_int(*dp_control_, mesh_->node()));
}

// At the accumulation boundary, with the step's other byte counts.
void Engine::mark_quant_step() {
    const zero::QuantStats now = stage_->quant_bytes();
    const auto diff = [](const comm::QuantBytes &a, const comm::QuantBytes &b) {
        comm::QuantBytes d;
        d.sent_on = a.sent_on - b.sent_on;
        d.sent_off = a.sent_off - b.sent_off;
        d.full_on = a.full_on - b.full_on;
        d.full_off = a.full_off - b.full_off;
        return d;
    };
    last_quant_.gather = diff(now.gather, quant_mark_.gather);
    last_quant_.reduce = diff(now.reduce, quant_mark_.reduce);
    quant_mark_ = now;
}

nlohmann::json Engine::quant_json() const {
    const auto bytes = [](const comm::QuantBytes &b) {
        return nlohmann::json{{"sent_on_node", b.sent_on},
                              {"sent_off_node", b.sent_off},
                              {"full_precision_on_node", b.full_on},
                              {"full_precision_off_node", b.full_off}};
    };
    return nlohmann::json{
        {"weights", qwz_block_ > 0},
        {"weight_bits", comm::quant::kWeightBits},
        {"weight_block", qwz_block_},
        {"gradients", qgz_block_ > 0},
        {"gradient_bits", comm::quant::kGradientBits},
        {"gradient_block", qgz_block_},
        {"isa", comm::quant::active_isa()},
        {"kernels", space_->host_addressable() ? (space_->kind() == device::Kind::HOST ? "host" : "simulated") : "cuda"},
        {"last_step", {{"gather", bytes(last_quant_.gather)}, {"reduce", bytes(last_quant_.reduce)}}}};
}

} // namespace engine
} // namespace dsm
