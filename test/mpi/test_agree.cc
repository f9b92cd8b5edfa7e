// The agreement protocol (core/agree.hpp): the lowest failing rank with its
// status and message on every rank, values' minimum and maximum (extremes
// included), agree() and agree_same().
#include <climits>
#include <cstdint>
#include <string>

#include "core/agree.hpp"
#include "core/comm.hpp"
#include "core/error.hpp"

// CMocka (through mpi_test.h) last: its fail() macro would break the C++ headers.
#include "mpi_test.h"
#include "mpi_test_cxx.h"

namespace {

// A duplicate of MPI_COMM_WORLD with MPI_ERRORS_RETURN, as the library's own.
dsm::Comm world() { return dsm::Comm::dup(MPI_COMM_WORLD); }

} // namespace

static void test_no_failure_values(void **) {
    guarded([] {
        const dsm::Comm c = world();
        dsm::Agreement a(c.get());
        const size_t r = a.add(test_rank), lo = a.add(INT64_MIN + test_rank), hi = a.add(INT64_MAX - test_rank),
                     same = a.add(-7);
        a.run(DSM_SUCCESS);
        CHECK(!a.failed() && a.failed_rank() == -1, "a failure without one");
        CHECK(a.min(r) == 0 && a.max(r) == test_size - 1, "rank range ", a.min(r), "..", a.max(r));
        CHECK(a.min(lo) == INT64_MIN && a.max(lo) == INT64_MIN + test_size - 1, "extreme low ", a.min(lo));
        CHECK(a.max(hi) == INT64_MAX && a.min(hi) == INT64_MAX - (test_size - 1), "extreme high ", a.max(hi));
        CHECK(a.same(same) && a.min(same) == -7, "a value every rank gives");
        CHECK(a.same(r) == (test_size == 1), "same() of different values");
        a.throw_if_failed(); // nothing to throw
    });
}

// The ranks from the middle up fail, each with its own status: every rank
// learns the lowest one, with its status and message.
static void test_lowest_failing_rank(void **) {
    guarded([] {
        const dsm::Comm c = world();
        const int first = test_size / 2;
        const dsm_status_t mine = test_rank < first ? DSM_SUCCESS
                                  : test_rank == first ? DSM_ERR_IO
                                                       : DSM_ERR_INVALID_ARGUMENT;
        dsm::Agreement a(c.get());
        const size_t v = a.add(test_rank);
        a.run(mine, dsm::cat("failed here on ", test_rank));
        CHECK(a.failed() && a.failed_rank() == first, "failed rank ", a.failed_rank(), ", expected ", first);
        CHECK(a.failed_status() == DSM_ERR_IO, "status ", a.failed_status());
        CHECK(a.max(v) == test_size - 1, "values agreed with a failure too");
        EXPECT_ERROR(a.throw_if_failed(), DSM_ERR_IO, dsm::cat("rank ", first, ": failed here on ", first));
    });
}

static void test_agree(void **) {
    guarded([] {
        const dsm::Comm c = world();
        dsm::agree(c.get(), [] {});
        const int last = test_size - 1;
        EXPECT_ERROR(dsm::agree(c.get(),
                                [&] {
                                    DSM_REQUIRE(test_rank != last, DSM_ERR_NULL_POINTER, "p is NULL on ", test_rank);
                                }),
                     DSM_ERR_NULL_POINTER, dsm::cat("rank ", last, ": p is NULL on ", last));
        dsm::agree_same(c.get(), "the texts", "same everywhere");
        if (test_size > 1)
            EXPECT_ERROR(dsm::agree_same(c.get(), "the texts", test_rank == last ? "other" : "same"),
                         DSM_ERR_MISMATCH, dsm::cat("the texts differ across ranks: rank 0 has same, rank ", last,
                                                    " has other"));
    });
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_failure_values),
        cmocka_unit_test(test_lowest_failing_rank),
        cmocka_unit_test(test_agree),
    };
    return RUN_MPI_TESTS("agree", tests);
}
