// Reading a configuration on every rank of a job, so that all ranks get the
// same verdict, and its text form.
#pragma once

#include <string>

#include <mpi.h>

#include "config/config.hpp"
#include "dsm.h"

namespace dsm {
namespace config {

// Collective over `comm`: every rank parses `text_or_path` with `ctx`. If any
// rank fails, every rank throws the error of the lowest failing rank; if the
// ranks resolved different configurations (files that differ between nodes),
// every rank throws DSM_ERR_MISMATCH. A `bad_status` other than DSM_SUCCESS is this rank's
// argument error (with `bad_message`), agreed like a parse error instead of
// reading anything.
Config load_collective(MPI_Comm comm, const std::string &text_or_path, const ConfigContext &ctx,
                       dsm_status_t bad_status = DSM_SUCCESS, const std::string &bad_message = "");

// A configuration already read (by parse_config() or load_collective(), for
// any context) made this job's: resolve_for(`read`, `ctx`) on every rank of
// `comm`, agreed as load_collective() agrees (the same errors, and
// DSM_ERR_MISMATCH when the ranks hold different configurations). Collective
// over `comm`; reads nothing.
Config adopt_collective(MPI_Comm comm, const Config &read, const ConfigContext &ctx,
                        dsm_status_t bad_status = DSM_SUCCESS, const std::string &bad_message = "");

// The resolved configuration as "key.path = value" lines, in the order of
// config_to_json().
std::string config_to_text(const Config &cfg);

} // namespace config
} // namespace dsm
