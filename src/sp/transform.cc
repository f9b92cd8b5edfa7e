// See transform.hpp and doc/sequence-parallel.md.
//
// One all-to-all per call, whatever the number of tensors: the block a rank
// sends to peer j holds, for each tensor in order, the piece j needs (64-byte
// aligned sub-blocks), written by pack() straight from the caller's layout and
// read by unpack() straight into the caller's output, so the permutation
// between "my tokens, all heads" and "all tokens, my heads" costs no pass of
// its own. Before any data moves the ranks agree, with one small allreduce,
// that every rank's arguments are valid and describe the same tensors.
#include "dsm_config.h"

#include "sp/transform.hpp"

#include <climits>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <exception>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/agree.hpp"
#include "core/hash.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/half.hpp"

namespace dsm {
namespace sp {

namespace {

// A byte range [at, at + bytes); empty ranges overlap nothing.
struct Span {
    uintptr_t at = 0;
    size_t bytes = 0;
    bool overlaps(const Span &o) const noexcept {
        return bytes != 0 && o.bytes != 0 && at < o.at + o.bytes && o.at < at + bytes;
    }
};

constexpr size_t kAlign = 64;

size_t align_up(size_t n) noexcept { return (n + kAlign - 1) / kAlign * kAlign; }

bool mul_ok(size_t a, size_t b, size_t *out) noexcept { return !__builtin_mul_overflow(a, b, out); }

// Elements of one [rows, heads, d] slab, checked against overflow by check_tensor().
size_t elems(const dsm_sp_tensor_t &t, int64_t seq, int64_t heads) noexcept {
    return static_cast<size_t>(t.batch) * static_cast<size_t>(seq) * static_cast<size_t>(heads) *
           static_cast<size_t>(t.head_dim);
}

// A rank's heads, for every rank of the group.
std::vector<HeadRange> ranges_of(const dsm_sp_tensor_t &t, int size) {
    std::vector<HeadRange> r(static_cast<size_t>(size));
    for (int j = 0; j < size; ++j) r[static_cast<size_t>(j)] = head_range(t.heads, t.flags, size, j);
    return r;
}

// Replicated heads are summed on the way back: in float (double for fp64),
// in ascending rank order, rounded once.
bool summable(dsm_dtype_t d) noexcept {
    return d == DSM_FLOAT32 || d == DSM_FLOAT64 || d == DSM_FLOAT16 || d == DSM_BFLOAT16;
}

double load(const unsigned char *p, dsm_dtype_t d) noexcept {
    switch (d) {
    case DSM_FLOAT32: {
        float x;
        std::memcpy(&x, p, 4);
        return x;
    }
    case DSM_FLOAT64: {
        double x;
        std::memcpy(&x, p, 8);
        return x;
    }
    case DSM_FLOAT16: {
        uint16_t h;
        std::memcpy(&h, p, 2);
        return fp16_to_fp32(h);
    }
    default: {
        uint16_t h;
        std::memcpy(&h, p, 2);
        return bf16_to_fp32(h);
    }
    }
}

void store(unsigned char *p, dsm_dtype_t d, double v) noexcept {
    switch (d) {
    case DSM_FLOAT32: {
        const float x = static_cast<float>(v);
        std::memcpy(p, &x, 4);
        break;
    }
    case DSM_FLOAT64: std::memcpy(p, &v, 8); break;
    case DSM_FLOAT16: {
        const uint16_t h = fp32_to_fp16(static_cast<float>(v));
        std::memcpy(p, &h, 2);
        break;
    }
    default: {
        const uint16_t h = fp32_to_bf16(static_cast<float>(v));
        std::memcpy(p, &h, 2);
        break;
    }
    }
}

// The call's arguments as a canonical text, for the mismatch message.
std::string canonical(Direction dir, int n, const dsm_sp_tensor_t t[]) {
    std::ostringstream os;
    os << (dir == Direction::SEQ_TO_HEAD ? "seq_to_head" : "head_to_seq") << " of " << n << " tensor(s)";
    for (int k = 0; k < n && t != nullptr; ++k)
        os << (k ? "; " : ": ") << "[batch " << t[k].batch << ", seq " << t[k].seq << ", heads " << t[k].heads
           << ", head_dim " << t[k].head_dim << ", " << (t[k].layout == DSM_SP_SEQ_FIRST ? "seq-first" : "batch-first")
           << ", " << dtype_name(t[k].dtype) << (t[k].flags & DSM_SP_REPLICATE ? ", replicate" : "") << "]";
    return os.str();
}

// A 64-bit fingerprint of the same (FNV-1a over the fields).
uint64_t fingerprint(Direction dir, int n, const dsm_sp_tensor_t t[]) {
    uint64_t h = kFnv1aOffset;
    auto mix = [&](int64_t v) { h = fnv1a(&v, sizeof v, h); };
    mix(dir == Direction::SEQ_TO_HEAD ? 1 : 2);
    mix(n);
    for (int k = 0; k < n && t != nullptr; ++k) {
        mix(t[k].batch);
        mix(t[k].seq);
        mix(t[k].heads);
        mix(t[k].head_dim);
        mix(t[k].layout);
        mix(t[k].dtype);
        mix(t[k].flags);
    }
    return h;
}


} // namespace

// ---------------------------------------------------------------- shapes

HeadRange head_range(int64_t heads, unsigned flags, int size, int rank) {
    DSM_REQUIRE(heads >= 1, DSM_ERR_INVALID_ARGUMENT, "heads is ", heads, " (must be >= 1)");
    DSM_REQUIRE(size >= 1, DSM_ERR_INVALID_ARGUMENT, "the group size is ", size, " (must be >= 1)");
    DSM_REQUIRE(rank >= 0 && rank < size, DSM_ERR_INVALID_ARGUMENT, "rank ", rank, " is outside [0, ", size, ")");
    DSM_REQUIRE((flags & ~DSM_SP_REPLICATE) == 0, DSM_ERR_INVALID_ARGUMENT, "flags 0x", std::hex, flags,
                " has unknown bits");
    HeadRange r;
    if (flags & DSM_SP_REPLICATE) {
        if (heads < size) {
            DSM_REQUIRE(size % heads == 0, DSM_ERR_INVALID_ARGUMENT, "replicating ", heads, " heads over ", size,
                        " ranks needs the group size to be a multiple of the heads");
            r.first = static_cast<int64_t>(rank) * heads / size;
            r.count = 1;
            return r;
        }
        DSM_REQUIRE(heads % size == 0, DSM_ERR_INVALID_ARGUMENT, "DSM_SP_REPLICATE with ", heads, " heads over ", size,
                    " ranks needs the heads to be a multiple of the group size (or the group size of the heads)");
    }
    const int64_t q = heads / size, rem = heads % size;
    r.count = q + (rank < rem ? 1 : 0);
    r.first = rank * q + (rank < rem ? rank : rem);
    return r;
}

void check_tensor(const dsm_sp_tensor_t &t, int size, const std::string &what) {
    DSM_REQUIRE(t.batch >= 1, DSM_ERR_INVALID_ARGUMENT, what, ": batch is ", t.batch, " (must be >= 1)");
    DSM_REQUIRE(t.seq >= 1, DSM_ERR_INVALID_ARGUMENT, what, ": seq is ", t.seq, " (must be >= 1)");
    DSM_REQUIRE(t.heads >= 1, DSM_ERR_INVALID_ARGUMENT, what, ": heads is ", t.heads, " (must be >= 1)");
    DSM_REQUIRE(t.head_dim >= 1, DSM_ERR_INVALID_ARGUMENT, what, ": head_dim is ", t.head_dim, " (must be >= 1)");
    // The enums as the caller stored them: C lets any int through, and in
    // C++ reading an enum outside its values is undefined.
    int layout = 0, dtype = 0;
    static_assert(sizeof t.layout == sizeof layout && sizeof t.dtype == sizeof dtype, "C enums are ints");
    std::memcpy(&layout, &t.layout, sizeof layout);
    std::memcpy(&dtype, &t.dtype, sizeof dtype);
    DSM_REQUIRE(layout == DSM_SP_BATCH_FIRST || layout == DSM_SP_SEQ_FIRST, DSM_ERR_INVALID_ARGUMENT, what,
                ": layout is ", layout, " (DSM_SP_BATCH_FIRST or DSM_SP_SEQ_FIRST)");
    DSM_REQUIRE(dtype >= DSM_FLOAT32 && dtype <= DSM_INT64 && dtype_size(static_cast<dsm_dtype_t>(dtype)) != 0,
                DSM_ERR_INVALID_ARGUMENT, what, ": dtype ", dtype, " is not a dsm_dtype_t");
    DSM_REQUIRE(t.seq % size == 0, DSM_ERR_INVALID_ARGUMENT, what, ": the sequence length ", t.seq,
                " is not a multiple of the sequence-parallel size ", size);
    if (t.flags & DSM_SP_REPLICATE)
        DSM_REQUIRE(summable(t.dtype), DSM_ERR_INVALID_ARGUMENT, what, ": DSM_SP_REPLICATE needs a floating-point dtype, not ",
                    dtype_name(t.dtype));
    try {
        (void)head_range(t.heads, t.flags, size, 0);
    } catch (const Error &e) {
        DSM_FAIL(e.status(), what, ": ", e.message());
    }
    size_t total = 1;
    bool ok = mul_ok(total, static_cast<size_t>(t.batch), &total) && mul_ok(total, static_cast<size_t>(t.seq), &total) &&
              mul_ok(total, static_cast<size_t>(t.heads), &total) &&
              mul_ok(total, static_cast<size_t>(t.head_dim), &total) && mul_ok(total, dtype_size(t.dtype), &total) &&
              total <= static_cast<size_t>(PTRDIFF_MAX) / 2;
    DSM_REQUIRE(ok, DSM_ERR_INVALID_ARGUMENT, what, ": [", t.batch, ", ", t.seq, ", ", t.heads, ", ", t.head_dim,
                "] of ", dtype_name(t.dtype), " is too large to address");
}

Counts counts(const dsm_sp_tensor_t &t, int size, int rank) {
    check_tensor(t, size, "the tensor");
    const HeadRange h = head_range(t.heads, t.flags, size, rank);
    Counts c;
    c.seq_sharded = elems(t, t.seq / size, t.heads);
    c.head_sharded = elems(t, t.seq, h.count);
    return c;
}

// ---------------------------------------------------------------- context

Context::Context(MPI_Comm comm, int node_color)
    : backend_(comm::make_backend(comm, comm::Space::HOST, node_color)) {
    backend_->watch().label = "the sequence-parallel context's group";
    size_ = backend_->size();
    rank_ = backend_->rank();
}

Context::~Context() = default;

void Context::close() { backend_.reset(); }

void Context::transform(Direction dir, int n, const dsm_sp_tensor_t t[], const void *const in[],
                        const size_t in_count[], void *const out[], const size_t out_count[]) {
    DSM_REQUIRE(backend_ != nullptr, DSM_ERR_INVALID_ARGUMENT, "the sequence-parallel context was closed");
    const MPI_Comm comm = backend_->comm();
    const bool fwd = dir == Direction::SEQ_TO_HEAD;
    // Local checks: pointers, shapes, counts.
    auto local = [&] {
        DSM_REQUIRE(n >= 1 && n <= 64, DSM_ERR_INVALID_ARGUMENT, "n is ", n, " (1..64 tensors per call)");
        DSM_ARG_NOT_NULL(t);
        DSM_ARG_NOT_NULL(in);
        DSM_ARG_NOT_NULL(in_count);
        DSM_ARG_NOT_NULL(out);
        DSM_ARG_NOT_NULL(out_count);
        for (int k = 0; k < n; ++k) {
            const std::string what = n == 1 ? std::string("the tensor") : cat("tensor ", k);
            check_tensor(t[k], size_, what);
            const Counts c = counts(t[k], size_, rank_);
            const size_t want_in = fwd ? c.seq_sharded : c.head_sharded;
            const size_t want_out = fwd ? c.head_sharded : c.seq_sharded;
            DSM_REQUIRE(in_count[k] == want_in, DSM_ERR_INVALID_ARGUMENT, what, ": in_count is ", in_count[k],
                        " but rank ", rank_, " of ", size_, " must pass ", want_in, " elements (",
                        fwd ? "[b, s/P, H, d]" : "[b, s, its heads, d]", ")");
            DSM_REQUIRE(out_count[k] == want_out, DSM_ERR_INVALID_ARGUMENT, what, ": out_count is ", out_count[k],
                        " but rank ", rank_, " of ", size_, " must pass ", want_out, " elements (",
                        fwd ? "[b, s, its heads, d]" : "[b, s/P, H, d]", ")");
            DSM_REQUIRE(want_in == 0 || in[k] != nullptr, DSM_ERR_NULL_POINTER, what, ": in is NULL");
            DSM_REQUIRE(want_out == 0 || out[k] != nullptr, DSM_ERR_NULL_POINTER, what, ": out is NULL");
        }
        // Outputs are written while inputs are still read (by this rank and
        // its peers) and in any order: every out must be disjoint from every
        // in and every other out. Inputs may share memory.
        std::vector<Span> ins(static_cast<size_t>(n)), outs(static_cast<size_t>(n));
        for (int k = 0; k < n; ++k) {
            const size_t esize = dtype_size(t[k].dtype);
            ins[static_cast<size_t>(k)] = Span{reinterpret_cast<uintptr_t>(in[k]), in_count[k] * esize};
            outs[static_cast<size_t>(k)] = Span{reinterpret_cast<uintptr_t>(out[k]), out_count[k] * esize};
        }
        for (int k = 0; k < n; ++k) {
            const Span o = outs[static_cast<size_t>(k)];
            for (int j = 0; j < n; ++j) {
                const std::string in_j = n == 1 ? std::string("in") : cat("in[", j, "]");
                const std::string out_k = n == 1 ? std::string("out") : cat("out[", k, "]");
                DSM_REQUIRE(!o.overlaps(ins[static_cast<size_t>(j)]), DSM_ERR_INVALID_ARGUMENT,
                            n == 1 ? std::string("the tensor") : cat("tensor ", k), ": ", in_j, " and ", out_k,
                            " overlap (outputs must not share memory with any input or other output)");
                DSM_REQUIRE(j >= k || !o.overlaps(outs[static_cast<size_t>(j)]), DSM_ERR_INVALID_ARGUMENT,
                            "tensor ", k, ": out[", j, "] and out[", k,
                            "] overlap (outputs must not share memory with any input or other output)");
            }
        }
    };
    // Agreement in one allreduce: the lowest failing rank, and whether the
    // fingerprints are the same (taken only of tensors that passed the checks).
    dsm_status_t status = DSM_SUCCESS;
    std::string failure;
    uint64_t print = 0;
    try {
        local();
        print = fingerprint(dir, n, t);
    } catch (const Error &e) {
        status = e.status();
        failure = e.message();
    }
    Agreement a(comm);
    const size_t fp = a.add(static_cast<int64_t>(print));
    a.run(status, failure);
    a.throw_if_failed(); // every rank throws the lowest failing rank's error
    if (!a.same(fp)) {
        agree_same(comm, "the sequence-parallel tensors", canonical(dir, n, t));
        DSM_FAIL(DSM_ERR_MISMATCH, "the sequence-parallel tensors differ across ranks");
    }

    // Block layout: for peer j, tensor k's piece at sub[k][j] bytes into the
    // block; send/recv sizes per peer.
    const int P = size_;
    const size_t np = static_cast<size_t>(P);
    std::vector<std::vector<HeadRange>> heads(static_cast<size_t>(n));
    std::vector<std::vector<size_t>> send_off(static_cast<size_t>(n), std::vector<size_t>(np)),
        recv_off(static_cast<size_t>(n), std::vector<size_t>(np));
    std::vector<size_t> send_bytes(np, 0), recv_bytes(np, 0);
    bool any_replicated_back = false;
    for (int k = 0; k < n; ++k) {
        const dsm_sp_tensor_t &x = t[k];
        const size_t ks = static_cast<size_t>(k);
        heads[ks] = ranges_of(x, P);
        const size_t esize = dtype_size(x.dtype);
        const int64_t chunk = x.seq / P;
        const HeadRange mine = heads[ks][static_cast<size_t>(rank_)];
        for (size_t j = 0; j < np; ++j) {
            // Forward: I send my tokens of j's heads, I receive j's tokens of my heads.
            // Backward: I send j's tokens of my heads, I receive my tokens of j's heads.
            const HeadRange &hj = heads[ks][j];
            const size_t to_j = elems(x, chunk, fwd ? hj.count : mine.count) * esize;
            const size_t from_j = elems(x, chunk, fwd ? mine.count : hj.count) * esize;
            send_off[ks][j] = send_bytes[j];
            recv_off[ks][j] = recv_bytes[j];
            send_bytes[j] += align_up(to_j);
            recv_bytes[j] += align_up(from_j);
        }
        if (!fwd && (x.flags & DSM_SP_REPLICATE) && x.heads < P) any_replicated_back = true;
    }

    // Replicated tensors coming back: each peer's block is kept, then the
    // copies of each head are summed in rank order.
    std::vector<size_t> stage_off(static_cast<size_t>(n) * np, 0);
    if (any_replicated_back) {
        size_t total = 0;
        for (int k = 0; k < n; ++k) {
            const dsm_sp_tensor_t &x = t[k];
            if (!((x.flags & DSM_SP_REPLICATE) && x.heads < P)) continue;
            for (size_t j = 0; j < np; ++j) {
                stage_off[static_cast<size_t>(k) * np + j] = total;
                total += align_up(elems(x, x.seq / P, 1) * dtype_size(x.dtype));
            }
        }
        if (staging_.size() < total) staging_.resize(total);
    }

    auto geometry = [&](int k) {
        const dsm_sp_tensor_t &x = t[k];
        Geometry g;
        g.es = dtype_size(x.dtype);
        g.d = static_cast<size_t>(x.head_dim);
        g.b = static_cast<size_t>(x.batch);
        g.s = static_cast<size_t>(x.seq);
        g.chunk = g.s / np;
        g.H = static_cast<size_t>(x.heads);
        g.seq_first = x.layout == DSM_SP_SEQ_FIRST;
        return g;
    };
    auto mine = [&](int k) { return heads[static_cast<size_t>(k)][static_cast<size_t>(rank_)]; };
    auto pack = [&](int peer, void *buf) {
        const size_t j = static_cast<size_t>(peer);
        for (int k = 0; k < n; ++k) {
            const Geometry g = geometry(k);
            const unsigned char *src = static_cast<const unsigned char *>(in[k]);
            unsigned char *block = static_cast<unsigned char *>(buf) + send_off[static_cast<size_t>(k)][j];
            if (fwd) // my tokens, j's heads
                copy_host<true>(heads_copy(g, heads[static_cast<size_t>(k)][j]), const_cast<unsigned char *>(src), block);
            else // j's tokens, my heads
                copy_host<true>(tokens_copy(g, j, mine(k)), const_cast<unsigned char *>(src), block);
        }
    };
    auto unpack = [&](int peer, const void *buf) {
        const size_t j = static_cast<size_t>(peer);
        for (int k = 0; k < n; ++k) {
            const dsm_sp_tensor_t &x = t[k];
            const Geometry g = geometry(k);
            unsigned char *block =
                const_cast<unsigned char *>(static_cast<const unsigned char *>(buf)) + recv_off[static_cast<size_t>(k)][j];
            unsigned char *dst = static_cast<unsigned char *>(out[k]);
            if (fwd) // j's tokens of my heads
                copy_host<false>(tokens_copy(g, j, mine(k)), dst, block);
            else if ((x.flags & DSM_SP_REPLICATE) && x.heads < P) // summed below, in rank order
                std::memcpy(staging_.data() + stage_off[static_cast<size_t>(k) * np + j], block,
                            elems(x, x.seq / P, 1) * g.es);
            else // my tokens of j's heads
                copy_host<false>(heads_copy(g, heads[static_cast<size_t>(k)][j]), dst, block);
        }
    };

    // A group of one: the block to myself is the whole tensor, laid out as
    // the output already (no copies through a buffer).
    if (P == 1) {
        for (int k = 0; k < n; ++k) {
            const size_t bytes = (fwd ? out_count[k] : in_count[k]) * dtype_size(t[k].dtype);
            if (bytes) std::memcpy(out[k], in[k], bytes);
        }
        return;
    }
    // Single copy where the backend can (one node, cross-memory attach): each
    // rank reads its pieces straight from its peers' inputs into its output;
    // the permutation is in the pieces. Else pack, exchange, unpack.
    std::vector<comm::Backend::Exposed> exposed(static_cast<size_t>(n));
    for (int k = 0; k < n; ++k)
        exposed[static_cast<size_t>(k)] = comm::Backend::Exposed{in[k], in_count[k] * dtype_size(t[k].dtype)};
    auto plan = [&](int peer, std::vector<comm::Backend::Piece> &pieces) {
        const size_t j = static_cast<size_t>(peer), me = static_cast<size_t>(rank_);
        for (int k = 0; k < n; ++k) {
            const dsm_sp_tensor_t &x = t[k];
            const Geometry g = geometry(k);
            unsigned char *dst = static_cast<unsigned char *>(out[k]);
            const size_t rows = g.b * g.chunk; // rows of a sequence-sharded tensor
            if (fwd) {
                // Peer j's rows (its tokens, every head): my heads of each row,
                // to token j*chunk + t of my output.
                const HeadRange h = mine(k);
                const size_t len = static_cast<size_t>(h.count) * g.d * g.es;
                if (len == 0) continue;
                for (size_t r = 0; r < rows; ++r) {
                    const size_t token_row = g.seq_first ? j * g.chunk * g.b + r
                                                         : (r / g.chunk) * g.s + j * g.chunk + r % g.chunk;
                    pieces.push_back({k, r * g.H * g.d * g.es + static_cast<size_t>(h.first) * g.d * g.es,
                                      dst + token_row * len, len});
                }
            } else {
                // Peer j's heads of my tokens: from its [.., s, c_j, d] rows.
                const HeadRange h = heads[static_cast<size_t>(k)][j];
                const size_t len = static_cast<size_t>(h.count) * g.d * g.es;
                if (len == 0) continue;
                const bool replicated = (x.flags & DSM_SP_REPLICATE) && x.heads < P;
                unsigned char *stage = replicated ? staging_.data() + stage_off[static_cast<size_t>(k) * np + j] : nullptr;
                for (size_t r = 0; r < rows; ++r) {
                    const size_t token_row = g.seq_first ? me * g.chunk * g.b + r
                                                         : (r / g.chunk) * g.s + me * g.chunk + r % g.chunk;
                    unsigned char *to = replicated ? stage + r * len : dst + r * g.H * g.d * g.es + static_cast<size_t>(h.first) * g.d * g.es;
                    pieces.push_back({k, token_row * len, to, len});
                }
            }
        }
    };
    // What this rank sends to a peer, in the order the peer's plan lists it.
    auto send_plan = [&](int peer, std::vector<comm::Backend::Piece> &pieces) {
        const size_t j = static_cast<size_t>(peer);
        for (int k = 0; k < n; ++k) {
            const Geometry g = geometry(k);
            const size_t rows = g.b * g.chunk;
            if (fwd) {
                // My rows, peer j's heads of each.
                const HeadRange h = heads[static_cast<size_t>(k)][j];
                const size_t len = static_cast<size_t>(h.count) * g.d * g.es;
                if (len == 0) continue;
                for (size_t r = 0; r < rows; ++r)
                    pieces.push_back({k, r * g.H * g.d * g.es + static_cast<size_t>(h.first) * g.d * g.es, nullptr, len});
            } else {
                // Peer j's tokens of my heads, from my [.., s, c_me, d] rows.
                const size_t len = static_cast<size_t>(mine(k).count) * g.d * g.es;
                if (len == 0) continue;
                for (size_t r = 0; r < rows; ++r) {
                    const size_t token_row = g.seq_first ? j * g.chunk * g.b + r
                                                         : (r / g.chunk) * g.s + j * g.chunk + r % g.chunk;
                    pieces.push_back({k, token_row * len, nullptr, len});
                }
            }
        }
    };
    // Across nodes: MPI reads each block from the input and writes it into
    // the output where it belongs (no pack or unpack pass; a block that is
    // contiguous on its side travels as plain bytes).
    if (!backend_->alltoall_direct(exposed, plan) && !backend_->alltoall_pieces(exposed, send_plan, plan))
        backend_->alltoall_packed(send_bytes, recv_bytes, pack, unpack);

    if (!any_replicated_back) return;
    for (int k = 0; k < n; ++k) {
        const dsm_sp_tensor_t &x = t[k];
        if (!((x.flags & DSM_SP_REPLICATE) && x.heads < P)) continue;
        const size_t ks = static_cast<size_t>(k);
        const size_t es = dtype_size(x.dtype), d = static_cast<size_t>(x.head_dim);
        const size_t rows = static_cast<size_t>(x.batch) * static_cast<size_t>(x.seq) / np;
        const size_t H = static_cast<size_t>(x.heads), copies = np / H;
        unsigned char *dst = static_cast<unsigned char *>(out[k]);
        for (size_t h = 0; h < H; ++h)
            for (size_t r = 0; r < rows; ++r)
                for (size_t e = 0; e < d; ++e) {
                    double acc = 0.0;
                    float accf = 0.0f;
                    for (size_t c = 0; c < copies; ++c) {
                        const size_t j = h * copies + c; // the ranks holding head h, ascending
                        const double v = load(staging_.data() + stage_off[ks * np + j] + (r * d + e) * es, x.dtype);
                        if (x.dtype == DSM_FLOAT64) acc += v;
                        else accf += static_cast<float>(v);
                    }
                    store(dst + ((r * H + h) * d + e) * es, x.dtype, x.dtype == DSM_FLOAT64 ? acc : accf);
                }
    }
}

void *Context::alloc(size_t bytes, bool have_output) {
    DSM_REQUIRE(backend_ != nullptr, DSM_ERR_INVALID_ARGUMENT, "the sequence-parallel context was closed");
    agree(backend_->comm(), [&] {
        DSM_REQUIRE(have_output, DSM_ERR_NULL_POINTER, "ptr is NULL");
        DSM_REQUIRE(bytes <= static_cast<size_t>(PTRDIFF_MAX) / 2, DSM_ERR_INVALID_ARGUMENT, "bytes is ", bytes,
                    " (too large to allocate)");
    });
    // The shm backend agrees on its own failures (a node whose /dev/shm is
    // too small fails every rank); the mpi backend's private memory may fail
    // on one rank: agree, and give back what the others got.
    void *p = nullptr;
    std::exception_ptr failure;
    try {
        p = backend_->alloc_shared(bytes);
    } catch (const Error &) {
        failure = std::current_exception();
    }
    Agreement a(backend_->comm());
    const size_t ok = a.add(failure ? 0 : 1);
    a.run([&] {
        if (failure) std::rethrow_exception(failure);
    });
    if (a.max(ok) == 0) std::rethrow_exception(failure); // agreed already: the same error everywhere
    if (a.failed()) {
        if (p != nullptr) backend_->free_shared(p); // private memory: not collective
        a.throw_if_failed();
    }
    allocations_.insert(p);
    return p;
}

void Context::free(void **where) {
    DSM_REQUIRE(backend_ != nullptr, DSM_ERR_INVALID_ARGUMENT, "the sequence-parallel context was closed");
    // Freeing a shared window is collective: agree that every rank frees a
    // block of its own, or that every rank passes NULL, before touching it.
    void *const ptr = where != nullptr ? *where : nullptr;
    Agreement a(backend_->comm());
    const size_t null = a.add(ptr == nullptr);
    a.run([&] {
        DSM_REQUIRE(where != nullptr, DSM_ERR_NULL_POINTER, "ptr is NULL (pass the address of the pointer)");
        DSM_REQUIRE(ptr == nullptr || allocations_.count(ptr) != 0, DSM_ERR_INVALID_ARGUMENT, "pointer ", ptr,
                    " was not returned by dsm_sp_alloc() of this context (or a copy of it was freed already)");
    });
    a.throw_if_failed();
    if (!a.same(null))
        DSM_FAIL(DSM_ERR_MISMATCH, "some ranks passed NULL and others a pointer (frees are collective): ",
                 by_value(a.by_rank(null), [](int64_t v) { return std::string(v ? "NULL" : "a pointer"); }, "passed",
                          "passed"));
    if (ptr == nullptr) return;
    allocations_.erase(ptr);
    backend_->free_shared(ptr);
    *where = nullptr;
}

void Context::loss(double loss_sum, int64_t tokens, double *mean, double *grad_scale) {
    DSM_REQUIRE(backend_ != nullptr, DSM_ERR_INVALID_ARGUMENT, "the sequence-parallel context was closed");
    const MPI_Comm comm = backend_->comm();
    agree(comm, [&] {
        DSM_ARG_NOT_NULL(mean);
        DSM_ARG_NOT_NULL(grad_scale);
        DSM_REQUIRE(tokens >= 0, DSM_ERR_INVALID_ARGUMENT, "tokens is ", tokens, " (must be >= 0)");
        DSM_REQUIRE(std::isfinite(loss_sum), DSM_ERR_INVALID_ARGUMENT, "loss_sum is ", loss_sum,
                    " (must be finite)");
    });
    // Exact in double for token counts below 2^53; the backend's reductions
    // give every rank the same bits.
    double v[2] = {loss_sum, static_cast<double>(tokens)};
    backend_->allreduce(v, v, 2, DSM_FLOAT64, comm::Op::SUM);
    if (v[1] > 0) {
        *mean = v[0] / v[1];
        *grad_scale = 1.0 / v[1];
    } else {
        *mean = 0.0;
        *grad_scale = 0.0;
    }
}

} // namespace sp
} // namespace dsm
