// Bulk precision helpers: bit-identity with the scalar conversions of
// core/half.hpp (every fp16 and bf16 pattern, rounding ties, NaN, Inf,
// subnormals, overflow), every dtype pair, accumulate and scale_inplace,
// norms that do not depend on the OpenMP thread count, non-finite detection
// and bad arguments. DSM_TEST_EXHAUSTIVE=1 also checks all 2^32 fp32 inputs.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "amp/convert.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/half.hpp"
#include "core/simd.hpp"
#include "dtype_values.h"

#include "cxx_test.h" // last: CMocka's fail() macro would break the C++ headers

using dsm::bf16_to_fp32;
using dsm::bits_float;
using dsm::float_bits;
using dsm::fp16_to_fp32;
using dsm::fp32_to_bf16;
using dsm::fp32_to_fp16;

// More than three blocks of the implementation (32768 elements), not a
// multiple of the vector or chunk lengths.
static const size_t kBig = 100003;

static const dsm_dtype_t kTypes[] = {DSM_FLOAT32, DSM_FLOAT16, DSM_BFLOAT16, DSM_FLOAT64};

// convert() in calls of 7 elements: shorter than the 8-wide F16C loop, so
// even on a CPU with F16C these take the portable fp16 code.
static void convert_by_7(const void *src, dsm_dtype_t st, void *dst, dsm_dtype_t dt, size_t n) {
    const size_t ss = esize(st), ds = esize(dt);
    for (size_t i = 0; i < n; i += 7)
        dsm::amp::convert(static_cast<const char *>(src) + i * ss, st, static_cast<char *>(dst) + i * ds, dt,
                          n - i < 7 ? n - i : 7);
}

// fp32 -> fp16 and bf16 through convert() against the scalar functions, at
// offsets 0, 3, 6 so that vector bodies and scalar tails both see each value,
// from FLOAT32 and from FLOAT64 (which rounds through fp32), and through the
// portable code.
static void check_from_fp32(const std::vector<float> &x, int line) {
    std::vector<uint16_t> p(x.size());
    convert_by_7(x.data(), DSM_FLOAT32, p.data(), DSM_FLOAT16, x.size());
    for (size_t i = 0; i < x.size(); ++i)
        if (p[i] != fp32_to_fp16(x[i]))
            fail_msg("line %d: portable fp16 of %08x: got %04x, expected %04x", line, float_bits(x[i]), p[i],
                     fp32_to_fp16(x[i]));
    const std::vector<double> wide(x.begin(), x.end());
    for (size_t off = 0; off < 8 && off < x.size(); off += 3) {
        const size_t n = x.size() - off;
        std::vector<uint16_t> h(n), b(n), hw(n), bw(n);
        dsm::amp::convert(x.data() + off, DSM_FLOAT32, h.data(), DSM_FLOAT16, n);
        dsm::amp::convert(x.data() + off, DSM_FLOAT32, b.data(), DSM_BFLOAT16, n);
        dsm::amp::convert(wide.data() + off, DSM_FLOAT64, hw.data(), DSM_FLOAT16, n);
        dsm::amp::convert(wide.data() + off, DSM_FLOAT64, bw.data(), DSM_BFLOAT16, n);
        for (size_t i = 0; i < n; ++i) {
            const float v = x[off + i];
            const float vw = static_cast<float>(wide[off + i]); // a signalling NaN comes back quiet
            if (h[i] != fp32_to_fp16(v))
                fail_msg("line %d: fp16 of %08x: got %04x, expected %04x", line, float_bits(v), h[i], fp32_to_fp16(v));
            if (b[i] != fp32_to_bf16(v))
                fail_msg("line %d: bf16 of %08x: got %04x, expected %04x", line, float_bits(v), b[i], fp32_to_bf16(v));
            if (hw[i] != fp32_to_fp16(vw) || bw[i] != fp32_to_bf16(vw))
                fail_msg("line %d: fp16/bf16 of fp64 %08x: got %04x/%04x", line, float_bits(v), hw[i], bw[i]);
        }
    }
}

// --- bit identity ------------------------------------------------------------------

static void test_all_fp16_patterns(void **) {
    std::vector<uint16_t> h(65536);
    for (uint32_t i = 0; i < 65536; ++i) h[i] = static_cast<uint16_t>(i);
    for (size_t off = 0; off < 8; ++off) { // vector body and tail at every alignment
        const size_t n = h.size() - off;
        std::vector<float> f(n);
        dsm::amp::convert(h.data() + off, DSM_FLOAT16, f.data(), DSM_FLOAT32, n);
        for (size_t i = 0; i < n; ++i) {
            const uint16_t v = h[off + i];
            if (float_bits(f[i]) != float_bits(fp16_to_fp32(v)))
                fail_msg("fp16 %04x: got %08x, expected %08x", v, float_bits(f[i]), float_bits(fp16_to_fp32(v)));
        }
        // Back to fp16: every value, and NaNs become 0x7e00 with their sign.
        std::vector<uint16_t> back(n);
        dsm::amp::convert(f.data(), DSM_FLOAT32, back.data(), DSM_FLOAT16, n);
        for (size_t i = 0; i < n; ++i) {
            const uint16_t v = h[off + i];
            const bool nan = (v & 0x7c00) == 0x7c00 && (v & 0x3ff) != 0;
            const uint16_t want = nan ? static_cast<uint16_t>((v & 0x8000) | 0x7e00) : v;
            if (back[i] != want) fail_msg("fp16 %04x round trip: got %04x, expected %04x", v, back[i], want);
        }
    }
    // The portable code (see convert_by_7), and fp16 -> fp64 (exact).
    std::vector<float> p(h.size());
    convert_by_7(h.data(), DSM_FLOAT16, p.data(), DSM_FLOAT32, h.size());
    for (uint32_t v = 0; v < 65536; ++v)
        if (float_bits(p[v]) != float_bits(fp16_to_fp32(static_cast<uint16_t>(v))))
            fail_msg("portable fp16 %04x: got %08x", v, float_bits(p[v]));
    std::vector<double> d(h.size());
    dsm::amp::convert(h.data(), DSM_FLOAT16, d.data(), DSM_FLOAT64, h.size());
    for (uint32_t v = 0; v < 65536; ++v) {
        const float want = fp16_to_fp32(static_cast<uint16_t>(v));
        if (std::isnan(want) ? !std::isnan(d[v]) || std::signbit(d[v]) != std::signbit(want)
                             : float_bits(static_cast<float>(d[v])) != float_bits(want))
            fail_msg("fp16 %04x to fp64: got %.17g", v, d[v]);
    }
    std::vector<uint16_t> b(h.size()); // NaN payloads included
    dsm::amp::convert(h.data(), DSM_FLOAT16, b.data(), DSM_BFLOAT16, h.size());
    for (uint32_t v = 0; v < 65536; ++v)
        if (b[v] != fp32_to_bf16(fp16_to_fp32(static_cast<uint16_t>(v)))) fail_msg("fp16 %04x to bf16: got %04x", v, b[v]);
}

static void test_all_bf16_patterns(void **) {
    std::vector<uint16_t> b(65536);
    for (uint32_t i = 0; i < 65536; ++i) b[i] = static_cast<uint16_t>(i);
    std::vector<float> f(b.size());
    dsm::amp::convert(b.data(), DSM_BFLOAT16, f.data(), DSM_FLOAT32, b.size());
    std::vector<uint16_t> back(b.size());
    dsm::amp::convert(f.data(), DSM_FLOAT32, back.data(), DSM_BFLOAT16, b.size());
    for (uint32_t v = 0; v < 65536; ++v) {
        if (float_bits(f[v]) != float_bits(bf16_to_fp32(static_cast<uint16_t>(v))) || float_bits(f[v]) != v << 16)
            fail_msg("bf16 %04x: got %08x", v, float_bits(f[v]));
        const bool nan = (v & 0x7f80) == 0x7f80 && (v & 0x7f) != 0;
        const uint32_t want = nan ? (v | 0x40) : v; // NaNs made quiet
        if (back[v] != want) fail_msg("bf16 %04x round trip: got %04x", v, back[v]);
    }
}

static void test_fp32_ties_and_specials(void **) {
    std::vector<float> x;
    auto near = [&](uint32_t u) { // u and its fp32 neighbours
        for (uint32_t d = 0; d < 3; ++d) x.push_back(bits_float(u + d - 1));
    };
    // Midpoints between consecutive fp16 values (ties), subnormal and normal,
    // both signs, up to and past the overflow threshold.
    for (uint32_t h = 0; h < 0x7c00; ++h) {
        const double mid = (fp16_to_fp32(static_cast<uint16_t>(h)) + (double)fp16_to_fp32(static_cast<uint16_t>(h + 1))) / 2;
        near(float_bits(static_cast<float>(mid)));
        near(float_bits(static_cast<float>(-mid)));
    }
    // Midpoints between consecutive bf16 values: every exponent, several mantissas.
    for (uint32_t e = 0; e < 256; ++e)
        for (uint32_t m : {0u, 1u, 2u, 63u, 64u, 126u, 127u}) {
            near((e << 23) | (m << 16) | 0x8000u);
            near(0x80000000u | (e << 23) | (m << 16) | 0x8000u);
        }
    // fp32 subnormals, fp16 subnormal range and its edges, overflow, Inf, NaN payloads.
    for (uint32_t u : {0x00000000u, 0x00000001u, 0x007fffffu, 0x00800000u, 0x33000000u, 0x33000001u, 0x337fffffu,
                       0x33800000u, 0x387fc000u, 0x387fe000u, 0x387fffffu, 0x38800000u, 0x477fe000u, 0x477fefffu,
                       0x477ff000u, 0x477fffffu, 0x47800000u, 0x7f7fffffu, 0x7f800000u, 0x7f800001u, 0x7fa00000u,
                       0x7fbfffffu, 0x7fc00000u, 0x7fe00001u, 0x7fffffffu, 0x3f800000u, 0x3f801000u, 0x3f803000u}) {
        x.push_back(bits_float(u));
        x.push_back(bits_float(u | 0x80000000u));
    }
    check_from_fp32(x, __LINE__);
}

static void test_fp32_spread(void **) {
    // About a million patterns spread over all 2^32, every exponent and sign.
    std::vector<float> x;
    for (uint64_t u = 0; u < (1ull << 32); u += 4093) x.push_back(bits_float(static_cast<uint32_t>(u)));
    std::mt19937 rng(12345);
    for (int i = 0; i < 200000; ++i) x.push_back(bits_float(static_cast<uint32_t>(rng())));
    check_from_fp32(x, __LINE__);
}

// All 2^32 fp32 inputs, from FLOAT32 and from FLOAT64: about a minute, so
// only on request.
static void test_fp32_exhaustive(void **) {
    const char *e = std::getenv("DSM_TEST_EXHAUSTIVE");
    if (e == nullptr || std::strcmp(e, "1") != 0) skip();
    const size_t chunk = size_t{1} << 24;
    std::vector<float> x(chunk);
    std::vector<double> wide(chunk);
    std::vector<uint16_t> h(chunk), b(chunk), hw(chunk), bw(chunk);
    for (uint64_t base = 0; base < (1ull << 32); base += chunk) {
        for (size_t i = 0; i < chunk; ++i) {
            x[i] = bits_float(static_cast<uint32_t>(base + i));
            wide[i] = x[i];
        }
        dsm::amp::convert(x.data(), DSM_FLOAT32, h.data(), DSM_FLOAT16, chunk);
        dsm::amp::convert(x.data(), DSM_FLOAT32, b.data(), DSM_BFLOAT16, chunk);
        dsm::amp::convert(wide.data(), DSM_FLOAT64, hw.data(), DSM_FLOAT16, chunk);
        dsm::amp::convert(wide.data(), DSM_FLOAT64, bw.data(), DSM_BFLOAT16, chunk);
        for (size_t i = 0; i < chunk; ++i) {
            const float v = x[i], vw = static_cast<float>(wide[i]);
            if (h[i] != fp32_to_fp16(v) || b[i] != fp32_to_bf16(v) || hw[i] != fp32_to_fp16(vw) ||
                bw[i] != fp32_to_bf16(vw))
                fail_msg("fp32 %08x", float_bits(v));
        }
    }
}

// --- dtype pairs ----------------------------------------------------------------------

// Values exact in every dtype, as doubles, stored in dtype t.
static void test_all_pairs(void **) {
    std::vector<double> v;
    for (int k = -255; k <= 255; ++k) // at most 8 significant bits: exact in bf16
        for (int e : {-14, -6, 0, 7}) v.push_back(std::ldexp(k, e));
    v.push_back(-0.0);
    v.push_back(std::ldexp(1.0, -24)); // fp16's smallest subnormal
    v.push_back(std::ldexp(-3.0, -20));
    v.push_back(256.0 * 255.0);
    v.push_back(std::numeric_limits<double>::infinity());
    v.push_back(-std::numeric_limits<double>::infinity());
    for (dsm_dtype_t s : kTypes)
        for (dsm_dtype_t d : kTypes) {
            const std::vector<char> src = make(s, v);
            std::vector<char> dst(v.size() * esize(d)), back(src.size());
            dsm::amp::convert(src.data(), s, dst.data(), d, v.size());
            dsm::amp::convert(dst.data(), d, back.data(), s, v.size());
            for (size_t i = 0; i < v.size(); ++i) {
                if (value_at(d, dst, i) != v[i] || std::signbit(value_at(d, dst, i)) != std::signbit(v[i]))
                    fail_msg("%d -> %d: element %zu is %g, expected %g", s, d, i, value_at(d, dst, i), v[i]);
            }
            assert_memory_equal(back.data(), src.data(), src.size());
        }
    // NaN survives every pair as a NaN.
    for (dsm_dtype_t s : kTypes)
        for (dsm_dtype_t d : kTypes) {
            const std::vector<char> src = make(s, {std::nan(""), 1.0});
            std::vector<char> dst(2 * esize(d));
            dsm::amp::convert(src.data(), s, dst.data(), d, 2);
            assert_true(std::isnan(value_at(d, dst, 0)));
            assert_true(value_at(d, dst, 1) == 1.0);
        }
}

static void test_fp64_rounding(void **) {
    // fp64 -> fp32 rounds once; fp64 -> fp16/bf16 rounds through fp32 (as
    // PyTorch does): 1 + 2^-11 + 2^-40 is 1 + 2^-11 in fp32, an fp16 tie
    // that goes to the even 1.0 (a single rounding would give 1 + 2^-10).
    const std::vector<double> x = {1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40), 0.1, -1e300, 1e-300, 65519.99};
    std::vector<float> f(x.size());
    std::vector<uint16_t> h(x.size()), b(x.size());
    dsm::amp::convert(x.data(), DSM_FLOAT64, f.data(), DSM_FLOAT32, x.size());
    dsm::amp::convert(x.data(), DSM_FLOAT64, h.data(), DSM_FLOAT16, x.size());
    dsm::amp::convert(x.data(), DSM_FLOAT64, b.data(), DSM_BFLOAT16, x.size());
    for (size_t i = 0; i < x.size(); ++i) {
        assert_true(float_bits(f[i]) == float_bits(static_cast<float>(x[i])));
        assert_int_equal(h[i], fp32_to_fp16(static_cast<float>(x[i])));
        assert_int_equal(b[i], fp32_to_bf16(static_cast<float>(x[i])));
    }
    assert_int_equal(h[0], 0x3c00);
}

static void test_copy_and_in_place(void **) {
    for (dsm_dtype_t t : kTypes) {
        std::vector<double> v(kBig);
        for (size_t i = 0; i < kBig; ++i) v[i] = static_cast<double>(i % 251) - 125.0;
        std::vector<char> src = make(t, v), dst(src.size(), 0);
        dsm::amp::convert(src.data(), t, dst.data(), t, kBig);
        assert_memory_equal(dst.data(), src.data(), src.size());
        dsm::amp::convert(src.data(), t, src.data(), t, kBig); // same pointer: nothing to do
        assert_memory_equal(dst.data(), src.data(), src.size());
    }
}

// In place only for one dtype and the same pointer; any other overlap is an
// error naming src and dst (threads would read what another already wrote).
static void test_overlap(void **) {
    std::vector<char> buf(64 * 1024, 0);
    char *p = buf.data();
    const size_t n = 1000;
    for (dsm_dtype_t s : kTypes)
        for (dsm_dtype_t d : kTypes) {
            if (s == d) {
                dsm::amp::convert(p, s, p, d, n); // a no-op
                expect_error_at([&] { dsm::amp::convert(p, s, p + esize(s), d, n); }, DSM_ERR_INVALID_ARGUMENT,
                                {"src", "dst", "overlap"}, __LINE__);
                continue;
            }
            expect_error_at([&] { dsm::amp::convert(p, s, p, d, n); }, DSM_ERR_INVALID_ARGUMENT,
                            {"src", "dst", "overlap", dsm::dtype_name(s), dsm::dtype_name(d)}, __LINE__);
            // dst's tail reaching into src, and src's tail into dst
            expect_error_at([&] { dsm::amp::convert(p + n * esize(d) - 1, s, p, d, n); },
                            DSM_ERR_INVALID_ARGUMENT, {"overlap"}, __LINE__);
            expect_error_at([&] { dsm::amp::convert(p, s, p + n * esize(s) - 1, d, n); },
                            DSM_ERR_INVALID_ARGUMENT, {"overlap"}, __LINE__);
            // adjacent is fine
            dsm::amp::convert(p, s, p + n * esize(s), d, n);
            dsm::amp::convert(p + n * esize(d), s, p, d, n);
        }
}

// --- accumulate, scale_inplace -------------------------------------------------------------

static void test_accumulate(void **) {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
    std::vector<double> v(kBig);
    for (auto &x : v) x = dist(rng);
    for (dsm_dtype_t t : kTypes) {
        const std::vector<char> src = make(t, v);
        std::vector<float> dst(kBig), want(kBig);
        for (size_t i = 0; i < kBig; ++i) dst[i] = want[i] = static_cast<float>(i % 17) - 8.0f;
        const float scale = 0.375f;
        dsm::amp::accumulate(src.data(), t, dst.data(), kBig, scale);
        for (size_t i = 0; i < kBig; ++i) {
            const float x = static_cast<float>(value_at(t, src, i)); // fp64 is narrowed first
            want[i] += scale * x;
            if (std::fabs(dst[i] - want[i]) > 1e-6f * (std::fabs(want[i]) + 1.0f))
                fail_msg("dtype %d element %zu: got %.9g, expected %.9g", t, i, dst[i], want[i]);
        }
    }
}

// accumulate_into(): into fp32 as accumulate(); into a 16-bit dst with the
// bits of widening it, accumulate() and narrowing it back (Inf, NaN and
// overflow included), from every source dtype, at offsets that put elements
// in vector bodies and tails.
static void test_accumulate_into(void **) {
    std::mt19937 rng(9);
    std::uniform_real_distribution<float> dist(-70000.0f, 70000.0f); // past fp16's range
    std::vector<double> v(kBig), d0(kBig);
    for (auto &x : v) x = dist(rng);
    for (auto &x : d0) x = dist(rng);
    v[3] = std::numeric_limits<double>::infinity();
    v[4] = std::numeric_limits<double>::quiet_NaN();
    d0[5] = -std::numeric_limits<double>::infinity();
    d0[6] = std::numeric_limits<double>::quiet_NaN();
    const float scale = 0.375f;
    for (dsm_dtype_t dt : {DSM_FLOAT32, DSM_FLOAT16, DSM_BFLOAT16})
        for (dsm_dtype_t st : kTypes)
            for (size_t off : {size_t(0), size_t(5)}) {
                const size_t n = kBig - off;
                const std::vector<char> src = make(st, v);
                std::vector<char> dst = make(dt, d0), want = dst;
                std::vector<float> wide(n);
                char *w = want.data() + off * esize(dt);
                dsm::amp::convert(w, dt, wide.data(), DSM_FLOAT32, n);
                dsm::amp::accumulate(src.data() + off * esize(st), st, wide.data(), n, scale);
                dsm::amp::convert(wide.data(), DSM_FLOAT32, w, dt, n);
                dsm::amp::accumulate_into(src.data() + off * esize(st), st, dst.data() + off * esize(dt), dt, n, scale);
                if (std::memcmp(dst.data(), want.data(), dst.size()) != 0)
                    fail_msg("accumulate_into from %s into %s at offset %zu: not the bits of widen, accumulate, "
                             "narrow", dsm::dtype_name(st), dsm::dtype_name(dt), off);
            }
    uint16_t h[2] = {0, 0};
    double f64[2] = {0, 0};
    expect_error_at([&] { dsm::amp::accumulate_into(h, DSM_FLOAT16, f64, DSM_FLOAT64, 2, 1.0f); },
                    DSM_ERR_INVALID_ARGUMENT, {"accumulate_into destination", "float64"}, __LINE__);
    expect_error_at([&] { dsm::amp::accumulate_into(h, DSM_FLOAT16, h, DSM_INT8, 2, 1.0f); },
                    DSM_ERR_INVALID_ARGUMENT, {"accumulate_into destination", "dtype 4", "int8"}, __LINE__);
    expect_error_at([&] { dsm::amp::accumulate_into(h, DSM_INT32, h, DSM_BFLOAT16, 2, 1.0f); },
                    DSM_ERR_INVALID_ARGUMENT, {"accumulate_into source", "dtype 6", "int32"}, __LINE__);
    expect_error_at([&] { dsm::amp::accumulate_into(nullptr, DSM_FLOAT32, h, DSM_BFLOAT16, 2, 1.0f); },
                    DSM_ERR_NULL_POINTER, {"src"}, __LINE__);
}

static void test_bf16_patterns_and_ties(void **);

// The bf16 conversions on every instruction set the CPU has (the vector
// kernels and the portable loops give the same bits): every bf16 pattern,
// ties, specials, the fp32 spread and accumulate_into.
static void test_bf16_every_isa(void **) {
    for (const std::string &isa : dsm::simd::available()) {
        dsm::simd::force(isa);
        assert_string_equal(dsm::amp::kernels_isa(), isa.c_str());
        test_bf16_patterns_and_ties(nullptr);
        test_accumulate_into(nullptr);
    }
    dsm::simd::force("auto");
}

static void test_scale_inplace(void **) {
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> dist(-1000.0f, 1000.0f);
    std::vector<double> v(kBig);
    for (auto &x : v) x = dist(rng);
    v[5] = std::numeric_limits<double>::infinity();
    v[6] = 60000.0; // * 2 overflows fp16
    for (dsm_dtype_t t : kTypes) {
        const std::vector<char> orig = make(t, v);
        std::vector<char> x = orig;
        const double scale = 2.0; // then 1/3: scaled in fp32 for 16/32-bit data
        dsm::amp::scale_inplace(x.data(), t, kBig, scale);
        dsm::amp::scale_inplace(x.data(), t, kBig, 1.0 / 3.0);
        for (size_t i = 0; i < kBig; ++i) {
            double want;
            const double o = value_at(t, orig, i);
            if (t == DSM_FLOAT64) {
                want = o * scale * (1.0 / 3.0);
            } else {
                const float s1 = static_cast<float>(scale), s2 = static_cast<float>(1.0 / 3.0);
                float a = static_cast<float>(o) * s1;
                if (t == DSM_FLOAT16) a = fp16_to_fp32(fp32_to_fp16(a));
                if (t == DSM_BFLOAT16) a = bf16_to_fp32(fp32_to_bf16(a));
                a *= s2;
                if (t == DSM_FLOAT16) a = fp16_to_fp32(fp32_to_fp16(a));
                if (t == DSM_BFLOAT16) a = bf16_to_fp32(fp32_to_bf16(a));
                want = a;
            }
            if (value_at(t, x, i) != want)
                fail_msg("dtype %d element %zu: got %.17g, expected %.17g", t, i, value_at(t, x, i), want);
        }
        if (t == DSM_FLOAT16) assert_true(std::isinf(value_at(t, x, 6)));
    }
}

// --- norms and non-finite checks ----------------------------------------------------------

static std::vector<float> random_floats(size_t n, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 3.0f);
    std::vector<float> x(n);
    for (auto &v : x) v = dist(rng);
    return x;
}

static void test_norm_part(void **) {
    const std::vector<float> x = random_floats(kBig * 3 + 1, 3);
    const float scale = 1.0f / 1024.0f;
    double ref = 0.0;
    for (float v : x) ref += ((double)v * scale) * ((double)v * scale);
    const dsm::amp::NormPart p = dsm::amp::norm_part(x.data(), x.size(), scale);
    assert_false(p.nonfinite);
    NEAR(p.sumsq, ref);
    for (size_t n : {size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{1000}}) {
        double r = 0.0;
        for (size_t i = 0; i < n; ++i) r += (double)x[i] * x[i] * 4.0;
        NEAR(dsm::amp::norm_part(x.data(), n, 2.0f).sumsq, r);
    }
    const dsm::amp::NormPart z = dsm::amp::norm_part(nullptr, 0, 1.0f);
    assert_true(z.sumsq == 0.0);
    assert_false(z.nonfinite);
}

// The exact bits of the norm: blocks of 32768 elements, each summed in 16
// fp64 lanes (element i in lane i % 16, the tail from lane 0) combined
// pairwise, the blocks added in order; the same for bf16 read in place as
// for its fp32 widening, on whichever vector path this CPU takes.
static double norm_reference(const std::vector<float> &x, double scale) {
    const size_t block = 32 * 1024;
    double total = 0.0;
    for (size_t at = 0; at < x.size(); at += block) {
        const size_t len = std::min(block, x.size() - at);
        double lane[16] = {};
        size_t i = 0;
        for (; i + 16 <= len; i += 16)
            for (size_t j = 0; j < 16; ++j) {
                const double v = static_cast<double>(x[at + i + j]) * scale;
                lane[j] += v * v;
            }
        for (size_t j = 0; i < len; ++i, ++j) {
            const double v = static_cast<double>(x[at + i]) * scale;
            lane[j] += v * v;
        }
        for (size_t w = 8; w >= 1; w /= 2)
            for (size_t j = 0; j < w; ++j) lane[j] += lane[j + w];
        total += lane[0];
    }
    return total;
}

static void test_norm_part_bits(void **) {
    const std::vector<float> x = random_floats(kBig * 2 + 32 * 1024 + 21, 11);
    std::vector<uint16_t> h(x.size());
    std::vector<float> wide(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
        h[i] = dsm::fp32_to_bf16(x[i]);
        wide[i] = dsm::bf16_to_fp32(h[i]);
    }
    for (size_t n : {size_t{5}, size_t{16}, size_t{37}, size_t{32 * 1024 + 3}, x.size()}) {
        const std::vector<float> a(x.begin(), x.begin() + n), b(wide.begin(), wide.begin() + n);
        const double want = norm_reference(a, 0.25), wantb = norm_reference(b, 0.25);
        const double got = dsm::amp::norm_part(a.data(), n, 0.25f).sumsq;
        const double gotb = dsm::amp::norm_part(h.data(), DSM_BFLOAT16, n, 0.25f).sumsq;
        assert_memory_equal(&got, &want, sizeof got);
        assert_memory_equal(&gotb, &wantb, sizeof gotb);
    }
}

static void test_norm_part_thread_count(void **) {
#ifdef _OPENMP
    const std::vector<float> x = random_floats(kBig * 5 + 17, 5);
    const int saved = omp_get_max_threads();
    uint64_t bits[3];
    for (int t = 1; t <= 3; ++t) {
        omp_set_num_threads(t);
        const double s = dsm::amp::norm_part(x.data(), x.size(), 0.5f).sumsq;
        std::memcpy(&bits[t - 1], &s, sizeof s);
    }
    omp_set_num_threads(saved);
    assert_true(bits[0] == bits[1]);
    assert_true(bits[0] == bits[2]);
#else
    skip();
#endif
}

static void test_norm_part_nonfinite(void **) {
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> x = random_floats(kBig, 9);
    for (size_t at : {size_t{0}, kBig / 2, kBig - 1})
        for (float bad : {inf, -inf, nan}) {
            std::vector<float> y = x;
            y[at] = bad;
            assert_true(dsm::amp::norm_part(y.data(), y.size(), 1.0f).nonfinite);
            assert_true(dsm::amp::norm_part(y.data(), y.size(), 0.0f).nonfinite); // inf * 0 is NaN
        }
    x[3] = std::numeric_limits<float>::max(); // huge but finite: no fp64 overflow
    const dsm::amp::NormPart p = dsm::amp::norm_part(x.data(), x.size(), std::numeric_limits<float>::max());
    assert_false(p.nonfinite);
    assert_true(std::isfinite(p.sumsq));
    // A non-finite scale: the flag still speaks of the data.
    assert_false(dsm::amp::norm_part(x.data(), x.size(), inf).nonfinite);
}

static void test_has_nonfinite(void **) {
    for (dsm_dtype_t t : kTypes) {
        std::vector<double> v(kBig);
        for (size_t i = 0; i < kBig; ++i) v[i] = (i % 2 ? -1.0 : 1.0) * std::ldexp(1.0, static_cast<int>(i % 30) - 20);
        v[1] = t == DSM_FLOAT16 ? 65504.0 : t == DSM_BFLOAT16 ? 3.3895313892515355e38 : 3.4028234663852886e38;
        v[2] = t == DSM_FLOAT16 ? std::ldexp(1.0, -24) : std::ldexp(1.0, -130); // subnormal
        const std::vector<char> clean = make(t, v);
        assert_false(dsm::amp::has_nonfinite(clean.data(), t, kBig));
        for (size_t at : {size_t{0}, kBig / 2, kBig - 1})
            for (double bad : {std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
                               std::nan("")}) {
                std::vector<double> w = v;
                w[at] = bad;
                const std::vector<char> buf = make(t, w);
                if (!dsm::amp::has_nonfinite(buf.data(), t, kBig)) fail_msg("dtype %d: %g at %zu not found", t, bad, at);
                assert_true(dsm::amp::has_nonfinite(buf.data() + at * esize(t), t, 1));
                if (at > 0) assert_false(dsm::amp::has_nonfinite(buf.data(), t, at)); // just before it
            }
        assert_false(dsm::amp::has_nonfinite(nullptr, t, 0));
    }
    // fp64 values outside the fp32 range are finite.
    const double big[] = {1e300, -1e300, 5e-324};
    assert_false(dsm::amp::has_nonfinite(big, DSM_FLOAT64, 3));
}

// --- arguments ----------------------------------------------------------------------------

static void test_zero_length(void **) {
    dsm::amp::convert(nullptr, DSM_FLOAT32, nullptr, DSM_FLOAT16, 0);
    dsm::amp::accumulate(nullptr, DSM_FLOAT16, nullptr, 0, 1.0f);
    dsm::amp::scale_inplace(nullptr, DSM_BFLOAT16, 0, 2.0);
    assert_false(dsm::amp::has_nonfinite(nullptr, DSM_FLOAT64, 0));
}

static void test_bf16_patterns_and_ties(void **) {
    test_all_bf16_patterns(nullptr);
    test_fp32_ties_and_specials(nullptr);
    test_fp32_spread(nullptr);
}

static void test_bad_dtype(void **) {
    float f[2] = {1, 2};
    uint16_t h[2];
    expect_error_at([&] { dsm::amp::convert(f, DSM_INT8, h, DSM_FLOAT16, 2); }, DSM_ERR_INVALID_ARGUMENT,
                    {"convert source", "dtype 4", "int8"}, __LINE__);
    expect_error_at([&] { dsm::amp::convert(f, DSM_FLOAT32, h, static_cast<dsm_dtype_t>(99), 2); },
                    DSM_ERR_INVALID_ARGUMENT, {"convert destination", "dtype 99", "invalid"}, __LINE__);
    expect_error_at([&] { dsm::amp::convert(f, DSM_INT64, h, DSM_INT64, 0); }, DSM_ERR_INVALID_ARGUMENT,
                    {"dtype 7", "int64"}, __LINE__); // checked even for n == 0
    expect_error_at([&] { dsm::amp::accumulate(h, DSM_INT32, f, 2, 1.0f); }, DSM_ERR_INVALID_ARGUMENT,
                    {"accumulate", "dtype 6", "int32"}, __LINE__);
    expect_error_at([&] { dsm::amp::scale_inplace(h, DSM_UINT8, 2, 1.0); }, DSM_ERR_INVALID_ARGUMENT,
                    {"scale_inplace", "dtype 5", "uint8"}, __LINE__);
    expect_error_at([&] { dsm::amp::has_nonfinite(h, static_cast<dsm_dtype_t>(-1), 2); }, DSM_ERR_INVALID_ARGUMENT,
                    {"has_nonfinite", "dtype -1"}, __LINE__);
    expect_error_at([&] { dsm::amp::convert(nullptr, DSM_FLOAT32, h, DSM_FLOAT16, 2); }, DSM_ERR_NULL_POINTER,
                    {"src"}, __LINE__);
}

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_fp16_patterns),
        cmocka_unit_test(test_all_bf16_patterns),
        cmocka_unit_test(test_fp32_ties_and_specials),
        cmocka_unit_test(test_fp32_spread),
        cmocka_unit_test(test_fp32_exhaustive),
        cmocka_unit_test(test_all_pairs),
        cmocka_unit_test(test_fp64_rounding),
        cmocka_unit_test(test_copy_and_in_place),
        cmocka_unit_test(test_overlap),
        cmocka_unit_test(test_accumulate),
        cmocka_unit_test(test_accumulate_into),
        cmocka_unit_test(test_bf16_every_isa),
        cmocka_unit_test(test_scale_inplace),
        cmocka_unit_test(test_norm_part),
        cmocka_unit_test(test_norm_part_thread_count),
        cmocka_unit_test(test_norm_part_bits),
        cmocka_unit_test(test_norm_part_nonfinite),
        cmocka_unit_test(test_has_nonfinite),
        cmocka_unit_test(test_zero_length),
        cmocka_unit_test(test_bad_dtype),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
