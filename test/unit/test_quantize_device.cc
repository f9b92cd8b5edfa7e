// ZeRO++ quantization on device memory, what the CPU can check of it:
// - the plan of qgZ's hierarchical reduce-scatter (comm/qgz_plan.hpp), the
//   host's and the device's: on every layout of nodes (equal, unequal, one
//   node, one member per node, members of a node not consecutive) each
//   member's contribution reaches its owner exactly once, what a member
//   sends a peer is what the peer expects to receive, both exchanges run on
//   every member alike, and the bytes are counted as the host counts them;
// - the quantization kernels of a space (comm/quantize_space.hpp): on the
//   host and on the simulated device they give quantize.hpp's bits (the
//   simulated device only once its queue ran), 16-bit values included, and
//   bad bits, blocks and dtypes are refused before anything is enqueued;
// - on a CUDA device (skipped without one): the kernels of the CUDA space
//   against the host's, bit for bit, fp32, fp16 and bf16, int8 and int4,
//   and each round trip within its block's bound.
#include "dsm_config.h"

#include "comm/qgz_plan.hpp"
#include "comm/quantize.hpp"
#include "comm/quantize_space.hpp"
#include "device/space.hpp"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/half.hpp"

#if DSM_HAVE_CUDA_KERNELS
#include <cuda_runtime.h>
#endif

#include "quantize_test.h"

using namespace dsm;
using namespace dsm::comm;

namespace {

// The exchanges of every member's plan, run on symbols: member m's
// contribution to owner o is the bit 1 << m; every owner must end with all
// bits, each once (a sum of distinct powers of two).
void check_layout(const std::vector<int> &nodes, const std::vector<size_t> &counts, const char *what) {
    const QgzTopology topo(nodes);
    const int n = topo.size();
    const size_t N = static_cast<size_t>(n);
    std::vector<QgzPlan> plans;
    for (int m = 0; m < n; ++m) plans.push_back(plan_qgz(topo, m, counts, 2, 4, 64));
    for (int m = 0; m < n; ++m) {
        const QgzPlan &p = plans[static_cast<size_t>(m)];
        if (p.step1 != plans[0].step1 || p.step2 != plans[0].step2)
            fail_msg("%s: member %d runs the steps %d/%d, member 0 %d/%d", what, m, p.step1, p.step2,
                     plans[0].step1, plans[0].step2);
        for (int q = 0; q < n; ++q) {
            const QgzPlan &r = plans[static_cast<size_t>(q)];
            const bool same = topo.node_of(q) == topo.node_of(m);
            if (p.send1[static_cast<size_t>(q)] != r.recv1[static_cast<size_t>(m)])
                fail_msg("%s: step 1: member %d sends %zu bytes to %d, which expects %zu", what, m,
                         p.send1[static_cast<size_t>(q)], q, r.recv1[static_cast<size_t>(m)]);
            if (p.send2[static_cast<size_t>(q)] != r.recv2[static_cast<size_t>(m)])
                fail_msg("%s: step 2: member %d sends %zu bytes to %d, which expects %zu", what, m,
                         p.send2[static_cast<size_t>(q)], q, r.recv2[static_cast<size_t>(m)]);
            if (!same && p.send1[static_cast<size_t>(q)] != 0)
                fail_msg("%s: step 1 sends from member %d to %d on another node", what, m, q);
            if (same && q != m && p.step1 && p.pack1[static_cast<size_t>(q)] != r.collected)
                fail_msg("%s: member %d packs for %d other owners than it collects", what, m, q);
            if (same && q != m && p.send2[static_cast<size_t>(q)] != 0)
                fail_msg("%s: step 2 sends from member %d to %d on its own node", what, m, q);
        }
        for (size_t k = 0; k < p.collected.size(); ++k)
            if (p.slot(p.collected[k]) != k)
                fail_msg("%s: member %d finds owner %d at %zu, not %zu", what, m, p.collected[k],
                         p.slot(p.collected[k]), k);
        if (p.off[N] != [&] { size_t s = 0; for (size_t c : counts) s += c; return s; }())
            fail_msg("%s: offsets end at %zu", what, p.off[N]);
    }
    // Symbols: acc[c][o] at collector c.
    std::vector<std::vector<uint64_t>> acc(N, std::vector<uint64_t>(N, 0));
    for (int c = 0; c < n; ++c)
        for (int o : plans[static_cast<size_t>(c)].collected) acc[static_cast<size_t>(c)][static_cast<size_t>(o)] = uint64_t(1) << c;
    if (plans[0].step1)
        for (int m = 0; m < n; ++m)
            for (int q = 0; q < n; ++q)
                for (int o : plans[static_cast<size_t>(m)].pack1[static_cast<size_t>(q)]) {
                    uint64_t &a = acc[static_cast<size_t>(q)][static_cast<size_t>(o)];
                    if (a & (uint64_t(1) << m)) fail_msg("%s: member %d's block of %d reaches %d twice", what, m, o, q);
                    a |= uint64_t(1) << m;
                }
    std::vector<uint64_t> out(N, 0);
    for (int o = 0; o < n; ++o) out[static_cast<size_t>(o)] = acc[static_cast<size_t>(o)][static_cast<size_t>(o)];
    if (plans[0].step2)
        for (int c = 0; c < n; ++c)
            for (int o : plans[static_cast<size_t>(c)].collected)
                if (o != c) {
                    if (plans[static_cast<size_t>(c)].send2[static_cast<size_t>(o)] !=
                        quant::packed_bytes(counts[static_cast<size_t>(o)], 4, 64))
                        fail_msg("%s: collector %d sends a wrong size to %d", what, c, o);
                    const uint64_t a = acc[static_cast<size_t>(c)][static_cast<size_t>(o)];
                    if (out[static_cast<size_t>(o)] & a) fail_msg("%s: owner %d gets a contribution twice", what, o);
                    out[static_cast<size_t>(o)] |= a;
                }
    const uint64_t all = n >= 64 ? ~uint64_t(0) : (uint64_t(1) << n) - 1;
    for (int o = 0; o < n; ++o)
        if (out[static_cast<size_t>(o)] != all)
            fail_msg("%s: owner %d ends with contributions %#llx, expected %#llx", what, o,
                     static_cast<unsigned long long>(out[static_cast<size_t>(o)]), static_cast<unsigned long long>(all));
}

} // namespace

static void test_plan_layouts(void **) {
    const std::vector<std::vector<int>> layouts = {
        {0},          {0, 0},       {0, 1},          {0, 0, 1, 1},       {0, 0, 0, 1},       {0, 1, 0, 1},
        {7, 7, 7, 7}, {0, 1, 2, 3}, {0, 0, 1, 1, 2, 2}, {0, 0, 0, 1, 1, 2, 2, 2}, {3, 1, 3, 1, 3, 1, 2, 2}};
    for (const auto &nodes : layouts) {
        for (int variant = 0; variant < 3; ++variant) {
            std::vector<size_t> counts(nodes.size());
            for (size_t r = 0; r < counts.size(); ++r)
                counts[r] = variant == 0 ? 100 : variant == 1 ? (r * 37) % 150 : (r % 2 ? 0 : 65);
            char what[128];
            int at = snprintf(what, sizeof what, "nodes {");
            for (int c : nodes) at += snprintf(what + at, sizeof what - static_cast<size_t>(at), "%d,", c);
            snprintf(what + at, sizeof what - static_cast<size_t>(at), "} counts %d", variant);
            check_layout(nodes, counts, what);
        }
    }
}

// 2 nodes x 2 members, equal blocks: each member sends one quantized block
// inside its node and one to the other node; the full-precision equivalents
// count the communication dtype's bytes.
static void test_plan_bytes(void **) {
    const QgzTopology topo({0, 0, 1, 1});
    const std::vector<size_t> counts(4, 1000);
    const size_t qb = quant::packed_bytes(1000, 4, 64);
    for (int m = 0; m < 4; ++m) {
        const QgzPlan p = plan_qgz(topo, m, counts, 2, 4, 64);
        assert_true(p.step1 && p.step2);
        assert_int_equal(p.collected.size(), 2);
        assert_int_equal(p.acc_values, 1000);
        assert_int_equal(p.bytes.sent_on, 2 * qb);
        assert_int_equal(p.bytes.full_on, 2 * 2000);
        assert_int_equal(p.bytes.sent_off, qb);
        assert_int_equal(p.bytes.full_off, 2000);
    }
    // One node: no step 2, every owner collected by itself.
    const QgzPlan one = plan_qgz(QgzTopology({0, 0, 0}), 1, {10, 20, 30}, 4, 8, 16);
    assert_true(one.step1 && !one.step2);
    assert_int_equal(one.collected.size(), 1);
    assert_int_equal(one.bytes.sent_off, 0);
    // One member per node: no step 1.
    const QgzPlan single = plan_qgz(QgzTopology({0, 1, 2}), 0, {10, 20, 30}, 4, 8, 16);
    assert_true(!single.step1 && single.step2);
    assert_int_equal(single.bytes.sent_on, 0);
    expect_error_at([&] { plan_qgz(QgzTopology({0, 1}), 0, {1, 2, 3}, 4, 8, 16); }, DSM_ERR_INVALID_ARGUMENT,
                    {"3 counts for a group of 2"}, __LINE__);
    expect_error_at([&] { plan_qgz(QgzTopology({0, 1}), 2, {1, 2}, 4, 8, 16); }, DSM_ERR_INVALID_ARGUMENT,
                    {"member 2 of a group of 2"}, __LINE__);
    expect_error_at([&] { (void)one.slot(0); }, DSM_ERR_INTERNAL, {"owner 0 is not collected here"}, __LINE__);
}

// The host's and the simulated device's kernels give quantize.hpp's bits.
static void test_space_kernels_host_sim(void **) {
    for (int which = 0; which < 2; ++which) {
        std::unique_ptr<device::Space> own;
        device::Space *space = &device::host();
        if (which == 1) {
            own = device::make_sim();
            space = own.get();
        }
        auto k = quant::make_space_kernels(*space);
        assert_string_equal(k->where(), which ? "simulated" : "host");
        for (dsm_dtype_t dt : {DSM_FLOAT32, DSM_FLOAT16, DSM_BFLOAT16})
            for (int bits : {8, 4}) {
                const size_t n = 5000, block = bits == 8 ? 4096 : 1024, es = dt == DSM_FLOAT32 ? 4 : 2;
                const std::vector<float> x = sample(n, static_cast<unsigned>(bits + dt));
                std::vector<uint16_t> h(n);
                for (size_t i = 0; i < n; ++i) h[i] = dt == DSM_FLOAT16 ? fp32_to_fp16(x[i]) : fp32_to_bf16(x[i]);
                const void *src_host = dt == DSM_FLOAT32 ? static_cast<const void *>(x.data()) : h.data();
                const size_t bytes = quant::packed_bytes(n, bits, block);
                std::vector<uint8_t> want(bytes);
                quant::quantize(src_host, dt, n, bits, block, want.data());
                device::Buffer src(*space, n * es), q(*space, bytes), y(*space, n * es), w(*space, n * 4);
                space->upload(src.data(), src_host, n * es);
                k->quantize(src.data(), dt, n, bits, block, q.data());
                k->dequantize(q.data(), n, bits, block, y.data(), dt, false);
                k->widen(src.data(), dt, n, static_cast<float *>(w.data()));
                k->settle();
                std::vector<uint8_t> got(bytes);
                space->download(got.data(), q.data(), bytes);
                assert_memory_equal(got.data(), want.data(), bytes);
                std::vector<uint8_t> yw(n * es), yg(n * es);
                quant::dequantize(want.data(), n, bits, block, yw.data(), dt, false);
                space->download(yg.data(), y.data(), n * es);
                assert_memory_equal(yg.data(), yw.data(), n * es);
                std::vector<float> wide(n);
                space->download(wide.data(), w.data(), n * 4);
                for (size_t i = 0; i < n; ++i) {
                    const float v = dt == DSM_FLOAT32 ? x[i] : dt == DSM_FLOAT16 ? fp16_to_fp32(h[i]) : bf16_to_fp32(h[i]);
                    if (std::memcmp(&v, &wide[i], 4) != 0) fail_msg("widen: value %zu: %g, expected %g", i, wide[i], v);
                }
            }
        float f = 0;
        expect_error_at([&] { k->quantize(&f, DSM_FLOAT32, 16, 5, 16, &f); }, DSM_ERR_INVALID_ARGUMENT, {"5 bits"},
                        __LINE__);
        expect_error_at([&] { k->quantize(&f, DSM_FLOAT32, 16, 8, 24, &f); }, DSM_ERR_INVALID_ARGUMENT,
                        {"block size 24"}, __LINE__);
        expect_error_at([&] { k->dequantize(&f, 16, 8, 16, &f, DSM_FLOAT16, true); }, DSM_ERR_INVALID_ARGUMENT,
                        {"FLOAT32 values only"}, __LINE__);
        expect_error_at([&] { k->widen(&f, DSM_INT32, 1, &f); }, DSM_ERR_INVALID_ARGUMENT, {"dtype"}, __LINE__);
        expect_error_at([&] { k->quantize(nullptr, DSM_FLOAT32, 16, 8, 16, &f); }, DSM_ERR_NULL_POINTER, {"NULL"},
                        __LINE__);
    }
}

// The CUDA space's kernels against the host's, bit for bit, and each round
// trip within its block's bound (skipped without a device).
static void test_space_kernels_cuda(void **) {
#if DSM_HAVE_CUDA_KERNELS
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        print_message("[          ] no CUDA device: the device kernels are not run\n");
        skip();
        return;
    }
    auto space = device::make_cuda(0);
    auto k = quant::make_space_kernels(*space);
    assert_string_equal(k->where(), "cuda");
    for (dsm_dtype_t dt : {DSM_FLOAT32, DSM_FLOAT16, DSM_BFLOAT16})
        for (int bits : {8, 4})
            for (size_t n : {size_t(1), size_t(17), size_t(5000), size_t(1) << 20}) {
                const size_t block = bits == 8 ? 4096 : 1024, es = dt == DSM_FLOAT32 ? 4 : 2;
                const std::vector<float> x = sample(n, static_cast<unsigned>(n + bits + dt));
                std::vector<uint16_t> h(n);
                for (size_t i = 0; i < n; ++i) h[i] = dt == DSM_FLOAT16 ? fp32_to_fp16(x[i]) : fp32_to_bf16(x[i]);
                const void *src_host = dt == DSM_FLOAT32 ? static_cast<const void *>(x.data()) : h.data();
                const size_t bytes = quant::packed_bytes(n, bits, block);
                std::vector<uint8_t> want(bytes), got(bytes);
                quant::quantize(src_host, dt, n, bits, block, want.data());
                device::Buffer src(*space, n * es), q(*space, bytes), y(*space, n * es), acc(*space, n * 4);
                space->upload(src.data(), src_host, n * es);
                k->quantize(src.data(), dt, n, bits, block, q.data());
                space->download(got.data(), q.data(), bytes);
                assert_memory_equal(got.data(), want.data(), bytes);
                k->dequantize(q.data(), n, bits, block, y.data(), dt, false);
                std::vector<uint8_t> yw(n * es), yg(n * es);
                quant::dequantize(want.data(), n, bits, block, yw.data(), dt, false);
                space->download(yg.data(), y.data(), n * es);
                assert_memory_equal(yg.data(), yw.data(), n * es);
                // The fused accumulate: fp32 += x', the host's bits.
                std::vector<float> base(n, 0.25f);
                space->upload(acc.data(), base.data(), n * 4);
                k->dequantize(q.data(), n, bits, block, acc.data(), DSM_FLOAT32, true);
                quant::dequantize(want.data(), n, bits, block, base.data(), DSM_FLOAT32, true);
                std::vector<float> ag(n);
                space->download(ag.data(), acc.data(), n * 4);
                assert_memory_equal(ag.data(), base.data(), n * 4);
                // Within the bound of each block (fp32 only: 16-bit adds its own rounding).
                if (dt == DSM_FLOAT32) {
                    std::vector<float> yf(n);
                    std::memcpy(yf.data(), yg.data(), n * 4);
                    check_round_trip(x, yf, bits, block, "cuda round trip");
                }
            }
#else
    print_message("[          ] built without the CUDA kernels\n");
    skip();
#endif
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_layouts),
        cmocka_unit_test(test_plan_bytes),
        cmocka_unit_test(test_space_kernels_host_sim),
        cmocka_unit_test(test_space_kernels_cuda),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
