// The stage factory and what every stage shares.
#include "zero/stage.hpp"

#include <algorithm>

#include "core/dtype.hpp"
#include "core/error.hpp"
#include "zero/plan.hpp"

namespace dsm {
namespace zero {

std::unique_ptr<Stage> make_replicated(const StageSettings &s);  // stage_replicated.cc
std::unique_ptr<Stage> make_partitioned(const StageSettings &s); // stage_partitioned.cc

std::unique_ptr<Stage> Stage::create(const StageSettings &s) {
    DSM_REQUIRE(s.stage >= 0 && s.stage <= 3, DSM_ERR_CONFIG, "ZeRO stage ", s.stage, " is not 0..3");
    return s.stage < 2 ? make_replicated(s) : make_partitioned(s);
}

Stage::Stage(const StageSettings &s)
    : s_(s), esize_(dtype_size(s.dtype)), csize_(dtype_size(s.comm_dtype)),
      pipe_(std::make_unique<comm::Pipeline>(s.overlap)) {}

void Stage::bind(const Layout *layout, int part, comm::Backend *dp, comm::Backend *sp, device::Space *space,
                 amp::Math *math, Timers *timers) {
    layout_ = layout;
    part_ = part;
    dp_ = dp;
    sp_ = sp;
    space_ = space;
    math_ = math;
    timers_ = timers;
}

void Stage::stop_before(PointDetail detail, Then then) {
    DSM_REQUIRE(!point_, DSM_ERR_INTERNAL, "the stage stops before a collective while another is pending");
    point_ = Point{std::move(detail), std::move(then)};
}

void Stage::proceed() {
    DSM_REQUIRE(point_, DSM_ERR_INTERNAL, "the stage has no collective pending");
    Point p = std::move(*point_);
    point_.reset();
    p.then(p.detail);
}

const std::vector<size_t> &Stage::plan_publish(bool sliced, size_t end) {
    const size_t P = layout_->part_size(), my_begin = layout_->part_begin(part_);
    converted_ = 0;
    ends_.clear();
    slices_.clear();
    if (sliced) slices_ = flat_regions(end, s_.allgather_bucket_size);
    // A slice leaves once this rank's share of it is up to date.
    for (const auto &r : slices_) ends_.push_back(std::min(P, r.second > my_begin ? r.second - my_begin : 0));
    ends_.push_back(P);
    return ends_;
}

void Stage::convert_upto(const float *master, size_t upto) {
    upto = std::min(upto, layout_->part_size());
    if (upto <= converted_) return;
    if (s_.dtype != DSM_FLOAT32 && !update_writes_)
        math_->convert(master + converted_, DSM_FLOAT32, static_cast<char *>(param_partition()) + converted_ * esize_,
                       s_.dtype, upto - converted_);
    converted_ = upto;
}

} // namespace zero
} // namespace dsm
