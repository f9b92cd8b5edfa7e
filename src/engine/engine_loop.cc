// What every training loop needs besides the step: resuming when there is
// a checkpoint to resume from, and the loss of a step averaged over the
// engine's ranks. Both collective over the engine's ranks, agreed like
// every engine call, their waits under the watchdog.
#include "dsm_config.h"

#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstring>

#include "core/agree.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/watchdog.hpp"
#include "engine/engine.hpp"

namespace dsm {
namespace engine {

bool Engine::resume(const char *dir_arg, unsigned flags, bool have_output, std::vector<unsigned char> *client) {
    check_usable();
    const watchdog::Context ctx("dsm_engine_resume");
    const unsigned known = DSM_CKPT_LOAD_MODULE_ONLY | DSM_CKPT_LOAD_NO_OPTIMIZER | DSM_CKPT_LOAD_NO_LR_SCHEDULE |
                           DSM_CKPT_LOAD_NON_STRICT | DSM_CKPT_LOAD_FALLBACK;
    std::string why;
    dsm_status_t status = DSM_SUCCESS;
    int64_t found = 0;
    try {
        DSM_REQUIRE(have_output, DSM_ERR_NULL_POINTER, "resumed (the output) is NULL");
        DSM_REQUIRE(dir_arg != nullptr, DSM_ERR_NULL_POINTER, "dir is NULL");
        DSM_REQUIRE(*dir_arg != '\0', DSM_ERR_INVALID_ARGUMENT, "the checkpoint directory is empty");
        DSM_REQUIRE((flags & ~known) == 0, DSM_ERR_INVALID_ARGUMENT, "flags 0x", std::hex, flags,
                    " has unknown bits 0x", flags & ~known);
        // Rank 0 looks; the others take its answer (a directory on a file
        // system that some nodes see late must not split the job).
        if (world_rank_ == 0) {
            const std::string latest = std::string(dir_arg) + "/latest";
            struct stat st;
            if (::stat(latest.c_str(), &st) == 0)
                found = 1;
            else if (errno != ENOENT && errno != ENOTDIR)
                DSM_FAIL(DSM_ERR_IO, "cannot look for the checkpoint to resume from, '", latest,
                         "': ", std::strerror(errno));
        }
    } catch (const Error &e) {
        status = e.status();
        why = e.message();
    }
    sync(SyncPoint::LOAD, 0, why, status); // every rank here, the arguments good on every rank
    Agreement a(world_);
    const size_t at = a.add(found);
    {
        const watchdog::WaitScope wait("agreement of the engine's ranks", &world_watch_);
        a.run(DSM_SUCCESS, "");
    }
    a.throw_if_failed();
    if (a.max(at) == 0) {
        if (world_rank_ == 0)
            DSM_INFO(ENGINE, "resume: nothing to resume in '%s' (no %s/latest): starting from the beginning",
                     dir_arg, dir_arg);
        return false;
    }
    load_checkpoint(dir_arg, nullptr, flags, client);
    return true;
}

double Engine::mean_loss(double loss, double weight, bool have_output) {
    check_usable();
    const watchdog::Context ctx("dsm_engine_mean_loss");
    std::string why;
    dsm_status_t status = DSM_SUCCESS;
    if (!have_output) {
        status = DSM_ERR_NULL_POINTER;
        why = "mean (the output) is NULL";
    } else if (!std::isfinite(weight) || weight < 0) {
        status = DSM_ERR_INVALID_ARGUMENT;
        why = cat("weight is ", weight,
                  ", must be a finite number >= 0 (how many samples or tokens this rank's loss averages)");
    }
    sync(SyncPoint::MEAN_LOSS, 0, why, status);
    // A rank with weight 0 adds nothing, not even a NaN loss.
    double v[2] = {weight == 0 ? 0.0 : loss * weight, weight};
    {
        const watchdog::Context c("mean loss");
        comm::allreduce_f64(*control_, v, 2, comm::Op::SUM);
    }
    DSM_REQUIRE(v[1] > 0, DSM_ERR_INVALID_ARGUMENT, "the weights of all ", world_size_,
                " ranks are 0: there is no loss to average");
    return v[0] / v[1];
}

} // namespace engine
} // namespace dsm
