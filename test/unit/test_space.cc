// The memory spaces (device/space.hpp) and amp's math on them (amp/math.hpp):
// the simulated device defers its work until something waits for it, and
// computes the host's bits; the CUDA space reports a missing device.
#include "amp/math.hpp"
#include "device/space.hpp"
#include "optim/optimizer.hpp"

#include <cstring>

#include "cxx_test.h"

using dsm::device::Buffer;
using dsm::device::Kind;
using dsm::device::Space;

// Work on the simulated device runs when the space waits, in the order it
// was enqueued; host memory given to upload may be reused at once.
static void test_sim_defers(void **) {
    std::unique_ptr<Space> sim = dsm::device::make_sim();
    assert_int_equal(static_cast<int>(sim->kind()), static_cast<int>(Kind::SIM));
    assert_true(sim->host_addressable());
    assert_string_equal(sim->name().c_str(), "simulated");
    Buffer b(*sim, 16 * sizeof(float), false);
    float ones[16], out[16];
    for (float &x : ones) x = 1.0f;
    sim->upload(b.data(), ones, sizeof ones);
    for (float &x : ones) x = 5.0f; // reused before the queue ran
    const float *p = static_cast<const float *>(b.data());
    uint32_t bits;
    std::memcpy(&bits, &p[0], 4);
    assert_int_equal(bits, 0xffffffffu); // still the poison: nothing ran
    sim->download(out, b.data(), sizeof out);
    for (float x : out) assert_true(x == 1.0f);
    // zero, then a copy within the space, in order.
    Buffer c(*sim, 16 * sizeof(float));
    sim->copy(c.data(), b.data(), 8 * sizeof(float));
    sim->download(out, c.data(), sizeof out);
    for (int i = 0; i < 16; ++i) assert_true(out[i] == (i < 8 ? 1.0f : 0.0f));
    // A collective's wait: the queue's wait function runs the queue.
    sim->zero(b.data(), b.bytes());
    const dsm::device::Queue q = sim->queue();
    assert_false(q.is_host());
    assert_non_null(q.wait_fn());
    q.wait_fn()(q.handle());
    assert_true(p[3] == 0.0f);
    // Host code through run(), deferred too.
    int ran = 0;
    sim->run([&] { ran = 1; });
    assert_int_equal(ran, 0);
    sim->synchronize();
    assert_int_equal(ran, 1);
}

// A mark waits for the work before it and no more; idle() is false while
// work is queued.
static void test_sim_marks(void **) {
    std::unique_ptr<Space> sim = dsm::device::make_sim();
    assert_true(sim->idle());
    int a = 0, b = 0;
    sim->run([&] { a = 1; });
    std::unique_ptr<Space::Mark> m = sim->mark();
    sim->record(*m);
    sim->run([&] { b = 1; });
    assert_false(sim->idle());
    sim->wait_mark(*m);
    assert_int_equal(a, 1);
    assert_int_equal(b, 0);
    sim->wait_mark(*m); // again: nothing more
    assert_int_equal(b, 0);
    sim->synchronize();
    assert_int_equal(b, 1);
    assert_true(sim->idle());
    std::string why;
    int x = 0;
    assert_true(sim->pin(&x, sizeof x, why));
}

// A failure in the queue is thrown by the wait, and drops the rest.
static void test_sim_failure(void **) {
    std::unique_ptr<Space> sim = dsm::device::make_sim();
    int after = 0;
    sim->run([] { DSM_FAIL(DSM_ERR_INTERNAL, "queued work failed"); });
    sim->run([&] { after = 1; });
    expect_error_at([&] { sim->synchronize(); }, DSM_ERR_INTERNAL, {"queued work failed"}, __LINE__);
    assert_int_equal(after, 0);
    sim->synchronize(); // empty now
}

// The host space runs everything at once; its queue is the host queue.
static void test_host(void **) {
    Space &h = dsm::device::host();
    assert_int_equal(static_cast<int>(h.kind()), static_cast<int>(Kind::HOST));
    assert_true(h.queue().is_host());
    Buffer b(64);
    assert_non_null(b.data());
    assert_true(b.space() == &h);
    const float *p = static_cast<const float *>(b.data());
    for (int i = 0; i < 16; ++i) assert_true(p[i] == 0.0f); // zeroed
    int ran = 0;
    h.run([&] { ran = 1; });
    assert_int_equal(ran, 1);
}

// amp's table on the simulated device gives the host table's bits.
static void test_math_bits(void **) {
    std::unique_ptr<Space> sim = dsm::device::make_sim();
    std::unique_ptr<dsm::amp::Math> hm = dsm::amp::make_math(dsm::device::host());
    std::unique_ptr<dsm::amp::Math> sm = dsm::amp::make_math(*sim);
    const size_t n = 1000;
    std::vector<float> x(n), acc(n);
    for (size_t i = 0; i < n; ++i) {
        x[i] = std::sin(0.37f * static_cast<float>(i)) * 3.0f;
        acc[i] = std::cos(0.11f * static_cast<float>(i));
    }
    const dsm_dtype_t types[] = {DSM_FLOAT32, DSM_FLOAT16, DSM_BFLOAT16};
    for (dsm_dtype_t t : types) {
        const size_t es = t == DSM_FLOAT32 ? 4 : 2;
        // host
        std::vector<unsigned char> h16(n * es);
        std::vector<float> hacc = acc;
        hm->convert(x.data(), DSM_FLOAT32, h16.data(), t, n);
        hm->scale(h16.data(), t, n, 0.3);
        hm->accumulate(h16.data(), t, hacc.data(), n, 0.7f);
        const dsm::amp::NormPart hn = hm->inspect(hacc.data(), n, 0.5f);
        // simulated device
        Buffer d32(*sim, n * 4, false), d16(*sim, n * es, false), dacc(*sim, n * 4, false);
        sim->upload(d32.data(), x.data(), n * 4);
        sim->upload(dacc.data(), acc.data(), n * 4);
        sm->convert(d32.data(), DSM_FLOAT32, d16.data(), t, n);
        sm->scale(d16.data(), t, n, 0.3);
        sm->accumulate(d16.data(), t, static_cast<float *>(dacc.data()), n, 0.7f);
        const dsm::amp::NormPart sn = sm->inspect(static_cast<const float *>(dacc.data()), n, 0.5f);
        std::vector<float> sacc(n);
        sim->download(sacc.data(), dacc.data(), n * 4);
        assert_memory_equal(sacc.data(), hacc.data(), n * 4);
        assert_memory_equal(&sn.sumsq, &hn.sumsq, sizeof(double));
        assert_int_equal(sn.nonfinite, hn.nonfinite);
        assert_false(sm->has_nonfinite(d16.data(), t, n));
        // accumulate_into a 16-bit destination.
        std::vector<unsigned char> hdst = h16;
        hm->accumulate_into(x.data(), DSM_FLOAT32, hdst.data(), t, n, 0.25f);
        sm->accumulate_into(d32.data(), DSM_FLOAT32, d16.data(), t, n, 0.25f);
        std::vector<unsigned char> sdst(n * es);
        sim->download(sdst.data(), d16.data(), n * es);
        assert_memory_equal(sdst.data(), hdst.data(), n * es);
    }
    // A NaN is seen.
    Buffer bad(*sim, 8 * 4); // zeroed
    const float nan = NAN;
    sim->upload(static_cast<float *>(bad.data()) + 5, &nan, 4);
    assert_true(sm->has_nonfinite(bad.data(), DSM_FLOAT32, 8));
    assert_true(sm->inspect(static_cast<const float *>(bad.data()), 8, 1.0f).nonfinite);
}

// The optimizer on the simulated device: deferred, and the host's bits.
static void test_optimizer_bits(void **) {
    std::unique_ptr<Space> sim = dsm::device::make_sim();
    dsm::optim::Hyper h;
    h.weight_decay = 0.1;
    const size_t n = 40000; // more than one chunk
    std::vector<float> p(n), g(n);
    for (size_t i = 0; i < n; ++i) {
        p[i] = std::sin(0.01f * static_cast<float>(i));
        g[i] = std::cos(0.03f * static_cast<float>(i));
    }
    std::vector<dsm::optim::Segment> segs = {{0, 25000, 0, true}, {25000, 15000, 1, false}};
    dsm::optim::StepArgs a;
    a.lr = 0.01;
    dsm::optim::Optimizer host(h, n);
    std::vector<float> hp = p;
    host.step(hp.data(), g.data(), segs, a);
    dsm::optim::Optimizer dev(h, n, *sim);
    Buffer dp(*sim, n * 4, false), dg(*sim, n * 4, false);
    sim->upload(dp.data(), p.data(), n * 4);
    sim->upload(dg.data(), g.data(), n * 4);
    dev.step(static_cast<float *>(dp.data()), static_cast<const float *>(dg.data()), segs, a);
    std::vector<float> sp(n), sm(n);
    sim->download(sp.data(), dp.data(), n * 4);
    sim->download(sm.data(), dev.state(0), n * 4);
    assert_memory_equal(sp.data(), hp.data(), n * 4);
    assert_memory_equal(sm.data(), host.state(0), n * 4);
}

// Without a GPU (this machine), the CUDA space and a stream on another
// space are DSM_ERR_NOT_SUPPORTED, naming why.
static void test_cuda_absent(void **) {
    std::unique_ptr<Space> cuda;
    try {
        cuda = dsm::device::make_cuda(0);
    } catch (const dsm::Error &e) {
        assert_true(e.status() == DSM_ERR_NOT_SUPPORTED || e.status() == DSM_ERR_CUDA);
    }
    if (cuda) {
        // A GPU is here: its queue is a stream, and the host cannot run on it.
        assert_false(cuda->host_addressable());
        expect_error_at([&] { cuda->run([] {}); }, DSM_ERR_INTERNAL, {"host code cannot run"}, __LINE__);
    }
    std::unique_ptr<Space> sim = dsm::device::make_sim();
    expect_error_at([&] { dsm::device::set_stream(*sim, nullptr); }, DSM_ERR_NOT_SUPPORTED, {"simulated"}, __LINE__);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sim_defers), cmocka_unit_test(test_sim_marks),
        cmocka_unit_test(test_sim_failure),
        cmocka_unit_test(test_host),       cmocka_unit_test(test_math_bits),
        cmocka_unit_test(test_optimizer_bits), cmocka_unit_test(test_cuda_absent),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
