/*
 * The C++ MPI tests' checks: a failed check is recorded on its rank and the
 * test goes on; at the end of each test every rank learns whether some rank
 * failed, so no rank leaves a collective that others still wait in.
 * Include after the C++ headers and mpi_test.h (CMocka's macros last).
 */
#ifndef DSM_MPI_TEST_CXX_H
#define DSM_MPI_TEST_CXX_H

#include <exception>
#include <functional>
#include <string>

#include "core/error.hpp"

namespace {
// ---------------------------------------------------------------- failures

std::string g_failure; // the first failed check on this rank
int g_failures = 0;

void record(const std::string &what) {
    if (g_failures++ == 0) g_failure = what;
}

#define CHECK(cond, ...)                                                                                 \
    do {                                                                                                 \
        if (!(cond)) record(dsm::cat("line ", __LINE__, ": ", __VA_ARGS__));                             \
    } while (0)

// End of a test: every rank learns whether some rank failed.
void agree_on_failures() {
    int mine = g_failures, worst = 0, lowest = test_size;
    int failing_rank = g_failures ? test_rank : test_size;
    MPI_Allreduce(&mine, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(&failing_rank, &lowest, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    const std::string msg = g_failure;
    const int count = g_failures;
    g_failures = 0;
    g_failure.clear();
    if (count) fail_msg("%d failed checks, the first: %s", count, msg.c_str());
    if (worst) fail_msg("rank %d failed", lowest);
}

// Run a test body; an unexpected exception is a failure, not a crash.
void guarded(const std::function<void()> &body) {
    try {
        body();
    } catch (const std::exception &e) {
        record(std::string("unexpected exception: ") + e.what());
    }
    agree_on_failures();
}

// f() throws dsm::Error with `status` and a message containing `text`.
void expect_error(const std::function<void()> &f, dsm_status_t status, const std::string &text, int line) {
    try {
        f();
    } catch (const dsm::Error &e) {
        if (e.status() != status)
            record(dsm::cat("line ", line, ": status ", e.status(), ", expected ", status, " (", e.what(), ")"));
        else if (e.message().find(text) == std::string::npos)
            record(dsm::cat("line ", line, ": \"", e.what(), "\" lacks \"", text, "\""));
        return;
    }
    record(dsm::cat("line ", line, ": no error, expected status ", status));
}
#define EXPECT_ERROR(call, status, text) expect_error([&] { call; }, (status), (text), __LINE__)

} // namespace

#endif
