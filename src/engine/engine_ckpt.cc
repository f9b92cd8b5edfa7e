// The engine's checkpoints: what each rank holds, described for the ckpt
// layer (doc/checkpoint.md), and the engine state around it.
#include "dsm_config.h"

#include "engine/engine.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <new>

#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "amp/convert.hpp"
#include "ckpt/safetensors.hpp"
#include "core/agree.hpp"
#include "core/hash.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "dsm_version.h"


namespace dsm {
namespace engine {

#if DSM_HAVE_HDF5

namespace {

// The micro-step counter a load resumes from (doc/checkpoint.md, "Resuming
// at another accumulation"). A checkpoint saved at an optimizer-step
// boundary of its own gradient_accumulation_steps (the only point a save
// accepts) resumes at any accumulation: the counter becomes global_steps x
// the engine's accumulation, so that the next window is whole and ends at
// a boundary, as after DeepSpeed's load (which starts micro_steps over).
// Under the same accumulation the saved counter is kept. A file off a
// boundary (written by other means) resumes only under its own
// accumulation: a mismatch naming both values. A config without the value
// (a file not written by libdsm) keeps the saved counter.
int64_t resumed_micro_steps(const ckpt::Attributes &a, const std::string &file, int64_t global, int64_t micro,
                            int64_t accumulation) {
    const nlohmann::json cfg = nlohmann::json::parse(a["config"].get<std::string>(), nullptr, false);
    const char *key = "gradient_accumulation_steps";
    if (!cfg.is_object() || !cfg.contains(key) || !cfg[key].is_number_integer() || cfg[key].get<int64_t>() < 1)
        return micro;
    const int64_t saved = cfg[key].get<int64_t>();
    if (saved == accumulation) return micro;
    DSM_REQUIRE(micro % saved == 0, DSM_ERR_MISMATCH, "checkpoint '", file, "' was saved at micro-step ", micro,
                ", inside an accumulation window of its gradient_accumulation_steps ", saved,
                " (not at an optimizer-step boundary): it resumes only with gradient_accumulation_steps ", saved,
                ", not ", accumulation);
    return global * accumulation;
}

// The fp32 values of `tensors` in MB (the whole tensors, every rank's pieces).
double tensor_megabytes(const std::vector<ckpt::Tensor> &tensors) {
    double bytes = 0;
    for (const ckpt::Tensor &t : tensors) {
        double n = 4;
        for (int64_t d : t.shape) n *= static_cast<double>(d);
        bytes += n;
    }
    return bytes / 1e6;
}

// Rank 0's end line of a save or load: the file's size, the time, the rate.
void log_done(const char *did, const std::string &dir, const std::string &tag, double seconds) {
    const std::string path = dir + "/" + tag + ".h5";
    struct stat st;
    const double bytes = ::stat(path.c_str(), &st) == 0 ? static_cast<double>(st.st_size) : 0.0;
    DSM_INFO(ENGINE, "%s checkpoint '%s': %.1f MB in %.2f s (%.2f GB/s)", did, path.c_str(), bytes / 1e6, seconds,
             seconds > 0 ? bytes / seconds / 1e9 : 0.0);
}

// Run `prepare` (local allocations) on every rank, then agree: a rank out
// of memory fails every rank here instead of leaving the others waiting in
// the checkpoint's collective I/O.
void agree_prepared(MPI_Comm comm, const char *what, const std::function<void()> &prepare) {
    agree(comm, [&] {
        try {
            prepare();
        } catch (const std::bad_alloc &) {
            DSM_FAIL(DSM_ERR_OUT_OF_MEMORY, "cannot allocate ", what);
        }
    });
}

} // namespace

// What this rank holds of every tensor of the file: its piece of each
// trainable parameter's master weights and optimizer states (the owner of a
// piece is the first rank of its sequence-parallel group, and under ZeRO-0,
// where every rank holds everything, data-parallel rank 0 only), and the
// frozen parameters (owned by rank 0). Save (`live` NULL): `buffers` keeps the
// fp32 copies of the frozen parameters alive. Load: `buffers` holds a buffer
// for every piece in place of the engine's memory, and `live` gets, for each
// tensor, the engine's memory the piece belongs in (NULL for a frozen
// parameter, which is converted to the compute dtype instead).
// A load with `in_place` (ckpt::load, which changes a tensor only once
// every rank verified every checksum) reads the master weights and the
// optimizer states straight into the engine's host memory; otherwise, and
// for frozen parameters (converted by put_frozen), into staging buffers.
std::vector<ckpt::Tensor> Engine::checkpoint_tensors(bool with_optimizer, std::vector<std::unique_ptr<float[]>> &buffers,
                                                     std::vector<float *> *live, const std::vector<float *> *bases,
                                                     bool in_place) {
    // Where the pieces are read from (a save from device memory: host copies).
    auto base = [&](size_t k) { return bases != nullptr ? (*bases)[k] : k == 0 ? master_ : optimizer_->state(static_cast<int>(k - 1)); };
    const bool own_buffers = live != nullptr;
    std::vector<ckpt::Tensor> out;
    const int sp_rank = sp_ ? sp_->rank() : 0;
    const bool owner = sp_rank == 0 && (layout_.parts() > 1 || dp_rank_ == 0);
    const size_t pb = layout_.part_begin(part_);
    auto piece_of = [&](int i, ckpt::Tensor &t, float *base) {
        for (const auto &pc : layout_.param_pieces(i))
            if (pc.part == part_) {
                t.offset = pc.param_offset;
                t.count = pc.count;
                t.data = base + (pc.flat_offset - pb);
            }
    };
    auto add = [&](ckpt::Tensor t) {
        if (own_buffers) live->push_back(t.data);
        const bool direct = in_place && (t.group != "params" || t.trainable);
        if (own_buffers && t.count && !direct) {
            // load: the file's values land here first (not zeroed: all read)
            buffers.emplace_back(new float[t.count]);
            t.data = buffers.back().get();
        }
        out.push_back(std::move(t));
    };
    buffers.reserve(params_.size() * (1 + static_cast<size_t>(optimizer_->num_states())));
    for (int i = 0; i < num_params(); ++i) {
        const Param &p = params_[static_cast<size_t>(i)];
        ckpt::Tensor t;
        t.group = "params";
        t.name = p.name;
        t.shape = p.shape;
        t.trainable = p.trainable;
        if (p.trainable) {
            piece_of(i, t, base(0));
            t.owner = owner;
        } else {
            t.owner = world_rank_ == 0;
            t.offset = 0;
            t.count = p.numel;
            if (!own_buffers) { // save: the fp32 values of the frozen parameter
                buffers.emplace_back(new float[p.numel]);
                get_frozen(p, buffers.back().get());
                t.data = buffers.back().get();
            }
        }
        add(std::move(t));
    }
    if (!with_optimizer) return out;
    for (int s = 0; s < optimizer_->num_states(); ++s) {
        const std::string group = std::string("optimizer/") + optim::state_name(cfg_.optimizer.type, s);
        for (int i = 0; i < num_params(); ++i) {
            const Param &p = params_[static_cast<size_t>(i)];
            if (!p.trainable) continue;
            ckpt::Tensor t;
            t.group = group;
            t.name = p.name;
            t.shape = p.shape;
            piece_of(i, t, base(1 + static_cast<size_t>(s)));
            t.owner = owner;
            add(std::move(t));
        }
    }
    return out;
}

// The master weights and each optimizer state, readable on the host: the
// engine's own memory there; from a device, copies in the space's staging
// memory (page-locked for CUDA), one download each.
std::vector<float *> Engine::host_state(std::vector<std::unique_ptr<device::Staging>> &hold) {
    std::vector<float *> out{master_};
    for (int s = 0; s < optimizer_->num_states(); ++s) out.push_back(optimizer_->state(s));
    if (space_->kind() == device::Kind::HOST) return out;
    const size_t bytes = layout_.part_size() * sizeof(float);
    for (float *&p : out) {
        hold.push_back(std::make_unique<device::Staging>(*space_, bytes));
        space_->download(hold.back()->data(), p, bytes);
        p = static_cast<float *>(hold.back()->data());
    }
    return out;
}

std::vector<float *> Engine::snapshot_state(std::vector<std::unique_ptr<float[]>> &own) {
    std::vector<float *> out{master_};
    for (int s = 0; s < optimizer_->num_states(); ++s) out.push_back(optimizer_->state(s));
    const size_t n = layout_.part_size();
    for (size_t k = 0; k < out.size(); ++k) {
        if (k < snapshot_spare_.size()) own.push_back(std::move(snapshot_spare_[k]));
        else own.emplace_back(new float[std::max<size_t>(n, 1)]);
        float *dst = own.back().get();
        const float *src = out[k];
        if (space_->kind() == device::Kind::HOST) {
            // Host memory: copied by every thread, in blocks (the copy is
            // what the step boundary waits for).
            const size_t block = size_t(1) << 18;
            const long blocks = static_cast<long>((n + block - 1) / block);
#pragma omp parallel for schedule(static) if (blocks > 1)
            for (long b = 0; b < blocks; ++b) {
                const size_t at = static_cast<size_t>(b) * block;
                std::memcpy(dst + at, src + at, std::min(block, n - at) * sizeof(float));
            }
        } else {
            space_->download(dst, src, n * sizeof(float));
        }
        out[k] = dst;
    }
    snapshot_spare_.clear();
    return out;
}

void Engine::finish_save(bool wait) {
    if (!saver_ || (!wait && !saves_done_)) return;
    std::unique_ptr<ckpt::BackgroundSave> s = std::move(saver_);
    s->wait(); // the save's error, agreed by every rank
    if (world_rank_ == 0) log_done("saved (in the background)", s->dir(), s->tag(), s->seconds());
    snapshot_spare_ = s->take_buffers();
    snapshot_spare_.resize(std::min(snapshot_spare_.size(), static_cast<size_t>(1 + optimizer_->num_states())));
    if (space_->kind() == device::Kind::HOST) snapshot_spare_ = s->take_copies(); // the double buffer

}

void Engine::checkpoint_wait() {
    check_usable();
    sync(SyncPoint::WAIT, 0);
    finish_save(true);
}

void Engine::check_checkpoint_point(SyncPoint point) {
    const char *what = sync_point_name(point);
    std::string why;
    dsm_status_t status = DSM_SUCCESS;
    for (const Param &p : params_) {
        const std::string held = p.held();
        if (!held.empty()) {
            status = DSM_ERR_STATE;
            why = cat(held, " is still acquired at ", what, " (release it first)");
            break;
        }
    }
    if (status == DSM_SUCCESS && micro_steps_ % cfg_.gradient_accumulation_steps != 0) {
        status = DSM_ERR_STATE;
        why = cat(what, " between accumulation boundaries (micro-step ", micro_steps_, ", ",
                  cfg_.gradient_accumulation_steps,
                  " per boundary): call it after the dsm_step() that ends a window");
    }
    drain_offload(status, why);
    sync(point, 0, why, status);
}

void Engine::save_checkpoint(const char *dir_arg, const char *tag_arg, const void *client, size_t client_size) {
    const watchdog::Context ctx("dsm_engine_save_checkpoint");
    check_usable();
    const std::string dir = dir_arg != nullptr ? dir_arg : "";
    std::string tag = tag_arg != nullptr ? tag_arg : cat("global_step", global_steps_);
    std::string why;
    dsm_status_t status = DSM_SUCCESS;
    try {
        stage_->settle(); // the collectives in flight (overlap_comm) read and write the state
        DSM_REQUIRE(dir_arg != nullptr, DSM_ERR_NULL_POINTER, "dir is NULL");
        DSM_REQUIRE(!dir.empty(), DSM_ERR_INVALID_ARGUMENT, "the checkpoint directory is empty");
        ckpt::check_tag(tag);
        DSM_REQUIRE(client != nullptr || client_size == 0, DSM_ERR_NULL_POINTER, "client_state is NULL but size is ",
                    client_size);
    } catch (const Error &e) {
        status = e.status();
        why = e.what();
    }
    try {
        sync(SyncPoint::SAVE, 0, why, status);
        finish_save(true); // the previous asynchronous save; its failure is this call's
        check_checkpoint_point(SyncPoint::SAVE);
        // Tag validation (DeepSpeed's checkpoint.tag_validation): every rank
        // should pass the same tag; rank 0's is used.
        // A rank whose tag differs from rank 0's "fails" this agreement; the
        // message names rank 0's tag and the first differing rank's.
        const std::string tag0 = bcast_string(world_, 0, tag);
        Agreement tags(world_);
        tags.run(tag0 == tag ? DSM_SUCCESS : DSM_ERR_MISMATCH);
        if (tags.failed()) {
            const int other = tags.failed_rank();
            const std::string theirs = bcast_string(world_, other, tag);
            const std::string sides = cat("rank 0 passed '", tag0, "', rank ", other, " passed '", theirs, "'");
            if (cfg_.checkpoint.tag_validation == config::TagValidation::FAIL)
                DSM_FAIL(DSM_ERR_MISMATCH, "the ranks passed different checkpoint tags (the tag argument): ", sides,
                         "; checkpoint.tag_validation is \"Fail\"");
            if (cfg_.checkpoint.tag_validation == config::TagValidation::WARN && world_rank_ == 0)
                DSM_WARN(ENGINE, "the ranks passed different checkpoint tags (%s); saving under rank 0's '%s'",
                         sides.c_str(), tag0.c_str());
        }
        tag = tag0;
        // The client state is rank 0's.
        uint64_t csize = client_size;
        comm::bcast_u64(*control_, &csize, 0);

        // checkpoint.writer.decoupled: the file is written by a thread of
        // the save while the caller goes on, which needs MPI calls from two
        // threads at once. Below MPI_THREAD_MULTIPLE the save is made here
        // (its collective steps could only run inside later engine calls,
        // which would then wait as long as this one).
        int background = 0;
        if (cfg_.checkpoint.decoupled) {
            int level = MPI_THREAD_SINGLE;
            DSM_CHECK_MPI(MPI_Query_thread(&level));
            background = level == MPI_THREAD_MULTIPLE;
            background = comm::allreduce_int(*control_, background, comm::Op::MIN);
            if (!background && !said_sync_fallback_ && world_rank_ == 0)
                DSM_WARN(ENGINE, "checkpoint.writer.decoupled: MPI was initialized below MPI_THREAD_MULTIPLE on some "
                                 "rank, so checkpoints are saved synchronously (MPI_Init_thread with "
                                 "MPI_THREAD_MULTIPLE writes them in the background)");
            said_sync_fallback_ = said_sync_fallback_ || !background;
        }
        const double start = MPI_Wtime();
        std::vector<std::unique_ptr<float[]>> frozen32;
        std::vector<std::unique_ptr<device::Staging>> staged;
        ckpt::Content content;
        // In host memory the asynchronous save's thread copies the live
        // state into a double buffer of the engine's (allocated here, kept
        // from save to save) and writes the file from it: the next dsm_step
        // waits only for that copy (BackgroundSave::wait_captured) before it
        // changes the state, and nothing is copied at the step boundary. A
        // device's state is copied to the host here.
        const bool live = background && space_->kind() == device::Kind::HOST;
        std::vector<ckpt::BackgroundSave::Region> regions;
        std::vector<std::unique_ptr<float[]>> copies;
        agree_prepared(world_,
                       background ? "the copy of the state that the asynchronous save writes"
                                  : "the fp32 copies of the frozen parameters to save",
                       [&] {
                           const std::vector<float *> bases =
                               background && !live ? snapshot_state(frozen32) : host_state(staged);
                           content.tensors = checkpoint_tensors(true, frozen32, nullptr, &bases);
                           if (!live) return;
                           const size_t n = layout_.part_size();
                           for (size_t k = 0; k < bases.size(); ++k) {
                               regions.push_back({bases[k], n});
                               if (k < snapshot_spare_.size() && snapshot_spare_[k]) copies.push_back(std::move(snapshot_spare_[k]));
                               else copies.emplace_back(new float[std::max<size_t>(n, 1)]);
                           }
                           snapshot_spare_.clear();
                       });
        const auto &lss = scaler_->state();
        const std::vector<int> shape = mesh_->shape();
        std::string names;
        for (const std::string &n : mesh_->dim_names()) names += (names.empty() ? "" : ",") + n;
        content.attrs = {
            {"format", ckpt::kFormat},
            {"format_version", ckpt::kFormatVersion},
            {"libdsm_version", DSM_VERSION_STRING},
            {"tag", tag},
            {"global_steps", global_steps_},
            {"micro_steps", micro_steps_},
            {"skipped_steps", skipped_steps_},
            {"global_samples", global_samples_},
            {"optimizer_steps", applied_steps_},
            {"loss_scale", lss.cur_scale},
            {"loss_scale_cur_iter", lss.cur_iter},
            {"loss_scale_last_overflow_iter", lss.last_overflow_iter},
            {"loss_scale_cur_hysteresis", lss.cur_hysteresis},
            {"lr_schedule_last_step", schedule_ ? schedule_->last_step() : int64_t(-1)},
            {"zero_stage", stage_->number()},
            {"data_parallel_size", dp_size_},
            {"sequence_parallel_size", sp_size_},
            {"mesh_shape", std::vector<int64_t>(shape.begin(), shape.end())},
            {"mesh_names", names},
            {"compute_dtype", dtype_name(dtype_)},
            {"optimizer", config::optimizer_name(cfg_.optimizer.type)},
            {"config", config::config_to_json(cfg_)},
        };
        if (world_rank_ == 0)
            DSM_INFO(ENGINE, "checkpoint save '%s/%s.h5': %zu tensors, %.1f MB of values, starting%s", dir.c_str(),
                     tag.c_str(), content.tensors.size(), tensor_megabytes(content.tensors),
                     background ? " in the background" : "");
        if (background) {
            std::vector<unsigned char> blob;
            if (world_rank_ == 0 && client_size)
                blob.assign(static_cast<const unsigned char *>(client), static_cast<const unsigned char *>(client) + client_size);
            {
                const watchdog::WaitScope wait("checkpoint file creation (collective HDF5)", &world_watch_);
                ckpt::save_prepare(world_, dir, tag, content, static_cast<size_t>(csize));
            }
            saver_ = std::make_unique<ckpt::BackgroundSave>(world_, dir, tag, std::move(content), std::move(frozen32),
                                                            std::move(blob), static_cast<size_t>(csize),
                                                            cfg_.checkpoint.keep_last, std::move(regions),
                                                            std::move(copies));
            saves_done_ = false;
            if (world_rank_ == 0)
                DSM_INFO(ENGINE, "checkpoint save '%s/%s.h5': %s in %.3f s, writing in the background", dir.c_str(),
                         tag.c_str(), live ? "started" : "state copied", MPI_Wtime() - start);
            return;
        }
        {
            const watchdog::WaitScope wait("checkpoint write (collective HDF5)", &world_watch_);
            ckpt::save(world_, dir, tag, content, world_rank_ == 0 ? client : nullptr, static_cast<size_t>(csize),
                       cfg_.checkpoint.keep_last);
        }
        if (world_rank_ == 0) log_done("saved", dir, tag, MPI_Wtime() - start);
    } catch (...) {
        // A failure every rank met in this save leaves the engine as it was:
        // no collective state moved. Ranks found in different calls were
        // marked failed by sync() (on every rank), so dsm_engine_free is local.
        throw;
    }
}

// The start of a load at `point`: this rank's argument checks (`checks`,
// which may throw), agreed by every rank; the asynchronous save waited for
// (its failure is this call's); the boundary and released buffers checked.
void Engine::enter_load(SyncPoint point, const std::function<void()> &checks) {
    std::string why;
    dsm_status_t status = DSM_SUCCESS;
    try {
        stage_->settle(); // the collectives in flight (overlap_comm) read and write the state
        checks();
    } catch (const Error &e) {
        status = e.status();
        why = e.what();
    }
    sync(point, 0, why, status);
    finish_save(true);
    check_checkpoint_point(point);
}

// The values a load read (content, with `live` from checkpoint_tensors)
// into the engine: master weights and optimizer states uploaded, frozen
// parameters converted. Tensors marked `skip` keep their values.
void Engine::put_loaded(const ckpt::Content &content, const std::vector<float *> &live) {
    for (size_t i = 0; i < live.size(); ++i) {
        const ckpt::Tensor &from = content.tensors[i];
        if (from.count == 0 || from.skip) continue;
        if (from.group == "params" && !from.trainable) {
            put_frozen(params_[static_cast<size_t>(param_index(from.name.c_str()))], from.data);
        } else if (live[i] != from.data) { // not read in place
            space_->upload(live[i], from.data, from.count * sizeof(float));
        }
    }
}

// After a load changed the master weights: the compute parameters
// republished from them, gradients and gathered copies dropped.
void Engine::after_load() {
    window_start_ = 0.0;
    zero_grads();
    stage_->new_micro_step(true); // gathered copies dropped, traces forgotten
    compute_->invalidate(true); // the frozen parameters were loaded too
    publish();
}

void Engine::load_weights(const char *path_arg, unsigned flags) {
    check_usable();
    const std::string path = path_arg != nullptr ? path_arg : "";
    enter_load(SyncPoint::WEIGHTS, [&] {
        DSM_REQUIRE(path_arg != nullptr, DSM_ERR_NULL_POINTER, "path is NULL");
        DSM_REQUIRE(!path.empty(), DSM_ERR_INVALID_ARGUMENT, "the weights file path is empty");
        DSM_REQUIRE((flags & ~DSM_CKPT_LOAD_NON_STRICT) == 0, DSM_ERR_INVALID_ARGUMENT, "flags 0x", std::hex, flags,
                    " has bits other than DSM_CKPT_LOAD_NON_STRICT (0x", flags & ~DSM_CKPT_LOAD_NON_STRICT, ")");
    });

    // What the file is, as rank 0 sees it: an HDF5 checkpoint (the HDF5
    // signature, after the checkpoint's user block) or else safetensors.
    int hdf5 = 0;
    agree(world_, [&] {
        if (world_rank_ != 0) return;
        struct stat st;
        DSM_REQUIRE(::stat(path.c_str(), &st) == 0, DSM_ERR_IO, "weights file '", path, "': ", std::strerror(errno));
        DSM_REQUIRE(!S_ISDIR(st.st_mode), DSM_ERR_INVALID_ARGUMENT, "weights file '", path,
                    "' is a directory: name a checkpoint file (DIR/TAG.h5) or a .safetensors file "
                    "(dsm_engine_load_checkpoint loads a checkpoint directory)");
        DSM_REQUIRE(S_ISREG(st.st_mode), DSM_ERR_IO, "weights file '", path, "' is not a regular file");
        hdf5 = ckpt::hdf5_signature(path);
    });
    comm::bcast_int(*control_, &hdf5, 0);

    std::vector<std::unique_ptr<float[]>> staged;
    std::vector<float *> live;
    ckpt::Content content;
    content.strict = !(flags & DSM_CKPT_LOAD_NON_STRICT);
    agree_prepared(world_, "the buffers the weights are read into",
                   [&] { content.tensors = checkpoint_tensors(false, staged, &live); });
    const double start = MPI_Wtime();
    if (hdf5) ckpt::load_file(world_, path, content, nullptr);
    else ckpt::load_safetensors(world_, path, content);
    const double seconds = MPI_Wtime() - start;

    // Everything was read: now change the engine (parameters only).
    put_loaded(content, live);
    after_load();
    last_load_ = LoadReport{"", "", path, {}, std::move(content.missing), std::move(content.unexpected),
                            std::move(content.mismatched)};
    if (world_rank_ == 0) {
        DSM_INFO(ENGINE, "loaded weights from '%s' (%s) in %.2f s", path.c_str(), hdf5 ? "checkpoint" : "safetensors",
                 seconds);
        const LoadReport &r = last_load_;
        if (!r.missing.empty() || !r.unexpected.empty() || !r.mismatched.empty())
            DSM_WARN(ENGINE, "non-strict weights load of '%s': %zu missing, %zu unexpected, %zu of another shape, "
                             "not loaded%s%s (dsm_engine_load_report lists them)",
                     path.c_str(), r.missing.size(), r.unexpected.size(), r.mismatched.size(),
                     r.missing.empty() ? "" : "; first missing: ", r.missing.empty() ? "" : r.missing[0].c_str());
    }
}

std::string Engine::load_checkpoint(const char *dir_arg, const char *tag_arg, unsigned flags,
                                    std::vector<unsigned char> *client) {
    check_usable();
    const watchdog::Context ctx("dsm_engine_load_checkpoint");
    const std::string dir = dir_arg != nullptr ? dir_arg : "";
    const unsigned known = DSM_CKPT_LOAD_MODULE_ONLY | DSM_CKPT_LOAD_NO_OPTIMIZER | DSM_CKPT_LOAD_NO_LR_SCHEDULE |
                           DSM_CKPT_LOAD_NON_STRICT | DSM_CKPT_LOAD_FALLBACK;
    enter_load(SyncPoint::LOAD, [&] {
        DSM_REQUIRE(dir_arg != nullptr, DSM_ERR_NULL_POINTER, "dir is NULL");
        DSM_REQUIRE(!dir.empty(), DSM_ERR_INVALID_ARGUMENT, "the checkpoint directory is empty");
        DSM_REQUIRE((flags & ~known) == 0, DSM_ERR_INVALID_ARGUMENT, "flags 0x", std::hex, flags,
                    " has unknown bits 0x", flags & ~known);
        if (tag_arg != nullptr) ckpt::check_tag(tag_arg);
    });

    const bool module_only = flags & DSM_CKPT_LOAD_MODULE_ONLY;
    const bool with_optimizer = !module_only && !(flags & DSM_CKPT_LOAD_NO_OPTIMIZER);
    std::vector<std::unique_ptr<float[]>> staged;
    std::vector<float *> live;
    ckpt::Content content;
    content.strict = !(flags & DSM_CKPT_LOAD_NON_STRICT);
    agree_prepared(world_, "the buffers the checkpoint is read into",
                   [&] {
                       content.tensors = checkpoint_tensors(with_optimizer, staged, &live, nullptr,
                                                            space_->kind() == device::Kind::HOST);
                   });
    // Values the engine needs from the attributes, checked by the load
    // before any tensor changes (Content::check_attrs).
    std::string tag, trying;
    amp::LossScalerState lss = scaler_->state();
    int64_t counters[5] = {0, 0, 0, 0, 0}, last_step = -1;
    bool restore_scaler = false;
    content.check_attrs = [&](const ckpt::Attributes &a) {
        auto int_attr = [&](const char *name) -> int64_t {
            DSM_REQUIRE(a.contains(name) && a[name].is_number_integer(), DSM_ERR_IO, "checkpoint '", dir, "/", trying,
                        ".h5' lacks the integer attribute ", name);
            return a[name].get<int64_t>();
        };
        if (module_only) return;
        counters[0] = int_attr("global_steps");
        counters[1] = int_attr("micro_steps");
        counters[2] = int_attr("skipped_steps");
        counters[3] = int_attr("global_samples");
        counters[4] = int_attr("optimizer_steps");
        counters[1] = resumed_micro_steps(a, cat(dir, "/", trying, ".h5"), counters[0], counters[1],
                                          cfg_.gradient_accumulation_steps);
        last_step = int_attr("lr_schedule_last_step");
        // A dynamic scaler resumes an fp16 run's state whole. A static one
        // (fp32, bf16) has only its iteration counter, which counts from the
        // start of training, as the uninterrupted run's does.
        const bool fp16_run = a.value("compute_dtype", std::string()) == "float16";
        restore_scaler = !scaler_->dynamic() || fp16_run;
        if (scaler_->dynamic() && fp16_run) {
            DSM_REQUIRE(a.contains("loss_scale") && a["loss_scale"].is_number(), DSM_ERR_IO,
                        "checkpoint lacks the attribute loss_scale");
            lss.cur_scale = a["loss_scale"].get<double>();
            lss.cur_iter = int_attr("loss_scale_cur_iter");
            lss.last_overflow_iter = int_attr("loss_scale_last_overflow_iter");
            lss.cur_hysteresis = int_attr("loss_scale_cur_hysteresis");
        } else if (!scaler_->dynamic()) {
            lss.cur_iter = int_attr("loss_scale_cur_iter");
        }
    };
    std::vector<unsigned char> blob;
    const double start = MPI_Wtime();
    // The tag asked for (or `latest`'s); with DSM_CKPT_LOAD_FALLBACK, a
    // checkpoint that does not verify (missing, truncated, corrupt: an I/O
    // or HDF5 error, agreed by every rank) is skipped for the newest of the
    // directory that does. A mismatch with the engine is never skipped.
    const bool fallback = flags & DSM_CKPT_LOAD_FALLBACK;
    std::vector<std::pair<std::string, std::string>> skipped;
    auto skip = [&](const std::string &t, const Error &e) {
        if (!fallback || (e.status() != DSM_ERR_IO && e.status() != DSM_ERR_HDF5)) throw;
        skipped.emplace_back(t, e.message());
        DSM_WARN(ENGINE, "checkpoint load: skipping '%s' in '%s' (DSM_CKPT_LOAD_FALLBACK): %s", t.c_str(), dir.c_str(),
                 e.message().c_str());
    };
    std::vector<std::string> queue;
    try {
        queue.push_back(ckpt::resolve_tag(world_, dir, tag_arg ? tag_arg : ""));
    } catch (const Error &e) {
        skip(tag_arg ? tag_arg : "latest", e);
    }
    bool listed = false;
    for (size_t k = 0; tag.empty(); ++k) {
        if (k == queue.size() && fallback && !listed) {
            listed = true;
            for (const std::string &t : ckpt::list_checkpoints(world_, dir))
                if (std::find(queue.begin(), queue.end(), t) == queue.end()) queue.push_back(t);
        }
        if (k == queue.size()) {
            std::string all;
            for (const auto &sk : skipped) all += cat(all.empty() ? "" : "; ", "'", sk.first, "': ", sk.second);
            DSM_FAIL(DSM_ERR_IO, "no checkpoint in '", dir, "' verifies (DSM_CKPT_LOAD_FALLBACK): ", all);
        }
        if (world_rank_ == 0)
            DSM_INFO(ENGINE, "checkpoint load '%s/%s.h5': %zu tensors, %.1f MB of values, starting", dir.c_str(),
                     queue[k].c_str(), content.tensors.size(), tensor_megabytes(content.tensors));
        try {
            const watchdog::WaitScope wait("checkpoint read (collective HDF5)", &world_watch_);
            trying = queue[k];
            ckpt::load(world_, dir, queue[k], content, &blob);
            tag = queue[k];
        } catch (const Error &e) {
            skip(queue[k], e);
        }
    }
    const double load_seconds = MPI_Wtime() - start;

    // Everything was read and verified, the attributes above checked by the
    // load: engine state from here, no more errors from the file.
    put_loaded(content, live);
    if (!module_only) {
        global_steps_ = counters[0];
        micro_steps_ = counters[1];
        skipped_steps_ = counters[2];
        global_samples_ = counters[3];
        applied_steps_ = counters[4];
        if (restore_scaler) scaler_->set_state(lss);
        if (schedule_ && !(flags & DSM_CKPT_LOAD_NO_LR_SCHEDULE)) {
            schedule_->set_last_step(last_step); // the lr the checkpoint's optimizer stepped with
            schedule_pending_ = false;
        }
    }
    after_load();
    if (client) *client = std::move(blob);
    last_load_ = LoadReport{dir, tag, "", std::move(skipped), std::move(content.missing),
                            std::move(content.unexpected), std::move(content.mismatched)};
    if (world_rank_ == 0) {
        log_done("loaded", dir, tag, load_seconds);
        const LoadReport &r = last_load_;
        if (!r.missing.empty() || !r.unexpected.empty() || !r.mismatched.empty())
            DSM_WARN(ENGINE, "non-strict checkpoint load of '%s/%s.h5': %zu missing, %zu unexpected, %zu of another "
                             "shape, not loaded%s%s (dsm_engine_load_report lists them)",
                     dir.c_str(), tag.c_str(), r.missing.size(), r.unexpected.size(), r.mismatched.size(),
                     r.missing.empty() ? "" : "; first missing: ", r.missing.empty() ? "" : r.missing[0].c_str());
    }
    return tag;
}

std::string Engine::load_report(dsm_format_t format) const {
    const LoadReport &r = last_load_;
    DSM_REQUIRE(format == DSM_FORMAT_TEXT || format == DSM_FORMAT_JSON, DSM_ERR_INVALID_ARGUMENT, "format ",
                static_cast<int>(format), " is not DSM_FORMAT_TEXT or DSM_FORMAT_JSON");
    if (format == DSM_FORMAT_JSON) {
        nlohmann::json j;
        j["loaded"] = !r.tag.empty() || !r.weights.empty();
        j["dir"] = r.dir;
        j["tag"] = r.tag;
        j["weights"] = r.weights; // dsm_engine_load_weights: the file ("" after a checkpoint load)
        j["skipped"] = nlohmann::json::array();
        for (const auto &sk : r.skipped) j["skipped"].push_back({{"tag", sk.first}, {"reason", sk.second}});
        j["missing"] = r.missing;
        j["unexpected"] = r.unexpected;
        j["mismatched"] = r.mismatched;
        return j.dump(2) + "\n";
    }
    if (r.tag.empty() && r.weights.empty()) return "no checkpoint loaded\n";
    std::string out = r.weights.empty() ? cat("loaded: ", r.dir, "/", r.tag, ".h5\n")
                                        : cat("loaded weights: ", r.weights, "\n");
    for (const auto &sk : r.skipped) out += cat("skipped: ", sk.first, ": ", sk.second, "\n");
    for (const std::string &m : r.missing) out += cat("missing: ", m, "\n");
    for (const std::string &u : r.unexpected) out += cat("unexpected: ", u, "\n");
    for (const std::string &m : r.mismatched) out += cat("shape differs: ", m, "\n");
    return out;
}

#else // no HDF5

// Still collective: every rank fails together, and a rank that saves while
// another steps fails both instead of leaving the other in its step.
void Engine::save_checkpoint(const char *, const char *, const void *, size_t) {
    check_usable();
    sync(SyncPoint::SAVE, 0, "checkpoints need parallel HDF5: this libdsm was built without it",
         DSM_ERR_NOT_SUPPORTED);
}

std::string Engine::load_checkpoint(const char *, const char *, unsigned, std::vector<unsigned char> *) {
    check_usable();
    sync(SyncPoint::LOAD, 0, "checkpoints need parallel HDF5: this libdsm was built without it",
         DSM_ERR_NOT_SUPPORTED);
    return std::string();
}

void Engine::load_weights(const char *, unsigned) {
    check_usable();
    sync(SyncPoint::WEIGHTS, 0, "loading weights needs parallel HDF5: this libdsm was built without it",
         DSM_ERR_NOT_SUPPORTED);
}

// No save ever runs in the background: waiting is only the agreement.
void Engine::finish_save(bool) {}

void Engine::checkpoint_wait() {
    check_usable();
    sync(SyncPoint::WAIT, 0);
}

std::string Engine::load_report(dsm_format_t format) const {
    DSM_REQUIRE(format == DSM_FORMAT_TEXT || format == DSM_FORMAT_JSON, DSM_ERR_INVALID_ARGUMENT, "format ",
                static_cast<int>(format), " is not DSM_FORMAT_TEXT or DSM_FORMAT_JSON");
    return format == DSM_FORMAT_JSON ? "{\"loaded\": false}\n" : "no checkpoint loaded\n";
}

#endif

} // namespace engine
} // namespace dsm
