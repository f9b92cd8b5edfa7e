// CPU binding of this process at mesh creation.
#pragma once

#include <string>

#include "dsm.h"

namespace dsm::topo {

// Bind this process: DSM_BIND_SPREAD gives rank `index` of the `count` ranks
// of its node an even share of the node's cores; DSM_BIND_GPU the cores
// nearest GPU `gpu` (spread when gpu < 0). Returns the cores bound to, as an
// hwloc list string. DSM_ERR_NOT_SUPPORTED without hwloc.
std::string bind_self(dsm_bind_t mode, int index, int count, int gpu);

} // namespace dsm::topo
