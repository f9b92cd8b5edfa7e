// The training engine: orchestrates a model's training in flat buffers laid
// out by zero::Layout. A zero::Stage (zero/stage.hpp) owns the compute-dtype
// parameters and gradients and their reductions and gathers; the engine owns
// the fp32 master weights and the optimizer state of its partition, agrees
// every collective point, and drives a micro-step through the layers below
// (amp for loss scaling and precision, optim for the update and the LR
// schedule).
//
// Storage per ZeRO stage (N data-parallel ranks, P = part_size, T = total):
//   stage 0: params T (compute dtype), grads T, master + optimizer state T
//   stage 1: params T, grads T, master + state P
//   stage 2: params T, grads P (reduced as they are released), master + state P
//   stage 3: params P (+ the persistent small ones whole), grads P, master + state P
// With fp32 the master weights are the parameters themselves (no copy).
// With ZeRO-Offload all of the above stays in host memory; the values the
// user reads and the gradients the user writes are device copies
// (OffloadCompute over a DeviceMirror, compute.hpp; without offload the
// host Compute hands out the engine's own buffers).
//
// ZeRO++ hpZ (zero_hpz_partition_size > 1, stage 3): the stage also gets
// the backend of this rank's secondary partition group (hpz_: consecutive
// data-parallel ranks, normally those of a node), and the engine counts the
// bytes that leave the node per step (bytes_off_node()).
//
// Collective points (every rank of the engine in the same order): init,
// param_acquire of a gathered (ZeRO-3) parameter, grad_release that fills a
// bucket (ZeRO-2/3), step, checkpoint save, load and wait, and free. Each starts
// with sync(): one small allreduce that checks that every rank is at the same
// point, so a rank that diverged fails every rank instead of hanging them.
// Ranks found at different points all mark the engine failed (broken_),
// whatever call each was in, so that dsm_engine_free is then local on every
// one of them. A failure agreed at the same point leaves the engine usable
// for a save or a load (nothing collective moved), and failed for the other
// points (step, gather, bucket flush), on every rank alike.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "amp/loss_scaler.hpp"
#include "amp/math.hpp"
#include "ckpt/background.hpp"
#include "ckpt/checkpoint.hpp"
#include "comm/backend.hpp"
#include "comm/scalars.hpp"
#include "config/config.hpp"
#include "core/comm.hpp"
#include "core/watchdog.hpp"
#include "device/space.hpp"
#include "engine/compute.hpp"
#include "engine/monitor.hpp"
#include "dsm.h"
#include "mesh/mesh.hpp"
#include "optim/lr_schedule.hpp"
#include "optim/optimizer.hpp"
#include "zero/layout.hpp"
#include "zero/stage.hpp"

namespace dsm {
namespace engine {

using zero::Buffer;
using zero::Timers; // what one micro-step's reductions and update cost (wall_clock_breakdown)

struct Param {
    std::string name;
    std::vector<int64_t> shape;
    size_t numel = 0;
    bool trainable = true;
    bool decay = true;
    bool persistent = true;     // ZeRO-3: held whole on every rank (small); always true below stage 3
    bool param_acquired = false;
    bool grad_acquired = false;
    // The element ranges acquired now (offset, count): dsm_engine_*_range.
    std::vector<std::pair<size_t, size_t>> param_ranges, grad_ranges;
    // Whether anything of the parameter or its gradient is acquired (what
    // dsm_step and the checkpoints refuse): "" or what is.
    std::string held() const;
    Buffer frozen;              // a frozen parameter's values (compute dtype, the engine's space)
};

// dsm_engine_options_t, checked (the API layer validates the caller's struct).
struct Options {
    dsm_device_t device = DSM_DEVICE_DEFAULT;
    dsm_backend_t backend = DSM_BACKEND_DEFAULT;
    int cuda_device = -1;
};

class Engine {
public:
    // Collective over the mesh's ranks; `mesh` is the engine's own reference.
    // Argument errors of any rank (a NULL output: have_output false) fail
    // every rank, as do options that differ between the ranks.
    static std::unique_ptr<Engine> create(std::unique_ptr<Mesh> mesh, const char *config,
                                          const dsm_param_desc_t *params, int nparams,
                                          bool have_output, const Options &options = Options());
    // The same with a configuration already read (dsm_engine_init_with_config,
    // and dsm_engine_init_comm, which read it for the mesh): resolved again
    // for this mesh and agreed, never read again. `read` == nullptr is a NULL
    // configuration argument, agreed like the other argument errors.
    static std::unique_ptr<Engine> create(std::unique_ptr<Mesh> mesh, const config::Config *read,
                                          const dsm_param_desc_t *params, int nparams,
                                          bool have_output, const Options &options = Options());
    ~Engine();
    Engine(const Engine &) = delete;
    Engine &operator=(const Engine &) = delete;

    // Collective: free the buffers and the communicators (the destructor does
    // the same, without reporting errors).
    void close();

    int num_params() const noexcept { return static_cast<int>(params_.size()); }
    int param_index(const char *name) const;
    size_t numel(int index) const;
    // The shape the parameter was declared with (row-major, outermost first).
    const std::vector<int64_t> &shape(int index) const;
    dsm_dtype_t dtype() const noexcept { return dtype_; }
    double loss_scale() const noexcept { return scaler_->scale(); }
    Mesh &mesh() noexcept { return *mesh_; }
    dsm_mesh_s *mesh_handle() noexcept { return mesh_handle_.get(); }
    const config::Config &config() const noexcept { return cfg_; }
    // The data-parallel group (every mesh dimension but "sequence_parallel")
    // and the sequence-parallel one.
    int dp_size() const noexcept { return dp_size_; }
    int dp_rank() const noexcept { return dp_rank_; }
    int sp_size() const noexcept { return sp_size_; }
    // ZeRO-Offload: where the user's parameters and gradients live
    // ("cuda:N", "simulated"); empty without offload.
    std::string offload_device() const { return compute_->device(); }
    // Where the model state lives (DSM_DEVICE_HOST, _CUDA or _SIMULATED:
    // never DEFAULT) and its name ("host", "cuda:0", "simulated").
    dsm_device_t device() const noexcept;
    std::string device_name() const;
    // Device-resident CUDA engines: the stream the engine's work is ordered
    // on (NULL: the engine's own). Local. set_stream on another device:
    // DSM_ERR_NOT_SUPPORTED naming the engine's device.
    void set_stream(void *stream);
    void *stream() const noexcept;
    // Wait for the work the engine enqueued on its space (benchmarks).
    void synchronize() { space_->synchronize(); }

    const void *param_acquire(int index);
    void param_release(int index);
    void *grad_acquire(int index);
    void grad_release(int index);
    // Element ranges of a parameter (engine_range.cc): `count` elements from
    // `offset`. The acquire of a ZeRO-3 partitioned parameter's range is
    // collective and agrees its arguments (have_output: the caller's output
    // is not NULL), so a bad range on one rank fails every rank.
    const void *param_acquire_range(int index, int64_t offset, int64_t count, bool have_output);
    void param_release_range(int index, int64_t offset, int64_t count);
    void *grad_acquire_range(int index, int64_t offset, int64_t count);
    void grad_release_range(int index, int64_t offset, int64_t count);
    // dsm_engine_param_read_f32 / dsm_engine_grad_add_f32 (engine_f32.cc):
    // acquire, copy as fp32 to or add from host memory, release.
    void param_read_f32(int index, float *out, int64_t count);
    void grad_add_f32(int index, const float *grad, int64_t count);
    // The space of the memory the acquires hand out (ZeRO-Offload's device
    // copies, else the engine's own).
    device::Space &user_space() noexcept { return compute_->space(*space_); }
    void step(dsm_step_info_t *info);
    void step_info(dsm_step_info_t *info) const;
    std::string describe(dsm_format_t format) const;
    // This rank's memory by use (dsm_engine_memory()).
    dsm_engine_memory_t memory() const;
    // Checkpoints (engine_ckpt.cc, doc/checkpoint.md). Collective. The load
    // returns the tag it read.
    // NULL arguments are errors agreed by every rank.
    void save_checkpoint(const char *dir, const char *tag, const void *client, size_t client_size);
    std::string load_checkpoint(const char *dir, const char *tag, unsigned flags,
                                std::vector<unsigned char> *client);
    // dsm_engine_load_weights: the parameters from a checkpoint file or a
    // safetensors file, by name; optimizer state and counters stay.
    void load_weights(const char *path, unsigned flags);
    // dsm_engine_checkpoint_wait: collective; the asynchronous save's
    // failure, if it had one, is thrown (the same on every rank).
    void checkpoint_wait();
    // Not collective: blocks until an asynchronous save of the live state no
    // longer reads it (what the next dsm_step waits for); at once without one.
    void checkpoint_captured_wait() noexcept {
        if (saver_) saver_->wait_captured();
    }
    // dsm_engine_load_report: what the last load read, skipped and left out.
    std::string load_report(dsm_format_t format) const;

    // For benchmarks: time spent so far, and the bytes this rank sent.
    const Timers &timers() const noexcept { return timers_; }
    uint64_t bytes_sent() const noexcept;
    // Of those, the bytes that left this rank's node: what the backends
    // count, none for a group whose ranks share one node (the mesh's
    // placement says so, whatever the backend).
    uint64_t bytes_off_node() const noexcept;
    // The same two counts over the last global step (from the end of the
    // step before, or the engine's creation, to the end of its last
    // dsm_step: every micro-step's gathers and reductions and the update's
    // gathers).
    uint64_t last_step_bytes_sent() const noexcept { return last_step_sent_; }
    uint64_t last_step_bytes_off_node() const noexcept { return last_step_off_; }
    // hpZ: ranks per secondary partition group (1: off), and whether every
    // group lies inside one node.
    int hpz_size() const noexcept { return hpz_size_; }
    bool hpz_within_node() const noexcept { return hpz_one_node_; }
    // ZeRO++ qwZ/qgZ (engine_quant.cc): the block sizes (0: off) and the
    // bytes of the quantized exchanges over the last global step.
    size_t qwz_block() const noexcept { return qwz_block_; }
    size_t qgz_block() const noexcept { return qgz_block_; }
    const zero::QuantStats &last_step_quant() const noexcept { return last_quant_; }
    // Bytes of the model state on this rank, and the ZeRO paper's bytes per parameter.
    size_t model_state_bytes() const;
    double zero_formula_bytes_per_param() const;

private:
    Engine() = default;
    // `config` (text or path) is read once, or `read` (when `text` is false) adopted.
    void setup(bool text, const char *config, const config::Config *read, const dsm_param_desc_t *params,
               int nparams, bool have_output, const Options &options);
    void check_params(const dsm_param_desc_t *params, int nparams) const;
    void build_params(const dsm_param_desc_t *params, int nparams);
    void allocate();
    void allocate_or_fall_back(int node);
    void initialize_values(const dsm_param_desc_t *params);
    static bool offloads(const config::Config &c); // ZeRO-Offload is configured
    void choose_space(const Options &options);  // engine_init.cc
    void make_backends(const Options &options); // engine_init.cc
    void name_groups();                         // engine_init.cc: the watchdog's names of the groups
    void make_hpz_group(const Options &options); // engine_init.cc
    // qwZ/qgZ (engine_quant.cc): the block sizes from the configuration and
    // the environment (in the configuration's agreed checks), then, with
    // the backends made, the checks against the space and the nodes of the
    // data-parallel ranks for the stage; the report in describe().
    void check_quantized(const config::Config &c);
    void bind_quantized();
    void mark_quant_step();
    nlohmann::json quant_json() const;
    // Before a pointer goes to the user: the space's queued work is done
    // (unless the user's stream orders it).
    void hand_out();
    // A frozen parameter's values from / to fp32 host memory.
    void put_frozen(Param &p, const float *fp32);
    void get_frozen(const Param &p, float *fp32);
    // A piecewise optimizer's update, run by publish() piece by piece.
    struct PieceUpdate {
        optim::StepArgs args;
        float *g = nullptr;                   // the fp32 gradients (NULL: the fused step reads fused->grad16)
        const optim::Fused *fused = nullptr;  // the fused host step, or NULL
        size_t updated = 0;                   // master's elements updated so far
    };
    // master -> compute params (+ gathers), in the stage's pieces; with
    // `update`, the optimizer has not run yet and brings each piece up to
    // date before the stage publishes it (zero::Stage::begin_publish).
    void publish(PieceUpdate *update = nullptr);
    double current_lr() const;
    Param &param(int index);
    void check_index(int index) const;
    // "" when [offset, offset + count) is a range of `p`, else why not.
    static std::string range_error(const Param &p, int64_t offset, int64_t count);
    void check_usable() const;
    static DeviceMirror::Keep mirror_keep(const Param &p);

    // Reductions (engine_step.cc).
    enum class SyncPoint : int64_t {
        INIT = 1, GATHER, FLUSH, STEP, FREE, SAVE, LOAD, WAIT, STOP_SIGNAL, WEIGHTS, GATHER_RANGE, MEAN_LOSS
    };
    // The engine call made at a point: a point reached from several calls
    // (a bucket reduction: dsm_engine_grad_release, _range or dsm_step) says
    // which one in the messages.
    enum class Call : int64_t {
        DEFAULT = 0, PARAM_ACQUIRE, PARAM_ACQUIRE_RANGE, GRAD_RELEASE, GRAD_RELEASE_RANGE, STEP
    };
    // The engine call of a point, for messages ("?" for a value outside the enum).
    static const char *sync_point_name(SyncPoint point) noexcept;
    // "dsm_engine_grad_release (bucket reduction)": the call made and what
    // the point is.
    static std::string sync_point_text(int64_t point, int64_t call);
    static const char *sync_point_hint(SyncPoint point) noexcept; // what to do about a difference
    void release(bool abandon);
    void sync(SyncPoint point, const PointDetail &detail, const std::string &local_error = "",
              dsm_status_t local_status = DSM_SUCCESS, Call call = Call::DEFAULT);
    void sync(SyncPoint point, int64_t value, const std::string &local_error = "",
              dsm_status_t local_status = DSM_SUCCESS);
    // A parameter's index and name for messages: "3 ('w1')".
    std::string param_text(int64_t index) const;
    void drain_offload(dsm_status_t &status, std::string &why);
    // The collectives the stage stopped before in the call just made to it
    // (zero/stage.hpp), each made once the ranks agreed at `point` (at a
    // bucket flush the offloaded gradients are added in first); `wait`
    // adds the agreements' time.
    void stage_collectives(SyncPoint point, Call call, double *wait = nullptr);
    float *fp32_grads();
    // dsm_step's phases, in order (engine_step.cc, doc/engine-internals.md).
    // What the inspection found, for the phases after it.
    struct Inspection {
        double inv = 1.0;          // 1 / (loss scale * gradient_accumulation_steps)
        bool fused = false;        // the optimizer's fused host step (optim::Fused)
        bool half = false;         // 16-bit compute dtype
        const void *raw = nullptr; // the stage's gradient partition (compute dtype)
        float *g = nullptr;        // its fp32 values (NULL: the fused 16-bit step reads raw)
        double norm = 0.0;         // the global gradient norm (INFINITY when non-finite)
        bool nonfinite = false;    // some rank's gradients hold an Inf or NaN
        bool fp32_nonfinite = false;
        std::string culprit;       // " (first in parameter 'NAME')" or ""
    };
    void enter_step(dsm_step_info_t *info);
    bool begin_micro_step();
    void reduce_phase(bool boundary);
    void mark_step_traffic();
    Inspection inspect_phase();
    bool nonfinite_phase(Inspection &in);
    void skip_phase(const Inspection &in);
    void update_phase(const Inspection &in);
    void bookkeeping(double norm);
    std::string first_nonfinite(const float *g);
    void zero_grads();
    void log_step(double norm) const;
    std::vector<ckpt::Tensor> checkpoint_tensors(bool with_optimizer, std::vector<std::unique_ptr<float[]>> &buffers,
                                                 std::vector<float *> *live = nullptr,
                                                 const std::vector<float *> *bases = nullptr, bool in_place = false);
    // The master weights and the optimizer states as host memory for a
    // save: the engine's own on the host, else copies staged in `hold`.
    std::vector<float *> host_state(std::vector<std::unique_ptr<device::Staging>> &hold);
    void check_checkpoint_point(SyncPoint point);
    void enter_load(SyncPoint point, const std::function<void()> &checks);
    void put_loaded(const ckpt::Content &content, const std::vector<float *> &live);
    void after_load();
    // Copies of the master weights and optimizer states in host memory the
    // asynchronous save owns (buffers of the previous one reused).
    std::vector<float *> snapshot_state(std::vector<std::unique_ptr<float[]>> &own);
    // The asynchronous save (engine_ckpt.cc): with `wait`, wait for it; else
    // only when the last sync() found it finished on every rank. Its failure
    // is thrown, the same on every rank, and the engine stays usable.
    void finish_save(bool wait);

    std::unique_ptr<Mesh> mesh_;
    std::unique_ptr<dsm_mesh_s> mesh_handle_; // what dsm_engine_borrow_mesh() returns
    // Where the model state lives and the math runs (device/space.hpp): the
    // host, or with device-resident training a CUDA device or the simulated
    // one (own_space_).
    std::unique_ptr<device::Space> own_space_;
    device::Space *space_ = &device::host();
    std::unique_ptr<amp::Math> math_; // amp's table for space_
    bool user_stream_ = false; // dsm_engine_set_stream gave the stream
    Comm world_comm_;                         // the ranks of the mesh view
    MPI_Comm world_ = MPI_COMM_NULL;          // world_comm_.get()
    watchdog::Group world_watch_;             // world_ as the watchdog names it
    int64_t bucket_ = -1;                     // the last bucket reduction's index (messages)
    Comm dp_comm_, sp_comm_;
    std::unique_ptr<comm::Backend> dp_, sp_;
    std::unique_ptr<comm::Backend> world_backend_; // nccl: the communicator dp_ and sp_ were split from
    // The small host values the engine agrees between its ranks (the
    // gradient norm and non-finite flags, the mean loss, init's broadcasts,
    // a save's client size: control_, over the engine's ranks) and within
    // the data-parallel group (Lamb's per-parameter sums, the ranks' nodes:
    // dp_control_), through comm/scalars.hpp. Always the "mpi" backend: host
    // memory whatever space the model state lives in, and MPI's reduction
    // order, so these sums have the same bits whatever DSM_COMM_BACKEND says.
    // Their bytes are theirs (not in bytes_sent(), the model state's).
    std::unique_ptr<comm::Backend> control_, dp_control_;
    // hpZ: the secondary partition group (zero_hpz_partition_size consecutive
    // data-parallel ranks; none with hpz_size_ 1).
    Comm hpz_comm_;
    std::unique_ptr<comm::Backend> hpz_;
    int hpz_size_ = 1;
    // Whether each group's ranks share one node (their bytes stay on it).
    bool dp_one_node_ = false, sp_one_node_ = false, hpz_one_node_ = true;
    // Bytes sent and sent off the node, at the end of the last global step
    // and during it.
    uint64_t step_mark_sent_ = 0, step_mark_off_ = 0, last_step_sent_ = 0, last_step_off_ = 0;
    // qwZ/qgZ: values per block (0: off); the quantized bytes at the end of
    // the last global step and during it.
    size_t qwz_block_ = 0, qgz_block_ = 0;
    zero::QuantStats quant_mark_, last_quant_;
    int dp_size_ = 1, dp_rank_ = 0, sp_size_ = 1, world_size_ = 1, world_rank_ = 0;

    config::Config cfg_;
    dsm_dtype_t dtype_ = DSM_FLOAT32;      // compute dtype
    dsm_dtype_t comm_dtype_ = DSM_FLOAT32; // gradient reduction dtype
    size_t esize_ = 4;                           // bytes per compute element
    std::vector<Param> params_;
    zero::Layout layout_;
    int part_ = 0;                 // this rank's partition
    std::vector<optim::Segment> segments_;

    // The ZeRO stage: the compute-dtype parameters and gradients and their
    // collectives (zero/stage.hpp).
    std::unique_ptr<zero::Stage> stage_;
    Buffer master_own_;            // P fp32 when the compute dtype is not fp32
    float *master_ = nullptr;      // P fp32 (an alias of the parameters with fp32)
    Buffer grad32_;                // P fp32 scratch when the gradients are not fp32
    std::unique_ptr<optim::Optimizer> optimizer_;
    // Where the user's parameters and gradients live: the host buffers, or
    // with ZeRO-Offload device copies (compute.hpp).
    std::unique_ptr<Compute> compute_ = std::make_unique<Compute>();
    std::unique_ptr<amp::LossScaler> scaler_;
    std::optional<optim::LrSchedule> schedule_;

    int64_t micro_steps_ = 0, global_steps_ = 0, skipped_steps_ = 0, global_samples_ = 0,
            applied_steps_ = 0;
    double grad_norm_ = -1.0;
    bool last_boundary_ = false, last_skipped_ = false;
    bool broken_ = false, closed_ = false;
    bool warned_nonfinite_ = false; // fp32_nonfinite_gradients "warn": said once
    // A schedule configured with last_batch_iteration >= 0 leaves the
    // optimizer's lr and betas until its first step, as DeepSpeed's do.
    bool schedule_pending_ = false;
    Timers timers_;
    // checkpoint.writer.decoupled: the save writing in the background, whether
    // the last sync() found it finished on every rank, the snapshot buffers
    // of the last one (reused), and whether the fallback to synchronous saves
    // (MPI below MPI_THREAD_MULTIPLE) was logged.
    std::unique_ptr<ckpt::BackgroundSave> saver_;
    bool saves_done_ = true;
    std::vector<std::unique_ptr<float[]>> snapshot_spare_;
    bool said_sync_fallback_ = false;
    // What the last load read (dsm_engine_load_report).
    struct LoadReport {
        std::string dir, tag;
        std::string weights; // dsm_engine_load_weights: the file it read
        std::vector<std::pair<std::string, std::string>> skipped; // tag, why
        std::vector<std::string> missing, unexpected, mismatched;
    } last_load_;
    double window_start_ = 0.0;   // samples/s of the log lines: since the first step (or the last load)
    int64_t window_samples_ = 0;
    // Metrics (csv_monitor, tensorboard; engine_monitor.cc): the losses
    // given since the last boundary, the FLOPs figures, the last boundary.
    std::unique_ptr<Monitor> monitor_;
    double loss_sum_ = 0.0;
    int64_t loss_count_ = 0;
    double flops_per_sample_ = 0.0, peak_flops_ = 0.0;
    double monitor_last_ = 0.0;
    Timers monitor_timers_;

    // The stop signal (stop_signal.hpp; 0: none), and whether it arrived on
    // some rank: agreed at every dsm_step, reported from the next boundary on.
    int stop_signal_ = 0;
    bool stop_pending_ = false, stop_requested_ = false;
    void use_stop_signal(int signum, const char *from); // local: the handler for signum, the old one released

public:
    // dsm_engine_set_stop_signal (collective), dsm_engine_stop_requested (local).
    void set_stop_signal(int signum);
    bool stop_requested() const noexcept { return stop_requested_; }

    // dsm_engine_log_loss, dsm_engine_log_scalar, dsm_engine_set_flops (local).
    void log_loss(double loss);
    void log_scalar(const char *name, double value);
    void set_flops(double flops_per_sample, double peak_flops);

    // What every training loop needs (engine_loop.cc). Collective.
    // dsm_engine_resume: load DIR's `latest` when DIR has one and return
    // true; false (nothing loaded) when DIR or DIR/latest does not exist.
    bool resume(const char *dir, unsigned flags, bool have_output, std::vector<unsigned char> *client);
    // dsm_engine_mean_loss: sum(loss * weight) / sum(weight) over the
    // engine's ranks (data parallel x sequence parallel), under the watchdog.
    double mean_loss(double loss, double weight, bool have_output);

private:
    void open_monitor();
    void record_step(double norm); // rank 0, at a boundary
};

} // namespace engine
} // namespace dsm

// The C handle.
struct dsm_engine_s {
    std::unique_ptr<dsm::engine::Engine> engine;
};
