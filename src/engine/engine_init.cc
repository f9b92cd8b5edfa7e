// The engine's creation steps that touch every parameter: the argument
// checks, the memory space and the backends, the buffers (the ZeRO stage's,
// then the master weights and the optimizer state), with the fall-back to the
// mpi backend when /dev/shm is too small, and the initial values.
#include "dsm_config.h"

#include "engine/engine.hpp"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <string>
#include <vector>

#include "amp/convert.hpp"
#include "config/settings.hpp"
#include "core/agree.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/param.hpp"
#include "comm/nccl_backend.hpp"
#include "cuda/device.hpp"

namespace dsm {
namespace engine {

namespace {

DSM_PARAM(engine, ENGINE_DEVICE, param::Choice({"auto", "host", "cuda", "sim"}), "auto",
          "Where an engine keeps the model state when dsm_engine_options_t.device is DSM_DEVICE_DEFAULT "
          "(and for dsm_engine_init): auto, host, cuda or sim. auto: cuda (device-resident training: "
          "parameters, gradients, master weights and optimizer state in GPU memory, collectives on NCCL) "
          "when NCCL is built, every rank has a GPU of its own and no ZeRO-Offload is configured, else host. "
          "sim: the device-resident engine on a simulated device (host memory with a deferred queue), "
          "for testing the device paths without a GPU.");

constexpr int kMaxParams = 1000000;
constexpr size_t kMaxNameLength = 255;

bool init_dtype_ok(dsm_dtype_t t) {
    return t == DSM_FLOAT32 || t == DSM_FLOAT64 || t == DSM_FLOAT16 ||
           t == DSM_BFLOAT16;
}

} // namespace

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
    int trainable = 0;
    for (int i = 0; i < nparams; ++i) trainable += params[i].trainable;
    DSM_REQUIRE(trainable > 0, DSM_ERR_INVALID_ARGUMENT, "every parameter is frozen (trainable = 0 in all ", nparams,
                "): the engine has nothing to train (a zeroed dsm_param_desc_t is frozen; "
                "DSM_PARAM_DESC_INITIALIZER makes one trainable)");
    std::vector<std::string> sorted = names;
    std::sort(sorted.begin(), sorted.end());
    auto dup = std::adjacent_find(sorted.begin(), sorted.end());
    DSM_REQUIRE(dup == sorted.end(), DSM_ERR_INVALID_ARGUMENT, "parameter name '",
                dup == sorted.end() ? "" : *dup, "' is used twice");
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
                      : 0;
    const int any = comm::allreduce_int(*control_, no_room, comm::Op::MAX);
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
        if (hpz_ && std::strcmp(hpz_->name(), "shm") == 0) { // its windows would not fit either
            hpz_.reset();
            hpz_ = comm::create_backend(hpz_comm_.get(), comm::Kind::MPI, node);
        }
        attempt();
    }
    agree(world_, [&] {
        if (status != DSM_SUCCESS) DSM_FAIL(status, err);
    });
}

// overlap_comm: a progress thread where the stage's memory is the host's and
// MPI allows calls from two threads at once; else the collectives wait for
// the next point that needs them (the same results, no overlap).
static comm::Pipeline::Mode overlap_mode(bool overlap, const device::Space &space) {
    if (!overlap) return comm::Pipeline::Mode::INLINE;
    int level = MPI_THREAD_SINGLE;
    DSM_CHECK_MPI(MPI_Query_thread(&level));
    return level == MPI_THREAD_MULTIPLE && space.kind() == device::Kind::HOST ? comm::Pipeline::Mode::THREAD
                                                                               : comm::Pipeline::Mode::DEFERRED;
}

void Engine::allocate() {
    const size_t P = layout_.part_size();
    stage_->set_overlap(overlap_mode(cfg_.zero.overlap_comm, *space_));
    stage_->bind(&layout_, part_, dp_.get(), sp_.get(), space_, math_.get(), &timers_);
    stage_->bind_hpz(hpz_.get());
    stage_->allocate(); // the collective (shared) allocations first
    if (dtype_ == DSM_FLOAT32) {
        master_ = static_cast<float *>(stage_->param_partition());
    } else {
        master_own_ = Buffer(*space_, P * sizeof(float));
        master_ = static_cast<float *>(master_own_.data());
        grad32_ = Buffer(*space_, P * sizeof(float));
    }
    optimizer_ = std::make_unique<optim::Optimizer>(config::optimizer_hyper(cfg_.optimizer), P, *space_);
    for (Param &p : params_)
        if (!p.trainable) p.frozen = Buffer(*space_, p.numel * esize_);
}

// ---------------------------------------------------------------- the space

namespace {

const char *device_word(dsm_device_t d) {
    switch (d) {
    case DSM_DEVICE_HOST: return "host";
    case DSM_DEVICE_CUDA: return "cuda";
    case DSM_DEVICE_SIMULATED: return "sim";
    default: return "auto";
    }
}

} // namespace

// The space of the model state: the options' device, else DSM_ENGINE_DEVICE;
// auto is device-resident on CUDA when NCCL is built, every rank has a GPU
// of its own (no two ranks of a node share one) and nothing is offloaded. Agreed: every rank makes the same choice or
// fails with the same error.
void Engine::choose_space(const Options &options) {
    dsm_device_t want = options.device;
    agree(world_, [&] {
        if (want != DSM_DEVICE_DEFAULT) return;
        const std::string v = param_ENGINE_DEVICE().value();
        want = v == "host" ? DSM_DEVICE_HOST : v == "cuda" ? DSM_DEVICE_CUDA : v == "sim" ? DSM_DEVICE_SIMULATED
                                                                                        : DSM_DEVICE_DEFAULT;
    });
    const std::string from = options.device != DSM_DEVICE_DEFAULT ? "dsm_engine_options_t.device" : "DSM_ENGINE_DEVICE";
    agree_same(world_, from, device_word(want));
    if (want == DSM_DEVICE_DEFAULT) {
        std::string why;
        // The device-resident engine needs the CUDA kernels and NCCL built.
        const cuda::DeviceHint hint = DSM_HAVE_CUDA_KERNELS && comm::nccl_built() ? cuda::mesh_hint(*mesh_)
                                                                                 : cuda::DeviceHint{};
        const bool gpus = DSM_HAVE_CUDA_KERNELS && comm::nccl_built() &&
                          comm::every_rank_has_its_own_device(world_, &hint, &why);
        if (!gpus && DSM_HAVE_CUDA_KERNELS && comm::nccl_built())
            DSM_INFO(INIT, "engine: model state on the host (%s)", why.c_str());
        want = gpus && !offloads(cfg_) ? DSM_DEVICE_CUDA : DSM_DEVICE_HOST;
    }
    agree(world_, [&] {
        DSM_REQUIRE(want == DSM_DEVICE_HOST || !offloads(cfg_), DSM_ERR_CONFIG, from, " ", device_word(want),
                    ": device-resident training keeps the master weights and optimizer state on the device, and "
                    "zero_optimization offloads them to the CPU (choose one: device host with offload, or no "
                    "offload)");
        if (want == DSM_DEVICE_SIMULATED) own_space_ = device::make_sim();
        if (want == DSM_DEVICE_CUDA) {
            try {
                // The device is made current: the engine's kernels launch on it.
                int dev = options.cuda_device;
                if (dev >= 0) {
                    const cuda::DeviceCount dc = cuda::device_count();
                    DSM_REQUIRE(dc.count > 0, DSM_ERR_NOT_SUPPORTED, "no CUDA device is usable: ", dc.reason);
                    DSM_REQUIRE(dev < dc.count, DSM_ERR_INVALID_ARGUMENT, "options->cuda_device is ", dev,
                                " and this rank sees ", dc.count, " CUDA devices");
                    cuda::set_device(dev);
                } else {
                    dev = cuda::use_device(cuda::mesh_hint(*mesh_));
                }
                own_space_ = device::make_cuda(dev);
            } catch (const Error &e) {
                DSM_FAIL(e.status(), from, " cuda: ", e.message());
            }
        }
    });
    if (own_space_) space_ = own_space_.get();
    math_ = amp::make_math(*space_);
}

// The backends of the data-parallel and sequence-parallel groups for the
// space's memory. NCCL communicators come from one communicator over the
// engine's ranks, split per mesh dimension (ncclCommSplit).
namespace {

// The kind the options ask for, in `kind`; NULL for DSM_BACKEND_DEFAULT
// (make_backend() reads DSM_COMM_BACKEND).
const comm::Kind *backend_choice(const Options &options, comm::Kind &kind) {
    switch (options.backend) {
    case DSM_BACKEND_AUTO: kind = comm::Kind::AUTO; return &kind;
    case DSM_BACKEND_MPI: kind = comm::Kind::MPI; return &kind;
    case DSM_BACKEND_SHM: kind = comm::Kind::SHM; return &kind;
    case DSM_BACKEND_NCCL: kind = comm::Kind::NCCL; return &kind;
    default: return nullptr;
    }
}

} // namespace

// The engine's groups as the watchdog's messages name them (a backend made
// by an nccl split is described here).
void Engine::name_groups() {
    const auto name = [](comm::Backend *b, const char *label) {
        if (b == nullptr) return;
        if (b->watch().world.empty())
            b->watch().describe(b->comm(), label, b->name());
        else
            b->watch().label = label;
    };
    name(dp_.get(), "data_parallel");
    name(sp_.get(), "sequence_parallel");
    name(hpz_.get(), "hpZ secondary partition group");
}

void Engine::make_backends(const Options &options) {
    const int node = mesh_->node();
    comm::Kind kind = comm::Kind::AUTO;
    const comm::Kind *choice = backend_choice(options, kind);
    const comm::Space cs = space_->host_addressable() ? comm::Space::HOST : comm::Space::DEVICE;
#if DSM_HAVE_NCCL_BACKEND
    if (cs == comm::Space::DEVICE) {
        std::unique_ptr<comm::Backend> all = comm::make_backend(world_, cs, node, choice);
        if (auto *nccl = dynamic_cast<comm::NcclBackend *>(all.get())) {
            int spr = 0;
            DSM_CHECK_MPI(MPI_Comm_rank(sp_comm_.get(), &spr));
            // The data-parallel group: the ranks at this sequence-parallel
            // position; the sequence-parallel group: those at this
            // data-parallel position.
            dp_ = nccl->split(spr, dp_rank_);
            if (sp_size_ > 1) sp_ = nccl->split(dp_rank_, spr);
            world_backend_ = std::move(all);
            return;
        }
    }
#endif
    dp_ = comm::make_backend(dp_comm_.get(), cs, node, choice);
    if (sp_size_ > 1) sp_ = comm::make_backend(sp_comm_.get(), cs, node, choice);
}

// ZeRO++ hpZ: the secondary partition groups, zero_hpz_partition_size
// consecutive data-parallel ranks each (as DeepSpeed's
// _create_zero_param_parallel_group makes them), with a backend for the
// space's memory; and which groups stay inside a node (their bytes are not
// counted off the node). A group that spans nodes works (the same values)
// but its gathers cross the network: a warning says so, once.
void Engine::make_hpz_group(const Options &options) {
    const int node = mesh_->node();
    int spr = 0;
    DSM_CHECK_MPI(MPI_Comm_rank(sp_comm_.get(), &spr));
    // Every rank's node and place (its sequence-parallel and data-parallel
    // ranks), in one allgather over the engine's ranks: a data-parallel group
    // is the ranks at one sequence-parallel position, a sequence-parallel
    // group those at one data-parallel position (make_backends).
    const int32_t mine[3] = {node, spr, dp_rank_};
    std::vector<int32_t> all(3 * static_cast<size_t>(world_size_));
    control_->allgather(mine, all.data(), 3, DSM_INT32);
    // Whether every rank whose key is this rank's is on this rank's node.
    const auto one_node = [&](const std::function<int64_t(int, int)> &key) {
        const int64_t k = key(spr, dp_rank_);
        for (size_t r = 0; r < all.size(); r += 3)
            if (key(all[r + 1], all[r + 2]) == k && all[r] != node) return false;
        return true;
    };
    dp_one_node_ = one_node([](int s, int) { return s; });
    sp_one_node_ = one_node([](int, int d) { return d; });
    hpz_size_ = cfg_.zero.stage == 3 ? static_cast<int>(std::max<int64_t>(cfg_.zero.zero_hpz_partition_size, 1)) : 1;
    if (hpz_size_ <= 1) return;
    const int color = dp_rank_ / hpz_size_;
    hpz_comm_ = Comm::split(dp_comm_.get(), color, dp_rank_);
    hpz_one_node_ = one_node([this](int s, int d) { return int64_t(s) * (int64_t(INT32_MAX) + 1) + d / hpz_size_; });
#if DSM_HAVE_NCCL_BACKEND
    if (auto *nccl = dynamic_cast<comm::NcclBackend *>(world_backend_.get())) {
        // One color per group over the engine's ranks: its sequence-parallel
        // position and its block of data-parallel ranks.
        hpz_ = nccl->split(spr * (dp_size_ / hpz_size_) + color, dp_rank_);
    }
#endif
    if (!hpz_) {
        comm::Kind kind = comm::Kind::AUTO;
        const comm::Space cs = space_->host_addressable() ? comm::Space::HOST : comm::Space::DEVICE;
        hpz_ = comm::make_backend(hpz_comm_.get(), cs, node, backend_choice(options, kind));
    }
    const MeshState &m = mesh_->state();
    const int spans = comm::allreduce_int(*control_, hpz_one_node_ ? 0 : 1, comm::Op::MAX);
    const int fewest = comm::allreduce_int(*control_, m.ranks[static_cast<size_t>(m.rank)].local_size, comm::Op::MIN);
    if (spans != 0 && world_rank_ == 0)
        DSM_WARN(INIT, "zero_optimization.zero_hpz_partition_size %d: a secondary partition group spans nodes (%d "
                 "consecutive data-parallel ranks; a node holds %d of the engine's ranks), so hpZ's gathers cross "
                 "the network; use the number of data-parallel ranks per node",
                 hpz_size_, hpz_size_, fewest);
}

// A frozen parameter's values (compute dtype, in the space) from and to fp32.
void Engine::put_frozen(Param &p, const float *fp32) {
    if (space_->kind() == device::Kind::HOST) {
        amp::convert(fp32, DSM_FLOAT32, p.frozen.data(), dtype_, p.numel);
        return;
    }
    std::vector<unsigned char> tmp(p.numel * esize_);
    amp::convert(fp32, DSM_FLOAT32, tmp.data(), dtype_, p.numel);
    space_->upload(p.frozen.data(), tmp.data(), tmp.size());
}

void Engine::get_frozen(const Param &p, float *fp32) {
    std::vector<unsigned char> tmp(p.numel * esize_);
    space_->download(tmp.data(), p.frozen.data(), tmp.size());
    amp::convert(tmp.data(), dtype_, fp32, DSM_FLOAT32, p.numel);
}

void Engine::initialize_values(const dsm_param_desc_t *params) {
    // The first rank decides, per parameter, where the values come from:
    // 0 zeros, 1 its init_values (broadcast), 2 every rank's init_fn.
    const int n = num_params();
    std::vector<int> mode(static_cast<size_t>(n), 0);
    if (world_rank_ == 0)
        for (int i = 0; i < n; ++i)
            mode[static_cast<size_t>(i)] = params[i].init_values ? 1 : params[i].init_fn ? 2 : 0;
    static_assert(sizeof(int) == sizeof(int32_t), "mode travels as DSM_INT32");
    control_->bcast(mode.data(), mode.size(), DSM_INT32, 0);
    agree(world_, [&] {
        for (int i = 0; i < n; ++i)
            DSM_REQUIRE(mode[static_cast<size_t>(i)] != 2 || params[i].init_fn != nullptr,
                        DSM_ERR_INVALID_ARGUMENT, "params[", i, "] '", params[i].name,
                        "': init_fn is NULL here but the first rank initializes it with init_fn");
    });

    const size_t pb = layout_.part_begin(part_);
    // The values are written on the host: into the master weights there,
    // else into a staging copy uploaded at the end.
    const bool direct = space_->kind() == device::Kind::HOST;
    std::vector<float> staged(direct ? 0 : layout_.part_size(), 0.0f);
    float *master = direct ? master_ : staged.data();
    std::string failure;
    for (int i = 0; i < n && failure.empty(); ++i) {
        Param &p = params_[static_cast<size_t>(i)];
        const int m = mode[static_cast<size_t>(i)];
        if (m == 1) {
            // Broadcast as fp32, then keep what this rank stores.
            std::vector<float> full(p.numel);
            if (world_rank_ == 0) amp::convert(params[i].init_values, params[i].dtype, full.data(), DSM_FLOAT32, p.numel);
            control_->bcast(full.data(), p.numel, DSM_FLOAT32, 0);
            if (!p.trainable) {
                put_frozen(p, full.data());
                continue;
            }
            for (const auto &pc : layout_.param_pieces(i))
                if (pc.part == part_)
                    std::memcpy(master + (pc.flat_offset - pb), full.data() + pc.param_offset, pc.count * sizeof(float));
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
                put_frozen(p, full.data());
                continue;
            }
            for (const auto &pc : layout_.param_pieces(i))
                if (pc.part == part_) call(pc.param_offset, pc.count, master + (pc.flat_offset - pb));
        }
    }
    if (!direct) space_->upload(master_, staged.data(), staged.size() * sizeof(float));
    agree(world_, [&] { DSM_REQUIRE(failure.empty(), DSM_ERR_INVALID_ARGUMENT, failure); });
    publish();
}

} // namespace engine
} // namespace dsm

DSM_PARAM_LINK(engine_init)
