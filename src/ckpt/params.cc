// The checkpoint parameters. Declared in this file, which every build
// compiles, rather than in the files that use them (built with HDF5
// only), so that dsm-info lists them in every build.
#include "dsm_config.h"

#include "ckpt/params.hpp"

#include <climits>

#include "core/param.hpp"

namespace dsm {
namespace ckpt {

namespace {

DSM_PARAM(ckpt, CKPT_SPACE_CHECK, param::Bool(), "1",
          "1: before a checkpoint save, rank 0 checks that the file system reports room for the file and "
          "fails the save on every rank when it does not; 0 skips that check (a file system that reports "
          "less free space than it has). A write that fails anyway is caught on every rank either way.");
DSM_PARAM(ckpt, CKPT_PRECHECK, param::Bool(), "1",
          "1: before a checkpoint load opens the file collectively, rank 0 reads its HDF5 metadata in a "
          "child process, so that a corrupt file on which HDF5 crashes or loops fails the load on every "
          "rank instead of killing or hanging the job; 0 skips that (where a process using MPI must not fork).");
DSM_PARAM(ckpt, CKPT_PRECHECK_TIMEOUT, param::Int(0, INT_MAX, "a number of seconds (0 for no limit)"), "120",
          "Seconds the load's metadata pre-check (DSM_CKPT_PRECHECK) may take before the file is declared "
          "corrupt; 0 waits for ever.");
DSM_PARAM(ckpt, CKPT_FAULT, param::Text(), "",
          "Testing: make a checkpoint save fail at a point on one rank: POINT:RANK, or kill:POINT:RANK to "
          "kill that rank with SIGKILL there. POINT is create (rank 0, after creating the file's metadata), "
          "write (that rank, in the middle of writing its data), "
          "data (after writing), rename (rank 0, before the rename) or latest (rank 0, before rewriting "
          "latest); RANK defaults to 0. A malformed value fails the save on every rank.");

} // namespace

bool space_check_param() { return param_CKPT_SPACE_CHECK().value(); }
bool precheck_param() { return param_CKPT_PRECHECK().value(); }
long precheck_timeout_param() { return static_cast<long>(param_CKPT_PRECHECK_TIMEOUT().value()); }
std::string fault_param() { return param_CKPT_FAULT().value(); }

} // namespace ckpt
} // namespace dsm

DSM_PARAM_LINK(ckpt)
