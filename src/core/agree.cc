#include "dsm_config.h"

#include "core/agree.hpp"

#include <algorithm>
#include <climits>
#include <map>
#include <sstream>
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "core/hash.hpp"
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

const std::vector<int64_t> &Agreement::by_rank(size_t i) {
    if (all_.empty()) {
        int size = 1;
        DSM_CHECK_MPI(MPI_Comm_size(comm_, &size));
        const size_t n = values_.size();
        std::vector<int64_t> flat(n * static_cast<size_t>(size));
        if (n > 0) {
            const watchdog::WaitScope wait("agreement of the ranks (allgather of a mismatch)", nullptr);
            DSM_CHECK_MPI(MPI_Allgather(values_.data(), static_cast<int>(n), MPI_INT64_T, flat.data(),
                                        static_cast<int>(n), MPI_INT64_T, comm_));
        }
        all_.assign(n, std::vector<int64_t>(static_cast<size_t>(size)));
        for (size_t r = 0; r < static_cast<size_t>(size); ++r)
            for (size_t v = 0; v < n; ++v) all_[v][r] = flat[r * n + v];
    }
    return all_.at(i);
}

std::string rank_list(const std::vector<int> &ranks) {
    std::ostringstream o;
    o << (ranks.size() == 1 ? "rank " : "ranks ");
    size_t items = 0, i = 0;
    for (; i < ranks.size() && items < 8; ++items) {
        size_t j = i;
        while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
        o << (items ? ", " : "") << ranks[i];
        if (j == i + 1) o << ", " << ranks[j];
        else if (j > i + 1) o << "-" << ranks[j];
        i = j + 1;
    }
    if (i < ranks.size()) o << " and " << ranks.size() - i << " more";
    return o.str();
}

std::string by_value(const std::vector<int64_t> &by_rank, const std::function<std::string(int64_t)> &show,
                     const char *has, const char *have) {
    std::vector<int64_t> order;
    std::map<int64_t, std::vector<int>> groups;
    for (size_t r = 0; r < by_rank.size(); ++r) {
        auto &g = groups[by_rank[r]];
        if (g.empty()) order.push_back(by_rank[r]);
        g.push_back(static_cast<int>(r));
    }
    std::ostringstream o;
    const size_t shown = std::min<size_t>(order.size(), 6);
    for (size_t k = 0; k < shown; ++k) {
        const std::vector<int> &g = groups[order[k]];
        o << (k ? "; " : "") << rank_list(g) << " " << (g.size() == 1 ? has : have) << " " << show(order[k]);
    }
    if (shown < order.size()) o << "; and " << order.size() - shown << " other values";
    return o.str();
}

int64_t PointDetail::list_digest() const noexcept {
    uint64_t h = kFnv1aOffset;
    for (const Entry &e : list) {
        h = fnv1a(&e.param, sizeof e.param, h);
        h = fnv1a(&e.offset, sizeof e.offset, h);
        h = fnv1a(&e.count, sizeof e.count, h);
    }
    return static_cast<int64_t>(h >> 1);
}

namespace {

std::string entry_text(const PointDetail::Entry &e, const std::function<std::string(int64_t)> &name) {
    std::ostringstream o;
    o << e.param;
    const std::string n = name ? name(e.param) : std::string();
    if (!n.empty()) o << " ('" << n << "')";
    o << " [" << e.offset << "+" << e.count << "]";
    return o.str();
}

} // namespace

std::string PointDetail::list_text(const std::function<std::string(int64_t)> &name) const {
    std::ostringstream o;
    o << (list.size() == 1 ? "parameter " : "parameters ");
    for (size_t i = 0; i < list.size(); ++i) o << (i ? ", " : "") << entry_text(list[i], name);
    if (list.empty()) o << "none";
    return o.str();
}

std::string list_difference(MPI_Comm comm, const std::vector<PointDetail::Entry> &mine,
                            const std::function<std::string(int64_t)> &name) {
    int size = 1;
    DSM_CHECK_MPI(MPI_Comm_size(comm, &size));
    const watchdog::WaitScope wait("agreement of the ranks (allgather of a mismatch)", nullptr);
    std::vector<int64_t> flat_mine;
    for (const auto &e : mine) flat_mine.insert(flat_mine.end(), {e.param, e.offset, e.count});
    int n = static_cast<int>(flat_mine.size());
    std::vector<int> counts(static_cast<size_t>(size)), displs(static_cast<size_t>(size));
    DSM_CHECK_MPI(MPI_Allgather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, comm));
    int total = 0;
    for (int r = 0; r < size; ++r) {
        displs[static_cast<size_t>(r)] = total;
        total += counts[static_cast<size_t>(r)];
    }
    std::vector<int64_t> flat(static_cast<size_t>(std::max(total, 1)));
    DSM_CHECK_MPI(MPI_Allgatherv(flat_mine.data(), n, MPI_INT64_T, flat.data(), counts.data(), displs.data(),
                                 MPI_INT64_T, comm));
    std::vector<std::vector<PointDetail::Entry>> lists(static_cast<size_t>(size));
    for (int r = 0; r < size; ++r)
        for (int k = 0; k + 2 < counts[static_cast<size_t>(r)]; k += 3) {
            const int64_t *p = &flat[static_cast<size_t>(displs[static_cast<size_t>(r)] + k)];
            lists[static_cast<size_t>(r)].push_back(PointDetail::Entry{p[0], p[1], p[2]});
        }
    // The first position where some list differs from rank 0's.
    size_t longest = 0;
    for (const auto &l : lists) longest = std::max(longest, l.size());
    for (size_t k = 0; k < longest; ++k) {
        bool differs = false;
        for (const auto &l : lists)
            differs = differs || (k < l.size()) != (k < lists[0].size()) ||
                      (k < l.size() && !(l[k] == lists[0][k]));
        if (!differs) continue;
        // Number the distinct entries at k (-1: the list has ended).
        std::vector<PointDetail::Entry> seen;
        std::vector<int64_t> which(static_cast<size_t>(size));
        for (int r = 0; r < size; ++r) {
            const auto &l = lists[static_cast<size_t>(r)];
            if (k >= l.size()) {
                which[static_cast<size_t>(r)] = -1;
                continue;
            }
            auto it = std::find(seen.begin(), seen.end(), l[k]);
            which[static_cast<size_t>(r)] = it - seen.begin();
            if (it == seen.end()) seen.push_back(l[k]);
        }
        return cat("entry ", k, " (counting from 0): ",
                   by_value(which, [&](int64_t w) {
                       if (w < 0) return std::string("no entry there (its list ends before)");
                       return "parameter " + entry_text(seen[static_cast<size_t>(w)], name);
                   }));
    }
    return "the lists are the same";
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
