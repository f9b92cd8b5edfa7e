// The collective protocol of a save and a load: see protocol.hpp.
#include "dsm_config.h"

#include "ckpt/protocol.hpp"
#include "ckpt/format.hpp"
#include "ckpt/params.hpp"

#include <signal.h>

#include <cstdlib>
#include <new>

#include "core/error.hpp"
#include "core/log.hpp"

namespace dsm {
namespace ckpt {

bool Steps::run(const std::function<void()> &fn) {
    if (!stopped_) {
        try {
            fn();
        } catch (const Error &e) {
            status_ = e.status();
            failure_ = e.what();
        } catch (const std::bad_alloc &) {
            status_ = DSM_ERR_OUT_OF_MEMORY;
            failure_ = cat("out of memory for checkpoint '", file_, "'");
        }
    }
    int bad = status_ != DSM_SUCCESS ? 1 : 0;
    DSM_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, comm_));
    stopped_ = bad != 0;
    return !stopped_;
}

void Steps::rethrow() const {
    if (status_ != DSM_SUCCESS) DSM_FAIL(status_, failure_);
}

Progress::Progress(int rank, const char *what, const std::string &path, const std::vector<Tensor> &tensors)
    : on_(rank == 0 && log_enabled(LogLevel::INFO, Subsys::ENGINE)), what_(what), path_(path), start_(MPI_Wtime()),
      last_(start_) {
    for (const Tensor &t : tensors) total_ += bytes_of(t);
}

void Progress::done(const Tensor &t) {
    done_ += bytes_of(t);
    if (!on_) return;
    const double now = MPI_Wtime();
    if (now - last_ < kEverySeconds) return;
    last_ = now;
    DSM_INFO(ENGINE, "checkpoint %s '%s': %.0f of %.0f MB (%.0f%%) in %.1f s", what_, path_.c_str(), done_ / 1e6,
             total_ / 1e6, total_ > 0 ? 100.0 * done_ / total_ : 100.0, now - start_);
}

double Progress::bytes_of(const Tensor &t) {
    double n = 4; // fp32
    for (int64_t d : t.shape) n *= static_cast<double>(d);
    return n;
}

void check_tag(const std::string &tag) {
    DSM_REQUIRE(!tag.empty() && tag.size() <= kMaxTag, DSM_ERR_INVALID_ARGUMENT, "checkpoint tag '", tag,
                "' must have 1..", kMaxTag, " characters");
    DSM_REQUIRE(tag[0] != '.', DSM_ERR_INVALID_ARGUMENT, "checkpoint tag '", tag,
                "' must not start with '.' (it would name a hidden file or another directory)");
    for (unsigned char c : tag)
        DSM_REQUIRE((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-', DSM_ERR_INVALID_ARGUMENT,
                    "checkpoint tag '", tag, "' has the character '", static_cast<char>(c),
                    "': tags use A-Z a-z 0-9 . _ - only (no '/', so a tag cannot leave the directory)");
}

namespace {

// DSM_CKPT_FAULT parsed: [kill:]POINT[:RANK].
struct FaultSpec {
    bool set = false, kill = false;
    std::string point;
    int rank = 0;
};

FaultSpec fault_spec() {
    FaultSpec f;
    const std::string spec = fault_param();
    if (spec.empty()) return f;
    std::string rest = spec;
    if (rest.rfind("kill:", 0) == 0) {
        f.kill = true;
        rest = rest.substr(5);
    }
    const size_t colon = rest.find(':');
    f.point = rest.substr(0, colon);
    bool ok = f.point == "create" || f.point == "write" || f.point == "data" || f.point == "rename" || f.point == "latest";
    if (ok && colon != std::string::npos) {
        const std::string r = rest.substr(colon + 1);
        ok = !r.empty() && r.size() <= 9 && r.find_first_not_of("0123456789") == std::string::npos;
        if (ok) f.rank = std::atoi(r.c_str());
    }
    if (!ok)
        DSM_FAIL(DSM_ERR_INVALID_ARGUMENT, "DSM_CKPT_FAULT=", spec,
                 " is malformed: expected POINT, POINT:RANK or kill:POINT:RANK with POINT create, write, data, rename or "
                 "latest "
                 "and RANK a rank number");
    f.set = true;
    return f;
}

} // namespace

void check_fault_spec() { fault_spec(); }

void fault_point(const char *point, int world_rank) {
    const FaultSpec f = fault_spec();
    if (!f.set || f.point != point || f.rank != world_rank) return;
    if (f.kill) ::raise(SIGKILL);
    DSM_FAIL(DSM_ERR_IO, "injected fault at checkpoint point '", point, "' (DSM_CKPT_FAULT=",
             fault_param(), ")");
}

} // namespace ckpt
} // namespace dsm
