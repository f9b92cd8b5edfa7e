// The stage factory and what every stage shares.
#include "zero/stage.hpp"

#include <algorithm>

#include "core/dtype.hpp"
#include "core/error.hpp"

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

void Stage::advance(const float *master, void *part, const Update &update, size_t *done, size_t upto) {
    upto = std::min(upto, layout_->part_size());
    if (upto <= *done) return;
    if (update) update(upto);
    if (s_.dtype != DSM_FLOAT32 && !(update && update_writes_))
        math_->convert(master + *done, DSM_FLOAT32, static_cast<char *>(part) + *done * esize_, s_.dtype, upto - *done);
    *done = upto;
}

} // namespace zero
} // namespace dsm
