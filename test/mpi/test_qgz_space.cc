// qgZ's reduce-scatter on a space's memory (comm/qgz_device.hpp) against
// the host's (comm/qgz.hpp), on the simulated device: over the mpi and shm
// backends, on one node, two nodes (block and interleaved), 3+1 and one
// node per rank, fp32/fp16/bf16 blocks of uneven sizes (empty ones
// included), the two count the same bytes and give the same values up to
// the order of the fp32 additions (nearly all within a few ulps; here they
// have the same bits); the result is the sum of the ranks' blocks within
// the two int4 roundings.
// A bad number of node colors or a bad block size is refused.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "comm/backend.hpp"
#include "comm/qgz.hpp"
#include "comm/qgz_device.hpp"
#include "comm/quantize.hpp"
#include "core/half.hpp"
#include "core/error.hpp"
#include "device/space.hpp"

#include "mpi_test.h"
#include "mpi_test_cxx.h"

using dsm::comm::Backend;
using dsm::comm::Kind;
using dsm::comm::QuantBytes;

namespace {

int one(int) { return 0; }
int block_of_two(int r) { return r < (test_size + 1) / 2 ? 0 : 1; }
int interleaved(int r) { return r % 2; }
int three_one(int r) { return r == test_size - 1 ? 1 : 0; }
int alone(int r) { return r; }

struct Layout {
    const char *name;
    int (*color)(int);
};
const Layout kLayouts[] = {{"one node", one},       {"two nodes", block_of_two}, {"interleaved", interleaved},
                           {"3+1", three_one},      {"node per rank", alone}};

void run_case(Kind kind, const Layout &l, dsm_dtype_t dt, unsigned seed) {
    const auto group = dsm::comm::create_backend(MPI_COMM_WORLD, kind, l.color(test_rank));
    std::vector<int> nodes(static_cast<size_t>(test_size));
    for (int r = 0; r < test_size; ++r) nodes[static_cast<size_t>(r)] = l.color(r);
    const size_t block = 64, es = dt == DSM_FLOAT32 ? 4 : 2;
    std::mt19937 g(seed); // the same counts on every rank
    std::vector<size_t> counts(static_cast<size_t>(test_size));
    size_t total = 0;
    for (auto &c : counts) total += (c = g() % 4 == 0 ? 0 : g() % 300);
    std::mt19937 mine(seed * 131 + static_cast<unsigned>(test_rank));
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> x(total);
    std::vector<uint16_t> h(total);
    for (size_t i = 0; i < total; ++i) {
        x[i] = d(mine) * (1.0f + static_cast<float>(i % 7));
        h[i] = dt == DSM_FLOAT16 ? dsm::fp32_to_fp16(x[i]) : dsm::fp32_to_bf16(x[i]);
        if (dt != DSM_FLOAT32) x[i] = dt == DSM_FLOAT16 ? dsm::fp16_to_fp32(h[i]) : dsm::bf16_to_fp32(h[i]);
    }
    const void *send = dt == DSM_FLOAT32 ? static_cast<const void *>(x.data()) : h.data();
    const size_t n = counts[static_cast<size_t>(test_rank)];

    dsm::comm::QuantizedReduce host(group.get(), nodes, block, 4);
    std::vector<float> out_host(n + 1, -1.0f);
    QuantBytes bh;
    host.reduce_scatter(send, counts, dt, out_host.data(), &bh);

    const auto sim = dsm::device::make_sim();
    dsm::comm::SpaceQuantizedReduce dev(group.get(), nodes, block, 4, *sim);
    dsm::device::Buffer sb(*sim, total * es + 1), ob(*sim, (n + 1) * 4);
    sim->upload(sb.data(), send, total * es);
    QuantBytes bd;
    dev.reduce_scatter(sb.data(), counts, dt, static_cast<float *>(ob.data()), &bd);
    std::vector<float> out_dev(n + 1, -1.0f);
    sim->download(out_dev.data(), ob.data(), n * 4);

    const std::string what = dsm::cat(kind == Kind::MPI ? "mpi" : "shm", ", ", l.name, ", dtype ", static_cast<int>(dt));
    // The same plan and kernels: the same values, up to the order in which
    // a backend hands the peers' blocks to the fp32 sums (a backend may
    // unpack in its own order). So: nearly every value within a few ulps of
    // the host's (an ulp of difference in a node's sum may move a value of
    // the second quantization by one step: rare), none beyond two steps.
    size_t off_ulps = 0;
    float step = 0;
    for (size_t i = 0; i < n; ++i) step = std::max(step, std::fabs(out_host[i]));
    step = step / 7.0f;
    for (size_t i = 0; i < n; ++i) {
        const float dh = std::fabs(out_dev[i] - out_host[i]);
        if (dh > 16.0f * 1.2e-7f * (std::fabs(out_host[i]) + step)) ++off_ulps;
        if (!(dh <= 2.0f * step + 1e-30f)) {
            CHECK(false, what, ": value ", i, ": device ", out_dev[i], ", host ", out_host[i]);
            break;
        }
    }
    CHECK(off_ulps <= n / 100 + 1, what, ": ", off_ulps, " of ", n, " values differ from the host's by more than a few ulps");
    CHECK(bh.sent_on == bd.sent_on && bh.sent_off == bd.sent_off && bh.full_on == bd.full_on &&
              bh.full_off == bd.full_off,
          what, ": bytes host ", bh.sent_on, "/", bh.sent_off, "/", bh.full_on, "/", bh.full_off, ", device ",
          bd.sent_on, "/", bd.sent_off, "/", bd.full_on, "/", bd.full_off);
    // Against the exact sum, block by block (blocks of 64 values from the
    // start of each owner's segment). An int4 rounding of a block whose
    // largest magnitude is a moves a value by at most a / 14 (half the step
    // a / 7) plus a few ulps of a: eb(a). Step 1: every member but the
    // collector of this owner on its node (whose block is added at full
    // precision) rounds its block once; step 2: the collector of every other
    // node rounds that node's sum (its largest magnitude at most the exact
    // sum's plus the node's step-1 errors); this owner's own node is not
    // rounded again. Plus the fp32 additions. So one member's contribution
    // dropped (of the order of its block's largest value) fails, at any size.
    std::vector<float> all(total * static_cast<size_t>(test_size));
    MPI_Allgather(x.data(), static_cast<int>(total), MPI_FLOAT, all.data(), static_cast<int>(total), MPI_FLOAT,
                  MPI_COMM_WORLD);
    size_t off = 0;
    for (int r = 0; r < test_rank; ++r) off += counts[static_cast<size_t>(r)];
    auto eb = [](double a) { return a / (2.0 * 7.0) + 8.0 * 1.1920929e-7 * a; };
    // The nodes in first-appearance order, their members ascending; the
    // collector of this owner on node v: member (owner's index on its own
    // node) mod (members of v).
    std::vector<int> colors;
    std::vector<std::vector<int>> members;
    for (int r = 0; r < test_size; ++r) {
        const int c = nodes[static_cast<size_t>(r)];
        const size_t v = static_cast<size_t>(std::find(colors.begin(), colors.end(), c) - colors.begin());
        if (v == colors.size()) {
            colors.push_back(c);
            members.emplace_back();
        }
        members[v].push_back(r);
    }
    size_t my_node = 0, my_local = 0;
    for (size_t v = 0; v < members.size(); ++v)
        for (size_t k = 0; k < members[v].size(); ++k)
            if (members[v][k] == test_rank) my_node = v, my_local = k;
    auto at = [&](int r, size_t i) { return static_cast<double>(all[static_cast<size_t>(r) * total + off + i]); };
    for (size_t b0 = 0; b0 < n; b0 += block) {
        const size_t m = std::min(block, n - b0);
        double bound = 0;
        for (size_t v = 0; v < members.size(); ++v) {
            const int collector = members[v][my_local % members[v].size()];
            double step1 = 0, sum_max = 0;
            for (int r : members[v]) {
                double a = 0;
                for (size_t i = b0; i < b0 + m; ++i) a = std::max(a, std::fabs(at(r, i)));
                if (r != collector) step1 += eb(a);
            }
            for (size_t i = b0; i < b0 + m; ++i) {
                double sv = 0;
                for (int r : members[v]) sv += at(r, i);
                sum_max = std::max(sum_max, std::fabs(sv));
            }
            bound += step1 + (v != my_node ? eb(sum_max + step1) : 0.0);
        }
        for (size_t i = b0; i < b0 + m; ++i) {
            double exact = 0, sabs = 0;
            for (int r = 0; r < test_size; ++r) exact += at(r, i), sabs += std::fabs(at(r, i));
            // The fp32 additions (a few per member): a few ulps of each term and of the bound.
            const double tol = bound * (1 + 1e-6) + 4.0 * test_size * 1.1920929e-7 * sabs + 1e-30;
            if (!(std::fabs(out_dev[i] - exact) <= tol) || !(std::fabs(out_host[i] - exact) <= tol)) {
                CHECK(false, what, ": value ", i, ": device ", out_dev[i], ", host ", out_host[i], ", exact sum ", exact,
                      ", bound ", tol, " (block ", b0 / block, ")");
                return;
            }
        }
    }
}

} // namespace

static void test_same_as_host(void **) {
    guarded([] {
        unsigned seed = 1;
        for (Kind kind : {Kind::MPI, Kind::SHM})
            for (const Layout &l : kLayouts)
                for (dsm_dtype_t dt : {DSM_FLOAT32, DSM_FLOAT16, DSM_BFLOAT16}) run_case(kind, l, dt, seed++);
    });
}

static void test_bad_values(void **) {
    guarded([] {
        const auto group = dsm::comm::create_backend(MPI_COMM_WORLD, Kind::MPI);
        const auto sim = dsm::device::make_sim();
        std::vector<int> nodes(static_cast<size_t>(test_size) + 1, 0);
        EXPECT_ERROR(dsm::comm::SpaceQuantizedReduce(group.get(), nodes, 64, 4, *sim), DSM_ERR_INVALID_ARGUMENT,
                     dsm::cat(test_size + 1, " node colors for a group of ", test_size));
        nodes.pop_back();
        EXPECT_ERROR(dsm::comm::SpaceQuantizedReduce(group.get(), nodes, 24, 4, *sim), DSM_ERR_INVALID_ARGUMENT,
                     "block size 24");
        EXPECT_ERROR(dsm::comm::SpaceQuantizedReduce(group.get(), nodes, 64, 3, *sim), DSM_ERR_INVALID_ARGUMENT,
                     "3 bits");
        dsm::comm::SpaceQuantizedReduce ok(group.get(), nodes, 64, 4, *sim);
        std::vector<size_t> counts(static_cast<size_t>(test_size) + 1, 1);
        float f[4] = {0, 0, 0, 0};
        EXPECT_ERROR(ok.reduce_scatter(f, counts, DSM_FLOAT32, f, nullptr), DSM_ERR_INVALID_ARGUMENT,
                     "counts for a group of");
        counts.pop_back();
        EXPECT_ERROR(ok.reduce_scatter(f, counts, DSM_INT32, f, nullptr), DSM_ERR_INVALID_ARGUMENT, "dtype");
    });
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_as_host),
        cmocka_unit_test(test_bad_values),
    };
    return RUN_MPI_TESTS("qgz_space", tests);
}
