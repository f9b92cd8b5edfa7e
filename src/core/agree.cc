#include "dsm_config.h"

#include "core/agree.hpp"

#include <climits>
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "core/watchdog.hpp"

namespace dsm {

std::string bcast_string(MPI_Comm comm, int root, const std::string &s) {
    unsigned long long len = s.size();
    DSM_CHECK_MPI(MPI_Bcast(&len, 1, MPI_UNSIGNED_LONG_LONG, root, comm));
    DSM_REQUIRE(len <= static_cast<unsigned long long>(INT_MAX), DSM_ERR_INTERNAL, "a text of ", len,
                " bytes is too long to broadcast");
    std::string out = s;
    out.resize(static_cast<size_t>(len));
    if (len > 0) DSM_CHECK_MPI(MPI_Bcast(&out[0], static_cast<int>(len), MPI_CHAR, root, comm));
    return out;
}

size_t Agreement::add(int64_t value) {
    values_.push_back(value);
    return values_.size() - 1;
}

// One MPI_MAX over: the failure key ((INT_MAX - rank) << 32 | status, so that
// the maximum is the lowest failing rank and carries its status; -1 when this
// rank did not fail), then each value and its complement (~v = -v - 1, whose
// maximum gives the minimum without overflow).
void Agreement::run(dsm_status_t status, std::string message) {
    message_ = std::move(message);
    int rank = 0;
    DSM_CHECK_MPI(MPI_Comm_rank(comm_, &rank));
    std::vector<int64_t> mine(1 + 2 * values_.size());
    mine[0] = status == DSM_SUCCESS ? -1
                                    : static_cast<int64_t>(static_cast<uint64_t>(INT_MAX - rank) << 32 |
                                                           static_cast<uint32_t>(status));
    for (size_t i = 0; i < values_.size(); ++i) {
        mine[1 + 2 * i] = values_[i];
        mine[1 + 2 * i + 1] = ~values_[i];
    }
    result_.assign(mine.size(), 0);
    const watchdog::WaitScope wait("agreement of the ranks (allreduce)", nullptr);
    DSM_CHECK_MPI(MPI_Allreduce(mine.data(), result_.data(), static_cast<int>(mine.size()), MPI_INT64_T, MPI_MAX,
                                comm_));
    if (result_[0] < 0) return;
    first_ = INT_MAX - static_cast<int>(result_[0] >> 32);
    status_ = static_cast<dsm_status_t>(static_cast<uint32_t>(result_[0] & 0xffffffff));
}

void Agreement::run(const std::function<void()> &local) {
    dsm_status_t status = DSM_SUCCESS;
    std::string message;
    try {
        local();
    } catch (const Error &e) {
        status = e.status();
        message = e.message();
    }
    run(status, std::move(message));
}

void Agreement::throw_if_failed() const {
    if (!failed()) return;
    const std::string text = bcast_string(comm_, first_, message_);
    DSM_FAIL(status_, "rank ", first_, ": ", text);
}

void agree(MPI_Comm comm, const std::function<void()> &local) {
    Agreement a(comm);
    a.run(local);
    a.throw_if_failed();
}

void agree_same(MPI_Comm comm, const std::string &what, const std::string &canonical) {
    std::string root = bcast_string(comm, 0, canonical);
    // A rank whose text differs from rank 0's "fails" this agreement.
    Agreement a(comm);
    a.run(root == canonical ? DSM_SUCCESS : DSM_ERR_MISMATCH);
    if (!a.failed()) return;
    const int first = a.failed_rank();
    std::string other = bcast_string(comm, first, canonical);
    DSM_FAIL(DSM_ERR_MISMATCH, what, " differ across ranks: rank 0 has ", root, ", rank ", first,
             " has ", other);
}

} // namespace dsm
