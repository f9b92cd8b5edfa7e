// Element ranges of parameters and gradients (dsm_engine_param_acquire_range
// and the others, doc/engine.md "Ranges"): a layer's slice of a tensor that
// stacks the layers. Under ZeRO-3 only the acquired range of a partitioned
// parameter is gathered, and under ZeRO-2/3 a released gradient range joins
// the bucket as a gradient of its own, so a stacked tensor is gathered and
// reduced slice by slice and never held whole. The stage does the work
// (zero::Stage::acquire_param_range ...); here are the checks and the
// agreement of a collective acquire's arguments.
#include "dsm_config.h"

#include <algorithm>

#include "core/error.hpp"
#include "engine/engine.hpp"

namespace dsm {
namespace engine {

std::string Param::held() const {
    if (grad_acquired) return cat("the gradient of '", name, "'");
    if (param_acquired) return cat("parameter '", name, "'");
    if (!grad_ranges.empty())
        return cat("the gradient range ", grad_ranges.front().first, "+", grad_ranges.front().second, " of '", name,
                   "'");
    if (!param_ranges.empty())
        return cat("the range ", param_ranges.front().first, "+", param_ranges.front().second, " of parameter '",
                   name, "'");
    return std::string();
}

std::string Engine::range_error(const Param &p, int64_t offset, int64_t count) {
    if (offset < 0 || count < 1 || static_cast<uint64_t>(offset) > p.numel ||
        static_cast<uint64_t>(count) > p.numel - static_cast<uint64_t>(offset))
        return cat("the range offset ", offset, ", count ", count, " is not inside parameter '", p.name, "' (",
                   p.numel, " elements: offset >= 0, count >= 1, offset + count <= ", p.numel, ")");
    return std::string();
}

namespace {

using Range = std::pair<size_t, size_t>;

bool has(const std::vector<Range> &v, const Range &r) { return std::find(v.begin(), v.end(), r) != v.end(); }

} // namespace

const void *Engine::param_acquire_range(int index, int64_t offset, int64_t count, bool have_output) {
    Param &p = param(index);
    DSM_REQUIRE(!offloads(cfg_), DSM_ERR_NOT_SUPPORTED, "param_acquire_range: ranges are not supported with "
                "ZeRO-Offload (zero_optimization.offload_optimizer/offload_param); acquire whole parameters");
    // This rank's argument error: agreed with every rank where the call is
    // collective (a partitioned ZeRO-3 parameter), else this rank's alone.
    dsm_status_t status = DSM_SUCCESS;
    std::string why = range_error(p, offset, count);
    if (!why.empty()) status = DSM_ERR_INVALID_ARGUMENT;
    const Range r{static_cast<size_t>(std::max<int64_t>(offset, 0)), static_cast<size_t>(std::max<int64_t>(count, 1))};
    if (status == DSM_SUCCESS && !have_output) {
        status = DSM_ERR_NULL_POINTER;
        why = "values (the output) is NULL";
    }
    if (status == DSM_SUCCESS && has(p.param_ranges, r)) {
        status = DSM_ERR_STATE;
        why = cat("the range ", r.first, "+", r.second, " of parameter '", p.name, "' is already acquired");
    }
    if (!p.trainable) {
        DSM_REQUIRE(status == DSM_SUCCESS, status, why);
        hand_out();
        p.param_ranges.push_back(r);
        return static_cast<const char *>(p.frozen.data()) + r.first * esize_;
    }
    const Range use = status == DSM_SUCCESS ? r : Range{0, 1};
    bool agreed = false;
    const void *values = nullptr;
    try {
        // The stage stops before the gather of a partitioned range
        // (zero/stage.hpp); the agreement there carries this rank's error.
        stage_->acquire_param_range(index, use.first, use.second);
        while (const PointDetail *at = stage_->next_collective()) {
            sync(SyncPoint::GATHER_RANGE, *at, why, status, Call::PARAM_ACQUIRE_RANGE); // throws every rank's agreed error
            agreed = true;
            stage_->proceed();
        }
        values = stage_->param_range_values(index, use.first, use.second);
    } catch (...) {
        stage_->cancel();
        if (agreed) broken_ = true; // a gather failed: the ranks' states are unknown
        throw;
    }
    DSM_REQUIRE(status == DSM_SUCCESS, status, why); // a local call: this rank's error
    hand_out();
    p.param_ranges.push_back(r);
    return values;
}

void Engine::param_release_range(int index, int64_t offset, int64_t count) {
    Param &p = param(index);
    const Range r{static_cast<size_t>(std::max<int64_t>(offset, 0)), static_cast<size_t>(std::max<int64_t>(count, 0))};
    auto it = std::find(p.param_ranges.begin(), p.param_ranges.end(), r);
    DSM_REQUIRE(offset >= 0 && count >= 0 && it != p.param_ranges.end(), DSM_ERR_STATE, "the range offset ", offset,
                ", count ", count, " of parameter '", p.name,
                "' is not acquired (release each range with the offset and count it was acquired with)");
    p.param_ranges.erase(it);
    if (p.trainable) stage_->release_param_range(index, r.first, r.second);
}

void *Engine::grad_acquire_range(int index, int64_t offset, int64_t count) {
    Param &p = param(index);
    DSM_REQUIRE(!offloads(cfg_), DSM_ERR_NOT_SUPPORTED, "grad_acquire_range: ranges are not supported with "
                "ZeRO-Offload (zero_optimization.offload_optimizer/offload_param); acquire whole gradients");
    DSM_REQUIRE(p.trainable, DSM_ERR_INVALID_ARGUMENT, "parameter '", p.name,
                "' is frozen (trainable = 0): it has no gradient");
    const std::string why = range_error(p, offset, count);
    DSM_REQUIRE(why.empty(), DSM_ERR_INVALID_ARGUMENT, why);
    const Range r{static_cast<size_t>(offset), static_cast<size_t>(count)};
    DSM_REQUIRE(!has(p.grad_ranges, r), DSM_ERR_STATE, "the gradient range ", r.first, "+", r.second, " of '", p.name,
                "' is already acquired");
    stage_->set_boundary((micro_steps_ + 1) % cfg_.gradient_accumulation_steps == 0);
    void *g = stage_->acquire_grad_range(index, r.first, r.second);
    hand_out();
    p.grad_ranges.push_back(r);
    return g;
}

void Engine::grad_release_range(int index, int64_t offset, int64_t count) {
    Param &p = param(index);
    const Range r{static_cast<size_t>(std::max<int64_t>(offset, 0)), static_cast<size_t>(std::max<int64_t>(count, 0))};
    auto it = std::find(p.grad_ranges.begin(), p.grad_ranges.end(), r);
    DSM_REQUIRE(offset >= 0 && count >= 0 && it != p.grad_ranges.end(), DSM_ERR_STATE, "the gradient range offset ",
                offset, ", count ", count, " of '", p.name,
                "' is not acquired (release each range with the offset and count it was acquired with)");
    p.grad_ranges.erase(it);
    stage_->set_boundary((micro_steps_ + 1) % cfg_.gradient_accumulation_steps == 0);
    try {
        stage_->release_grad_range(index, r.first, r.second);
        stage_collectives(SyncPoint::FLUSH, Call::GRAD_RELEASE_RANGE);
    } catch (...) {
        broken_ = true;
        throw;
    }
}

} // namespace engine
} // namespace dsm
