// What the quantization unit tests (test_quantize.cc, test_quantize_device.cc)
// share: the values they quantize and the bound each round trip must keep.
// Include it in place of cxx_test.h, after every other C++ header.
#pragma once

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "comm/quantize.hpp"

#include "cxx_test.h"

// Values with magnitudes that vary from block to block (so that one scale
// per block matters), a zero block, and a short tail.
static inline std::vector<float> sample(size_t n, unsigned seed) {
    std::mt19937 g(seed);
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> x(n);
    for (size_t i = 0; i < n; ++i) x[i] = d(g) * std::ldexp(1.0f, static_cast<int>((i / 100) % 20) - 10);
    for (size_t i = 2 * 64; i < 3 * 64 && i < n; ++i) x[i] = 0.0f;
    return x;
}

// The largest error of a round trip through symmetric blockwise
// quantization, from its definition (not the library's): a block whose
// largest magnitude is amax has the step s = amax / qmax (qmax = 2^(bits-1)
// - 1: 127 for int8, 7 for int4); rounding x / s to the nearest integer
// moves a value by at most s / 2; computing x * (qmax / amax) and q * s in
// fp32 adds a few ulps of amax (8 x 2^-23 x amax covers them).
static inline float round_trip_bound(float amax, int bits) {
    const double qmax = static_cast<double>((1 << (bits - 1)) - 1);
    return static_cast<float>(amax / qmax / 2.0 + 8.0 * std::ldexp(1.0, -23) * amax);
}

// Every value within the bound of its block.
static inline void check_round_trip(const std::vector<float> &x, const std::vector<float> &y, int bits, size_t block,
                                    const char *ctx) {
    for (size_t b0 = 0; b0 < x.size(); b0 += block) {
        const size_t m = std::min(block, x.size() - b0);
        float amax = 0.0f;
        for (size_t i = 0; i < m; ++i) amax = std::max(amax, std::fabs(x[b0 + i]));
        const float bound = round_trip_bound(amax, bits);
        for (size_t i = 0; i < m; ++i)
            if (!(std::fabs(x[b0 + i] - y[b0 + i]) <= bound))
                fail_msg("%s: value %zu: %.9g became %.9g (block max %.9g, bound %.9g)", ctx, b0 + i, x[b0 + i],
                         y[b0 + i], amax, bound);
    }
}
