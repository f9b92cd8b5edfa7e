// Build description: features, MPI library, environment parameters.
#pragma once

#include <string>

#include "dsm.h"

namespace dsm {

// 1 or 0 for a feature name ("mpi", "hwloc", "hdf5", "cuda", "nccl",
// "fortran"); DSM_ERR_NOT_FOUND otherwise.
int feature_enabled(const std::string &name);

std::string describe_build(dsm_format_t format);

// A malloc'd copy for the C caller (freed with dsm_free()).
char *to_c_string(const std::string &s);

} // namespace dsm
