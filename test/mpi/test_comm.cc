// The communication backends ("mpi" and "shm" on real and simulated nodes)
// against references computed here: every rank generates every rank's data
// from a seed, so each expected value is known locally. Checks: values
// (exact for integer-valued data, within fp summation tolerance for random
// data), bit-identical results on all ranks and across repeated calls, the
// shm results next to the mpi ones, in-place forms, buffers from malloc and
// from alloc_shared, awkward counts, the chunked paths beyond the MPI count
// limit, alltoall_packed (uneven and empty blocks, a permuting pack, growing
// windows, failing callbacks), alltoall_direct (permuting plans with many
// and empty pieces, from private memory and from alloc_shared memory of
// sizes that differ between members, with and without cross-memory attach;
// which path ran; false where it cannot run; failures), argument errors, the
// backend factory (DSM_COMM_BACKEND and the memory space), capabilities,
// queues (host backends accept and ignore one) and the nccl split (skipped
// without a GPU).
//
// A failed check is recorded, not asserted at once, so that every rank goes
// on through the same collectives; each test ends by agreeing on failures.
#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/backend.hpp"
#include "comm/common.hpp"
#include "comm/mpi_backend.hpp"
#include "comm/nccl_backend.hpp"
#include "comm/pipeline.hpp"
#include "comm/shm_backend.hpp"
#include "comm/reduce.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/half.hpp"
#include "core/hash.hpp"
#include "cuda/device.hpp"

// CMocka (through mpi_test.h) last: its fail() macro would break the C++ headers.
#include "mpi_test.h"

using dsm::comm::Backend;
using dsm::comm::Kind;
using dsm::comm::Op;

#include "mpi_test_cxx.h"

namespace {

// ---------------------------------------------------------------- data

enum class Mode { EXACT, RANDOM }; // small integers (exact sums in every dtype) or uniform [-1, 1)

uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

uint64_t hash(uint64_t seed, int r, size_t i) { return mix(mix(seed * 1000003u + static_cast<uint64_t>(r)) ^ i); }

double value(Mode m, uint64_t seed, int r, size_t i) {
    const uint64_t u = hash(seed, r, i);
    if (m == Mode::EXACT) return static_cast<double>(static_cast<int>(u % 31) - 15);
    return static_cast<double>(u >> 11) * 0x1p-52 - 1.0;
}

size_t esize(dsm_dtype_t t) { return dsm::require_dtype_size(t); }

void put(dsm_dtype_t t, void *buf, size_t i, double v) {
    char *p = static_cast<char *>(buf) + i * esize(t);
    if (t == DSM_FLOAT64) {
        std::memcpy(p, &v, 8);
    } else if (t == DSM_FLOAT32) {
        const float f = static_cast<float>(v);
        std::memcpy(p, &f, 4);
    } else {
        const uint16_t h = t == DSM_FLOAT16 ? dsm::fp32_to_fp16(static_cast<float>(v)) : dsm::fp32_to_bf16(static_cast<float>(v));
        std::memcpy(p, &h, 2);
    }
}

double get(dsm_dtype_t t, const void *buf, size_t i) {
    const char *p = static_cast<const char *>(buf) + i * esize(t);
    if (t == DSM_FLOAT64) {
        double v;
        std::memcpy(&v, p, 8);
        return v;
    }
    if (t == DSM_FLOAT32) {
        float f;
        std::memcpy(&f, p, 4);
        return f;
    }
    uint16_t h;
    std::memcpy(&h, p, 2);
    return t == DSM_FLOAT16 ? dsm::fp16_to_fp32(h) : dsm::bf16_to_fp32(h);
}

// The value as stored in dtype t.
double rounded(dsm_dtype_t t, double v) {
    unsigned char b[8];
    put(t, b, 0, v);
    return get(t, b, 0);
}

double eps(dsm_dtype_t t) {
    switch (t) {
    case DSM_FLOAT64: return 0x1p-52;
    case DSM_FLOAT32: return 0x1p-23;
    case DSM_FLOAT16: return 0x1p-10;
    default: return 0x1p-7;
    }
}

// The reduction of rank-ordered inputs in double, and the tolerance of a
// result computed in another order (16-bit types: rounded at each combine).
struct Expect {
    double value, tol;
};

Expect expect_of(dsm_dtype_t t, Op op, Mode m, uint64_t seed, size_t index_of_rank_data) {
    double acc = 0, mag = 0;
    for (int r = 0; r < test_size; ++r) {
        const double x = rounded(t, value(m, seed, r, index_of_rank_data));
        mag += std::fabs(x);
        if (r == 0)
            acc = x;
        else if (op == Op::SUM)
            acc += x;
        else if (op == Op::MAX)
            acc = std::max(acc, x);
        else
            acc = std::min(acc, x);
    }
    if (op != Op::SUM || m == Mode::EXACT) return Expect{rounded(t, acc), 0};
    double tol = (test_size + 1) * eps(t) * mag;
    if (t == DSM_FLOAT16) tol += test_size * 0x1p-24; // rounding in the subnormal range
    return Expect{acc, tol};
}

uint64_t bytes_hash(const void *p, size_t n) { return dsm::fnv1a(p, n); }

// Whether `n` bytes have the same bits on every rank.
bool same_on_all_ranks(const void *p, size_t n) {
    unsigned long long h = bytes_hash(p, n), lo = 0, hi = 0;
    MPI_Allreduce(&h, &lo, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&h, &hi, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
    return lo == hi;
}

// ---------------------------------------------------------------- buffers

// Where a collective's buffers live.
enum class Place {
    HEAP,               // malloc, send != recv
    HEAP_INPLACE,       // malloc, in place
    SHARED,             // alloc_shared, send != recv
    SHARED_INPLACE,     // alloc_shared, in place
    SEND_SHARED,        // send from alloc_shared, recv malloc
    RECV_SHARED,        // send malloc, recv from alloc_shared
    SHARED_OFFSET,      // alloc_shared at a small offset, the same on all ranks
    SHARED_RANK_OFFSET, // alloc_shared at an offset that differs between ranks
};
const Place kAllPlaces[] = {Place::HEAP,        Place::HEAP_INPLACE, Place::SHARED,        Place::SHARED_INPLACE,
                            Place::SEND_SHARED, Place::RECV_SHARED,  Place::SHARED_OFFSET, Place::SHARED_RANK_OFFSET};

const char *place_name(Place p) {
    switch (p) {
    case Place::HEAP: return "heap";
    case Place::HEAP_INPLACE: return "heap in place";
    case Place::SHARED: return "shared";
    case Place::SHARED_INPLACE: return "shared in place";
    case Place::SEND_SHARED: return "send shared";
    case Place::RECV_SHARED: return "recv shared";
    case Place::SHARED_OFFSET: return "shared at offset";
    default: return "shared at rank offsets";
    }
}

bool in_place(Place p) { return p == Place::HEAP_INPLACE || p == Place::SHARED_INPLACE; }
bool send_shared(Place p) { return p != Place::HEAP && p != Place::HEAP_INPLACE && p != Place::RECV_SHARED; }
bool recv_shared(Place p) { return p != Place::HEAP && p != Place::HEAP_INPLACE && p != Place::SEND_SHARED; }
size_t place_offset(Place p) {
    if (p == Place::SHARED_OFFSET) return 24;
    if (p == Place::SHARED_RANK_OFFSET) return 8 * static_cast<size_t>(test_rank % 3);
    return 0;
}

// A buffer of `bytes` from malloc or from be.alloc_shared (every rank asks
// for `alloc_bytes`; sizes that differ between ranks are tested with
// alltoall_direct).
class Buf {
public:
    Buf(Backend &be, bool shared, size_t bytes, size_t alloc_bytes, size_t offset) : be_(be) {
        if (shared) {
            shared_ = be.alloc_shared(alloc_bytes + 64);
            p_ = static_cast<unsigned char *>(shared_) + offset;
        } else {
            heap_.assign(bytes + 8, 0xcd);
            p_ = heap_.data();
        }
    }
    ~Buf() {
        try {
            if (shared_) be_.free_shared(shared_);
        } catch (const std::exception &e) {
            record(std::string("free_shared: ") + e.what());
        }
    }
    Buf(const Buf &) = delete;
    Buf &operator=(const Buf &) = delete;
    unsigned char *data() { return p_; }

private:
    Backend &be_;
    void *shared_ = nullptr;
    std::vector<unsigned char> heap_;
    unsigned char *p_ = nullptr;
};

// ---------------------------------------------------------------- backends under test

struct Config {
    const char *label;
    Kind kind;
    int (*color)(int rank); // node_color of a rank; NULL: discover (-1)
};

int pairs(int r) { return r / 2; }
int interleaved(int r) { return r % 2; }
int threes(int r) { return r / 3; }
int alone(int r) { return r; }

const Config kConfigs[] = {
    {"mpi", Kind::MPI, nullptr},
    {"shm", Kind::SHM, nullptr},
    {"shm nodes rank/2", Kind::SHM, pairs},
    {"shm nodes rank%2", Kind::SHM, interleaved},
    {"shm nodes rank/3", Kind::SHM, threes},
    {"shm node per rank", Kind::SHM, alone},
    {"auto", Kind::AUTO, nullptr},
};

std::unique_ptr<Backend> make(const Config &c) {
    return dsm::comm::create_backend(MPI_COMM_WORLD, c.kind, c.color ? c.color(test_rank) : -1);
}

// The nodes a backend made with `color` sees: ranks of one real node (see
// mpi_test.h) with equal colors, since node_comm splits the colors further
// by MPI_COMM_TYPE_SHARED. Without a color, the real nodes.
bool same_node(int (*color)(int), int a, int b) {
    return test_node_of[a] == test_node_of[b] && (color == nullptr || color(a) == color(b));
}

int nodes_seen(int (*color)(int)) {
    int n = 0;
    for (int r = 0; r < test_size; ++r) {
        bool first = true;
        for (int q = 0; q < r && first; ++q) first = !same_node(color, q, r);
        n += first;
    }
    return n;
}

// Whether bytes to member q count as sent off the node: all of them for the
// mpi backend (which does not know the nodes), else those to another node.
std::function<bool(size_t)> off_node_of(const Backend &be, const Config &c) {
    const bool mpi = std::string(be.name()) == "mpi";
    return [mpi, color = c.color](size_t q) { return mpi || !same_node(color, static_cast<int>(q), test_rank); };
}

// ---------------------------------------------------------------- allreduce

// One allreduce checked against the reference; returns the result.
std::vector<unsigned char> run_allreduce(Backend &be, const char *label, Place pl, dsm_dtype_t t, Op op,
                                         size_t count, Mode m, uint64_t seed) {
    const size_t bytes = count * esize(t);
    const std::string what = dsm::cat(label, " allreduce ", dsm::dtype_name(t), " ",
                                      dsm::comm::op_label(op), " count ", count, " ", place_name(pl),
                                      m == Mode::EXACT ? " exact" : " random");
    const size_t off = place_offset(pl);
    Buf a(be, send_shared(pl), bytes, bytes + 64, off);
    std::unique_ptr<Buf> b;
    if (!in_place(pl)) b = std::make_unique<Buf>(be, recv_shared(pl), bytes, bytes + 64, off);
    unsigned char *send = a.data(), *recv = b ? b->data() : send;
    for (size_t i = 0; i < count; ++i) put(t, send, i, value(m, seed, test_rank, i));
    std::vector<unsigned char> copy_of_send(send, send + bytes);
    be.allreduce(send, recv, count, t, op);
    std::vector<unsigned char> result(recv, recv + bytes);
    int bad = 0;
    for (size_t i = 0; i < count; ++i) {
        const Expect e = expect_of(t, op, m, seed, i);
        const double got = get(t, recv, i);
        if (!(std::fabs(got - e.value) <= e.tol)) {
            if (bad++ == 0) CHECK(false, what, ": element ", i, " is ", got, ", expected ", e.value, " +- ", e.tol);
        }
    }
    CHECK(same_on_all_ranks(result.data(), bytes), what, ": results differ between ranks");
    if (!in_place(pl)) {
        CHECK(bytes == 0 || std::memcmp(copy_of_send.data(), send, bytes) == 0, what, ": send was modified");
        // Again on the same input: the same bits.
        be.allreduce(send, recv, count, t, op);
        CHECK(bytes == 0 || std::memcmp(result.data(), recv, bytes) == 0, what, ": a repeated call gave other bits");
    }
    return result;
}

// Element-wise agreement of two backends' results within the tolerance of
// the summation order (exact for MAX/MIN and integer-valued data).
void compare_results(const std::string &what, dsm_dtype_t t, Op op, Mode m, uint64_t seed, size_t first_index,
                     const std::vector<unsigned char> &a, const std::vector<unsigned char> &b) {
    CHECK(a.size() == b.size(), what, ": sizes ", a.size(), " and ", b.size());
    if (a.size() != b.size()) return;
    const size_t n = a.size() / esize(t);
    for (size_t i = 0; i < n; ++i) {
        const double tol = 2 * expect_of(t, op, m, seed, first_index + i).tol;
        const double x = get(t, a.data(), i), y = get(t, b.data(), i);
        if (!(std::fabs(x - y) <= tol)) {
            CHECK(false, what, ": element ", i, " is ", x, " and ", y, " with the mpi backend");
            return;
        }
    }
}

const dsm_dtype_t kFloatTypes[] = {DSM_FLOAT32, DSM_FLOAT64, DSM_FLOAT16, DSM_BFLOAT16};
const Op kOps[] = {Op::SUM, Op::MAX, Op::MIN};

void allreduce_suite(Backend &be, Backend &ref, const char *label) {
    uint64_t seed = 1;
    // Routing: integer-valued data, exact results, every buffer placement.
    for (dsm_dtype_t t : kFloatTypes)
        for (size_t count : {size_t(0), size_t(1), size_t(7), size_t(1021)})
            for (Place pl : kAllPlaces) run_allreduce(be, label, pl, t, Op::SUM, count, Mode::EXACT, ++seed);
    // Rounding: random data, every op, next to the mpi backend.
    for (dsm_dtype_t t : kFloatTypes)
        for (Op op : kOps)
            for (size_t count : {size_t(1), size_t(13), size_t(4099)})
                for (Place pl : {Place::HEAP, Place::SHARED_INPLACE}) {
                    ++seed;
                    const auto got = run_allreduce(be, label, pl, t, op, count, Mode::RANDOM, seed);
                    const auto want = run_allreduce(ref, "mpi", Place::HEAP, t, op, count, Mode::RANDOM, seed);
                    compare_results(dsm::cat(label, " allreduce ", dsm::dtype_name(t), " ",
                                             dsm::comm::op_label(op), " count ", count),
                                    t, op, Mode::RANDOM, seed, 0, got, want);
                }
    run_allreduce(be, label, Place::SHARED, DSM_FLOAT32, Op::SUM, 100003, Mode::RANDOM, ++seed);
}

// ---------------------------------------------------------------- reduce_scatterv

// Count patterns over the group: zeros, primes, uneven, empty members.
std::vector<std::vector<size_t>> count_patterns() {
    const size_t n = static_cast<size_t>(test_size);
    std::vector<std::vector<size_t>> ps;
    ps.push_back(std::vector<size_t>(n, 0));
    ps.push_back(std::vector<size_t>(n, 13));
    std::vector<size_t> v(n);
    for (size_t r = 0; r < n; ++r) v[r] = 3 * r + 1;
    ps.push_back(v);
    for (size_t r = 0; r < n; ++r) v[r] = r % 2 ? 5 : 0;
    ps.push_back(v);
    for (size_t r = 0; r < n; ++r) v[r] = r == 0 ? 1021 : 0;
    ps.push_back(v);
    for (size_t r = 0; r < n; ++r) v[r] = r == n - 1 ? 7 : (r * 7919) % 11;
    ps.push_back(v);
    return ps;
}

std::string join(const std::vector<size_t> &v) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
    return s;
}

std::vector<unsigned char> run_reduce_scatterv(Backend &be, const char *label, Place pl, dsm_dtype_t t, Op op,
                                               const std::vector<size_t> &counts, Mode m, uint64_t seed,
                                               bool equal_form) {
    const size_t es = esize(t), me = static_cast<size_t>(test_rank);
    size_t total = 0, offset = 0, most = 0;
    for (size_t r = 0; r < counts.size(); ++r) {
        if (r == me) offset = total;
        total += counts[r];
        most = std::max(most, counts[r]);
    }
    const std::string what = dsm::cat(label, " reduce_scatter", equal_form ? "" : "v", " ", dsm::dtype_name(t),
                                      " ", dsm::comm::op_label(op), " counts [", join(counts), "] ",
                                      place_name(pl), m == Mode::EXACT ? " exact" : " random");
    const size_t off = place_offset(pl);
    Buf a(be, send_shared(pl), total * es, total * es, off);
    std::unique_ptr<Buf> b;
    if (!in_place(pl)) b = std::make_unique<Buf>(be, recv_shared(pl), counts[me] * es, most * es, off);
    unsigned char *send = a.data();
    unsigned char *recv = b ? b->data() : send + offset * es;
    for (size_t i = 0; i < total; ++i) put(t, send, i, value(m, seed, test_rank, i));
    if (equal_form)
        be.reduce_scatter(send, recv, counts[0], t, op);
    else
        be.reduce_scatterv(send, recv, counts, t, op);
    for (size_t i = 0; i < counts[me]; ++i) {
        const Expect e = expect_of(t, op, m, seed, offset + i);
        const double got = get(t, recv, i);
        if (!(std::fabs(got - e.value) <= e.tol)) {
            CHECK(false, what, ": element ", i, " is ", got, ", expected ", e.value, " +- ", e.tol);
            break;
        }
    }
    return std::vector<unsigned char>(recv, recv + counts[me] * es);
}

void reduce_scatter_suite(Backend &be, Backend &ref, const char *label) {
    uint64_t seed = 1000;
    const Place places[] = {Place::HEAP, Place::HEAP_INPLACE, Place::SHARED, Place::SHARED_INPLACE,
                            Place::SEND_SHARED, Place::SHARED_RANK_OFFSET};
    for (const auto &counts : count_patterns()) {
        const size_t me = static_cast<size_t>(test_rank);
        size_t first = 0;
        for (size_t r = 0; r < me; ++r) first += counts[r];
        for (dsm_dtype_t t : kFloatTypes) {
            for (Place pl : places)
                run_reduce_scatterv(be, label, pl, t, Op::SUM, counts, Mode::EXACT, ++seed, false);
            for (Op op : kOps) {
                ++seed;
                const auto got = run_reduce_scatterv(be, label, Place::HEAP, t, op, counts, Mode::RANDOM, seed, false);
                const auto want = run_reduce_scatterv(ref, "mpi", Place::HEAP, t, op, counts, Mode::RANDOM, seed, false);
                compare_results(dsm::cat(label, " reduce_scatterv ", dsm::dtype_name(t), " counts [",
                                         join(counts), "]"),
                                t, op, Mode::RANDOM, seed, first, got, want);
            }
        }
        if (std::all_of(counts.begin(), counts.end(), [&](size_t c) { return c == counts[0]; }))
            run_reduce_scatterv(be, label, Place::SHARED_INPLACE, DSM_FLOAT32, Op::SUM, counts, Mode::EXACT, ++seed,
                                true);
    }
}

// ---------------------------------------------------------------- allgatherv

void run_allgatherv(Backend &be, const char *label, Place pl, dsm_dtype_t t, const std::vector<size_t> &counts,
                    uint64_t seed, bool equal_form) {
    const size_t es = esize(t), me = static_cast<size_t>(test_rank);
    size_t total = 0, offset = 0, most = 0;
    std::vector<size_t> offs(counts.size());
    for (size_t r = 0; r < counts.size(); ++r) {
        offs[r] = total;
        if (r == me) offset = total;
        total += counts[r];
        most = std::max(most, counts[r]);
    }
    const std::string what = dsm::cat(label, " allgather", equal_form ? "" : "v", " ", dsm::dtype_name(t),
                                      " counts [", join(counts), "] ", place_name(pl));
    const size_t off = place_offset(pl);
    // recv is "b" (allocated first on every rank, so alloc_shared calls line up).
    Buf b(be, recv_shared(pl), total * es, total * es, off);
    std::unique_ptr<Buf> a;
    if (!in_place(pl)) a = std::make_unique<Buf>(be, send_shared(pl), counts[me] * es, most * es, off);
    unsigned char *recv = b.data();
    unsigned char *send = a ? a->data() : recv + offset * es;
    auto byte_of = [&](int r, size_t k) { return static_cast<unsigned char>(hash(seed, r, k)); };
    for (size_t k = 0; k < counts[me] * es; ++k) send[k] = byte_of(test_rank, k);
    if (equal_form)
        be.allgather(send, recv, counts[0], t);
    else
        be.allgatherv(send, recv, counts, t);
    for (size_t r = 0; r < counts.size(); ++r)
        for (size_t k = 0; k < counts[r] * es; ++k)
            if (recv[offs[r] * es + k] != byte_of(static_cast<int>(r), k)) {
                CHECK(false, what, ": byte ", k, " of rank ", r, "'s block is wrong");
                r = counts.size() - 1;
                break;
            }
    CHECK(same_on_all_ranks(recv, total * es), what, ": results differ between ranks");
}

void allgather_suite(Backend &be, const char *label) {
    uint64_t seed = 5000;
    const Place places[] = {Place::HEAP,        Place::HEAP_INPLACE, Place::SHARED,
                            Place::SHARED_INPLACE, Place::SEND_SHARED, Place::RECV_SHARED,
                            Place::SHARED_RANK_OFFSET};
    for (const auto &counts : count_patterns()) {
        for (dsm_dtype_t t : {DSM_FLOAT32, DSM_FLOAT16, DSM_FLOAT64, DSM_INT8})
            for (Place pl : places) run_allgatherv(be, label, pl, t, counts, ++seed, false);
        if (std::all_of(counts.begin(), counts.end(), [&](size_t c) { return c == counts[0]; }))
            run_allgatherv(be, label, Place::SHARED_INPLACE, DSM_BFLOAT16, counts, ++seed, true);
    }
}

// ---------------------------------------------------------------- alltoallv and bcast

void alltoallv_and_bcast(Backend &be, const char *label) {
    const size_t n = static_cast<size_t>(test_size), me = static_cast<size_t>(test_rank);
    // Rank r sends (r + 2q) % 5 int32 values to q, each value naming (r, q, k).
    auto cnt = [](size_t r, size_t q) { return (r + 2 * q) % 5; };
    std::vector<size_t> sc(n), sd(n), rc(n), rd(n);
    size_t stot = 0, rtot = 0;
    for (size_t q = 0; q < n; ++q) {
        sc[q] = cnt(me, q);
        sd[q] = stot + 1; // a gap of one element between blocks
        stot += sc[q] + 1;
        rc[q] = cnt(q, me);
        rd[q] = rtot;
        rtot += rc[q];
    }
    std::vector<int32_t> send(stot, -1), recv(rtot + 1, -7);
    for (size_t q = 0; q < n; ++q)
        for (size_t k = 0; k < sc[q]; ++k) send[sd[q] + k] = static_cast<int32_t>(me * 10000 + q * 100 + k);
    be.alltoallv(send.data(), sc, sd, recv.data(), rc, rd, DSM_INT32);
    for (size_t q = 0; q < n; ++q)
        for (size_t k = 0; k < rc[q]; ++k)
            CHECK(recv[rd[q] + k] == static_cast<int32_t>(q * 10000 + me * 100 + k), label, " alltoallv: from rank ",
                  q, " element ", k, " is ", recv[rd[q] + k]);
    CHECK(recv[rtot] == -7, label, " alltoallv wrote past its blocks");

    for (size_t count : {size_t(0), size_t(1), size_t(1021)}) {
        const int root = test_size - 1;
        std::vector<double> buf(count, -1.0);
        if (test_rank == root)
            for (size_t i = 0; i < count; ++i) buf[i] = value(Mode::RANDOM, 77, root, i);
        be.bcast(buf.data(), count, DSM_FLOAT64, root);
        for (size_t i = 0; i < count; ++i)
            if (buf[i] != value(Mode::RANDOM, 77, root, i)) {
                CHECK(false, label, " bcast count ", count, ": element ", i, " is ", buf[i]);
                break;
            }
    }
    be.barrier();
}

// ---------------------------------------------------------------- alltoall_packed

// Bytes member p sends to member q: zero for about a quarter of the pairs
// (this member's own block included), else 1 to `scale`.
size_t packed_bytes(uint64_t seed, size_t p, size_t q, size_t scale) {
    const uint64_t h = hash(seed, static_cast<int>(p), q);
    return h % 4 == 0 ? 0 : 1 + (h >> 8) % scale;
}

// Byte k of the block p sends to q.
unsigned char packed_byte(uint64_t seed, size_t p, size_t q, size_t k) {
    return static_cast<unsigned char>(hash(seed + 1, static_cast<int>(p * 1000 + q), k));
}

using BlockBytes = std::function<size_t(size_t p, size_t q)>; // bytes member p sends to member q

// One alltoall_packed whose pack writes each block reversed and whose unpack
// reverses it back, checked exactly, with the calls and Stats it made.
// `off_node(q)`: whether member q is on another node as the backend counts it.
void run_packed(Backend &be, const std::string &what, uint64_t seed, const BlockBytes &bytes,
                const std::function<bool(size_t)> &off_node) {
    const size_t n = static_cast<size_t>(test_size), me = static_cast<size_t>(test_rank);
    std::vector<size_t> sb(n), rb(n), soff(n), roff(n);
    size_t stot = 0, rtot = 0;
    for (size_t q = 0; q < n; ++q) {
        sb[q] = bytes(me, q);
        rb[q] = bytes(q, me);
        soff[q] = stot;
        roff[q] = rtot;
        stot += sb[q];
        rtot += rb[q];
    }
    std::vector<unsigned char> src(stot), dst(rtot + 1, 0xa5);
    for (size_t q = 0; q < n; ++q)
        for (size_t k = 0; k < sb[q]; ++k) src[soff[q] + k] = packed_byte(seed, me, q, k);
    std::vector<int> packs(n, 0), unpacks(n, 0);
    bool inside = false;
    int misaligned = 0, concurrent = 0, bad_peer = 0;
    auto enter = [&](int peer, const void *buf) {
        if (inside) ++concurrent;
        inside = true;
        if (reinterpret_cast<uintptr_t>(buf) % 64 != 0) ++misaligned;
        if (peer < 0 || peer >= test_size) ++bad_peer;
        return peer >= 0 && peer < test_size;
    };
    const Backend::PackFn pack = [&](int peer, void *buf) {
        if (enter(peer, buf)) {
            const size_t q = static_cast<size_t>(peer), len = sb[q];
            unsigned char *out = static_cast<unsigned char *>(buf);
            for (size_t j = 0; j < len; ++j) out[j] = src[soff[q] + len - 1 - j];
            ++packs[q];
        }
        inside = false;
    };
    const Backend::UnpackFn unpack = [&](int peer, const void *buf) {
        if (enter(peer, buf)) {
            const size_t q = static_cast<size_t>(peer), len = rb[q];
            const unsigned char *in = static_cast<const unsigned char *>(buf);
            for (size_t j = 0; j < len; ++j) dst[roff[q] + len - 1 - j] = in[j];
            ++unpacks[q];
        }
        inside = false;
    };
    be.reset_stats();
    be.alltoall_packed(sb, rb, pack, unpack);
    CHECK(misaligned == 0 && concurrent == 0 && bad_peer == 0, what, ": ", misaligned, " misaligned, ", concurrent,
          " concurrent, ", bad_peer, " bad peer callbacks");
    for (size_t q = 0; q < n; ++q) {
        CHECK(packs[q] == (sb[q] ? 1 : 0), what, ": pack called ", packs[q], " times for member ", q, " (", sb[q],
              " bytes)");
        CHECK(unpacks[q] == (rb[q] ? 1 : 0), what, ": unpack called ", unpacks[q], " times for member ", q, " (",
              rb[q], " bytes)");
        for (size_t k = 0; k < rb[q]; ++k)
            if (dst[roff[q] + k] != packed_byte(seed, q, me, k)) {
                CHECK(false, what, ": byte ", k, " of ", rb[q], " from member ", q, " is wrong");
                break;
            }
    }
    CHECK(dst[rtot] == 0xa5, what, ": unpack wrote past its blocks");
    uint64_t sent = 0, off = 0;
    for (size_t q = 0; q < n; ++q) {
        if (q != me) sent += sb[q];
        if (q != me && off_node(q)) off += sb[q];
    }
    const dsm::comm::Stats st = be.stats();
    CHECK(st.calls == 1 && st.bytes_sent == sent && st.bytes_off_node == off, what, ": stats ", st.calls, " calls, ",
          st.bytes_sent, " bytes sent, ", st.bytes_off_node, " off the node; expected 1, ", sent, ", ", off);
}

// A pack that throws on one member: every member throws (the others with
// the thrower's status, naming it); an unpack that throws: only its member.
// The backend works afterwards.
void packed_failures(Backend &be, const char *label, const std::function<bool(size_t)> &off_node) {
    const size_t n = static_cast<size_t>(test_size);
    const int thrower = test_size - 1;
    std::vector<size_t> sizes(n, 100);
    std::vector<unsigned char> sink(100);
    const Backend::UnpackFn unpack = [&](int, const void *buf) { std::memcpy(sink.data(), buf, 100); };
    for (int dsm_error = 0; dsm_error < 2; ++dsm_error) {
        int packs = 0;
        const Backend::PackFn pack = [&](int, void *buf) {
            std::memset(buf, 1, 100);
            if (test_rank == thrower && ++packs == std::min(2, test_size)) {
                if (dsm_error) DSM_FAIL(DSM_ERR_IO, "pack test failure");
                throw std::runtime_error("pack test failure");
            }
        };
        const dsm_status_t want = dsm_error ? DSM_ERR_IO : DSM_ERR_INTERNAL;
        try {
            be.alltoall_packed(sizes, sizes, pack, unpack);
            CHECK(false, label, " alltoall_packed: a throwing pack on member ", thrower, " did not throw here");
        } catch (const dsm::Error &e) {
            CHECK(e.status() == want, label, " alltoall_packed after a failed pack: status ", e.status(), " (",
                  e.what(), ")");
            if (test_rank == thrower)
                CHECK(dsm_error && e.message() == "pack test failure", label, " alltoall_packed: ", e.what());
            else
                CHECK(e.message().find(dsm::cat("member ", thrower)) != std::string::npos, label,
                      " alltoall_packed: \"", e.what(), "\" does not name member ", thrower);
        } catch (const std::runtime_error &e) {
            CHECK(test_rank == thrower && !dsm_error, label, " alltoall_packed: ", e.what());
        }
    }
    int unpacks = 0;
    const Backend::PackFn pack = [&](int, void *buf) { std::memset(buf, 1, 100); };
    const Backend::UnpackFn throwing = [&](int, const void *) {
        ++unpacks;
        if (test_rank == 0) throw std::runtime_error("unpack test failure");
    };
    try {
        be.alltoall_packed(sizes, sizes, pack, throwing);
        CHECK(test_rank != 0, label, " alltoall_packed: a throwing unpack did not throw");
        CHECK(unpacks == test_size, label, " alltoall_packed: ", unpacks, " unpacks");
    } catch (const std::runtime_error &e) {
        CHECK(test_rank == 0 && unpacks == 1, label, " alltoall_packed: ", e.what(), " after ", unpacks, " unpacks");
    }
    const uint64_t seed = 4242;
    run_packed(be, dsm::cat(label, " alltoall_packed after failures"), seed,
               [&](size_t p, size_t q) { return packed_bytes(seed, p, q, 300); }, off_node);
}

void packed_suite(Backend &be, const Config &c) {
    const std::function<bool(size_t)> off_node = off_node_of(be, c);
    uint64_t seed = 7000;
    // Back to back, growing: the shm window grows several times.
    for (size_t scale : {size_t(1), size_t(5), size_t(100), size_t(4099), size_t(70000), size_t(400000)}) {
        ++seed;
        run_packed(be, dsm::cat(c.label, " alltoall_packed scale ", scale), seed,
                   [&](size_t p, size_t q) { return packed_bytes(seed, p, q, scale); }, off_node);
    }
    // Shrinking again; a member that alone outgrows the window; nothing at
    // all; blocks of exactly 64 bytes (no padding), twice.
    ++seed;
    run_packed(be, dsm::cat(c.label, " alltoall_packed scale 3"), seed,
               [&](size_t p, size_t q) { return packed_bytes(seed, p, q, 3); }, off_node);
    ++seed;
    run_packed(be, dsm::cat(c.label, " alltoall_packed member 0 grows"), seed,
               [&](size_t p, size_t q) { return p == 0 ? (size_t(3) << 20) + q : packed_bytes(seed, p, q, 64); },
               off_node);
    run_packed(be, dsm::cat(c.label, " alltoall_packed all empty"), ++seed, [](size_t, size_t) { return 0; },
               off_node);
    for (int again = 0; again < 2; ++again)
        run_packed(be, dsm::cat(c.label, " alltoall_packed 64 bytes"), seed, [](size_t, size_t) { return 64; },
                   off_node);
    packed_failures(be, c.label, off_node);
}

// ---------------------------------------------------------------- alltoall_direct

// Member p's exposed buffer b: `base` + 61 p + 7 b bytes; byte k of it.
size_t direct_size(size_t base, size_t p, size_t b) { return base + 61 * p + 7 * b; }
unsigned char direct_byte(uint64_t seed, size_t p, size_t b, size_t k) {
    return static_cast<unsigned char>(hash(seed + 2, static_cast<int>(p * 1000 + b), k));
}

// What member `dst` copies from member `src`: piece j reads `bytes` at
// `from` of buffer b and lands at `at` in dst's output for src. Up to three
// runs, one after the other in the output: `random` pieces of up to `len`
// bytes (about one in eight empty) from anywhere, landing in reverse order
// with the odd one-byte gap; unless `gather_only`, `m` pieces of `len` bytes
// read back to back from buffer 1 % B (the source side merges) landing
// strided (j * 7 mod m); and m pieces read strided from buffer 2 % B landing
// back to back (the destination side merges). With enough pieces, the
// gather-only shape is pushed by the source, the others pulled.
// *end: the output's size.
struct DirectSpec {
    int b;
    size_t from, bytes, at;
};
struct DirectShape {
    size_t buffers, base, random, m, len;
    bool gather_only;
};
std::vector<DirectSpec> direct_specs(uint64_t seed, const DirectShape &sh, size_t src, size_t dst, size_t *end) {
    std::vector<DirectSpec> v;
    size_t at = 0;
    const uint64_t s = seed * 7919 + src * 131 + dst;
    std::vector<DirectSpec> rnd(sh.random);
    for (size_t j = 0; j < sh.random; ++j) {
        const uint64_t h = hash(s, 1, j);
        DirectSpec d;
        d.b = static_cast<int>(h % sh.buffers);
        d.bytes = (h >> 8) % 8 == 0 ? 0 : 1 + (h >> 12) % sh.len;
        const size_t size = direct_size(sh.base, src, static_cast<size_t>(d.b));
        d.from = (h >> 32) % (size - d.bytes + 1);
        rnd[j] = d;
    }
    for (size_t j = sh.random; j-- > 0;) { // reverse order in the output
        rnd[j].at = at;
        at += rnd[j].bytes + (hash(s, 2, j) % 3 == 0 ? 1 : 0);
    }
    v.insert(v.end(), rnd.begin(), rnd.end());
    size_t stride = 7;
    while (sh.m > 1 && std::gcd(stride, sh.m) != 1) ++stride;
    if (!sh.gather_only) {
        for (size_t j = 0; j < sh.m; ++j)
            v.push_back(
                DirectSpec{static_cast<int>(1 % sh.buffers), j * sh.len, sh.len, at + (j * stride % sh.m) * sh.len});
        at += sh.m * sh.len;
    }
    for (size_t j = 0; j < sh.m; ++j)
        v.push_back(
            DirectSpec{static_cast<int>(2 % sh.buffers), (j * stride % sh.m) * sh.len, sh.len, at + j * sh.len});
    at += sh.m * sh.len;
    *end = at;
    return v;
}

bool shm_one_node(Backend &be) {
    const auto *s = dynamic_cast<const dsm::comm::ShmBackend *>(&be);
    return s != nullptr && s->nodes() == 1;
}

// Whether every rank got the same answer from alltoall_direct.
bool agreed(bool mine) {
    int x = mine ? 1 : 0, lo = 0, hi = 0;
    MPI_Allreduce(&x, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&x, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    return lo == hi;
}

// alloc_shared memory of `bytes` (which may differ between members, or be
// zero), freed by the destructor: every member holds as many, in the same
// order, as alloc_shared and free_shared require.
class SharedBlock {
public:
    SharedBlock(Backend &be, size_t bytes) : be_(be), p_(static_cast<unsigned char *>(be.alloc_shared(bytes))) {
        CHECK(reinterpret_cast<uintptr_t>(p_) % 64 == 0, "alloc_shared(", bytes, ") is not 64-byte aligned");
        CHECK(std::all_of(p_, p_ + bytes, [](unsigned char x) { return x == 0; }), "alloc_shared(", bytes,
              ") is not zeroed");
    }
    ~SharedBlock() {
        try {
            be_.free_shared(p_);
        } catch (const std::exception &e) {
            record(std::string("free_shared: ") + e.what());
        }
    }
    SharedBlock(const SharedBlock &) = delete;
    SharedBlock &operator=(const SharedBlock &) = delete;
    unsigned char *data() const { return p_; }

private:
    Backend &be_;
    unsigned char *p_;
};

// Where run_direct's buffers live: the inputs in alloc_shared memory (on
// every member but `private_member`, whose inputs stay in private memory),
// and the outputs too.
struct DirectPlace {
    bool in_shared = false;
    int private_member = -1;
    bool out_shared = false;
};

// One alltoall_direct checked byte for byte (untouched bytes keep their
// sentinel), with its plan calls and Stats. Returns what the call returned.
// Shared inputs: the even buffers in one allocation and the odd ones in
// another, each at an offset that differs between members (as do the
// allocations' sizes), after an allocation of zero bytes on even members.
bool run_direct(Backend &be, const std::string &what, uint64_t seed, const DirectShape &sh,
                const DirectPlace &pl = DirectPlace{}) {
    const size_t n = static_cast<size_t>(test_size), me = static_cast<size_t>(test_rank);
    std::vector<std::unique_ptr<SharedBlock>> blocks;
    std::vector<std::vector<unsigned char>> heap(sh.buffers);
    std::vector<unsigned char *> in(sh.buffers);
    std::vector<size_t> at(sh.buffers, 0);
    if (pl.in_shared) {
        size_t used[2] = {0, 0};
        for (size_t b = 0; b < sh.buffers; ++b) {
            at[b] = used[b % 2] + 8 + me;
            used[b % 2] = at[b] + direct_size(sh.base, me, b);
        }
        blocks.push_back(std::make_unique<SharedBlock>(be, me % 2 == 0 ? 0 : 64 + me));
        for (int k = 0; k < 2; ++k) blocks.push_back(std::make_unique<SharedBlock>(be, used[k] + 3 * me));
    }
    const bool mine_shared = pl.in_shared && pl.private_member != test_rank;
    std::vector<Backend::Exposed> exposed(sh.buffers);
    for (size_t b = 0; b < sh.buffers; ++b) {
        const size_t size = direct_size(sh.base, me, b);
        heap[b].resize(size);
        in[b] = mine_shared ? blocks[1 + b % 2]->data() + at[b] : heap[b].data();
        for (size_t k = 0; k < size; ++k) in[b][k] = direct_byte(seed, me, b, k);
        exposed[b] = Backend::Exposed{in[b], size};
    }
    std::vector<std::vector<DirectSpec>> specs(n);
    std::vector<size_t> out_at(n, 0), out_size(n, 0);
    size_t out_total = 0;
    for (size_t q = 0; q < n; ++q) {
        specs[q] = direct_specs(seed, sh, q, me, &out_size[q]);
        out_at[q] = out_total + 5 + q; // (odd offsets)
        out_total = out_at[q] + out_size[q] + 1;
    }
    std::vector<unsigned char> out_heap(pl.out_shared ? 0 : out_total);
    if (pl.out_shared) blocks.push_back(std::make_unique<SharedBlock>(be, out_total));
    unsigned char *out_base = pl.out_shared ? blocks.back()->data() : out_heap.data();
    std::vector<unsigned char *> out(n);
    for (size_t q = 0; q < n; ++q) {
        out[q] = out_base + out_at[q];
        std::fill(out[q], out[q] + out_size[q] + 1, 0xa5);
    }
    std::vector<int> plans(n, 0);
    int first = -1, bad_peer = 0;
    const Backend::PlanFn plan = [&](int peer, std::vector<Backend::Piece> &pieces) {
        if (first < 0) first = peer;
        if (peer < 0 || peer >= test_size || !pieces.empty()) {
            ++bad_peer;
            return;
        }
        const size_t q = static_cast<size_t>(peer);
        ++plans[q];
        for (const DirectSpec &d : specs[q])
            pieces.push_back(Backend::Piece{d.b, d.from, d.bytes ? out[q] + d.at : nullptr, d.bytes});
    };
    be.reset_stats();
    const bool ran = be.alltoall_direct(exposed, plan);
    CHECK(agreed(ran), what, ": alltoall_direct returned ", ran, " here but not on every member");
    if (!ran) {
        CHECK(first < 0, what, ": alltoall_direct returned false after calling plan");
        for (size_t q = 0; q < n; ++q)
            CHECK(std::all_of(out[q], out[q] + out_size[q] + 1, [](unsigned char x) { return x == 0xa5; }), what,
                  ": alltoall_direct returned false but wrote into the output for member ", q);
        CHECK(be.stats().calls == 0, what, ": a false alltoall_direct counted ", be.stats().calls, " calls");
        return false;
    }
    CHECK(bad_peer == 0 && first == test_rank, what, ": ", bad_peer, " bad plan calls; the first for member ",
          first);
    for (size_t q = 0; q < n; ++q) {
        CHECK(plans[q] == 1, what, ": plan called ", plans[q], " times for member ", q);
        std::vector<unsigned char> want(out_size[q] + 1, 0xa5);
        for (const DirectSpec &d : specs[q])
            for (size_t k = 0; k < d.bytes; ++k)
                want[d.at + k] = direct_byte(seed, q, static_cast<size_t>(d.b), d.from + k);
        for (size_t k = 0; k < want.size(); ++k)
            if (out[q][k] != want[k]) {
                CHECK(false, what, ": byte ", k, " of ", want.size(), " from member ", q, " is ", int(out[q][k]),
                      ", expected ", int(want[k]));
                break;
            }
    }
    // The inputs are as they were.
    for (size_t b = 0; b < sh.buffers; ++b)
        for (size_t k = 0; k < exposed[b].bytes; ++k)
            if (in[b][k] != direct_byte(seed, me, b, k)) {
                CHECK(false, what, ": byte ", k, " of input ", b, " changed");
                break;
            }
    uint64_t sent = 0;
    for (size_t q = 0; q < n; ++q) {
        if (q == me) continue;
        size_t end = 0;
        for (const DirectSpec &d : direct_specs(seed, sh, me, q, &end)) sent += d.bytes;
    }
    const dsm::comm::Stats st = be.stats();
    CHECK(st.calls == 1 && st.bytes_sent == sent && st.bytes_off_node == 0, what, ": stats ", st.calls, " calls, ",
          st.bytes_sent, " bytes sent, ", st.bytes_off_node, " off the node; expected 1, ", sent, ", 0");
    return true;
}

// How an shm backend's alltoall_direct calls have copied so far, summed over
// the members: peers read and written in node-shared memory, peers pulled
// from and pushed to with cross-memory attach.
struct DirectCounts {
    uint64_t reads = 0, writes = 0, pulls = 0, pushes = 0;
};
DirectCounts direct_counts(Backend &be) {
    const auto *s = dynamic_cast<const dsm::comm::ShmBackend *>(&be);
    unsigned long long mine[4] = {s ? s->direct_reads() : 0, s ? s->direct_writes() : 0,
                                  s ? s->direct_pulls() : 0, s ? s->direct_pushes() : 0};
    unsigned long long all[4] = {0, 0, 0, 0};
    MPI_Allreduce(mine, all, 4, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    return DirectCounts{all[0], all[1], all[2], all[3]};
}

// run_direct, and how many of the member pairs were read, written, pulled
// and pushed (the path it took).
void run_direct_counted(Backend &be, const std::string &what, uint64_t seed, const DirectShape &sh,
                        const DirectCounts &want, const DirectPlace &pl = DirectPlace{}) {
    const DirectCounts a = direct_counts(be);
    run_direct(be, what, seed, sh, pl);
    const DirectCounts b = direct_counts(be);
    const DirectCounts got{b.reads - a.reads, b.writes - a.writes, b.pulls - a.pulls, b.pushes - a.pushes};
    CHECK(got.reads == want.reads && got.writes == want.writes && got.pulls == want.pulls &&
              got.pushes == want.pushes,
          what, ": ", got.reads, " reads, ", got.writes, " writes, ", got.pulls, " pulls and ", got.pushes,
          " pushes, expected ", want.reads, ", ", want.writes, ", ", want.pulls, " and ", want.pushes);
}

// A failure on one member (the last): every member throws, the failing one
// its own exception, the others its status naming it; nobody hangs. With
// `shared`, the inputs and the output lie in alloc_shared memory.
void direct_failure(Backend &be, const char *label, const std::string &what, dsm_status_t want,
                    const std::string &own_text, const std::function<void(std::vector<Backend::Exposed> &)> &expose,
                    const std::function<void(int, std::vector<Backend::Piece> &)> &bad_plan, bool shared = false) {
    const int thrower = test_size - 1;
    // (b's 500 bytes: the last piece of the pushed plan reads one past them.)
    std::vector<unsigned char> a_heap(1000, 1), b_heap(500, 2), sink_heap(1000, 0);
    std::unique_ptr<SharedBlock> mem = shared ? std::make_unique<SharedBlock>(be, 2560) : nullptr;
    unsigned char *a = shared ? mem->data() : a_heap.data();
    unsigned char *b = shared ? mem->data() + 1024 : b_heap.data();
    unsigned char *sink = shared ? mem->data() + 1536 : sink_heap.data();
    std::fill(a, a + 1000, 1);
    std::fill(b, b + 500, 2);
    std::vector<Backend::Exposed> exposed{{a, 1000}, {b, 500}};
    if (test_rank == thrower) expose(exposed);
    const Backend::PlanFn plan = [&](int peer, std::vector<Backend::Piece> &pieces) {
        pieces.push_back(Backend::Piece{0, static_cast<size_t>(peer), sink, 100});
        if (test_rank == thrower) bad_plan(peer, pieces);
    };
    const std::string name = dsm::cat(label, shared ? " alltoall_direct (shared) " : " alltoall_direct ", what);
    try {
        be.alltoall_direct(exposed, plan);
        CHECK(false, name, ": no error on rank ", test_rank);
    } catch (const dsm::Error &e) {
        CHECK(e.status() == want, name, ": status ", e.status(), " (", e.what(), "), expected ", want);
        const std::string text = test_rank == thrower ? own_text : dsm::cat("member ", thrower);
        CHECK(e.message().find(text) != std::string::npos, name, ": \"", e.what(), "\" lacks \"", text, "\"");
    } catch (const std::runtime_error &e) {
        CHECK(test_rank == thrower && want == DSM_ERR_INTERNAL, name, ": ", e.what());
    }
}

// The failures, on private or shared buffers, then a call that works.
void direct_failures(Backend &be, const Config &c, bool shared, uint64_t seed, const DirectPlace &after) {
    auto keep = [](std::vector<Backend::Exposed> &) {};
    auto fine = [](int, std::vector<Backend::Piece> &) {};
    direct_failure(be, c.label, "piece out of range", DSM_ERR_INVALID_ARGUMENT, "reads 200 bytes at offset 400", keep,
                   [](int peer, std::vector<Backend::Piece> &pieces) {
                       if (peer == (test_size - 1 + 1) % test_size)
                           pieces.push_back(Backend::Piece{1, 400, pieces[0].to, 200});
                   }, shared);
    if (test_size > 1)
        direct_failure(be, c.label, "piece out of range in a push", DSM_ERR_INVALID_ARGUMENT,
                   "reads 1 bytes at offset 500", keep, [](int peer, std::vector<Backend::Piece> &pieces) {
                       if (peer == test_size - 1) return;
                       // 100 single bytes read strided, landing back to back: pushed by the peer.
                       unsigned char *to = static_cast<unsigned char *>(pieces[0].to);
                       pieces.clear();
                       for (size_t j = 0; j < 100; ++j) pieces.push_back(Backend::Piece{1, 4 * j, to + j, 1});
                       pieces.push_back(Backend::Piece{1, 500, to + 100, 1});
                   }, shared);
    direct_failure(be, c.label, "bad buffer index", DSM_ERR_INVALID_ARGUMENT, "names buffer 2 of 2", keep,
                   [](int, std::vector<Backend::Piece> &pieces) { pieces[0].buffer = 2; }, shared);
    direct_failure(be, c.label, "no destination", DSM_ERR_NULL_POINTER, "has no destination", keep,
                   [](int, std::vector<Backend::Piece> &pieces) { pieces[0].to = nullptr; }, shared);
    direct_failure(be, c.label, "throwing plan", DSM_ERR_INTERNAL, "", keep,
                   [](int, std::vector<Backend::Piece> &) { throw std::runtime_error("plan test failure"); }, shared);
    direct_failure(be, c.label, "NULL buffer", DSM_ERR_NULL_POINTER, "exposed buffer 1 is NULL",
                   [](std::vector<Backend::Exposed> &e) { e[1].data = nullptr; }, fine, shared);
    if (test_size > 1)
        direct_failure(be, c.label, "buffer counts differ", DSM_ERR_MISMATCH, "exposes 3 buffers",
                       [](std::vector<Backend::Exposed> &e) { e.push_back(e[0]); }, fine, shared);
    run_direct(be, dsm::cat(c.label, " alltoall_direct after failures", shared ? " (shared)" : ""), seed,
               DirectShape{3, 4096, 40, 30, 16, false}, after);
}

// Inputs in alloc_shared memory: single copies with memcpy from the peers'
// segments on every OS, with or without cross-memory attach (`cma`); one
// member with private inputs makes every member fall back alike.
void direct_shared_suite(Backend &be, const Config &c, bool cma, uint64_t seed) {
    const uint64_t pairs = static_cast<uint64_t>(test_size) * static_cast<uint64_t>(test_size - 1);
    const std::string label = dsm::cat(c.label, cma ? "" : " (no cma)", " alltoall_direct shared");
    DirectPlace in;
    in.in_shared = true;
    DirectPlace both = in;
    both.out_shared = true;
    const DirectShape small{3, 4096, 40, 30, 16, false};
    // Pulled from the peers' segments (private outputs, or pieces that are
    // not gathers); back to back, with many, big and zero-byte pieces, more
    // buffers than the window first holds, and nothing at all.
    run_direct_counted(be, label, ++seed, small, DirectCounts{pairs, 0, 0, 0}, in);
    run_direct_counted(be, label + ", outputs shared", ++seed, small, DirectCounts{pairs, 0, 0, 0}, both);
    run_direct_counted(be, label + " many pieces", ++seed, DirectShape{3, 40000, 2500, 1500, 8, false},
                       DirectCounts{pairs, 0, 0, 0}, both);
    run_direct_counted(be, label + " big pieces", ++seed, DirectShape{2, size_t(3) << 20, 4, 20, size_t(1) << 17, false},
                       DirectCounts{pairs, 0, 0, 0}, in);
    run_direct_counted(be, label + " 20 buffers", ++seed, DirectShape{20, 3000, 300, 10, 64, false},
                       DirectCounts{pairs, 0, 0, 0}, in);
    run_direct_counted(be, label + " 20 buffers again", ++seed, DirectShape{20, 3000, 300, 10, 64, false},
                       DirectCounts{pairs, 0, 0, 0}, both);
    run_direct_counted(be, label + " nothing", ++seed, DirectShape{1, 0, 0, 0, 0, false},
                       DirectCounts{pairs, 0, 0, 0}, in);
    run_direct_counted(be, label + " zero pieces", ++seed, DirectShape{2, 64, 50, 0, 1, false},
                       DirectCounts{pairs, 0, 0, 0}, both);
    // Gathers (sources scattered, destinations back to back): written by the
    // source's owner when the outputs are node-shared (beyond the requests
    // the window first holds, and in big pieces), else read.
    run_direct_counted(be, label + " gather, written", ++seed, DirectShape{3, 8000, 0, 100, 24, true},
                       DirectCounts{0, pairs, 0, 0}, both);
    run_direct_counted(be, label + " gather, written, many", ++seed, DirectShape{3, 40000, 0, 3000, 8, true},
                       DirectCounts{0, pairs, 0, 0}, both);
    run_direct_counted(be, label + " gather, written, big", ++seed, DirectShape{3, size_t(1) << 20, 0, 100, 4096, true},
                       DirectCounts{0, pairs, 0, 0}, both);
    run_direct_counted(be, label + " gather, outputs private, read", ++seed, DirectShape{3, 8000, 0, 100, 24, true},
                       DirectCounts{pairs, 0, 0, 0}, in);
    run_direct_counted(be, label + " short gather, read", ++seed, DirectShape{3, 8000, 0, 20, 24, true},
                       DirectCounts{pairs, 0, 0, 0}, both);
    // One member's inputs in private memory: cross-memory attach for every
    // member, or false on every member.
    if (test_size > 1) {
        for (int who : {test_size - 1, 0}) {
            DirectPlace mixed = both;
            mixed.private_member = who;
            const DirectCounts a = direct_counts(be);
            const bool ran = run_direct(be, dsm::cat(label, ", member ", who, " private"), ++seed, small, mixed);
            const DirectCounts b = direct_counts(be);
            CHECK(ran == cma, label, ", member ", who, " private: returned ", ran, ", expected ", cma);
            CHECK(b.reads == a.reads && b.writes == a.writes &&
                      b.pulls + b.pushes - a.pulls - a.pushes == (cma ? pairs : 0),
                  label, ", member ", who, " private: ", b.reads - a.reads, " reads, ", b.writes - a.writes,
                  " writes, ", b.pulls + b.pushes - a.pulls - a.pushes, " cross-memory copies");
        }
    }
    direct_failures(be, c, true, ++seed, both);
}

void direct_suite(Backend &be, const Config &c, bool *cma) {
    // Expected: the shm backend on one node, where cross-memory attach works
    // (which the first call on such a backend tells, on every member alike).
    uint64_t seed = 11000;
    const DirectShape small{3, 4096, 40, 30, 16, false};
    const bool ran = run_direct(be, dsm::cat(c.label, " alltoall_direct"), ++seed, small);
    if (c.kind == Kind::SHM && c.color == nullptr) *cma = ran; // the probe's answer (the first config)
    const bool capable = shm_one_node(be) && (test_size == 1 || *cma);
    CHECK(ran == capable, c.label, " alltoall_direct returned ", ran, ", expected ", capable);
    if (shm_one_node(be) && test_size > 1) direct_shared_suite(be, c, *cma, 12000);
    if (c.kind == Kind::SHM && !shm_one_node(be)) { // across nodes: refused, node-shared inputs or not
        DirectPlace shared;
        shared.in_shared = shared.out_shared = true;
        CHECK(!run_direct(be, dsm::cat(c.label, " alltoall_direct shared across nodes"), seed + 500, small, shared),
              c.label, " alltoall_direct across nodes returned true");
    }
    if (!ran) return;
    // Back to back: many pieces (beyond IOV_MAX on each side), big pieces,
    // more buffers than the window first holds, nothing at all; gathers that
    // are pushed (beyond IOV_MAX at the source, and more requests than the
    // window first holds), then pulled again.
    const uint64_t pairs = static_cast<uint64_t>(test_size) * static_cast<uint64_t>(test_size - 1);
    run_direct_counted(be, dsm::cat(c.label, " alltoall_direct many pieces"), ++seed,
                       DirectShape{3, 40000, 2500, 1500, 8, false}, DirectCounts{0, 0, pairs, 0});
    run_direct(be, dsm::cat(c.label, " alltoall_direct big pieces"), ++seed,
               DirectShape{2, size_t(3) << 20, 4, 20, size_t(1) << 17, false});
    run_direct(be, dsm::cat(c.label, " alltoall_direct 20 buffers"), ++seed, DirectShape{20, 3000, 300, 10, 64, false});
    run_direct(be, dsm::cat(c.label, " alltoall_direct 20 buffers again"), ++seed,
               DirectShape{20, 3000, 300, 10, 64, false});
    run_direct(be, dsm::cat(c.label, " alltoall_direct nothing"), ++seed, DirectShape{1, 0, 0, 0, 0, false});
    run_direct(be, dsm::cat(c.label, " alltoall_direct zero pieces"), ++seed, DirectShape{2, 64, 50, 0, 1, false});
    run_direct_counted(be, dsm::cat(c.label, " alltoall_direct pushed gather"), ++seed,
                       DirectShape{3, 8000, 0, 100, 24, true}, DirectCounts{0, 0, 0, pairs});
    run_direct_counted(be, dsm::cat(c.label, " alltoall_direct pushed gather, many"), ++seed,
                       DirectShape{3, 40000, 0, 3000, 8, true}, DirectCounts{0, 0, 0, pairs});
    run_direct_counted(be, dsm::cat(c.label, " alltoall_direct short gather, pulled"), ++seed,
                       DirectShape{3, 8000, 0, 20, 24, true}, DirectCounts{0, 0, pairs, 0});
    // Private inputs with node-shared outputs: cross-memory attach still.
    DirectPlace out;
    out.out_shared = true;
    run_direct_counted(be, dsm::cat(c.label, " alltoall_direct pushed gather, outputs shared"), ++seed,
                       DirectShape{3, 8000, 0, 100, 24, true}, DirectCounts{0, 0, 0, pairs}, out);

    // Failures on the last member, then the backend still works.
    direct_failures(be, c, false, ++seed, DirectPlace{});
}

void test_alltoall_direct(void **state) {
    (void)state;
    guarded([] {
        bool cma = false;
        // The plain shm backend first: its answer is the probe's.
        const Config order[] = {kConfigs[1], kConfigs[0], kConfigs[2], kConfigs[3],
                                kConfigs[4], kConfigs[5], kConfigs[6]};
        for (const Config &c : order) {
            const auto be = make(c);
            direct_suite(*be, c, &cma);
        }
        // Where cross-memory attach is refused: inputs in node-shared memory
        // still go in a single copy, the others are packed by the callers.
        if (test_size > 1) {
            const auto be = make(kConfigs[1]);
            dynamic_cast<dsm::comm::ShmBackend &>(*be).refuse_cma();
            const bool ran = run_direct(*be, "shm (no cma) alltoall_direct", 13000, DirectShape{3, 4096, 40, 30, 16, false});
            CHECK(!ran, "shm (no cma) alltoall_direct with private inputs returned true");
            if (shm_one_node(*be)) direct_shared_suite(*be, kConfigs[1], false, 14000);
        }
        if (test_rank == 0 && test_nnodes > 1)
            print_message("alltoall_direct over %d ranks on %d nodes: refused (it works inside one node), the "
                          "callers pack\n",
                          test_size, test_nnodes);
        else if (test_rank == 0)
            print_message("alltoall_direct over %d ranks: %s; inputs in node-shared memory: single copy with memcpy\n",
                          test_size,
                          test_size == 1 ? "a group of one (memcpy)"
                          : cma          ? "private inputs: single copy with process_vm_readv"
                                         : "private inputs: refused (cross-memory attach not available), the "
                                           "callers pack");
    });
}

// ---------------------------------------------------------------- tests

void test_collectives(void **state) {
    (void)state;
    guarded([] {
        const auto ref = dsm::comm::create_backend(MPI_COMM_WORLD, Kind::MPI);
        for (const Config &c : kConfigs) {
            const auto be = make(c);
            allreduce_suite(*be, *ref, c.label);
            reduce_scatter_suite(*be, *ref, c.label);
            allgather_suite(*be, c.label);
            alltoallv_and_bcast(*be, c.label);
            packed_suite(*be, c);
        }
    });
}

// alltoall_pieces: MPI reads each member's pieces from its exposed buffers
// and writes them where the receiver's plan says (direct_specs: random,
// gathered and scattered pieces, gaps that keep their sentinel), on the mpi
// backend and the shm backend over simulated nodes; false on one node (the
// shm backend's alltoall_direct is the path there) and for a group of one.
void test_alltoall_pieces(void **state) {
    (void)state;
    guarded([] {
        const size_t n = static_cast<size_t>(test_size), me = static_cast<size_t>(test_rank);
        const DirectShape sh{3, 2000, 40, 64, 24, false};
        uint64_t seed = 7000;
        for (const Config &c : {kConfigs[0], kConfigs[1], kConfigs[2], kConfigs[4], kConfigs[5]}) {
            const auto be = make(c);
            ++seed;
            std::vector<std::vector<unsigned char>> in(sh.buffers);
            std::vector<Backend::Exposed> exposed;
            for (size_t b = 0; b < sh.buffers; ++b) {
                in[b].resize(direct_size(sh.base, me, b));
                for (size_t k = 0; k < in[b].size(); ++k) in[b][k] = direct_byte(seed, me, b, k);
                exposed.push_back({in[b].data(), in[b].size()});
            }
            std::vector<std::vector<unsigned char>> out(n);
            std::vector<std::vector<DirectSpec>> specs(n);
            for (size_t q = 0; q < n; ++q) {
                size_t end = 0;
                specs[q] = direct_specs(seed, sh, q, me, &end);
                out[q].assign(end + 1, 0xee);
            }
            auto recv_plan = [&](int peer, std::vector<Backend::Piece> &pieces) {
                const size_t q = static_cast<size_t>(peer);
                for (const DirectSpec &d : specs[q]) pieces.push_back({d.b, d.from, out[q].data() + d.at, d.bytes});
            };
            auto send_plan = [&](int peer, std::vector<Backend::Piece> &pieces) {
                size_t end = 0;
                for (const DirectSpec &d : direct_specs(seed, sh, me, static_cast<size_t>(peer), &end))
                    pieces.push_back({d.b, d.from, nullptr, d.bytes});
            };
            be->reset_stats();
            const bool ran = be->alltoall_pieces(exposed, send_plan, recv_plan);
            CHECK(agreed(ran), c.label, ": alltoall_pieces returned ", ran, " here but not on every member");
            const bool expected = n > 1 && (c.kind == Kind::MPI || !shm_one_node(*be));
            CHECK(ran == expected, c.label, ": alltoall_pieces returned ", ran, ", expected ", expected);
            if (!ran) continue;
            for (size_t q = 0; q < n; ++q) {
                std::vector<unsigned char> want(out[q].size(), 0xee);
                for (const DirectSpec &d : specs[q])
                    for (size_t k = 0; k < d.bytes; ++k) want[d.at + k] = direct_byte(seed, q, static_cast<size_t>(d.b), d.from + k);
                CHECK(want == out[q], c.label, ": alltoall_pieces: the bytes from member ", q, " differ");
            }
            uint64_t sent = 0;
            for (size_t q = 0; q < n; ++q) {
                if (q == me) continue;
                size_t end = 0;
                for (const DirectSpec &d : direct_specs(seed, sh, me, q, &end)) sent += d.bytes;
            }
            CHECK(be->stats().calls == 1 && be->stats().bytes_sent == sent, c.label, ": stats ", be->stats().calls,
                  " calls, ", be->stats().bytes_sent, " bytes; expected 1, ", sent);
            // A piece outside the sender's buffers fails every member, naming it.
            auto bad_send = [&](int peer, std::vector<Backend::Piece> &pieces) {
                send_plan(peer, pieces);
                if (test_rank == test_size - 1) pieces.push_back({0, in[0].size(), nullptr, 1});
            };
            EXPECT_ERROR(be->alltoall_pieces(exposed, bad_send, recv_plan), DSM_ERR_INVALID_ARGUMENT, "outside");
        }
    });
}

// The shm backend's between-node algorithms, each forced
// (DSM_COMM_NET_ALGO, read at creation) with small chunks (DSM_COMM_NET_CHUNK
// = 4096 bytes, so that most blocks travel in several messages and no count
// divides evenly), on every simulated node layout: every dtype and op, odd
// and uneven counts, empty members, every buffer placement. The ring and
// halving/doubling paths for 2 nodes (the two-node exchange), 3 nodes (rhd
// folds onto 2), 4 and 8 nodes (one rank each), and uneven nodes. Then auto,
// and the algorithm each call ran.
void test_net_algorithms(void **state) {
    (void)state;
    guarded([] {
        const auto ref = dsm::comm::create_backend(MPI_COMM_WORLD, Kind::MPI);
        setenv("DSM_COMM_NET_CHUNK", "4096", 1);
        for (const char *algo : {"ring", "rhd", "mpi"}) {
            setenv("DSM_COMM_NET_ALGO", algo, 1);
            for (const Config &c : {kConfigs[2], kConfigs[3], kConfigs[4], kConfigs[5]}) {
                const auto be = make(c);
                const auto &shm = static_cast<const dsm::comm::ShmBackend &>(*be);
                CHECK(std::string(dsm::comm::net_algo_label(shm.net_algo())) == algo && shm.net_chunk() == 4096,
                      c.label, ": DSM_COMM_NET_ALGO=", algo, " gave ", dsm::comm::net_algo_label(shm.net_algo()),
                      " and chunk ", shm.net_chunk());
                const std::string label = dsm::cat(c.label, " net ", algo);
                allreduce_suite(*be, *ref, label.c_str());
                if (shm.nodes() > 1)
                    CHECK(std::string(dsm::comm::net_algo_label(shm.last_net_algo())) == algo, label,
                          ": the allreduce ran ", dsm::comm::net_algo_label(shm.last_net_algo()));
                reduce_scatter_suite(*be, *ref, label.c_str());
                allgather_suite(*be, label.c_str());
            }
        }
        // auto: two nodes exchange the whole lane for an allreduce and run
        // the ring otherwise; more nodes halve and double small blocks when
        // they are a power of two, else ring.
        unsetenv("DSM_COMM_NET_ALGO");
        unsetenv("DSM_COMM_NET_CHUNK");
        using dsm::comm::NetAlgo;
        using dsm::comm::net_resolve;
        CHECK(net_resolve(NetAlgo::AUTO, 2, 1 << 20, true) == NetAlgo::RHD &&
                  net_resolve(NetAlgo::AUTO, 2, 64, false) == NetAlgo::RING &&
                  net_resolve(NetAlgo::AUTO, 4, 4 * 1000, false) == NetAlgo::RHD &&
                  net_resolve(NetAlgo::AUTO, 4, size_t(64) << 20, true) == NetAlgo::RING &&
                  net_resolve(NetAlgo::AUTO, 3, 64, true) == NetAlgo::RING &&
                  net_resolve(NetAlgo::RING, 2, 64, true) == NetAlgo::RING,
              "net_resolve: unexpected choices");
        const auto be = make(kConfigs[5]); // a node per rank
        const auto &shm = static_cast<const dsm::comm::ShmBackend &>(*be);
        CHECK(shm.net_algo() == NetAlgo::AUTO && shm.net_chunk() == 61440, "defaults: ",
              dsm::comm::net_algo_label(shm.net_algo()), ", chunk ", shm.net_chunk());
        std::vector<float> x(1000, 1.0f);
        be->allreduce(x.data(), x.data(), x.size(), DSM_FLOAT32, Op::SUM);
        const NetAlgo want = test_size == 1 ? NetAlgo::AUTO : net_resolve(NetAlgo::AUTO, test_size, 4000, true);
        CHECK(shm.last_net_algo() == want, "auto ran ", dsm::comm::net_algo_label(shm.last_net_algo()),
              ", expected ", dsm::comm::net_algo_label(want));
        CHECK(x[999] == static_cast<float>(test_size), "auto allreduce of ones gives ", x[999]);
    });
}

// overlap_comm's progress thread runs the collectives (comm::Pipeline,
// THREAD mode; this program runs at MPI_THREAD_SERIALIZED, and the caller
// makes no MPI call while a task runs) on simulated nodes, through the
// between-node stage: the results have the bits of the same calls made
// inline, whether the caller computes for a while or waits at once.
void test_progress_thread(void **state) {
    (void)state;
    guarded([] {
        using dsm::comm::Pipeline;
        setenv("DSM_COMM_NET_CHUNK", "4096", 1);
        const size_t n = 100003, np = static_cast<size_t>(test_size);
        std::vector<float> x(n), ar0(n), ar1(n), rs0(n / np + n % np), rs1(n / np + n % np), ag0(n * np), ag1(n * np);
        for (size_t i = 0; i < n; ++i) x[i] = 0.001f * static_cast<float>((static_cast<size_t>(test_rank) * 7919u + i * 31u) % 1000u) - 0.5f;
        std::vector<size_t> counts(np, n / np);
        counts.back() += n % np;
        for (const Config &c : {kConfigs[2], kConfigs[5]}) {
            const auto be = make(c);
            auto all = [&](std::vector<float> &ar, std::vector<float> &rs, std::vector<float> &ag) {
                be->allreduce(x.data(), ar.data(), n, DSM_FLOAT32, Op::SUM);
                be->reduce_scatterv(x.data(), rs.data(), counts, DSM_FLOAT32, Op::SUM);
                be->allgather(x.data(), ag.data(), n, DSM_FLOAT32);
            };
            all(ar0, rs0, ag0);
            for (int waited = 0; waited < 2; ++waited) {
                std::fill(ar1.begin(), ar1.end(), 0.0f);
                std::fill(rs1.begin(), rs1.end(), 0.0f);
                std::fill(ag1.begin(), ag1.end(), 0.0f);
                Pipeline pipe(Pipeline::Mode::THREAD);
                const Pipeline::Ticket t = pipe.submit([&] { all(ar1, rs1, ag1); });
                if (!waited) { // the caller computes for a while (no MPI call) before it waits
                    volatile double acc = 0;
                    const double until = MPI_Wtime() + 0.02;
                    while (MPI_Wtime() < until) acc = acc + 1.0;
                }
                pipe.wait(t);
                const size_t mine = counts[static_cast<size_t>(test_rank)];
                CHECK(std::memcmp(ar0.data(), ar1.data(), n * sizeof(float)) == 0 &&
                          std::memcmp(rs0.data(), rs1.data(), mine * sizeof(float)) == 0 &&
                          std::memcmp(ag0.data(), ag1.data(), n * np * sizeof(float)) == 0,
                      c.label, waited ? " (waited for at once)" : " (the caller computing)",
                      ": the collectives on the progress thread differ from the same calls inline");
            }
        }
        unsetenv("DSM_COMM_NET_CHUNK");
    });
}

// Malformed parameters of the between-node stage fail the backend's
// creation on every rank, naming the variable and the value; a value set on
// one rank only fails every rank too.
void test_net_parameters(void **state) {
    (void)state;
    guarded([] {
        auto create = [] { return dsm::comm::create_backend(MPI_COMM_WORLD, Kind::SHM, alone(test_rank)); };
        setenv("DSM_COMM_NET_ALGO", "tree", 1);
        EXPECT_ERROR(create(), DSM_ERR_INVALID_ARGUMENT, "DSM_COMM_NET_ALGO=\"tree\"");
        setenv("DSM_COMM_NET_ALGO", "RING", 1); // case-insensitive
        {
            const auto be = create();
            CHECK(static_cast<const dsm::comm::ShmBackend &>(*be).net_algo() == dsm::comm::NetAlgo::RING,
                  "DSM_COMM_NET_ALGO=RING is not the ring");
        }
        unsetenv("DSM_COMM_NET_ALGO");
        for (const char *bad : {"abc", "-4096", "100", "4095", "2G", "64KB", "2048M", "99999999999999999999"}) {
            setenv("DSM_COMM_NET_CHUNK", bad, 1);
            EXPECT_ERROR(create(), DSM_ERR_INVALID_ARGUMENT, dsm::cat("DSM_COMM_NET_CHUNK=\"", bad, "\"").c_str());
        }
        for (const auto &good : {std::make_pair("4096", size_t(4096)), std::make_pair("64k", size_t(65536)),
                                 std::make_pair("1M", size_t(1) << 20), std::make_pair("1024M", size_t(1) << 30)}) {
            setenv("DSM_COMM_NET_CHUNK", good.first, 1);
            const auto be = create();
            CHECK(static_cast<const dsm::comm::ShmBackend &>(*be).net_chunk() == good.second,
                  "DSM_COMM_NET_CHUNK=", good.first, " gave ",
                  static_cast<const dsm::comm::ShmBackend &>(*be).net_chunk());
        }
        unsetenv("DSM_COMM_NET_CHUNK");
        if (test_size > 1) {
            if (test_rank == test_size - 1) setenv("DSM_COMM_NET_ALGO", "butterfly", 1);
            EXPECT_ERROR(create(), DSM_ERR_INVALID_ARGUMENT, "\"butterfly\"");
            unsetenv("DSM_COMM_NET_ALGO");
        }
    });
}

// Beyond the MPI count limit every collective is chunked: lower the limit to
// a few elements and run the MPI paths (the mpi backend, and the shm
// backend's inter-node lanes).
void test_chunked_beyond_count_limit(void **state) {
    (void)state;
    guarded([] {
        const auto ref = dsm::comm::create_backend(MPI_COMM_WORLD, Kind::MPI);
        dsm::comm::detail::set_mpi_count_limit(5);
        for (const Config &c : {kConfigs[0], kConfigs[2], kConfigs[4], kConfigs[5]}) {
            const auto be = make(c);
            uint64_t seed = 9000;
            for (dsm_dtype_t t : {DSM_FLOAT32, DSM_FLOAT16})
                for (Place pl : {Place::HEAP, Place::HEAP_INPLACE, Place::SHARED_INPLACE}) {
                    run_allreduce(*be, c.label, pl, t, Op::SUM, 23, Mode::EXACT, ++seed);
                    for (const auto &counts : count_patterns()) {
                        run_reduce_scatterv(*be, c.label, pl, t, Op::SUM, counts, Mode::EXACT, ++seed, false);
                        run_allgatherv(*be, c.label, pl, t, counts, ++seed, false);
                    }
                }
            alltoallv_and_bcast(*be, c.label);
            ++seed;
            run_packed(*be, dsm::cat(c.label, " alltoall_packed chunked"), seed,
                       [&](size_t p, size_t q) { return packed_bytes(seed, p, q, 40); }, off_node_of(*be, c));
        }
        dsm::comm::detail::set_mpi_count_limit(0);
    });
}

void test_choice_and_stats(void **state) {
    (void)state;
    guarded([] {
        CHECK(dsm::comm::kind_from_name("auto") == Kind::AUTO, "auto");
        CHECK(dsm::comm::kind_from_name("mpi") == Kind::MPI, "mpi");
        CHECK(dsm::comm::kind_from_name("shm") == Kind::SHM, "shm");
        // AUTO: the shm backend for every group of two or more ranks (one
        // node or several, one rank per node too), plain MPI for one rank.
        const std::string host_auto = test_size > 1 ? "shm" : "mpi";
        const auto one_host = dsm::comm::create_backend(MPI_COMM_WORLD, Kind::AUTO);
        CHECK(one_host->name() == host_auto, "auto on ", test_nnodes, " nodes of up to ", test_max_node_size(),
              " ranks is ", one_host->name());
        const auto spread = dsm::comm::create_backend(MPI_COMM_WORLD, Kind::AUTO, test_rank);
        CHECK(spread->name() == host_auto, "auto with a node per rank is ", spread->name());
        CHECK(one_host->size() == test_size && one_host->rank() == test_rank, "size/rank");
        int cmp = MPI_UNEQUAL;
        MPI_Comm_compare(one_host->comm(), MPI_COMM_WORLD, &cmp);
        CHECK(cmp == MPI_CONGRUENT, "comm() is a duplicate of the group's communicator");

        // The real nodes (one on one host); colors split them further.
        const auto shm = dsm::comm::create_backend(MPI_COMM_WORLD, Kind::SHM, -1);
        const auto *s = dynamic_cast<const dsm::comm::ShmBackend *>(shm.get());
        CHECK(s != nullptr && s->nodes() == test_nnodes && s->local_size() == test_node_size(test_rank), "the ",
              test_nnodes, " real nodes: ", s ? s->nodes() : -1, " nodes, ", s ? s->local_size() : -1, " ranks here");
        const auto nodes = dsm::comm::create_backend(MPI_COMM_WORLD, Kind::SHM, test_rank / 2);
        s = dynamic_cast<const dsm::comm::ShmBackend *>(nodes.get());
        CHECK(s != nullptr && s->nodes() == nodes_seen(pairs), "nodes of two ranks: ", s ? s->nodes() : -1,
              ", expected ", nodes_seen(pairs));
        if (test_nnodes == 1) CHECK(nodes_seen(pairs) == (test_size + 1) / 2, "nodes of two ranks on one host");

        // alloc_shared: zeroed, 64-byte aligned, freed collectively.
        for (Backend *be : {one_host.get(), shm.get(), spread.get()}) {
            void *p = be->alloc_shared(1000);
            void *q = be->alloc_shared(0);
            CHECK(p != nullptr && q != nullptr && p != q, be->name(), " alloc_shared");
            CHECK(reinterpret_cast<uintptr_t>(p) % 64 == 0, be->name(), " alignment");
            const unsigned char *c = static_cast<const unsigned char *>(p);
            CHECK(std::all_of(c, c + 1000, [](unsigned char x) { return x == 0; }), be->name(), " not zeroed");
            be->free_shared(q);
            be->free_shared(p);
            be->free_shared(nullptr);
            int local = 0;
            EXPECT_ERROR(be->free_shared(&local), DSM_ERR_INVALID_ARGUMENT, "not returned by alloc_shared");
        }

        // Stats: the ring volume for both; off the node, all of it for mpi
        // (which does not know the nodes); for shm, the lanes between nodes
        // carry each node's share twice (reduce-scatter, then allgather): a
        // node's ranks together send off the node twice the slices of the
        // ranks on other nodes; nothing on one node.
        const auto mpi = dsm::comm::create_backend(MPI_COMM_WORLD, Kind::MPI);
        std::vector<float> x(1000, 1.0f);
        mpi->allreduce(x.data(), x.data(), x.size(), DSM_FLOAT32, Op::SUM);
        shm->reset_stats();
        shm->allreduce(x.data(), x.data(), x.size(), DSM_FLOAT32, Op::SUM);
        const uint64_t ring = static_cast<uint64_t>(2.0L * 4000 * (test_size - 1) / test_size);
        CHECK(mpi->stats().calls == 1 && mpi->stats().bytes_sent == ring && mpi->stats().bytes_off_node == ring,
              "mpi stats ", mpi->stats().bytes_sent, " ", mpi->stats().bytes_off_node, ", expected ", ring);
        uint64_t elsewhere = 0; // the elements of the slices of ranks on other nodes
        for (int r = 0; r < test_size; ++r)
            if (test_node_of[r] != test_node_of[test_rank])
                elsewhere += 1000 / test_size + (r < 1000 % test_size ? 1 : 0);
        unsigned long long mine = shm->stats().bytes_off_node, node_off = 0;
        MPI_Comm node;
        MPI_Comm_split(MPI_COMM_WORLD, test_node_of[test_rank], test_rank, &node);
        MPI_Allreduce(&mine, &node_off, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, node);
        MPI_Comm_free(&node);
        CHECK(shm->stats().calls == 1 && shm->stats().bytes_sent == ring && node_off == 2 * 4 * elsewhere,
              "shm stats ", shm->stats().bytes_sent, " sent, ", node_off, " off this node; expected ", ring, " and ",
              2 * 4 * elsewhere);
        CHECK(x[0] == static_cast<float>(test_size) * test_size, "two allreduces of ones give ", x[0]);
    });
}

// ---------------------------------------------------------------- factory, capabilities, queues

using dsm::comm::Capabilities;
using dsm::comm::Queue;
using dsm::comm::Space;

// Whether every rank sees a CUDA device (the same answer on all).
bool every_rank_has_a_gpu() {
    int mine = dsm::cuda::device_count().count > 0 ? 1 : 0, all = 0;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return all == 1;
}

// Whether no node has more ranks than GPUs (NCCL's one GPU per rank).
bool every_rank_has_its_own_gpu() {
    int mine = dsm::cuda::device_count().count >= test_node_size(test_rank) ? 1 : 0, all = 0;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return all == 1 && every_rank_has_a_gpu();
}

// DSM_COMM_BACKEND for this rank; NULL unsets it.
void set_backend_env(const char *v) {
    if (v)
        setenv("DSM_COMM_BACKEND", v, 1);
    else
        unsetenv("DSM_COMM_BACKEND");
}

std::string made(Space space, int color = -1) { return dsm::comm::make_backend(MPI_COMM_WORLD, space, color)->name(); }

void test_factory(void **state) {
    (void)state;
    guarded([] {
        const bool gpus = every_rank_has_a_gpu();
        const bool nccl = dsm::comm::nccl_built() && every_rank_has_its_own_gpu();
        const std::string host_auto = test_size > 1 ? "shm" : "mpi";
        // Unset, empty and "auto" (any case): the choice create_backend(AUTO) makes for host memory.
        for (const char *v : {static_cast<const char *>(nullptr), "", "auto", "AUTO"}) {
            set_backend_env(v);
            const std::string label = v ? dsm::cat("\"", v, "\"") : std::string("unset");
            CHECK(made(Space::HOST) == host_auto, label, ": host memory gives ", made(Space::HOST));
            CHECK(made(Space::HOST, test_rank) == host_auto, label, ": a node per rank gives ",
                  made(Space::HOST, test_rank));
            CHECK(made(Space::DEVICE) == (nccl ? "nccl" : "mpi"), label, ": device memory gives ",
                  made(Space::DEVICE));
        }
        set_backend_env("mpi");
        CHECK(made(Space::HOST) == "mpi", "mpi for host memory");
        CHECK(made(Space::DEVICE) == "mpi", "mpi for device memory (staged)");
        set_backend_env("Shm");
        CHECK(made(Space::HOST) == "shm", "shm for host memory");
        CHECK(made(Space::HOST, test_rank) == "shm", "shm with a node per rank");
        EXPECT_ERROR(made(Space::DEVICE), DSM_ERR_NOT_SUPPORTED, "does not take device memory");
        set_backend_env("nccl");
        EXPECT_ERROR(made(Space::HOST), DSM_ERR_NOT_SUPPORTED, "does not take host memory");
        if (nccl) {
            CHECK(made(Space::DEVICE) == "nccl", "nccl for device memory");
        } else if (!dsm::comm::nccl_built()) {
            EXPECT_ERROR(made(Space::DEVICE), DSM_ERR_NOT_SUPPORTED, "the nccl backend is not built");
        } else {
            // Refused cleanly, on every rank, before NCCL is touched.
            EXPECT_ERROR(made(Space::DEVICE), DSM_ERR_NOT_SUPPORTED,
                         gpus ? "share the CUDA device" : "needs a CUDA device on every rank");
        }
        // Bad values: DSM_ERR_INVALID_ARGUMENT naming the variable, on every rank.
        for (const char *v : {"bogus", "gpu", "mpi,shm"}) {
            set_backend_env(v);
            EXPECT_ERROR(made(Space::HOST), DSM_ERR_INVALID_ARGUMENT, "DSM_COMM_BACKEND");
            EXPECT_ERROR(made(Space::DEVICE), DSM_ERR_INVALID_ARGUMENT, dsm::cat("\"", v, "\""));
        }
        if (test_size > 1) {
            // A bad value on one rank only: every rank fails alike, none hangs.
            set_backend_env(test_rank == test_size - 1 ? "bogus" : "mpi");
            EXPECT_ERROR(made(Space::HOST), DSM_ERR_INVALID_ARGUMENT, "DSM_COMM_BACKEND");
            // Valid values that differ: a mismatch on every rank.
            set_backend_env(test_rank == 0 ? "mpi" : "shm");
            EXPECT_ERROR(made(Space::HOST), DSM_ERR_MISMATCH, "DSM_COMM_BACKEND");
        }
        set_backend_env(nullptr);
        EXPECT_ERROR(dsm::comm::make_backend(MPI_COMM_NULL, Space::HOST), DSM_ERR_INVALID_ARGUMENT, "MPI_COMM_NULL");
        EXPECT_ERROR(dsm::comm::make_backend(MPI_COMM_WORLD, static_cast<Space>(5)), DSM_ERR_INVALID_ARGUMENT,
                     "space 5");
    });
    set_backend_env(nullptr);
}

bool same_caps(const Capabilities &a, const Capabilities &b) {
    return a.host_memory == b.host_memory && a.device_memory == b.device_memory &&
           a.stream_ordered == b.stream_ordered && a.multi_node == b.multi_node;
}

void test_capabilities(void **state) {
    (void)state;
    guarded([] {
        const Capabilities m = dsm::comm::capabilities_of(Kind::MPI), s = dsm::comm::capabilities_of(Kind::SHM),
                           n = dsm::comm::capabilities_of(Kind::NCCL), a = dsm::comm::capabilities_of(Kind::AUTO);
        CHECK(m.host_memory && m.device_memory && !m.stream_ordered && m.multi_node, "mpi capabilities");
        CHECK(s.host_memory && !s.device_memory && !s.stream_ordered && s.multi_node, "shm capabilities");
        CHECK(!n.host_memory && n.device_memory && n.stream_ordered && n.multi_node, "nccl capabilities");
        CHECK(!a.host_memory && !a.device_memory && !a.stream_ordered && !a.multi_node, "auto has none");
        CHECK(m.accepts(Space::HOST) && m.accepts(Space::DEVICE), "mpi accepts both spaces");
        CHECK(s.accepts(Space::HOST) && !s.accepts(Space::DEVICE), "shm accepts host memory only");
        CHECK(!n.accepts(Space::HOST) && n.accepts(Space::DEVICE), "nccl accepts device memory only");
        for (Kind k : {Kind::AUTO, Kind::MPI, Kind::SHM, Kind::NCCL})
            CHECK(dsm::comm::kind_from_name(dsm::comm::kind_name(k)) == k, "kind_name round trip ",
                  dsm::comm::kind_name(k));
        // A backend reports its kind's capabilities.
        const auto mpi = dsm::comm::create_backend(MPI_COMM_WORLD, Kind::MPI);
        const auto shm = dsm::comm::create_backend(MPI_COMM_WORLD, Kind::SHM, test_rank / 2);
        CHECK(same_caps(mpi->capabilities(), m), "mpi backend capabilities");
        CHECK(same_caps(shm->capabilities(), s), "shm backend capabilities");
    });
}

void test_queue(void **state) {
    (void)state;
    guarded([] {
        static_assert(Queue().is_host() && Queue::host().handle() == nullptr, "the default queue is the host's");
        // cudaStreamPerThread: a valid stream handle wherever CUDA runs.
        void *const per_thread = reinterpret_cast<void *>(uintptr_t(0x2));
        const Queue dev(per_thread);
        CHECK(!dev.is_host() && dev.handle() == per_thread && dev != Queue() && dev == Queue(per_thread),
              "a device queue");
        // Host backends accept a device queue (waiting for its earlier work)
        // and complete before returning: the same results as on the host
        // queue; synchronize() returns.
        const size_t n = static_cast<size_t>(test_size);
        for (const Config &c : {kConfigs[0], kConfigs[1], kConfigs[2]}) {
            const auto be = make(c);
            CHECK(!be->capabilities().stream_ordered, c.label, " is not stream-ordered");
            std::vector<float> a(8 * n), b(8 * n), ra(8 * n), rb(8 * n);
            for (size_t i = 0; i < a.size(); ++i)
                a[i] = b[i] = static_cast<float>(test_rank * 100 + static_cast<int>(i));
            be->allreduce(a.data(), ra.data(), a.size(), DSM_FLOAT32, Op::SUM);
            be->allreduce(b.data(), rb.data(), b.size(), DSM_FLOAT32, Op::SUM, dev);
            CHECK(ra == rb, c.label, " allreduce on a queue");
            be->reduce_scatter(a.data(), ra.data(), 8, DSM_FLOAT32, Op::MAX);
            be->reduce_scatter(b.data(), rb.data(), 8, DSM_FLOAT32, Op::MAX, dev);
            CHECK(std::equal(ra.begin(), ra.begin() + 8, rb.begin()), c.label, " reduce_scatter on a queue");
            be->allgather(a.data(), ra.data(), 8, DSM_FLOAT32);
            be->allgather(b.data(), rb.data(), 8, DSM_FLOAT32, dev);
            CHECK(ra == rb, c.label, " allgather on a queue");
            std::vector<size_t> counts(n, 8), displs(n);
            for (size_t q = 0; q < n; ++q) displs[q] = 8 * q;
            be->alltoallv(a.data(), counts, displs, ra.data(), counts, displs, DSM_FLOAT32);
            be->alltoallv(b.data(), counts, displs, rb.data(), counts, displs, DSM_FLOAT32, dev);
            CHECK(ra == rb, c.label, " alltoallv on a queue");
            std::vector<float> x(4, static_cast<float>(test_rank));
            be->bcast(x.data(), x.size(), DSM_FLOAT32, test_size - 1, dev);
            CHECK(x[3] == static_cast<float>(test_size - 1), c.label, " bcast on a queue");
            std::vector<size_t> bytes(n, 4);
            std::vector<int> got(n, -1);
            be->alltoall_packed(
                bytes, bytes, [&](int, void *buf) { std::memcpy(buf, &test_rank, 4); },
                [&](int peer, const void *buf) { std::memcpy(&got[static_cast<size_t>(peer)], buf, 4); }, dev);
            for (size_t q = 0; q < n; ++q) CHECK(got[q] == static_cast<int>(q), c.label, " alltoall_packed on a queue");
            be->barrier(dev);
            be->synchronize(dev);
            be->synchronize();
        }
    });
}

// NCCL communicators per mesh dimension, split from one: needs a GPU per rank.
void test_nccl_split(void **state) {
    (void)state;
    if (!dsm::comm::nccl_built()) {
        if (test_rank == 0) print_message("skipped: libdsm was built without CUDA and NCCL\n");
        skip();
    }
    if (!every_rank_has_its_own_gpu()) {
        if (test_rank == 0) print_message("skipped: a rank has no CUDA device of its own\n");
        skip();
    }
    guarded([] {
        auto world = dsm::comm::create_backend(MPI_COMM_WORLD, Kind::NCCL);
        auto *nccl = dynamic_cast<dsm::comm::NcclBackend *>(world.get());
        CHECK(nccl != nullptr, "the nccl backend");
        if (nccl == nullptr) return;
        // A (rows, 2) mesh: the row groups (consecutive pairs) and the column groups.
        const int cols = test_size > 1 ? 2 : 1;
        auto row = nccl->split(test_rank / cols, test_rank % cols);
        auto col = nccl->split(test_rank % cols, test_rank / cols);
        auto none = nccl->split(test_rank == 0 ? 0 : -1, 0);
        CHECK(row && row->size() == cols && row->rank() == test_rank % cols, "row group");
        CHECK(col && col->size() == test_size / cols + (test_rank % cols < test_size % cols ? 1 : 0) &&
                  col->rank() == test_rank / cols,
              "column group");
        CHECK((test_rank == 0) == (none != nullptr), "color < 0 joins no group");
        CHECK(row && row->capabilities().stream_ordered, "a split backend is stream-ordered");
    });
}

// Bad arguments fail locally (on every rank alike) with a message naming the value.
void test_errors(void **state) {
    (void)state;
    guarded([] {
        EXPECT_ERROR(dsm::comm::kind_from_name("bogus"), DSM_ERR_INVALID_ARGUMENT, "\"bogus\"");
        EXPECT_ERROR(dsm::comm::kind_from_name(""), DSM_ERR_INVALID_ARGUMENT, "\"\"");
        EXPECT_ERROR(dsm::comm::create_backend(MPI_COMM_NULL, Kind::MPI), DSM_ERR_INVALID_ARGUMENT,
                     "MPI_COMM_NULL");
        EXPECT_ERROR(dsm::comm::create_backend(MPI_COMM_WORLD, static_cast<Kind>(7)), DSM_ERR_INVALID_ARGUMENT,
                     "kind 7");
        const auto bad_dtype = static_cast<dsm_dtype_t>(99);
        const size_t n = static_cast<size_t>(test_size);
        for (Kind k : {Kind::MPI, Kind::SHM}) {
            const auto be = dsm::comm::create_backend(MPI_COMM_WORLD, k, k == Kind::SHM ? test_rank / 2 : -1);
            std::vector<double> buf(4 * n + 8, 1.0);
            double *p = buf.data();
            std::vector<size_t> counts(n, 2);
            EXPECT_ERROR(be->allreduce(p, p, 4, bad_dtype, Op::SUM), DSM_ERR_INVALID_ARGUMENT, "99");
            EXPECT_ERROR(be->allreduce(p, p, 4, DSM_INT8, Op::SUM), DSM_ERR_INVALID_ARGUMENT, "int8");
            EXPECT_ERROR(be->allreduce(p, p, 4, DSM_INT32, Op::MAX), DSM_ERR_INVALID_ARGUMENT, "int32");
            EXPECT_ERROR(be->allreduce(p, p, 4, DSM_FLOAT32, static_cast<Op>(7)), DSM_ERR_INVALID_ARGUMENT, "op 7");
            EXPECT_ERROR(be->allreduce(nullptr, p, 4, DSM_FLOAT32, Op::SUM), DSM_ERR_NULL_POINTER, "send");
            EXPECT_ERROR(be->reduce_scatterv(p, p, counts, bad_dtype, Op::SUM), DSM_ERR_INVALID_ARGUMENT, "99");
            EXPECT_ERROR(be->reduce_scatterv(p, p, counts, DSM_UINT8, Op::MIN), DSM_ERR_INVALID_ARGUMENT, "uint8");
            EXPECT_ERROR(be->reduce_scatterv(p, p, std::vector<size_t>(n + 1, 1), DSM_FLOAT32, Op::SUM),
                         DSM_ERR_INVALID_ARGUMENT, dsm::cat("has ", n + 1, " entries"));
            EXPECT_ERROR(be->reduce_scatter(p, p, 1, DSM_INT64, Op::SUM), DSM_ERR_INVALID_ARGUMENT, "int64");
            EXPECT_ERROR(be->allgatherv(p, p + 2, counts, bad_dtype), DSM_ERR_INVALID_ARGUMENT, "99");
            EXPECT_ERROR(be->allgatherv(p, p, std::vector<size_t>(), DSM_FLOAT32), DSM_ERR_INVALID_ARGUMENT,
                         "has 0 entries");
            EXPECT_ERROR(be->allgather(p, nullptr, 1, DSM_FLOAT32), DSM_ERR_NULL_POINTER, "recv");
            EXPECT_ERROR(be->alltoallv(p, counts, counts, p, counts, std::vector<size_t>(n + 1, 0), DSM_FLOAT64),
                         DSM_ERR_INVALID_ARGUMENT, "recv_displs");
            const Backend::PackFn pack = [](int, void *) {};
            const Backend::UnpackFn unpack = [](int, const void *) {};
            EXPECT_ERROR(be->alltoall_packed(std::vector<size_t>(n + 1, 1), counts, pack, unpack),
                         DSM_ERR_INVALID_ARGUMENT, dsm::cat("send_bytes has ", n + 1, " entries and recv_bytes ", n));
            EXPECT_ERROR(be->alltoall_packed(counts, std::vector<size_t>(), pack, unpack), DSM_ERR_INVALID_ARGUMENT,
                         dsm::cat("recv_bytes 0, expected ", n));
            std::vector<size_t> self(n, 2);
            self[static_cast<size_t>(test_rank)] = 3;
            EXPECT_ERROR(be->alltoall_packed(counts, self, pack, unpack), DSM_ERR_INVALID_ARGUMENT,
                         "sends itself 2 bytes but expects 3");
            EXPECT_ERROR(be->alltoall_packed(counts, counts, nullptr, unpack), DSM_ERR_NULL_POINTER, "pack is empty");
            EXPECT_ERROR(be->alltoall_packed(counts, counts, pack, nullptr), DSM_ERR_NULL_POINTER,
                         "unpack is empty");
            EXPECT_ERROR(be->bcast(p, 1, DSM_FLOAT64, test_size), DSM_ERR_INVALID_ARGUMENT,
                         dsm::cat("root ", test_size));
            EXPECT_ERROR(be->bcast(p, 1, bad_dtype, 0), DSM_ERR_INVALID_ARGUMENT, "99");
            EXPECT_ERROR(be->allreduce(p, p, SIZE_MAX / 2, DSM_FLOAT32, Op::SUM), DSM_ERR_INVALID_ARGUMENT,
                         "overflows");
            // The backend is still usable after the errors.
            be->allreduce(p, p, 4, DSM_FLOAT64, Op::SUM);
            CHECK(p[0] == test_size, be->name(), " allreduce after errors gives ", p[0]);
        }
    });
}

} // namespace

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_choice_and_stats),
        cmocka_unit_test(test_factory),
        cmocka_unit_test(test_capabilities),
        cmocka_unit_test(test_queue),
        cmocka_unit_test(test_nccl_split),
        cmocka_unit_test(test_collectives),
        cmocka_unit_test(test_chunked_beyond_count_limit),
        cmocka_unit_test(test_alltoall_pieces),
        cmocka_unit_test(test_net_algorithms),
        cmocka_unit_test(test_net_parameters),
        cmocka_unit_test(test_progress_thread),
        cmocka_unit_test(test_alltoall_direct),
    };
    return RUN_MPI_TESTS("comm", tests);
}
