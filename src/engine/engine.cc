// The engine: creation (argument checks, configuration, mesh groups, the
// flat layout, buffers, initial values), parameter and gradient access, and
// the description. The micro-step and the reductions are in engine_step.cc.
#include "dsm_config.h"

#include "engine/engine.hpp"

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include <nlohmann/json.hpp>

#include "amp/convert.hpp"
#include "config/config_load.hpp"
#include "core/agree.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "cuda/device.hpp"
#include "optim/lr_from_config.hpp"

namespace dsm {
namespace engine {

// ---------------------------------------------------------------- creation

namespace {

constexpr int kMaxParams = 1000000;
constexpr size_t kMaxNameLength = 255;

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

// ZeRO-Offload: an offload_optimizer or offload_param device "cpu".
bool offloads(const config::Config &c) {
    return c.zero.offload_optimizer.device == config::OffloadDevice::CPU ||
           c.zero.offload_param.device == config::OffloadDevice::CPU;
}

bool init_dtype_ok(dsm_dtype_t t) {
    return t == DSM_FLOAT32 || t == DSM_FLOAT64 || t == DSM_FLOAT16 ||
           t == DSM_BFLOAT16;
}

size_t dtype_bytes(dsm_dtype_t t) { return dtype_size(t); }

// Mesh communicator and the groups: data parallel = every dimension except
// "sequence_parallel"; sequence parallel = that dimension.
struct Groups {
    int sp_dim = -1;
    int dp_color = 0, dp_key = 0, sp_color = 0, sp_key = 0;
};

Groups groups_of(const Mesh &mesh) {
    Groups g;
    const std::vector<int> shape = mesh.shape();
    const std::vector<int> coords = mesh.coords();
    const std::vector<std::string> names = mesh.dim_names();
    for (size_t d = 0; d < names.size(); ++d)
        if (names[d] == "sequence_parallel") g.sp_dim = static_cast<int>(d);
    // dp index: row-major over the non-SP dimensions; sp index: the SP coordinate.
    int dp_index = 0;
    for (size_t d = 0; d < shape.size(); ++d)
        if (static_cast<int>(d) != g.sp_dim) dp_index = dp_index * shape[d] + coords[d];
    const int sp_index = g.sp_dim >= 0 ? coords[static_cast<size_t>(g.sp_dim)] : 0;
    g.dp_color = sp_index;
    g.dp_key = dp_index;
    g.sp_color = dp_index;
    g.sp_key = sp_index;
    return g;
}

} // namespace

std::unique_ptr<Engine> Engine::create(std::unique_ptr<Mesh> mesh, const char *config,
                                       const dsm_param_desc_t *params, int nparams, bool have_output) {
    std::unique_ptr<Engine> e(new Engine());
    e->mesh_ = std::move(mesh);
    e->setup(config, params, nparams, have_output);
    return e;
}

void Engine::setup(const char *config, const dsm_param_desc_t *params, int nparams, bool have_output) {
    const MeshState &st = mesh_->state();
    {
        // The engine's ranks: the mesh view's group (the whole mesh unless the
        // handle is a slice), ordered by mesh position.
        std::vector<int> view;
        for (const std::string &n : mesh_->dim_names())
            for (size_t d = 0; d < st.names.size(); ++d)
                if (st.names[d] == n) view.push_back(static_cast<int>(d));
        int color = 0;
        for (size_t d = 0; d < st.shape.size(); ++d)
            if (std::find(view.begin(), view.end(), static_cast<int>(d)) == view.end())
                color = color * st.shape[d] + st.coord(st.position, static_cast<int>(d));
        world_comm_ = Comm::split(st.mesh_comm.get(), color, st.position);
        world_ = world_comm_.get();
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
    try {
        DSM_REQUIRE(have_output, DSM_ERR_NULL_POINTER, "engine (the output) is NULL");
        DSM_ARG_NOT_NULL(config);
        check_params(params, nparams);
    } catch (const Error &e) {
        bad = e.status();
        why = e.message();
    }

    // The groups, then the configuration with the data-parallel size.
    const Groups g = groups_of(*mesh_);
    dp_comm_ = Comm::split(world_, g.dp_color, g.dp_key);
    sp_comm_ = Comm::split(world_, g.sp_color, g.sp_key);
    DSM_CHECK_MPI(MPI_Comm_size(dp_comm_.get(), &dp_size_));
    DSM_CHECK_MPI(MPI_Comm_rank(dp_comm_.get(), &dp_rank_));
    DSM_CHECK_MPI(MPI_Comm_size(sp_comm_.get(), &sp_size_));

    config::ConfigContext ctx;
    ctx.world_size = world_size_;
    ctx.mesh_data_parallel = dp_size_;
    auto check = [this](const config::Config &c) {
        optim::check_schedule_params(c);
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
        DSM_REQUIRE(c.sequence_parallel_size == 1 || c.sequence_parallel_size == sp_size_,
                    DSM_ERR_CONFIG, "sequence_parallel_size: the configuration says ",
                    c.sequence_parallel_size, " but the mesh's sequence_parallel dimension has ",
                    sp_size_, " ranks");
    };
    cfg_ = config::load_collective(world_, bad == DSM_SUCCESS ? config : "", ctx, check, bad, why);

    // Every rank must describe the same model.
    std::ostringstream canon;
    for (int i = 0; i < nparams; ++i) {
        const dsm_param_desc_t &p = params[i];
        canon << p.name << '[';
        for (int d = 0; d < p.ndims; ++d) canon << (d ? "," : "") << p.shape[d];
        canon << ']' << (p.trainable ? "" : " frozen") << (p.no_weight_decay ? " no_decay" : "") << ';';
    }
    agree_same(world_, "the parameter lists (name[shape] flags;...)", canon.str());

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
        stage_ = zero::Stage::create(ss);
    }
    build_params(params, nparams);

    // Local allocations may fail on one rank: agree before anything collective uses them.
    comm::Kind kind = comm::Kind::AUTO;
    const int node = st.ranks[static_cast<size_t>(st.rank)].node;
    dp_ = comm::create_backend(dp_comm_.get(), kind, node);
    if (sp_size_ > 1) sp_ = comm::create_backend(sp_comm_.get(), kind, node);
    allocate_or_fall_back(node);
    if (offloads(cfg_)) {
        // Every rank checked for a device while loading the configuration;
        // a failure here (a device that cannot be set) is agreed below.
        std::string err;
        dsm_status_t status = DSM_SUCCESS;
        try {
            mirror_ = std::make_unique<DeviceMirror>(offload_memory(cuda::mesh_hint(st)), params_.size(), dtype_);
            pin_offload();
        } catch (const Error &e) {
            status = e.status();
            err = e.message();
        }
        sync(SyncPoint::INIT, 0, err, status);
    }
    initialize_values(params);

    scaler_ = std::make_unique<amp::LossScaler>(amp::loss_scaler_config(cfg_));
    schedule_ = optim::schedule_from_config(cfg_);
    DSM_INFO(ENGINE, "engine: %d parameters (%zu trainable elements), ZeRO stage %d, %s compute, %s "
             "reductions, %d data-parallel x %d sequence-parallel ranks, %s backend%s%s",
             num_params(), layout_.used(), stage_->number(), dtype_name(dtype_), dtype_name(comm_dtype_),
             dp_size_, sp_size_, dp_->name(), mirror_ ? ", offload: parameters and gradients on " : "",
             mirror_ ? mirror_->memory().name().c_str() : "");
}

void Engine::check_params(const dsm_param_desc_t *params, int nparams) const {
    DSM_REQUIRE(nparams >= 1 && nparams <= kMaxParams, DSM_ERR_INVALID_ARGUMENT, "nparams is ", nparams,
                ", must be 1..", kMaxParams);
    DSM_ARG_NOT_NULL(params);
    std::vector<std::string> names;
    names.reserve(static_cast<size_t>(nparams));
    for (int i = 0; i < nparams; ++i) {
        const dsm_param_desc_t &p = params[i];
        DSM_REQUIRE(p.name != nullptr, DSM_ERR_NULL_POINTER, "params[", i, "].name is NULL");
        const std::string name = p.name;
        DSM_REQUIRE(!name.empty() && name.size() <= kMaxNameLength, DSM_ERR_INVALID_ARGUMENT, "params[",
                    i, "].name '", name, "' must have 1..", kMaxNameLength, " characters");
        for (unsigned char c : name)
            DSM_REQUIRE(std::isgraph(c), DSM_ERR_INVALID_ARGUMENT, "params[", i, "].name '", name,
                        "' has a space or control character");
        DSM_REQUIRE(p.ndims >= 0 && p.ndims <= DSM_PARAM_MAX_DIMS, DSM_ERR_INVALID_ARGUMENT, "params[", i,
                    "] '", name, "': ndims is ", p.ndims, ", must be 0..", DSM_PARAM_MAX_DIMS);
        DSM_REQUIRE(p.ndims == 0 || p.shape != nullptr, DSM_ERR_NULL_POINTER, "params[", i, "] '", name,
                    "': shape is NULL");
        int64_t numel = 1;
        for (int d = 0; d < p.ndims; ++d) {
            DSM_REQUIRE(p.shape[d] >= 1, DSM_ERR_INVALID_ARGUMENT, "params[", i, "] '", name, "': shape[",
                        d, "] is ", p.shape[d], ", must be >= 1");
            DSM_REQUIRE(numel <= (INT64_C(1) << 40) / p.shape[d], DSM_ERR_INVALID_ARGUMENT, "params[", i,
                        "] '", name, "': more than 2^40 elements");
            numel *= p.shape[d];
        }
        DSM_REQUIRE(init_dtype_ok(p.dtype), DSM_ERR_INVALID_ARGUMENT, "params[", i, "] '", name,
                    "': dtype ", static_cast<int>(p.dtype),
                    " is not FLOAT32, FLOAT64, FLOAT16 or BFLOAT16");
        DSM_REQUIRE(p.trainable == 0 || p.trainable == 1, DSM_ERR_INVALID_ARGUMENT, "params[", i, "] '",
                    name, "': trainable is ", p.trainable, ", must be 0 or 1");
        DSM_REQUIRE(p.no_weight_decay == 0 || p.no_weight_decay == 1, DSM_ERR_INVALID_ARGUMENT, "params[",
                    i, "] '", name, "': no_weight_decay is ", p.no_weight_decay, ", must be 0 or 1");
        names.push_back(name);
    }
    std::vector<std::string> sorted = names;
    std::sort(sorted.begin(), sorted.end());
    auto dup = std::adjacent_find(sorted.begin(), sorted.end());
    DSM_REQUIRE(dup == sorted.end(), DSM_ERR_INVALID_ARGUMENT, "parameter name '",
                dup == sorted.end() ? "" : *dup, "' is used twice");
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
    segments_ = layout_.segments(part_);
}

// The shm backend keeps the engine's shared buffers in /dev/shm, which
// containers often make small (64 MB). When they do not fit there on some
// node, every rank of the world learns it (the backend agrees over its
// group, the allreduce below over the world) and all of them free what they
// got and fall back to the mpi backend, whose buffers are private memory:
// the same decision on every rank, with a warning. Any other failure, or one
// with the mpi backend, is agreed over the world and returned.
void Engine::allocate_or_fall_back(int node) {
    dsm_status_t status = DSM_SUCCESS;
    std::string err;
    const auto attempt = [&] {
        status = DSM_SUCCESS;
        err.clear();
        try {
            allocate();
        } catch (const Error &e) {
            status = e.status();
            err = e.message();
        } catch (const std::bad_alloc &) {
            status = DSM_ERR_OUT_OF_MEMORY;
            err = "out of memory allocating the engine's buffers";
        }
    };
    attempt();
    // The shm backend's own failure (not a private buffer's): its message says "shared memory".
    int no_room = status == DSM_ERR_OUT_OF_MEMORY && std::strcmp(dp_->name(), "shm") == 0 &&
                          err.find("shared memory: ") != std::string::npos
                      ? 1
                      : 0,
        any = 0;
    DSM_CHECK_MPI(MPI_Allreduce(&no_room, &any, 1, MPI_INT, MPI_MAX, world_));
    if (any != 0) {
        if (world_rank_ == 0)
            DSM_WARN(ENGINE, "%s: the engine uses the mpi backend (private memory) on every rank instead",
                     no_room != 0 ? err.c_str()
                                  : "another data-parallel group's shared buffers do not fit in /dev/shm");
        // Collective frees over each data-parallel group, in the same order
        // on its ranks (their allocations were agreed, so they hold the same).
        stage_->free();
        dp_.reset();
        dp_ = comm::create_backend(dp_comm_.get(), comm::Kind::MPI, node);
        attempt();
    }
    agree(world_, [&] {
        if (status != DSM_SUCCESS) DSM_FAIL(status, err);
    });
}

void Engine::allocate() {
    const size_t P = layout_.part_size();
    stage_->bind(&layout_, part_, dp_.get(), sp_.get(), &timers_);
    stage_->allocate(); // the collective (shared) allocations first
    if (dtype_ == DSM_FLOAT32) {
        master_ = static_cast<float *>(stage_->param_partition());
    } else {
        master_own_ = HostBuffer(P * sizeof(float));
        master_ = static_cast<float *>(master_own_.data());
        grad32_ = HostBuffer(P * sizeof(float));
    }
    optimizer_ = std::make_unique<optim::Optimizer>(optim::hyper_from_config(cfg_.optimizer), P);
    for (Param &p : params_)
        if (!p.trainable) p.frozen = HostBuffer(p.numel * esize_);
}

void Engine::initialize_values(const dsm_param_desc_t *params) {
    // The first rank decides, per parameter, where the values come from:
    // 0 zeros, 1 its init_values (broadcast), 2 every rank's init_fn.
    const int n = num_params();
    std::vector<int> mode(static_cast<size_t>(n), 0);
    if (world_rank_ == 0)
        for (int i = 0; i < n; ++i)
            mode[static_cast<size_t>(i)] = params[i].init_values ? 1 : params[i].init_fn ? 2 : 0;
    DSM_CHECK_MPI(MPI_Bcast(mode.data(), n, MPI_INT, 0, world_));
    agree(world_, [&] {
        for (int i = 0; i < n; ++i)
            DSM_REQUIRE(mode[static_cast<size_t>(i)] != 2 || params[i].init_fn != nullptr,
                        DSM_ERR_INVALID_ARGUMENT, "params[", i, "] '", params[i].name,
                        "': init_fn is NULL here but the first rank initializes it with init_fn");
    });

    const size_t pb = layout_.part_begin(part_), pe = pb + layout_.part_size();
    std::string failure;
    for (int i = 0; i < n && failure.empty(); ++i) {
        Param &p = params_[static_cast<size_t>(i)];
        const int m = mode[static_cast<size_t>(i)];
        if (m == 1) {
            // Broadcast as fp32, then keep what this rank stores.
            std::vector<float> full(p.numel);
            if (world_rank_ == 0) amp::convert(params[i].init_values, params[i].dtype, full.data(), DSM_FLOAT32, p.numel);
            const size_t chunk = size_t(1) << 28;
            for (size_t off = 0; off < p.numel; off += chunk)
                DSM_CHECK_MPI(MPI_Bcast(full.data() + off, static_cast<int>(std::min(chunk, p.numel - off)),
                                        MPI_FLOAT, 0, world_));
            if (!p.trainable) {
                amp::convert(full.data(), DSM_FLOAT32, p.frozen.data(), dtype_, p.numel);
                continue;
            }
            for (const auto &pc : layout_.param_pieces(i))
                if (pc.part == part_)
                    std::memcpy(master_ + (pc.flat_offset - pb), full.data() + pc.param_offset, pc.count * sizeof(float));
        } else if (m == 2) {
            auto call = [&](size_t off, size_t count, float *dst) {
                if (failure.empty() && params[i].init_fn(params[i].init_user_data, i, params[i].name,
                                                         static_cast<int64_t>(off), static_cast<int64_t>(count), dst) != 0)
                    failure = cat("params[", i, "] '", p.name, "': init_fn returned an error for elements [",
                                  off, ", ", off + count, ")");
            };
            if (!p.trainable) {
                std::vector<float> full(p.numel);
                call(0, p.numel, full.data());
                amp::convert(full.data(), DSM_FLOAT32, p.frozen.data(), dtype_, p.numel);
                continue;
            }
            for (const auto &pc : layout_.param_pieces(i))
                if (pc.part == part_) call(pc.param_offset, pc.count, master_ + (pc.flat_offset - pb));
        }
        (void)pe;
    }
    agree(world_, [&] { DSM_REQUIRE(failure.empty(), DSM_ERR_INVALID_ARGUMENT, failure); });
    publish();
}

// ---------------------------------------------------------------- access

void Engine::check_usable() const {
    DSM_REQUIRE(!closed_, DSM_ERR_STATE, "the engine is closed");
    DSM_REQUIRE(!broken_, DSM_ERR_STATE,
                "a collective engine call failed earlier; the engine can only be freed");
}

Param &Engine::param(int index, const char *what) {
    check_usable();
    DSM_REQUIRE(index >= 0 && index < num_params(), DSM_ERR_INVALID_ARGUMENT, what, ": parameter index ",
                index, " is out of range 0..", num_params() - 1);
    return params_[static_cast<size_t>(index)];
}

int Engine::param_index(const char *name) const {
    DSM_ARG_NOT_NULL(name);
    for (size_t i = 0; i < params_.size(); ++i)
        if (params_[i].name == name) return static_cast<int>(i);
    DSM_FAIL(DSM_ERR_NOT_FOUND, "no parameter is named '", name, "'");
}

size_t Engine::numel(int index) const {
    DSM_REQUIRE(index >= 0 && index < num_params(), DSM_ERR_INVALID_ARGUMENT, "parameter index ", index,
                " is out of range 0..", num_params() - 1);
    return params_[static_cast<size_t>(index)].numel;
}

// ZeRO-Offload with pin_memory: page-lock the host parameters the device
// copies are refreshed from, so that those copies run by DMA while the user
// computes. Where the driver refuses, the copies go through its staging (the
// host waits for that part): a note in the log, not an error.
void Engine::pin_offload() {
    const bool pin = cfg_.zero.offload_optimizer.pin_memory || cfg_.zero.offload_param.pin_memory;
    size_t bytes = 0;
    void *whole = stage_->whole_params(&bytes);
    if (!pin || whole == nullptr) return;
    std::string why;
    if (!mirror_->pin(whole, bytes, why))
        DSM_INFO(ENGINE, "offload pin_memory: the parameters stay in pageable memory: %s", why.c_str());
}

// How long the offload's device copy of a parameter stays valid: a frozen
// parameter changes only at a checkpoint load, a kept trainable one at each
// step; a ZeRO-3 gather is copied at each acquire.
DeviceMirror::Keep Engine::mirror_keep(const Param &p) {
    if (!p.trainable) return DeviceMirror::Keep::LOAD;
    return p.persistent ? DeviceMirror::Keep::STEP : DeviceMirror::Keep::NONE;
}

const void *Engine::param_acquire(int index) {
    Param &p = param(index, "param_acquire");
    DSM_REQUIRE(!p.param_acquired, DSM_ERR_STATE, "parameter '", p.name, "' is already acquired");
    const void *values = p.frozen.data();
    if (p.trainable) {
        try {
            values = stage_->acquire_param(index, at_point(SyncPoint::GATHER));
        } catch (...) {
            broken_ = true;
            throw;
        }
    }
    if (mirror_) values = mirror_->param(index, values, p.numel, mirror_keep(p));
    p.param_acquired = true;
    return values;
}

void Engine::param_release(int index) {
    Param &p = param(index, "param_release");
    DSM_REQUIRE(p.param_acquired, DSM_ERR_STATE, "parameter '", p.name, "' is not acquired");
    p.param_acquired = false;
    if (mirror_) mirror_->param_release(index, mirror_keep(p));
    if (p.trainable) stage_->release_param(index);
}

void *Engine::grad_acquire(int index) {
    Param &p = param(index, "grad_acquire");
    DSM_REQUIRE(p.trainable, DSM_ERR_INVALID_ARGUMENT, "parameter '", p.name,
                "' is frozen (trainable = 0): it has no gradient");
    DSM_REQUIRE(!p.grad_acquired, DSM_ERR_STATE, "the gradient of '", p.name, "' is already acquired");
    void *g = stage_->acquire_grad(index);
    if (mirror_) g = mirror_->grad(index, g, p.numel);
    p.grad_acquired = true;
    return g;
}

void Engine::grad_release(int index) {
    Param &p = param(index, "grad_release");
    DSM_REQUIRE(p.grad_acquired, DSM_ERR_STATE, "the gradient of '", p.name, "' is not acquired");
    if (mirror_) mirror_->grad_release(index); // into the host gradient the engine gave
    p.grad_acquired = false;
    try {
        stage_->release_grad(index, at_point(SyncPoint::FLUSH));
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
    if (!broken_) {
        try {
            sync(SyncPoint::FREE, 0);
        } catch (...) {
            broken_ = true;
            closed_ = true;
            release(true);
            throw;
        }
    }
    closed_ = true;
    release(broken_);
}

void Engine::release(bool abandon) {
    if (abandon) {
        if (sp_) sp_->abandon();
        if (dp_) dp_->abandon();
    }
    mirror_.reset();
    if (stage_) stage_->free(); // shared buffers: collective, in reverse order of allocation
    sp_.reset();
    dp_.reset();
    if (abandon) { // MPI_Comm_free is collective too
        (void)sp_comm_.release();
        (void)dp_comm_.release();
        (void)world_comm_.release();
    }
    int rc1 = sp_comm_.reset(), rc2 = dp_comm_.reset();
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

// ---------------------------------------------------------------- describe

uint64_t Engine::bytes_sent() const noexcept {
    return (dp_ ? dp_->stats().bytes_sent : 0) + (sp_ ? sp_->stats().bytes_sent : 0);
}

double Engine::zero_formula_bytes_per_param() const {
    // The ZeRO paper's bytes per parameter: K = 12 for fp16 with fp32 Adam
    // (master 4 + two moments 8); with fp32 the master is the parameter.
    const double dp = dp_size_;
    const int nstate = optim::state_count(cfg_.optimizer.type);
    const double pw = static_cast<double>(esize_);
    const double K = (dtype_ == DSM_FLOAT32 ? 0.0 : 4.0) + 4.0 * nstate;
    return stage_->formula(pw, K, dp);
}

size_t Engine::model_state_bytes() const {
    const zero::StageMemory m = stage_->memory();
    return m.params + m.grads + master_own_.bytes() +
           optimizer_->size() * sizeof(float) * static_cast<size_t>(optimizer_->num_states());
}

std::string Engine::describe(dsm_format_t format) const {
    DSM_REQUIRE(format == DSM_FORMAT_TEXT || format == DSM_FORMAT_JSON, DSM_ERR_INVALID_ARGUMENT, "format ",
                static_cast<int>(format), " is not DSM_FORMAT_TEXT or DSM_FORMAT_JSON");
    using nlohmann::json;
    const double N = static_cast<double>(layout_.used());
    const double formula = zero_formula_bytes_per_param();
    json buffers = json::object();
    auto add = [&](const char *name, size_t bytes) {
        if (bytes) buffers[name] = bytes;
    };
    const zero::StageMemory m = stage_->memory();
    add("parameters", m.params);
    add("gradients", m.grads);
    add("master_weights", master_own_.bytes());
    add("optimizer_state", optimizer_->size() * sizeof(float) * static_cast<size_t>(optimizer_->num_states()));
    add("fp32_gradient_scratch", grad32_.bytes());
    add("reduction_buckets", m.buckets);
    size_t frozen = 0;
    for (const Param &p : params_) frozen += p.frozen.bytes();
    add("frozen_parameters", frozen);
    add("gathered_and_staging", m.live); // gathered parameters and gradient staging held now
    add("idle_reuse_pool", m.idle);
    const size_t model_state = model_state_bytes();
    size_t total = 0;
    for (auto &kv : buffers.items()) total += kv.value().get<size_t>();
    json j = {
        {"format", "dsm-engine"},
        {"format_version", 1},
        {"zero_stage", stage_->number()},
        {"compute_dtype", dtype_name(dtype_)},
        {"communication_dtype", dtype_name(comm_dtype_)},
        {"optimizer", config::optimizer_name(cfg_.optimizer.type)},
        {"optimizer_isa", optim::active_isa()},
        {"backend", dp_->name()},
        {"data_parallel_size", dp_size_},
        {"sequence_parallel_size", sp_size_},
        {"parameters", num_params()},
        {"trainable_elements", layout_.used()},
        {"flat_elements", layout_.total()},
        {"partition_elements", layout_.part_size()},
        {"partition", part_},
        {"memory",
         {{"buffers", buffers},
          {"model_state_bytes", model_state},
          {"total_bytes", total},
          {"bytes_per_parameter", N > 0 ? static_cast<double>(model_state) / N : 0.0},
          {"zero_formula_bytes_per_parameter", formula}}},
        {"communication",
         {{"bytes_sent", bytes_sent()},
          {"bytes_off_node", dp_->stats().bytes_off_node + (sp_ ? sp_->stats().bytes_off_node : 0)},
          {"calls", dp_->stats().calls + (sp_ ? sp_->stats().calls : 0)}}},
        {"timers_seconds",
         {{"reduce", timers_.reduce}, {"optimizer", timers_.optimizer}, {"gather", timers_.gather}}},
    };
    if (mirror_)
        j["offload"] = {{"device", mirror_->memory().name()},
                        {"device_bytes", mirror_->device_bytes()},
                        {"pinned_host_bytes", mirror_->pinned_bytes()},
                        {"param_copies_at_acquire", mirror_->copies_at_acquire()},
                        {"param_copies_after_step", mirror_->copies_refreshed()}};
    if (format == DSM_FORMAT_JSON) return j.dump() + "\n";
    std::ostringstream os;
    os << "engine: ZeRO stage " << stage_->number() << ", " << dtype_name(dtype_) << " compute, "
       << dtype_name(comm_dtype_) << " reductions, optimizer " << config::optimizer_name(cfg_.optimizer.type)
       << " (" << optim::active_isa() << "), backend " << dp_->name() << "\n";
    os << "ranks: " << dp_size_ << " data-parallel x " << sp_size_ << " sequence-parallel; partition " << part_
       << " of " << layout_.parts() << "\n";
    os << "parameters: " << num_params() << " (" << layout_.used() << " trainable elements, flat "
       << layout_.total() << ", partition " << layout_.part_size() << ")\n";
    if (mirror_)
        os << "offload: master weights and optimizer state in host memory; parameters and gradients on "
           << mirror_->memory().name() << " (" << mirror_->device_bytes() << " bytes now); "
           << mirror_->pinned_bytes() << " bytes of host parameters page-locked\n";
    os << "memory on this rank:\n";
    for (auto &kv : buffers.items()) os << "  " << kv.key() << ": " << kv.value().get<size_t>() << " bytes\n";
    char line[160];
    std::snprintf(line, sizeof line, "  model state: %.2f bytes per parameter (ZeRO formula %.2f)\n",
                  N > 0 ? static_cast<double>(model_state) / N : 0.0, formula);
    os << line;
    return os.str();
}

} // namespace engine
} // namespace dsm
