// Scalar fp16 (IEEE binary16) and bf16 conversions, round to nearest even,
// Inf and NaN kept (a NaN stays a quiet NaN). Header-only, for the host and
// for CUDA device code (src/optim/kernels_cuda.cu): every layer that moves 16-bit
// floats uses these (bulk, vectorized forms: amp/convert.hpp). Each rounding
// is one add or one multiply, which no compiler contracts into an FMA, so
// host and device give the same bits.
#pragma once

#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define DSM_HOST_DEVICE __host__ __device__
#else
#define DSM_HOST_DEVICE
#endif

namespace dsm {

DSM_HOST_DEVICE inline uint32_t float_bits(float x) noexcept {
#ifdef __CUDA_ARCH__
    return __float_as_uint(x);
#else
    uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    return u;
#endif
}

DSM_HOST_DEVICE inline float bits_float(uint32_t u) noexcept {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float x;
    std::memcpy(&x, &u, sizeof x);
    return x;
#endif
}

DSM_HOST_DEVICE inline uint16_t fp32_to_bf16(float x) noexcept {
    uint32_t u = float_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) // NaN: keep the sign, make it quiet
        return static_cast<uint16_t>((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
}

DSM_HOST_DEVICE inline float bf16_to_fp32(uint16_t b) noexcept { return bits_float(static_cast<uint32_t>(b) << 16); }

DSM_HOST_DEVICE inline uint16_t fp32_to_fp16(float x) noexcept {
    const uint32_t u = float_bits(x);
    const uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u); // NaN
    if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u); // overflow (after rounding) or Inf
    if (a < 0x38800000u) {
        // Subnormal or zero in fp16: add 0.5 so the FPU rounds to nearest even
        // at the fp16 subnormal step (2^-24).
        const float f = bits_float(a) + 0.5f;
        return static_cast<uint16_t>(sign | (float_bits(f) - 0x3f000000u));
    }
    const uint32_t odd = (a >> 13) & 1u;
    a += 0xc8000fffu + odd; // rebias exponent (-112 << 23) and round to nearest even
    return static_cast<uint16_t>(sign | (a >> 13));
}

DSM_HOST_DEVICE inline float fp16_to_fp32(uint16_t h) noexcept {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    const uint32_t mant = h & 0x3ffu;
    if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13)); // Inf, NaN
    if (exp == 0) {
        // Zero or subnormal: mant * 2^-24.
        const float f = static_cast<float>(mant) * 5.9604644775390625e-08f;
        return bits_float(sign | float_bits(f));
    }
    return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

} // namespace dsm
