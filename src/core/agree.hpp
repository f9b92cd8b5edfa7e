// Collective calls agree on errors: every rank runs its local checks, then
// the ranks exchange their outcome so that all of them return the same status
// with the message of the lowest failing rank, and none is left waiting in a
// later collective.
#pragma once

#include <functional>
#include <string>

#include <mpi.h>

namespace dsm {

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
