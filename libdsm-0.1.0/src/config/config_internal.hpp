// Readers for the parts of the configuration, shared by the config/*.cc files.
#pragma once

#include "config/config.hpp"
#include "config/json_reader.hpp"

namespace dsm {
namespace config {

void read_zero(Node &root, Config &cfg);        // config_zero.cc
void read_optimizer(Node &root, Config &cfg);   // config_optim.cc
void read_scheduler(Node &root, Config &cfg);   // config_optim.cc
// Dtype names as DeepSpeed spells them (fp32/float32/float/torch.float32, ...).
Dtype dtype_from(Node &node, const std::string &key, Dtype def, bool allow_none);

} // namespace config
} // namespace dsm
