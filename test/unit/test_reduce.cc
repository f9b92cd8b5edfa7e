// The backends' elementwise reductions (comm/reduce.hpp) against a scalar
// reference, bit for bit: every dtype and op, one to five sources combined
// left to right, lengths around the 1024-element blocks and past the size
// where the result is written with streaming stores, dst one of the sources,
// and the special values (Inf, NaN, signed zeros, subnormals, fp16
// overflow, rounding ties). The reference widens and rounds with its own
// arithmetic (written out below from the formats' definitions, not the
// library's core/half.hpp), and fixed sums whose exact value is a rounding
// tie must give the 16-bit patterns written out here. The loops have one
// copy per instruction set: every test runs each one this CPU offers
// (dsm::simd::force), so the AVX2 copy is tested on an AVX-512 machine too.
#include <algorithm>
#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "comm/reduce.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/half.hpp"
#include "core/simd.hpp"
#include "dtype_values.h"

#include "cxx_test.h" // last: CMocka's fail() macro would break the C++ headers

using dsm::comm::Op;

namespace {

template <typename A> A combine(Op op, A acc, A x) {
    switch (op) {
    case Op::SUM: return acc + x;
    case Op::MAX: return x > acc ? x : acc;
    case Op::MIN: return x < acc ? x : acc;
    }
    return acc;
}

// The 16-bit formats by their definitions (IEEE binary16: 1 sign, 5
// exponent bits biased by 15, 10 fraction bits; bfloat16: the top 16 bits of
// an IEEE binary32, 8 exponent bits biased by 127, 7 fraction bits), with
// rounding to nearest, ties to even (nearbyint in the default rounding
// mode) of the value scaled to an integer number of the format's steps.
// NaN becomes the quiet NaN with the sign kept (fp16: 0x7e00, bf16: the top
// 16 bits with the quiet bit 0x0040 set).
double decode_f16(uint16_t h) {
    const double sign = (h & 0x8000u) ? -1.0 : 1.0;
    const int e = (h >> 10) & 0x1f, f = h & 0x3ff;
    if (e == 0x1f) return f ? std::nan("") : sign * INFINITY;
    if (e == 0) return sign * std::ldexp(f, -24);               // subnormal: f x 2^-24
    return sign * std::ldexp(1024 + f, e - 15 - 10);             // (1 + f / 1024) x 2^(e - 15)
}
double decode_bf16(uint16_t b) {
    const double sign = (b & 0x8000u) ? -1.0 : 1.0;
    const int e = (b >> 7) & 0xff, f = b & 0x7f;
    if (e == 0xff) return f ? std::nan("") : sign * INFINITY;
    if (e == 0) return sign * std::ldexp(f, -126 - 7);          // subnormal: f x 2^-133
    return sign * std::ldexp(128 + f, e - 127 - 7);              // (1 + f / 128) x 2^(e - 127)
}
// |x| rounded to a multiple of 2^(max(floor(log2 |x|), emin) - fraction bits).
double round_steps(double a, int emin, int frac) {
    const int e = std::max(std::ilogb(a), emin) - frac;
    return std::ldexp(std::nearbyint(std::ldexp(a, -e)), e);
}
uint16_t encode_f16(float x) {
    const uint16_t sign = std::signbit(x) ? 0x8000u : 0u;
    if (std::isnan(x)) return sign | 0x7e00u;
    const double a = std::fabs(static_cast<double>(x));
    if (a == 0) return sign;
    const double r = std::isinf(a) ? INFINITY : round_steps(a, -14, 10);
    if (r >= 65520.0 || std::isinf(r)) return sign | 0x7c00u;    // past 65504 (+ half a step): Inf
    if (r < std::ldexp(1.0, -14)) return sign | static_cast<uint16_t>(std::ldexp(r, 24));
    const int e = std::ilogb(r);
    return sign | static_cast<uint16_t>((e + 15) << 10) | static_cast<uint16_t>(std::ldexp(r, 10 - e) - 1024);
}
uint16_t encode_bf16(float x) {
    const uint16_t sign = std::signbit(x) ? 0x8000u : 0u;
    uint32_t u;
    std::memcpy(&u, &x, 4);
    if (std::isnan(x)) return static_cast<uint16_t>((u >> 16) | 0x0040u);
    const double a = std::fabs(static_cast<double>(x));
    if (a == 0) return sign;
    const double r = std::isinf(a) ? INFINITY : round_steps(a, -126, 7);
    if (r >= std::ldexp(1.0, 128) || std::isinf(r)) return sign | 0x7f80u;
    if (r < std::ldexp(1.0, -126)) return sign | static_cast<uint16_t>(std::ldexp(r, 133));
    const int e = std::ilogb(r);
    return sign | static_cast<uint16_t>((e + 127) << 7) | static_cast<uint16_t>(std::ldexp(r, 7 - e) - 128);
}
float f32(uint32_t u) {
    float x;
    std::memcpy(&x, &u, 4);
    return x;
}
// Element i of a buffer of t, widened by the definitions above.
double element(dsm_dtype_t t, const std::vector<char> &buf, size_t i) {
    uint16_t h;
    switch (t) {
    case DSM_FLOAT16: std::memcpy(&h, buf.data() + 2 * i, 2); return decode_f16(h);
    case DSM_BFLOAT16: std::memcpy(&h, buf.data() + 2 * i, 2); return decode_bf16(h);
    default: return value_at(t, buf, i);
    }
}

// Element i of the reference: fp64 in fp64, the others in fp32 (16-bit
// widened, combined, rounded once).
void reference_at(dsm_dtype_t t, Op op, const std::vector<std::vector<char>> &srcs, size_t i,
                  char *out) {
    if (t == DSM_FLOAT64) {
        double acc = value_at(t, srcs[0], i);
        for (size_t k = 1; k < srcs.size(); ++k) acc = combine(op, acc, value_at(t, srcs[k], i));
        std::memcpy(out, &acc, 8);
        return;
    }
    float acc = static_cast<float>(element(t, srcs[0], i));
    for (size_t k = 1; k < srcs.size(); ++k) acc = combine(op, acc, static_cast<float>(element(t, srcs[k], i)));
    if (t == DSM_FLOAT32) {
        std::memcpy(out, &acc, 4);
        return;
    }
    const uint16_t h = t == DSM_FLOAT16 ? encode_f16(acc) : encode_bf16(acc);
    std::memcpy(out, &h, 2);
}

const char *op_name(Op op) { return dsm::comm::op_label(op); }

// Values that exercise each dtype: random magnitudes over many exponents,
// then the specials at fixed places.
std::vector<double> values(size_t n, unsigned seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<double> mant(-1.0, 1.0);
    std::uniform_int_distribution<int> ex(-30, 17); // past fp16's 65504, into its subnormals
    std::vector<double> v(n);
    for (auto &x : v) x = std::ldexp(mant(rng), ex(rng));
    const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
    const double specials[] = {inf, -inf, nan, 0.0, -0.0, 65504.0, 65520.0, 6e-8, 1.0 + 0x1p-11, 1.0 + 0x1p-8};
    for (size_t k = 0; k < sizeof specials / sizeof specials[0] && 7 * k + seed % 7 < n; ++k)
        v[7 * k + seed % 7] = specials[k];
    return v;
}

void check(dsm_dtype_t t, Op op, size_t nsrc, size_t n, bool in_place, int line) {
    std::vector<std::vector<char>> srcs;
    for (size_t k = 0; k < nsrc; ++k) srcs.push_back(make(t, values(n, static_cast<unsigned>(11 + k))));
    std::vector<char> want(n * esize(t));
    for (size_t i = 0; i < n; ++i) reference_at(t, op, srcs, i, want.data() + i * esize(t));
    std::vector<char> got(n * esize(t), 0xa5);
    std::vector<const void *> ptrs;
    for (const auto &s : srcs) ptrs.push_back(s.data());
    void *dst = got.data();
    if (in_place) dst = srcs[0].data(); // dst is the first source
    dsm::comm::reduce_sources(dst, ptrs.data(), nsrc, n, t, op);
    if (in_place) got = srcs[0];
    for (size_t i = 0; i < n; ++i)
        if (std::memcmp(got.data() + i * esize(t), want.data() + i * esize(t), esize(t)) != 0)
            fail_msg("line %d: %s: %s %s of %zu sources, %zu elements%s: element %zu is %.9g, expected %.9g", line,
                     dsm::comm::reduce_isa(), dsm::dtype_name(t), op_name(op), nsrc, n, in_place ? " in place" : "", i,
                     element(t, got, i), element(t, want, i));
}

const dsm_dtype_t kTypes[] = {DSM_FLOAT32, DSM_FLOAT64, DSM_FLOAT16, DSM_BFLOAT16};
const Op kOps[] = {Op::SUM, Op::MAX, Op::MIN};

// Runs body once per instruction set this CPU and build offer, then goes
// back to the best.
template <typename F> void each_isa(F &&body) {
    const std::vector<std::string> isas = dsm::simd::available();
    assert_true(!isas.empty() && isas.back() == "generic");
    for (const std::string &isa : isas) {
        dsm::simd::force(isa);
        assert_string_equal(dsm::comm::reduce_isa(), isa.c_str());
        body();
    }
    dsm::simd::force("auto");
}

} // namespace

// The reference's own conversions against values written out by hand.
static void test_reference_formats(void **) {
    assert_true(std::fegetround() == FE_TONEAREST);
    assert_int_equal(encode_bf16(1.0f), 0x3f80);
    assert_int_equal(encode_bf16(-2.0f), 0xc000);
    assert_int_equal(encode_bf16(f32(0x3f808000u)), 0x3f80); // 1.00390625: a tie, to even (down)
    assert_int_equal(encode_bf16(f32(0x3f818000u)), 0x3f82); // 1.01171875: a tie, to even (up)
    assert_int_equal(encode_bf16(f32(0x00018000u)), 0x0002); // a subnormal tie, to even (up)
    assert_int_equal(encode_bf16(f32(0x00008000u)), 0x0000); // a subnormal tie, to even (zero)
    assert_int_equal(encode_bf16(f32(0x3f808001u)), 0x3f81); // above the tie
    assert_int_equal(encode_bf16(INFINITY), 0x7f80);
    assert_int_equal(encode_f16(1.0f), 0x3c00);
    assert_int_equal(encode_f16(65504.0f), 0x7bff);
    assert_int_equal(encode_f16(65519.99f), 0x7bff);
    assert_int_equal(encode_f16(65520.0f), 0x7c00);       // the tie past the largest: Inf
    assert_int_equal(encode_f16(5.9604645e-08f), 0x0001); // 2^-24, the smallest subnormal
    assert_int_equal(encode_f16(2.9802322e-08f), 0x0000); // 2^-25: a tie, to even (zero)
    assert_int_equal(encode_f16(8.9406967e-08f), 0x0002); // 1.5 x 2^-24: a tie, to even (2)
    assert_true(decode_bf16(0x3f81) == 1.0078125 && decode_f16(0x3c01) == 1.0009765625);
    assert_true(decode_f16(0x0001) == std::ldexp(1.0, -24) && decode_bf16(0x0001) == std::ldexp(1.0, -133));
}

// Sums of two 16-bit values whose exact fp32 sum lies halfway between two
// 16-bit values: rounded to the even one, bit patterns written out.
static void test_rounding_ties(void **) {
    struct Tie {
        dsm_dtype_t t;
        uint16_t a, b, want;
    };
    const Tie ties[] = {
        {DSM_BFLOAT16, 0x3f80, 0x3b80, 0x3f80}, // 1 + 2^-8 = 0x3f808000: down to the even 0x3f80
        {DSM_BFLOAT16, 0x3f81, 0x3b80, 0x3f82}, // 1.0078125 + 2^-8 = 0x3f818000: up to the even 0x3f82
        {DSM_BFLOAT16, 0xbf80, 0xbb80, 0xbf80}, // the same, negative
        {DSM_BFLOAT16, 0xbf81, 0xbb80, 0xbf82},
        {DSM_BFLOAT16, 0x3f81, 0xbb80, 0x3f80}, // 1.0078125 - 2^-8 = 0x3f808000
        {DSM_BFLOAT16, 0x3f80, 0x3b81, 0x3f81}, // 1 + 1.0078125 x 2^-8 = 0x3f808100: above the tie
        {DSM_BFLOAT16, 0x4380, 0x3f80, 0x4380}, // 256 + 1 = 0x43808000: down to 256
        {DSM_BFLOAT16, 0x4381, 0x3f80, 0x4382}, // 258 + 1 = 0x43818000: up to 260
        {DSM_BFLOAT16, 0x7f7f, 0x7b00, 0x7f80}, // the largest + half a step (2^119) = 0x7f7f8000: up to Inf
        {DSM_FLOAT16, 0x3c00, 0x1000, 0x3c00},  // 1 + 2^-11: down to 1
        {DSM_FLOAT16, 0x3c01, 0x1000, 0x3c02},  // 1.0009765625 + 2^-11: up to 1.001953125
        {DSM_FLOAT16, 0x7bff, 0x4c00, 0x7c00},  // 65504 + 16 = 65520: Inf
    };
    each_isa([&] {
        for (const Tie &c : ties)
            for (Op op : {Op::SUM}) {
                // A long buffer so that the vector loops (not only a tail) see the tie.
                const size_t n = 100;
                std::vector<uint16_t> a(n, c.a), b(n, c.b), out(n, 0);
                const void *srcs[2] = {a.data(), b.data()};
                dsm::comm::reduce_sources(out.data(), srcs, 2, n, c.t, op);
                for (size_t i = 0; i < n; ++i)
                    if (out[i] != c.want)
                        fail_msg("%s: %s 0x%04x + 0x%04x: element %zu is 0x%04x, expected 0x%04x",
                                 dsm::comm::reduce_isa(), dsm::dtype_name(c.t), c.a, c.b, i, out[i], c.want);
                // The other order, and in place.
                b.assign(n, c.b);
                const void *rev[2] = {b.data(), a.data()};
                dsm::comm::reduce_sources(b.data(), rev, 2, n, c.t, op);
                if (b != out) fail_msg("%s: %s 0x%04x + 0x%04x in place: not 0x%04x", dsm::comm::reduce_isa(),
                                       dsm::dtype_name(c.t), c.b, c.a, c.want);
            }
    });
}

static void test_every_type_and_op(void **) {
    each_isa([] {
        for (dsm_dtype_t t : kTypes)
            for (Op op : kOps)
                for (size_t nsrc = 1; nsrc <= 5; ++nsrc)
                    for (size_t n : {size_t(1), size_t(15), size_t(1024), size_t(3077)}) {
                        check(t, op, nsrc, n, false, __LINE__);
                        check(t, op, nsrc, n, true, __LINE__);
                    }
    });
}

// Past 8 MiB of output the stores stream (non-temporal), then fence.
static void test_streaming_lengths(void **) {
    each_isa([] {
        for (dsm_dtype_t t : {DSM_BFLOAT16, DSM_FLOAT16, DSM_FLOAT32}) {
            const size_t n = (size_t(8) << 20) / esize(t) + 1029;
            check(t, Op::SUM, 2, n, false, __LINE__);
            check(t, Op::SUM, 3, n, true, __LINE__);
        }
    });
}

// reduce_into: inout = in op inout, the MPI user operation's order.
static void test_reduce_into(void **) {
    each_isa([] {
    for (dsm_dtype_t t : kTypes)
        for (Op op : kOps) {
            const size_t n = 2053;
            const std::vector<char> in = make(t, values(n, 3)), inout0 = make(t, values(n, 4));
            std::vector<char> inout = inout0, want(n * esize(t));
            for (size_t i = 0; i < n; ++i) reference_at(t, op, {in, inout0}, i, want.data() + i * esize(t));
            dsm::comm::reduce_into(inout.data(), in.data(), n, t, op);
            if (inout != want)
                fail_msg("%s: reduce_into %s %s: not the reference's bits", dsm::comm::reduce_isa(), dsm::dtype_name(t),
                         op_name(op));
        }
    });
}

// Only the sets this CPU and build run can be chosen; a bad name is refused.
static void test_isa_choice(void **) {
    try {
        dsm::simd::force("sse9");
        fail_msg("instruction set sse9 accepted");
    } catch (const dsm::Error &e) {
        assert_int_equal(e.status(), DSM_ERR_INVALID_ARGUMENT);
        assert_non_null(std::strstr(e.what(), "sse9"));
    }
    const std::vector<std::string> isas = dsm::simd::available();
    for (const char *isa : {"avx512", "avx2"})
        if (std::find(isas.begin(), isas.end(), isa) == isas.end()) {
            try {
                dsm::simd::force(isa);
                fail_msg("instruction set %s accepted on a CPU without it", isa);
            } catch (const dsm::Error &e) {
                assert_int_equal(e.status(), DSM_ERR_NOT_SUPPORTED);
            }
        }
    dsm::simd::force("auto");
    assert_string_equal(dsm::comm::reduce_isa(), isas.front().c_str());
    print_message("[          ] reduction loops run here: %s (of those the build has)\n", isas.front().c_str());
}

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_formats),
        cmocka_unit_test(test_rounding_ties),
        cmocka_unit_test(test_every_type_and_op),
        cmocka_unit_test(test_streaming_lengths),
        cmocka_unit_test(test_reduce_into),
        cmocka_unit_test(test_isa_choice),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
