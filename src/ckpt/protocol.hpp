// The collective protocol of a save and a load (doc/checkpoint.md): every
// step agreed, so that a failure on one rank stops all of them at the same
// point; the fault points of the tests; progress lines. Internal to
// src/ckpt (write.cc, read.cc).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <mpi.h>

#include "dsm.h"
#include "ckpt/checkpoint.hpp"

namespace dsm {
namespace ckpt {

// The steps of a save or a load, each agreed: run() runs one on this rank
// unless a rank has failed before, then the ranks agree whether any failed
// (one small allreduce), so that all of them stop making collective calls
// at the same point. The first failure of this rank is kept for the final
// agreement.
class Steps {
public:
    Steps(MPI_Comm comm, std::string file) : comm_(comm), file_(std::move(file)) {}
    // Runs `fn` (unless stopped), then agrees; false once any rank failed.
    bool run(const std::function<void()> &fn);
    bool stopped() const noexcept { return stopped_; }
    // This rank's failure, if it had one (for agree()).
    void rethrow() const;

private:
    MPI_Comm comm_;
    std::string file_, failure_;
    dsm_status_t status_ = DSM_SUCCESS;
    bool stopped_ = false;
};

// Checks DSM_CKPT_FAULT (DSM_ERR_INVALID_ARGUMENT when malformed), before a
// save starts.
void check_fault_spec();

// Progress of a long save or load on rank 0, at INFO: a line every few
// seconds with the bytes done, the total and the time so far.
class Progress {
public:
    Progress(int rank, const char *what, const std::string &path, const std::vector<Tensor> &tensors);
    // After tensor `t`.
    void done(const Tensor &t);

private:
    static constexpr double kEverySeconds = 5.0;
    static double bytes_of(const Tensor &t);
    bool on_;
    const char *what_;
    std::string path_;
    double start_, last_, total_ = 0, done_ = 0;
};

} // namespace ckpt
} // namespace dsm
