// Collective calls agree on errors: every rank runs its local checks, then
// the ranks exchange their outcome so that all of them return the same status
// with the message of the lowest failing rank, and none is left waiting in a
// later collective.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <mpi.h>

#include "dsm.h"

namespace dsm {

// One round of the agreement of a collective entry point over `comm`: every
// rank gives its local status (DSM_SUCCESS or the status of its failure) and
// any number of integer values; one allreduce gives every rank the lowest
// failing rank with its status, and each value's minimum and maximum over
// the ranks. Every collective entry point agrees through this type (agree()
// and agree_same() below are built on it).
class Agreement {
public:
    explicit Agreement(MPI_Comm comm) : comm_(comm) {}

    // A value to agree on; its index for min(), max() and same().
    size_t add(int64_t value);
    // The allreduce (collective). `status`: this rank's outcome; `message`:
    // its error message, for throw_if_failed().
    void run(dsm_status_t status, std::string message = std::string());
    // run() with the outcome of `local` (argument checks that may throw
    // dsm::Error; other exceptions propagate without agreeing).
    void run(const std::function<void()> &local);

    bool failed() const noexcept { return first_ >= 0; }
    int failed_rank() const noexcept { return first_; }          // -1 when none failed
    dsm_status_t failed_status() const noexcept { return status_; } // the lowest failing rank's
    int64_t min(size_t i) const noexcept { return ~result_[1 + 2 * i + 1]; }
    int64_t max(size_t i) const noexcept { return result_[1 + 2 * i]; }
    bool same(size_t i) const noexcept { return min(i) == max(i); }

    // If a rank failed: the lowest failing rank broadcasts its message and
    // every rank throws its status with "rank R: message" (collective when
    // failed(); nothing otherwise).
    void throw_if_failed() const;

private:
    MPI_Comm comm_;
    std::vector<int64_t> values_;
    std::vector<int64_t> result_;
    int first_ = -1;
    dsm_status_t status_ = DSM_SUCCESS;
    std::string message_;
};

// Rank `root`'s `s` on every rank of `comm` (collective).
std::string bcast_string(MPI_Comm comm, int root, const std::string &s);

// Run `local` (argument checks that may throw dsm::Error) on every rank of
// `comm`, then agree: if any rank failed, every rank throws the status and
// message ("rank R: ...") of the lowest failing rank. `comm` must have
// MPI_ERRORS_RETURN.
void agree(MPI_Comm comm, const std::function<void()> &local);

// Every rank passes a canonical text of its arguments; all ranks throw
// DSM_ERR_MISMATCH naming the first rank whose text differs from rank 0's,
// with both texts.
void agree_same(MPI_Comm comm, const std::string &what, const std::string &canonical);

} // namespace dsm
