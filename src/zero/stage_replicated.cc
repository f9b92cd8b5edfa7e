// ZeRO stages 0 and 1: every rank holds the whole parameters and gradients
// (shared buffers of the data-parallel backend). At the accumulation
// boundary the flat gradient is reduced in regions of reduce_bucket_size
// elements: an allreduce (stage 0, where the optimizer state is whole too)
// or a reduce-scatter to the owner of each partition (stage 1), whose
// optimizer updates it; publish() then allgathers the partitions (stage 1).
// With overlap_comm that allgather goes in slices of allgather_bucket_size
// elements through the pipeline (stage.hpp), and acquire_param() waits for
// the slice it reads. And in the micro-step that ends at the boundary, a
// region of reduce_bucket_size elements starts its reduction as soon as the
// last gradient in it is released (DeepSpeed reduces stages 0/1 in buckets
// during the backward with overlap_comm too); reduce() does the regions no
// release completed. A gradient acquired again after its region started is
// an error (DSM_ERR_STATE): the reduction cannot take it in.

#include "core/error.hpp"
#include "core/watchdog.hpp"
#include "mpi.h"
#include "zero/plan.hpp"
#include "zero/stage.hpp"

namespace dsm {
namespace zero {

namespace {

class Replicated final : public Stage {
public:
    explicit Replicated(const StageSettings &s) : Stage(s) {}
    ~Replicated() override { quiet_settle(); }

    int parts(int dp) const override { return s_.stage == 0 ? 1 : dp; }
    bool persistent(size_t) const override { return true; }
    double formula(double pw, double K, double dp) const override {
        return s_.stage == 0 ? pw + pw + K : pw + pw + K / dp;
    }

    void allocate() override {
        const size_t T = layout_->total();
        param_flat_ = SharedBuffer(dp_, *space_, T * esize_);
        grad_flat_ = SharedBuffer(dp_, *space_, T * esize_);
        if (s_.comm_dtype != s_.dtype) {
            const size_t cap = std::min<size_t>(static_cast<size_t>(std::max<int64_t>(s_.reduce_bucket_size, 1)), T);
            comm_scratch_ = Buffer(*space_, cap * csize_);
        }
    }
    void free() noexcept override {
        quiet_settle();
        regions_.clear();
        published_.clear();
        grad_flat_.reset();
        param_flat_.reset();
        comm_scratch_ = Buffer();
    }

    void *param_partition() override {
        return static_cast<char *>(param_flat_.data()) + layout_->part_begin(part_) * esize_;
    }
    void *whole_params(size_t *bytes) override {
        *bytes = param_flat_.bytes();
        return param_flat_.data();
    }
    void acquire_param(int) override {} // held whole: no collective
    const void *param_values(int index) override {
        const Slot *s = layout_->slot_of(index);
        for (const auto &sl : published_)
            if (sl.first >= s->offset + s->numel) {
                pipe_->wait(sl.second);
                break;
            }
        return static_cast<const char *>(param_flat_.data()) + s->offset * esize_;
    }
    void release_param(int) override {}
    // Stage 1 with overlap_comm: one piece per slice of allgather_bucket_size
    // elements, each slice's allgather leaving as soon as this rank's share
    // of it is up to date (the update of the next share overlaps it); else
    // one piece (and at stage 1 one allgather).
    const std::vector<size_t> &begin_publish() override {
        pipe_->wait_all();
        published_.clear();
        return plan_publish(sliced(), layout_->total());
    }
    void publish_piece(const float *master, size_t k) override {
        convert_upto(master, ends_[k]);
        if (!sliced()) {
            if (s_.stage == 1) dp_->allgather(param_partition(), param_flat_.data(), layout_->part_size(), s_.dtype, queue());
            return;
        }
        if (k >= slices_.size()) return;
        char *flat = static_cast<char *>(param_flat_.data());
        const size_t a = slices_[k].first, b = slices_[k].second;
        published_.emplace_back(b, pipe_->submit([this, a, b, flat] {
            const double t0 = MPI_Wtime();
            const std::vector<size_t> counts = layout_->counts(a, b);
            size_t mine = 0;
            for (int q = 0; q < part_; ++q) mine += counts[static_cast<size_t>(q)];
            const watchdog::Context ctx("parameter allgather after the update", "from element",
                                        static_cast<int64_t>(a));
            dp_->allgatherv(flat + (a + mine) * esize_, flat + a * esize_, counts, s_.dtype, queue());
            timers_->gather += MPI_Wtime() - t0;
        }));
    }
    void new_micro_step(bool forget) override {
        if (forget) { // a load: the boundary micro-step under way starts over
            quiet_settle();
            regions_.clear();
        }
    }

    void *acquire_grad(int index) override {
        const Slot *s = layout_->slot_of(index);
        check_not_started(index, s->offset, s->offset + s->numel);
        return static_cast<char *>(grad_flat_.data()) + s->offset * esize_;
    }
    // Ranges: pointers into the whole buffers. A range's release starts no
    // region early (a region waits for whole releases): what ranges wrote is
    // reduced at dsm_step with the regions their parameters lie in.
    void acquire_param_range(int, size_t, size_t) override {}
    const void *param_range_values(int index, size_t offset, size_t) override {
        return static_cast<const char *>(param_values(index)) + offset * esize_;
    }
    void release_param_range(int, size_t, size_t) override {}
    void *acquire_grad_range(int index, size_t offset, size_t count) override {
        const Slot *s = layout_->slot_of(index);
        check_not_started(index, s->offset + offset, s->offset + offset + count);
        return static_cast<char *>(grad_flat_.data()) + (s->offset + offset) * esize_;
    }
    void release_grad_range(int, size_t, size_t) override {}
    void release_grad(int index) override {
        if (!early()) return;
        prepare_regions();
        if (released_[static_cast<size_t>(index)]) return;
        released_[static_cast<size_t>(index)] = 1;
        const Slot *s = layout_->slot_of(index);
        std::vector<size_t> complete; // the regions this release completes
        for (size_t k = region_of(s->offset); k < regions_.size() && regions_[k].first < s->offset + s->numel; ++k) {
            const size_t a = std::max(regions_[k].first, s->offset),
                         b = std::min(regions_[k].second, s->offset + s->numel);
            left_[k] -= b - a;
            if (left_[k] == 0) complete.push_back(k);
        }
        start_regions(complete, 0, false);
    }
    void reduce(bool boundary) override {
        pipe_->wait_all(); // the allgather after the last step reads the partition the optimizer writes next
        if (!boundary) return;
        if (early()) {
            prepare_regions();
            std::vector<size_t> rest;
            for (size_t k = 0; k < regions_.size(); ++k)
                if (!started_[k]) rest.push_back(k);
            start_regions(rest, 0, true);
            return;
        }
        const double t0 = MPI_Wtime();
        for (const auto &r : flat_regions(layout_->total(), s_.reduce_bucket_size)) reduce_region(r.first, r.second);
        timers_->reduce += MPI_Wtime() - t0;
    }
    const void *grad_partition() const override {
        return static_cast<const char *>(grad_flat_.data()) + layout_->part_begin(part_) * esize_;
    }
    void zero_grads() override { space_->zero(grad_flat_.data(), layout_->total() * esize_); }
    void zero_grads_outside_partition() override {
        char *g = static_cast<char *>(grad_flat_.data());
        const size_t a = layout_->part_begin(part_), b = a + layout_->part_size();
        space_->zero(g, a * esize_);
        space_->zero(g + b * esize_, (layout_->total() - b) * esize_);
    }

    StageMemory memory() const override {
        StageMemory m;
        m.params = param_flat_.bytes();
        m.grads = grad_flat_.bytes();
        m.buckets = comm_scratch_.bytes();
        return m;
    }

private:
    // Reduce grad_flat_[begin, end) over the groups: sum over SP, then over
    // DP an allreduce (stage 0) or a reduce-scatter to the owners (stage 1),
    // with DeepSpeed's pre- and post-scaling, in the communication dtype.
    void reduce_region(size_t begin, size_t end) {
        const size_t n = end - begin;
        char *g = static_cast<char *>(grad_flat_.data()) + begin * esize_;
        const dsm_dtype_t cd = s_.comm_dtype;
        void *buf = g;
        if (cd != s_.dtype) {
            buf = comm_scratch_.data();
            math_->convert(g, s_.dtype, buf, cd, n);
        }
        if (s_.pre != 1.0) math_->scale(buf, cd, n, s_.pre);
        const watchdog::Context ctx(s_.stage == 0 ? "gradient allreduce" : "gradient reduce-scatter", "from element",
                                    static_cast<int64_t>(begin));
        if (sp_) sp_->allreduce(buf, buf, n, cd, comm::Op::SUM, queue());
        if (s_.stage == 0) {
            dp_->allreduce(buf, buf, n, cd, comm::Op::SUM, queue());
            if (s_.post != 1.0) math_->scale(buf, cd, n, s_.post);
            if (buf != g) math_->convert(buf, cd, g, s_.dtype, n);
            return;
        }
        const std::vector<size_t> counts = layout_->counts(begin, end);
        size_t mine = 0;
        for (int r = 0; r < part_; ++r) mine += counts[static_cast<size_t>(r)];
        char *recv = static_cast<char *>(buf) + mine * csize_;
        const size_t my_count = counts[static_cast<size_t>(part_)];
        dp_->reduce_scatterv(buf, recv, counts, cd, comm::Op::SUM, queue());
        if (s_.post != 1.0) math_->scale(recv, cd, my_count, s_.post);
        if (buf != g) math_->convert(recv, cd, g + mine * esize_, s_.dtype, my_count);
    }

    // overlap_comm: flat elements [a, b) of parameter `index` may not be
    // written once their region's reduction started.
    void check_not_started(int index, size_t a, size_t b) {
        if (!early()) return;
        prepare_regions();
        for (size_t k = region_of(a); k < regions_.size() && regions_[k].first < b; ++k)
            DSM_REQUIRE(!started_[k], DSM_ERR_STATE, "the gradient of parameter ", index,
                        " is acquired again after its bucket's reduction started (overlap_comm at ZeRO stage ",
                        s_.stage, " reduces a bucket when its last gradient is released; release each gradient "
                        "once per boundary micro-step, or set overlap_comm false)");
    }

    // Whether publish() goes in slices (stage 1 with overlap_comm).
    bool sliced() const noexcept { return s_.stage == 1 && pipe_->mode() != comm::Pipeline::Mode::INLINE; }
    // overlap_comm's reductions during the boundary micro-step's backward.
    bool early() const noexcept { return boundary_ && pipe_->mode() != comm::Pipeline::Mode::INLINE; }
    // The regions and the elements of released gradients each still waits
    // for, at the first acquisition or release of the boundary micro-step.
    void prepare_regions() {
        if (!regions_.empty()) return;
        regions_ = flat_regions(layout_->total(), s_.reduce_bucket_size);
        left_.assign(regions_.size(), 0);
        started_.assign(regions_.size(), 0);
        int max_param = -1;
        for (const auto &s : layout_->slots()) {
            max_param = std::max(max_param, s.param);
            for (size_t k = region_of(s.offset); k < regions_.size() && regions_[k].first < s.offset + s.numel; ++k)
                left_[k] += std::min(regions_[k].second, s.offset + s.numel) - std::max(regions_[k].first, s.offset);
        }
        released_.assign(static_cast<size_t>(max_param + 1), 0);
    }
    size_t region_of(size_t offset) const {
        const size_t bucket = regions_.empty() ? 1 : regions_.front().second - regions_.front().first;
        return offset / std::max<size_t>(bucket, 1);
    }
    // The reductions of the regions ks[i], ks[i + 1], ..., each submitted
    // once the ranks agreed that they are all at it (every rank is at the
    // same release): stop before the first; its proceed() submits it and
    // stops before the next. Then, with `settle`, wait for all of them.
    void start_regions(const std::vector<size_t> &ks, size_t i, bool settle) {
        if (i == ks.size()) {
            if (settle) {
                pipe_->wait_all();
                regions_.clear();
            }
            return;
        }
        const size_t k = ks[i];
        started_[k] = 1;
        PointDetail region("bucket index", static_cast<int64_t>(k));
        region.bucket = static_cast<int64_t>(k);
        stop_before(std::move(region), [this, ks, i, settle](const PointDetail &) {
            const size_t a = regions_[ks[i]].first, b = regions_[ks[i]].second;
            pipe_->submit([this, a, b] {
                const double t0 = MPI_Wtime();
                reduce_region(a, b);
                timers_->reduce += MPI_Wtime() - t0;
            });
            start_regions(ks, i + 1, settle);
        });
    }

    void quiet_settle() noexcept {
        try {
            pipe_->wait_all();
        } catch (...) {
        }
    }

    SharedBuffer param_flat_; // T
    SharedBuffer grad_flat_;  // T
    Buffer comm_scratch_;     // reductions in another dtype
    // overlap_comm: the slices of publish()'s allgather (end element, task).
    std::vector<std::pair<size_t, comm::Pipeline::Ticket>> published_;
    // overlap_comm, the boundary micro-step: the regions (empty between
    // boundaries), the elements each waits for, whether it started, and the
    // parameters whose gradient was released.
    std::vector<std::pair<size_t, size_t>> regions_;
    std::vector<size_t> left_;
    std::vector<char> started_, released_;
};

} // namespace

std::unique_ptr<Stage> make_replicated(const StageSettings &s) { return std::make_unique<Replicated>(s); }

} // namespace zero
} // namespace dsm
