#include "optim/optimizer_type.hpp"

namespace dsm {
namespace optim {

const char *optimizer_name(OptimizerType t) noexcept {
    switch (t) {
    case OptimizerType::NONE: return "none";
    case OptimizerType::ADAM: return "adam";
    case OptimizerType::ADAMW: return "adamw";
    case OptimizerType::SGD: return "sgd";
    case OptimizerType::LAMB: return "lamb";
    case OptimizerType::LION: return "lion";
    case OptimizerType::ADAGRAD: return "adagrad";
    }
    return "?";
}

} // namespace optim
} // namespace dsm
