// ZeRO stages 2 and 3: each rank holds the gradients of its partition only.
// A released gradient goes into a bucket; when the bucket holds
// reduce_bucket_size elements (and at every dsm_step) its gradients are
// summed over the sequence-parallel group and reduce-scattered, packed by
// owner (plan_rounds), into the owners' gradient partitions. Stage 2 holds
// the parameters whole (allgathered after each step); stage 3 holds its
// partition and the small persistent parameters whole, and gathers the
// others when they are acquired, prefetching along the previous
// micro-step's order of acquisitions (prefetch_list).
//
// The bucket (one round, reduce_bucket_size elements at most, in the
// backend's shared memory) is also where a gradient or a gathered parameter
// lives while nothing else uses it, when the communication dtype is the
// compute dtype: a gradient written there by the user is reduce-scattered in
// place when it makes a round alone (no staging copy, no packing, no receive
// buffer), and a parameter gathered there needs no copy through the
// backend's scratch memory. So the memory beyond the ZeRO formula is one
// bucket. A buffer the bucket cannot hold (larger, or the bucket busy) comes
// from the pool of idle buffers.
#include <algorithm>
#include <cstring>

#include "core/error.hpp"
#include "mpi.h"
#include "zero/plan.hpp"
#include "zero/stage.hpp"

namespace dsm {
namespace zero {

namespace {

class Partitioned final : public Stage {
public:
    explicit Partitioned(const StageSettings &s) : Stage(s) {}

    int parts(int dp) const override { return dp; }
    bool persistent(size_t numel) const override {
        return s_.stage < 3 || static_cast<int64_t>(numel) <= s_.persistence_threshold;
    }
    double formula(double pw, double K, double dp) const override {
        return s_.stage == 2 ? pw + (pw + K) / dp : (pw + pw + K) / dp;
    }

    void allocate() override;
    void free() noexcept override;

    void *param_partition() override {
        return s_.stage < 3 ? static_cast<char *>(param_flat_.data()) + layout_->part_begin(part_) * esize_
                            : param_part_.data();
    }
    void *whole_params(size_t *bytes) override {
        *bytes = param_flat_.bytes();
        return param_flat_.data();
    }
    const void *acquire_param(int index, const Before &before) override;
    void release_param(int index) override {
        if (held_whole(index)) return;
        if (arena_ == Arena::PARAM && arena_param_ == index) arena_ = Arena::FREE;
        pool_.give(std::move(gathered_[static_cast<size_t>(index)]));
    }
    void publish(const float *master) override;
    void new_micro_step(bool forget) override;

    void *acquire_grad(int index) override {
        const size_t n = layout_->slot_of(index)->numel;
        if (arena_fits(n)) {
            arena_ = Arena::GRAD;
            arena_param_ = index;
            space_->zero(bucket_send_.data(), n * esize_);
            return bucket_send_.data();
        }
        Buffer &b = staging_[static_cast<size_t>(index)];
        b = pool_.take(n * esize_, true);
        return b.data();
    }
    void release_grad(int index, const Before &before) override {
        bucket_elems_ += layout_->slot_of(index)->numel;
        Buffer &b = staging_[static_cast<size_t>(index)];
        const bool in_bucket = arena_ == Arena::GRAD && arena_param_ == index;
        char *data = static_cast<char *>(in_bucket ? bucket_send_.data() : b.data());
        pending_.push_back(Pending{index, std::move(b), data, in_bucket});
        if (bucket_elems_ >= bucket_cap_) flush(before);
    }
    void reduce(bool, const Before &before) override { flush(before); }
    const void *grad_partition() const override { return grad_part_.data(); }
    void zero_grads() override { space_->zero(grad_part_.data(), layout_->part_size() * esize_); }

    StageMemory memory() const override;

private:
    bool held_whole(int index) const { return persistent(layout_->slot_of(index)->numel); }
    bool gathered(int index) const {
        return gathered_[static_cast<size_t>(index)] || (arena_ == Arena::PARAM && arena_param_ == index);
    }
    // Whether `n` compute elements may use the bucket now.
    bool arena_fits(size_t n) const {
        return arena_ == Arena::FREE && s_.comm_dtype == s_.dtype && n > 0 && n <= bucket_cap_;
    }
    void flush(const Before &before);
    void gather(const std::vector<int> &list);

    SharedBuffer param_flat_;  // stage 2: T; stage 3: the persistent region
    SharedBuffer param_part_;  // stage 3: P
    SharedBuffer bucket_send_; // one round, packed by owner; reduced in place
    Buffer grad_part_;         // P
    // What the bucket holds between flushes: nothing, the gradient of
    // arena_param_ (acquired, or released and pending), or its gathered values.
    enum class Arena { FREE, GRAD, PARAM };
    Arena arena_ = Arena::FREE;
    int arena_param_ = -1;
    size_t bucket_cap_ = 0;    // elements per reduction round
    size_t persist_end_ = 0;   // stage 3: flat elements [0, persist_end_) are held whole

    // Per parameter index: the gathered copy (stage 3, while acquired or
    // prefetched) and the gradient buffer while acquired.
    std::vector<Buffer> gathered_, staging_;
    // Gradients released since the last flush, in release order.
    struct Pending {
        int param;
        Buffer grad; // empty when the gradient is in the bucket
        char *data;
        bool in_bucket;
    };
    std::vector<Pending> pending_;
    size_t bucket_elems_ = 0;
    BufferPool pool_;

    // Stage 3 prefetch: the order of gathered acquisitions in the last micro-step.
    std::vector<int> trace_, last_trace_;
    size_t trace_pos_ = 0;
};

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
    bucket_cap_ = bucket_capacity(s_.reduce_bucket_size, layout_->used());
    bucket_send_ = SharedBuffer(dp_, *space_, bucket_cap_ * csize_);
    grad_part_ = Buffer(*space_, P * esize_);
    pool_.set_space(*space_);
    arena_ = Arena::FREE;
    gathered_.resize(static_cast<size_t>(max_param + 1));
    staging_.resize(static_cast<size_t>(max_param + 1));
    // Idle buffers kept for reuse: twice the largest staging or gather need
    // (one parameter, or a ZeRO-3 prefetch group).
    const size_t prefetch = static_cast<size_t>(std::max<int64_t>(s_.prefetch_bucket_size, 0));
    pool_.set_limit(2 * (largest + (s_.stage == 3 ? prefetch : 0)) * esize_);
}

void Partitioned::free() noexcept {
    pending_.clear();
    pool_.clear();
    for (auto &b : gathered_) b = Buffer();
    for (auto &b : staging_) b = Buffer();
    // In reverse order of allocation.
    bucket_send_.reset();
    param_part_.reset();
    param_flat_.reset();
    grad_part_ = Buffer();
    arena_ = Arena::FREE;
}

StageMemory Partitioned::memory() const {
    StageMemory m;
    m.params = param_flat_.bytes() + param_part_.bytes();
    m.grads = grad_part_.bytes();
    m.buckets = bucket_send_.bytes();
    for (const auto &b : gathered_) m.live += b.capacity();
    for (const auto &b : staging_) m.live += b.capacity();
    for (const Pending &pe : pending_) m.live += pe.grad.capacity();
    m.idle = pool_.idle_bytes();
    return m;
}

const void *Partitioned::acquire_param(int index, const Before &before) {
    const zero::Slot *s = layout_->slot_of(index);
    if (persistent(s->numel)) return static_cast<const char *>(param_flat_.data()) + s->offset * esize_;
    if (!gathered(index)) {
        const std::vector<int> list = prefetch_list(
            last_trace_, trace_pos_, index, static_cast<size_t>(std::max<int64_t>(s_.prefetch_bucket_size, 0)),
            [this](int j) { return layout_->slot_of(j)->numel; },
            [this](int j) { return gathered(j); });
        before(list.front());
        gather(list);
    }
    trace_.push_back(index);
    if (arena_ == Arena::PARAM && arena_param_ == index) return bucket_send_.data();
    return gathered_[static_cast<size_t>(index)].data();
}

// Gather whole parameters from their partitions (allgatherv over the
// data-parallel group). One parameter goes straight into its buffer; several
// (prefetch) are packed by owner and unpacked.
void Partitioned::gather(const std::vector<int> &list) {
    const double t0 = MPI_Wtime();
    const char *part = static_cast<const char *>(param_part_.data());
    const size_t my_begin = layout_->part_begin(part_);
    if (list.size() == 1) {
        // One parameter: straight into the bucket when it is free (shared
        // memory, which the backend's peers read in place), else into a buffer.
        const int j = list.front();
        const zero::Slot *s = layout_->slot_of(j);
        void *to;
        if (arena_fits(s->numel)) {
            arena_ = Arena::PARAM;
            arena_param_ = j;
            to = bucket_send_.data();
        } else {
            gathered_[static_cast<size_t>(j)] = pool_.take(s->numel * esize_, false);
            to = gathered_[static_cast<size_t>(j)].data();
        }
        const std::vector<size_t> counts = layout_->counts(s->offset, s->offset + s->numel);
        const size_t lo = std::max(s->offset, my_begin);
        dp_->allgatherv(part + (lo - my_begin) * esize_, to, counts, s_.dtype, queue());
    } else {
        for (int j : list) gathered_[static_cast<size_t>(j)] = pool_.take(layout_->slot_of(j)->numel * esize_, false);
        const GatherPlan plan = plan_gather(*layout_, list);
        size_t total = 0;
        for (size_t c : plan.counts) total += c;
        Buffer send(*space_, plan.counts[static_cast<size_t>(part_)] * esize_ + 64, false),
            recv(*space_, total * esize_ + 64, false);
        size_t at = 0;
        for (const auto &jp : plan.pieces)
            if (jp.second.part == part_) {
                space_->copy(static_cast<char *>(send.data()) + at * esize_,
                             part + (jp.second.flat_offset - my_begin) * esize_, jp.second.count * esize_);
                at += jp.second.count;
            }
        dp_->allgatherv(send.data(), recv.data(), plan.counts, s_.dtype, queue());
        at = 0;
        for (const auto &jp : plan.pieces) {
            space_->copy(static_cast<char *>(gathered_[static_cast<size_t>(jp.first)].data()) + jp.second.param_offset * esize_,
                         static_cast<char *>(recv.data()) + at * esize_, jp.second.count * esize_);
            at += jp.second.count;
        }
    }
    timers_->gather += MPI_Wtime() - t0;
}

void Partitioned::publish(const float *master) {
    void *part = param_partition();
    if (s_.dtype != DSM_FLOAT32) math_->convert(master, DSM_FLOAT32, part, s_.dtype, layout_->part_size());
    if (s_.stage == 2) {
        dp_->allgather(part, param_flat_.data(), layout_->part_size(), s_.dtype, queue());
    } else if (persist_end_ > 0) {
        const std::vector<size_t> counts = layout_->counts(0, persist_end_);
        dp_->allgatherv(part, param_flat_.data(), counts, s_.dtype, queue());
    }
}

void Partitioned::new_micro_step(bool forget) {
    for (const auto &s : layout_->slots())
        if (!persistent(s.numel)) pool_.give(std::move(gathered_[static_cast<size_t>(s.param)]));
    if (arena_ == Arena::PARAM) arena_ = Arena::FREE;
    if (forget) last_trace_.clear();
    else last_trace_.swap(trace_);
    trace_.clear();
    trace_pos_ = 0;
}

// Reduce the released gradients: each is split into its pieces per owning
// partition; every round packs up to bucket_cap_ elements, grouped by owner,
// reduce-scatters them over the data-parallel group and adds this rank's
// share into its gradient partition.
void Partitioned::flush(const Before &before) {
    // The bucket's parameters, in order, must be the same on every rank.
    uint64_t h = 1469598103934665603ull;
    for (const auto &p : pending_) h = (h ^ static_cast<uint64_t>(p.param + 1)) * 1099511628211ull;
    before(static_cast<int64_t>(h >> 2));
    if (pending_.empty()) return;
    const double t0 = MPI_Wtime();
    const dsm_dtype_t dt = s_.dtype, cd = s_.comm_dtype;
    const float post = static_cast<float>(s_.post);
    std::vector<int> released;
    for (auto &p : pending_) {
        const size_t n = layout_->slot_of(p.param)->numel;
        if (s_.pre != 1.0) math_->scale(p.data, dt, n, s_.pre);
        if (sp_) sp_->allreduce(p.data, p.data, n, dt, comm::Op::SUM, queue());
        released.push_back(p.param);
    }
    const std::vector<Round> rounds = plan_rounds(*layout_, released, bucket_cap_);
    // A gradient in the bucket that makes the first round alone is reduced
    // in place; one that shares its round moves out first, so that the
    // rounds can be packed into the bucket.
    int resident = -1;
    for (size_t e = 0; e < pending_.size(); ++e)
        if (pending_[e].in_bucket) resident = static_cast<int>(e);
    bool in_place = false;
    if (resident >= 0) {
        in_place = resident == 0;
        for (const SendPiece &pc : rounds.front().pieces) in_place = in_place && pc.entry == 0;
        if (!in_place) {
            Pending &pe = pending_[static_cast<size_t>(resident)];
            const size_t bytes = layout_->slot_of(pe.param)->numel * esize_;
            pe.grad = pool_.take(bytes, false);
            space_->copy(pe.grad.data(), pe.data, bytes);
            pe.data = static_cast<char *>(pe.grad.data());
            pe.in_bucket = false;
        }
        arena_ = Arena::FREE;
    }
    // Packed into the bucket unless the user holds a buffer there.
    Buffer spare;
    char *send = static_cast<char *>(bucket_send_.data());
    if (arena_ != Arena::FREE) {
        spare = pool_.take(bucket_cap_ * csize_, false);
        send = static_cast<char *>(spare.data());
    }
    const size_t my_begin = layout_->part_begin(part_);
    Buffer scratch;
    if (dt != DSM_FLOAT32) scratch = pool_.take(bucket_cap_ * sizeof(float), false);
    for (size_t k = 0; k < rounds.size(); ++k) {
        const Round &r = rounds[k];
        char *buf = send;
        if (k == 0 && in_place) {
            buf = static_cast<char *>(bucket_send_.data()); // already in order: the parameter's pieces by owner
        } else {
            size_t at = 0;
            for (const SendPiece &pc : r.pieces) {
                math_->convert(pending_[static_cast<size_t>(pc.entry)].data + pc.src * esize_, dt, buf + at * csize_,
                                cd, pc.count);
                at += pc.count;
            }
        }
        size_t mine = 0;
        for (int q = 0; q < part_; ++q) mine += r.counts[static_cast<size_t>(q)];
        char *recv = buf + mine * csize_;
        dp_->reduce_scatterv(buf, recv, r.counts, cd, comm::Op::SUM, queue()); // in place
        // Unpack this rank's pieces in the same order, adding into the partition.
        size_t at = 0;
        for (const SendPiece &pc : r.pieces) {
            if (pc.part != part_) continue;
            const size_t dst = pc.flat - my_begin;
            // A 16-bit partition adds in fp32 through the scratch buffer, rounded once.
            math_->accumulate_into(recv + at * csize_, cd, static_cast<char *>(grad_part_.data()) + dst * esize_, dt,
                                    pc.count, post, static_cast<float *>(scratch.data()));
            at += pc.count;
        }
    }
    pool_.give(std::move(spare));
    pool_.give(std::move(scratch));
    for (Pending &pe : pending_) pool_.give(std::move(pe.grad));
    pending_.clear();
    bucket_elems_ = 0;
    timers_->reduce += MPI_Wtime() - t0;
}

} // namespace

std::unique_ptr<Stage> make_partitioned(const StageSettings &s) { return std::make_unique<Partitioned>(s); }

} // namespace zero
} // namespace dsm
