// The engine benchmarks' engine, through the public C API (api_engine.hpp).
#include "api_engine.hpp"

#include "api/api.hpp"
#include "core/error.hpp"
#include "engine/engine.hpp"

namespace dsm {
namespace bench {

void check(dsm_status_t status) {
    if (status != DSM_SUCCESS) throw Error(status, dsm_last_error());
}

ApiEngine::ApiEngine(MPI_Comm comm, const std::string &config, const dsm_param_desc_t *params, int nparams,
                     dsm_device_t device) {
    int size = 0;
    MPI_Comm_size(comm, &size);
    const int shape[1] = {size};
    const char *const names[1] = {"data_parallel"};
    dsm_mesh_t mesh = nullptr;
    check(dsm_mesh_create(comm, 1, shape, names, &mesh));
    dsm_engine_options_t o = DSM_ENGINE_OPTIONS_INITIALIZER;
    o.device = device;
    const dsm_status_t s = dsm_engine_init_with_options(mesh, config.c_str(), params, nparams, &o, &engine_);
    const std::string why = s == DSM_SUCCESS ? "" : dsm_last_error();
    dsm_mesh_free(&mesh);
    if (s != DSM_SUCCESS) throw Error(s, why);
}

ApiEngine::~ApiEngine() {
    if (engine_ != nullptr) dsm_engine_free(&engine_);
}

int ApiEngine::num_params() const {
    int n = 0;
    check(dsm_engine_num_params(engine_, &n));
    return n;
}

int64_t ApiEngine::numel(int index) const {
    int64_t n = 0;
    check(dsm_engine_param_numel(engine_, index, &n));
    return n;
}

dsm_dtype_t ApiEngine::dtype() const {
    dsm_dtype_t t = DSM_FLOAT32;
    check(dsm_engine_dtype(engine_, &t));
    return t;
}

const void *ApiEngine::param_acquire(int index) {
    const void *p = nullptr;
    check(dsm_engine_param_acquire(engine_, index, &p));
    return p;
}

void ApiEngine::param_release(int index) { check(dsm_engine_param_release(engine_, index)); }

void *ApiEngine::grad_acquire(int index) {
    void *g = nullptr;
    check(dsm_engine_grad_acquire(engine_, index, &g));
    return g;
}

void ApiEngine::grad_release(int index) { check(dsm_engine_grad_release(engine_, index)); }

void ApiEngine::step() { check(dsm_step(engine_, nullptr)); }

// No public call waits for the engine's own queue (a program that needs to
// gives the engine its stream, dsm_engine_set_stream, and waits on that).
void ApiEngine::synchronize() { api::engine_impl(engine_).synchronize(); }

nlohmann::json ApiEngine::describe() const {
    char *text = nullptr;
    check(dsm_engine_describe(engine_, DSM_FORMAT_JSON, &text));
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(text);
    } catch (...) {
        dsm_free(text);
        throw;
    }
    dsm_free(text);
    return j;
}

StepTimers ApiEngine::timers() const {
    const nlohmann::json d = describe();
    const nlohmann::json &t = d["timers_seconds"];
    StepTimers r;
    r.reduce = t["reduce"].get<double>();
    r.optimizer = t["optimizer"].get<double>();
    r.gather = t["gather"].get<double>();
    r.wait = t["wait"].get<double>();
    r.bytes_sent = d["communication"]["bytes_sent"].get<uint64_t>();
    return r;
}

void ApiEngine::save_checkpoint(const std::string &dir, const char *tag) {
    check(dsm_engine_save_checkpoint(engine_, dir.c_str(), tag, nullptr, 0));
}

void ApiEngine::load_checkpoint(const std::string &dir, const char *tag) {
    check(dsm_engine_load_checkpoint(engine_, dir.c_str(), tag, 0, nullptr, nullptr));
}

void ApiEngine::checkpoint_wait() { check(dsm_engine_checkpoint_wait(engine_)); }

// No public call: the asynchronous save's copy of the live state is done.
void ApiEngine::checkpoint_captured_wait() { api::engine_impl(engine_).checkpoint_captured_wait(); }

void ApiEngine::close() {
    if (engine_ != nullptr) check(dsm_engine_free(&engine_));
}

} // namespace bench
} // namespace dsm
