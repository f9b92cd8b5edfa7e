// Shared helpers of the C++ unit tests. Include after every C++ header: the
// fail() macro of CMocka would break them.
#pragma once

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "core/error.hpp"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

extern "C" { // this CMocka header has no C++ guards
#include <cmocka.h>
}

static const double kPi = 3.14159265358979323846;

// |actual - expected| within 1e-12 relative (exact when expected is 0).
static inline void near_at(double actual, double expected, int line) {
    const double tol = 1e-12 * std::fabs(expected);
    if (!(std::fabs(actual - expected) <= tol)) {
        fail_msg("line %d: got %.17g, expected %.17g", line, actual, expected);
    }
}
#define NEAR(actual, expected) near_at((actual), (expected), __LINE__)

static inline void all_near_at(const std::vector<double> &actual, const std::vector<double> &expected,
                               int line) {
    if (actual.size() != expected.size())
        fail_msg("line %d: got %zu values, expected %zu", line, actual.size(), expected.size());
    for (size_t i = 0; i < actual.size(); ++i) near_at(actual[i], expected[i], line);
}
#define ALL_NEAR(actual, ...) all_near_at((actual), std::vector<double> __VA_ARGS__, __LINE__)

// f() throws dsm::Error with `status` and a message containing every part.
static inline void expect_error_at(const std::function<void()> &f, dsm_status_t status,
                                   const std::vector<std::string> &parts, int line) {
    bool thrown = false;
    dsm_status_t got = DSM_SUCCESS;
    std::string message;
    try {
        f();
    } catch (const dsm::Error &e) {
        thrown = true;
        got = e.status();
        message = e.message();
    }
    if (!thrown) fail_msg("line %d: no error", line);
    if (got != status) fail_msg("line %d: status %d, expected %d (%s)", line, got, status, message.c_str());
    for (const auto &part : parts) {
        if (message.find(part) == std::string::npos)
            fail_msg("line %d: \"%s\" lacks \"%s\"", line, message.c_str(), part.c_str());
    }
}
