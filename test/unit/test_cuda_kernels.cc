// The CUDA kernels (src/optim/kernels_cuda.cu) against the CPU: the optimizer
// updates against the portable CPU kernels (optim::generic) given the same
// constants, bit for bit, for fp32, fp16 and bf16 gradients, with and
// without the 16-bit copy of p; Adam end to end against optim::adam_update;
// Lamb's two passes; the conversions against core/half.hpp bit for bit
// (every 16-bit pattern, rounding ties, subnormals, Inf, NaN); inspect()
// against amp::norm_part and its overflow flag; the Ulysses copies against
// an index-by-index reference; the multi-tensor launches against the
// per-tensor kernels (a list of 600 tiny tensors and odd sizes, every dtype,
// weight decay flags, zeroing, Inf and NaN gradients), the optimizer's fused
// device step against its plain one, and amp's one-launch accumulation
// against accumulate_into piece by piece. Sizes 1, 3, 1023 and 2^20 + 5, at offsets
// that take the vector path (all arrays equally misaligned) and the scalar
// path (misalignments that differ), with guard elements around each array.
//
// Bit-exact because the kernels perform the CPU kernels' operations in the
// same order with the same rounding (no FMA: see optim/kernels_cuda.hpp). The one
// exception is a sum over many elements (inspect, Lamb's norms): the GPU
// adds the same terms in another order, so it is checked against the bound
// of any summation order, |gpu - cpu| <= 2 n 2^-53 sum (both are sums of
// the same n nonnegative terms, each within gamma(n - 1) < n 2^-53 of the
// exact sum whatever the order of the additions), and
// for the same bits on every run and at another address.
//
// Without a usable device (cudaGetDeviceCount fails or finds none, or the
// kernels were not built for its architecture) every device test is
// skipped, with the reason printed once; the argument checks, which need no
// device, always run.
#include "dsm_config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <cstring>
#include <string>
#include <vector>

#if DSM_HAVE_CUDA_KERNELS
#include <cuda_runtime.h>

#include "amp/convert.hpp"
#include "amp/math.hpp"
#include "device/space.hpp"
#include "core/error.hpp"
#include "core/half.hpp"
#include "optim/kernels_cuda.hpp"
#include "optim/kernels.hpp"
#include "optim/optimizer.hpp"
#include "core/simd.hpp"
#include "sp/geometry.hpp"
#endif

#include "cxx_test.h" // last: CMocka's fail() macro would break the C++ headers

#if !DSM_HAVE_CUDA_KERNELS

static void test_not_built(void **state) {
    (void)state;
    print_message("test_cuda_kernels: libdsm was built without the CUDA kernels: skipped\n");
    skip();
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_not_built)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#else

using dsm::bf16_to_fp32;
using dsm::bits_float;
using dsm::float_bits;
using dsm::fp16_to_fp32;
using dsm::fp32_to_bf16;
using dsm::fp32_to_fp16;
using dsm::cuda::Flat;
using dsm::cuda::Reduction;

namespace {

// ---------------------------------------------------------------- device

#define CUDA_OK(call) cuda_ok((call), #call, __LINE__)
void cuda_ok(cudaError_t e, const char *what, int line) {
    if (e != cudaSuccess) fail_msg("line %d: %s: %s", line, what, cudaGetErrorString(e));
}

// Device memory, freed at scope exit (not after a failed check: CMocka
// leaves the test by longjmp).
struct Dev {
    void *p = nullptr;
    explicit Dev(size_t bytes) { CUDA_OK(cudaMalloc(&p, bytes > 0 ? bytes : 1)); }
    ~Dev() { cudaFree(p); }
    Dev(const Dev &) = delete;
    Dev &operator=(const Dev &) = delete;
    template <class T> T *at(size_t elements) { return static_cast<T *>(p) + elements; }
};

// Uploads go through the legacy default stream (cudaMemcpy, cudaMemset),
// which may return before the data has landed; every test calls uploaded()
// before it launches work on g_stream.
template <class T> void put(T *dev, const std::vector<T> &h) {
    CUDA_OK(cudaMemcpy(dev, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
}
void uploaded() { CUDA_OK(cudaDeviceSynchronize()); }
template <class T> std::vector<T> get(const T *dev, size_t n) {
    std::vector<T> h(n);
    CUDA_OK(cudaMemcpy(h.data(), dev, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}

cudaStream_t g_stream = nullptr;

void sync() { CUDA_OK(cudaStreamSynchronize(g_stream)); }

bool contains(const std::string &s, const char *part) { return s.find(part) != std::string::npos; }

// Why the device tests cannot run here; empty when they can. Decided once.
std::string find_no_device_reason() {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) return std::string("cudaGetDeviceCount failed: ") + cudaGetErrorString(e);
    if (count == 0) return "cudaGetDeviceCount found no device";
    cudaError_t s = cudaStreamCreate(&g_stream);
    if (s != cudaSuccess) return std::string("cudaStreamCreate failed: ") + cudaGetErrorString(s);
    // One conversion: a device the kernels were not compiled for (NVCCFLAGS)
    // has no kernel image to run.
    void *buf = nullptr;
    s = cudaMalloc(&buf, 16);
    if (s != cudaSuccess) return std::string("cudaMalloc failed: ") + cudaGetErrorString(s);
    std::string why;
    try {
        dsm::cuda::convert(buf, DSM_FLOAT32, static_cast<char *>(buf) + 8, DSM_FLOAT16, 1, g_stream);
        s = cudaStreamSynchronize(g_stream);
        if (s == cudaErrorNoKernelImageForDevice || s == cudaErrorUnsupportedPtxVersion)
            why = std::string("the kernels do not run on device 0: ") + cudaGetErrorString(s);
    } catch (const dsm::Error &err) {
        const std::string m = err.message();
        if (contains(m, cudaGetErrorString(cudaErrorNoKernelImageForDevice)) ||
            contains(m, cudaGetErrorString(cudaErrorUnsupportedPtxVersion)))
            why = "the kernels do not run on device 0: " + m;
    }
    cudaFree(buf);
    return why;
}

const std::string &no_device_reason() {
    static const std::string why = find_no_device_reason();
    return why;
}

bool g_told = false;

// Skips the calling test when there is no usable device (the reason printed once).
#define NEED_DEVICE()                                                                                              \
    do {                                                                                                           \
        if (!no_device_reason().empty()) {                                                                         \
            if (!g_told)                                                                                           \
                print_message("test_cuda_kernels: no usable CUDA device (%s): device tests skipped\n",            \
                              no_device_reason().c_str());                                                         \
            g_told = true;                                                                                         \
            skip();                                                                                                \
        }                                                                                                          \
    } while (0)

// Whether the portable CPU kernels round a * b + c twice, as the GPU kernels
// do. They do unless libdsm was compiled with FMA contraction (-march=native
// or -mfma with GCC's default -ffp-contract=fast): then bit-exact comparison
// is not possible. a = b = 1 + 2^-12, c = -(1 + 2^-11): a * b rounds to
// 1 + 2^-11 (a tie, to even), so twice-rounded gives 0 and a fused
// multiply-add 2^-24; 9 elements reach the vector body and the scalar tail.
bool cpu_kernels_unfused() {
    dsm::optim::SgdK k{};
    k.mode = 0;
    k.scale = 1.0f;
    k.neg_lr = 1.0f + std::ldexp(1.0f, -12);
    std::vector<float> p(9, -(1.0f + std::ldexp(1.0f, -11))), g(9, 1.0f + std::ldexp(1.0f, -12));
    dsm::optim::kernels<dsm::simd::Isa::generic>()->sgd(k, p.data(), g.data(), nullptr, p.size());
    for (float x : p)
        if (x != 0.0f) return false;
    return true;
}

#define NEED_UNFUSED_CPU()                                                                                         \
    do {                                                                                                           \
        if (!cpu_kernels_unfused()) {                                                                              \
            print_message("test_cuda_kernels: the portable CPU kernels were compiled with FMA contraction: "      \
                          "bit-exact comparison impossible, skipped\n");                                           \
            skip();                                                                                                \
        }                                                                                                          \
    } while (0)

// ---------------------------------------------------------------- data

// Deterministic uniform floats in [-1, 1).
struct Rng {
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
    uint64_t bits() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        return s;
    }
    float next() { return static_cast<float>(static_cast<double>(bits() >> 40) / 8388608.0 - 1.0); }
};

// Uniform in [lo, hi), with an fp32 subnormal every 61st element (so that a
// device that flushes subnormals shows) and a zero every 53rd, at the same
// places in every array (Lion's sign(0), sqrt(0), 0 / eps); signed when lo < 0.
std::vector<float> random_vec(size_t n, uint64_t seed, float lo, float hi) {
    Rng r(seed);
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) {
        const float u = 0.5f * (r.next() + 1.0f);
        const float sign = lo < 0.0f && (i / 53 + i / 61) % 2 ? -1.0f : 1.0f;
        v[i] = lo + (hi - lo) * u;
        if (i % 61 == 60) v[i] = sign * 1e-40f * (1.0f + u);
        if (i % 53 == 52) v[i] = sign * 0.0f;
    }
    return v;
}

size_t esize(dsm_dtype_t t) { return t == DSM_FLOAT32 ? 4 : 2; }

const char *tname(dsm_dtype_t t) { return t == DSM_FLOAT32 ? "fp32" : t == DSM_FLOAT16 ? "fp16" : "bf16"; }

uint16_t narrow(dsm_dtype_t t, float x) { return t == DSM_FLOAT16 ? fp32_to_fp16(x) : fp32_to_bf16(x); }
float widen(dsm_dtype_t t, uint16_t h) { return t == DSM_FLOAT16 ? fp16_to_fp32(h) : bf16_to_fp32(h); }

// A gradient in one dtype: its bytes for the device and its exact fp32 values
// for the CPU.
struct Grad {
    std::vector<unsigned char> bytes;
    std::vector<float> ref;
};
Grad make_grad(const std::vector<float> &g, dsm_dtype_t t) {
    Grad out;
    out.bytes.resize(g.size() * esize(t));
    out.ref = g;
    if (t != DSM_FLOAT32) {
        for (size_t i = 0; i < g.size(); ++i) {
            const uint16_t h = narrow(t, g[i]);
            std::memcpy(out.bytes.data() + 2 * i, &h, 2);
            out.ref[i] = widen(t, h);
        }
    } else {
        std::memcpy(out.bytes.data(), g.data(), g.size() * 4);
    }
    return out;
}

const size_t kSizes[] = {1, 3, 1023, (size_t{1} << 20) + 5};
const size_t kGuard = 8; // elements before (at most 3 used by offsets) and after each array

// Offsets of an update's arrays, in elements: (1, 1) and (3, 3) misalign all
// arrays alike (scalar head, then vectors); (2, 3) gives the gradient
// another misalignment (all scalar).
struct Offsets {
    size_t arrays, grad;
};
const Offsets kOffsets[] = {{0, 0}, {1, 1}, {3, 3}, {2, 3}};

const uint32_t kSentinel = 0x7fc0dead; // a NaN no kernel writes

struct Case {
    size_t n;
    Offsets off;
    dsm_dtype_t g_type;
    bool copy;
    dsm_dtype_t p16_type;
};

std::string describe(const Case &c) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "n %zu, offsets %zu/%zu, %s gradient, %s", c.n, c.off.arrays, c.off.grad,
                  tname(c.g_type), c.copy ? (c.p16_type == DSM_FLOAT16 ? "fp16 copy" : "bf16 copy") : "no copy");
    return buf;
}

// Every size and offset; every gradient dtype and copy with `all`, else
// those rotated through the cases.
std::vector<Case> cases(bool all) {
    const dsm_dtype_t gt[] = {DSM_FLOAT32, DSM_FLOAT16, DSM_BFLOAT16};
    std::vector<Case> out;
    int rot = 0;
    for (size_t n : kSizes)
        for (const Offsets &o : kOffsets) {
            if (all) {
                for (dsm_dtype_t g : gt)
                    for (int c = 0; c < 3; ++c)
                        out.push_back({n, o, g, c > 0, c == 2 ? DSM_BFLOAT16 : DSM_FLOAT16});
            } else {
                out.push_back({n, o, gt[rot % 3], rot % 3 != 1, (rot / 3) % 2 ? DSM_BFLOAT16 : DSM_FLOAT16});
                ++rot;
            }
        }
    return out;
}

void same_floats(const std::vector<float> &got, const std::vector<float> &want, size_t from, const char *what,
                 const std::string &where, int line) {
    for (size_t i = 0; i < want.size(); ++i)
        if (float_bits(got[from + i]) != float_bits(want[i]))
            fail_msg("line %d: %s [%s]: element %zu: got %.9g (%08x), expected %.9g (%08x)", line, what,
                     where.c_str(), i, got[from + i], float_bits(got[from + i]), want[i], float_bits(want[i]));
}

void same_halves(const std::vector<uint16_t> &got, const std::vector<uint16_t> &want, size_t from, const char *what,
                 const std::string &where, int line) {
    for (size_t i = 0; i < want.size(); ++i)
        if (got[from + i] != want[i])
            fail_msg("line %d: %s [%s]: element %zu: got %04x, expected %04x", line, what, where.c_str(), i,
                     got[from + i], want[i]);
}

// The guard elements of a float buffer still hold the sentinel.
void guards_intact(const std::vector<float> &buf, size_t off, size_t n, const char *what, const std::string &where,
                   int line) {
    for (size_t i = 0; i < buf.size(); ++i)
        if ((i < off || i >= off + n) && float_bits(buf[i]) != kSentinel)
            fail_msg("line %d: %s [%s]: guard element %zu (array at %zu, %zu long) overwritten", line, what,
                     where.c_str(), i, off, n);
}

std::vector<float> with_guards(const std::vector<float> &x, size_t off) {
    std::vector<float> b(x.size() + 2 * kGuard, bits_float(kSentinel));
    std::copy(x.begin(), x.end(), b.begin() + static_cast<long>(off));
    return b;
}

// ---------------------------------------------------------------- updates

using CpuUpdate = std::function<void(float *p, const float *g, float *s0, float *s1, size_t n)>;
using GpuUpdate = std::function<void(const Flat &f, float *s0, float *s1)>;

struct Update {
    const char *name;
    int states;
    float s0_lo, s0_hi, s1_lo, s1_hi; // state ranges (second moments and sums are >= 0)
    CpuUpdate cpu;
    GpuUpdate gpu;
};

// One update on the CPU (portable kernels) and on the device, over `cases`;
// p, the states and the 16-bit copy compared bit for bit, guards checked.
void check_update(const Update &u, const std::vector<Case> &cs, int line) {
    uint64_t seed = 1;
    for (const Case &c : cs) {
        const std::string where = std::string(u.name) + ", " + describe(c);
        const size_t n = c.n, off = c.off.arrays, goff = c.off.grad;
        std::vector<float> p = random_vec(n, ++seed, -1.0f, 1.0f);
        std::vector<float> s0 = random_vec(n, ++seed, u.s0_lo, u.s0_hi);
        std::vector<float> s1 = random_vec(n, ++seed, u.s1_lo, u.s1_hi);
        const Grad g = make_grad(random_vec(n, ++seed, -1024.0f, 1024.0f), c.g_type);

        // Device: p, the states and the copy in buffers with guards around them.
        Dev dp((n + 2 * kGuard) * 4), ds0((n + 2 * kGuard) * 4), ds1((n + 2 * kGuard) * 4);
        Dev dg((n + 2 * kGuard) * 4), dc((n + 2 * kGuard) * 2);
        put(dp.at<float>(0), with_guards(p, off));
        put(ds0.at<float>(0), with_guards(s0, off));
        put(ds1.at<float>(0), with_guards(s1, off));
        CUDA_OK(cudaMemcpy(static_cast<unsigned char *>(dg.p) + goff * esize(c.g_type), g.bytes.data(), g.bytes.size(),
                           cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemset(dc.p, 0xff, (n + 2 * kGuard) * 2));
        Flat f;
        f.p = dp.at<float>(off);
        f.g = static_cast<unsigned char *>(dg.p) + goff * esize(c.g_type);
        f.g_type = c.g_type;
        f.p16 = c.copy ? dc.at<uint16_t>(off) : nullptr;
        f.p16_type = c.p16_type;
        f.n = n;
        uploaded();
        u.gpu(f, u.states > 0 ? ds0.at<float>(off) : nullptr, u.states > 1 ? ds1.at<float>(off) : nullptr);
        sync();

        u.cpu(p.data(), g.ref.data(), s0.data(), s1.data(), n);
        const std::vector<float> gp = get(dp.at<float>(0), n + 2 * kGuard);
        same_floats(gp, p, off, "p", where, line);
        guards_intact(gp, off, n, "p", where, line);
        const std::vector<float> g0 = get(ds0.at<float>(0), n + 2 * kGuard);
        const std::vector<float> g1 = get(ds1.at<float>(0), n + 2 * kGuard);
        if (u.states > 0) same_floats(g0, s0, off, "state 0", where, line);
        if (u.states > 1) same_floats(g1, s1, off, "state 1", where, line);
        guards_intact(g0, off, n, "state 0", where, line);
        guards_intact(g1, off, n, "state 1", where, line);
        const std::vector<uint16_t> gc = get(dc.at<uint16_t>(0), n + 2 * kGuard);
        for (size_t i = 0; i < gc.size(); ++i) {
            const bool inside = c.copy && i >= off && i < off + n;
            const uint16_t want = inside ? narrow(c.p16_type, p[i - off]) : 0xffff;
            if (gc[i] != want)
                fail_msg("line %d: p16 [%s]: element %zu of the buffer: got %04x, expected %04x", line, where.c_str(),
                         i, gc[i], want);
        }
    }
}

const dsm::optim::Kernels &cpu() { return *dsm::optim::kernels<dsm::simd::Isa::generic>(); }

// AdamK as optimizer.cc's adam_k() makes it.
dsm::optim::AdamK adam_constants(const dsm::optim::Hyper &h, const dsm::optim::StepArgs &a, bool decay) {
    const double wd = decay ? h.weight_decay : 0.0;
    const double b2 = a.beta2 >= 0 ? a.beta2 : h.beta2;
    const double bc1 = h.bias_correction ? 1.0 - std::pow(a.beta1, static_cast<double>(a.step)) : 1.0;
    const double bc2 = h.bias_correction ? 1.0 - std::pow(b2, static_cast<double>(a.step)) : 1.0;
    dsm::optim::AdamK k{};
    k.b1 = static_cast<float>(a.beta1);
    k.omb1 = static_cast<float>(1.0 - a.beta1);
    k.b2 = static_cast<float>(b2);
    k.omb2 = static_cast<float>(1.0 - b2);
    k.eps = static_cast<float>(h.eps);
    k.step = static_cast<float>(-a.lr / bc1);
    k.ibc2 = static_cast<float>(1.0 / std::sqrt(bc2));
    k.l2 = h.adam_w_mode ? 0.0f : static_cast<float>(wd);
    k.decay = h.adam_w_mode ? static_cast<float>(-a.lr * wd) : 0.0f;
    k.scale = a.grad_scale;
    k.torch = h.torch_adam ? 1 : 0;
    k.keep = h.adam_w_mode ? static_cast<float>(1.0 - a.lr * wd) : 1.0f;
    k.bc2s = static_cast<float>(std::sqrt(bc2));
    return k;
}

Update adam_update_of(const dsm::optim::AdamK &k) {
    return Update{"adam", 2, -0.1f, 0.1f, 0.0f, 0.01f,
                  [k](float *p, const float *g, float *m, float *v, size_t n) { cpu().adam(k, p, g, m, v, n); },
                  [k](const Flat &f, float *m, float *v) { dsm::cuda::adam(k, f, m, v, g_stream); }};
}

// AdamW (decoupled decay, bias correction) and Adam with L2 decay and no
// bias correction, each in DeepSpeed's and in PyTorch's order (torch_adam):
// every constant of AdamK at work.
void test_adam(void **state) {
    (void)state;
    NEED_DEVICE();
    NEED_UNFUSED_CPU();
    dsm::optim::Hyper h;
    h.lr = 1e-3;
    h.weight_decay = 0.01;
    dsm::optim::StepArgs a;
    a.step = 3;
    a.lr = 1e-3;
    a.grad_scale = 1.0f / 1024.0f;
    for (bool torch : {false, true}) {
        h.torch_adam = torch;
        h.adam_w_mode = true;
        h.bias_correction = true;
        check_update(adam_update_of(adam_constants(h, a, true)), cases(true), __LINE__);
        h.adam_w_mode = false;
        h.bias_correction = false;
        check_update(adam_update_of(adam_constants(h, a, true)), cases(false), __LINE__);
    }
}

// End to end: the GPU with the constants above against optim::adam_update
// (the portable kernels forced), in both modes.
void test_adam_matches_adam_update(void **state) {
    (void)state;
    NEED_DEVICE();
    NEED_UNFUSED_CPU();
    const size_t n = (size_t{1} << 20) + 5, off = 1;
    for (int mode = 0; mode < 2; ++mode) {
        dsm::optim::Hyper h;
        h.weight_decay = 0.01;
        h.adam_w_mode = mode == 0;
        dsm::optim::StepArgs a;
        a.step = 5;
        a.lr = 3e-4;
        a.beta1 = 0.85;
        a.grad_scale = 0.5f;
        std::vector<float> p = random_vec(n, 11, -1.0f, 1.0f), g = random_vec(n, 12, -1.0f, 1.0f);
        std::vector<float> m = random_vec(n, 13, -0.1f, 0.1f), v = random_vec(n, 14, 0.0f, 0.01f);
        Dev dp((n + off) * 4), dg((n + off) * 4), dm((n + off) * 4), dv((n + off) * 4);
        put(dp.at<float>(off), p);
        put(dg.at<float>(off), g);
        put(dm.at<float>(off), m);
        put(dv.at<float>(off), v);
        Flat f;
        f.p = dp.at<float>(off);
        f.g = dg.at<float>(off);
        f.n = n;
        uploaded();
        dsm::cuda::adam(adam_constants(h, a, true), f, dm.at<float>(off), dv.at<float>(off), g_stream);
        sync();
        dsm::simd::force("generic");
        dsm::optim::adam_update(p.data(), g.data(), m.data(), v.data(), n, h, a, true);
        dsm::simd::force("auto");
        const std::string where = mode == 0 ? "adamw" : "adam l2";
        same_floats(get(dp.at<float>(off), n), p, 0, "p", where, __LINE__);
        same_floats(get(dm.at<float>(off), n), m, 0, "m", where, __LINE__);
        same_floats(get(dv.at<float>(off), n), v, 0, "v", where, __LINE__);
    }
}

void test_sgd(void **state) {
    (void)state;
    NEED_DEVICE();
    NEED_UNFUSED_CPU();
    for (int mode = 0; mode < 3; ++mode) {
        dsm::optim::SgdK k{}; // momentum 0.9, dampening 0.1, wd 0.01, lr 0.01, a second step
        k.wd = 0.01f;
        k.mom = 0.9f;
        k.damp = 0.9f;
        k.nesterov = 0.9f;
        k.neg_lr = -0.01f;
        k.scale = 0.25f;
        k.mode = mode;
        Update u{mode == 0 ? "sgd" : mode == 1 ? "sgd momentum" : "sgd nesterov", mode > 0 ? 1 : 0, -1.0f, 1.0f,
                 0.0f, 0.0f,
                 [k](float *p, const float *g, float *buf, float *, size_t n) { cpu().sgd(k, p, g, buf, n); },
                 [k](const Flat &f, float *buf, float *) { dsm::cuda::sgd(k, f, buf, g_stream); }};
        check_update(u, cases(false), __LINE__);
    }
}

void test_lion(void **state) {
    (void)state;
    NEED_DEVICE();
    NEED_UNFUSED_CPU();
    dsm::optim::LionK k{}; // betas 0.9, 0.99; lr 1e-4, wd 0.1
    k.b1 = 0.9f;
    k.omb1 = 0.1f;
    k.b2 = 0.99f;
    k.omb2 = 0.01f;
    k.neg_lr = -1e-4f;
    k.keep = static_cast<float>(1.0 - 1e-4 * 0.1);
    k.scale = 0.5f;
    Update u{"lion", 1, -1.0f, 1.0f, 0.0f, 0.0f,
             [k](float *p, const float *g, float *m, float *, size_t n) { cpu().lion(k, p, g, m, n); },
             [k](const Flat &f, float *m, float *) { dsm::cuda::lion(k, f, m, g_stream); }};
    check_update(u, cases(false), __LINE__);
}

void test_adagrad(void **state) {
    (void)state;
    NEED_DEVICE();
    NEED_UNFUSED_CPU();
    dsm::optim::AdagradK k{}; // lr 0.01, lr_decay 0.1 at step 3, wd 0.01, eps 1e-10
    k.wd = 0.01f;
    k.eps = 1e-10f;
    k.neg_clr = static_cast<float>(-0.01 / (1.0 + 2 * 0.1));
    k.scale = 1.0f / 64.0f;
    Update u{"adagrad", 1, 0.0f, 1.0f, 0.0f, 0.0f,
             [k](float *p, const float *g, float *sum, float *, size_t n) { cpu().adagrad(k, p, g, sum, n); },
             [k](const Flat &f, float *sum, float *) { dsm::cuda::adagrad(k, f, sum, g_stream); }};
    check_update(u, cases(false), __LINE__);
}

// ---------------------------------------------------------------- multi-tensor

// A parameter list as a partition: 600 tiny tensors (1 to 7 elements), odd
// and chunk-edge sizes and a few large ones, 0 to 3 elements of padding
// between them, weight decay on every other one.
std::vector<dsm::optim::Segment> mt_list(size_t *total) {
    std::vector<dsm::optim::Segment> out;
    std::vector<size_t> sizes;
    for (size_t i = 0; i < 600; ++i) sizes.push_back(1 + i % 7);
    for (size_t n : {size_t{1023}, size_t{4095}, size_t{4096}, size_t{4097}, size_t{8193}, size_t{65537},
                     size_t{300001}, size_t{768}, size_t{2304}})
        sizes.push_back(n);
    size_t at = 0;
    int param = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
        at += i % 4; // padding
        dsm::optim::Segment sg;
        sg.offset = at;
        sg.count = sizes[i];
        sg.param = param++;
        sg.decay = i % 2 == 0;
        out.push_back(sg);
        at += sizes[i];
    }
    *total = at + 3;
    return out;
}

using PerTensor = std::function<void(const Flat &f, float *s0, float *s1, bool decay)>;
using MultiTensor = std::function<void(const dsm::cuda::detail::MtArrays &a)>;

// The multi-tensor launch against the per-tensor kernels, one per segment,
// on the same data: p, the states, the 16-bit copy bit for bit over the
// whole partition (padding untouched by both), and with zeroing the
// gradient zero in the segments and untouched in the padding. Every
// gradient dtype and copy, with and without zeroing, with the arrays
// equally misaligned and misaligned differently, a gradient with Inf and
// NaN (an overflow step's data) included; the table is uploaded once.
void check_multi(const Update &u, const PerTensor &per, const MultiTensor &multi, int line) {
    size_t n = 0;
    const std::vector<dsm::optim::Segment> segs = mt_list(&n);
    std::vector<dsm::cuda::MtEntry> entries;
    for (const auto &sg : segs) entries.push_back(dsm::cuda::MtEntry{sg.offset, sg.count, sg.decay ? dsm::cuda::kMtDecay : 0u});
    dsm::cuda::MtTables tables;
    const dsm_dtype_t gt[] = {DSM_FLOAT32, DSM_FLOAT16, DSM_BFLOAT16};
    const Offsets offs[] = {{0, 0}, {1, 1}, {2, 3}};
    uint64_t seed = 100;
    for (const Offsets &o : offs)
        for (dsm_dtype_t g_type : gt)
            for (int copy = 0; copy < 3; ++copy)
                for (int zero = 0; zero < 2; ++zero) {
                    const dsm_dtype_t p16_type = copy == 2 ? DSM_BFLOAT16 : DSM_FLOAT16;
                    char where[160];
                    std::snprintf(where, sizeof where, "%s, offsets %zu/%zu, %s gradient, %s, %s", u.name, o.arrays,
                                  o.grad, tname(g_type), copy == 0 ? "no copy" : tname(p16_type),
                                  zero ? "zeroing" : "no zeroing");
                    const std::vector<float> p = random_vec(n, seed++, -1.0f, 1.0f);
                    std::vector<float> g = random_vec(n, seed++, -1.0f, 1.0f);
                    if (o.arrays == 1) { // an overflow step's gradient
                        g[segs[5].offset] = INFINITY;
                        g[segs.back().offset + 7] = NAN;
                    }
                    const std::vector<float> s0 = random_vec(n, seed++, u.s0_lo, u.s0_hi);
                    const std::vector<float> s1 = random_vec(n, seed++, u.s1_lo, u.s1_hi);
                    const Grad gr = make_grad(g, g_type);
                    const size_t es = esize(g_type);
                    std::vector<uint16_t> c16(n + 4, 0xdeadu);
                    // Two copies of every array: [0] per tensor, [1] multi-tensor.
                    Dev dp0((n + 4) * 4), dp1((n + 4) * 4), dg0((n + 4) * es), dg1((n + 4) * es);
                    Dev da0((n + 4) * 4), da1((n + 4) * 4), db0((n + 4) * 4), db1((n + 4) * 4);
                    Dev dc0((n + 4) * 2), dc1((n + 4) * 2);
                    for (Dev *d : {&dp0, &dp1}) put(d->at<float>(o.arrays), p);
                    for (Dev *d : {&da0, &da1}) put(d->at<float>(o.arrays), s0);
                    for (Dev *d : {&db0, &db1}) put(d->at<float>(o.arrays), s1);
                    for (Dev *d : {&dg0, &dg1}) put(d->at<unsigned char>(o.grad * es), gr.bytes);
                    for (Dev *d : {&dc0, &dc1}) put(d->at<uint16_t>(0), c16);
                    uploaded();
                    float *st0[2] = {u.states > 0 ? da0.at<float>(o.arrays) : nullptr,
                                     u.states > 0 ? da1.at<float>(o.arrays) : nullptr};
                    float *st1[2] = {u.states > 1 ? db0.at<float>(o.arrays) : nullptr,
                                     u.states > 1 ? db1.at<float>(o.arrays) : nullptr};
                    for (const auto &sg : segs) {
                        Flat f;
                        f.p = dp0.at<float>(o.arrays + sg.offset);
                        f.g = dg0.at<unsigned char>((o.grad + sg.offset) * es);
                        f.g_type = g_type;
                        f.p16 = copy ? dc0.at<uint16_t>(o.arrays + sg.offset) : nullptr;
                        f.p16_type = p16_type;
                        f.n = sg.count;
                        per(f, st0[0] ? st0[0] + sg.offset : nullptr, st1[0] ? st1[0] + sg.offset : nullptr, sg.decay);
                    }
                    dsm::cuda::detail::MtArrays a;
                    a.p = dp1.at<float>(o.arrays);
                    a.g = dg1.at<unsigned char>(o.grad * es);
                    a.g_fmt = dsm::cuda::detail::fmt_of(g_type, "g", true);
                    a.s0 = st0[1];
                    a.s1 = st1[1];
                    a.p16 = copy ? dc1.at<uint16_t>(o.arrays) : nullptr;
                    a.p16_fmt = copy ? dsm::cuda::detail::fmt_of(p16_type, "p16", false) : dsm::cuda::detail::Fmt::NONE;
                    a.zero_grads = zero != 0;
                    const uint64_t before = tables.uploads();
                    a.segs = tables.get(entries, g_stream, &a.nsegs, &a.chunks, &a.chunk_seg);
                    if (zero) a.chunk_seg = nullptr; // the binary search instead of the index
                    if (before > 0 && tables.uploads() != before)
                        fail_msg("line %d: [%s]: the same segments uploaded again", line, where);
                    multi(a);
                    sync();
                    same_floats(get(dp1.at<float>(0), n + 4), get(dp0.at<float>(0), n + 4), 0, "p", where, line);
                    if (u.states > 0)
                        same_floats(get(da1.at<float>(0), n + 4), get(da0.at<float>(0), n + 4), 0, "s0", where, line);
                    if (u.states > 1)
                        same_floats(get(db1.at<float>(0), n + 4), get(db0.at<float>(0), n + 4), 0, "s1", where, line);
                    same_halves(get(dc1.at<uint16_t>(0), n + 4), get(dc0.at<uint16_t>(0), n + 4), 0, "p16", where,
                                line);
                    // The gradient: zero in the segments when zeroing, else as uploaded.
                    std::vector<unsigned char> want = gr.bytes;
                    if (zero)
                        for (const auto &sg : segs) std::memset(want.data() + sg.offset * es, 0, sg.count * es);
                    const std::vector<unsigned char> got = get(dg1.at<unsigned char>(o.grad * es), n * es);
                    for (size_t i = 0; i < want.size(); ++i)
                        if (got[i] != want[i])
                            fail_msg("line %d: g [%s]: byte %zu: got %02x, expected %02x", line, where, i, got[i],
                                     want[i]);
                }
}

void test_multi_tensor_updates(void **state) {
    (void)state;
    NEED_DEVICE();
    dsm::optim::Hyper h;
    h.weight_decay = 0.1;
    dsm::optim::StepArgs a;
    a.step = 4;
    a.lr = 6e-4;
    a.grad_scale = 0.37f; // unscale times a clipping coefficient
    const dsm::optim::AdamK on = adam_constants(h, a, true), off = adam_constants(h, a, false);
    check_multi(Update{"adamw", 2, -0.1f, 0.1f, 0.0f, 0.01f, nullptr, nullptr},
                [&](const Flat &f, float *m, float *v, bool d) { dsm::cuda::adam(d ? on : off, f, m, v, g_stream); },
                [&](const dsm::cuda::detail::MtArrays &x) {
                    dsm::cuda::detail::check_launch(dsm::cuda::detail::launch_mt_adam(on, off, x, g_stream), "mt");
                },
                __LINE__);
    for (int mode = 0; mode < 3; ++mode) {
        dsm::optim::SgdK kon{};
        kon.wd = 0.01f;
        kon.mom = 0.9f;
        kon.damp = 0.9f;
        kon.nesterov = 0.9f;
        kon.neg_lr = -0.01f;
        kon.scale = 0.25f;
        kon.mode = mode;
        dsm::optim::SgdK koff = kon;
        koff.wd = 0.0f;
        check_multi(Update{"sgd", mode > 0 ? 1 : 0, -1.0f, 1.0f, 0.0f, 0.0f, nullptr, nullptr},
                    [&](const Flat &f, float *b, float *, bool d) { dsm::cuda::sgd(d ? kon : koff, f, b, g_stream); },
                    [&](const dsm::cuda::detail::MtArrays &x) {
                        dsm::cuda::detail::check_launch(dsm::cuda::detail::launch_mt_sgd(kon, koff, x, g_stream), "mt");
                    },
                    __LINE__);
    }
    dsm::optim::LionK lon{};
    lon.b1 = 0.9f;
    lon.omb1 = 0.1f;
    lon.b2 = 0.99f;
    lon.omb2 = 0.01f;
    lon.neg_lr = -1e-4f;
    lon.keep = static_cast<float>(1.0 - 1e-4 * 0.1);
    lon.scale = 0.5f;
    dsm::optim::LionK loff = lon;
    loff.keep = 1.0f;
    check_multi(Update{"lion", 1, -1.0f, 1.0f, 0.0f, 0.0f, nullptr, nullptr},
                [&](const Flat &f, float *m, float *, bool d) { dsm::cuda::lion(d ? lon : loff, f, m, g_stream); },
                [&](const dsm::cuda::detail::MtArrays &x) {
                    dsm::cuda::detail::check_launch(dsm::cuda::detail::launch_mt_lion(lon, loff, x, g_stream), "mt");
                },
                __LINE__);
    dsm::optim::AdagradK gon{};
    gon.wd = 0.01f;
    gon.eps = 1e-10f;
    gon.neg_clr = -0.01f;
    gon.scale = 1.0f / 64.0f;
    dsm::optim::AdagradK goff = gon;
    goff.wd = 0.0f;
    check_multi(Update{"adagrad", 1, 0.0f, 1.0f, 0.0f, 0.0f, nullptr, nullptr},
                [&](const Flat &f, float *sum, float *, bool d) { dsm::cuda::adagrad(d ? gon : goff, f, sum, g_stream); },
                [&](const dsm::cuda::detail::MtArrays &x) {
                    dsm::cuda::detail::check_launch(dsm::cuda::detail::launch_mt_adagrad(gon, goff, x, g_stream),
                                                    "mt");
                },
                __LINE__);
}

// The multi-tensor accumulation (one rank's gradient reduction) against
// accumulate_into's steps per piece: fp32 dst += a * src directly, a 16-bit
// dst through fp32 (convert, axpy, convert); many tiny pieces and large ones
// in one launch, every source and destination dtype.
void test_multi_tensor_accumulate(void **state) {
    (void)state;
    NEED_DEVICE();
    using dsm::cuda::detail::Fmt;
    size_t n = 0;
    const std::vector<dsm::optim::Segment> segs = mt_list(&n);
    const dsm_dtype_t types[] = {DSM_FLOAT32, DSM_FLOAT16, DSM_BFLOAT16};
    const float scale = 1.0f; // one rank: the sum is the gradient itself (post-scale 1)
    uint64_t seed = 500;
    for (dsm_dtype_t st : types)
        for (dsm_dtype_t dt : types) {
            const std::string where = std::string(tname(st)) + " into " + tname(dt);
            const size_t ses = esize(st), des = esize(dt);
            const Grad dst = make_grad(random_vec(n, seed++, -1.0f, 1.0f), dt);
            Dev d0(n * des), d1(n * des), scratch(n * 4);
            put(d0.at<unsigned char>(0), dst.bytes);
            put(d1.at<unsigned char>(0), dst.bytes);
            std::vector<std::unique_ptr<Dev>> srcs;
            std::vector<dsm::cuda::MtEntry> entries;
            for (const auto &sg : segs) {
                const Grad src = make_grad(random_vec(sg.count, seed++, -1.0f, 1.0f), st);
                srcs.push_back(std::make_unique<Dev>(sg.count * ses));
                put(srcs.back()->at<unsigned char>(0), src.bytes);
                entries.push_back(dsm::cuda::MtEntry{sg.offset, sg.count, reinterpret_cast<uintptr_t>(srcs.back()->p)});
            }
            uploaded();
            const Fmt sf = dsm::cuda::detail::fmt_of(st, "src", true), df = dsm::cuda::detail::fmt_of(dt, "dst", true);
            for (size_t i = 0; i < segs.size(); ++i) {
                unsigned char *d = d0.at<unsigned char>(segs[i].offset * des);
                if (dt == DSM_FLOAT32) {
                    dsm::cuda::detail::check_launch(dsm::cuda::detail::launch_axpy(srcs[i]->p, sf,
                                                                                   reinterpret_cast<float *>(d),
                                                                                   segs[i].count, scale, g_stream),
                                                    "axpy");
                } else {
                    dsm::cuda::convert(d, dt, scratch.p, DSM_FLOAT32, segs[i].count, g_stream);
                    dsm::cuda::detail::check_launch(dsm::cuda::detail::launch_axpy(srcs[i]->p, sf,
                                                                                   scratch.at<float>(0), segs[i].count,
                                                                                   scale, g_stream),
                                                    "axpy");
                    dsm::cuda::convert(scratch.p, DSM_FLOAT32, d, dt, segs[i].count, g_stream);
                }
            }
            for (size_t b = 0; b < entries.size(); b += dsm::cuda::detail::kMtParamSegs) {
                const size_t e = std::min(entries.size(), b + dsm::cuda::detail::kMtParamSegs);
                const dsm::cuda::MtTable t = dsm::cuda::mt_plan(
                    std::vector<dsm::cuda::MtEntry>(entries.begin() + static_cast<long>(b), entries.begin() + static_cast<long>(e)));
                dsm::cuda::detail::check_launch(dsm::cuda::detail::launch_mt_axpy(sf, d1.p, df, t.segs.data(),
                                                                                  static_cast<unsigned>(t.segs.size()),
                                                                                  scale, g_stream),
                                                "mt_axpy");
            }
            sync();
            const std::vector<unsigned char> want = get(d0.at<unsigned char>(0), n * des);
            const std::vector<unsigned char> got = get(d1.at<unsigned char>(0), n * des);
            for (size_t i = 0; i < want.size(); ++i)
                if (got[i] != want[i])
                    fail_msg("line %d: [%s]: byte %zu: got %02x, expected %02x", __LINE__, where.c_str(), i, got[i],
                             want[i]);
        }
}

// The optimizer on a CUDA space with the fused step (bf16 and fp16
// gradients read in place, 16-bit parameters written, gradients zeroed: the
// engine's step), against the same optimizer without it (fp32 gradients
// converted first, the parameters converted after), bit for bit; a second
// step with the same segments uploads no table.
void test_device_optimizer_fused(void **state) {
    (void)state;
    NEED_DEVICE();
    std::unique_ptr<dsm::device::Space> sp = dsm::device::make_cuda(0);
    size_t n = 0;
    const std::vector<dsm::optim::Segment> segs = mt_list(&n);
    dsm::optim::Hyper h;
    h.type = dsm::optim::OptimizerType::ADAMW;
    h.weight_decay = 0.1;
    dsm::optim::StepArgs a;
    a.lr = 3e-4;
    a.grad_scale = 0.61f;
    for (dsm_dtype_t t : {DSM_BFLOAT16, DSM_FLOAT16}) {
        const std::string where = tname(t);
        dsm::optim::Optimizer fused(h, n, *sp), plain(h, n, *sp);
        const std::vector<float> p = random_vec(n, 900, -1.0f, 1.0f);
        dsm::device::Buffer p0(*sp, n * 4), p1(*sp, n * 4), g16(*sp, n * 2), g32(*sp, n * 4), c0(*sp, n * 2),
            c1(*sp, n * 2);
        sp->upload(p0.data(), p.data(), n * 4);
        sp->upload(p1.data(), p.data(), n * 4);
        for (int step = 1; step <= 2; ++step) {
            const Grad gr = make_grad(random_vec(n, 900 + static_cast<uint64_t>(step), -1.0f, 1.0f), t);
            sp->upload(g16.data(), gr.bytes.data(), n * 2);
            sp->upload(g32.data(), gr.ref.data(), n * 4);
            a.step = step;
            dsm::optim::Fused f;
            f.grad16 = g16.data();
            f.param16 = c1.data();
            f.dtype = t;
            f.zero_grads = true;
            assert_true(fused.fuses());
            fused.step(static_cast<float *>(p1.data()), nullptr, segs, a, {}, &f);
            plain.step(static_cast<float *>(p0.data()), static_cast<float *>(g32.data()), segs, a);
            dsm::cuda::convert(p0.data(), DSM_FLOAT32, c0.data(), t, n,
                               static_cast<cudaStream_t>(sp->queue().handle()));
            sp->synchronize();
            same_floats(get(static_cast<float *>(p1.data()), n), get(static_cast<float *>(p0.data()), n), 0, "p",
                        where, __LINE__);
            for (int s2 = 0; s2 < 2; ++s2)
                same_floats(get(fused.state(s2), n), get(plain.state(s2), n), 0, "state", where, __LINE__);
            // The 16-bit parameters of the segments (the padding is the caller's).
            const std::vector<uint16_t> got = get(static_cast<uint16_t *>(c1.data()), n),
                                        want = get(static_cast<uint16_t *>(c0.data()), n);
            const std::vector<uint16_t> g_after = get(static_cast<uint16_t *>(g16.data()), n);
            for (const auto &sg : segs)
                for (size_t i = sg.offset; i < sg.offset + sg.count; ++i) {
                    if (got[i] != want[i])
                        fail_msg("p16 [%s]: element %zu: got %04x, expected %04x", where.c_str(), i, got[i], want[i]);
                    if (g_after[i] != 0) fail_msg("g [%s]: element %zu not zeroed", where.c_str(), i);
                }
        }
    }
}

// amp's multi-tensor accumulation on a CUDA space (one rank's reduction),
// and its accumulate_into() piece by piece (a 16-bit dst in one launch, no
// scratch), against the host's accumulate_into() piece by piece, with pieces
// that add twice into the same elements (a gradient released twice in a
// flush: in order) and more pieces than one launch takes. Scales 1 and 0.5
// (a product that is exact, fused or not).
void test_accumulate_pieces(void **state) {
    (void)state;
    NEED_DEVICE();
    std::unique_ptr<dsm::device::Space> sp = dsm::device::make_cuda(0);
    std::unique_ptr<dsm::amp::Math> math = dsm::amp::make_math(*sp);
    size_t n = 0;
    const std::vector<dsm::optim::Segment> segs = mt_list(&n);
    for (const float scale : {1.0f, 0.5f}) {
        for (dsm_dtype_t dt : {DSM_FLOAT32, DSM_BFLOAT16, DSM_FLOAT16}) {
            const size_t es = esize(dt);
            std::vector<dsm::device::Buffer> srcs;
            std::vector<Grad> host_srcs;
            std::vector<dsm::amp::Math::Piece> pieces;
            uint64_t seed = 700;
            // Every segment, then the first 150 again (overlaps), then segment 3 a third time.
            std::vector<size_t> order;
            for (size_t i = 0; i < segs.size(); ++i) order.push_back(i);
            for (size_t i = 0; i < 150; ++i) order.push_back(i);
            order.push_back(3);
            for (size_t i : order) {
                host_srcs.push_back(make_grad(random_vec(segs[i].count, seed++, -1.0f, 1.0f), dt));
                srcs.emplace_back(*sp, segs[i].count * es);
                sp->upload(srcs.back().data(), host_srcs.back().bytes.data(), host_srcs.back().bytes.size());
                pieces.push_back(dsm::amp::Math::Piece{srcs.back().data(), segs[i].offset, segs[i].count});
            }
            const Grad init = make_grad(random_vec(n, 701, -1.0f, 1.0f), dt);
            std::vector<unsigned char> want = init.bytes;
            for (size_t k = 0; k < pieces.size(); ++k)
                dsm::amp::accumulate_into(host_srcs[k].bytes.data(), dt, want.data() + pieces[k].offset * es, dt,
                                          pieces[k].count, scale);
            dsm::device::Buffer d0(*sp, n * es), d1(*sp, n * es);
            sp->upload(d0.data(), init.bytes.data(), n * es);
            sp->upload(d1.data(), init.bytes.data(), n * es);
            for (const auto &pc : pieces)
                math->accumulate_into(pc.src, dt, static_cast<char *>(d0.data()) + pc.offset * es, dt, pc.count,
                                      scale);
            assert_true(math->accumulate_pieces(pieces, dt, d1.data(), dt, scale));
            sp->synchronize();
            const std::vector<unsigned char> got0 = get(static_cast<unsigned char *>(d0.data()), n * es),
                                             got1 = get(static_cast<unsigned char *>(d1.data()), n * es);
            for (size_t i = 0; i < want.size(); ++i) {
                if (got0[i] != want[i])
                    fail_msg("accumulate_into [%s, scale %g]: byte %zu: got %02x, expected %02x", tname(dt), scale, i,
                             got0[i], want[i]);
                if (got1[i] != want[i])
                    fail_msg("accumulate_pieces [%s, scale %g]: byte %zu: got %02x, expected %02x", tname(dt), scale, i,
                             got1[i], want[i]);
            }
        }
    }
    // The host's math has no such launch: false, nothing done.
    std::unique_ptr<dsm::amp::Math> hm = dsm::amp::make_math(dsm::device::host());
    assert_false(hm->accumulate_pieces({}, DSM_FLOAT32, nullptr, DSM_FLOAT32, 1.0f));
}

// |gpu - cpu| within the bound of any order of summing n nonnegative terms.
void sums_agree(double gpu, double cpu_sum, size_t n, const char *what, const std::string &where, int line) {
    const double tol = 2.0 * static_cast<double>(n) * std::ldexp(1.0, -53) * cpu_sum;
    if (!(std::fabs(gpu - cpu_sum) <= tol))
        fail_msg("line %d: %s [%s]: got %.17g, expected %.17g (tolerance %.3g)", line, what, where.c_str(), gpu,
                 cpu_sum, tol);
}

dsm::cuda::ReduceResult result_of(Reduction *r) {
    dsm::cuda::ReduceResult out;
    CUDA_OK(cudaMemcpy(&out, r, sizeof out, cudaMemcpyDeviceToHost));
    return out;
}

// Lamb: pass 1 (m, v bit for bit; the norms within the summation bound),
// then pass 2 with the CPU's coefficient (p and the copy bit for bit).
void test_lamb(void **state) {
    (void)state;
    NEED_DEVICE();
    NEED_UNFUSED_CPU();
    dsm::optim::LambK k{}; // betas 0.9, 0.999, eps 1e-6, wd 0.01
    k.b1 = 0.9f;
    k.omb1 = 0.1f;
    k.b2 = 0.999f;
    k.omb2 = static_cast<float>(1.0 - 0.999);
    k.eps = 1e-6f;
    k.wd = 0.01f;
    k.scale = 0.125f;
    Dev red(sizeof(Reduction));
    Reduction *r = static_cast<Reduction *>(red.p);
    uint64_t seed = 100;
    for (const Case &c : cases(false)) {
        const std::string where = "lamb, " + describe(c);
        const size_t n = c.n, off = c.off.arrays, goff = c.off.grad;
        std::vector<float> p = random_vec(n, ++seed, -1.0f, 1.0f), m = random_vec(n, ++seed, -0.1f, 0.1f);
        std::vector<float> v = random_vec(n, ++seed, 0.0f, 0.01f);
        const Grad g = make_grad(random_vec(n, ++seed, -8.0f, 8.0f), c.g_type);
        Dev dp((n + 2 * kGuard) * 4), dm((n + 2 * kGuard) * 4), dv((n + 2 * kGuard) * 4);
        Dev dg((n + 2 * kGuard) * 4), dc((n + 2 * kGuard) * 2);
        put(dp.at<float>(0), with_guards(p, off));
        put(dm.at<float>(0), with_guards(m, off));
        put(dv.at<float>(0), with_guards(v, off));
        CUDA_OK(cudaMemcpy(static_cast<unsigned char *>(dg.p) + goff * esize(c.g_type), g.bytes.data(), g.bytes.size(),
                           cudaMemcpyHostToDevice));
        Flat f;
        f.p = dp.at<float>(off);
        f.g = static_cast<unsigned char *>(dg.p) + goff * esize(c.g_type);
        f.g_type = c.g_type;
        f.n = n;
        uploaded();
        dsm::cuda::lamb1(k, f, dm.at<float>(off), dv.at<float>(off), r, g_stream);
        sync();
        const dsm::cuda::ReduceResult got = result_of(r);

        double sums[2] = {0.0, 0.0};
        cpu().lamb1(k, p.data(), g.ref.data(), m.data(), v.data(), n, sums);
        const std::vector<float> gm = get(dm.at<float>(0), n + 2 * kGuard), gv = get(dv.at<float>(0), n + 2 * kGuard);
        same_floats(gm, m, off, "m", where, __LINE__);
        same_floats(gv, v, off, "v", where, __LINE__);
        guards_intact(gm, off, n, "m", where, __LINE__);
        guards_intact(gv, off, n, "v", where, __LINE__);
        sums_agree(got.sum[0], sums[0], n, "sum of p^2", where, __LINE__);
        sums_agree(got.sum[1], sums[1], n, "sum of u^2", where, __LINE__);
        assert_int_equal(got.nonfinite, 0);

        // Pass 2 with optimizer.cc's coefficient (lr 1e-3, trust ratio in [0.01, 10]).
        const double ratio = std::min(std::max(std::sqrt(sums[0]) / std::sqrt(sums[1]), 0.01), 10.0);
        const float neg_coef = static_cast<float>(-1e-3 * ratio);
        f.g = nullptr;
        f.p16 = c.copy ? dc.at<uint16_t>(off) : nullptr;
        f.p16_type = c.p16_type;
        dsm::cuda::lamb2(k, neg_coef, f, dm.at<float>(off), dv.at<float>(off), g_stream);
        sync();
        cpu().lamb2(k, neg_coef, p.data(), m.data(), v.data(), n);
        const std::vector<float> gp = get(dp.at<float>(0), n + 2 * kGuard);
        same_floats(gp, p, off, "p", where, __LINE__);
        guards_intact(gp, off, n, "p", where, __LINE__);
        same_floats(get(dm.at<float>(0), n + 2 * kGuard), m, off, "m after pass 2", where, __LINE__);
        if (c.copy) {
            std::vector<uint16_t> want(n);
            for (size_t i = 0; i < n; ++i) want[i] = narrow(c.p16_type, p[i]);
            same_halves(get(dc.at<uint16_t>(0), n + 2 * kGuard), want, off, "p16", where, __LINE__);
        }
    }
}

// ---------------------------------------------------------------- inspect

// inspect() of x (bytes of n elements of type t) at byte offset `at` of a fresh buffer.
dsm::cuda::ReduceResult inspect_at(const std::vector<unsigned char> &x, dsm_dtype_t t, size_t n, size_t at,
                                   float inv_scale, Reduction *r) {
    Dev d(x.size() + at + 16);
    CUDA_OK(cudaMemcpy(static_cast<unsigned char *>(d.p) + at, x.data(), x.size(), cudaMemcpyHostToDevice));
    uploaded();
    dsm::cuda::inspect(static_cast<unsigned char *>(d.p) + at, t, n, inv_scale, r, g_stream);
    sync();
    return result_of(r);
}

void test_inspect(void **state) {
    (void)state;
    NEED_DEVICE();
    Dev red(sizeof(Reduction));
    Reduction *r = static_cast<Reduction *>(red.p);
    const float inv_scale = 1.0f / 1024.0f;
    const dsm_dtype_t types[] = {DSM_FLOAT32, DSM_FLOAT16, DSM_BFLOAT16};
    uint64_t seed = 200;
    for (dsm_dtype_t t : types)
        for (size_t n : kSizes) {
            const std::string where = std::string(tname(t)) + ", n " + std::to_string(n);
            const Grad g = make_grad(random_vec(n, ++seed, -1000.0f, 1000.0f), t);
            const dsm::amp::NormPart want = dsm::amp::norm_part(g.ref.data(), n, inv_scale);
            const size_t es = esize(t);
            const dsm::cuda::ReduceResult a = inspect_at(g.bytes, t, n, 0, inv_scale, r);
            sums_agree(a.sum[0], want.sumsq, n, "sum of squares", where, __LINE__);
            assert_int_equal(a.nonfinite, 0);
            assert_true(a.sum[1] == 0.0);
            // The same bits again, and at misaligned addresses (scalar loads).
            for (size_t at : {size_t{0}, es, 3 * es}) {
                const dsm::cuda::ReduceResult b = inspect_at(g.bytes, t, n, at, inv_scale, r);
                if (std::memcmp(&a.sum[0], &b.sum[0], sizeof(double)) != 0)
                    fail_msg("line %d: inspect [%s] at byte offset %zu: %.17g, first run %.17g", __LINE__,
                             where.c_str(), at, b.sum[0], a.sum[0]);
            }
            // Inf and NaN at the last element, and NaN in the middle.
            const uint32_t inf32 = 0x7f800000u, nan32 = 0x7fc00000u;
            const uint16_t inf16 = t == DSM_FLOAT16 ? 0x7c00 : 0x7f80, nan16 = t == DSM_FLOAT16 ? 0x7e00 : 0x7fc0;
            for (int kind = 0; kind < 3; ++kind) {
                std::vector<unsigned char> bad = g.bytes;
                const size_t i = kind == 2 ? n / 2 : n - 1;
                if (t == DSM_FLOAT32)
                    std::memcpy(bad.data() + 4 * i, kind == 0 ? &inf32 : &nan32, 4);
                else
                    std::memcpy(bad.data() + 2 * i, kind == 0 ? &inf16 : &nan16, 2);
                const dsm::cuda::ReduceResult c = inspect_at(bad, t, n, es, inv_scale, r);
                if (c.nonfinite != 1)
                    fail_msg("line %d: inspect [%s]: %s at %zu not flagged", __LINE__, where.c_str(),
                             kind == 0 ? "Inf" : "NaN", i);
            }
        }
    // n == 0 still writes the result (over the flag left by the last call).
    dsm::cuda::inspect(nullptr, DSM_FLOAT32, 0, 1.0f, r, g_stream);
    sync();
    const dsm::cuda::ReduceResult z = result_of(r);
    assert_true(z.sum[0] == 0.0 && z.sum[1] == 0.0);
    assert_int_equal(z.nonfinite, 0);
}

// ---------------------------------------------------------------- conversions

// src (n elements of type st) converted on the device at element offsets
// so, do; the result's bytes.
std::vector<unsigned char> convert_on_device(const void *src, dsm_dtype_t st, dsm_dtype_t dt, size_t n, size_t so,
                                             size_t d_off) {
    Dev ds((n + 8) * esize(st)), dd((n + 8) * esize(dt));
    CUDA_OK(cudaMemcpy(static_cast<unsigned char *>(ds.p) + so * esize(st), src, n * esize(st), cudaMemcpyHostToDevice));
    uploaded();
    dsm::cuda::convert(static_cast<unsigned char *>(ds.p) + so * esize(st), st,
                       static_cast<unsigned char *>(dd.p) + d_off * esize(dt), dt, n, g_stream);
    sync();
    std::vector<unsigned char> out(n * esize(dt));
    CUDA_OK(cudaMemcpy(out.data(), static_cast<unsigned char *>(dd.p) + d_off * esize(dt), out.size(),
                       cudaMemcpyDeviceToHost));
    return out;
}

const size_t kConvertOffsets[][2] = {{0, 0}, {1, 1}, {3, 3}, {1, 2}};

// fp32 inputs: every fp16 and bf16 value widened, the midpoints between
// neighbouring fp16 and bf16 values (the ties), Inf, NaNs with payloads, the
// fp16 overflow threshold, fp32 subnormals, and random bit patterns.
std::vector<float> fp32_inputs() {
    std::vector<float> x;
    for (uint32_t h = 0; h < 0x10000; ++h) {
        x.push_back(fp16_to_fp32(static_cast<uint16_t>(h)));
        x.push_back(bf16_to_fp32(static_cast<uint16_t>(h)));
        if ((h & 0x7fff) < 0x7bff) // fp16 midpoints (exact in fp32)
            x.push_back(static_cast<float>(0.5 * (static_cast<double>(fp16_to_fp32(static_cast<uint16_t>(h))) +
                                                  fp16_to_fp32(static_cast<uint16_t>(h + 1)))));
        x.push_back(bits_float((h << 16) | 0x8000u)); // bf16 midpoints
        x.push_back(bits_float((h << 16) | 0x8001u));
        x.push_back(bits_float((h << 16) | 0x7fffu));
    }
    const uint32_t special[] = {0x7f800000u, 0xff800000u, 0x7fc00001u, 0xffbfffffu, 0x7f800001u,
                                0x477fefffu, 0x477ff000u, 0x477fe000u, 0x00000001u, 0x807fffffu,
                                0x33000000u, 0x33000001u, 0xb3800000u, 0x38800000u, 0x387fffffu};
    for (uint32_t s : special) x.push_back(bits_float(s));
    Rng r(7);
    for (size_t i = 0; i < (size_t{1} << 20) + 5; ++i) x.push_back(bits_float(static_cast<uint32_t>(r.bits() >> 32)));
    return x;
}

void test_convert(void **state) {
    (void)state;
    NEED_DEVICE();
    const dsm_dtype_t halves[] = {DSM_FLOAT16, DSM_BFLOAT16};
    std::vector<uint16_t> all(0x10000);
    for (uint32_t h = 0; h < 0x10000; ++h) all[h] = static_cast<uint16_t>(h);
    const std::vector<float> x = fp32_inputs();
    for (const auto &o : kConvertOffsets)
        for (dsm_dtype_t t : halves) {
            const std::string where = std::string(tname(t)) + ", offsets " + std::to_string(o[0]) + "/" +
                                      std::to_string(o[1]);
            // Every 16-bit pattern to fp32.
            std::vector<unsigned char> w = convert_on_device(all.data(), t, DSM_FLOAT32, all.size(), o[0], o[1]);
            std::vector<float> wide(all.size()), want(all.size());
            std::memcpy(wide.data(), w.data(), w.size());
            for (size_t i = 0; i < all.size(); ++i) want[i] = widen(t, all[i]);
            same_floats(wide, want, 0, "widen", where, __LINE__);
            // fp32 to 16 bits.
            std::vector<unsigned char> nb = convert_on_device(x.data(), DSM_FLOAT32, t, x.size(), o[0], o[1]);
            std::vector<uint16_t> got(x.size()), expect(x.size());
            std::memcpy(got.data(), nb.data(), nb.size());
            for (size_t i = 0; i < x.size(); ++i) expect[i] = narrow(t, x[i]);
            same_halves(got, expect, 0, "narrow", where, __LINE__);
            // 16 bits to the other 16 bits, through fp32.
            const dsm_dtype_t other = t == DSM_FLOAT16 ? DSM_BFLOAT16 : DSM_FLOAT16;
            std::vector<unsigned char> hb = convert_on_device(all.data(), t, other, all.size(), o[0], o[1]);
            std::vector<uint16_t> cross(all.size()), cross_want(all.size());
            std::memcpy(cross.data(), hb.data(), hb.size());
            for (size_t i = 0; i < all.size(); ++i) cross_want[i] = narrow(other, widen(t, all[i]));
            same_halves(cross, cross_want, 0, "16 to 16 bits", where, __LINE__);
            // Small sizes: only the scalar head and tail.
            for (size_t n : {size_t{1}, size_t{3}}) {
                std::vector<unsigned char> s = convert_on_device(x.data() + 1000, DSM_FLOAT32, t, n, o[0], o[1]);
                for (size_t i = 0; i < n; ++i) {
                    uint16_t h;
                    std::memcpy(&h, s.data() + 2 * i, 2);
                    assert_int_equal(h, narrow(t, x[1000 + i]));
                }
            }
        }
    // The same dtype: a copy.
    std::vector<unsigned char> c = convert_on_device(x.data(), DSM_FLOAT32, DSM_FLOAT32, 1023, 1, 2);
    assert_memory_equal(c.data(), x.data(), 1023 * 4);
}

// ---------------------------------------------------------------- Ulysses copies

// Bytes 0, 1, 2, ... of a tensor, so every element is distinct.
std::vector<unsigned char> pattern(size_t bytes, unsigned char salt) {
    std::vector<unsigned char> v(bytes);
    for (size_t i = 0; i < bytes; ++i) v[i] = static_cast<unsigned char>(i * 7 + salt + (i >> 8));
    return v;
}

// The Ulysses copies of sp/geometry.hpp on the device: one copy_2d each.
template <bool kToBlock>
void device_copy(const dsm::sp::Strided &c, unsigned char *tensor, unsigned char *block, cudaStream_t s) {
    if (kToBlock)
        dsm::cuda::copy_2d(block, c.block_pitch, tensor + c.tensor_offset, c.tensor_pitch, c.width, c.height, s);
    else
        dsm::cuda::copy_2d(tensor + c.tensor_offset, c.tensor_pitch, block, c.block_pitch, c.width, c.height, s);
}

void test_copies(void **state) {
    (void)state;
    NEED_DEVICE();
    for (size_t es : {size_t{2}, size_t{4}})
        for (bool seq_first : {false, true}) {
            dsm::sp::Geometry g;
            g.es = es;
            g.d = 3;
            g.b = 2;
            g.chunk = 5;
            g.s = 15; // 3 ranks
            g.H = 7;
            g.seq_first = seq_first;
            const dsm::sp::HeadRange h{2, 3};
            const size_t j = 1;
            const std::string where = "es " + std::to_string(es) + (seq_first ? ", seq-first" : ", batch-first");

            // copy_heads: tensor [rows = b * chunk][H][d], block [rows][count][d].
            const size_t rows = g.b * g.chunk, tensor_bytes = rows * g.H * g.d * es;
            const size_t block_bytes = rows * static_cast<size_t>(h.count) * g.d * es, hrow = h.count * g.d * es;
            const std::vector<unsigned char> tensor = pattern(tensor_bytes, 1), block = pattern(block_bytes, 2);
            std::vector<unsigned char> packed(block_bytes), unpacked = tensor;
            for (size_t r = 0; r < rows; ++r)
                for (size_t k = 0; k < hrow; ++k) {
                    const size_t t = (r * g.H + static_cast<size_t>(h.first)) * g.d * es + k;
                    packed[r * hrow + k] = tensor[t];
                    unpacked[t] = block[r * hrow + k];
                }
            Dev dt(tensor_bytes), db(block_bytes);
            put(static_cast<unsigned char *>(dt.p), tensor);
            uploaded();
            device_copy<true>(dsm::sp::heads_copy(g, h), static_cast<unsigned char *>(dt.p),
                              static_cast<unsigned char *>(db.p), g_stream);
            sync();
            if (get(static_cast<unsigned char *>(db.p), block_bytes) != packed)
                fail_msg("copy_heads pack [%s] differs", where.c_str());
            put(static_cast<unsigned char *>(db.p), block);
            uploaded();
            device_copy<false>(dsm::sp::heads_copy(g, h), static_cast<unsigned char *>(dt.p),
                               static_cast<unsigned char *>(db.p), g_stream);
            sync();
            if (get(static_cast<unsigned char *>(dt.p), tensor_bytes) != unpacked)
                fail_msg("copy_heads unpack [%s] differs", where.c_str());

            // copy_tokens: tensor [b][s][c][d] or [s][b][c][d], block: chunk j's tokens.
            const size_t token = static_cast<size_t>(h.count) * g.d * es, ht_bytes = g.b * g.s * token;
            const size_t tb_bytes = g.b * g.chunk * token;
            const std::vector<unsigned char> ht = pattern(ht_bytes, 3), tb = pattern(tb_bytes, 4);
            std::vector<unsigned char> tpacked(tb_bytes), tunpacked = ht;
            for (size_t bi = 0; bi < g.b; ++bi)
                for (size_t t = 0; t < g.chunk; ++t)
                    for (size_t k = 0; k < token; ++k) {
                        const size_t s = j * g.chunk + t;
                        const size_t at = (seq_first ? s * g.b + bi : bi * g.s + s) * token + k;
                        const size_t bt = (seq_first ? t * g.b + bi : bi * g.chunk + t) * token + k;
                        tpacked[bt] = ht[at];
                        tunpacked[at] = tb[bt];
                    }
            Dev dht(ht_bytes), dtb(tb_bytes);
            put(static_cast<unsigned char *>(dht.p), ht);
            uploaded();
            device_copy<true>(dsm::sp::tokens_copy(g, j, h), static_cast<unsigned char *>(dht.p),
                              static_cast<unsigned char *>(dtb.p), g_stream);
            sync();
            if (get(static_cast<unsigned char *>(dtb.p), tb_bytes) != tpacked)
                fail_msg("copy_tokens pack [%s] differs", where.c_str());
            put(static_cast<unsigned char *>(dtb.p), tb);
            uploaded();
            device_copy<false>(dsm::sp::tokens_copy(g, j, h), static_cast<unsigned char *>(dht.p),
                               static_cast<unsigned char *>(dtb.p), g_stream);
            sync();
            if (get(static_cast<unsigned char *>(dht.p), ht_bytes) != tunpacked)
                fail_msg("copy_tokens unpack [%s] differs", where.c_str());
        }
}

#define EXPECT_ERROR(status, expr, ...) expect_error_at([&] { expr; }, status, __VA_ARGS__, __LINE__)

// ---------------------------------------------------------------- table cache after a failure

// The tables' device memory: fails while g_alloc_fails, else DeviceBuffer.
int g_alloc_calls = 0;
bool g_alloc_fails = true;
dsm::cuda::DeviceBuffer table_alloc(size_t bytes) {
    ++g_alloc_calls;
    if (g_alloc_fails) DSM_FAIL(DSM_ERR_OUT_OF_MEMORY, "injected: cudaMalloc of ", bytes, " bytes failed");
    return dsm::cuda::DeviceBuffer(bytes);
}

// A failed allocation leaves no half-made table behind: the next get() with
// the same segments allocates and uploads again (it used to find the slot's
// key already set and hand out a null table). The failures need no device;
// with one, the table that finally comes is the right one, a table made
// before the failure is still found, and each is uploaded once.
void test_mt_tables_after_failure(void **state) {
    (void)state;
    using namespace dsm::cuda;
    const std::vector<MtEntry> a = {{0, 5000, kMtDecay}, {5003, 17, 0}};
    const std::vector<MtEntry> b = {{0, 64, 0}};
    unsigned nsegs = 0;
    uint64_t chunks = 0;
    const uint32_t *chunk_seg = nullptr;
    const bool device = no_device_reason().empty();
    MtTables tables(table_alloc);
    g_alloc_calls = 0;
    if (device) { // a table made before the failure
        g_alloc_fails = false;
        assert_non_null(tables.get(b, g_stream, &nsegs, &chunks, &chunk_seg));
        assert_int_equal(tables.uploads(), 1);
    }
    const int calls0 = g_alloc_calls;
    g_alloc_fails = true;
    for (int i = 1; i <= 2; ++i) {
        EXPECT_ERROR(DSM_ERR_OUT_OF_MEMORY, tables.get(a, g_stream, &nsegs, &chunks, &chunk_seg), {"injected"});
        assert_int_equal(g_alloc_calls, calls0 + i); // tried again, not served from the failed slot
    }
    assert_int_equal(tables.uploads(), device ? 1 : 0);
    if (!device) {
        print_message("test_cuda_kernels: the table cache's recovery checked without a device; its upload needs one\n");
        return;
    }
    g_alloc_fails = false;
    const MtSeg *segs = tables.get(a, g_stream, &nsegs, &chunks, &chunk_seg);
    assert_non_null(segs);
    assert_int_equal(tables.uploads(), 2);
    const MtTable want = mt_plan(a);
    assert_int_equal(nsegs, want.segs.size());
    assert_int_equal(chunks, want.chunks);
    sync();
    const std::vector<unsigned char> got =
        get(reinterpret_cast<const unsigned char *>(segs), want.segs.size() * sizeof(MtSeg));
    assert_memory_equal(got.data(), want.segs.data(), got.size());
    const std::vector<uint32_t> index = mt_chunk_index(want);
    assert_true(get(chunk_seg, index.size()) == index);
    assert_non_null(tables.get(b, g_stream, &nsegs, &chunks, &chunk_seg)); // still there: no upload
    assert_non_null(tables.get(a, g_stream, &nsegs, &chunks, &chunk_seg));
    assert_int_equal(tables.uploads(), 2);
}

// ---------------------------------------------------------------- argument checks (no device)

// Every check happens on the host before any CUDA call, so these run (and
// must pass) without a device. Fake pointers are never dereferenced: each
// call fails a check first.
void test_argument_checks(void **state) {
    (void)state;
    using namespace dsm::cuda;
    float *const fake = reinterpret_cast<float *>(uintptr_t{0x1000});
    float *const odd = reinterpret_cast<float *>(uintptr_t{0x1002});
    const dsm::optim::AdamK ak{};
    dsm::optim::SgdK sk{};
    const dsm::optim::LambK lk{};

    // n == 0: nothing to do, whatever the pointers.
    Flat empty;
    adam(ak, empty, nullptr, nullptr, nullptr);
    sgd(sk, empty, nullptr, nullptr);
    lion(dsm::optim::LionK{}, empty, nullptr, nullptr);
    adagrad(dsm::optim::AdagradK{}, empty, nullptr, nullptr);
    lamb2(lk, -1.0f, empty, nullptr, nullptr, nullptr);
    convert(nullptr, DSM_FLOAT32, nullptr, DSM_FLOAT16, 0, nullptr);
    dsm::sp::Geometry geo;
    geo.es = 4;
    geo.d = 8;
    geo.b = 2;
    geo.chunk = 4;
    geo.s = 8;
    geo.H = 4;
    device_copy<true>(dsm::sp::heads_copy(geo, dsm::sp::HeadRange{1, 0}), nullptr, nullptr, nullptr);
    device_copy<false>(dsm::sp::tokens_copy(geo, 0, dsm::sp::HeadRange{0, 0}), nullptr, nullptr, nullptr);

    Flat f;
    f.n = 16;
    EXPECT_ERROR(DSM_ERR_NULL_POINTER, adam(ak, f, fake, fake, nullptr), {"p is NULL"});
    f.p = fake;
    EXPECT_ERROR(DSM_ERR_NULL_POINTER, adam(ak, f, fake, fake, nullptr), {"g is NULL"});
    f.g = fake;
    EXPECT_ERROR(DSM_ERR_NULL_POINTER, adam(ak, f, nullptr, fake, nullptr), {"m is NULL"});
    EXPECT_ERROR(DSM_ERR_NULL_POINTER, adam(ak, f, fake, nullptr, nullptr), {"v is NULL"});
    EXPECT_ERROR(DSM_ERR_INVALID_ARGUMENT, adam(ak, f, odd, fake, nullptr), {"m", "not aligned", "4-byte"});
    f.g_type = DSM_FLOAT64;
    EXPECT_ERROR(DSM_ERR_INVALID_ARGUMENT, adam(ak, f, fake, fake, nullptr), {"gradient", "float32, float16"});
    f.g_type = DSM_FLOAT16;
    f.g = reinterpret_cast<const unsigned char *>(fake) + 1;
    EXPECT_ERROR(DSM_ERR_INVALID_ARGUMENT, adam(ak, f, fake, fake, nullptr), {"g", "2-byte"});
    f.g = fake;
    f.p16 = fake;
    f.p16_type = DSM_FLOAT32;
    EXPECT_ERROR(DSM_ERR_INVALID_ARGUMENT, adam(ak, f, fake, fake, nullptr), {"p16", "float16 or bfloat16"});
    f.p16_type = DSM_BFLOAT16;
    f.p = odd;
    EXPECT_ERROR(DSM_ERR_INVALID_ARGUMENT, adam(ak, f, fake, fake, nullptr), {"p (", "not aligned"});
    f.p = fake;
    EXPECT_ERROR(DSM_ERR_NULL_POINTER, lion(dsm::optim::LionK{}, f, nullptr, nullptr), {"m is NULL"});
    EXPECT_ERROR(DSM_ERR_NULL_POINTER, adagrad(dsm::optim::AdagradK{}, f, nullptr, nullptr), {"sum is NULL"});
    sk.mode = 3;
    EXPECT_ERROR(DSM_ERR_INVALID_ARGUMENT, sgd(sk, f, fake, nullptr), {"mode 3"});
    sk.mode = 1;
    EXPECT_ERROR(DSM_ERR_NULL_POINTER, sgd(sk, f, nullptr, nullptr), {"buf is NULL"});
    EXPECT_ERROR(DSM_ERR_INVALID_ARGUMENT, lamb1(lk, f, fake, fake, reinterpret_cast<Reduction *>(fake), nullptr),
                 {"lamb1", "p16 must be NULL"});
    EXPECT_ERROR(DSM_ERR_NULL_POINTER, lamb1(lk, empty, nullptr, nullptr, nullptr, nullptr), {"out is NULL"});
    EXPECT_ERROR(DSM_ERR_NULL_POINTER, lamb2(lk, -1.0f, f, nullptr, fake, nullptr), {"m is NULL"});

    EXPECT_ERROR(DSM_ERR_NULL_POINTER, inspect(fake, DSM_FLOAT32, 4, 1.0f, nullptr, nullptr), {"out is NULL"});
    EXPECT_ERROR(DSM_ERR_NULL_POINTER,
                 inspect(nullptr, DSM_FLOAT32, 4, 1.0f, reinterpret_cast<Reduction *>(fake), nullptr), {"g is NULL"});
    EXPECT_ERROR(DSM_ERR_INVALID_ARGUMENT,
                 inspect(fake, DSM_INT32, 4, 1.0f, reinterpret_cast<Reduction *>(fake), nullptr), {"inspect", "dtype"});
    EXPECT_ERROR(DSM_ERR_INVALID_ARGUMENT,
                 inspect(fake, DSM_FLOAT32, 4, 1.0f, reinterpret_cast<Reduction *>(odd), nullptr), {"out", "aligned"});

    EXPECT_ERROR(DSM_ERR_INVALID_ARGUMENT, convert(fake, DSM_FLOAT64, fake, DSM_FLOAT16, 4, nullptr),
                 {"convert source"});
    EXPECT_ERROR(DSM_ERR_INVALID_ARGUMENT, convert(fake, DSM_FLOAT32, fake, DSM_INT8, 0, nullptr),
                 {"convert destination"});
    EXPECT_ERROR(DSM_ERR_NULL_POINTER, convert(nullptr, DSM_FLOAT32, fake, DSM_FLOAT16, 4, nullptr), {"src is NULL"});
    EXPECT_ERROR(DSM_ERR_NULL_POINTER, convert(fake, DSM_FLOAT32, nullptr, DSM_FLOAT16, 4, nullptr), {"dst is NULL"});
    EXPECT_ERROR(DSM_ERR_INVALID_ARGUMENT, convert(odd, DSM_FLOAT32, fake, DSM_FLOAT16, 4, nullptr), {"src", "aligned"});

    unsigned char *const bytes = reinterpret_cast<unsigned char *>(fake);
    EXPECT_ERROR(DSM_ERR_NULL_POINTER, copy_2d(bytes, 8, nullptr, 8, 8, 2, nullptr), {"src is NULL"});
    EXPECT_ERROR(DSM_ERR_NULL_POINTER, copy_2d(nullptr, 8, bytes, 8, 8, 2, nullptr), {"dst is NULL"});
    EXPECT_ERROR(DSM_ERR_INVALID_ARGUMENT, copy_2d(bytes, 4, bytes, 8, 8, 2, nullptr), {"copy_2d", "pitches 4"});
    EXPECT_ERROR(DSM_ERR_INVALID_ARGUMENT, dsm::sp::heads_copy(geo, dsm::sp::HeadRange{3, 2}),
                 {"copy_heads", "heads [3, 5)"});
    EXPECT_ERROR(DSM_ERR_INVALID_ARGUMENT, dsm::sp::tokens_copy(geo, 2, dsm::sp::HeadRange{0, 2}),
                 {"copy_tokens", "chunk 2"});
}

} // namespace

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_argument_checks),
        cmocka_unit_test(test_mt_tables_after_failure),
        cmocka_unit_test(test_adam),
        cmocka_unit_test(test_adam_matches_adam_update),
        cmocka_unit_test(test_sgd),
        cmocka_unit_test(test_lion),
        cmocka_unit_test(test_adagrad),
        cmocka_unit_test(test_lamb),
        cmocka_unit_test(test_multi_tensor_updates),
        cmocka_unit_test(test_multi_tensor_accumulate),
        cmocka_unit_test(test_device_optimizer_fused),
        cmocka_unit_test(test_accumulate_pieces),
        cmocka_unit_test(test_inspect),
        cmocka_unit_test(test_convert),
        cmocka_unit_test(test_copies),
    };
    const int failed = cmocka_run_group_tests(tests, NULL, NULL);
    if (g_stream != nullptr) cudaStreamDestroy(g_stream);
    return failed;
}

#endif // DSM_HAVE_CUDA_KERNELS
