// amp's AVX2 kernels (convert_kernels.hpp; this file is compiled with
// SIMD_AVX2_FLAGS, run only when simd::isa() allows): fp16 through F16C,
// bf16 in AVX2 registers, the norms' sixteen lanes vectorized by the compiler.
#include "amp/convert_body.hpp"

namespace dsm {
namespace amp {
namespace kernels {

#if defined(__AVX2__) && defined(__F16C__)
template <> const Table *table<simd::Isa::avx2>() noexcept {
    static const Table t{"avx2", f32_to_f16_f16c, f16_to_f32_f16c, f32_to_bf16_avx2, bf16_to_f32_avx2,
                         sumsq_f32,       sumsq_bf16};
    return &t;
}
#else // the compiler cannot target AVX2 here
template <> const Table *table<simd::Isa::avx2>() noexcept { return nullptr; }
#endif

} // namespace kernels
} // namespace amp
} // namespace dsm
