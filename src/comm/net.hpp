// The between-node stage of the shm backend's collectives (net.cc): on a
// lane (one rank per node, in node order) a reduce-scatter, an allgather and
// an allreduce of per-node blocks over point-to-point MPI, as a ring or as
// recursive halving/doubling, cut into chunks so that reductions overlap the
// transfers. The node's own contribution to a block is read lazily, chunk by
// chunk, through a NodeInput, so the intra-node reduction of a chunk happens
// as that chunk enters the network stage instead of in a pass before it.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include <mpi.h>

#include "comm/backend.hpp"
#include "comm/common.hpp"

namespace dsm {
namespace comm {

// DSM_COMM_NET_ALGO: how the shm backend crosses nodes.
//   RING  a pipelined ring (k-1 steps, each block travels once per phase);
//   RHD   recursive halving (reduce-scatter) and doubling (allgather),
//         log2(k) steps, non-powers of two folded onto a power of two;
//   MPI   MPI's own collectives on the lane (MPI_Reduce_scatter, MPI_Allgatherv);
//   AUTO  two nodes: RHD for an allreduce (one exchange), else RING; more
//         nodes: RHD for a power of two when each node's block is under
//         64 KiB (latency-bound), else RING.
enum class NetAlgo { AUTO, RING, RHD, MPI };

// The parameters, read at each call (cheap: a getenv); DSM_ERR_INVALID_ARGUMENT
// naming the variable and the value when malformed.
NetAlgo net_algo_param();
size_t net_chunk_param(); // DSM_COMM_NET_CHUNK, bytes per message (4096 to 1 GiB)
const char *net_algo_label(NetAlgo a) noexcept;

// The algorithm AUTO resolves to for k nodes, a lane of `bytes` in all
// and the collective (the same on every lane member: all three are).
NetAlgo net_resolve(NetAlgo a, int k, size_t bytes, bool allreduce) noexcept;

// The node's contribution to a range [at, at + n) of the full buffer (in
// elements): `reduce` stores into dst, extra op partial (extra first, then
// the node's ranks in ascending local rank), or the bare partial when extra
// is NULL; extra may be dst itself. `direct`, when not NULL, is a buffer
// holding the partial as it is (a node of one rank whose input does not
// overlap the output): element x of the full buffer at direct + x * esize.
struct NodeInput {
    std::function<void(char *dst, const char *extra, size_t at, size_t n)> reduce;
    const char *direct = nullptr;
};

// One collective's between-node stage on a lane. Blocks: lc[j] elements of
// node j at element displacement ld[j] of the full buffer (any order, zero
// counts allowed). Every member passes the same lc, ld, algorithm and chunk.
class NetLane {
public:
    // a, b, c: private working memory (kept by the caller between calls).
    NetLane(MPI_Comm lane, size_t esize, size_t chunk_bytes, NetAlgo algo, dsm_dtype_t dtype, Op op,
            ScratchBuffer *a, ScratchBuffer *b, ScratchBuffer *c);

    // out: this node's block (lc[me] elements), reduced over every node's input.
    void reduce_scatter(const NodeInput &in, const std::vector<size_t> &lc, const std::vector<size_t> &ld,
                        char *out);
    // w: the full buffer; this node's block is in place at ld[me]; afterwards
    // every block is.
    void allgather(char *w, const std::vector<size_t> &lc, const std::vector<size_t> &ld);
    // reduce_scatter into w + ld[me], then allgather on w; with the ring the
    // allgather of a chunk starts as soon as its reduction is done.
    void allreduce(const NodeInput &in, char *w, const std::vector<size_t> &lc, const std::vector<size_t> &ld);

    NetAlgo algo() const noexcept { return algo_; }

private:
    void isend(const char *p, size_t n, int to, int tag, std::vector<MPI_Request> *reqs);
    void irecv(char *p, size_t n, int from, int tag, std::vector<MPI_Request> *reqs);
    void combine(char *dst, const char *received, size_t n) const; // dst = received op dst
    void exchange(const NodeInput &in, const std::vector<size_t> &lc, const std::vector<size_t> &ld, char *w);
    void ring(const NodeInput &in, const std::vector<size_t> &lc, const std::vector<size_t> &ld, char *out,
              char *w);
    void ring_ag(char *w, const std::vector<size_t> &lc, const std::vector<size_t> &ld);
    void rhd_rs(const NodeInput &in, const std::vector<size_t> &lc, const std::vector<size_t> &ld, char *out);
    void rhd_ag(char *w, const std::vector<size_t> &lc, const std::vector<size_t> &ld);

    MPI_Comm comm_;
    int me_ = 0, k_ = 1;
    size_t esize_, chunk_; // chunk_: elements per message
    NetAlgo algo_;
    dsm_dtype_t dtype_;
    Op op_;
    ScratchBuffer *a_, *b_, *c_;
};

} // namespace comm
} // namespace dsm
