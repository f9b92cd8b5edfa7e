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

// Every value within the bound of its block.
static inline void check_round_trip(const std::vector<float> &x, const std::vector<float> &y, int bits, size_t block,
                                    const char *ctx) {
    for (size_t b0 = 0; b0 < x.size(); b0 += block) {
        const size_t m = std::min(block, x.size() - b0);
        float amax = 0.0f;
        for (size_t i = 0; i < m; ++i) amax = std::max(amax, std::fabs(x[b0 + i]));
        const float bound = dsm::comm::quant::error_bound(amax, bits);
        for (size_t i = 0; i < m; ++i)
            if (!(std::fabs(x[b0 + i] - y[b0 + i]) <= bound))
                fail_msg("%s: value %zu: %.9g became %.9g (block max %.9g, bound %.9g)", ctx, b0 + i, x[b0 + i],
                         y[b0 + i], amax, bound);
    }
}
