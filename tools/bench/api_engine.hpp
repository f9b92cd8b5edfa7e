// The engine as the engine benchmarks drive it: through the public C API
// (dsm.h), as a program does. An engine on a one-dimensional
// "data_parallel" mesh of every rank of a communicator, made by
// dsm_mesh_create and dsm_engine_init_with_options, freed by
// dsm_engine_free. A call that fails throws dsm::Error with the status and
// dsm_last_error()'s message, which Harness::guard reports.
//
// Two waits have no public call, and are the only places where these
// benchmarks reach behind a handle (api_engine.cc, through the engine the
// handle holds): synchronize() (a device-resident or simulated step returns
// with its work queued on the engine's own queue) and
// checkpoint_captured_wait() (the moment an asynchronous save stops reading
// the live state, which a dsm_step right after the save waits for).
#pragma once

#include <cstdint>
#include <string>

#include <mpi.h>
#include <nlohmann/json.hpp>

#include <dsm.h>

namespace dsm {
namespace bench {

// Throws dsm::Error(status, dsm_last_error()) unless status is DSM_SUCCESS.
void check(dsm_status_t status);

// What the reductions, the update, the gathers and the waits at the step's
// agreements took so far (dsm_engine_describe's timers_seconds).
struct StepTimers {
    double reduce = 0, optimizer = 0, gather = 0, wait = 0;
    uint64_t bytes_sent = 0; // the engine's bytes sent so far (the same description)
};

class ApiEngine {
public:
    // Collective over `comm`: the mesh, then the engine of `config` (a
    // DeepSpeed JSON text) with `params` on `device`.
    ApiEngine(MPI_Comm comm, const std::string &config, const dsm_param_desc_t *params, int nparams,
              dsm_device_t device = DSM_DEVICE_DEFAULT);
    ~ApiEngine(); // close() unless closed
    ApiEngine(const ApiEngine &) = delete;
    ApiEngine &operator=(const ApiEngine &) = delete;

    dsm_engine_t handle() const noexcept { return engine_; }

    int num_params() const;
    int64_t numel(int index) const;
    dsm_dtype_t dtype() const;

    const void *param_acquire(int index);
    void param_release(int index);
    void *grad_acquire(int index);
    void grad_release(int index);
    void step(); // dsm_step
    // Waits until the engine's queued work is done (host: nothing queued).
    void synchronize();

    // dsm_engine_describe, parsed.
    nlohmann::json describe() const;
    StepTimers timers() const;

    void save_checkpoint(const std::string &dir, const char *tag);
    void load_checkpoint(const std::string &dir, const char *tag);
    void checkpoint_wait();
    void checkpoint_captured_wait();

    // dsm_engine_free (collective); the mesh is freed at creation (the
    // engine keeps its own).
    void close();

private:
    dsm_engine_t engine_ = nullptr;
};

} // namespace bench
} // namespace dsm
