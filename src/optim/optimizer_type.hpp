// The optimizers libdsm implements, by DeepSpeed's names. The configuration
// (config/) names its optimizer with this type; the optimizer layer needs
// nothing else from it.
#pragma once

namespace dsm {
namespace optim {

enum class OptimizerType { NONE, ADAM, ADAMW, SGD, LAMB, LION, ADAGRAD };

// DeepSpeed's lower-case name ("adamw"; "none" for NONE).
const char *optimizer_name(OptimizerType t) noexcept;

} // namespace optim
} // namespace dsm
