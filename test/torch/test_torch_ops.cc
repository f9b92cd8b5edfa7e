/*
 * torch.ops.dsm.seq_to_head / head_to_seq (libdsm_torch_ops), through the
 * dispatcher as TorchScript calls them:
 * - every element lands where the unsplit tensor has it, bit for bit, in the
 *   layouts [b, s, H, d], [s, b, H, d] and [b, H, s, d], for even, uneven
 *   and replicated (grouped-query) heads, fp32/fp64/bf16; round trips are the
 *   identity; each operator's gradient is the other's transform, exactly
 *   (replicated heads summed);
 * - a scripted transformer block (torch/ops/ulysses_block.py) run on this
 *   rank's tokens over a group of P ranks gives the outputs, input gradients
 *   and (summed over the group) parameter gradients of the same block
 *   without the operators run on the whole sequence, within 1e-12 relative
 *   in fp64 (its matrix products see other shapes when split);
 * - bad input on one rank or all (dimensions, dims, dtype, head counts,
 *   shapes that differ across ranks, no group set on a job of several
 *   ranks) throws on every rank, naming the value, without a hang.
 */
#include <torch/script.h>
#include <torch/types.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "dsm_torch_ops.h"
#include "mpi_test.h"

namespace {

// ---------------------------------------------------------------- checks
// A failed check is recorded and the test goes on; the test ends with
// CMocka's failure outside any C++ scope (CMocka leaves by longjmp).
std::string g_fail;

#define TCHECK(cond, ...)                                                                  \
    do {                                                                                  \
        if (!(cond) && g_fail.empty()) g_fail = c10::str("line ", __LINE__, ": ", __VA_ARGS__); \
    } while (0)

void run(void (*body)()) {
    try {
        body();
    } catch (const std::exception &e) {
        if (g_fail.empty()) g_fail = std::string("unexpected exception: ") + e.what();
    }
    if (g_fail.empty()) return;
    static char msg[4096];
    std::snprintf(msg, sizeof msg, "%s", g_fail.c_str());
    g_fail.clear();
    fail_msg("rank %d: %s", test_rank, msg);
}

#define OK(call)                                                                                \
    do {                                                                                        \
        const dsm_status_t st_ = (call);                                                        \
        TCHECK(st_ == DSM_SUCCESS, #call, ": ", dsm_status_string(st_), ": ", dsm_last_error()); \
    } while (0)

// f() throws c10::Error whose message contains `text`.
void expect_error(const std::function<void()> &f, const std::string &text, int line) {
    try {
        f();
    } catch (const c10::Error &e) {
        const std::string m = e.what_without_backtrace();
        TCHECK(m.find(text) != std::string::npos, "(from line ", line, ") message \"", m, "\" lacks \"", text, "\"");
        return;
    }
    TCHECK(false, "(from line ", line, ") no error; expected one naming \"", text, "\"");
}
#define EXPECT_ERROR(expr, text) expect_error([&] { (void)(expr); }, (text), __LINE__)

// ---------------------------------------------------------------- the operators

torch::Tensor seq_to_head(const torch::Tensor &x, int64_t seq_dim = 1, int64_t head_dim = 2, bool replicate = false) {
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("dsm::seq_to_head", "")
                         .typed<at::Tensor(const at::Tensor &, int64_t, int64_t, bool)>();
    return op.call(x, seq_dim, head_dim, replicate);
}

torch::Tensor head_to_seq(const torch::Tensor &x, int64_t heads, int64_t seq_dim = 1, int64_t head_dim = 2,
                          bool replicate = false) {
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("dsm::head_to_seq", "")
                         .typed<at::Tensor(const at::Tensor &, int64_t, int64_t, int64_t, bool)>();
    return op.call(x, heads, seq_dim, head_dim, replicate);
}

// A mesh of dp x sp over the world, the operators set on its sequence-parallel group.
struct SpMesh {
    dsm_mesh_t mesh = nullptr;
    int P = 1, r = 0;
    MPI_Comm comm = MPI_COMM_NULL;
    explicit SpMesh(int dp) {
        OK(dsm_mesh_create_dp_sp(MPI_COMM_WORLD, dp, -1, &mesh));
        OK(dsm_torch_ops_set_mesh(mesh, nullptr));
        OK(dsm_mesh_size(mesh, "sequence_parallel", &P));
        OK(dsm_mesh_rank(mesh, "sequence_parallel", &r));
        OK(dsm_mesh_comm(mesh, "sequence_parallel", &comm));
        int size = 0;
        OK(dsm_torch_ops_group_size(&size));
        TCHECK(size == P, "dsm_torch_ops_group_size gave ", size, ", expected ", P);
    }
    ~SpMesh() {
        dsm_torch_ops_clear();
        dsm_mesh_free(&mesh);
    }
};

// Distinct small integers (exact in every dtype used, sums included) for
// every element of a global tensor of `shape`; `salt` makes another tensor.
torch::Tensor distinct(c10::IntArrayRef shape, c10::ScalarType dt, int64_t salt) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    auto v = (torch::arange(n, torch::kLong) * 7 + salt * 13) % 251 - 125; // |v| <= 125: exact in bf16
    return v.reshape(shape).to(dt);
}

// ---------------------------------------------------------------- exact placement and gradients

struct Layout {
    int64_t seq_dim, head_dim;
};

void check_case(const SpMesh &m, Layout L, int64_t H, bool replicate, c10::ScalarType dt) {
    const int P = m.P, r = m.r;
    const int64_t b = 2, s = 4 * P, d = 3, chunk = s / P;
    // the operators take negative dims; the checks index with these
    const int64_t sd = L.seq_dim < 0 ? L.seq_dim + 4 : L.seq_dim, hd = L.head_dim < 0 ? L.head_dim + 4 : L.head_dim;
    std::vector<int64_t> shape(4);
    shape[static_cast<size_t>(3 - sd - hd)] = b;
    shape[static_cast<size_t>(sd)] = s;
    shape[static_cast<size_t>(hd)] = H;
    shape[3] = d;
    const std::string what = c10::str("P ", P, ", seq_dim ", L.seq_dim, ", head_dim ", L.head_dim, ", ", H, " heads",
                                      replicate ? " replicated" : "", ", ", c10::toString(dt));
    const torch::Tensor G = distinct(shape, dt, 0);
    auto range = [&](int rank) {
        int64_t first = 0, count = 0;
        OK(dsm_sp_head_range(H, replicate ? DSM_SP_REPLICATE : 0u, P, rank, &first, &count));
        return std::make_pair(first, count);
    };
    const auto mine = range(r);

    // forward: this rank's heads of every token, as in G
    torch::Tensor x = G.narrow(sd, r * chunk, chunk).clone().requires_grad_(true);
    torch::Tensor y = seq_to_head(x, L.seq_dim, L.head_dim, replicate);
    const torch::Tensor want_y = G.narrow(hd, mine.first, mine.second);
    TCHECK(y.sizes() == want_y.sizes() && torch::equal(y, want_y), what, ": seq_to_head gave ", y.sizes(), " != ",
          want_y.sizes(), " or different values");
    TCHECK(y.is_contiguous(), what, ": the output is not contiguous");

    // backward of seq_to_head: head_to_seq of the upstream gradient (replicas summed)
    std::vector<torch::Tensor> ups;
    torch::Tensor want_gx = torch::zeros(shape, torch::kDouble);
    for (int j = 0; j < P; ++j) {
        const auto rj = range(j);
        std::vector<int64_t> ushape = shape;
        ushape[static_cast<size_t>(hd)] = rj.second;
        ups.push_back(distinct(ushape, dt, 1 + j));
        want_gx.narrow(hd, rj.first, rj.second).add_(ups.back().to(torch::kDouble));
    }
    y.backward(ups[static_cast<size_t>(r)]);
    const torch::Tensor gx_want = want_gx.narrow(sd, r * chunk, chunk).to(dt);
    TCHECK(x.grad().defined() && torch::equal(x.grad(), gx_want), what, ": the gradient of seq_to_head differs");

    // head_to_seq: the inverse (for replicated heads: the sum of the copies)
    torch::Tensor yh = want_y.clone().requires_grad_(true);
    torch::Tensor z = head_to_seq(yh, H, L.seq_dim, L.head_dim, replicate);
    torch::Tensor want_z = G.narrow(sd, r * chunk, chunk);
    if (replicate && H < P) want_z = want_z * (P / H);
    TCHECK(torch::equal(z, want_z), what, ": head_to_seq did not invert seq_to_head");
    // its backward: seq_to_head of the upstream gradient
    const torch::Tensor gz = distinct(G.sizes(), dt, 99).narrow(sd, r * chunk, chunk).contiguous();
    z.backward(gz);
    const torch::Tensor gy_want = distinct(G.sizes(), dt, 99).narrow(hd, mine.first, mine.second);
    TCHECK(yh.grad().defined() && torch::equal(yh.grad(), gy_want), what, ": the gradient of head_to_seq differs");
}

void body_exact() {
    for (int dp : {1, 2}) {
        if (dp == 2 && test_size % 2 != 0) continue;
        SpMesh m(dp);
        for (Layout L : {Layout{1, 2}, Layout{0, 2}, Layout{2, 1}, Layout{-2, -3}})
            for (auto dt : {torch::kFloat, torch::kDouble, torch::kBFloat16}) {
                check_case(m, L, 4, false, dt);
                check_case(m, L, 3, false, dt); // uneven: 2+1, or 1+1+1+0 over 4
            }
        check_case(m, Layout{1, 2}, 2, true, torch::kFloat); // replicated when P = 4
        check_case(m, Layout{1, 2}, 1, true, torch::kDouble);
        check_case(m, Layout{0, 2}, 2, true, torch::kBFloat16);
    }
}

void test_exact(void **) { run(body_exact); }

// ---------------------------------------------------------------- the scripted block against itself unsplit

// The block, and the same block without the operators (the reference).
std::string block_file(const char *name) {
    const char *dir = std::getenv("top_builddir");
    return std::string(dir && *dir ? dir : ".") + "/test/torch/" + name;
}

// max |a - b| / max |b|
double rel_err(const torch::Tensor &a, const torch::Tensor &b) {
    const double scale = b.abs().max().item<double>();
    return (a - b).abs().max().item<double>() / (scale > 0 ? scale : 1.0);
}

void check_block(int dp) {
    const double tol = 1e-12; // fp64; measured around 1e-16
    torch::jit::Module ref = torch::jit::load(block_file("ulysses_block_ref.pt"));
    torch::jit::Module blk = torch::jit::load(block_file("ulysses_block.pt"));
    torch::manual_seed(1234); // the same full batch on every rank
    const int64_t b = 2, s = 8;
    const int64_t dim = (*ref.parameters().begin()).size(0);
    const torch::Tensor X = torch::randn({b, s, dim}, torch::kDouble);
    const torch::Tensor GY = torch::randn({b, s, dim}, torch::kDouble);

    // the whole sequence, without the operators
    torch::Tensor xr = X.clone().requires_grad_(true);
    torch::Tensor yr = ref.forward({xr}).toTensor();
    yr.backward(GY);

    // this rank's tokens over the group
    SpMesh m(dp);
    const int64_t chunk = s / m.P;
    torch::Tensor xs = X.narrow(1, m.r * chunk, chunk).clone().requires_grad_(true);
    torch::Tensor ys = blk.forward({xs}).toTensor();
    ys.backward(GY.narrow(1, m.r * chunk, chunk).contiguous());

    const std::string what = c10::str("dp ", dp, " x sp ", m.P, ", rank ", m.r, " of the group");
    double worst = 0;
    double e = rel_err(ys, yr.narrow(1, m.r * chunk, chunk));
    worst = std::max(worst, e);
    TCHECK(e <= tol, what, ": the output differs from the unsplit block's by ", e, " (relative)");
    e = rel_err(xs.grad(), xr.grad().narrow(1, m.r * chunk, chunk));
    worst = std::max(worst, e);
    TCHECK(e <= tol, what, ": the input gradient differs from the unsplit block's by ", e);
    auto pr = ref.named_parameters(), ps = blk.named_parameters();
    auto it = ps.begin();
    int n = 0;
    for (const auto &p : pr) {
        // a parameter's gradient is the sum of the group's (the engine sums over the group)
        torch::Tensor g = (*it).value.grad().contiguous().clone();
        MPI_Allreduce(MPI_IN_PLACE, g.data_ptr<double>(), static_cast<int>(g.numel()), MPI_DOUBLE, MPI_SUM, m.comm);
        e = rel_err(g, p.value.grad());
        worst = std::max(worst, e);
        TCHECK(e <= tol, what, ": the gradient of ", p.name, " differs from the unsplit block's by ", e);
        ++it;
        ++n;
    }
    TCHECK(n == 14, what, ": the block has ", n, " parameters, expected 14");
    if (test_rank == 0)
        std::printf("block dp %d x sp %d: outputs and %d gradients within %.3g of the unsplit block (tolerance %g)\n",
                    dp, m.P, n + 1, worst, tol);
}

void body_block() {
    check_block(1);
    if (test_size == 4) check_block(2);
}

void test_block(void **) { run(body_block); }

// ---------------------------------------------------------------- bad input

void body_bad() {
    SpMesh m(1);
    const int P = m.P, r = m.r, last = P - 1;
    const int64_t H = 4;
    const torch::Tensor x = torch::ones({2, 2, H, 3});
    const std::string last_rank = c10::str("rank ", last, " of ", P, ": ");

    // dimensions, on every rank and on the last rank only
    EXPECT_ERROR(seq_to_head(torch::ones({2, 2, 12})), "x has 3 dimensions [2, 2, 12]");
    EXPECT_ERROR(seq_to_head(r == last ? torch::ones({2, 2, 12}) : x), last_rank + "x has 3 dimensions");
    EXPECT_ERROR(head_to_seq(r == last ? torch::ones({2, 2, 1, 1, 3}) : x, H * P), last_rank + "x has 5 dimensions");
    // dims
    EXPECT_ERROR(seq_to_head(x, 3, 2), "seq_dim is 3");
    EXPECT_ERROR(seq_to_head(x, 1, r == last ? 4 : 2), last_rank + "head_dim is 4");
    EXPECT_ERROR(seq_to_head(x, 2, 2), "seq_dim and head_dim are both 2");
    // dtype
    EXPECT_ERROR(seq_to_head(torch::ones({2, 2, H, 3}, torch::kLong)), "x has dtype torch.int64");
    EXPECT_ERROR(seq_to_head(r == 0 ? torch::ones({2, 2, H, 3}, torch::kInt) : x), c10::str("rank 0 of ", P, ": x has dtype torch.int32"));
    // head counts: replicated heads that do not divide the group; a wrong total
    if (P > 1) {
        EXPECT_ERROR(seq_to_head(torch::ones({2, 2, 3, 3}), 1, 2, true), c10::str("3 heads over ", P, " ranks"));
        // heads in the shapes that differ across ranks: every rank names the mismatch
        EXPECT_ERROR(seq_to_head(torch::ones({2, 2, r == 0 ? 5 : 4, 3})), "differ across ranks");
        EXPECT_ERROR(seq_to_head(torch::ones({r == last ? 3 : 2, 2, H, 3})), "differ across ranks");
    }
    // P + 1 heads: rank 0 holds 2, the others 1
    EXPECT_ERROR(head_to_seq(torch::ones({2, 2 * P, 1, 3}), P + 1),
                 c10::str("x has 1 heads in dimension 2 but rank 0 of ", P, " holds 2 of the ", P + 1, " heads"));
    EXPECT_ERROR(head_to_seq(x, 0), "heads is 0");
    EXPECT_ERROR(seq_to_head(torch::ones({2, 2, 0, 3})), "x has 0 heads");
    // still usable after every failure
    torch::Tensor y = seq_to_head(x);
    TCHECK(y.size(1) == 2 * P && torch::equal(head_to_seq(y, H), x), "a transform after the failures failed");

    // an unknown group: nothing set afterwards
    const dsm_status_t st = dsm_torch_ops_set_mesh(m.mesh, "tensor_parallel");
    TCHECK(st == DSM_ERR_NOT_FOUND && std::string(dsm_last_error()).find("tensor_parallel") != std::string::npos,
          "set_mesh of an unknown group gave ", dsm_status_string(st), ": ", dsm_last_error());
    int size = 0;
    OK(dsm_torch_ops_group_size(&size));
    TCHECK(size == 1, "group size after a failed set is ", size);
    TCHECK(dsm_torch_ops_group_size(nullptr) == DSM_ERR_NULL_POINTER, "group_size(NULL) did not fail");

    // nothing set: an error on a job of several ranks, the identity (a new tensor) on one
    OK(dsm_torch_ops_clear());
    if (test_size > 1) {
        EXPECT_ERROR(seq_to_head(x), c10::str("no sequence-parallel group is set on this job of ", test_size, " MPI ranks"));
        EXPECT_ERROR(head_to_seq(x, H), "call dsm_torch_ops_set_mesh() first");
    } else {
        torch::Tensor id = seq_to_head(x);
        TCHECK(torch::equal(id, x) && id.data_ptr() != x.data_ptr(), "with nothing set on one rank: not a copy of x");
    }
    // no sequence parallelism (a NULL mesh; a mesh without the group): the identity, checks kept
    for (int k = 0; k < 2; ++k) {
        dsm_mesh_t plain = nullptr;
        if (k == 0) {
            OK(dsm_torch_ops_set_mesh(nullptr, nullptr));
        } else {
            const int shape[] = {-1};
            const char *names[] = {"data_parallel"};
            OK(dsm_mesh_create(MPI_COMM_WORLD, 1, shape, names, &plain));
            OK(dsm_torch_ops_set_mesh(plain, nullptr));
        }
        torch::Tensor xs = torch::ones({2, 3, H, 3}).requires_grad_(true);
        torch::Tensor id = seq_to_head(xs);
        TCHECK(torch::equal(id, xs) && id.data_ptr() != xs.data_ptr(), "no sequence parallelism: not a copy of x");
        (id * 2).sum().backward();
        TCHECK(torch::equal(xs.grad(), torch::full_like(xs, 2)), "no sequence parallelism: seq_to_head's gradient is not the identity");
        torch::Tensor ys = torch::ones({2, 3, H, 3}).requires_grad_(true);
        (head_to_seq(ys, H) * 3).sum().backward();
        TCHECK(torch::equal(ys.grad(), torch::full_like(ys, 3)), "no sequence parallelism: head_to_seq's gradient is not the identity");
        EXPECT_ERROR(seq_to_head(torch::ones({2, 2, H, 3}, torch::kLong)), "x has dtype torch.int64");
        EXPECT_ERROR(head_to_seq(x, H + 1), "x has 4 heads in dimension 2 but rank 0 of 1 holds 5 of the 5 heads");
        OK(dsm_torch_ops_clear());
        if (plain) OK(dsm_mesh_free(&plain));
    }
}

void test_bad(void **) { run(body_bad); }

} // namespace

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exact),
        cmocka_unit_test(test_block),
        cmocka_unit_test(test_bad),
    };
    return RUN_MPI_TESTS("test_torch_ops", tests);
}
