#include "dsm_config.h"

#include "core/agree.hpp"

#include <climits>
#include <vector>

#include "core/error.hpp"

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

void agree(MPI_Comm comm, const std::function<void()> &local) {
    dsm_status_t status = DSM_SUCCESS;
    std::string message;
    try {
        local();
    } catch (const Error &e) {
        status = e.status();
        message = e.message();
    }
    int rank = 0;
    DSM_CHECK_MPI(MPI_Comm_rank(comm, &rank));
    int mine = status == DSM_SUCCESS ? INT_MAX : rank;
    int first = INT_MAX;
    DSM_CHECK_MPI(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm));
    if (first == INT_MAX) return;
    int st = static_cast<int>(status);
    DSM_CHECK_MPI(MPI_Bcast(&st, 1, MPI_INT, first, comm));
    std::string text = bcast_string(comm, first, message);
    DSM_FAIL(static_cast<dsm_status_t>(st), "rank ", first, ": ", text);
}

void agree_same(MPI_Comm comm, const std::string &what, const std::string &canonical) {
    std::string root = bcast_string(comm, 0, canonical);
    int rank = 0;
    DSM_CHECK_MPI(MPI_Comm_rank(comm, &rank));
    int mine = root == canonical ? INT_MAX : rank;
    int first = INT_MAX;
    DSM_CHECK_MPI(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm));
    if (first == INT_MAX) return;
    std::string other = bcast_string(comm, first, canonical);
    DSM_FAIL(DSM_ERR_MISMATCH, what, " differ across ranks: rank 0 has ", root, ", rank ", first,
             " has ", other);
}

} // namespace dsm
