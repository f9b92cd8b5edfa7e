// ZeRO stages 2 and 3 (zero/stage_partitioned.hpp): allocation, acquisition,
// ZeRO-3's gathers and prefetch, the update's publication, and the reduction
// of the released gradients. hpZ's and qwZ's gathers are in stage_zeropp.cc.
#include "zero/stage_partitioned.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <tuple>

#include "comm/qgz_device.hpp"
#include "comm/quantize.hpp"
#include "comm/quantize_space.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/hash.hpp"
#include "core/watchdog.hpp"
#include "mpi.h"
#include "zero/plan.hpp"
#include "zero/stage.hpp"

namespace dsm {
namespace zero {

void Partitioned::allocate() {
    const size_t T = layout_->total(), P = layout_->part_size();
    persist_end_ = 0;
    size_t largest = 0;
    int max_param = -1;
    for (const auto &s : layout_->slots()) {
        if (persistent(s.numel)) persist_end_ = s.offset + s.numel;
        largest = std::max(largest, s.numel);
        max_param = std::max(max_param, s.param);
    }
    // Shared buffers are collective allocations: every rank of the group
    // allocates the same sizes in the same order; the shared ones first, so
    // that a private one that fails on one rank does not leave its group
    // waiting in the next.
    if (s_.stage < 3) {
        param_flat_ = SharedBuffer(dp_, *space_, T * esize_);
    } else {
        param_flat_ = SharedBuffer(dp_, *space_, std::max<size_t>(persist_end_, 1) * esize_);
        param_part_ = SharedBuffer(dp_, *space_, P * esize_);
    }
    direct_ = dp_->size() == 1 && layout_->parts() == 1 && (sp_ == nullptr || sp_->size() == 1) && s_.pre == 1.0 &&
              s_.post == 1.0 && s_.comm_dtype == s_.dtype && !hpz_on() && s_.direct;
    direct_grads_ = direct_ && space_->kind() == device::Kind::HOST && s_.qgz_block == 0;
    bucket_cap_ = bucket_capacity(s_.reduce_bucket_size, layout_->used());
    bucket_send_ = SharedBuffer(dp_, *space_, bucket_cap_ * csize_);
    grad_part_ = Buffer(*space_, P * esize_);
    if (hpz_on()) {
        DSM_REQUIRE(hpz_->size() == s_.hpz, DSM_ERR_INTERNAL, "the hpZ group has ", hpz_->size(), " ranks, expected ",
                    s_.hpz);
        // This rank's secondary part, less the persistent region (held whole).
        secondary_layout_ = Layout(layout_->slots(), s_.hpz);
        const size_t b = secondary_layout_.part_begin(hpz_->rank());
        secondary_begin_ = std::max(b, persist_end_);
        const size_t end = std::max(b + secondary_layout_.part_size(), persist_end_);
        secondary_ = Buffer(*space_, (end - secondary_begin_) * esize_);
    }
    secondary_ok_.assign(static_cast<size_t>(max_param + 1), 0);
    qgz_.reset();
    qgz_space_.reset();
    if (s_.qgz_block > 0) {
        DSM_REQUIRE(static_cast<int>(nodes_.size()) == dp_->size(), DSM_ERR_INTERNAL, "qgZ: ", nodes_.size(),
                    " node colors for ", dp_->size(), " data-parallel ranks");
        if (space_->kind() == device::Kind::HOST)
            qgz_ = std::make_unique<comm::QuantizedReduce>(dp_, nodes_, s_.qgz_block, comm::quant::kGradientBits);
        else
            qgz_space_ = std::make_unique<comm::SpaceQuantizedReduce>(dp_, nodes_, s_.qgz_block,
                                                                      comm::quant::kGradientBits, *space_);
    }
    qkernels_.reset();
    if (s_.qwz_block > 0 && space_->kind() != device::Kind::HOST) qkernels_ = comm::quant::make_space_kernels(*space_);
    pool_.set_space(*space_);
    arena_ = Arena::FREE;
    bucket_holder_ = -1;
    gathered_.resize(static_cast<size_t>(max_param + 1));
    staging_.resize(static_cast<size_t>(max_param + 1));
    touched_.assign(static_cast<size_t>(max_param + 1), {});
    direct_out_.assign(static_cast<size_t>(max_param + 1), 0);
    direct_ranges_.clear();
    gather_ticket_.assign(static_cast<size_t>(max_param + 1), 0);
    // Idle buffers kept for reuse: twice the largest staging or gather need
    // (one parameter, or a ZeRO-3 prefetch group).
    const size_t prefetch = static_cast<size_t>(std::max<int64_t>(s_.prefetch_bucket_size, 0));
    pool_.set_limit(2 * (largest + (s_.stage == 3 ? prefetch : 0)) * esize_);
}

void Partitioned::free() noexcept {
    quiet_settle();
    flushes_.clear();
    published_.clear();
    pending_.clear();
    range_params_.clear();
    range_grads_.clear();
    pool_.clear();
    for (auto &b : gathered_) b = Buffer();
    for (auto &b : staging_) b = Buffer();
    for (auto &t : touched_) t.clear();
    std::fill(direct_out_.begin(), direct_out_.end(), 0);
    direct_ranges_.clear();
    // In reverse order of allocation.
    bucket_send_.reset();
    param_part_.reset();
    param_flat_.reset();
    grad_part_ = Buffer();
    secondary_ = Buffer();
    set_arena(Arena::FREE, -1);
    bucket_holder_ = -1;
}

StageMemory Partitioned::memory() const {
    StageMemory m;
    m.params = param_flat_.bytes() + param_part_.bytes();
    m.grads = grad_part_.bytes();
    m.secondary = secondary_.bytes();
    m.buckets = bucket_send_.bytes();
    for (const auto &b : gathered_) m.live += b.capacity();
    for (const auto &b : staging_) m.live += b.capacity();
    for (const Pending &pe : pending_) m.live += pe.grad.capacity();
    for (const auto &kv : range_params_) m.live += kv.second.capacity();
    for (const auto &kv : range_grads_) m.live += kv.second.capacity();
    m.idle = pool_.idle_bytes();
    return m;
}

// A parameter held whole, or read in place (direct_), is there:
// param_values() points into it. Else it stops before its gather unless
// it is gathered (prefetched) already.
void Partitioned::acquire_param(int index) {
    if (direct_ || persistent(numel_of(index))) return;
    // Where this acquisition is in the recorded order (the end: not there).
    size_t at = trace_pos_;
    while (at < last_trace_.size() && last_trace_[at] != index) ++at;
    if (gathered(index)) return after_gather(index, at);
    // Blocking: this parameter and the next ones of the trace in one
    // gather, up to stage3_prefetch_bucket_size elements, no more than
    // stage3_max_live_parameters gathered at once. Overlapped: this one
    // alone (the least to wait for); prefetch_ahead() sends the rest.
    const bool overlap = pipe_->mode() != comm::Pipeline::Mode::INLINE;
    const int64_t room = std::max<int64_t>(0, s_.max_live_parameters - static_cast<int64_t>(live_elems()));
    const size_t budget = overlap ? 0 : static_cast<size_t>(std::min(std::max<int64_t>(s_.prefetch_bucket_size, 0), room));
    const std::vector<int> list = prefetch_list(
        last_trace_, trace_pos_, index, budget, [this](int j) { return numel_of(j); },
        [this](int j) { return gathered(j); });
    stop_before(PointDetail("parameter index", list.front()), [this, list, index, at](const PointDetail &) {
        gather(list);
        after_gather(index, at);
    });
}

void Partitioned::after_gather(int index, size_t at) {
    if (at < last_trace_.size()) trace_pos_ = at + 1; // reused_soon() looks ahead from here
    if (pipe_->mode() != comm::Pipeline::Mode::INLINE) prefetch_ahead(at, index);
}

const void *Partitioned::param_values(int index) {
    const zero::Slot *s = layout_->slot_of(index);
    if (direct_ && !persistent(s->numel)) return static_cast<const char *>(param_part_.data()) + s->offset * esize_;
    if (persistent(s->numel)) {
        wait_published(s->offset + s->numel);
        return static_cast<const char *>(param_flat_.data()) + s->offset * esize_;
    }
    pipe_->wait(gather_ticket_[static_cast<size_t>(index)]);
    trace_.push_back(index);
    if (arena_ == Arena::PARAM && arena_param_ == index) return bucket_send_.data();
    return gathered_[static_cast<size_t>(index)].data();
}

// A range of a parameter: held whole, a pointer into it; else gathered
// alone from the primary partitions (hpZ's secondary copies keep whole
// parameters only) into a buffer of its own.
void Partitioned::acquire_param_range(int index, size_t offset, size_t count) {
    if (direct_ || persistent(numel_of(index))) return;
    PointDetail range("parameter index", index);
    range.add("offset", static_cast<int64_t>(offset)).add("count", static_cast<int64_t>(count));
    stop_before(std::move(range), [this, index, offset, count](const PointDetail &) {
        const size_t a = layout_->slot_of(index)->offset + offset, b = a + count;
        Buffer &buf = range_params_[RangeKey{index, offset, count}];
        buf = pool_.take(count * esize_, false, memstat::Use::GATHERED);
        char *to = static_cast<char *>(buf.data());
        Source src = primary();
        range_ticket_ = pipe_->submit([this, a, b, src, to] {
            const double t0 = MPI_Wtime();
            const std::vector<size_t> counts = src.layout->counts(a, b);
            const size_t lo = std::max(a, src.layout->part_begin(src.part));
            const char *mine = counts[static_cast<size_t>(src.part)] ? src.base + (lo - src.begin) * esize_ : src.base;
            src.group->allgatherv(mine, to, counts, s_.dtype, queue());
            timers_->gather += MPI_Wtime() - t0;
        });
    });
}

const void *Partitioned::param_range_values(int index, size_t offset, size_t count) {
    const zero::Slot *s = layout_->slot_of(index);
    const size_t a = s->offset + offset, b = a + count;
    if (persistent(s->numel)) {
        wait_published(b);
        return static_cast<const char *>(param_flat_.data()) + a * esize_;
    }
    if (direct_) return static_cast<const char *>(param_part_.data()) + a * esize_;
    pipe_->wait(range_ticket_);
    return range_params_.at(RangeKey{index, offset, count}).data();
}

// Gather whole parameters: with hpZ, those whose secondary slices are
// current from the group's secondary partitions, the others from the
// primary ones (keeping their secondary slices); else all from the primary.
void Partitioned::gather(const std::vector<int> &list) {
    std::vector<int> from_primary, from_secondary;
    for (int j : list) (secondary_ok_[static_cast<size_t>(j)] ? from_secondary : from_primary).push_back(j);
    if (!from_primary.empty()) {
        const comm::Pipeline::Ticket t = gather_from(from_primary, primary());
        for (int j : from_primary) {
            gather_ticket_[static_cast<size_t>(j)] = t;
            if (hpz_on()) secondary_ok_[static_cast<size_t>(j)] = 1; // the pipeline runs in order
        }
    }
    if (!from_secondary.empty()) {
        const comm::Pipeline::Ticket t = gather_from(from_secondary, secondary());
        for (int j : from_secondary) gather_ticket_[static_cast<size_t>(j)] = t;
    }
}

// One allgatherv over `src`'s group. One parameter goes straight into its
// buffer; several (prefetch) are packed by owner and unpacked.
comm::Pipeline::Ticket Partitioned::gather_from(const std::vector<int> &list, const Source &src) {
    comm::Pipeline::Ticket t = 0;
    if (list.size() == 1) {
        // One parameter: straight into the bucket when it is free (shared
        // memory, which the backend's peers read in place), else into a buffer.
        const int j = list.front();
        const zero::Slot *s = layout_->slot_of(j);
        char *to;
        if (arena_fits(s->numel)) {
            set_arena(Arena::PARAM, j);
            to = static_cast<char *>(bucket_send_.data());
        } else {
            gathered_[static_cast<size_t>(j)] = pool_.take(s->numel * esize_, false, memstat::Use::GATHERED);
            to = static_cast<char *>(gathered_[static_cast<size_t>(j)].data());
        }
        const bool arena = to == bucket_send_.data();
        const bool quantized = qwz_on() && src.group == dp_; // decided now: exact_ may change before the task runs
        t = pipe_->submit([this, s, src, to, quantized] {
            const double t0 = MPI_Wtime();
            if (quantized) {
                gather_quantized({s->param}, src, {to});
                timers_->gather += MPI_Wtime() - t0;
                return;
            }
            if (src.group == hpz_ && gather_direct({s->param}, src, {to})) {
                timers_->gather += MPI_Wtime() - t0;
                return;
            }
            const std::vector<size_t> counts = src.layout->counts(s->offset, s->offset + s->numel);
            const size_t lo = std::max(s->offset, src.layout->part_begin(src.part));
            const char *mine = counts[static_cast<size_t>(src.part)] ? src.base + (lo - src.begin) * esize_ : src.base;
            const watchdog::Context ctx("ZeRO-3 parameter gather", "parameter", s->param);
            src.group->allgatherv(mine, to, counts, s_.dtype, queue());
            if (src.keep) keep_secondary(s->param, to);
            timers_->gather += MPI_Wtime() - t0;
        });
        if (arena) bucket_ticket_ = t;
        return t;
    }
    auto dst = std::make_shared<std::vector<char *>>();
    for (int j : list) {
        gathered_[static_cast<size_t>(j)] = pool_.take(numel_of(j) * esize_, false, memstat::Use::GATHERED);
        dst->push_back(static_cast<char *>(gathered_[static_cast<size_t>(j)].data()));
    }
    const bool quantized = qwz_on() && src.group == dp_;
    return pipe_->submit([this, list, dst, src, quantized] {
        const double t0 = MPI_Wtime();
        if (quantized) {
            gather_quantized(list, src, *dst);
            timers_->gather += MPI_Wtime() - t0;
            return;
        }
        if (src.group == hpz_ && gather_direct(list, src, *dst)) {
            timers_->gather += MPI_Wtime() - t0;
            return;
        }
        const GatherPlan plan = plan_gather(*src.layout, list);
        size_t total = 0;
        for (size_t c : plan.counts) total += c;
        Buffer send(*space_, plan.counts[static_cast<size_t>(src.part)] * esize_ + 64, false),
            recv(*space_, total * esize_ + 64, false);
        size_t at = 0;
        for (const auto &jp : plan.pieces)
            if (jp.second.part == src.part) {
                space_->copy(static_cast<char *>(send.data()) + at * esize_,
                             src.base + (jp.second.flat_offset - src.begin) * esize_, jp.second.count * esize_);
                at += jp.second.count;
            }
        const watchdog::Context ctx("ZeRO-3 parameter gather", "first parameter", list.empty() ? -1 : list.front());
        src.group->allgatherv(send.data(), recv.data(), plan.counts, s_.dtype, queue());
        at = 0;
        for (const auto &jp : plan.pieces) {
            const size_t k = static_cast<size_t>(std::find(list.begin(), list.end(), jp.first) - list.begin());
            space_->copy((*dst)[k] + jp.second.param_offset * esize_, static_cast<char *>(recv.data()) + at * esize_,
                         jp.second.count * esize_);
            at += jp.second.count;
        }
        if (src.keep)
            for (size_t k = 0; k < list.size(); ++k) keep_secondary(list[k], (*dst)[k]);
        timers_->gather += MPI_Wtime() - t0;
    });
}

// overlap_comm, ZeRO-3: gather now the parameters of the recorded trace
// after `index` (at position `p`; none when p is past the end) that lie within
// stage3_prefetch_bucket_size elements of it and are not gathered yet, so
// that they arrive while the caller computes; never more than
// stage3_max_live_parameters elements gathered at once. Every rank decides
// alike (the same trace, the same acquisitions), so the gather is a
// collective point like any other.
void Partitioned::prefetch_ahead(size_t p, int index) {
    if (p >= last_trace_.size()) return;
    const size_t window = static_cast<size_t>(std::max<int64_t>(s_.prefetch_bucket_size, 0));
    const int64_t room = s_.max_live_parameters - static_cast<int64_t>(live_elems());
    std::vector<int> list;
    size_t ahead = 0, adding = 0;
    for (size_t k = p + 1; k < last_trace_.size(); ++k) {
        const int j = last_trace_[k];
        if (j == index || std::find(list.begin(), list.end(), j) != list.end()) continue;
        ahead += numel_of(j);
        if (ahead > window) break;
        if (gathered(j)) continue;
        if (static_cast<int64_t>(adding + numel_of(j)) > room) break;
        adding += numel_of(j);
        list.push_back(j);
    }
    if (list.empty()) return;
    stop_before(PointDetail("parameter index", list.front()), [this, list](const PointDetail &) { gather(list); });
}

// stage3_max_reuse_distance: whether the trace acquires `index` again within
// that many elements of the current position (then a release keeps it).
bool Partitioned::reused_soon(int index) const {
    if (last_trace_.empty()) return false;
    size_t traversed = 0;
    for (size_t k = trace_pos_; k < last_trace_.size(); ++k) {
        if (static_cast<int64_t>(traversed) >= s_.max_reuse_distance) break;
        if (last_trace_[k] == index) return true;
        traversed += numel_of(last_trace_[k]);
    }
    return false;
}

// Elements of the parameters gathered (or being gathered) now.
size_t Partitioned::live_elems() const {
    size_t n = 0;
    for (const auto &s : layout_->slots())
        if (!persistent(s.numel) && gathered(s.param)) n += s.numel;
    return n;
}

// Wait for the slice of publish()'s allgather that holds element `end - 1`
// (the slices before it are done first: the pipeline runs in order).
void Partitioned::wait_published(size_t end) {
    for (const auto &sl : published_)
        if (sl.first >= end) {
            pipe_->wait(sl.second);
            return;
        }
}

// The pieces: with overlap_comm, one per slice of allgather_bucket_size
// elements of what the stage holds whole (stage 2: every parameter; stage
// 3: the persistent region), each sent in place as soon as this rank's
// share of it is up to date and waited for by the first acquisition that
// reads it; then the rest of the partition (stage 3: the partitioned
// parameters). Blocking: one piece, then one allgather.
const std::vector<size_t> &Partitioned::begin_publish() {
    pipe_->wait_all(); // gathers in flight read the partition
    published_.clear();
    // hpZ: the secondary copies hold the values before this update.
    std::fill(secondary_ok_.begin(), secondary_ok_.end(), 0);
    return plan_publish(pipe_->mode() != comm::Pipeline::Mode::INLINE,
                        s_.stage == 2 ? layout_->total() : persist_end_);
}

void Partitioned::publish_piece(const float *master, size_t k) {
    convert_upto(master, ends_[k]);
    void *part = param_partition();
    const size_t P = layout_->part_size();
    if (pipe_->mode() == comm::Pipeline::Mode::INLINE) {
        const watchdog::Context ctx("parameter allgather after the update");
        if (s_.stage == 2) {
            dp_->allgather(part, param_flat_.data(), P, s_.dtype, queue());
        } else if (persist_end_ > 0) {
            const std::vector<size_t> counts = layout_->counts(0, persist_end_);
            dp_->allgatherv(part, param_flat_.data(), counts, s_.dtype, queue());
        }
        return;
    }
    if (k >= slices_.size()) return; // the last piece: stage 3's partitioned parameters
    // This rank's block of a slice starts in its partition (stage 2: in
    // place in the flat parameters; stage 3: the partition's own buffer).
    const size_t a = slices_[k].first, b = slices_[k].second;
    const size_t my_begin = layout_->part_begin(part_);
    char *flat = static_cast<char *>(param_flat_.data());
    const char *send = static_cast<const char *>(part) + (std::max(a, my_begin) - my_begin) * esize_;
    const comm::Pipeline::Ticket t = pipe_->submit([this, a, b, flat, send] {
        const double t0 = MPI_Wtime();
        const std::vector<size_t> counts = layout_->counts(a, b);
        const watchdog::Context ctx("parameter allgather after the update", "from element", static_cast<int64_t>(a));
        dp_->allgatherv(send, flat + a * esize_, counts, s_.dtype, queue());
        timers_->gather += MPI_Wtime() - t0;
    });
    published_.emplace_back(b, t);
}

void Partitioned::new_micro_step(bool forget) {
    flush_index_ = 0;
    pipe_->wait_all(); // prefetches write the gathered buffers
    for (const auto &s : layout_->slots())
        if (!persistent(s.numel)) pool_.give(std::move(gathered_[static_cast<size_t>(s.param)]));
    if (arena_ == Arena::PARAM) set_arena(Arena::FREE, -1);
    if (forget) last_trace_.clear();
    else last_trace_.swap(trace_);
    trace_.clear();
    trace_pos_ = 0;
}

// Reduce the released gradients: each is split into its pieces per owning
// partition; every round packs up to bucket_cap_ elements, grouped by owner,
// reduce-scatters them over the data-parallel group and adds this rank's
// share into its gradient partition.
void Partitioned::flush(bool settle) {
    // The bucket's parameters, in order, must be the same on every rank.
    PointDetail bucket;
    bucket.bucket = static_cast<int64_t>(flush_index_++);
    for (const auto &p : pending_)
        bucket.list.push_back(PointDetail::Entry{p.param, static_cast<int64_t>(p.offset), static_cast<int64_t>(p.count)});
    stop_before(std::move(bucket), [this, settle](const PointDetail &agreed) {
        reduce_bucket(agreed);
        if (!settle) return;
        pipe_->wait_all();
        flushes_.clear();
    });
}

// The flush's reduction, submitted (overlap_comm: it runs while the caller
// goes on).
void Partitioned::reduce_bucket(const PointDetail &bucket) {
    if (pending_.empty()) return;
    auto job = std::make_shared<std::vector<Pending>>(std::move(pending_));
    pending_.clear();
    bucket_elems_ = 0;
    int resident = -1;
    for (size_t e = 0; e < job->size(); ++e)
        if ((*job)[e].in_bucket) resident = static_cast<int>(e);
    if (resident >= 0) set_arena(Arena::FREE, -1); // the bucket is the reduction's now
    // The user holds the bucket (an acquired gradient or a gathered parameter):
    // the rounds are packed elsewhere.
    const bool user_holds = arena_ != Arena::FREE;
    // At most one more reduction waits behind the running one (DeepSpeed's
    // double buffering), so released gradients do not pile up; gathers in
    // between do not count.
    while (flushes_.size() >= 2) {
        pipe_->wait(flushes_.front());
        flushes_.pop_front();
    }
    // The reduction (on the progress thread too) is named by the bucket's index and parameters.
    const watchdog::Context ctx("gradient bucket", "bucket", bucket.bucket, bucket.list_text());
    const comm::Pipeline::Ticket t =
        pipe_->submit([this, job, resident, user_holds] { reduce_pending(*job, resident, user_holds); });
    flushes_.push_back(t);
    if (resident >= 0 || !user_holds) bucket_ticket_ = t;
}

// The reduction of one flush's gradients (on overlap_comm's progress thread
// when there is one): touches the bucket (unless the user holds it), the
// gradient partition, the pool and the backends only.
void Partitioned::reduce_pending(std::vector<Pending> &pending, int resident, bool user_holds) {
    const double t0 = MPI_Wtime();
    const dsm_dtype_t dt = s_.dtype, cd = s_.comm_dtype;
    const float post = static_cast<float>(s_.post);
    std::vector<Released> released;
    for (auto &p : pending) {
        const size_t n = p.count;
        if (s_.pre != 1.0) math_->scale(p.data, dt, n, s_.pre);
        const watchdog::Context ctx("gradient sum over sequence parallel", "parameter", p.param);
        if (sp_) sp_->allreduce(p.data, p.data, n, dt, comm::Op::SUM, queue());
        released.push_back(Released{p.param, p.offset, p.count});
    }
    // One rank (direct_): the sum over one rank is the gradient itself, so
    // where the space's math has a multi-tensor accumulation (CUDA) each is
    // added into the partition straight from where it was released, in one
    // launch with accumulate_into's bits and in release order (no packing
    // copy, no launch per gradient); elsewhere (false) the rounds below.
    if (direct_ && !qgz_ && !qgz_space_) {
        std::vector<amp::Math::Piece> pieces;
        pieces.reserve(pending.size());
        for (const Pending &pe : pending)
            pieces.push_back(amp::Math::Piece{pe.data, layout_->slot_of(pe.param)->offset + pe.offset - layout_->part_begin(part_), pe.count});
        if (math_->accumulate_pieces(pieces, dt, grad_part_.data(), dt, post)) {
            for (Pending &pe : pending) pool_.give(std::move(pe.grad));
            timers_->reduce += MPI_Wtime() - t0;
            return;
        }
    }
    const std::vector<Round> rounds = plan_range_rounds(*layout_, released, bucket_cap_);
    // A gradient in the bucket that makes the first round alone is reduced
    // in place; one that shares its round moves out first, so that the
    // rounds can be packed into the bucket.
    bool in_place = false;
    if (resident >= 0) {
        in_place = resident == 0;
        for (const SendPiece &pc : rounds.front().pieces) in_place = in_place && pc.entry == 0;
        if (!in_place) {
            Pending &pe = pending[static_cast<size_t>(resident)];
            const size_t bytes = pe.count * esize_;
            pe.grad = pool_.take(bytes, false, memstat::Use::GRADIENTS);
            space_->copy(pe.grad.data(), pe.data, bytes);
            pe.data = static_cast<char *>(pe.grad.data());
            pe.in_bucket = false;
        }
    }
    // Packed into the bucket unless the user holds a buffer there.
    Buffer spare;
    char *send = static_cast<char *>(bucket_send_.data());
    if (user_holds) {
        spare = pool_.take(bucket_cap_ * csize_, false);
        send = static_cast<char *>(spare.data());
    }
    const size_t my_begin = layout_->part_begin(part_);
    Buffer qsum;
    // One data-parallel rank: the reduce-scatter is the identity and the
    // packing an exact copy (or an exact widening to an fp32 comm dtype), so
    // each piece is added into the partition straight from the released
    // gradient, with the bits of the packed path.
    const bool alone = dp_->size() == 1 && !qgz_ && !qgz_space_ && (cd == dt || cd == DSM_FLOAT32);
    for (size_t k = 0; alone && k < rounds.size(); ++k)
        for (const SendPiece &pc : rounds[k].pieces) {
            if (pc.part != part_) continue; // none: one rank holds every part
            math_->accumulate_into(pending[static_cast<size_t>(pc.entry)].data + pc.src * esize_, dt,
                                   static_cast<char *>(grad_part_.data()) + (pc.flat - my_begin) * esize_, dt,
                                   pc.count, post);
        }
    for (size_t k = 0; !alone && k < rounds.size(); ++k) {
        const Round &r = rounds[k];
        char *buf = send;
        if (k == 0 && in_place) {
            buf = static_cast<char *>(bucket_send_.data()); // already in order: the parameter's pieces by owner
        } else {
            size_t at = 0;
            for (const SendPiece &pc : r.pieces) {
                math_->convert(pending[static_cast<size_t>(pc.entry)].data + pc.src * esize_, dt, buf + at * csize_,
                                cd, pc.count);
                at += pc.count;
            }
        }
        size_t mine = 0;
        for (int q = 0; q < part_; ++q) mine += r.counts[static_cast<size_t>(q)];
        char *recv = buf + mine * csize_;
        const watchdog::Context ctx("gradient reduce-scatter", "round", static_cast<int64_t>(k));
        dsm_dtype_t rd = cd; // the dtype of the reduced values at recv
        if (qgz_ || qgz_space_) {
            // qgZ: the sums in fp32, added into the partition below as the plain path's are.
            if (!qsum.data()) qsum = pool_.take(bucket_cap_ * sizeof(float), false);
            if (qgz_) qgz_->reduce_scatter(buf, r.counts, cd, static_cast<float *>(qsum.data()), &qgz_bytes_);
            else qgz_space_->reduce_scatter(buf, r.counts, cd, static_cast<float *>(qsum.data()), &qgz_bytes_);
            recv = static_cast<char *>(qsum.data());
            rd = DSM_FLOAT32;
        } else {
            dp_->reduce_scatterv(buf, recv, r.counts, cd, comm::Op::SUM, queue()); // in place
        }
        const size_t rsize = dtype_size(rd);
        // Unpack this rank's pieces in the same order, adding into the partition.
        size_t at = 0;
        for (const SendPiece &pc : r.pieces) {
            if (pc.part != part_) continue;
            const size_t dst = pc.flat - my_begin;
            // A 16-bit partition adds in fp32, rounded once.
            math_->accumulate_into(recv + at * rsize, rd, static_cast<char *>(grad_part_.data()) + dst * esize_, dt,
                                    pc.count, post);
            at += pc.count;
        }
    }
    pool_.give(std::move(spare));
    pool_.give(std::move(qsum));
    for (Pending &pe : pending) pool_.give(std::move(pe.grad));
    timers_->reduce += MPI_Wtime() - t0;
}

std::unique_ptr<Stage> make_partitioned(const StageSettings &s) { return std::make_unique<Partitioned>(s); }

} // namespace zero
} // namespace dsm
