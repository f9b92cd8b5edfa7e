// The ZeRO stages as objects. A Stage owns the compute-dtype parameters and
// gradients of the flat layout on this rank and the collectives that move
// them over the data-parallel group (after a sum over the sequence-parallel
// group); the engine orchestrates and holds no stage branches.
//
//                     parameters        gradients          reduction
//   Replicated (0/1)  T, shared         T, shared          flat regions: allreduce (0, one part)
//                                                          or reduce-scatter to the owners (1)
//   Partitioned (2)   T, shared         P + bucket         buckets of released gradients,
//   Partitioned (3)   P (+ persistent   P + bucket         reduce-scattered to the owners
//                     region whole),                       as they are released
//                     gathered on use
//
// ZeRO++ hpZ (StageSettings::hpz > 1, stage 3): a secondary copy of every
// gathered parameter, partitioned over a group of hpz consecutive
// data-parallel ranks (the ranks of a node): the first gather of a parameter
// after publish() reads the primary partitions (the whole data-parallel
// group) and keeps this rank's slice of the group's secondary partition;
// the later gathers until the next publish() (or the accumulation boundary)
// read the secondary partitions over the group only (bind_hpz()). The
// gathered values are the same bits either way.
//
// T = the flat layout's total, P = one partition. The planning (which
// elements go into which round, which parameters a gather prefetches) is in
// plan.hpp, free of MPI.
//
// The buffers live in a memory space (device/space.hpp) and every copy,
// conversion (amp/math.hpp) and collective is ordered on its queue: the same code serves
// the host engine and the device-resident one.
//
// overlap_comm (StageSettings::overlap): the collectives go through a
// comm::Pipeline, in the order the blocking path makes them. A full bucket's
// reduction is submitted and release_grad() returns (at most one more
// waits behind the running one); ZeRO-3 prefetches along the recorded
// trace, beyond the parameter being acquired, while the caller computes;
// publish() submits the allgather of the updated parameters in slices of
// allgather_bucket_size (stages 1 and 2) and acquire_param() waits for the
// slice it needs only. Every wait is where the data is needed: acquire_param
// (its gather or slice), acquire_grad (stages 0/1: the flat gradients),
// reduce() (everything: the step reads the gradients), new_micro_step()
// (prefetches write gathered buffers), settle() (checkpoints, free).
//
// The protocol with the engine goes one way: the engine calls the stage,
// the stage never calls the engine (Stage below says how, in the order the
// engine makes the calls).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "amp/math.hpp"
#include "comm/backend.hpp"
#include "comm/pipeline.hpp"
#include "comm/qgz.hpp"
#include "core/agree.hpp"
#include "dsm.h"
#include "zero/buffers.hpp"
#include "zero/layout.hpp"

namespace dsm {
namespace zero {

// What one micro-step's reductions and update cost (wall_clock_breakdown).
// wait: dsm_step's agreements of the ranks (the opening one and the one
// before the last bucket's reduction), where a rank that came early (its
// releases' reductions ended first) waits for the others.
struct Timers {
    double reduce = 0, optimizer = 0, gather = 0, wait = 0;
};

struct StageSettings {
    int stage = 0;
    dsm_dtype_t dtype = DSM_FLOAT32;       // compute dtype
    dsm_dtype_t comm_dtype = DSM_FLOAT32;  // reduction dtype
    double pre = 1.0, post = 1.0;          // gradient scaling before and after the DP sum
    int64_t reduce_bucket_size = 1;
    int64_t prefetch_bucket_size = 0;
    int64_t persistence_threshold = 0;     // ZeRO-3: parameters up to this many elements stay whole
    // ZeRO-3, DeepSpeed's stage3_max_live_parameters: prefetch no further
    // than this many elements gathered at once; stage3_max_reuse_distance: a
    // released parameter the trace uses again within this many elements
    // stays gathered.
    int64_t max_live_parameters = 1000000000;
    int64_t max_reuse_distance = 1000000000;
    // Stages 1/2 with overlap: elements per slice of the allgather after the step.
    int64_t allgather_bucket_size = 500000000;
    // overlap_comm: how the collectives run (comm/pipeline.hpp); INLINE: off.
    comm::Pipeline::Mode overlap = comm::Pipeline::Mode::INLINE;
    // ZeRO-3, zero_hpz_partition_size: ranks per secondary partition group
    // (1: none). The group's backend comes with bind_hpz().
    int hpz = 1;
    // ZeRO++ qwZ (stage 3, zero_quantized_weights): the gathers from the
    // primary partitions travel as int8 blocks of this many values,
    // dequantized into the compute dtype (0: off). With hpZ the gathers
    // from the secondary partitions stay at full precision; the secondary
    // partition holds the values the first gather brought (so the backward
    // computes with the forward's weights).
    size_t qwz_block = 0;
    // ZeRO++ qgZ (stages 2 and 3, zero_quantized_gradients): the gradient
    // reduce-scatter is comm::QuantizedReduce over int4 blocks of this many
    // values, reduced in fp32 (0: off). Needs bind_nodes().
    size_t qgz_block = 0;
    // Whether ZeRO-3 on one data-parallel rank may read the parameter
    // partition in place (false with ZeRO-Offload).
    bool direct = true;
};

// Bytes of the quantized exchanges (comm::QuantBytes): the gathers (qwZ)
// and the gradient reductions (qgZ), since the stage was allocated.
struct QuantStats {
    comm::QuantBytes gather, reduce;
};

// The memory a stage holds, by kind (Engine::describe()).
struct StageMemory {
    size_t params = 0, grads = 0, buckets = 0, live = 0, idle = 0;
    size_t secondary = 0; // hpZ: this rank's slice of the secondary partition
};

// The engine and the stage, top-down (one direction: the engine calls, the
// stage answers; it keeps no pointer to the engine and takes no callback):
//
// 1. Collective points. Before each of the stage's collectives the ranks
//    must agree that they are all there, on the same parameter, range or
//    bucket (core/agree.hpp), so that a rank that diverged fails every rank
//    instead of hanging them. A call that may make collectives
//    (acquire_param, acquire_param_range, release_grad, release_grad_range,
//    reduce) does its local work and stops before its first collective;
//    next_collective() then describes that point. The engine runs the
//    agreement and calls proceed(), which makes the collective and stops
//    before the next one, if any (a ZeRO-3 gather and then its prefetch;
//    several buckets of one release). When next_collective() is null the
//    call is complete; the acquisitions then read their values:
//
//      stage.acquire_param(i);
//      while (const PointDetail *at = stage.next_collective()) {
//          agree(*at);         // the engine's agreement of the ranks
//          stage.proceed();    // the gather
//      }
//      const void *values = stage.param_values(i);
//
//    If the agreement fails, cancel() drops the point: nothing was sent.
//
// 2. The update. The engine owns the master weights and the optimizer; the
//    stage owns the compute-dtype parameters and their gathers. The stage
//    gives the pieces of its partition (begin_publish()); the engine brings
//    each piece's master weights up to date and hands it to publish_piece(),
//    which converts it and sends what is complete (below).
class Stage {
public:
    // The stage of `s.stage` (0..3).
    static std::unique_ptr<Stage> create(const StageSettings &s);
    virtual ~Stage() = default;

    int number() const noexcept { return s_.stage; }
    // The number of partitions of the layout over `dp` data-parallel ranks.
    virtual int parts(int dp) const = 0;
    // Whether a parameter of `numel` elements is held whole on every rank.
    virtual bool persistent(size_t numel) const = 0;
    // The ZeRO paper's bytes per parameter: `pw` parameter/gradient bytes,
    // `K` optimizer bytes (master and moments), `dp` ranks.
    virtual double formula(double pw, double K, double dp) const = 0;

    // Before allocate(): the layout (persistent slots first), this rank's
    // partition, the backends (sp may be null), the space the stage's
    // buffers live in (collectives take its queue) and its math, and the
    // timers to add to.
    void bind(const Layout *layout, int part, comm::Backend *dp, comm::Backend *sp, device::Space *space,
              amp::Math *math, Timers *timers);
    // hpZ (StageSettings::hpz > 1), before allocate(): the backend of this
    // rank's secondary partition group (hpz consecutive data-parallel ranks;
    // group rank = data-parallel rank % hpz). Stages that do not partition
    // parameters ignore it.
    void bind_hpz(comm::Backend *group) noexcept { hpz_ = group; }
    // qwZ/qgZ, before allocate(): the node of each data-parallel rank (the
    // same on every rank), so that the exchanges know what crosses nodes.
    void bind_nodes(std::vector<int> nodes) { nodes_ = std::move(nodes); }
    virtual QuantStats quant_bytes() const { return QuantStats{}; }
    // qwZ: while on, the gathers this rank starts are at full precision (a
    // read of the values, dsm_engine_param_read_f32, rather than a forward).
    void set_exact_gathers(bool on) noexcept { exact_ = on; }
    // Collective over the data-parallel group: shared allocations in the
    // same order on every rank, then private ones.
    virtual void allocate() = 0;
    // Collective: free the shared buffers (reverse order); private ones too.
    virtual void free() noexcept = 0;

    // This rank's partition of the compute-dtype parameters (P elements).
    virtual void *param_partition() = 0;
    // The parameters held whole (for page-locking): pointer and bytes.
    virtual void *whole_params(size_t *bytes) = 0;
    // A trainable parameter's whole values: acquire_param() (it stops before
    // the gather, and with overlap_comm before the prefetch after it, where
    // the parameter is not held), then param_values() (the values, once its
    // gather is done).
    virtual void acquire_param(int index) = 0;
    virtual const void *param_values(int index) = 0;
    virtual void release_param(int index) = 0;
    // After the optimizer (or a load) wrote `master` (fp32, P elements):
    // convert it into the partition and gather what the stage holds whole.
    // The engine drives it in pieces, so that it can run the optimizer's
    // update piece by piece in between (a piecewise optimizer):
    //
    //   const std::vector<size_t> &ends = stage.begin_publish();
    //   for (size_t k = 0; k < ends.size(); ++k) {
    //       // the optimizer brings master's elements [0, ends[k]) up to date
    //       stage.publish_piece(master, k);
    //   }
    //
    // begin_publish() waits for the collectives in flight that read the
    // partition and returns the ends of the pieces (partition elements,
    // non-decreasing, the last one P). publish_piece() converts master's
    // elements up to ends[k] into the compute dtype (unless
    // set_update_writes_params) and starts the allgather of what is complete:
    // with overlap_comm at stages 1 to 3 one slice of allgather_bucket_size
    // elements per piece (the last piece sends nothing), so that the update
    // of one piece overlaps the gather of the one before; else one piece and
    // one allgather. The values are those of one whole update followed by
    // the publish. Collective.
    virtual const std::vector<size_t> &begin_publish() = 0;
    virtual void publish_piece(const float *master, size_t k) = 0;
    // Every piece, with `master` already up to date (a whole update, a load).
    void publish(const float *master) {
        const size_t n = begin_publish().size();
        for (size_t k = 0; k < n; ++k) publish_piece(master, k);
    }
    // A new micro-step: prefetched parameters nobody acquired are dropped
    // (`forget`: the traces of acquisitions too, after a load).
    virtual void new_micro_step(bool forget) = 0;

    // The buffer to add a trainable parameter's gradient into (zeroed at
    // the start), and its release (it stops before a reduction when it
    // fills a bucket).
    virtual void *acquire_grad(int index) = 0;
    virtual void release_grad(int index) = 0;
    // At dsm_step: reduce what is still to be reduced (`boundary`: the
    // gradients are read next). Collective; it stops before each bucket's
    // reduction.
    virtual void reduce(bool boundary) = 0;
    // This rank's partition of the reduced gradients (compute dtype, P).
    virtual const void *grad_partition() const = 0;
    virtual void zero_grads() = 0;
    // The gradients less this rank's partition, which the fused host step
    // zeroed item by item (optim::Fused): nothing where the stage holds the
    // partition alone (stages 2/3), the other ranks' parts at stages 0/1.
    virtual void zero_grads_outside_partition() = 0;
    // A publish whose update writes the partition's compute-dtype
    // parameters itself (the fused host step): publish_piece() converts nothing.
    void set_update_writes_params(bool on) noexcept { update_writes_ = on; }

    // Element ranges [offset, offset + count) of a trainable parameter
    // (dsm_engine_param_acquire_range and the others; the engine checked the
    // range, and releases each acquired range once with the same offset and
    // count). The values of a parameter held whole are a pointer into it
    // (local); a partitioned one's range is gathered alone (ZeRO-3:
    // acquire_param_range() stops before the gather, at a point that names
    // the range), into a buffer of `count` elements that its release gives
    // back; param_range_values() reads it once gathered. A gradient
    // range is a pointer into the whole gradient (stages 0/1, reduced at
    // dsm_step) or a zeroed buffer of `count` elements (stages 2/3) that the
    // release puts into the bucket as a released gradient, so that a stacked
    // tensor is reduced slice by slice.
    virtual void acquire_param_range(int index, size_t offset, size_t count) = 0;
    virtual const void *param_range_values(int index, size_t offset, size_t count) = 0;
    virtual void release_param_range(int index, size_t offset, size_t count) = 0;
    virtual void *acquire_grad_range(int index, size_t offset, size_t count) = 0;
    virtual void release_grad_range(int index, size_t offset, size_t count) = 0;

    // The collective point the last call stopped before (what the ranks
    // must agree on there), or null: the call is complete.
    const PointDetail *next_collective() const noexcept { return point_ ? &point_->detail : nullptr; }
    // The ranks agreed: make that collective, and stop before the next one.
    void proceed();
    // The agreement failed: drop the point; its collective is not made.
    void cancel() noexcept { point_.reset(); }

    virtual StageMemory memory() const = 0;

    // Wait for every collective in flight (overlap_comm) and rethrow its
    // error: before a checkpoint, a load, the optimizer reading the
    // partitions, and free().
    void settle() { pipe_->wait_all(); }
    // Whether the micro-step under way ends at the accumulation boundary
    // (the engine says so before each gradient acquisition and release):
    // stages 0/1 with overlap_comm reduce during its backward only.
    void set_boundary(bool boundary) noexcept { boundary_ = boundary; }
    // Before allocate(): how the collectives run (StageSettings::overlap).
    void set_overlap(comm::Pipeline::Mode mode) { pipe_ = std::make_unique<comm::Pipeline>(mode); }
    comm::Pipeline::Mode overlap() const noexcept { return pipe_->mode(); }

protected:
    explicit Stage(const StageSettings &s);
    size_t esize() const noexcept { return esize_; }
    // Stop before a collective at the point `detail`; proceed() runs `then`
    // (which makes it and may stop before the next one).
    using Then = std::function<void(const PointDetail &detail)>;
    void stop_before(PointDetail detail, Then then);
    // begin_publish(): the pieces, one per slice of the flat elements
    // [0, end) of allgather_bucket_size elements (with `sliced`; slices_) and
    // a last one that ends at P.
    const std::vector<size_t> &plan_publish(bool sliced, size_t end);
    // publish_piece(): convert master's elements [converted_, upto) (at most
    // P) into the partition's compute dtype.
    void convert_upto(const float *master, size_t upto);

    StageSettings s_;
    size_t esize_ = 4, csize_ = 4; // bytes per compute and per communication element
    const Layout *layout_ = nullptr;
    int part_ = 0;
    comm::Backend *dp_ = nullptr, *sp_ = nullptr;
    comm::Backend *hpz_ = nullptr; // hpZ: the secondary partition group
    bool update_writes_ = false;   // set_update_writes_params
    std::vector<int> nodes_;       // qwZ/qgZ: the node of each data-parallel rank
    bool exact_ = false;           // qwZ: gathers at full precision for now
    device::Space *space_ = &device::host();
    amp::Math *math_ = nullptr;
    // The queue of the space now (dsm_engine_set_stream may change it).
    comm::Queue queue() const noexcept { return space_->queue(); }
    Timers *timers_ = nullptr;
    // The collectives in flight (overlap_comm; INLINE runs them at once).
    std::unique_ptr<comm::Pipeline> pipe_;
    bool boundary_ = true;
    // The publish under way: its pieces' ends, its slices ([begin, end) of
    // the flat elements; empty: one allgather after the last piece), and the
    // partition's elements converted so far.
    std::vector<size_t> ends_;
    std::vector<std::pair<size_t, size_t>> slices_;
    size_t converted_ = 0;

private:
    // The collective point the stage stopped before, and what proceed() runs.
    struct Point {
        PointDetail detail;
        Then then;
    };
    std::optional<Point> point_;
};

} // namespace zero
} // namespace dsm
