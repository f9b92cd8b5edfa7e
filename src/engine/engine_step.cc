// The engine's collective work: the agreement at every collective point,
// gradient reductions (bucketed allreduce / reduce-scatter over the
// data-parallel group after a sum over the sequence-parallel group), ZeRO-3
// gathers with prefetch, and the optimizer step at the accumulation boundary.
#include "dsm_config.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "amp/convert.hpp"
#include "core/agree.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/watchdog.hpp"
#include "engine/engine.hpp"
#include "engine/stop_signal.hpp"

namespace dsm {
namespace engine {

namespace {

double now() { return MPI_Wtime(); }

} // namespace

const char *Engine::sync_point_name(SyncPoint point) noexcept {
    switch (point) {
    case SyncPoint::INIT: return "dsm_engine_init";
    case SyncPoint::GATHER: return "dsm_engine_param_acquire (ZeRO-3 gather)";
    case SyncPoint::GATHER_RANGE: return "dsm_engine_param_acquire_range (ZeRO-3 gather of a range)";
    case SyncPoint::FLUSH: return "dsm_engine_grad_release (bucket reduction)";
    case SyncPoint::STEP: return "dsm_step";
    case SyncPoint::FREE: return "dsm_engine_free";
    case SyncPoint::SAVE: return "dsm_engine_save_checkpoint";
    case SyncPoint::LOAD: return "dsm_engine_load_checkpoint";
    case SyncPoint::WAIT: return "dsm_engine_checkpoint_wait";
    case SyncPoint::STOP_SIGNAL: return "dsm_engine_set_stop_signal";
    case SyncPoint::WEIGHTS: return "dsm_engine_load_weights";
    case SyncPoint::MEAN_LOSS: return "dsm_engine_mean_loss";
    }
    return "?";
}

namespace {

const char *call_name(int64_t call) noexcept {
    switch (call) {
    case 1: return "dsm_engine_param_acquire";
    case 2: return "dsm_engine_param_acquire_range";
    case 3: return "dsm_engine_grad_release";
    case 4: return "dsm_engine_grad_release_range";
    case 5: return "dsm_step";
    default: return nullptr;
    }
}

} // namespace

// What to do about a difference at a point.
const char *Engine::sync_point_hint(SyncPoint point) noexcept {
    switch (point) {
    case SyncPoint::GATHER: return "acquire the same parameters in the same order";
    case SyncPoint::GATHER_RANGE: return "acquire the same ranges of the same parameters in the same order";
    case SyncPoint::FLUSH: return "release the same gradients in the same order";
    case SyncPoint::STEP: return "every rank must call dsm_step as often";
    default: return "every rank must make the same engine calls with the same arguments";
    }
}

std::string Engine::sync_point_text(int64_t point, int64_t call) {
    const SyncPoint p = static_cast<SyncPoint>(point);
    const char *c = call_name(call);
    if (c == nullptr) return sync_point_name(p);
    if (p == SyncPoint::FLUSH) return cat(c, " (bucket reduction)");
    if (p == SyncPoint::GATHER) return cat(c, " (ZeRO-3 gather)");
    if (p == SyncPoint::GATHER_RANGE) return cat(c, " (ZeRO-3 gather of a range)");
    return sync_point_name(p);
}

std::string Engine::param_text(int64_t index) const {
    if (index < 0 || index >= static_cast<int64_t>(params_.size())) return cat(index);
    return cat(index, " ('", params_[static_cast<size_t>(index)].name, "')");
}

void Engine::sync(SyncPoint point, int64_t value, const std::string &local_error, dsm_status_t local_status) {
    PointDetail d;
    if (point == SyncPoint::STEP) d.add("micro-step", value);
    else if (point == SyncPoint::STOP_SIGNAL) d.add("signal number", value);
    else if (value != 0) d.add("value", value);
    sync(point, d, local_error, local_status);
}

// One agreement (one allreduce) of: this rank's status, the point and the
// call made, the point's values and its list (a bucket: its length and
// digest), whether an asynchronous save still writes on some rank, and at
// dsm_step whether the stop signal arrived here (so every rank learns it
// from any rank). Then, if any rank failed, every rank throws the lowest
// failing rank's error; if the ranks are at different points, or differ in a
// value or the list, every rank throws DSM_ERR_MISMATCH naming what differs
// with each side's value and ranks (the values are exchanged then, on the
// error path only). Ranks at different points are in different engine
// calls and will not meet at the same collective again: every one of them
// marks the engine failed, so that its dsm_engine_free is local (a rank that
// saw the failure in a save or a load as well as one that saw it in a step).
void Engine::sync(SyncPoint point, const PointDetail &detail, const std::string &local_error,
                  dsm_status_t local_status, Call call) {
    const bool stop = point == SyncPoint::STEP && stop_signal_received(stop_signal_);
    Agreement a(world_);
    const size_t at = a.add(static_cast<int64_t>(point)), made = a.add(static_cast<int64_t>(call));
    size_t val[PointDetail::kValues];
    for (int i = 0; i < PointDetail::kValues; ++i) val[i] = a.add(i < detail.n ? detail.value[i] : 0);
    const size_t len = a.add(static_cast<int64_t>(detail.list.size())), digest = a.add(detail.list_digest()),
                 saving = a.add(saver_ && !saver_->done()), stopped = a.add(stop);
    if (point == SyncPoint::FLUSH) bucket_ = detail.bucket >= 0 ? detail.bucket : bucket_ + 1;
    try {
        const auto name = [this](int64_t i) { return i >= 0 && i < num_params() ? params_[static_cast<size_t>(i)].name : std::string(); };
        const watchdog::Context ctx(point == SyncPoint::FLUSH    ? "gradient bucket flush"
                                    : point == SyncPoint::GATHER || point == SyncPoint::GATHER_RANGE ? "ZeRO-3 gather"
                                                                 : nullptr,
                                    point == SyncPoint::FLUSH ? "bucket" : detail.n > 0 ? "parameter" : nullptr,
                                    point == SyncPoint::FLUSH ? bucket_ : detail.n > 0 ? detail.value[0] : -1,
                                    point == SyncPoint::FLUSH && !detail.list.empty() ? detail.list_text(name)
                                    : point == SyncPoint::GATHER_RANGE && detail.n == 3
                                        ? cat("elements ", detail.value[1], "+", detail.value[2])
                                        : std::string());
        const watchdog::WaitScope wait("agreement of the engine's ranks", &world_watch_);
        a.run(local_status, local_error);
    } catch (...) {
        broken_ = true; // the ranks' states are unknown
        throw;
    }
    saves_done_ = a.max(saving) == 0;
    if (!a.same(at)) broken_ = true;
    a.throw_if_failed();
    // The same point reached from different calls (a bucket reduction from
    // a release on some ranks, from dsm_step on others) is the same
    // collective: not a mismatch.
    if (!a.same(at)) {
        // Where each rank is: by point and call.
        std::vector<int64_t> where = a.by_rank(at);
        const std::vector<int64_t> &calls = a.by_rank(made);
        for (size_t r = 0; r < where.size(); ++r) where[r] = where[r] * 64 + calls[r];
        const auto text = [](int64_t w) { return sync_point_text(w / 64, w % 64); };
        int64_t lo = INT64_MAX, hi = INT64_MIN; // the first rank's call at the lowest and highest point
        for (int64_t w : where) {
            if (w / 64 == a.min(at) && lo == INT64_MAX) lo = w;
            if (w / 64 == a.max(at) && hi == INT64_MIN) hi = w;
        }
        DSM_FAIL(DSM_ERR_MISMATCH, "the ranks of the engine are at different collective points: some are in ",
                 text(lo), ", others in ", text(hi), ": ", by_value(where, text, "is in", "are in"),
                 " (every rank must make the same engine calls in the same order)");
    }
    const SyncPoint p = point;
    const std::string here = sync_point_name(p);
    for (int i = 0; i < PointDetail::kValues; ++i) {
        if (a.same(val[i])) continue;
        const char *field = i < detail.n && detail.name[i] != nullptr ? detail.name[i] : "value";
        const bool is_param = std::string(field) == "parameter index";
        std::string others;
        for (int j = 0; j < detail.n; ++j)
            if (j != i && a.same(val[j]))
                others += cat(others.empty() ? "" : ", ", detail.name[j], " ",
                              std::string(detail.name[j]) == "parameter index" ? param_text(detail.value[j])
                                                                              : cat(detail.value[j]));
        DSM_FAIL(DSM_ERR_MISMATCH, "the ranks of the engine disagree at ", here, " on the ", field, ": ",
                 by_value(a.by_rank(val[i]), [&](int64_t v) { return is_param ? param_text(v) : cat(v); }),
                 " (", others.empty() ? std::string() : cat("the same on every rank: ", others, "; "), sync_point_hint(p), ")");
    }
    if (!a.same(len) || !a.same(digest)) {
        const auto name = [this](int64_t i) { return i >= 0 && i < num_params() ? params_[static_cast<size_t>(i)].name : std::string(); };
        const std::string which = list_difference(world_, detail.list, name);
        DSM_FAIL(DSM_ERR_MISMATCH, "the ranks of the engine disagree at ", here, " on the gradients in bucket ",
                 bucket_, ": ", which, " (", sync_point_hint(p), ")");
    }
    if (a.max(stopped) > 0) stop_pending_ = true;
}

void Engine::set_stop_signal(int signum) {
    check_usable();
    const std::string bad = stop_signal_check(signum);
    sync(SyncPoint::STOP_SIGNAL, signum, bad.empty() ? "" : cat("signum is ", signum, ": ", bad),
         bad.empty() ? DSM_SUCCESS : DSM_ERR_INVALID_ARGUMENT);
    use_stop_signal(signum, "dsm_engine_set_stop_signal");
}

void Engine::use_stop_signal(int signum, const char *from) {
    if (signum == stop_signal_) return;
    stop_signal_use(signum);
    stop_signal_release(stop_signal_);
    stop_signal_ = signum;
    if (signum == 0)
        DSM_INFO(ENGINE, "stop signal: none (%s)", from);
    else
        DSM_INFO(ENGINE, "stop signal: SIG%s (%d) from %s; dsm_engine_stop_requested() reports it at the next step "
                 "boundary", stop_signal_name(signum), signum, from);
}

// ZeRO-Offload: add in the gradients released so far before the engine
// reads them. A failure (a CUDA error of a copy) becomes this rank's error
// for the sync() that follows, so every rank fails together.
void Engine::drain_offload(dsm_status_t &status, std::string &why) {
    if (status != DSM_SUCCESS) return;
    try {
        compute_->drain();
    } catch (const Error &e) {
        status = e.status();
        why = e.message();
    }
}

// The protocol's collective points (zero/stage.hpp): the call just made to
// the stage did its local work and stopped before its first collective.
// Before each, on every rank: at a bucket flush the offload's gradients are
// added in (its failure becomes this rank's error), then the agreement that
// every rank is there with the same parameter, range or bucket; then the
// stage makes it and stops before the next, if any. An error drops the
// point the stage stopped at.
void Engine::stage_collectives(SyncPoint point, Call call, double *wait) {
    try {
        while (const PointDetail *at = stage_->next_collective()) {
            const double t0 = wait != nullptr ? now() : 0.0;
            try {
                std::string why;
                dsm_status_t status = DSM_SUCCESS;
                if (point == SyncPoint::FLUSH) drain_offload(status, why);
                sync(point, *at, why, status, call);
            } catch (...) {
                if (wait != nullptr) *wait += now() - t0;
                throw;
            }
            if (wait != nullptr) *wait += now() - t0;
            stage_->proceed();
        }
    } catch (...) {
        stage_->cancel();
        throw;
    }
}

// ---------------------------------------------------------------- publish

// After the master weights changed: write them into the compute-dtype
// parameters of this partition and gather what the stage keeps whole, in
// the stage's pieces (zero/stage.hpp). With `update` (a piecewise
// optimizer) the master weights change here: the optimizer brings each
// piece up to date before the stage converts it and sends its slice, so
// that the update of one piece overlaps the allgather of the one before.
void Engine::publish(PieceUpdate *update) {
    const double t0 = now(), opt0 = timers_.optimizer;
    compute_->invalidate();
    const std::vector<size_t> &ends = stage_->begin_publish();
    for (size_t k = 0; k < ends.size(); ++k) {
        if (update != nullptr && ends[k] > (k > 0 ? ends[k - 1] : 0)) {
            timers_.optimizer -= now();
            optimizer_->step_upto(master_, update->g, segments_, update->args, &update->updated, ends[k],
                                  update->fused);
            timers_.optimizer += now();
        }
        stage_->publish_piece(master_, k);
    }
    compute_->refresh(); // ZeRO-Offload: the kept parameters' device copies, while the user goes on
    timers_.gather += now() - t0 - (timers_.optimizer - opt0);
}

// ---------------------------------------------------------------- step

float *Engine::fp32_grads() {
    const size_t P = layout_.part_size();
    const void *g = stage_->grad_partition();
    if (dtype_ == DSM_FLOAT32) return const_cast<float *>(reinterpret_cast<const float *>(g));
    math_->convert(g, dtype_, grad32_.data(), DSM_FLOAT32, P);
    return static_cast<float *>(grad32_.data());
}

void Engine::zero_grads() { stage_->zero_grads(); }

double Engine::current_lr() const {
    return schedule_ && !schedule_pending_ ? schedule_->lr().front() : cfg_.optimizer.lr;
}

// Collective (every rank, after the gradients' non-finite check agreed that
// some are): " (first in parameter 'NAME')" naming the lowest-index parameter
// with an Inf or NaN gradient element on any rank, or "" if none is found
// (the sum of squares overflowed). `g`: this rank's fp32 gradient partition.
std::string Engine::first_nonfinite(const float *g) {
    int first = INT_MAX;
    for (const optim::Segment &s : segments_)
        if (s.param < first && math_->has_nonfinite(g + s.offset, DSM_FLOAT32, s.count)) first = s.param;
    {
        const watchdog::Context c("non-finite gradient check");
        first = comm::allreduce_int(*control_, first, comm::Op::MIN);
    }
    if (first == INT_MAX) return std::string();
    return cat(" (first in parameter '", params_[static_cast<size_t>(first)].name, "')");
}

// dsm_step, top-down (doc/engine-internals.md): the checks and the
// agreement that every rank is here (enter_step), the micro-step's counters
// (begin_micro_step), the gradient reduction (reduce_phase); at the
// accumulation boundary the step's traffic (mark_step_traffic), the
// unscale/overflow/norm inspection (inspect_phase), the non-finite policy
// (nonfinite_phase), then either the skip (skip_phase) or the clipped update
// with its gather of the new parameters (update_phase), and the logs and
// metrics (bookkeeping). Each phase is a member function below, in that order.
void Engine::step(dsm_step_info_t *info) {
    check_usable();
    // An asynchronous save of the live state (engine_ckpt.cc): the update
    // changes it only once the writer has handed it to the file system.
    if (saver_) saver_->wait_captured();
    watchdog::set_step(global_steps_, micro_steps_);
    const watchdog::Context ctx("dsm_step");
    enter_step(info);
    try {
        const bool boundary = begin_micro_step();
        reduce_phase(boundary);
        if (boundary) {
            mark_step_traffic();
            Inspection in = inspect_phase();
            if (nonfinite_phase(in)) skip_phase(in);
            else update_phase(in);
            bookkeeping(in.norm);
        }
    } catch (...) {
        broken_ = true;
        throw;
    }
    // The program now works on the next step: a message between two calls
    // (the program's own MPI calls) names it.
    watchdog::set_step(global_steps_, micro_steps_);
    step_info(info);
}

// Phase 0: this rank's checks (the info struct, nothing still acquired, the
// offloaded gradients drained) agreed at the STEP point, so that a bad call
// on one rank fails every rank; then an asynchronous save that has ended on
// every rank reports its failure here (the step then does nothing else).
void Engine::enter_step(dsm_step_info_t *info) {
    std::string why;
    dsm_status_t status = DSM_SUCCESS;
    if (info != nullptr && info->size < sizeof(dsm_step_info_t)) {
        status = DSM_ERR_INVALID_ARGUMENT;
        why = cat("info->size is ", info->size, ", expected ", sizeof(dsm_step_info_t),
                  " (initialize with DSM_STEP_INFO_INITIALIZER)");
    }
    for (const Param &p : params_) {
        if (status != DSM_SUCCESS) break;
        const std::string held = p.held();
        if (!held.empty()) {
            status = DSM_ERR_STATE;
            why = cat(held, " is still acquired at dsm_step (release it first)");
            break;
        }
    }
    drain_offload(status, why);
    try {
            // The wait for the ranks still reducing what they released.
        timers_.wait -= now();
        sync(SyncPoint::STEP, micro_steps_, why, status);
        timers_.wait += now();
    } catch (...) {
        broken_ = true;
        throw;
    }
    finish_save(false);
}

// Phase 1: the micro-step's counters; whether it ends an accumulation.
bool Engine::begin_micro_step() {
    if (window_start_ == 0.0) {
        window_start_ = now();
        window_samples_ = global_samples_;
    }
    ++micro_steps_;
    const bool boundary = micro_steps_ % cfg_.gradient_accumulation_steps == 0;
    last_boundary_ = boundary;
    if (boundary && stop_pending_) stop_requested_ = true;
    last_skipped_ = false;
    // Prefetched parameters nobody acquired are dropped; the trace rolls over.
    stage_->new_micro_step(false);
    return boundary;
}

// Phase 2: the stage reduces what is left of the gradients (the last
// bucket; at the boundary everything the step reads). Before its collective
// the ranks agree at the FLUSH point; that agreement is a wait for the ranks
// whose earlier reductions ended later, and counts as waiting.
void Engine::reduce_phase(bool boundary) {
    stage_->reduce(boundary);
    stage_collectives(SyncPoint::FLUSH, Call::STEP, &timers_.wait);
}

// The step's traffic: since the previous step's reduction (its update's
// gathers, every micro-step's gathers and reductions); nothing is in flight
// after reduce().
void Engine::mark_step_traffic() {
    const uint64_t sent = bytes_sent(), off = bytes_off_node();
    last_step_sent_ = sent - step_mark_sent_;
    last_step_off_ = off - step_mark_off_;
    step_mark_sent_ = sent;
    step_mark_off_ = off;
    mark_quant_step();
}

// Phase 3: unscale, overflow check and norm in one pass where the gradients
// are; one small allreduce over the engine's ranks (comm::allreduce_f64 on
// control_) brings the sum of squares and the non-finite flag together.
Engine::Inspection Engine::inspect_phase() {
    Inspection in;
    in.inv = 1.0 / (scaler_->scale() * static_cast<double>(cfg_.gradient_accumulation_steps));
    // The fused host step (optim::Fused): 16-bit gradients are inspected and
    // read by the update in place (no fp32 copy), the update writes the
    // 16-bit parameters and zeroes the gradients it read, all in one pass
    // per work item.
    in.fused = optimizer_->fuses();
    in.half = dtype_ != DSM_FLOAT32;
    in.raw = stage_->grad_partition();
    in.g = in.fused && in.half ? nullptr : fp32_grads();
    const amp::NormPart np = in.fused && in.half
                                 ? math_->inspect(in.raw, dtype_, layout_.part_size(), static_cast<float>(in.inv))
                                 : math_->inspect(in.g, layout_.part_size(), static_cast<float>(in.inv));
    double tot[2] = {np.sumsq, np.nonfinite ? 1.0 : 0.0};
    {
        // A reduction: its time (mostly the wait for the ranks whose
        // reduction ended last) counts as the reduction's.
        const watchdog::Context c("gradient norm and overflow check");
        timers_.reduce -= now();
        comm::allreduce_f64(*control_, tot, 2, comm::Op::SUM);
        timers_.reduce += now();
    }
    // Every copy of a partition was counted: one partition (stage 0) has
    // world_size copies, the others one per SP rank.
    const double copies = layout_.parts() == 1 ? world_size_ : sp_size_;
    in.nonfinite = tot[1] > 0 || !std::isfinite(tot[0]);
    in.norm = in.nonfinite ? INFINITY : std::sqrt(tot[0] / copies);
    grad_norm_ = in.norm;
    return in;
}

// Phase 4: what non-finite gradients do: fp16 (and bf16 with
// check_grad_overflow) skip the step and lower the loss scale; fp32 follows
// fp32_nonfinite_gradients (fail, skip, or warn once and apply). The same
// answer on every rank (the inspection's allreduce). Counts the global step;
// returns whether it is skipped.
bool Engine::nonfinite_phase(Inspection &in) {
    const bool check = cfg_.fp16.enabled || (cfg_.bf16.enabled && cfg_.bf16.check_grad_overflow);
    const config::NonfiniteGrads policy = cfg_.fp32_nonfinite_gradients;
    const bool fp32_nonfinite = dtype_ == DSM_FLOAT32 && in.nonfinite;
    in.fp32_nonfinite = fp32_nonfinite;
    if (fp32_nonfinite && (policy != config::NonfiniteGrads::WARN || !warned_nonfinite_))
        in.culprit = first_nonfinite(in.g); // fp32: g is the gradient partition
    if (fp32_nonfinite && policy == config::NonfiniteGrads::FAIL)
        DSM_FAIL(DSM_ERR_NUMERIC, "step ", global_steps_ + 1, ": non-finite (Inf or NaN) fp32 gradients",
                 in.culprit, "; fp32_nonfinite_gradients is \"fail\" (the step was not applied)");
    const bool overflow = (check && in.nonfinite) || (fp32_nonfinite && policy == config::NonfiniteGrads::SKIP);
    ++global_steps_;
    global_samples_ += cfg_.train_batch_size;
    if (fp32_nonfinite && policy == config::NonfiniteGrads::WARN && !warned_nonfinite_) {
        warned_nonfinite_ = true;
        if (world_rank_ == 0)
            DSM_WARN(ENGINE, "step %lld: non-finite (Inf or NaN) fp32 gradients%s; the step is applied and "
                     "the weights may become NaN (fp32_nonfinite_gradients \"warn\", said once; \"skip\" or "
                     "\"fail\" to stop it)", static_cast<long long>(global_steps_), in.culprit.c_str());
    }
    return overflow;
}

// Phase 5a: a skipped step: the gradients are dropped, the loss scale
// lowered.
void Engine::skip_phase(const Inspection &in) {
    ++skipped_steps_;
    last_skipped_ = true;
    zero_grads();
    scaler_->update(true);
    if (in.fp32_nonfinite)
        DSM_INFO(ENGINE, "step %lld: non-finite fp32 gradients%s, skipped (fp32_nonfinite_gradients)",
                 static_cast<long long>(global_steps_), in.culprit.c_str());
    else
        DSM_INFO(ENGINE, "step %lld: gradient overflow, skipped; loss scale now %g",
                 static_cast<long long>(global_steps_), scaler_->scale());
}

// Phase 5b: clip (the coefficient folded into the unscale), the optimizer's
// update of the master weights, and the publish: the new values written
// into the compute-dtype parameters and gathered where the stage keeps them
// whole. A piecewise optimizer runs in the publish's pieces, each piece's
// allgather leaving while the next is updated (overlap_comm), with the bits
// of one whole step; the others update first, then publish. Then
// the gradients are zeroed and the scaler and the schedule advance.
void Engine::update_phase(const Inspection &in) {
    double coef = 1.0;
    if (cfg_.gradient_clipping > 0 && std::isfinite(in.norm)) {
        const double c = cfg_.gradient_clipping / (in.norm + 1e-6);
        if (c < 1.0) coef = c;
    }
    optim::StepArgs args;
    args.step = applied_steps_ + 1;
    args.lr = current_lr();
    args.beta1 = optimizer_->hyper().beta1;
    if (schedule_ && !schedule_pending_) {
        const std::vector<double> mom = schedule_->momentum();
        if (!mom.empty()) {
            args.beta1 = mom.front();
            args.beta2 = optim::LrSchedule::kOneCycleBeta2;
        }
    }
    args.grad_scale = static_cast<float>(in.inv * coef);
    float *g = in.g;
    if (optimizer_->piecewise()) {
        optim::Fused f;
        if (in.half) {
            f.grad16 = in.raw;
            f.param16 = stage_->param_partition();
            f.dtype = dtype_;
        }
        f.zero_grads = true;
        PieceUpdate update;
        update.args = args;
        update.g = g;
        update.fused = in.fused ? &f : nullptr;
        stage_->set_update_writes_params(in.fused && in.half);
        try {
            publish(&update);
        } catch (...) {
            stage_->set_update_writes_params(false);
            throw;
        }
        stage_->set_update_writes_params(false);
    } else {
        optim::SumFn sum;
        if (layout_.parts() > 1)
            sum = [this](std::vector<double> &x) {
                // Lamb's per-parameter sums: one slot pair per parameter on
                // every rank, whatever this rank's partition holds.
                x.resize(2 * static_cast<size_t>(num_params()), 0.0);
                const watchdog::Context c("Lamb's per-parameter sums");
                comm::allreduce_f64(*dp_control_, x.data(), x.size(), comm::Op::SUM);
            };
        timers_.optimizer -= now();
        optimizer_->step(master_, g, segments_, args, sum);
        timers_.optimizer += now();
        publish();
    }
    if (in.fused && optimizer_->piecewise()) stage_->zero_grads_outside_partition();
    else zero_grads();
    scaler_->update(false);
    if (schedule_) {
        schedule_->step();
        schedule_pending_ = false;
    }
    ++applied_steps_;
}

// Phase 6: the log line (rank 0, every steps_per_print) and the metrics.
void Engine::bookkeeping(double norm) {
    if (world_rank_ == 0 && cfg_.steps_per_print > 0 && global_steps_ % cfg_.steps_per_print == 0) log_step(norm);
    record_step(norm);
}

void Engine::log_step(double norm) const {
    const double t = now();
    const double secs = t - window_start_;
    const double rate = secs > 0 ? static_cast<double>(global_samples_ - window_samples_) / secs : 0.0;
    std::printf("[dsm] step=%lld skipped=%lld lr=%.6g loss_scale=%g grad_norm=%.6g samples/s=%.1f\n",
                static_cast<long long>(global_steps_), static_cast<long long>(skipped_steps_), current_lr(),
                scaler_->scale(), norm, rate);
    if (cfg_.wall_clock_breakdown)
        std::printf("[dsm] time (s): reduce=%.4f optimizer=%.4f gather=%.4f wait=%.4f\n", timers_.reduce,
                    timers_.optimizer, timers_.gather, timers_.wait);
    std::fflush(stdout);
}

void Engine::step_info(dsm_step_info_t *info) const {
    if (info == nullptr) return;
    DSM_REQUIRE(info->size >= sizeof(dsm_step_info_t), DSM_ERR_INVALID_ARGUMENT, "info->size is ", info->size,
                ", expected ", sizeof(dsm_step_info_t), " (initialize with DSM_STEP_INFO_INITIALIZER)");
    info->boundary = last_boundary_ ? 1 : 0;
    info->skipped = last_skipped_ ? 1 : 0;
    info->global_steps = global_steps_;
    info->micro_steps = micro_steps_;
    info->skipped_steps = skipped_steps_;
    info->global_samples = global_samples_;
    info->lr = current_lr();
    info->loss_scale = scaler_->scale();
    info->grad_norm = grad_norm_;
}

} // namespace engine
} // namespace dsm
