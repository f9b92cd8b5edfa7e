// Blockwise quantization (comm/quantize.hpp): round trips within the bound
// of every block on every instruction set this CPU runs, the same bits from
// every instruction set, the 16-bit forms, the fused accumulate, overflow
// reaching the output as NaN, and bad block sizes, bits and buffers.
#include "dsm_config.h"

#include "comm/quantize.hpp"
#include "comm/quantize_cuda.hpp"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/half.hpp"
#include "core/simd.hpp"

#if DSM_HAVE_CUDA_KERNELS
#include <cuda_runtime.h>
#endif

#include "quantize_test.h"

using namespace dsm::comm;

static void test_round_trip_every_isa(void **) {
    const std::vector<std::string> isas = dsm::simd::available();
    print_message("[          ] instruction sets here:");
    for (const auto &i : isas) print_message(" %s", i.c_str());
    print_message("\n");
    assert_true(!isas.empty() && isas.back() == "generic");
    for (int bits : {8, 4})
        for (size_t block : {size_t(16), size_t(64), size_t(1024), size_t(4096)})
            for (size_t n : {size_t(1), size_t(15), size_t(16), size_t(17), size_t(1000), size_t(8195)}) {
                const std::vector<float> x = sample(n, static_cast<unsigned>(n * 31 + block + bits));
                const size_t bytes = quant::packed_bytes(n, bits, block);
                assert_int_equal(bytes % 4, 0);
                std::vector<uint8_t> ref;
                for (const std::string &isa : isas) {
                    dsm::simd::force(isa);
                    std::vector<uint8_t> q(bytes + 8, 0xAB);
                    quant::quantize(x.data(), DSM_FLOAT32, n, bits, block, q.data());
                    for (size_t i = bytes; i < q.size(); ++i) assert_int_equal(q[i], 0xAB); // no overrun
                    q.resize(bytes);
                    std::vector<float> y(n + 1, -7.0f);
                    quant::dequantize(q.data(), n, bits, block, y.data(), DSM_FLOAT32, false);
                    assert_true(y[n] == -7.0f);
                    y.resize(n);
                    const std::string ctx = isa + " bits=" + std::to_string(bits) + " block=" + std::to_string(block) +
                                            " n=" + std::to_string(n);
                    check_round_trip(x, y, bits, block, ctx.c_str());
                    // Packed bits alike on every instruction set (the padding aside).
                    if (ref.empty()) ref = q;
                    else if (std::memcmp(ref.data(), q.data(), bytes) != 0)
                        fail_msg("%s: packed bytes differ from %s's", ctx.c_str(), isas.front().c_str());
                    // The fused accumulate: z + x'.
                    std::vector<float> z(n, 0.5f);
                    quant::dequantize(q.data(), n, bits, block, z.data(), DSM_FLOAT32, true);
                    for (size_t i = 0; i < n; ++i)
                        if (z[i] != 0.5f + y[i]) fail_msg("%s: accumulate at %zu", ctx.c_str(), i);
                }
            }
    dsm::simd::force("auto");
}

static void test_sixteen_bit(void **) {
    const size_t n = 3000, block = 256;
    const std::vector<float> x = sample(n, 7);
    for (dsm_dtype_t dt : {DSM_FLOAT16, DSM_BFLOAT16}) {
        std::vector<uint16_t> h(n), back(n);
        std::vector<float> xr(n), y(n);
        for (size_t i = 0; i < n; ++i) {
            h[i] = dt == DSM_FLOAT16 ? dsm::fp32_to_fp16(x[i]) : dsm::fp32_to_bf16(x[i]);
            xr[i] = dt == DSM_FLOAT16 ? dsm::fp16_to_fp32(h[i]) : dsm::bf16_to_fp32(h[i]);
        }
        std::vector<uint8_t> q(quant::packed_bytes(n, 8, block)), q32(q.size());
        quant::quantize(h.data(), dt, n, 8, block, q.data());
        quant::quantize(xr.data(), DSM_FLOAT32, n, 8, block, q32.data());
        assert_memory_equal(q.data(), q32.data(), q.size()); // the same as from the widened values
        quant::dequantize(q.data(), n, 8, block, back.data(), dt, false);
        quant::dequantize(q.data(), n, 8, block, y.data(), DSM_FLOAT32, false);
        for (size_t i = 0; i < n; ++i) {
            const uint16_t want = dt == DSM_FLOAT16 ? dsm::fp32_to_fp16(y[i]) : dsm::fp32_to_bf16(y[i]);
            assert_int_equal(back[i], want);
        }
        check_round_trip(xr, y, 8, block, dt == DSM_FLOAT16 ? "fp16" : "bf16");
    }
}

static void test_overflow_becomes_nan(void **) {
    for (const std::string &isa : dsm::simd::available()) {
        dsm::simd::force(isa);
        for (int bits : {8, 4}) {
            for (float bad : {INFINITY, -INFINITY, NAN}) {
                std::vector<float> x(64, 1.0f);
                x[37] = bad;
                std::vector<uint8_t> q(quant::packed_bytes(64, bits, 32));
                quant::quantize(x.data(), DSM_FLOAT32, 64, bits, 32, q.data());
                std::vector<float> y(64);
                quant::dequantize(q.data(), 64, bits, 32, y.data(), DSM_FLOAT32, false);
                for (size_t i = 0; i < 32; ++i) assert_true(std::fabs(y[i] - 1.0f) <= round_trip_bound(1.0f, bits));
                for (size_t i = 32; i < 64; ++i)
                    if (!std::isnan(y[i])) fail_msg("%s bits=%d: value %zu is %g, expected NaN", isa.c_str(), bits, i, y[i]);
            }
        }
    }
    dsm::simd::force("auto");
}

// Blocks the fast kernels find the largest magnitude of while they quantize
// the block before (blocks of 64 values or more): an inf, a NaN or a -inf in
// every position class (a step of 64, a step of 16, the last values), a
// block of zeros and -0, subnormals (whose 1 / amax overflows), the largest
// magnitude in the last value, a short last block. Every instruction set
// gives the portable kernel's bits, and bad blocks a NaN scale.
static void test_special_blocks_every_isa(void **) {
    for (int bits : {8, 4})
        for (size_t block : {size_t(64), size_t(80), size_t(1024), size_t(1040)}) {
            const size_t n = 7 * block + 37, nb = (n + block - 1) / block;
            std::vector<float> x = sample(n, static_cast<unsigned>(block + bits));
            x[block + 3] = INFINITY;                  // block 1, in a step of 64
            x[3 * block - 1] = NAN;                   // block 2, its last value
            for (size_t i = 3 * block; i < 4 * block; ++i) x[i] = i % 3 ? 0.0f : -0.0f; // block 3
            for (size_t i = 4 * block; i < 5 * block; ++i) x[i] = (i % 2 ? 1.0f : -1.0f) * 1e-45f * static_cast<float>(i % 7);
            x[5 * block - 1] = -3e-44f;               // block 4's largest, last
            x[6 * block - 10] = 1e30f;                // block 5's largest, past the steps of 64 where block % 64
            x[6 * block + 1] = -INFINITY;             // block 6
            x[n - 1] = NAN;                           // the short last block
            const size_t bytes = quant::packed_bytes(n, bits, block);
            std::vector<uint8_t> ref;
            for (const std::string &isa : dsm::simd::available()) {
                dsm::simd::force(isa);
                std::vector<uint8_t> q(bytes + 8, 0xAB);
                quant::quantize(x.data(), DSM_FLOAT32, n, bits, block, q.data());
                for (size_t i = bytes; i < q.size(); ++i) assert_int_equal(q[i], 0xAB);
                q.resize(bytes);
                const std::string ctx = isa + " bits=" + std::to_string(bits) + " block=" + std::to_string(block);
                std::vector<float> s(nb);
                std::memcpy(s.data(), q.data(), nb * 4);
                for (size_t k = 0; k < nb; ++k) {
                    bool bad = false;
                    for (size_t i = k * block; i < std::min(n, (k + 1) * block); ++i) bad = bad || !std::isfinite(x[i]);
                    if (bad != std::isnan(s[k])) fail_msg("%s: block %zu has scale %g", ctx.c_str(), k, s[k]);
                }
                if (s[3] != 0.0f) fail_msg("%s: the zero block has scale %g", ctx.c_str(), s[3]);
                if (s[4] != 3e-44f / (bits == 8 ? 127.0f : 7.0f))
                    fail_msg("%s: the subnormal block has scale %g", ctx.c_str(), s[4]);
                if (ref.empty()) ref = q;
                else if (std::memcmp(ref.data(), q.data(), bytes) != 0)
                    fail_msg("%s: packed bytes differ from %s's", ctx.c_str(), dsm::simd::available().front().c_str());
            }
            // The portable kernel among them.
            assert_true(dsm::simd::available().back() == "generic");
        }
    dsm::simd::force("auto");
}

// dequantize_add (out = add + x', in one pass) and dequantize_part (a range
// of blocks) give the bits of dequantize() on every instruction set.
static void test_add_and_part(void **) {
    const size_t n = 5000 + 7, block = 256;
    const std::vector<float> x = sample(n, 11), base = sample(n, 12);
    for (int bits : {8, 4})
        for (const std::string &isa : dsm::simd::available()) {
            dsm::simd::force(isa);
            const std::string ctx = isa + " bits=" + std::to_string(bits);
            std::vector<uint8_t> q(quant::packed_bytes(n, bits, block));
            quant::quantize(x.data(), DSM_FLOAT32, n, bits, block, q.data());
            std::vector<float> y(n), z(n, -1.0f), w(n + 1, -7.0f);
            quant::dequantize(q.data(), n, bits, block, y.data(), DSM_FLOAT32, false);
            quant::dequantize_add(q.data(), n, bits, block, base.data(), z.data());
            for (size_t i = 0; i < n; ++i)
                if (z[i] != base[i] + y[i]) fail_msg("%s: dequantize_add at %zu", ctx.c_str(), i);
            // Parts of 3 blocks and the short tail, into place.
            for (size_t from = 0; from < n; from += 3 * block)
                quant::dequantize_part(q.data(), n, bits, block, from, std::min(3 * block, n - from), w.data() + from,
                                       DSM_FLOAT32);
            assert_true(w[n] == -7.0f);
            if (std::memcmp(w.data(), y.data(), n * sizeof(float)) != 0)
                fail_msg("%s: dequantize_part differs from dequantize", ctx.c_str());
            // bf16: the same as dequantize() into bf16.
            std::vector<uint16_t> h(n), hp(n);
            quant::dequantize(q.data(), n, bits, block, h.data(), DSM_BFLOAT16, false);
            quant::dequantize_part(q.data(), n, bits, block, block, n - block, hp.data() + block, DSM_BFLOAT16);
            if (std::memcmp(h.data() + block, hp.data() + block, (n - block) * 2) != 0)
                fail_msg("%s: dequantize_part (bf16) differs from dequantize", ctx.c_str());
        }
    dsm::simd::force("auto");
}

static void test_bad_arguments(void **) {
    float x[32] = {0};
    uint8_t q[256];
    for (size_t block : {size_t(0), size_t(8), size_t(24), size_t(100), (size_t(1) << 20) + 16})
        expect_error_at([&] { quant::quantize(x, DSM_FLOAT32, 32, 8, block, q); }, DSM_ERR_INVALID_ARGUMENT,
                        {"block size " + std::to_string(block), "multiple of 16"}, __LINE__);
    expect_error_at([&] { quant::dequantize(q, 32, 8, 100, x, DSM_FLOAT32, false); }, DSM_ERR_INVALID_ARGUMENT,
                    {"block size 100"}, __LINE__);
    expect_error_at([&] { quant::quantize(x, DSM_FLOAT32, 32, 3, 16, q); }, DSM_ERR_INVALID_ARGUMENT,
                    {"3 bits"}, __LINE__);
    expect_error_at([&] { quant::quantize(x, DSM_INT32, 32, 8, 16, q); }, DSM_ERR_INVALID_ARGUMENT, {"dtype"},
                    __LINE__);
    expect_error_at([&] { quant::quantize(nullptr, DSM_FLOAT32, 32, 8, 16, q); }, DSM_ERR_NULL_POINTER, {"NULL"},
                    __LINE__);
    expect_error_at([&] { quant::dequantize(q, 32, 8, 16, x, DSM_FLOAT16, true); }, DSM_ERR_INVALID_ARGUMENT,
                    {"FLOAT32"}, __LINE__);
    expect_error_at([&] { quant::dequantize_part(q, 32, 8, 16, 8, 16, x, DSM_FLOAT32); }, DSM_ERR_INVALID_ARGUMENT,
                    {"values 8 to 24 of 32"}, __LINE__);
    expect_error_at([&] { quant::dequantize_part(q, 32, 8, 16, 16, 17, x, DSM_FLOAT32); }, DSM_ERR_INVALID_ARGUMENT,
                    {"values 16 to 33 of 32"}, __LINE__);
    expect_error_at([&] { quant::dequantize_add(q, 32, 8, 16, nullptr, x); }, DSM_ERR_NULL_POINTER, {"NULL"},
                    __LINE__);
    expect_error_at([&] { quant::dequantize_add(q, 32, 8, 24, x, x); }, DSM_ERR_INVALID_ARGUMENT, {"block size 24"},
                    __LINE__);
    expect_error_at([] { dsm::simd::force("bogus"); }, DSM_ERR_INVALID_ARGUMENT, {"\"bogus\""}, __LINE__);
    // The environment's block sizes.
    setenv("DSM_QWZ_BLOCK", "1000", 1);
    expect_error_at([] { quant::weight_block(); }, DSM_ERR_INVALID_ARGUMENT, {"DSM_QWZ_BLOCK", "1000"}, __LINE__);
    setenv("DSM_QWZ_BLOCK", "2048", 1);
    assert_int_equal(quant::weight_block(), 2048);
    unsetenv("DSM_QWZ_BLOCK");
    assert_int_equal(quant::weight_block(), quant::kWeightBlock);
    setenv("DSM_QGZ_BLOCK", "0", 1);
    expect_error_at([] { quant::gradient_block(); }, DSM_ERR_INVALID_ARGUMENT, {"DSM_QGZ_BLOCK", "block size 0"},
                    __LINE__);
    unsetenv("DSM_QGZ_BLOCK");
    assert_int_equal(quant::gradient_block(), quant::kGradientBlock);
    // Sizes.
    assert_int_equal(quant::packed_bytes(0, 8, 16), 0);
    assert_int_equal(quant::packed_bytes(17, 8, 16), 2 * 4 + 20);
    assert_int_equal(quant::packed_bytes(17, 4, 16), 2 * 4 + 12);
    assert_int_equal(quant::packed_bytes(4096, 4, 1024), 4 * 4 + 2048);
}

// The CUDA kernels against the host's, bit for bit (skipped without a device).
static void test_device_kernels(void **) {
#if DSM_HAVE_CUDA_KERNELS
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        print_message("[          ] no CUDA device: the device kernels are not run\n");
        skip();
        return;
    }
    for (int bits : {8, 4})
        for (size_t n : {size_t(1), size_t(17), size_t(5000), size_t(1) << 20}) {
            const size_t block = bits == 8 ? 4096 : 1024;
            const std::vector<float> x = sample(n, static_cast<unsigned>(n + bits));
            const size_t bytes = quant::packed_bytes(n, bits, block);
            std::vector<uint8_t> host(bytes, 0), dev(bytes, 0);
            quant::quantize(x.data(), DSM_FLOAT32, n, bits, block, host.data());
            float *dx = nullptr, *dy = nullptr;
            void *dq = nullptr;
            assert_int_equal(cudaMalloc(reinterpret_cast<void **>(&dx), n * 4), cudaSuccess);
            assert_int_equal(cudaMalloc(reinterpret_cast<void **>(&dy), n * 4), cudaSuccess);
            assert_int_equal(cudaMalloc(&dq, bytes), cudaSuccess);
            cudaMemset(dq, 0, bytes);
            cudaMemcpy(dx, x.data(), n * 4, cudaMemcpyHostToDevice);
            quant::cuda::quantize(dx, n, bits, block, dq, nullptr);
            cudaMemcpy(dev.data(), dq, bytes, cudaMemcpyDeviceToHost);
            assert_memory_equal(host.data(), dev.data(), bytes);
            std::vector<float> y(n, 0.25f), yd(n, 0.25f);
            cudaMemcpy(dy, yd.data(), n * 4, cudaMemcpyHostToDevice);
            quant::dequantize(host.data(), n, bits, block, y.data(), DSM_FLOAT32, true);
            quant::cuda::dequantize(dq, n, bits, block, dy, true, nullptr);
            cudaMemcpy(yd.data(), dy, n * 4, cudaMemcpyDeviceToHost);
            assert_memory_equal(y.data(), yd.data(), n * 4);
            cudaFree(dx);
            cudaFree(dy);
            cudaFree(dq);
        }
    float *p = nullptr;
    expect_error_at([&] { quant::cuda::quantize(p, 16, 8, 24, p, nullptr); }, DSM_ERR_INVALID_ARGUMENT,
                    {"block size 24"}, __LINE__);
#else
    print_message("[          ] built without the CUDA kernels\n");
    skip();
#endif
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_every_isa),
        cmocka_unit_test(test_sixteen_bit),
        cmocka_unit_test(test_overflow_becomes_nan),
        cmocka_unit_test(test_special_blocks_every_isa),
        cmocka_unit_test(test_add_and_part),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_device_kernels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
