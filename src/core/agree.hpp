// Collective calls agree on errors: every rank runs its local checks, then
// the ranks exchange their outcome so that all of them return the same status
// with the message of the lowest failing rank, and none is left waiting in a
// later collective.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <mpi.h>

#include "dsm.h"

namespace dsm {

// One round of the agreement of a collective entry point over `comm`: every
// rank gives its local status (DSM_SUCCESS or the status of its failure) and
// any number of integer values; one allreduce gives every rank the lowest
// failing rank with its status, and each value's minimum and maximum over
// the ranks. Every collective entry point agrees through this type (agree()
// and agree_same() below are built on it).
class Agreement {
public:
    explicit Agreement(MPI_Comm comm) : comm_(comm) {}

    // A value to agree on; its index for min(), max() and same().
    size_t add(int64_t value);
    // The allreduce (collective). `status`: this rank's outcome; `message`:
    // its error message, for throw_if_failed().
    void run(dsm_status_t status, std::string message = std::string());
    // run() with the outcome of `local` (argument checks that may throw
    // dsm::Error; other exceptions propagate without agreeing).
    void run(const std::function<void()> &local);

    bool failed() const noexcept { return first_ >= 0; }
    int failed_rank() const noexcept { return first_; }          // -1 when none failed
    dsm_status_t failed_status() const noexcept { return status_; } // the lowest failing rank's
    int64_t min(size_t i) const noexcept { return ~result_[1 + 2 * i + 1]; }
    int64_t max(size_t i) const noexcept { return result_[1 + 2 * i]; }
    bool same(size_t i) const noexcept { return min(i) == max(i); }

    // Value i of every rank, by rank (collective: an allgather of every
    // value, made once and kept; for the messages of a mismatch, so every
    // rank of `comm` must call it when one does).
    const std::vector<int64_t> &by_rank(size_t i);

    // If a rank failed: the lowest failing rank broadcasts its message and
    // every rank throws its status with "rank R: message" (collective when
    // failed(); nothing otherwise).
    void throw_if_failed() const;

private:
    MPI_Comm comm_;
    std::vector<int64_t> values_;
    std::vector<int64_t> result_;
    std::vector<std::vector<int64_t>> all_; // by_rank(): by value, by rank
    int first_ = -1;
    dsm_status_t status_ = DSM_SUCCESS;
    std::string message_;
};

// The ranks of `comm` grouped by their value, for a message: "rank 0 has
// 64; ranks 1-3 have 0" (`show` writes a value; groups in the order of
// their lowest rank; at most 6 groups named, then how many more). Local.
std::string by_value(const std::vector<int64_t> &by_rank, const std::function<std::string(int64_t)> &show,
                     const char *has = "has", const char *have = "have");

// "rank 3", "ranks 0, 2, 5-7" (at most 8 items, then "and N more"). Local.
std::string rank_list(const std::vector<int> &ranks);

// What the ranks agree on at a collective point besides being there: a few
// named values (a parameter's index, a range's offset and count) and a list
// (a gradient bucket's entries: parameter, offset, count), each the same on
// every rank or the mismatch is named with each side's value. The list is
// compared through a digest in the agreement; only on a mismatch do the
// ranks exchange their lists to name the first entry that differs (the
// digest itself is never shown).
struct PointDetail {
    static constexpr int kValues = 3;
    int n = 0;
    const char *name[kValues] = {}; // static strings: "parameter index", "offset", "count"
    int64_t value[kValues] = {};
    struct Entry {
        int64_t param = 0, offset = 0, count = 0;
        bool operator==(const Entry &o) const noexcept {
            return param == o.param && offset == o.offset && count == o.count;
        }
    };
    std::vector<Entry> list;  // empty: none
    int64_t bucket = -1;      // the bucket's index (for the watchdog's message; not agreed)

    PointDetail() = default;
    PointDetail(const char *name0, int64_t value0) { add(name0, value0); }
    PointDetail &add(const char *field, int64_t v) {
        if (n < kValues) {
            name[n] = field;
            value[n++] = v;
        }
        return *this;
    }
    // The list's digest (FNV-1a over the entries), to compare only.
    int64_t list_digest() const noexcept;
    // "parameters 3 [0+64], 4 [0+17]": the list for the watchdog's message
    // (`name` gives a parameter's name, or empty).
    std::string list_text(const std::function<std::string(int64_t)> &name = {}) const;
};

// Collective over `comm`, on the error path: every rank's `mine`, and the
// first entry at which some rank's list differs from rank 0's, as a
// message: "entry 2 (counting from 0): rank 0 has parameter 3 [0+64]; rank 1
// has parameter 4 [0+17]", or the lengths when one list is a prefix of the
// other. `name` gives a parameter's name (or empty).
std::string list_difference(MPI_Comm comm, const std::vector<PointDetail::Entry> &mine,
                            const std::function<std::string(int64_t)> &name = {});

// Rank `root`'s `s` on every rank of `comm` (collective).
std::string bcast_string(MPI_Comm comm, int root, const std::string &s);

// Run `local` (argument checks that may throw dsm::Error) on every rank of
// `comm`, then agree: if any rank failed, every rank throws the status and
// message ("rank R: ...") of the lowest failing rank. `comm` must have
// MPI_ERRORS_RETURN.
void agree(MPI_Comm comm, const std::function<void()> &local);

// Every rank passes a canonical text of its arguments; all ranks throw
// DSM_ERR_MISMATCH naming the first rank whose text differs from rank 0's,
// with both texts.
void agree_same(MPI_Comm comm, const std::string &what, const std::string &canonical);

} // namespace dsm
