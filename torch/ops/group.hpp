// The process-wide sequence-parallel group of the operators (set through
// dsm_torch_ops.h), and how the ranks of the group agree on one error.
#ifndef DSM_TORCH_OPS_GROUP_HPP
#define DSM_TORCH_OPS_GROUP_HPP

#include <mutex>
#include <string>

#include "dsm_torch_ops.h"

namespace dsm_torch_ops {

struct Group {
    bool set = false;              // dsm_torch_ops_set_mesh() was called (a NULL mesh too)
    dsm_sp_t sp = nullptr;         // the group's context; NULL: no sequence parallelism
    MPI_Comm comm = MPI_COMM_NULL; // a duplicate of the group's communicator, for agreeing on errors
    int size = 1;
    int rank = 0;
};

// The group, locked for the duration of one operator call (the operators
// are collectives over it: one at a time).
class Held {
public:
    Held();
    Group &group;

private:
    std::lock_guard<std::mutex> lock_;
};

// Unset in a job of more than one MPI rank: the number of ranks; else 0.
int ranks_without_group(const Group &g);

// After a transform failed on every rank of the group (its status one of the
// agreed argument errors): the message every rank throws. `local` is this
// rank's own failure found before calling the library ("" if none): the
// lowest rank with one sends it to all, prefixed with "rank r of P: ";
// without any, the library's (agreed) message stands.
std::string agreed_failure(const Group &g, const std::string &local, const std::string &library);

} // namespace dsm_torch_ops

#endif
