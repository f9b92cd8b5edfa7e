// The between-node stage of the shm backend (net.hpp): pipelined ring and
// recursive halving/doubling over point-to-point MPI on a lane.
//
// Messages carry at most one chunk (DSM_COMM_NET_CHUNK bytes) as MPI_BYTE,
// so counts stay far below INT_MAX whatever the buffer size. Between a pair
// of lane members, messages of one phase share a tag and are posted in the
// same order on both sides (MPI keeps that order), so chunk c of a block
// always meets chunk c.
#include "dsm_config.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "comm/net.hpp"
#include "comm/reduce.hpp"
#include "core/error.hpp"
#include "core/param.hpp"

namespace dsm {
namespace comm {

namespace {

DSM_PARAM(comm, COMM_NET_ALGO, param::Choice({"auto", "ring", "rhd", "mpi"}), "auto",
          "How the shm backend's allreduce, reduce-scatter and allgather cross nodes (on one lane per "
          "local rank): ring (pipelined ring over point-to-point MPI), rhd (recursive halving and doubling; "
          "node counts that are not powers of two fold onto one), mpi (MPI's own collectives on the lanes) "
          "or auto (two nodes: rhd for an allreduce, which is then one exchange of the whole lane, else ring; "
          "more nodes: rhd for a power of two when each node's block is under 64 KiB, else ring). Read when "
          "the backend is created.");
DSM_PARAM(comm, COMM_NET_CHUNK, param::Size(4096, size_t(1) << 30), "60K",
          "Bytes per message of the shm backend's between-node stage (ring, rhd): the unit in which the "
          "stages of a collective overlap. The default stays under Open MPI's eager limit over TCP (64 KiB), "
          "so that no message waits for a handshake behind queued data; raise it on fabrics with a larger "
          "eager limit. 4096 to 1073741824; a K, M or G suffix allowed.");

constexpr int kTagRs = 0x4e01;   // reduce-scatter steps
constexpr int kTagAg = 0x4e02;   // allgather steps
constexpr int kTagFold = 0x4e03; // rhd: a surplus member hands its data to its partner
constexpr int kTagPost = 0x4e04; // rhd: the partner hands back the surplus member's result

void wait_all(std::vector<MPI_Request> *reqs) {
    if (reqs->empty()) return;
    DSM_CHECK_MPI(MPI_Waitall(static_cast<int>(reqs->size()), reqs->data(), MPI_STATUSES_IGNORE));
    reqs->clear();
}

} // namespace

// ---------------------------------------------------------------- parameters

NetAlgo net_algo_param() {
    const std::string v = param_COMM_NET_ALGO().value();
    if (v == "ring") return NetAlgo::RING;
    if (v == "rhd") return NetAlgo::RHD;
    if (v == "mpi") return NetAlgo::MPI;
    return NetAlgo::AUTO;
}

size_t net_chunk_param() { return param_COMM_NET_CHUNK().value(); }

const char *net_algo_label(NetAlgo a) noexcept {
    switch (a) {
    case NetAlgo::AUTO: return "auto";
    case NetAlgo::RING: return "ring";
    case NetAlgo::RHD: return "rhd";
    case NetAlgo::MPI: return "mpi";
    }
    return "invalid";
}

NetAlgo net_resolve(NetAlgo a, int k, size_t bytes, bool allreduce) noexcept {
    if (a != NetAlgo::AUTO) return a;
    // Two nodes: a reduce-scatter or an allgather is one exchange either
    // way; an allreduce with rhd is one exchange of the whole lane, where
    // the ring's allgather waits for its reduce-scatter.
    if (k == 2) return allreduce ? NetAlgo::RHD : NetAlgo::RING;
    // More: halving/doubling takes log2(k) steps where the ring takes k-1,
    // which wins when the blocks are too small to pipeline (below 64 KiB);
    // only for powers of two, where it moves no more bytes than the ring.
    const bool pow2 = (k & (k - 1)) == 0;
    if (k > 2 && pow2 && bytes < static_cast<size_t>(k) * (size_t(64) << 10)) return NetAlgo::RHD;
    return NetAlgo::RING;
}

// ---------------------------------------------------------------- lane

NetLane::NetLane(MPI_Comm lane, size_t esize, size_t chunk_bytes, NetAlgo algo, dsm_dtype_t dtype, Op op,
                 ScratchBuffer *a, ScratchBuffer *b, ScratchBuffer *c)
    : comm_(lane), esize_(esize), chunk_(std::max<size_t>(1, chunk_bytes / esize)), algo_(algo), dtype_(dtype),
      op_(op), a_(a), b_(b), c_(c) {
    DSM_CHECK_MPI(MPI_Comm_rank(lane, &me_));
    DSM_CHECK_MPI(MPI_Comm_size(lane, &k_));
}

void NetLane::isend(const char *p, size_t n, int to, int tag, std::vector<MPI_Request> *reqs) {
    reqs->emplace_back();
    DSM_CHECK_MPI(MPI_Isend(p, static_cast<int>(n * esize_), MPI_BYTE, to, tag, comm_, &reqs->back()));
}

void NetLane::irecv(char *p, size_t n, int from, int tag, std::vector<MPI_Request> *reqs) {
    reqs->emplace_back();
    DSM_CHECK_MPI(MPI_Irecv(p, static_cast<int>(n * esize_), MPI_BYTE, from, tag, comm_, &reqs->back()));
}

void NetLane::combine(char *dst, const char *received, size_t n) const {
    const void *srcs[2] = {received, dst};
    reduce_sources(dst, srcs, 2, n, dtype_, op_);
}

void NetLane::reduce_scatter(const NodeInput &in, const std::vector<size_t> &lc, const std::vector<size_t> &ld,
                             char *out) {
    if (algo_ == NetAlgo::RHD) rhd_rs(in, lc, ld, out);
    else ring(in, lc, ld, out, nullptr);
}

void NetLane::allgather(char *w, const std::vector<size_t> &lc, const std::vector<size_t> &ld) {
    if (algo_ == NetAlgo::RHD) rhd_ag(w, lc, ld);
    else ring_ag(w, lc, ld);
}

void NetLane::allreduce(const NodeInput &in, char *w, const std::vector<size_t> &lc, const std::vector<size_t> &ld) {
    if (algo_ == NetAlgo::RHD && k_ == 2) {
        exchange(in, lc, ld, w);
    } else if (algo_ == NetAlgo::RHD) {
        rhd_rs(in, lc, ld, w + ld[static_cast<size_t>(me_)] * esize_);
        rhd_ag(w, lc, ld);
    } else {
        ring(in, lc, ld, w + ld[static_cast<size_t>(me_)] * esize_, w);
    }
}

// ---------------------------------------------------------------- two nodes

// Allreduce between two nodes: each sends its whole partial, computed chunk
// by chunk and sent as each chunk is ready, and reduces the other's as it
// lands, node 0's partial first on both, so that both get the same bits.
// The same bytes per direction as reduce-scatter + allgather, in one phase:
// no chunk waits for another's reduction on the far side.
void NetLane::exchange(const NodeInput &in, const std::vector<size_t> &lc, const std::vector<size_t> &ld, char *w) {
    const size_t es = esize_, ch = chunk_;
    const int other = 1 - me_;
    const size_t total = lc[0] + lc[1];
    char *own = static_cast<char *>(c_->get(total * es)), *got = static_cast<char *>(a_->get(total * es));
    std::vector<MPI_Request> sends, recvs;
    for (size_t j = 0, pos = 0; j < 2; pos += lc[j], ++j)
        for (size_t at = 0; at < lc[j]; at += ch) irecv(got + (pos + at) * es, std::min(ch, lc[j] - at), other, kTagRs, &recvs);
    for (size_t j = 0, pos = 0; j < 2; pos += lc[j], ++j)
        for (size_t at = 0; at < lc[j]; at += ch) {
            const size_t n = std::min(ch, lc[j] - at);
            if (in.direct != nullptr) {
                isend(in.direct + (ld[j] + at) * es, n, other, kTagRs, &sends);
            } else {
                in.reduce(own + (pos + at) * es, nullptr, ld[j] + at, n);
                isend(own + (pos + at) * es, n, other, kTagRs, &sends);
            }
        }
    size_t c = 0;
    for (size_t j = 0, pos = 0; j < 2; pos += lc[j], ++j)
        for (size_t at = 0; at < lc[j]; at += ch, ++c) {
            const size_t n = std::min(ch, lc[j] - at);
            DSM_CHECK_MPI(MPI_Wait(&recvs[c], MPI_STATUS_IGNORE));
            const char *mine = in.direct != nullptr ? in.direct + (ld[j] + at) * es : own + (pos + at) * es;
            const char *theirs = got + (pos + at) * es;
            const void *srcs[2] = {me_ == 0 ? mine : theirs, me_ == 0 ? theirs : mine};
            reduce_sources(w + (ld[j] + at) * es, srcs, 2, n, dtype_, op_);
        }
    wait_all(&sends);
}

// ---------------------------------------------------------------- ring

// Reduce-scatter: at step s (0..k-2) member i sends block i-s-1 and receives
// block i-s-2 (mod k), which it reduces with its own contribution chunk by
// chunk and sends on at step s+1 as soon as each chunk is done; at the last
// step the block received is its own, reduced into `out`. Two receive
// buffers alternate; a buffer is reused once the sends from it two steps
// earlier are complete. With `w` (allreduce) the allgather follows in the
// same pipeline: each finished chunk of `out` leaves for the next member at
// once, every allgather receive is posted at the start, and each received
// chunk is forwarded as soon as it lands.
void NetLane::ring(const NodeInput &in, const std::vector<size_t> &lc, const std::vector<size_t> &ld, char *out,
                   char *w) {
    const int k = k_, i = me_, next = (i + 1) % k, prev = (i + k - 1) % k;
    const size_t es = esize_, ch = chunk_;
    auto blk = [&](int s) { return static_cast<size_t>(((i - s) % k + k) % k); };
    const size_t mine = static_cast<size_t>(i);
    if (k == 1) {
        for (size_t at = 0; at < lc[mine]; at += ch)
            in.reduce(out + at * es, nullptr, ld[mine] + at, std::min(ch, lc[mine] - at));
        return;
    }
    const size_t most = *std::max_element(lc.begin(), lc.end());
    char *bufs[2] = {static_cast<char *>(a_->get(most * es)), static_cast<char *>(b_->get(most * es))};
    std::vector<MPI_Request> sends[2], other, agr, rr;

    if (w != nullptr)
        for (int t = 0; t + 1 < k; ++t) {
            const size_t b = blk(t + 1);
            for (size_t at = 0; at < lc[b]; at += ch)
                irecv(w + (ld[b] + at) * es, std::min(ch, lc[b] - at), prev, kTagAg, &agr);
        }
    // Step 0: this node's contribution to block i-1, as it is or reduced over the node.
    const size_t b0 = blk(1);
    char *s0 = in.direct != nullptr ? nullptr : static_cast<char *>(c_->get(lc[b0] * es));
    for (size_t at = 0; at < lc[b0]; at += ch) {
        const size_t n = std::min(ch, lc[b0] - at);
        if (in.direct != nullptr) {
            isend(in.direct + (ld[b0] + at) * es, n, next, kTagRs, &other);
        } else {
            in.reduce(s0 + at * es, nullptr, ld[b0] + at, n);
            isend(s0 + at * es, n, next, kTagRs, &other);
        }
    }
    for (int s = 0; s + 1 < k; ++s) {
        const size_t rb = blk(s + 2);
        char *r = bufs[s % 2];
        wait_all(&sends[s % 2]);
        for (size_t at = 0; at < lc[rb]; at += ch) irecv(r + at * es, std::min(ch, lc[rb] - at), prev, kTagRs, &rr);
        size_t c = 0;
        for (size_t at = 0; at < lc[rb]; at += ch, ++c) {
            const size_t n = std::min(ch, lc[rb] - at);
            DSM_CHECK_MPI(MPI_Wait(&rr[c], MPI_STATUS_IGNORE));
            if (s + 2 < k) {
                in.reduce(r + at * es, r + at * es, ld[rb] + at, n);
                isend(r + at * es, n, next, kTagRs, &sends[s % 2]);
            } else {
                in.reduce(out + at * es, r + at * es, ld[rb] + at, n);
                if (w != nullptr) isend(out + at * es, n, next, kTagAg, &other);
            }
        }
        rr.clear();
    }
    if (w != nullptr) {
        size_t c = 0;
        for (int t = 0; t + 1 < k; ++t) {
            const size_t b = blk(t + 1);
            for (size_t at = 0; at < lc[b]; at += ch, ++c) {
                DSM_CHECK_MPI(MPI_Wait(&agr[c], MPI_STATUS_IGNORE));
                if (t + 2 < k) isend(w + (ld[b] + at) * es, std::min(ch, lc[b] - at), next, kTagAg, &other);
            }
        }
    }
    wait_all(&sends[0]);
    wait_all(&sends[1]);
    wait_all(&other);
}

// Allgather: at step t member i sends block i-t and receives block i-t-1,
// forwarding each chunk as it lands (every receive posted at the start).
void NetLane::ring_ag(char *w, const std::vector<size_t> &lc, const std::vector<size_t> &ld) {
    const int k = k_, i = me_, next = (i + 1) % k, prev = (i + k - 1) % k;
    const size_t es = esize_, ch = chunk_;
    if (k == 1) return;
    auto blk = [&](int s) { return static_cast<size_t>(((i - s) % k + k) % k); };
    std::vector<MPI_Request> agr, sends;
    for (int t = 0; t + 1 < k; ++t) {
        const size_t b = blk(t + 1);
        for (size_t at = 0; at < lc[b]; at += ch) irecv(w + (ld[b] + at) * es, std::min(ch, lc[b] - at), prev, kTagAg, &agr);
    }
    const size_t mine = static_cast<size_t>(i);
    for (size_t at = 0; at < lc[mine]; at += ch)
        isend(w + (ld[mine] + at) * es, std::min(ch, lc[mine] - at), next, kTagAg, &sends);
    size_t c = 0;
    for (int t = 0; t + 1 < k; ++t) {
        const size_t b = blk(t + 1);
        for (size_t at = 0; at < lc[b]; at += ch, ++c) {
            DSM_CHECK_MPI(MPI_Wait(&agr[c], MPI_STATUS_IGNORE));
            if (t + 2 < k) isend(w + (ld[b] + at) * es, std::min(ch, lc[b] - at), next, kTagAg, &sends);
        }
    }
    wait_all(&sends);
}

// ---------------------------------------------------------------- recursive halving / doubling

// k = p + r with p the largest power of two <= k. The first 2r members pair
// up: the odd one hands its data to the even one (fold) and gets its result
// back at the end (post); the p remaining "virtual" members run log2(p)
// steps. Virtual member v stands for blocks [first(v), end(v)): two blocks
// (2v, 2v+1) for v < r, else block v + r.
namespace {
struct Fold {
    int p = 1, r = 0;
    Fold(int k) {
        while (p * 2 <= k) p *= 2;
        r = k - p;
    }
    int real(int v) const { return v < r ? 2 * v : v + r; }
    int virt(int i) const { return i < 2 * r ? (i % 2 ? -1 : i / 2) : i - r; }
    size_t first(int v) const { return static_cast<size_t>(v < r ? 2 * v : v + r); }
    size_t end(int v) const { return static_cast<size_t>(v < r ? 2 * v + 2 : v + r + 1); }
};
} // namespace

// Reduce-scatter by recursive halving on a private copy of the node's
// partial (blocks one after the other in node order): at each step a
// virtual member sends the half of its current range that its partner
// keeps and reduces the partner's copy of its own half, chunk by chunk as
// the chunks land.
void NetLane::rhd_rs(const NodeInput &in, const std::vector<size_t> &lc, const std::vector<size_t> &ld, char *out) {
    const size_t es = esize_, ch = chunk_, k = static_cast<size_t>(k_);
    const int i = me_;
    std::vector<size_t> pd(k + 1, 0); // element offsets in acc
    for (size_t j = 0; j < k; ++j) pd[j + 1] = pd[j] + lc[j];
    const size_t total = pd[k];
    char *acc = static_cast<char *>(a_->get(total * es));
    char *tmp = static_cast<char *>(b_->get(total * es));
    const Fold f(k_);
    std::vector<MPI_Request> sends, recvs;
    // Send [x, y) of acc / receive it into tmp and reduce into acc, in chunks.
    auto send_range = [&](size_t x, size_t y, int to, int tag) {
        for (size_t at = x; at < y; at += ch) isend(acc + at * es, std::min(ch, y - at), to, tag, &sends);
    };
    auto reduce_range = [&](size_t x, size_t y, int from, int tag) {
        for (size_t at = x; at < y; at += ch) irecv(tmp + at * es, std::min(ch, y - at), from, tag, &recvs);
        size_t c = 0;
        for (size_t at = x; at < y; at += ch, ++c) {
            DSM_CHECK_MPI(MPI_Wait(&recvs[c], MPI_STATUS_IGNORE));
            combine(acc + at * es, tmp + at * es, std::min(ch, y - at));
        }
        recvs.clear();
    };
    for (size_t j = 0; j < k; ++j)
        for (size_t at = 0; at < lc[j]; at += ch) in.reduce(acc + (pd[j] + at) * es, nullptr, ld[j] + at, std::min(ch, lc[j] - at));

    const size_t mine = static_cast<size_t>(i);
    const int v = f.virt(i);
    if (v < 0) { // a surplus member: everything to the partner, its block back
        send_range(0, total, i - 1, kTagFold);
        for (size_t at = 0; at < lc[mine]; at += ch) irecv(out + at * es, std::min(ch, lc[mine] - at), i - 1, kTagPost, &recvs);
        wait_all(&recvs);
        wait_all(&sends);
        return;
    }
    if (i < 2 * f.r) reduce_range(0, total, i + 1, kTagFold);
    int lo = 0, hi = f.p;
    for (int d = f.p / 2; d >= 1; d /= 2) {
        const int mid = lo + d, partner = f.real(v ^ d);
        const bool low = v < mid;
        const int klo = low ? lo : mid, khi = low ? mid : hi, slo = low ? mid : lo, shi = low ? hi : mid;
        send_range(pd[f.first(slo)], pd[f.end(shi - 1)], partner, kTagRs);
        reduce_range(pd[f.first(klo)], pd[f.end(khi - 1)], partner, kTagRs);
        lo = klo;
        hi = khi;
    }
    if (lc[mine]) std::memcpy(out, acc + pd[mine] * es, lc[mine] * es);
    if (i < 2 * f.r) send_range(pd[mine + 1], pd[mine + 2], i + 1, kTagPost);
    wait_all(&sends);
}

// Allgather by recursive doubling in place: at each step a virtual member
// and its partner swap the blocks each has gathered so far.
void NetLane::rhd_ag(char *w, const std::vector<size_t> &lc, const std::vector<size_t> &ld) {
    const size_t es = esize_, ch = chunk_, k = static_cast<size_t>(k_);
    const int i = me_;
    const Fold f(k_);
    std::vector<MPI_Request> sends, recvs;
    auto send_block = [&](size_t j, int to, int tag) {
        for (size_t at = 0; at < lc[j]; at += ch) isend(w + (ld[j] + at) * es, std::min(ch, lc[j] - at), to, tag, &sends);
    };
    auto recv_block = [&](size_t j, int from, int tag) {
        for (size_t at = 0; at < lc[j]; at += ch) irecv(w + (ld[j] + at) * es, std::min(ch, lc[j] - at), from, tag, &recvs);
    };
    const size_t mine = static_cast<size_t>(i);
    const int v = f.virt(i);
    if (v < 0) {
        send_block(mine, i - 1, kTagFold);
        for (size_t j = 0; j < k; ++j)
            if (j != mine) recv_block(j, i - 1, kTagPost);
        wait_all(&recvs);
        wait_all(&sends);
        return;
    }
    if (i < 2 * f.r) {
        recv_block(mine + 1, i + 1, kTagFold);
        wait_all(&recvs);
    }
    for (int d = 1; d < f.p; d *= 2) {
        const int mlo = v & ~(d - 1), plo = mlo ^ d, partner = f.real(v ^ d);
        for (size_t j = f.first(plo); j < f.end(plo + d - 1); ++j) recv_block(j, partner, kTagAg);
        for (size_t j = f.first(mlo); j < f.end(mlo + d - 1); ++j) send_block(j, partner, kTagAg);
        wait_all(&recvs);
    }
    if (i < 2 * f.r)
        for (size_t j = 0; j < k; ++j)
            if (j != mine + 1) send_block(j, i + 1, kTagPost);
    wait_all(&sends);
}

} // namespace comm
} // namespace dsm

DSM_PARAM_LINK(comm_net)
