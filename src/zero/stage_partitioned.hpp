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
//
// overlap_comm (stage.hpp, comm/pipeline.hpp): a flush hands its pending
// gradients to a task (reduce_pending) and returns; the bucket is the task's
// until its ticket is done (bucket_ticket_), so the next gradients go to
// pool buffers meanwhile. A gather is a task too, and ZeRO-3 also prefetches
// the window of the trace ahead of the acquired parameter (prefetch_ahead).
//
// One data-parallel rank (direct_): the partition is the whole flat layout,
// so a ZeRO-3 acquire reads the parameter partition in place: no gather, no
// copy. Only without sequence parallelism, pre- and post-scaling or another
// communication dtype, without hpZ, and without ZeRO-Offload
// (StageSettings::direct). On the host (direct_grads_) a gradient acquired
// (whole or by a range) whose elements nobody acquired since the partition
// was zeroed gets the partition's own elements, which are zero as a
// buffer must start, and its release moves nothing: the bucket would have
// added the user's buffer into zeros, which is the buffer itself (in fp32
// and in 16 bits alike: one rounding of an exact value; only the sign of a
// zero the user wrote as -0 is kept, as at stages 0/1). Every later
// acquisition of those elements in the window (a second one in the
// micro-step, the next micro-steps of an accumulation) gets a zeroed buffer
// that goes through the buckets: the user's arithmetic starts from zero and
// its result is added into the window's sum once, as with more ranks (an
// fmaf, or several terms per acquisition, into the window's sum would round
// otherwise). On a CUDA device a flush adds its gradients into the
// partition from where they were released, in one multi-tensor launch
// (amp::Math::accumulate_pieces), with the same bits.
//
// hpZ (stage.hpp): the secondary partition is the flat layout split into
// StageSettings::hpz parts (secondary_layout_: the same slots and offsets);
// this rank holds part hpz_->rank() of it, less the persistent region, in
// secondary_ (private memory, allocated once). A primary gather copies this
// rank's slice of each parameter it gathered into secondary_ and marks the
// parameter (secondary_ok_); a gather of marked parameters is one
// single-copy alltoall_direct over the group's backend from the members'
// secondary_ (gather_direct), or where the backend cannot, the same
// allgatherv as a primary gather, from secondary_. publish() clears the
// marks: the copies hold the values before the update.
//
// ZeRO++ qwZ (StageSettings::qwz_block): a gather from the primary
// partitions quantizes each piece it sends into int8 blocks where it would
// have copied it (the pack), moves the bytes with one allgatherv, and
// dequantizes each piece into its parameter where it would have copied it
// (the unpack; with hpZ, a cache-sized part at a time, this rank's secondary
// slice copied out of each part while it is hot); the partitions, the
// master weights and the optimizer never see quantized values. qgZ (StageSettings::qgz_block): each round's
// reduce-scatter is comm::QuantizedReduce, whose fp32 result is added into
// the gradient partition with the same scaling. On a device (CUDA, or the
// simulated one) both run the space's quantization kernels on its queue
// (comm/quantize_space.hpp), qgZ as comm::SpaceQuantizedReduce.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <set>
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

class Partitioned final : public Stage {
public:
    explicit Partitioned(const StageSettings &s) : Stage(s) {}
    ~Partitioned() override { quiet_settle(); }

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
    void acquire_param(int index) override;
    const void *param_values(int index) override;
    void release_param(int index) override {
        if (direct_ || held_whole(index) || reused_soon(index)) return;
        if (arena_ == Arena::PARAM && arena_param_ == index) set_arena(Arena::FREE, -1);
        pool_.give(std::move(gathered_[static_cast<size_t>(index)]));
    }
    const std::vector<size_t> &begin_publish() override;
    void publish_piece(const float *master, size_t k) override;
    void new_micro_step(bool forget) override;

    void *acquire_grad(int index) override {
        const size_t n = layout_->slot_of(index)->numel;
        if (give_direct(index, 0, n)) {
            direct_out_[static_cast<size_t>(index)] = 1;
            return static_cast<char *>(grad_part_.data()) + layout_->slot_of(index)->offset * esize_;
        }
        if (arena_fits(n)) {
            pipe_->wait(bucket_ticket_); // done: only rethrows a task's error
            set_arena(Arena::GRAD, index);
            bucket_holder_ = index;
            space_->zero(bucket_send_.data(), n * esize_);
            return bucket_send_.data();
        }
        Buffer &b = staging_[static_cast<size_t>(index)];
        b = pool_.take(n * esize_, true, memstat::Use::GRADIENTS);
        return b.data();
    }
    void release_grad(int index) override {
        if (direct_out_[static_cast<size_t>(index)]) { // the partition's own elements: in place already
            direct_out_[static_cast<size_t>(index)] = 0;
            return;
        }
        Buffer &b = staging_[static_cast<size_t>(index)];
        // This acquisition's buffer is the bucket only if it was given the
        // bucket: the bucket may still hold an earlier, released copy of the
        // same gradient (pending) while this one is a pool buffer.
        // Several gradients may be out at once (the PyTorch bridge acquires a
        // block's before its backward): only the holder's release frees it.
        const bool in_bucket = bucket_holder_ == index;
        if (in_bucket) bucket_holder_ = -1;
        bucket_elems_ += layout_->slot_of(index)->numel;
        char *data = static_cast<char *>(in_bucket ? bucket_send_.data() : b.data());
        pending_.push_back(Pending{index, std::move(b), data, in_bucket, 0, layout_->slot_of(index)->numel});
        if (bucket_elems_ >= bucket_cap_) flush(false);
    }
    void acquire_param_range(int index, size_t offset, size_t count) override;
    const void *param_range_values(int index, size_t offset, size_t count) override;
    void release_param_range(int index, size_t offset, size_t count) override {
        if (direct_) return;
        auto it = range_params_.find(RangeKey{index, offset, count});
        if (it == range_params_.end()) return; // a pointer into a parameter held whole
        pool_.give(std::move(it->second));
        range_params_.erase(it);
    }
    void *acquire_grad_range(int index, size_t offset, size_t count) override {
        if (give_direct(index, offset, count)) {
            direct_ranges_.emplace(index, offset, count);
            return static_cast<char *>(grad_part_.data()) + (layout_->slot_of(index)->offset + offset) * esize_;
        }
        Buffer &b = range_grads_[RangeKey{index, offset, count}];
        b = pool_.take(count * esize_, true, memstat::Use::GRADIENTS);
        return b.data();
    }
    void release_grad_range(int index, size_t offset, size_t count) override {
        if (direct_ranges_.erase(RangeKey{index, offset, count}) > 0) return; // the partition's own elements
        auto it = range_grads_.find(RangeKey{index, offset, count});
        DSM_REQUIRE(it != range_grads_.end(), DSM_ERR_INTERNAL, "no gradient range of parameter ", index, " at ",
                    offset, "+", count);
        Buffer b = std::move(it->second);
        range_grads_.erase(it);
        char *data = static_cast<char *>(b.data());
        bucket_elems_ += count;
        pending_.push_back(Pending{index, std::move(b), data, false, offset, count});
        if (bucket_elems_ >= bucket_cap_) flush(false);
    }
    void reduce(bool) override { flush(true); }
    const void *grad_partition() const override { return grad_part_.data(); }
    void zero_grads() override {
        space_->zero(grad_part_.data(), layout_->part_size() * esize_);
        for (auto &t : touched_) t.clear();
    }
    // Nothing to zero: the stage holds its partition alone, which the fused
    // step zeroed (all of it: every element it holds is a parameter's).
    void zero_grads_outside_partition() override {
        for (auto &t : touched_) t.clear();
    }

    StageMemory memory() const override;
    QuantStats quant_bytes() const override { return QuantStats{qwz_bytes_, qgz_bytes_}; }

private:
    bool held_whole(int index) const { return persistent(layout_->slot_of(index)->numel); }
    bool gathered(int index) const {
        return gathered_[static_cast<size_t>(index)] || (arena_ == Arena::PARAM && arena_param_ == index);
    }
    // Whether `n` compute elements may use the bucket now (no task uses it).
    bool arena_fits(size_t n) const {
        return arena_ == Arena::FREE && s_.comm_dtype == s_.dtype && n > 0 && n <= bucket_cap_ &&
               pipe_->done(bucket_ticket_);
    }
    // Stop before the reduction of the released gradients (the bucket; then,
    // with `settle`, wait for every reduction in flight).
    void flush(bool settle);
    void reduce_bucket(const PointDetail &bucket);
    struct Pending;
    void reduce_pending(std::vector<Pending> &pending, int resident, bool user_holds);
    void gather(const std::vector<int> &list);
    // Where one gather reads from: the partitions of `layout` over `group`,
    // this rank's part `part`, held at `base` from flat element `begin`.
    struct Source {
        const Layout *layout;
        comm::Backend *group;
        const char *base;
        size_t begin;
        int part;
        bool keep; // a primary gather that fills the secondary partition
    };
    Source primary() const {
        return Source{layout_, dp_, static_cast<const char *>(param_part_.data()), layout_->part_begin(part_), part_,
                      hpz_on()};
    }
    Source secondary() const {
        return Source{&secondary_layout_, hpz_, static_cast<const char *>(secondary_.data()), secondary_begin_,
                      hpz_->rank(), false};
    }
    comm::Pipeline::Ticket gather_from(const std::vector<int> &list, const Source &src);
    // qwZ: one gather of `list` into `dst` (one buffer per parameter) over
    // src's group, the pieces quantized on the way.
    void gather_quantized(const std::vector<int> &list, const Source &src, const std::vector<char *> &dst);
    // The same on a device space: its kernels on its queue (qkernels_).
    void gather_quantized_space(const std::vector<int> &list, const Source &src, const std::vector<char *> &dst);
    // What the two have in common: the plan of pieces and the bytes of each
    // part, this rank's pieces packed by `quantize(from, count, to)`, and the
    // bytes counted once the gather is done.
    struct QwzGather;
    QwzGather plan_quantized(const std::vector<int> &list, const Source &src) const;
    template <class Quantize>
    void pack_quantized(const QwzGather &g, const Source &src, char *w, Quantize quantize) const;
    void count_quantized(const QwzGather &g, const Source &src);
    // hpZ: a gather from the secondary partitions as one single-copy
    // alltoall_direct; false (on every member, nothing moved) where the
    // group's backend cannot.
    bool gather_direct(const std::vector<int> &list, const Source &src, const std::vector<char *> &dst);
    bool qwz_on() const noexcept { return s_.stage == 3 && s_.qwz_block > 0 && !exact_; }
    // hpZ: this rank's slice of parameter `j` from its whole values.
    void keep_secondary(int j, const char *whole);
    bool hpz_on() const noexcept { return s_.stage == 3 && s_.hpz > 1 && hpz_ != nullptr; }
    // acquire_param() after the gather of `index` (at `at` in the trace).
    void after_gather(int index, size_t at);
    void prefetch_ahead(size_t p, int index);
    bool reused_soon(int index) const;
    size_t live_elems() const;
    size_t numel_of(int j) const { return layout_->slot_of(j)->numel; }
    void wait_published(size_t end);
    void quiet_settle() noexcept {
        try {
            pipe_->wait_all();
        } catch (...) {
        }
    }

    // qwZ/qgZ: the quantized reduction and the bytes moved quantized.
    std::unique_ptr<comm::QuantizedReduce> qgz_;
    std::unique_ptr<comm::SpaceQuantizedReduce> qgz_space_; // qgZ on a device space
    std::unique_ptr<comm::quant::SpaceKernels> qkernels_;   // qwZ on a device space: its kernels
    comm::QuantBytes qwz_bytes_, qgz_bytes_;

    SharedBuffer param_flat_;  // stage 2: T; stage 3: the persistent region
    SharedBuffer param_part_;  // stage 3: P
    SharedBuffer bucket_send_; // one round, packed by owner; reduced in place
    Buffer grad_part_;         // P
    // hpZ: the secondary layout, this rank's slice of it (flat elements from
    // secondary_begin_), and per parameter whether the slice holds it now.
    Layout secondary_layout_;
    Buffer secondary_;
    size_t secondary_begin_ = 0;
    std::vector<char> secondary_ok_;
    // What the bucket holds between flushes: nothing, the gradient of
    // arena_param_ (acquired, or released and pending), or its gathered values.
    enum class Arena { FREE, GRAD, PARAM };
    Arena arena_ = Arena::FREE;
    int arena_param_ = -1;
    // The parameter whose gradient acquisition holds the bucket now (acquired,
    // not yet released), or -1.
    int bucket_holder_ = -1;
    // Moves the bucket between its uses; a parameter gathered or a gradient
    // acquired into it counts as such (core/memstat.hpp) while it is there.
    void set_arena(Arena a, int param) noexcept {
        const auto use = [](Arena x) { return x == Arena::PARAM ? memstat::Use::GATHERED : memstat::Use::GRADIENTS; };
        if (arena_ != Arena::FREE && arena_param_ >= 0) memstat::use_sub(use(arena_), numel_of(arena_param_) * esize_);
        arena_ = a;
        arena_param_ = param;
        if (arena_ != Arena::FREE && param >= 0) memstat::use_add(use(arena_), numel_of(param) * esize_);
    }
    size_t bucket_cap_ = 0;    // elements per reduction round
    size_t persist_end_ = 0;   // stage 3: flat elements [0, persist_end_) are held whole
    bool direct_ = false;      // one data-parallel rank: ZeRO-3 reads the partition in place (above)
    // direct_ on the host: a gradient's elements untouched in the window go
    // out as the partition's own (above).
    bool direct_grads_ = false;
    // Per parameter: the element ranges [offset, offset + count) whose
    // gradient was acquired since the partition was zeroed (by either path).
    std::vector<std::vector<std::pair<size_t, size_t>>> touched_;
    // The gradients out now as the partition's own elements: whole, ranges.
    std::vector<char> direct_out_;
    std::set<std::tuple<int, size_t, size_t>> direct_ranges_;
    // Whether elements [offset, offset + count) of parameter `index` may go
    // out as the partition's own: direct_grads_, and untouched since the
    // zeroing (so zero). Records them as touched either way.
    bool give_direct(int index, size_t offset, size_t count) {
        auto &t = touched_[static_cast<size_t>(index)];
        bool untouched = true;
        for (const auto &r : t)
            if (offset < r.first + r.second && r.first < offset + count) untouched = false;
        t.emplace_back(offset, count);
        return direct_grads_ && untouched;
    }

    // Per parameter index: the gathered copy (stage 3, while acquired or
    // prefetched) and the gradient buffer while acquired.
    std::vector<Buffer> gathered_, staging_;
    // Gradients released since the last flush, in release order: a whole
    // parameter's (offset 0, count numel) or a range's.
    struct Pending {
        int param;
        Buffer grad; // empty when the gradient is in the bucket
        char *data;
        bool in_bucket;
        size_t offset, count;
    };
    // The acquired ranges (parameter, offset, count): gathered values
    // (ZeRO-3, partitioned parameters) and gradient buffers.
    using RangeKey = std::tuple<int, size_t, size_t>;
    std::map<RangeKey, Buffer> range_params_, range_grads_;
    comm::Pipeline::Ticket range_ticket_ = 0; // the gather of the range being acquired
    std::vector<Pending> pending_;
    size_t bucket_elems_ = 0;
    BufferPool pool_;

    // Stage 3 prefetch: the order of gathered acquisitions in the last micro-step.
    std::vector<int> trace_, last_trace_;
    size_t trace_pos_ = 0;

    // overlap_comm: the last task that uses the bucket, the task that gathers
    // each parameter, and the slices of publish()'s allgather (end element,
    // task) not yet waited for.
    comm::Pipeline::Ticket bucket_ticket_ = 0;
    std::deque<comm::Pipeline::Ticket> flushes_; // the reductions that may still run
    size_t flush_index_ = 0;                     // the next bucket's index in this micro-step (messages)
    std::vector<comm::Pipeline::Ticket> gather_ticket_;
    std::vector<std::pair<size_t, comm::Pipeline::Ticket>> published_;
};

} // namespace zero
} // namespace dsm
