// The engine: creation (configuration, mesh groups, the ZeRO stage, the flat
// layout), parameter and gradient access, and free. The argument checks,
// buffers and initial values are in engine_init.cc, the micro-step in
// engine_step.cc, the description in engine_describe.cc.
#include "dsm_config.h"

#include "engine/engine.hpp"
#include "engine/stop_signal.hpp"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <sstream>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "config/config_load.hpp"
#include "config/settings.hpp"
#include "core/agree.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/memstat.hpp"
#include "core/param.hpp"
#include "core/simd.hpp"
#include "cuda/device.hpp"
#include "optim/optimizer.hpp"
#include "topo/threads.hpp"

namespace dsm {
namespace engine {

// ---------------------------------------------------------------- creation

namespace {

int env_stop_signal(const std::string &text) { return parse_stop_signal(text, "DSM_STOP_SIGNAL"); }

DSM_PARAM(engine, STOP_SIGNAL,
          param::Parsed<int>("signal", "a signal name (USR1, SIGUSR1, TERM, RTMIN+N, ...) or number",
                             env_stop_signal, 0),
          "",
          "A signal (USR1, SIGTERM, a number) that asks training to stop: every engine created while it is "
          "set catches it, and dsm_engine_stop_requested() reports it on every rank from the next step "
          "boundary on (as dsm_engine_set_stop_signal()). Empty: no signal is caught.");

dsm_dtype_t compute_dtype(const config::Config &cfg) {
    if (cfg.fp16.enabled) return DSM_FLOAT16;
    if (cfg.bf16.enabled) return DSM_BFLOAT16;
    return DSM_FLOAT32;
}

dsm_dtype_t to_dtype(config::Dtype d, dsm_dtype_t fallback) {
    switch (d) {
    case config::Dtype::FP32: return DSM_FLOAT32;
    case config::Dtype::FP16: return DSM_FLOAT16;
    case config::Dtype::BF16: return DSM_BFLOAT16;
    case config::Dtype::NONE: break;
    }
    return fallback;
}

size_t dtype_bytes(dsm_dtype_t t) { return dtype_size(t); }

} // namespace

// ZeRO-Offload: an offload_optimizer or offload_param device "cpu".
bool Engine::offloads(const config::Config &c) {
    return c.zero.offload_optimizer.device == config::OffloadDevice::CPU ||
           c.zero.offload_param.device == config::OffloadDevice::CPU;
}

std::unique_ptr<Engine> Engine::create(std::unique_ptr<Mesh> mesh, const char *config,
                                       const dsm_param_desc_t *params, int nparams, bool have_output,
                                       const Options &options) {
    std::unique_ptr<Engine> e(new Engine());
    e->mesh_ = std::move(mesh);
    e->setup(true, config, nullptr, params, nparams, have_output, options);
    return e;
}

std::unique_ptr<Engine> Engine::create(std::unique_ptr<Mesh> mesh, const config::Config *read,
                                       const dsm_param_desc_t *params, int nparams, bool have_output,
                                       const Options &options) {
    std::unique_ptr<Engine> e(new Engine());
    e->mesh_ = std::move(mesh);
    e->setup(false, nullptr, read, params, nparams, have_output, options);
    return e;
}

void Engine::setup(bool text, const char *config, const config::Config *read, const dsm_param_desc_t *params,
                   int nparams, bool have_output, const Options &options) {
    {
        // The engine's ranks (the mesh view's group: the whole mesh unless the
        // handle is a slice, ordered by mesh position) and its groups: data
        // parallel = every dimension but "sequence_parallel", and that one.
        Mesh::Roles roles = mesh_->roles();
        world_comm_ = std::move(roles.product);
        dp_comm_ = std::move(roles.data_parallel);
        sp_comm_ = std::move(roles.sequence_parallel);
        world_ = world_comm_.get();
        world_watch_.describe(world_, "the engine's ranks", "");
        control_ = comm::create_backend(world_, comm::Kind::MPI);
        control_->watch().label = "the engine's ranks";
        dp_control_ = comm::create_backend(dp_comm_.get(), comm::Kind::MPI);
        dp_control_->watch().label = "data_parallel";
        std::vector<const char *> names;
        std::vector<std::string> keep = mesh_->dim_names();
        for (const std::string &n : keep) names.push_back(n.c_str());
        mesh_handle_ = std::make_unique<dsm_mesh_s>();
        mesh_handle_->mesh = mesh_->slice(static_cast<int>(names.size()), names.data());
    }
    DSM_CHECK_MPI(MPI_Comm_size(world_, &world_size_));
    DSM_CHECK_MPI(MPI_Comm_rank(world_, &world_rank_));

    // Arguments first, agreed, so that one rank's bad argument fails all.
    dsm_status_t bad = DSM_SUCCESS;
    std::string why;
    int env_stop = 0;
    try {
        DSM_REQUIRE(have_output, DSM_ERR_NULL_POINTER, "engine (the output) is NULL");
        if (text)
            DSM_ARG_NOT_NULL(config);
        else
            DSM_REQUIRE(read != nullptr, DSM_ERR_NULL_POINTER, "config is NULL");
        check_params(params, nparams);
        env_stop = param_STOP_SIGNAL().value();
        simd::check_environment(); // a bad DSM_SIMD fails here, not only warned at the first kernel
    } catch (const Error &e) {
        bad = e.status();
        why = e.message();
    }

    // The configuration with the data-parallel size.
    DSM_CHECK_MPI(MPI_Comm_size(dp_comm_.get(), &dp_size_));
    DSM_CHECK_MPI(MPI_Comm_rank(dp_comm_.get(), &dp_rank_));
    DSM_CHECK_MPI(MPI_Comm_size(sp_comm_.get(), &sp_size_));

    config::ConfigContext ctx;
    ctx.world_size = world_size_;
    ctx.mesh_data_parallel = dp_size_;
    ctx.mesh_sequence_parallel = sp_size_; // a sequence_parallel_size that contradicts it is DSM_ERR_CONFIG
    // What the engine needs of a configuration that the reader accepted,
    // agreed the same way.
    auto check = [this](const config::Config &c) {
        DSM_REQUIRE(c.optimizer.type != config::OptimizerType::NONE, DSM_ERR_CONFIG,
                    "optimizer.type: the engine needs an optimizer section (Adam, AdamW, SGD, Lamb, "
                    "Lion or Adagrad)");
        const bool off_opt = c.zero.offload_optimizer.device == config::OffloadDevice::CPU;
        const bool off_param = c.zero.offload_param.device == config::OffloadDevice::CPU;
        DSM_REQUIRE(!off_param || c.zero.stage == 3, DSM_ERR_CONFIG,
                    "zero_optimization.offload_param.device \"cpu\": offloading parameters needs ZeRO stage 3, "
                    "stage is ", c.zero.stage);
        if (offloads(c)) {
            const std::string why = offload_unavailable();
            DSM_REQUIRE(why.empty(), DSM_ERR_NOT_SUPPORTED, "zero_optimization.",
                        off_opt ? "offload_optimizer" : "offload_param",
                        ".device \"cpu\": ZeRO-Offload keeps the parameters and gradients on a CUDA device, "
                        "and this rank has ", why);
        }
        // hpZ groups are zero_hpz_partition_size consecutive data-parallel ranks.
        const int64_t hpz = c.zero.zero_hpz_partition_size;
        DSM_REQUIRE(c.zero.stage != 3 || hpz <= 1 || (hpz <= dp_size_ && dp_size_ % hpz == 0), DSM_ERR_CONFIG,
                    "zero_optimization.zero_hpz_partition_size: ", hpz, " does not divide the data-parallel size ",
                    dp_size_, " (hpZ's secondary partition groups are that many consecutive data-parallel ranks: "
                    "use a divisor, normally the ranks per node)");
        check_quantized(c); // ZeRO++ qwZ, qgZ
    };
    // Read once: the text here, or a configuration read before, resolved again for this mesh.
    cfg_ = text ? config::load_collective(world_, bad == DSM_SUCCESS ? config : "", ctx, bad, why)
                : config::adopt_collective(world_, read != nullptr ? *read : config::Config(), ctx, bad, why);
    agree(world_, [&] { check(cfg_); });

    // Every rank must describe the same model.
    std::ostringstream canon;
    for (int i = 0; i < nparams; ++i) {
        const dsm_param_desc_t &p = params[i];
        canon << p.name << '[';
        for (int d = 0; d < p.ndims; ++d) canon << (d ? "," : "") << p.shape[d];
        canon << ']' << (p.trainable ? "" : " frozen") << (p.no_weight_decay ? " no_decay" : "") << ';';
    }
    agree_same(world_, "the parameter lists (name[shape] flags;...)", canon.str());

    // The CPU kernels' threads: DSM_NUM_THREADS, OMP_NUM_THREADS, the
    // binding, or the node's cores shared by its ranks (agreed: a bad
    // DSM_NUM_THREADS fails every rank).
    agree(world_, [&] {
        const MeshState &m = mesh_->state();
        const size_t r = static_cast<size_t>(m.rank);
        const int local_size = r < m.ranks.size() ? m.ranks[r].local_size : 1;
        const bool first_on_node = r < m.ranks.size() && m.ranks[r].local_rank == 0;
        const int threads = topo::decide_threads(local_size, first_on_node).threads;
        optim::set_num_threads(threads);
#ifdef _OPENMP
        omp_set_num_threads(threads); // the conversions' and checksums' loops, and the program's
#endif
    });

    open_monitor(); // csv_monitor, tensorboard: the first rank's files
    if (cfg_.zero.stage != 3 && cfg_.zero.zero_hpz_partition_size > 1 && world_rank_ == 0)
        DSM_WARN(INIT, "configuration: zero_optimization.zero_hpz_partition_size %lld is ignored with ZeRO stage %d "
                 "(hpZ keeps secondary partitions of the parameters, which only stage 3 partitions)",
                 static_cast<long long>(cfg_.zero.zero_hpz_partition_size), cfg_.zero.stage);

    dtype_ = compute_dtype(cfg_);
    esize_ = dtype_bytes(dtype_);
    comm_dtype_ = to_dtype(cfg_.communication_data_type, dtype_);
    {
        zero::StageSettings ss;
        ss.stage = cfg_.zero.stage;
        ss.dtype = dtype_;
        ss.comm_dtype = comm_dtype_;
        // DeepSpeed's scaling around the data-parallel sum.
        const double dp = dp_size_, f = cfg_.gradient_predivide_factor;
        const bool mean = cfg_.gradient_allreduce_op == config::AllreduceOp::MEAN;
        ss.pre = cfg_.prescale_gradients ? 1.0 / dp : 1.0 / f;
        ss.post = cfg_.prescale_gradients ? 1.0 : (mean ? f / dp : 1.0);
        ss.reduce_bucket_size = cfg_.zero.reduce_bucket_size;
        ss.prefetch_bucket_size = cfg_.zero.prefetch_bucket_size;
        ss.persistence_threshold = cfg_.zero.param_persistence_threshold;
        ss.max_live_parameters = cfg_.zero.max_live_parameters;
        ss.max_reuse_distance = cfg_.zero.max_reuse_distance;
        ss.allgather_bucket_size = cfg_.zero.allgather_bucket_size;
        ss.direct = !offloads(cfg_);
        ss.hpz = cfg_.zero.stage == 3 ? static_cast<int>(std::max<int64_t>(cfg_.zero.zero_hpz_partition_size, 1)) : 1;
        ss.qwz_block = qwz_block_;
        ss.qgz_block = qgz_block_;
        stage_ = zero::Stage::create(ss);
    }
    build_params(params, nparams);

    // Where the model state lives, and the backends that take that memory
    // (the options' backend or DSM_COMM_BACKEND; auto: nccl for CUDA memory,
    // shm within a node, else mpi, for host memory).
    choose_space(options);
    make_backends(options);
    make_hpz_group(options);
    bind_quantized();
    // Local allocations may fail on one rank: agree before anything collective uses them.
    allocate_or_fall_back(mesh_->node());
    name_groups();
    if (offloads(cfg_)) {
        // Every rank checked for a device while loading the configuration;
        // a failure here (a device that cannot be set) is agreed below.
        std::string err;
        dsm_status_t status = DSM_SUCCESS;
        try {
            const bool pin = cfg_.zero.offload_optimizer.pin_memory || cfg_.zero.offload_param.pin_memory;
            compute_ = std::make_unique<OffloadCompute>(
                std::make_unique<DeviceMirror>(offload_memory(cuda::mesh_hint(*mesh_)), params_.size(), dtype_), pin);
            size_t bytes = 0;
            void *whole = stage_->whole_params(&bytes);
            compute_->pin(whole, bytes);
        } catch (const Error &e) {
            status = e.status();
            err = e.message();
        }
        sync(SyncPoint::INIT, 0, err, status);
    }
    initialize_values(params);

    scaler_ = std::make_unique<amp::LossScaler>(config::loss_scaler_config(cfg_));
    schedule_ = config::schedule_from_config(cfg_);
    schedule_pending_ = schedule_ && schedule_->last_step() >= 0;
    DSM_INFO(ENGINE, "engine: %d parameters (%zu trainable elements), ZeRO stage %d, %s compute, %s "
             "reductions, %d data-parallel x %d sequence-parallel ranks, model state in %s memory, %s backend%s%s, overlap_comm: %s",
             num_params(), layout_.used(), stage_->number(), dtype_name(dtype_), dtype_name(comm_dtype_),
             dp_size_, sp_size_, space_->name().c_str(), dp_->name(),
             offloads(cfg_) ? ", offload: parameters and gradients on " : "", compute_->device().c_str(),
             comm::Pipeline::mode_name(stage_->overlap()));
    use_stop_signal(env_stop, "DSM_STOP_SIGNAL");
    // The high-water marks (dsm_engine_describe, the metrics) count from the
    // engine's buffers on.
    memstat::reset_peaks();
}

void Engine::build_params(const dsm_param_desc_t *params, int nparams) {
    params_.resize(static_cast<size_t>(nparams));
    std::vector<zero::Slot> persistent, gathered;
    for (int i = 0; i < nparams; ++i) {
        Param &p = params_[static_cast<size_t>(i)];
        p.name = params[i].name;
        p.shape.assign(params[i].shape, params[i].shape + params[i].ndims);
        p.numel = 1;
        for (int64_t s : p.shape) p.numel *= static_cast<size_t>(s);
        p.trainable = params[i].trainable != 0;
        p.decay = params[i].no_weight_decay == 0;
        p.persistent = stage_->persistent(p.numel);
        if (!p.trainable) continue;
        zero::Slot s;
        s.param = i;
        s.numel = p.numel;
        s.decay = p.decay;
        (p.persistent ? persistent : gathered).push_back(s);
    }
    // ZeRO-3 puts the persistent parameters first: one gather of that region
    // after each step keeps all of them whole.
    std::vector<zero::Slot> slots = persistent;
    slots.insert(slots.end(), gathered.begin(), gathered.end());
    layout_ = zero::Layout(std::move(slots), stage_->parts(dp_size_));
    part_ = layout_.parts() > 1 ? dp_rank_ : 0;
    segments_.clear();
    for (const zero::Run &r : layout_.runs(part_)) segments_.push_back(optim::Segment{r.offset, r.count, r.param, r.decay});
}
// ---------------------------------------------------------------- access

dsm_device_t Engine::device() const noexcept {
    switch (space_->kind()) {
    case device::Kind::CUDA: return DSM_DEVICE_CUDA;
    case device::Kind::SIM: return DSM_DEVICE_SIMULATED;
    case device::Kind::HOST: break;
    }
    return DSM_DEVICE_HOST;
}

std::string Engine::device_name() const { return space_->name(); }

void Engine::set_stream(void *stream) {
    check_usable();
    DSM_REQUIRE(space_->kind() == device::Kind::CUDA, DSM_ERR_NOT_SUPPORTED,
                "dsm_engine_set_stream: the engine's model state is in ", device_name(),
                " memory; a stream orders the work of a device-resident CUDA engine (DSM_DEVICE_CUDA)");
    device::set_stream(*space_, stream);
    user_stream_ = stream != nullptr;
}

void *Engine::stream() const noexcept { return user_stream_ ? space_->queue().handle() : nullptr; }

// The user reads and writes what it gets at once (host code on the
// simulated device, kernels on another stream on CUDA): the space's queued
// work (a gather, the zeroing of gradients, the update) is done first,
// unless the user's stream is the engine's.
void Engine::hand_out() {
    if (!user_stream_) space_->synchronize(); // nothing to wait for on the host
}

void Engine::check_usable() const {
    DSM_REQUIRE(!closed_, DSM_ERR_STATE, "the engine is closed");
    DSM_REQUIRE(!broken_, DSM_ERR_STATE,
                "a collective engine call failed earlier; the engine can only be freed");
}

// The C entry point names the call; Fortran users in particular need to
// hear that indices start at 0.
void Engine::check_index(int index) const {
    DSM_REQUIRE(index >= 0 && index < num_params(), DSM_ERR_INVALID_ARGUMENT, "parameter index ", index,
                " is out of range 0..", num_params() - 1, " (indices are 0-based)");
}

Param &Engine::param(int index) {
    check_usable();
    check_index(index);
    return params_[static_cast<size_t>(index)];
}

int Engine::param_index(const char *name) const {
    DSM_ARG_NOT_NULL(name);
    for (size_t i = 0; i < params_.size(); ++i)
        if (params_[i].name == name) return static_cast<int>(i);
    DSM_FAIL(DSM_ERR_NOT_FOUND, "no parameter is named '", name, "'");
}

size_t Engine::numel(int index) const {
    check_index(index);
    return params_[static_cast<size_t>(index)].numel;
}

const std::vector<int64_t> &Engine::shape(int index) const {
    check_index(index);
    return params_[static_cast<size_t>(index)].shape;
}

// How long the offload's device copy of a parameter stays valid: a frozen
// parameter changes only at a checkpoint load, a kept trainable one at each
// step; a ZeRO-3 gather is copied at each acquire.
DeviceMirror::Keep Engine::mirror_keep(const Param &p) {
    if (!p.trainable) return DeviceMirror::Keep::LOAD;
    return p.persistent ? DeviceMirror::Keep::STEP : DeviceMirror::Keep::NONE;
}

const void *Engine::param_acquire(int index) {
    Param &p = param(index);
    DSM_REQUIRE(!p.param_acquired, DSM_ERR_STATE, "parameter '", p.name, "' is already acquired");
    const void *values = p.frozen.data();
    const watchdog::Context ctx("dsm_engine_param_acquire", "parameter", index);
    if (p.trainable) {
        try {
            stage_->acquire_param(index);
            stage_collectives(SyncPoint::GATHER, Call::PARAM_ACQUIRE);
            values = stage_->param_values(index);
        } catch (...) {
            broken_ = true;
            throw;
        }
    }
    hand_out();
    values = compute_->param(index, values, p.numel, mirror_keep(p));
    p.param_acquired = true;
    return values;
}

void Engine::param_release(int index) {
    Param &p = param(index);
    DSM_REQUIRE(p.param_acquired, DSM_ERR_STATE, "parameter '", p.name, "' is not acquired");
    p.param_acquired = false;
    compute_->param_release(index, mirror_keep(p));
    if (p.trainable) stage_->release_param(index);
}

void *Engine::grad_acquire(int index) {
    Param &p = param(index);
    DSM_REQUIRE(p.trainable, DSM_ERR_INVALID_ARGUMENT, "parameter '", p.name,
                "' is frozen (trainable = 0): it has no gradient");
    DSM_REQUIRE(!p.grad_acquired, DSM_ERR_STATE, "the gradient of '", p.name, "' is already acquired");
    stage_->set_boundary((micro_steps_ + 1) % cfg_.gradient_accumulation_steps == 0);
    void *g = stage_->acquire_grad(index);
    hand_out();
    g = compute_->grad(index, g, p.numel);
    p.grad_acquired = true;
    return g;
}

void Engine::grad_release(int index) {
    Param &p = param(index);
    DSM_REQUIRE(p.grad_acquired, DSM_ERR_STATE, "the gradient of '", p.name, "' is not acquired");
    compute_->grad_release(index); // ZeRO-Offload: into the host gradient the engine gave
    p.grad_acquired = false;
    stage_->set_boundary((micro_steps_ + 1) % cfg_.gradient_accumulation_steps == 0);
    const watchdog::Context ctx("dsm_engine_grad_release", "parameter", index);
    try {
        stage_->release_grad(index);
        stage_collectives(SyncPoint::FLUSH, Call::GRAD_RELEASE);
    } catch (...) {
        broken_ = true;
        throw;
    }
}

// ---------------------------------------------------------------- free

// Collective when the engine is usable: the ranks first agree that all of
// them are freeing it (a rank still in another engine call gets
// DSM_ERR_MISMATCH instead of a hang in the window frees). After a failed
// collective call (broken_) the ranks may be anywhere, so the shared windows
// and the backends' communicators are abandoned, not freed: nothing
// collective runs, and MPI_Finalize reclaims them.
void Engine::close() {
    if (closed_) return;
    // An asynchronous save is waited for first; its failure is this call's
    // error once the engine is freed.
    std::exception_ptr save_failed;
    if (!broken_) {
        try {
            sync(SyncPoint::FREE, 0);
        } catch (...) {
            broken_ = true;
            closed_ = true;
            saver_.reset(); // waits for the thread, frees nothing collective
            release(true);
            throw;
        }
        try {
            finish_save(true);
        } catch (...) {
            save_failed = std::current_exception();
        }
    }
    saver_.reset();
    closed_ = true;
    release(broken_);
    if (save_failed) std::rethrow_exception(save_failed);
}

void Engine::release(bool abandon) {
    stop_signal_release(stop_signal_);
    stop_signal_ = 0;
    if (abandon) {
        if (hpz_) hpz_->abandon();
        if (sp_) sp_->abandon();
        if (dp_) dp_->abandon();
        if (world_backend_) world_backend_->abandon();
        if (dp_control_) dp_control_->abandon();
        if (control_) control_->abandon();
    }
    compute_->release();
    if (stage_) stage_->free(); // shared buffers: collective, in reverse order of allocation
    hpz_.reset();
    sp_.reset();
    dp_.reset();
    world_backend_.reset();
    dp_control_.reset();
    control_.reset();
    if (abandon) { // MPI_Comm_free is collective too
        (void)hpz_comm_.release();
        (void)sp_comm_.release();
        (void)dp_comm_.release();
        (void)world_comm_.release();
    }
    int rc1 = hpz_comm_.reset(), rc2 = dp_comm_.reset();
    rc1 = rc1 != MPI_SUCCESS ? rc1 : sp_comm_.reset();
    rc1 = rc1 != MPI_SUCCESS ? rc1 : world_comm_.reset();
    mesh_handle_.reset();
    int rc3 = mesh_ ? mesh_->release() : MPI_SUCCESS;
    mesh_.reset();
    DSM_REQUIRE(rc1 == MPI_SUCCESS && rc2 == MPI_SUCCESS && rc3 == MPI_SUCCESS, DSM_ERR_MPI,
                "freeing the engine's communicators failed");
}

Engine::~Engine() {
    try {
        close();
    } catch (...) {
    }
}

} // namespace engine
} // namespace dsm

DSM_PARAM_LINK(engine)
