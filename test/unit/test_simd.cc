// The one SIMD dispatch (core/simd.hpp): simd::force() moves every CPU
// kernel family at once (optim, comm's quantization and reductions and
// streaming copies, amp's conversions and norms, the checkpoint checksum),
// and each instruction set
// this CPU runs gives the generic set's bits, on inputs with specials
// (NaN, infinities, subnormals, ties) and lengths that leave vector tails.
#include "dsm_config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "amp/convert.hpp"
#include "ckpt/checksum.hpp"
#include "ckpt/format.hpp"
#include "comm/memops.hpp"
#include "comm/quantize.hpp"
#include "comm/reduce.hpp"
#include "core/error.hpp"
#include "core/simd.hpp"
#include "optim/kernels.hpp"
#include "optim/optimizer.hpp"

#include "cxx_test.h" // last: CMocka's fail() macro would break the C++ headers

namespace {

constexpr size_t kN = 70001; // over two of amp's 32K blocks, a tail for every width

// fp32 values with every kind of special and a wide spread of magnitudes.
std::vector<float> sample(size_t n, unsigned seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> d(-4.0f, 4.0f);
    std::uniform_int_distribution<int> e(-140, 60);
    std::vector<float> x(n);
    for (size_t i = 0; i < n; ++i) x[i] = std::ldexp(d(rng), e(rng));
    const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-45f, -1e-40f, 65504.0f, 65520.0f,
                              1.00390625f /* a bf16 tie */, 3.4e38f};
    for (size_t k = 0; k < sizeof specials / sizeof *specials && k * 97 < n; ++k) x[k * 97] = specials[k];
    return x;
}

// Finite values only (the norms and the quantization compare their sums).
std::vector<float> finite(size_t n, unsigned seed) {
    std::vector<float> x = sample(n, seed);
    for (float &v : x)
        if (!std::isfinite(v) || std::fabs(v) > 1e30f) v = 0.5f;
    return x;
}

template <class T> std::vector<uint8_t> bytes_of(const std::vector<T> &v) {
    std::vector<uint8_t> b(v.size() * sizeof(T));
    std::memcpy(b.data(), v.data(), b.size());
    return b;
}

// Everything each family computes here, as bytes, on the set in use.
std::vector<std::vector<uint8_t>> run_all() {
    std::vector<std::vector<uint8_t>> out;
    const std::vector<float> x = sample(kN, 1), y = finite(kN, 2), z = finite(kN, 3);
    // amp: conversions both ways, accumulate, norms.
    std::vector<uint16_t> h16(kN), b16(kN);
    dsm::amp::convert(x.data(), DSM_FLOAT32, h16.data(), DSM_FLOAT16, kN);
    dsm::amp::convert(x.data(), DSM_FLOAT32, b16.data(), DSM_BFLOAT16, kN);
    std::vector<float> hf(kN), bf(kN);
    dsm::amp::convert(h16.data(), DSM_FLOAT16, hf.data(), DSM_FLOAT32, kN);
    dsm::amp::convert(b16.data(), DSM_BFLOAT16, bf.data(), DSM_FLOAT32, kN);
    std::vector<float> acc = y;
    dsm::amp::accumulate(h16.data(), DSM_FLOAT16, acc.data(), kN, 0.25f);
    dsm::amp::accumulate_into(y.data(), DSM_FLOAT32, b16.data(), DSM_BFLOAT16, kN, 3.0f);
    std::vector<uint16_t> yb(kN);
    dsm::amp::convert(y.data(), DSM_FLOAT32, yb.data(), DSM_BFLOAT16, kN);
    const dsm::amp::NormPart n32 = dsm::amp::norm_part(y.data(), kN, 0.5f);
    const dsm::amp::NormPart n16 = dsm::amp::norm_part(yb.data(), DSM_BFLOAT16, kN, 0.5f);
    const dsm::amp::NormPart nbad = dsm::amp::norm_part(x.data(), kN, 1.0f);
    const std::vector<double> norms{n32.sumsq, n16.sumsq, double(n32.nonfinite), double(nbad.nonfinite)};
    for (const auto &b : {bytes_of(h16), bytes_of(b16), bytes_of(hf), bytes_of(bf), bytes_of(acc), bytes_of(norms)})
        out.push_back(b);
    // comm: the reductions of three sources, per dtype and op.
    for (dsm::comm::Op op : {dsm::comm::Op::SUM, dsm::comm::Op::MAX, dsm::comm::Op::MIN}) {
        std::vector<float> r(kN);
        const void *srcs[3] = {x.data(), y.data(), z.data()};
        dsm::comm::reduce_sources(r.data(), srcs, 3, kN, DSM_FLOAT32, op);
        out.push_back(bytes_of(r));
        std::vector<uint16_t> r16(kN);
        const void *hs[2] = {h16.data(), yb.data()};
        dsm::comm::reduce_sources(r16.data(), hs, 2, kN, DSM_FLOAT16, op);
        out.push_back(bytes_of(r16));
        dsm::comm::reduce_sources(r16.data(), hs, 2, kN, DSM_BFLOAT16, op);
        out.push_back(bytes_of(r16));
    }
    // comm: quantization round trips (8 and 4 bits; accumulate).
    for (int bits : {8, 4}) {
        std::vector<uint8_t> q(dsm::comm::quant::packed_bytes(kN, bits, 1024));
        dsm::comm::quant::quantize(y.data(), DSM_FLOAT32, kN, bits, 1024, q.data());
        std::vector<float> d = z;
        dsm::comm::quant::dequantize(q.data(), kN, bits, 1024, d.data(), DSM_FLOAT32, true);
        out.push_back(q);
        out.push_back(bytes_of(d));
    }
    // comm: the streaming copy, at an odd offset.
    std::vector<uint8_t> src = bytes_of(x), dst(src.size() + 64, 0xAB);
    dsm::comm::memops::active().stream_copy(dst.data() + 3, src.data(), src.size() - 5);
    dsm::comm::memops::active().stream_fence();
    out.push_back(dst);
    // ckpt: the checkpoint checksum, threaded (over its 64K-element blocks),
    // short at an odd offset, and one thread's kernel with a vector tail.
    const std::vector<uint64_t> sums{dsm::ckpt::checksum(x.data(), 0, kN), dsm::ckpt::checksum(x.data() + 5, 12345, 999),
                                     dsm::ckpt::cksum::active().range(x.data() + 3, 7, 4099)};
    out.push_back(bytes_of(sums));
    return out;
}

const char *const kFamily[] = {"amp fp16", "amp bf16",    "amp fp16->fp32", "amp bf16->fp32", "amp accumulate",
                               "amp norms", "reduce sum f32", "reduce sum f16", "reduce sum bf16", "reduce max f32",
                               "reduce max f16", "reduce max bf16", "reduce min f32", "reduce min f16",
                               "reduce min bf16", "quantize 8", "dequantize 8", "quantize 4", "dequantize 4",
                               "stream copy", "ckpt checksum"};

} // namespace

// The names and errors of the one hook.
static void test_force_moves_every_family(void **) {
    const std::vector<std::string> isas = dsm::simd::available();
    print_message("[          ] instruction sets here:");
    for (const auto &i : isas) print_message(" %s", i.c_str());
    print_message(" (cpu: %s)\n", dsm::simd::name(dsm::simd::cpu()));
    assert_true(!isas.empty() && isas.back() == "generic" && isas.front() == dsm::simd::name(dsm::simd::cpu()));
    for (const std::string &isa : isas) {
        dsm::simd::force(isa);
        assert_string_equal(dsm::simd::name(dsm::simd::isa()), isa.c_str());
        assert_string_equal(dsm::optim::active_isa(), isa.c_str());
        assert_string_equal(dsm::comm::quant::active_isa(), isa.c_str());
        assert_string_equal(dsm::comm::reduce_isa(), isa.c_str());
        assert_string_equal(dsm::comm::memops::active().name, isa.c_str());
        assert_string_equal(dsm::amp::kernels_isa(), isa.c_str());
        assert_string_equal(dsm::ckpt::cksum::active().name, isa.c_str());
    }
    expect_error_at([] { dsm::simd::force("sse9"); }, DSM_ERR_INVALID_ARGUMENT, {"\"sse9\""}, __LINE__);
    for (const char *wide : {"avx2", "avx512"})
        if (std::find(isas.begin(), isas.end(), wide) == isas.end())
            expect_error_at([&] { dsm::simd::force(wide); }, DSM_ERR_NOT_SUPPORTED, {wide}, __LINE__);
    dsm::simd::force("auto");
    assert_string_equal(dsm::simd::name(dsm::simd::isa()), isas.front().c_str());
}

// Every family on every set: the generic set's bits.
static void test_same_bits_on_every_isa(void **) {
    dsm::simd::force("generic");
    const std::vector<std::vector<uint8_t>> ref = run_all();
    assert_int_equal(ref.size(), sizeof kFamily / sizeof *kFamily);
    for (const std::string &isa : dsm::simd::available()) {
        dsm::simd::force(isa);
        const std::vector<std::vector<uint8_t>> got = run_all();
        for (size_t k = 0; k < ref.size(); ++k)
            if (got[k] != ref[k]) {
                size_t i = 0;
                while (i < ref[k].size() && got[k][i] == ref[k][i]) ++i;
                fail_msg("%s: %s differs from generic at byte %zu of %zu", isa.c_str(), kFamily[k], i, ref[k].size());
            }
    }
    dsm::simd::force("auto");
}

// The optimizer tables: the 16-bit pass's conversions give the same bits on
// every set; the updates (FMA on the wide sets, two roundings on generic)
// stay within a few ulps of generic's (test_optimizer checks them in full).
static void test_optimizer_tables(void **) {
    using dsm::simd::Isa;
    const dsm::optim::Kernels *tables[] = {dsm::optim::kernels<Isa::generic>(), dsm::optim::kernels<Isa::avx2>(),
                                           dsm::optim::kernels<Isa::avx512>()};
    const std::vector<float> x = sample(kN, 4), g = finite(kN, 5);
    std::vector<uint16_t> ref16(kN);
    std::vector<float> ref32(kN), p0(kN), m0(kN), v0(kN);
    tables[0]->f32_to_bf16(x.data(), ref16.data(), kN);
    tables[0]->bf16_to_f32(ref16.data(), ref32.data(), kN);
    const dsm::optim::AdamK k{0.9f, 0.1f, 0.999f, 0.001f, 1e-8f, -1e-3f, 1.0f, 0.0f, -1e-5f, 1.0f};
    const std::vector<float> p = finite(kN, 6);
    p0 = p;
    tables[0]->adam(k, p0.data(), g.data(), m0.data(), v0.data(), kN);
    for (int s = 1; s <= static_cast<int>(dsm::simd::cpu()); ++s) {
        const dsm::optim::Kernels *t = tables[s];
        assert_non_null(t);
        std::vector<uint16_t> h(kN);
        std::vector<float> f(kN), q = p, m(kN), v(kN);
        t->f32_to_bf16(x.data(), h.data(), kN);
        t->bf16_to_f32(ref16.data(), f.data(), kN);
        assert_memory_equal(h.data(), ref16.data(), kN * 2);
        assert_memory_equal(f.data(), ref32.data(), kN * 4);
        t->adam(k, q.data(), g.data(), m.data(), v.data(), kN);
        for (size_t i = 0; i < kN; ++i)
            // A few ulps of p and of the step (lr 1e-3: the step is at most ~1e-3).
            if (!(std::fabs(q[i] - p0[i]) <= 1e-6f * (std::fabs(p[i]) + std::fabs(p0[i])) + 1e-9f))
                fail_msg("%s adam: p[%zu] %.9g, generic %.9g", t->name, i, (double)q[i], (double)p0[i]);
    }
}

// The checkpoint checksum on every set: test_ckpt_format's values (from
// doc/checkpoint.md's formula by an independent implementation), so that
// checkpoints saved on any set verify on any other.
static void test_checksum_pinned_on_every_isa(void **) {
    const float small[] = {1.0f, -2.5f, 0.0f, 3.25f};
    std::vector<float> big(200003); // several OpenMP blocks and a ragged tail
    for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i % 97) * 0.5f - 20.0f;
    for (const std::string &isa : dsm::simd::available()) {
        dsm::simd::force(isa);
        if (dsm::ckpt::checksum(small, 0, 4) != 0xd7ce45eb737743d1ull ||
            dsm::ckpt::checksum(small, 1000, 4) != 0xc65213d5fd0408b7ull ||
            dsm::ckpt::checksum(big.data(), 0, big.size()) != 0xa59e416f96916715ull)
            fail_msg("%s: the checkpoint checksum differs from the pinned values", isa.c_str());
    }
    dsm::simd::force("auto");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_force_moves_every_family),
        cmocka_unit_test(test_same_bits_on_every_isa),
        cmocka_unit_test(test_optimizer_tables),
        cmocka_unit_test(test_checksum_pinned_on_every_isa),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
