// The backends' elementwise reductions (comm/reduce.hpp) against a scalar
// reference, bit for bit: every dtype and op, one to five sources combined
// left to right, lengths around the 1024-element blocks and past the size
// where the result is written with streaming stores, dst one of the sources,
// and the special values (Inf, NaN, signed zeros, subnormals, fp16
// overflow, rounding ties). The loops are cloned per instruction set; the
// one this CPU runs must give the reference's bits.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "comm/reduce.hpp"
#include "core/dtype.hpp"
#include "core/half.hpp"
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
    float acc = static_cast<float>(value_at(t, srcs[0], i));
    for (size_t k = 1; k < srcs.size(); ++k) acc = combine(op, acc, static_cast<float>(value_at(t, srcs[k], i)));
    if (t == DSM_FLOAT32) {
        std::memcpy(out, &acc, 4);
        return;
    }
    const uint16_t h = t == DSM_FLOAT16 ? dsm::fp32_to_fp16(acc) : dsm::fp32_to_bf16(acc);
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
            fail_msg("line %d: %s %s of %zu sources, %zu elements%s: element %zu is %.9g, expected %.9g", line,
                     dsm::dtype_name(t), op_name(op), nsrc, n, in_place ? " in place" : "", i, value_at(t, got, i),
                     value_at(t, want, i));
}

const dsm_dtype_t kTypes[] = {DSM_FLOAT32, DSM_FLOAT64, DSM_FLOAT16, DSM_BFLOAT16};
const Op kOps[] = {Op::SUM, Op::MAX, Op::MIN};

} // namespace

static void test_every_type_and_op(void **) {
    for (dsm_dtype_t t : kTypes)
        for (Op op : kOps)
            for (size_t nsrc = 1; nsrc <= 5; ++nsrc)
                for (size_t n : {size_t(1), size_t(15), size_t(1024), size_t(3077)}) {
                    check(t, op, nsrc, n, false, __LINE__);
                    check(t, op, nsrc, n, true, __LINE__);
                }
}

// Past 8 MiB of output the stores stream (non-temporal), then fence.
static void test_streaming_lengths(void **) {
    for (dsm_dtype_t t : {DSM_BFLOAT16, DSM_FLOAT16, DSM_FLOAT32}) {
        const size_t n = (size_t(8) << 20) / esize(t) + 1029;
        check(t, Op::SUM, 2, n, false, __LINE__);
        check(t, Op::SUM, 3, n, true, __LINE__);
    }
}

// reduce_into: inout = in op inout, the MPI user operation's order.
static void test_reduce_into(void **) {
    for (dsm_dtype_t t : kTypes)
        for (Op op : kOps) {
            const size_t n = 2053;
            const std::vector<char> in = make(t, values(n, 3)), inout0 = make(t, values(n, 4));
            std::vector<char> inout = inout0, want(n * esize(t));
            for (size_t i = 0; i < n; ++i) reference_at(t, op, {in, inout0}, i, want.data() + i * esize(t));
            dsm::comm::reduce_into(inout.data(), in.data(), n, t, op);
            if (inout != want) fail_msg("reduce_into %s %s: not the reference's bits", dsm::dtype_name(t), op_name(op));
        }
}

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_type_and_op),
        cmocka_unit_test(test_streaming_lengths),
        cmocka_unit_test(test_reduce_into),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
