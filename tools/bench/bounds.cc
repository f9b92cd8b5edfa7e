// The bounds' table: the widest this CPU runs (bounds.hpp).
#include "bounds.hpp"

namespace dsm {
namespace bench {

const BoundKernels &bounds() noexcept {
    static simd::Dispatch<BoundKernels> tables{bound_kernels<simd::Isa::generic>, bound_kernels<simd::Isa::avx2>,
                                               bound_kernels<simd::Isa::avx512>};
    return tables.at(simd::cpu());
}

} // namespace bench
} // namespace dsm
