// The checkpoint parameters (DSM_CKPT_*), for the writer, the reader and files.cc.
#pragma once

#include <string>

namespace dsm {
namespace ckpt {

bool space_check_param();          // DSM_CKPT_SPACE_CHECK
bool precheck_param();             // DSM_CKPT_PRECHECK
long precheck_timeout_param();     // DSM_CKPT_PRECHECK_TIMEOUT, seconds (0: no limit)
std::string fault_param();         // DSM_CKPT_FAULT, "" when unset

} // namespace ckpt
} // namespace dsm
