// dsm-bench alltoall: the Ulysses sequence-parallel transforms (seq_to_head,
// head_to_seq, and seq_to_head_n of q, k, v) on a mesh that is all sequence
// parallel, with their inputs in node-shared memory (what dsm_sp_alloc()
// hands out) and in private memory, next to two baselines timed in turn with
// them within each round: a raw MPI_Alltoall of the same bytes per rank
// (contiguous blocks, no layout permutation), and the same transform done
// without fusion (a permuting copy into a send buffer, MPI_Alltoallv, a
// permuting copy out).
//
// The transforms are the sp layer's Context::transform(), the function that
// dsm_sp_seq_to_head(), dsm_sp_head_to_seq() and dsm_sp_seq_to_head_n() call,
// on the group and node colors that dsm_mesh_create_dp_sp(comm, 1, -1) and
// dsm_sp_create(mesh, NULL) give it; the shared inputs come from its
// backend's alloc_shared(), the function behind dsm_sp_alloc().
#include "dsm_config.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <mpi.h>

#include "harness.hpp"
#include "comm/backend.hpp"
#include "comm/common.hpp"
#include "comm/mpi_backend.hpp"
#include "comm/nccl_backend.hpp"
#include "comm/shm_backend.hpp"
#include "core/error.hpp"
#include "mesh/mesh.hpp"
#include "sp/transform.hpp"

namespace dsm {
namespace bench {

namespace {

constexpr int kTensors = 3; // q, k and v in seq_to_head_n

struct Options {
    long long batch = 1, seq = 8192, heads = 32, head_dim = 128;
    dsm_sp_layout_t layout = DSM_SP_BATCH_FIRST;
    std::vector<dsm_dtype_t> dtypes{DSM_FLOAT32, DSM_BFLOAT16};
    int iters = 5;
};

void usage(FILE *out) {
    std::fprintf(out,
                 "usage: mpiexec -n N dsm-bench alltoall [--batch B] [--seq S] [--heads H] [--head-dim D]\n"
                 "                                      [--layout batch|seq] [--dtype fp32|bf16|fp16|both]\n"
                 "                                      [--iters N] [--json]\n"
                 "  On a mesh that is all sequence parallel (dsm_mesh_create_dp_sp(MPI_COMM_WORLD, 1, -1)),\n"
                 "  times the Ulysses all-to-alls of one [B, S, H, D] tensor (global shape; default 1, 8192,\n"
                 "  32, 128; S a multiple of N): seq_to_head, head_to_seq, and seq_to_head_n of three such\n"
                 "  tensors (q, k, v) in one call, in the batch-first layout [B, S, H, D] (--layout seq:\n"
                 "  [S, B, H, D]), for fp32 and bf16 (--dtype both, the default; or one dtype), each with\n"
                 "  its inputs in node-shared memory (inputs shared: what dsm_sp_alloc() gives) and in\n"
                 "  private memory (inputs private), next to a raw MPI_Alltoall on MPI_COMM_WORLD of the\n"
                 "  same bytes per rank (contiguous blocks, no layout permutation) and to the unfused\n"
                 "  transform (a permuting copy into a send buffer, MPI_Alltoallv, a permuting copy out),\n"
                 "  the four timed in turn within each round. seconds: the median over --iters rounds\n"
                 "  (default 5, after one warm-up) of the slowest rank; GB/s: bytes sent + received per\n"
                 "  rank, 2 (N-1)/N of the rank's sequence-sharded bytes, per second; vs raw: raw\n"
                 "  MPI_Alltoall time / time (above 1: faster than the raw call); vs unfused: the unfused\n"
                 "  transform's time / time. The warm-up outputs of both transforms and of the unfused one\n"
                 "  are checked against the expected tensors.\n");
}

const char *dtype_name(dsm_dtype_t t) {
    switch (t) {
    case DSM_FLOAT32: return "fp32";
    case DSM_BFLOAT16: return "bf16";
    case DSM_FLOAT16: return "fp16";
    default: return "?";
    }
}

size_t dtype_bytes(dsm_dtype_t t) { return t == DSM_FLOAT32 ? 4 : 2; }


// The bits of element (b, s, h, d) of tensor `k` of the global tensor: a
// hash of its position, so that every rank knows every expected value.
uint64_t element_bits(int k, const dsm_sp_tensor_t &t, int64_t b, int64_t s, int64_t h, int64_t d) {
    uint64_t x = static_cast<uint64_t>(((b * t.seq + s) * t.heads + h) * t.head_dim + d) * 4 + static_cast<uint64_t>(k);
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// Visit every element of a [batch, rows, heads, d] block (or [rows, batch,
// heads, d] in the sequence-first layout) whose rows are global rows
// row0.. and heads global heads head0..: f(local element index, b, s, h, dd).
template <typename F>
void for_each_element(const dsm_sp_tensor_t &t, int64_t row0, int64_t rows, int64_t head0, int64_t heads, F &&f) {
    size_t i = 0;
    const bool bf = t.layout == DSM_SP_BATCH_FIRST;
    const int64_t outer = bf ? t.batch : rows, inner = bf ? rows : t.batch;
    for (int64_t o = 0; o < outer; ++o)
        for (int64_t r = 0; r < inner; ++r)
            for (int64_t h = 0; h < heads; ++h)
                for (int64_t d = 0; d < t.head_dim; ++d, ++i) {
                    const int64_t b = bf ? o : r, s = row0 + (bf ? r : o);
                    f(i, b, s, head0 + h, d);
                }
}

// This rank's sequence-sharded piece of tensor k, filled with its global values.
void fill_seq_sharded(int k, const dsm_sp_tensor_t &t, int size, int rank, unsigned char *p) {
    const size_t es = dtype_bytes(t.dtype);
    const int64_t rows = t.seq / size;
    for_each_element(t, rank * rows, rows, 0, t.heads, [&](size_t i, int64_t b, int64_t s, int64_t h, int64_t d) {
        const uint64_t bits = element_bits(k, t, b, s, h, d);
        std::memcpy(p + i * es, &bits, es); // the low bytes (little endian)
    });
}

// Whether this rank's head-sharded piece of tensor k holds its global values.
bool check_head_sharded(int k, const dsm_sp_tensor_t &t, int size, int rank, const unsigned char *p) {
    const size_t es = dtype_bytes(t.dtype);
    const sp::HeadRange hr = sp::head_range(t.heads, t.flags, size, rank);
    bool ok = true;
    for_each_element(t, 0, t.seq, hr.first, hr.count, [&](size_t i, int64_t b, int64_t s, int64_t h, int64_t d) {
        const uint64_t bits = element_bits(k, t, b, s, h, d);
        if (ok && std::memcmp(p + i * es, &bits, es) != 0) ok = false;
    });
    return ok;
}

struct Row {
    const char *op;
    dsm_dtype_t dtype;
    int tensors;
    double bytes;                      // the rank's sequence-sharded bytes of all tensors (the mean over ranks)
    double shared, ours, raw, unfused; // median seconds: inputs shared, inputs private, the baselines
    const char *shared_path, *path;    // how the transforms moved the data (path_name())
};

// Memory from the sequence-parallel backend's alloc_shared(), the function
// behind dsm_sp_alloc() (node-shared windows under the shm backend): every
// rank allocates in the same order, possibly different sizes; freed
// collectively, in reverse order, by the destructor.
class SharedBuffers {
public:
    explicit SharedBuffers(comm::Backend &be) : be_(be) {}
    ~SharedBuffers() {
        for (auto it = ptrs_.rbegin(); it != ptrs_.rend(); ++it) {
            try {
                be_.free_shared(*it);
            } catch (const Error &e) {
                std::fprintf(stderr, "dsm-bench alltoall: free_shared: %s\n", e.what());
            }
        }
    }
    SharedBuffers(const SharedBuffers &) = delete;
    SharedBuffers &operator=(const SharedBuffers &) = delete;
    unsigned char *alloc(size_t bytes) {
        ptrs_.push_back(be_.alloc_shared(bytes));
        return static_cast<unsigned char *>(ptrs_.back());
    }

private:
    comm::Backend &be_;
    std::vector<void *> ptrs_;
};

// The shm backend's counts of alltoall_direct's copies (peers read from and
// written to in node-shared memory, pulled from and pushed to with
// cross-memory attach); zero for another backend.
struct DirectCounts {
    uint64_t reads = 0, writes = 0, pulls = 0, pushes = 0, pieces = 0;
};
DirectCounts direct_counts(comm::Backend &be) {
    DirectCounts c;
    c.pieces = be.pieces_calls();
    if (const auto *s = dynamic_cast<const comm::ShmBackend *>(&be)) {
        c.reads = s->direct_reads();
        c.writes = s->direct_writes();
        c.pulls = s->direct_pulls();
        c.pushes = s->direct_pushes();
    }
    return c;
}

// How a transform moved its data on this rank, from the counts before and
// after it: "memcpy" (single copy from the peers' node-shared inputs),
// "cma" (single copy with cross-memory attach), "mpi-dt" (alltoall_pieces:
// MPI reads the inputs and writes the outputs in place, with derived
// datatypes), "packed" (alltoall_packed), "self" (one rank).
const char *path_name(comm::Backend &be, const DirectCounts &a, const DirectCounts &b) {
    if (be.size() == 1) return "self";
    if (b.reads > a.reads || b.writes > a.writes) return "memcpy";
    if (b.pulls > a.pulls || b.pushes > a.pushes) return "cma";
    if (b.pieces > a.pieces) return "mpi-dt";
    return "packed";
}

// The transform without fusion, as it is done with plain MPI: every block
// copied out of the input's layout into a send buffer in peer order (for each
// peer, each tensor, each row: the peer's heads), one MPI_Alltoallv of bytes,
// and every received block copied into the output's layout. The same results
// as sp::Context::transform() for tensors without DSM_SP_REPLICATE.
class Unfused {
public:
    // Room for up to `most` tensors of shape t per call.
    Unfused(const dsm_sp_tensor_t &t, int most, int size, int rank) : t_(t), size_(size), rank_(rank) {
        rows_ = t.seq / size;
        row_bytes_ = static_cast<size_t>(t.head_dim) * dtype_bytes(t.dtype);
        for (int j = 0; j < size; ++j) heads_.push_back(sp::head_range(t.heads, t.flags, size, j));
        size_t out = 0, in = 0; // bytes sequence-to-head sends and receives per tensor
        for (const sp::HeadRange &h : heads_) {
            out += block_bytes(h.count);
            in += block_bytes(heads_[static_cast<size_t>(rank)].count);
        }
        send_ = comm::aligned_bytes(std::max(out, in) * static_cast<size_t>(most), true);
        recv_ = comm::aligned_bytes(std::max(out, in) * static_cast<size_t>(most), true);
    }

    void run(sp::Direction dir, int n, const void *const in[], void *const out[], MPI_Comm comm) {
        const bool fwd = dir == sp::Direction::SEQ_TO_HEAD;
        const bool bf = t_.layout == DSM_SP_BATCH_FIRST;
        const int64_t outer = bf ? t_.batch : rows_, inner = bf ? rows_ : t_.batch;
        const sp::HeadRange mine = heads_[static_cast<size_t>(rank_)];
        // Row (o, i) of the sequence-sharded form at head h.first, and the
        // same token's row in the head-sharded form when it is peer q's.
        auto seq_piece = [&](auto *base, int64_t o, int64_t i, const sp::HeadRange &h) {
            return base + static_cast<size_t>((o * inner + i) * t_.heads + h.first) * row_bytes_;
        };
        auto head_piece = [&](auto *base, int q, int64_t o, int64_t i) {
            const int64_t row = bf ? o * t_.seq + q * rows_ + i : (q * rows_ + o) * t_.batch + i;
            return base + static_cast<size_t>(row * mine.count) * row_bytes_;
        };
        // Sequence-to-head sends peer j its heads of this rank's rows and
        // receives this rank's heads of peer q's rows; head-to-sequence the reverse.
        std::vector<int> sc, sd, rc, rd;
        int at_s = 0, at_r = 0;
        for (int j = 0; j < size_; ++j) {
            const int64_t hj = heads_[static_cast<size_t>(j)].count;
            sc.push_back(n * static_cast<int>(block_bytes(fwd ? hj : mine.count)));
            rc.push_back(n * static_cast<int>(block_bytes(fwd ? mine.count : hj)));
            sd.push_back(at_s);
            rd.push_back(at_r);
            at_s += sc.back();
            at_r += rc.back();
        }
        char *send = static_cast<char *>(send_.get());
        for (int j = 0; j < size_; ++j) {
            const sp::HeadRange hj = heads_[static_cast<size_t>(j)];
            const size_t len = static_cast<size_t>(fwd ? hj.count : mine.count) * row_bytes_;
            for (int k = 0; k < n; ++k) {
                const char *src = static_cast<const char *>(in[k]);
                for (int64_t o = 0; o < outer; ++o)
                    for (int64_t i = 0; i < inner; ++i, send += len)
                        std::memcpy(send, fwd ? seq_piece(src, o, i, hj) : head_piece(src, j, o, i), len);
            }
        }
        DSM_CHECK_MPI(MPI_Alltoallv(send_.get(), sc.data(), sd.data(), MPI_BYTE, recv_.get(), rc.data(), rd.data(),
                                    MPI_BYTE, comm));
        const char *recv = static_cast<const char *>(recv_.get());
        for (int q = 0; q < size_; ++q) {
            const sp::HeadRange hq = heads_[static_cast<size_t>(q)];
            const size_t len = static_cast<size_t>(fwd ? mine.count : hq.count) * row_bytes_;
            for (int k = 0; k < n; ++k) {
                char *dst = static_cast<char *>(out[k]);
                for (int64_t o = 0; o < outer; ++o)
                    for (int64_t i = 0; i < inner; ++i, recv += len)
                        std::memcpy(fwd ? head_piece(dst, q, o, i) : seq_piece(dst, o, i, hq), recv, len);
            }
        }
    }

private:
    // Bytes of one tensor's block of `heads` heads over one rank's rows.
    size_t block_bytes(int64_t heads) const {
        return static_cast<size_t>(t_.batch * rows_ * heads) * row_bytes_;
    }

    dsm_sp_tensor_t t_;
    int size_, rank_;
    int64_t rows_ = 0;
    size_t row_bytes_ = 0; // one head of one token
    std::vector<sp::HeadRange> heads_;
    comm::AlignedPtr send_, recv_;
};

// The number of nodes: ranks that share memory, as MPI sees them.
int count_nodes(MPI_Comm world) {
    MPI_Comm node = MPI_COMM_NULL;
    int rank = 0, local = 0, leaders = 0;
    MPI_Comm_rank(world, &rank);
    DSM_CHECK_MPI(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
    MPI_Comm_rank(node, &local);
    MPI_Comm_free(&node);
    const int leader = local == 0 ? 1 : 0;
    MPI_Allreduce(&leader, &leaders, 1, MPI_INT, MPI_SUM, world);
    return leaders;
}

// Every rank agrees whether all ranks passed a check.
bool all_true(MPI_Comm comm, bool mine) {
    int in = mine ? 1 : 0, out = 0;
    MPI_Allreduce(&in, &out, 1, MPI_INT, MPI_MIN, comm);
    return out != 0;
}

// The measurements of one dtype, appended to rows; false when the warm-up
// output was wrong (reported on rank 0).
bool measure(const Harness &h, const Options &o, dsm_dtype_t dtype, sp::Context &ctx, MPI_Comm world, std::vector<Row> *rows) {
    const int size = ctx.size(), rank = ctx.rank();
    dsm_sp_tensor_t t{};
    t.batch = o.batch;
    t.seq = o.seq;
    t.heads = o.heads;
    t.head_dim = o.head_dim;
    t.layout = o.layout;
    t.dtype = dtype;
    t.flags = 0;
    sp::check_tensor(t, size, "the tensor");
    const sp::Counts c = sp::counts(t, size, rank);
    const size_t es = dtype_bytes(dtype);
    const size_t seq_bytes = c.seq_sharded * es, head_bytes = c.head_sharded * es;

    // q, k, v in both forms, in private memory and in node-shared memory; the
    // first also serves seq_to_head and head_to_seq. (The head-sharded sizes
    // differ between ranks when N does not divide H.)
    std::vector<comm::AlignedPtr> seq_form, head_form;
    SharedBuffers shared_mem(ctx.backend());
    unsigned char *shared_seq[kTensors], *shared_head[kTensors];
    for (int k = 0; k < kTensors; ++k) {
        seq_form.push_back(comm::aligned_bytes(seq_bytes, false));
        head_form.push_back(comm::aligned_bytes(head_bytes, true));
        fill_seq_sharded(k, t, size, rank, static_cast<unsigned char *>(seq_form.back().get()));
        shared_seq[k] = shared_mem.alloc(seq_bytes);
        shared_head[k] = shared_mem.alloc(head_bytes);
        std::memcpy(shared_seq[k], seq_form.back().get(), seq_bytes);
    }
    // Raw MPI_Alltoall: equal blocks of the same bytes per rank (the mean
    // over ranks when the heads do not divide evenly).
    const double mean_bytes = static_cast<double>(t.batch) * static_cast<double>(t.seq / size) *
                              static_cast<double>(t.heads) * static_cast<double>(t.head_dim) * static_cast<double>(es);
    const size_t block1 = static_cast<size_t>(mean_bytes) / static_cast<size_t>(size);
    const size_t block3 = static_cast<size_t>(mean_bytes * kTensors) / static_cast<size_t>(size);
    comm::AlignedPtr raw_send = comm::aligned_bytes(block3 * static_cast<size_t>(size), false);
    comm::AlignedPtr raw_recv = comm::aligned_bytes(block3 * static_cast<size_t>(size), true);
    std::memset(raw_send.get(), rank + 1, block3 * static_cast<size_t>(size));

    const dsm_sp_tensor_t ts[kTensors] = {t, t, t};
    const size_t seq_counts[kTensors] = {c.seq_sharded, c.seq_sharded, c.seq_sharded};
    const size_t head_counts[kTensors] = {c.head_sharded, c.head_sharded, c.head_sharded};
    // The transforms' arguments, with the tensors in private (mine) or
    // node-shared (shared) memory; each form is the input of one direction
    // and the output of the other.
    struct Forms {
        const void *seq_in[kTensors], *head_in[kTensors];
        void *seq_out[kTensors], *head_out[kTensors];
    };
    Forms mine{}, shared{};
    for (int k = 0; k < kTensors; ++k) {
        mine.seq_in[k] = mine.seq_out[k] = seq_form[static_cast<size_t>(k)].get();
        mine.head_in[k] = mine.head_out[k] = head_form[static_cast<size_t>(k)].get();
        shared.seq_in[k] = shared.seq_out[k] = shared_seq[k];
        shared.head_in[k] = shared.head_out[k] = shared_head[k];
    }
    const std::vector<unsigned char> first_input(static_cast<unsigned char *>(seq_form[0].get()),
                                                 static_cast<unsigned char *>(seq_form[0].get()) + seq_bytes);

    Unfused unfused(t, kTensors, size, rank);
    auto raw = [&](size_t block) {
        DSM_CHECK_MPI(MPI_Alltoall(raw_send.get(), static_cast<int>(block), MPI_BYTE, raw_recv.get(),
                                   static_cast<int>(block), MPI_BYTE, world));
    };
    struct Op {
        const char *name;
        sp::Direction dir;
        int tensors;
        size_t block;
    };
    const Op ops[] = {{"seq_to_head", sp::Direction::SEQ_TO_HEAD, 1, block1},
                      {"head_to_seq", sp::Direction::HEAD_TO_SEQ, 1, block1},
                      {"seq_to_head_n", sp::Direction::SEQ_TO_HEAD, kTensors, block3}};
    auto ours = [&](const Op &op, const Forms &f) {
        const bool fwd = op.dir == sp::Direction::SEQ_TO_HEAD;
        ctx.transform(op.dir, op.tensors, ts, fwd ? f.seq_in : f.head_in, fwd ? seq_counts : head_counts,
                      fwd ? f.head_out : f.seq_out, fwd ? head_counts : seq_counts);
    };
    auto plain = [&](const Op &op) {
        const bool fwd = op.dir == sp::Direction::SEQ_TO_HEAD;
        unfused.run(op.dir, op.tensors, fwd ? mine.seq_in : mine.head_in, fwd ? mine.head_out : mine.seq_out, world);
    };

    // Warm-up (first touch of every buffer and of the backend's windows),
    // checked: seq_to_head_n gives every tensor's expected head-sharded
    // piece and head_to_seq brings the first one back, through the transform
    // with shared inputs, with private inputs, and through the unfused
    // baseline. The transforms' paths are read on the way.
    const char *const what[3] = {"the transforms with inputs in node-shared memory",
                                 "the transforms with private inputs", "the unfused baseline"};
    const char *paths[2] = {"", ""};
    for (int pass = 0; pass < 3; ++pass) {
        const Forms &f = pass == 0 ? shared : mine;
        bool ok = true;
        const DirectCounts before = direct_counts(ctx.backend());
        for (int k = 0; k < kTensors; ++k)
            std::memset(f.head_out[k], 0, head_bytes);
        pass < 2 ? ours(ops[2], f) : plain(ops[2]);
        for (int k = 0; k < kTensors; ++k)
            ok = ok && check_head_sharded(k, t, size, rank, static_cast<const unsigned char *>(f.head_out[k]));
        std::memset(f.seq_out[0], 0, seq_bytes);
        pass < 2 ? ours(ops[1], f) : plain(ops[1]);
        ok = ok && std::memcmp(first_input.data(), f.seq_out[0], seq_bytes) == 0;
        if (pass < 2) paths[pass] = path_name(ctx.backend(), before, direct_counts(ctx.backend()));
        if (!all_true(world, ok)) {
            if (rank == 0)
                std::fprintf(stderr, "dsm-bench alltoall: %s: %s did not produce the expected tensors\n",
                             dtype_name(dtype), what[pass]);
            return false;
        }
    }
    ours(ops[0], shared);
    ours(ops[0], mine);
    plain(ops[0]);
    for (const Op &op : ops) raw(op.block);

    // Each round times the four in turn, starting one further each round, so
    // that none always follows the same one.
    const size_t nops = sizeof ops / sizeof ops[0];
    std::vector<std::vector<double>> t_shared(nops), t_ours(nops), t_raw(nops), t_plain(nops);
    for (int it = 0; it < o.iters; ++it)
        for (size_t i = 0; i < nops; ++i) {
            const std::function<void()> run[4] = {[&] { ours(ops[i], shared); }, [&] { ours(ops[i], mine); },
                                                  [&] { raw(ops[i].block); }, [&] { plain(ops[i]); }};
            std::vector<double> *times[4] = {&t_shared[i], &t_ours[i], &t_raw[i], &t_plain[i]};
            for (size_t j = 0; j < 4; ++j) {
                const size_t v = (j + static_cast<size_t>(it)) % 4;
                times[v]->push_back(h.time_once(run[v]));
            }
        }
    for (size_t i = 0; i < nops; ++i)
        rows->push_back(Row{ops[i].name, dtype, ops[i].tensors, mean_bytes * ops[i].tensors, median(t_shared[i]),
                            median(t_ours[i]), median(t_raw[i]), median(t_plain[i]), paths[0], paths[1]});
    return true;
}

int run(const Harness &h, const Options &o) {
    MPI_Comm world = MPI_COMM_WORLD;
    const int rank = h.rank(), size = h.size();
    // The mesh and context dsm_mesh_create_dp_sp(world, 1, -1) and
    // dsm_sp_create(mesh, NULL) build.
    const int shape[2] = {1, size};
    const char *const names[2] = {"data_parallel", "sequence_parallel"};
    std::unique_ptr<Mesh> mesh = Mesh::create(world, 2, shape, names, nullptr, true);
    const MeshState &st = mesh->state();
    const GroupView g = mesh->group("sequence_parallel");
    auto ctx = std::make_unique<sp::Context>(g.comm, st.ranks[static_cast<size_t>(st.rank)].node);
    const std::string backend = ctx->backend().name();
    const int nodes = count_nodes(world);

    std::vector<Row> rows;
    bool ok = true;
    for (dsm_dtype_t d : o.dtypes) ok = ok && measure(h, o, d, *ctx, world, &rows);
    ctx->close();
    ctx.reset();
    (void)mesh->release();
    if (!ok) return 1;
    if (rank != 0) return 0;

    // Bytes each rank sends plus receives: all but its own 1/N, each way.
    auto moved = [&](const Row &r) { return 2.0 * r.bytes * (size - 1) / size; };
    const char *layout = o.layout == DSM_SP_BATCH_FIRST ? "batch" : "seq";
    if (h.json()) {
        Json results = Json::array();
        for (const Row &r : rows)
            results.push_back({{"op", r.op},
                               {"dtype", dtype_name(r.dtype)},
                               {"tensors", r.tensors},
                               {"bytes_per_rank", r.bytes},
                               {"bytes_moved_per_rank", moved(r)},
                               {"seconds", r.ours},
                               {"gbs", moved(r) / 1e9 / r.ours},
                               {"raw_seconds", r.raw},
                               {"raw_gbs", moved(r) / 1e9 / r.raw},
                               {"speedup_vs_raw", r.raw / r.ours},
                               {"unfused_seconds", r.unfused},
                               {"speedup_vs_unfused", r.unfused / r.ours},
                               {"path", r.path},
                               {"shared_seconds", r.shared},
                               {"shared_gbs", moved(r) / 1e9 / r.shared},
                               {"shared_speedup_vs_raw", r.raw / r.shared},
                               {"shared_speedup_vs_unfused", r.unfused / r.shared},
                               {"shared_path", r.shared_path}});
        h.print(h.result({{"ranks", size},
                         {"nodes", nodes},
                         {"backend", backend},
                         {"batch", o.batch},
                         {"seq", o.seq},
                         {"heads", o.heads},
                         {"head_dim", o.head_dim},
                         {"layout", layout},
                         {"iters", o.iters},
                         {"results", results}}));
        return 0;
    }
    std::printf("dsm-bench alltoall: %d ranks on %d node%s (backend %s), b=%lld s=%lld H=%lld d=%lld, %s-first "
                "layout, median of %d, slowest rank\n\n",
                size, nodes, nodes == 1 ? "" : "s", backend.c_str(), o.batch, o.seq, o.heads, o.head_dim, layout,
                o.iters);
    std::printf("%-14s %-5s %7s %-7s %-6s %9s %9s %7s %9s %8s %7s %10s %11s\n", "op", "dtype", "tensors", "inputs",
                "path", "MiB/rank", "seconds", "GB/s", "raw s", "raw GB/s", "vs raw", "unfused s", "vs unfused");
    for (const Row &r : rows)
        for (int v = 0; v < 2; ++v) {
            const double sec = v == 0 ? r.shared : r.ours;
            std::printf("%-14s %-5s %7d %-7s %-6s %9.1f %9.5f %7.2f %9.5f %8.2f %6.2fx %10.5f %10.2fx\n", r.op,
                        dtype_name(r.dtype), r.tensors, v == 0 ? "shared" : "private", v == 0 ? r.shared_path : r.path,
                        r.bytes / (1 << 20), sec, moved(r) / 1e9 / sec, r.raw, moved(r) / 1e9 / r.raw, r.raw / sec,
                        r.unfused, r.unfused / sec);
        }
    std::printf("\nMiB/rank: the rank's sequence-sharded bytes of all the call's tensors; GB/s: 2 (N-1)/N of them\n"
                "(sent + received) per second. inputs shared: the transform's inputs and outputs in node-shared\n"
                "memory (the backend's alloc_shared, what dsm_sp_alloc() gives); private: in malloc'd memory.\n"
                "path (rank 0): memcpy = single copy from the peers' node-shared inputs; cma = single copy with\n"
                "cross-memory attach; mpi-dt = MPI reads the inputs and writes the outputs in place (derived\n"
                "datatypes, across nodes); packed = pack, exchange, unpack; self = one rank. raw: MPI_Alltoall of the\n"
                "same bytes on MPI_COMM_WORLD (contiguous blocks, no permutation); unfused: the same transform as\n"
                "a permuting copy into a send buffer, MPI_Alltoallv and a permuting copy out; the four timed in\n"
                "turn in every round (raw and unfused: the same timings on both rows). vs raw, vs unfused: their\n"
                "time / ours (above 1: ours is faster).\n");
    return 0;
}

} // namespace

int run_alltoall(int argc, char **argv) {
    Harness h("alltoall", usage);
    Options o;
    h.integer("batch", 1, 1LL << 40, [&](long long x) { o.batch = x; });
    h.integer("seq", 1, 1LL << 40, [&](long long x) { o.seq = x; });
    h.integer("heads", 1, 1LL << 40, [&](long long x) { o.heads = x; });
    h.integer("head-dim", 1, 1LL << 40, [&](long long x) { o.head_dim = x; });
    h.integer("iters", 1, 1000, [&](long long x) { o.iters = static_cast<int>(x); });
    h.choice("layout", {"batch", "seq"},
             [&](const std::string &v) { o.layout = v == "batch" ? DSM_SP_BATCH_FIRST : DSM_SP_SEQ_FIRST; });
    h.choice("dtype", {"fp32", "bf16", "fp16", "both"}, [&](const std::string &v) {
        if (v == "fp32") o.dtypes = {DSM_FLOAT32};
        else if (v == "bf16") o.dtypes = {DSM_BFLOAT16};
        else if (v == "fp16") o.dtypes = {DSM_FLOAT16};
        else o.dtypes = {DSM_FLOAT32, DSM_BFLOAT16};
    });
    const int p = h.parse(argc, argv);
    if (p != 0) return p == 1 ? 0 : 2;
    const int size = h.size();
    if (o.seq % size != 0) {
        h.refuse("--seq %lld is not a multiple of the %d ranks", o.seq, size);
        return 2;
    }
    // The baselines' byte counts and displacements (three tensors' worth,
    // with a rank's share of the heads rounded up) must fit MPI's int.
    const double most = static_cast<double>(o.batch) * static_cast<double>(o.seq / size) *
                        static_cast<double>(o.heads + size) * static_cast<double>(o.head_dim) * 4.0 * kTensors;
    if (most > static_cast<double>(INT_MAX)) {
        h.refuse("the shape gives a rank up to %.0f bytes to send, beyond the int counts of the MPI baselines", most);
        return 2;
    }
    // Per rank: q, k, v in both forms, private and node-shared, and the
    // baselines' send and receive buffers: about 8 times `most`.
    if (!h.fits_memory("the shape", 8.0 * most)) return 2;
    return h.guard([&] { return run(h, o); });
}

} // namespace bench
} // namespace dsm
