/*
 * ZeRO++ quantized communication: qwZ (zero_quantized_weights, ZeRO-3's
 * gathers in int8 blocks) and qgZ (zero_quantized_gradients, stages 2 and 3:
 * the hierarchical int4 reduction of the gradients).
 *
 * - tolerance: from the same start, the update of a step (SGD, so that the
 *   update is the averaged gradient times the learning rate) with qwZ, qgZ,
 *   both, and both with hpZ, fp32 and bf16, with and without overlap_comm,
 *   differs from the unquantized step's by at most 2% (qwZ alone: int8
 *   weights only perturb the gradient through the values it reads) or 20%
 *   (qgZ: two int4 roundings, each within max|g| / 14 of its block) of the
 *   update's norm, and every element of every parameter, the small ones
 *   included, within the bound derived from those roundings (grad_bound
 *   below). One AdamW step moves each element by lr x sign(g) (plus the
 *   decay): where the mean gradient is larger than that bound, the
 *   quantized step must move it exactly as the unquantized one does. Master
 *   weights never see quantized values: without a gradient (lr 0) the
 *   parameters keep their bits, and each later gather of a parameter in a
 *   micro-step gives the bits of its first.
 * - off-node bytes: on two nodes (simulated with DSM_SIM_NODES at 4 ranks,
 *   or the real ones when the job spans nodes of equal sizes), the bytes a
 *   ZeRO-3 step sends off the node, counted by the engine, with hpZ + qwZ +
 *   qgZ are at most 0.3x those of plain ZeRO-3; dsm_engine_describe()
 *   reports the quantized bytes next to their full-precision equivalent.
 * - bad values: qwZ below stage 3, qgZ below stage 2, a bad DSM_QWZ_BLOCK or
 *   DSM_QGZ_BLOCK, or block sizes that differ between ranks fail
 *   dsm_engine_init() on every rank with a message naming the value.
 */
#include "dsm_config.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "mpi_test.h"
#include "engine_memory.h"

#define NP 4
static const int64_t shape[NP] = {3000, 37, 1515, 8};
static const char *names[NP] = {"a", "b", "c", "d"};
#define MAXN 3000

static int init_fn(void *user, int index, const char *name, int64_t offset, int64_t count, float *values) {
    (void)user;
    (void)name;
    for (int64_t i = 0; i < count; ++i) values[i] = 0.5f * test_hashf(11u + (unsigned)index, (unsigned)(offset + i));
    return 0;
}

static void params(dsm_param_desc_t d[NP]) { test_vector_params(d, NP, names, shape, init_fn); }

typedef struct {
    const char *precision;
    int stage, overlap, hpz, qwz, qgz;
} variant_t;

/* No gradient clipping (its default 1.0 would scale each step by
   1 / ||g||, and the bounds below with it). stage3_max_reuse_distance 0:
   the backward gathers every parameter again (as for a model larger than
   the distance), so that a ZeRO-3 step moves three parameter passes
   (forward gather, backward gather, reduce-scatter). */
static int reuse0;

static void make_config(char *buf, size_t len, const variant_t *v, const char *optimizer) {
    snprintf(buf, len,
             "{\"train_micro_batch_size_per_gpu\": 1, \"gradient_accumulation_steps\": 1, %s"
             " \"steps_per_print\": 1000000, \"gradient_clipping\": 0.0,"
             " \"zero_optimization\": {\"stage\": %d, \"overlap_comm\": %s, \"reduce_bucket_size\": 2000,"
             " \"stage3_param_persistence_threshold\": 0, \"stage3_prefetch_bucket_size\": 600,%s"
             " \"zero_hpz_partition_size\": %d, \"zero_quantized_weights\": %s,"
             " \"zero_quantized_gradients\": %s},"
             " \"optimizer\": %s}",
             v->precision, v->stage, v->overlap ? "true" : "false", reuse0 ? " \"stage3_max_reuse_distance\": 0," : "", v->hpz, v->qwz ? "true" : "false",
             v->qgz ? "true" : "false", optimizer);
}

typedef struct {
    unsigned long long off_node;
    unsigned long long g_off, g_full_off, r_on, r_full_on, r_off, r_full_off; /* quantized bytes, last step */
} report_t;

static report_t describe(dsm_engine_t e, const variant_t *v) {
    char *text = NULL;
    ASSERT_OK(dsm_engine_describe(e, DSM_FORMAT_JSON, &text));
    report_t r;
    memset(&r, 0, sizeof r);
    r.off_node = test_json_after(text, "\"last_step\"", "\"bytes_off_node\":");
    const char *z = strstr(text, "\"zeropp_quantization\"");
    assert_non_null(z);
    assert_int_equal(strstr(z, "\"weights\":true") != NULL, v->qwz);
    assert_int_equal(strstr(z, "\"gradients\":true") != NULL, v->qgz);
    r.g_off = test_json_after(z, "\"gather\"", "\"sent_off_node\":");
    r.g_full_off = test_json_after(z, "\"gather\"", "\"full_precision_off_node\":");
    r.r_on = test_json_after(z, "\"reduce\"", "\"sent_on_node\":");
    r.r_full_on = test_json_after(z, "\"reduce\"", "\"full_precision_on_node\":");
    r.r_off = test_json_after(z, "\"reduce\"", "\"sent_off_node\":");
    r.r_full_off = test_json_after(z, "\"reduce\"", "\"full_precision_off_node\":");
    dsm_free(text);
    ASSERT_OK(dsm_engine_describe(e, DSM_FORMAT_TEXT, &text));
    if (v->qwz || v->qgz) assert_non_null(strstr(text, "ZeRO++ quantized communication:"));
    dsm_free(text);
    return r;
}

/* The gradient rank r adds at step s to element j of parameter i, from the
   value v it read: a part common to the ranks (so that the mean gradient of
   every parameter, the small ones too, is of the order of the largest
   one), one that depends on the rank, with magnitudes that vary between
   the quantization blocks, and one that depends on the values read. */
static float grad_of(int i, int64_t j, int r, int s, float v) {
    return 0.05f * v + 0.5f * test_hashf(71u + (unsigned)i, (unsigned)j) +
           0.002f * test_hashf((unsigned)(r * 131 + s * 7), (unsigned)j) * (1.0f + (float)((j * 31 + i * 17) % 97));
}

/* Train `steps` steps: each reads every parameter forward, then backward
   (whose gather must give the forward's bits), and adds a gradient that
   depends on the values read and on the rank. out: the final values. */
static report_t train(dsm_mesh_t mesh, const variant_t *v, const char *opt, int steps, float out[NP][MAXN]) {
    char cfg[1200];
    make_config(cfg, sizeof cfg, v, opt);
    dsm_param_desc_t d[NP];
    params(d);
    dsm_engine_t e = NULL;
    ASSERT_OK(dsm_engine_init(mesh, cfg, d, NP, &e));
    dsm_dtype_t dt;
    size_t es = 0;
    ASSERT_OK(dsm_engine_dtype(e, &dt));
    ASSERT_OK(dsm_dtype_size(dt, &es));
    static unsigned char fwd[NP][MAXN * 4], now[MAXN * 4];
    static float vals[MAXN], g[MAXN];
    for (int s = 0; s < steps; ++s) {
        for (int i = 0; i < NP; ++i) {
            const void *p;
            ASSERT_OK(dsm_engine_param_acquire(e, i, &p));
            engine_copy(e, fwd[i], p, (size_t)shape[i] * es);
            ASSERT_OK(dsm_engine_param_release(e, i));
        }
        for (int i = NP - 1; i >= 0; --i) {
            const void *p;
            void *grad;
            ASSERT_OK(dsm_engine_param_acquire(e, i, &p));
            engine_copy(e, now, p, (size_t)shape[i] * es);
            if (memcmp(now, fwd[i], (size_t)shape[i] * es) != 0)
                fail_msg("step %d: parameter '%s' gathered again differs from its first gather", s, names[i]);
            engine_read_f32(e, p, vals, (size_t)shape[i]);
            for (int64_t j = 0; j < shape[i]; ++j) g[j] = grad_of(i, j, test_rank, s, vals[j]);
            ASSERT_OK(dsm_engine_grad_acquire(e, i, &grad));
            engine_write_f32(e, grad, g, (size_t)shape[i]);
            ASSERT_OK(dsm_engine_grad_release(e, i));
            ASSERT_OK(dsm_engine_param_release(e, i));
        }
        ASSERT_OK(dsm_step(e, NULL));
    }
    const report_t r = describe(e, v);
    if (out)
        for (int i = 0; i < NP; ++i) ASSERT_OK(dsm_engine_param_read_f32(e, i, out[i], shape[i]));
    ASSERT_OK(dsm_engine_free(&e));
    return r;
}

static const char *sgd = "{\"type\": \"SGD\", \"params\": {\"lr\": 0.5}}";
static const char *sgd0 = "{\"type\": \"SGD\", \"params\": {\"lr\": 0.0}}";
static const char *adamw = "{\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.1}}";
#define SGD_LR 0.5
#define ADAMW_LR 0.01

/* One rounding of a block whose largest magnitude is a: half the step
   a / qmax (int4: qmax 7, int8: 127) plus a few ulps of a (fp32). */
static double eb4(double a) { return a / 14.0 + 8.0 * FLT_EPSILON * a; }
static double eb8(double a) { return a / 254.0 + 8.0 * FLT_EPSILON * a; }

/* The largest |gradient| any rank adds at the first step (from p0). */
static double grad_max(void) {
    static float p0[MAXN];
    double m = 0;
    for (int i = 0; i < NP; ++i) {
        init_fn(NULL, i, names[i], 0, shape[i], p0);
        for (int64_t j = 0; j < shape[i]; ++j)
            for (int r = 0; r < test_size; ++r) m = fmax(m, fabs((double)grad_of(i, j, r, 0, p0[j])));
    }
    return m;
}

/* The mean over the ranks of the first step's gradient of element j of
   parameter i (fp32 values read). */
static double grad_mean(int i, int64_t j, float p0j) {
    double m = 0;
    for (int r = 0; r < test_size; ++r) m += grad_of(i, j, r, 0, p0j);
    return m / test_size;
}

/* How far the mean gradient of one element of the quantized first step may
   be from the unquantized one's, G being the largest |gradient| of a rank
   (the blocks follow the engine's buckets, which mix parameters, so any
   block may hold it):
   - qwZ: each value read moves by at most eb8(max |p0| = 0.5) (int8), so
     the gradient by 0.05 x that;
   - qgZ: the mean of the ranks' sums, where each rank rounds its blocks
     once (at most eb4(G) each, eb4(G) on the mean) and each node's
     collector rounds the node's sum once more (at most n x (G + eb4(G)) in
     magnitude for n members: eb4(G + eb4(G)) on the mean);
   - bf16: the unquantized reduction adds bf16 values, rounding each
     partial sum of k ranks' values (at most k G) to bf16 (2^-9 relative):
     at most W^2 / 2 x 2^-9 G over the W ranks, W / 2 x 2^-9 G on the mean;
     the mean and the values read are rounded once more on each side: with
     the rest, (W + 4) x 2^-9 G. */
static double grad_bound(const variant_t *v, int bf16, double G) {
    const double wq = v->qwz ? 0.05 * eb8(0.5) : 0.0, g = G + wq;
    return wq + (v->qgz ? eb4(g) + eb4(g + eb4(g)) : 0.0) + (bf16 ? ldexp(g, -9) * (test_size + 4) : 0.0);
}

/* Elements whose quantized update differs from the unquantized one's by
   more than lr x grad_bound() (plus a few ulps of the values). */
static void check_elements(const char *what, float q[NP][MAXN], float u[NP][MAXN], double bound) {
    for (int i = 0; i < NP; ++i)
        for (int64_t j = 0; j < shape[i]; ++j) {
            const double d = fabs((double)q[i][j] - u[i][j]), tol = bound + 4.0 * FLT_EPSILON * (1.0 + fabs(u[i][j]));
            if (!(d <= tol))
                fail_msg("%s: parameter '%s'[%lld] (of %lld) is %.9g after the quantized step, %.9g after the "
                         "unquantized one: %.3g apart, bound %.3g", what, names[i], (long long)j, (long long)shape[i],
                         q[i][j], u[i][j], d, tol);
        }
}

/* ||(q - p0) - (u - p0)|| / ||u - p0||: the quantized step's update against the plain one's. */
static double update_error(float q[NP][MAXN], float u[NP][MAXN]) {
    double diff = 0, norm = 0;
    dsm_param_desc_t d[NP];
    params(d);
    static float p0[MAXN];
    for (int i = 0; i < NP; ++i) {
        init_fn(NULL, i, names[i], 0, shape[i], p0);
        for (int64_t j = 0; j < shape[i]; ++j) {
            const double a = (double)q[i][j] - p0[j], b = (double)u[i][j] - p0[j];
            diff += (a - b) * (a - b);
            norm += b * b;
        }
    }
    return norm > 0 ? sqrt(diff / norm) : 0;
}

static void test_tolerance(void **state) {
    (void)state;
    static float plain[NP][MAXN], quant[NP][MAXN];
    const char *precisions[2] = {"", "\"bf16\": {\"enabled\": true},"};
    /* The job's nodes; on one real node also 2 simulated ones (block) and
       two uneven ones (all ranks but the last on one node): qgZ's exchange
       between nodes, with nodes of equal and of different sizes. */
    char uneven[256] = "";
    for (int r = 0; r < test_size && test_size >= 3; ++r) strcat(uneven, r == test_size - 1 ? "b" : "a,");
    const char *sims[3] = {NULL, test_size % 2 == 0 && test_size >= 2 ? "2:block" : NULL, test_size >= 3 ? uneven : NULL};
    for (int sim = 0; sim < 3; ++sim) {
        if (sim > 0 && (sims[sim] == NULL || test_nnodes > 1)) continue;
        if (sims[sim]) setenv("DSM_SIM_NODES", sims[sim], 1);
        dsm_mesh_t mesh = test_dp_mesh();
        const int hpz = test_size % 2 == 0 && test_size > 1 && sim != 2 ? 2 : 1;
        const double G = grad_max();
        for (int pr = 0; pr < 2; ++pr)
            for (int overlap = 0; overlap <= 1; ++overlap) {
                if (sim > 0 && (pr > 0 || overlap > 0)) continue; /* the simulated nodes: fp32, blocking */
            const variant_t cases[] = {
                {precisions[pr], 3, overlap, 1, 1, 0}, {precisions[pr], 3, overlap, 1, 0, 1},
                {precisions[pr], 3, overlap, 1, 1, 1}, {precisions[pr], 3, overlap, hpz, 1, 1},
                {precisions[pr], 2, overlap, 1, 0, 1},
            };
            for (size_t k = 0; k < sizeof cases / sizeof cases[0]; ++k) {
                variant_t base = cases[k];
                base.qwz = base.qgz = 0;
                base.hpz = 1;
                train(mesh, &base, sgd, 1, plain);
                train(mesh, &cases[k], sgd, 1, quant);
                const double err = update_error(quant, plain), tol = cases[k].qgz ? 0.20 : 0.02;
                char what[160];
                snprintf(what, sizeof what, "%s stage %d overlap %d hpZ %d qwZ %d qgZ %d", pr ? "bf16" : "fp32",
                         cases[k].stage, overlap, cases[k].hpz, cases[k].qwz, cases[k].qgz);
                if (!(err <= tol))
                    fail_msg("%s: the step's update differs by %.4f of its norm from the unquantized one (tolerance "
                             "%.2f)", what, err, tol);
                check_elements(what, quant, plain, SGD_LR * grad_bound(&cases[k], pr, G));
                if (test_rank == 0 && pr == 0 && overlap == 0)
                    print_message("[          ] nodes %s: stage %d hpZ %d qwZ %d qgZ %d: update error %.4f\n",
                                  sims[sim] ? sims[sim] : "(the job's)", cases[k].stage, cases[k].hpz, cases[k].qwz,
                                  cases[k].qgz, err);
            }
        }
        if (sim > 0) {
            ASSERT_OK(dsm_mesh_free(&mesh));
            unsetenv("DSM_SIM_NODES");
            continue;
        }
    /* One AdamW step: m / sqrt(v) is g / |g| at the first step, so each
       element moves by lr x sign(mean g) plus the decay, whatever the
       gradient's size. Where |mean g| exceeds what quantization may move
       it by, the sign and so the update are the unquantized step's (a few
       ulps apart); elsewhere the two differ by at most 2 lr. A zeroed, a
       negated or a garbage gradient moves elements the wrong way. */
    {
        const variant_t v = {"", 3, 1, hpz, 1, 1}, b = {"", 3, 1, 1, 0, 0};
        train(mesh, &b, adamw, 1, plain);
        train(mesh, &v, adamw, 1, quant);
        const double gb = grad_bound(&v, 0, G);
        static float p0[MAXN];
        long sure = 0;
        for (int i = 0; i < NP; ++i) {
            init_fn(NULL, i, names[i], 0, shape[i], p0);
            for (int64_t j = 0; j < shape[i]; ++j) {
                const double gm = grad_mean(i, j, p0[j]), d = fabs((double)quant[i][j] - plain[i][j]);
                const int decided = fabs(gm) > gb;
                const double tol = (decided ? 1e-6 : 2.0) * ADAMW_LR + 4.0 * FLT_EPSILON * (1.0 + fabs(plain[i][j]));
                sure += decided;
                if (!(d <= tol))
                    fail_msg("AdamW: parameter '%s'[%lld] (of %lld) is %.9g after the quantized step, %.9g after the "
                             "unquantized one (mean gradient %.4g, quantization moves it by %.3g at most)", names[i],
                             (long long)j, (long long)shape[i], quant[i][j], plain[i][j], gm, gb);
            }
        }
        if (test_rank == 0)
            print_message("[          ] AdamW: %ld elements whose update's sign quantization cannot flip\n", sure);
    }
    /* lr 0: the master weights never see the quantized values. */
    {
        const variant_t v = {"", 3, 0, hpz, 1, 1};
        train(mesh, &v, sgd0, 2, quant);
        static float p0[MAXN];
        for (int i = 0; i < NP; ++i) {
            init_fn(NULL, i, names[i], 0, shape[i], p0);
            if (memcmp(p0, quant[i], (size_t)shape[i] * sizeof(float)) != 0)
                fail_msg("lr 0: parameter '%s' changed", names[i]);
        }
    }
    ASSERT_OK(dsm_mesh_free(&mesh));
    }
}

/* Two nodes of equal size: the real ones, else simulated (block order). */
static int two_nodes(int *per_node) {
    if (test_nnodes > 1) {
        for (int r = 0; r < test_size; ++r)
            if (test_node_size(r) != test_node_size(0)) return 0;
        *per_node = test_node_size(0);
        return *per_node >= 2 ? test_nnodes : 0;
    }
    if (test_size % 2 || test_size < 4) return 0;
    setenv("DSM_SIM_NODES", "2:block", 1);
    *per_node = test_size / 2;
    return 2;
}

static void test_off_node(void **state) {
    (void)state;
    int per = 0;
    const int nodes = two_nodes(&per);
    if (nodes < 2) {
        unsetenv("DSM_SIM_NODES");
        skip();
        return;
    }
    dsm_mesh_t mesh = test_dp_mesh();
    const char *precisions[2] = {"", "\"bf16\": {\"enabled\": true},"};
    reuse0 = 1;
    for (int pr = 0; pr < 2; ++pr) {
        const variant_t plain_v = {precisions[pr], 3, 0, 1, 0, 0}, all_v = {precisions[pr], 3, 0, per, 1, 1};
        const report_t plain = train(mesh, &plain_v, sgd, 2, NULL), all = train(mesh, &all_v, sgd, 2, NULL);
        unsigned long long mine[2] = {plain.off_node, all.off_node}, tot[2];
        MPI_Allreduce(mine, tot, 2, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
        const double ratio = (double)tot[1] / (double)tot[0];
        if (test_rank == 0)
            print_message("[          ] %d nodes x %d, %s: off-node bytes per ZeRO-3 step %llu plain, %llu with hpZ + "
                          "qwZ + qgZ (%.3fx)\n", nodes, per, pr ? "bf16" : "fp32", tot[0], tot[1], ratio);
        if (!(ratio <= 0.3))
            fail_msg("%s: hpZ + qwZ + qgZ send %.3fx the off-node bytes of plain ZeRO-3 (at most 0.3x)",
                     pr ? "bf16" : "fp32", ratio);
        /* The report: quantized bytes off the node, less than at full precision. */
        /* int8 against 4 or 2 bytes, int4 against 4 or 2, with a scale per block. */
        const double gmax = pr ? 0.6 : 0.3, rmax = pr ? 0.35 : 0.2;
        if (!(all.g_off > 0 && all.g_off <= gmax * (double)all.g_full_off && all.r_off > 0 &&
              all.r_off <= rmax * (double)all.r_full_off && all.r_on <= rmax * (double)all.r_full_on))
            fail_msg("%s: quantized bytes: gathers %llu off the node (%llu at full precision), reductions %llu "
                     "(%llu) off and %llu (%llu) on the node", pr ? "bf16" : "fp32", all.g_off, all.g_full_off,
                     all.r_off, all.r_full_off, all.r_on, all.r_full_on);
        assert_true(plain.g_off == 0 && plain.r_off == 0 && plain.r_on == 0);
    }
    reuse0 = 0;
    ASSERT_OK(dsm_mesh_free(&mesh));
    unsetenv("DSM_SIM_NODES");
}

static void test_bad_values(void **state) {
    (void)state;
    char cfg[1200], want[200];
    dsm_param_desc_t d[NP];
    params(d);
    dsm_mesh_t mesh = test_dp_mesh();
    dsm_engine_t e = NULL;
    for (int stage = 0; stage <= 2; ++stage) {
        const variant_t v = {"", stage, 0, 1, 1, 0};
        make_config(cfg, sizeof cfg, &v, sgd);
        snprintf(want, sizeof want, "zero_optimization.zero_quantized_weights: true needs ZeRO stage 3 "
                 "(qwZ quantizes the gathers of partitioned parameters), stage is %d", stage);
        ASSERT_FAILS(dsm_engine_init(mesh, cfg, d, NP, &e), DSM_ERR_CONFIG, want);
        assert_null(e);
    }
    for (int stage = 0; stage <= 1; ++stage) {
        const variant_t v = {"", stage, 0, 1, 0, 1};
        make_config(cfg, sizeof cfg, &v, sgd);
        snprintf(want, sizeof want, "zero_optimization.zero_quantized_gradients: true needs ZeRO stage 2 or 3 "
                 "(qgZ reduces the gradients to their partitions), stage is %d", stage);
        ASSERT_FAILS(dsm_engine_init(mesh, cfg, d, NP, &e), DSM_ERR_CONFIG, want);
        assert_null(e);
    }
    const variant_t both = {"", 3, 0, 1, 1, 1};
    make_config(cfg, sizeof cfg, &both, sgd);
    /* Bad block sizes, on every rank or on one. */
    const char *bad[4] = {"0", "24", "100", "2097152"};
    for (int k = 0; k < 4; ++k) {
        setenv(k % 2 ? "DSM_QGZ_BLOCK" : "DSM_QWZ_BLOCK", bad[k], 1);
        snprintf(want, sizeof want, "block size %s is not a multiple of 16", bad[k]);
        ASSERT_FAILS(dsm_engine_init(mesh, cfg, d, NP, &e), DSM_ERR_INVALID_ARGUMENT, want);
        assert_null(e);
        unsetenv("DSM_QGZ_BLOCK");
        unsetenv("DSM_QWZ_BLOCK");
    }
    if (test_rank == test_size - 1) setenv("DSM_QWZ_BLOCK", "100", 1);
    ASSERT_FAILS(dsm_engine_init(mesh, cfg, d, NP, &e), DSM_ERR_INVALID_ARGUMENT, "DSM_QWZ_BLOCK");
    assert_null(e);
    unsetenv("DSM_QWZ_BLOCK");
    if (test_size > 1) {
        if (test_rank == 0) setenv("DSM_QGZ_BLOCK", "2048", 1);
        dsm_status_t st = dsm_engine_init(mesh, cfg, d, NP, &e);
        if (st == DSM_SUCCESS) fail_msg("block sizes that differ between the ranks were accepted");
        assert_non_null(strstr(dsm_last_error(), "quantization block sizes"));
        assert_null(e);
        unsetenv("DSM_QGZ_BLOCK");
    }
    /* Other block sizes work. */
    setenv("DSM_QWZ_BLOCK", "64", 1);
    setenv("DSM_QGZ_BLOCK", "32", 1);
    ASSERT_OK(dsm_engine_init(mesh, cfg, d, NP, &e));
    char *text = NULL;
    ASSERT_OK(dsm_engine_describe(e, DSM_FORMAT_JSON, &text));
    assert_non_null(strstr(text, "\"weight_block\":64"));
    assert_non_null(strstr(text, "\"gradient_block\":32"));
    dsm_free(text);
    ASSERT_OK(dsm_engine_free(&e));
    unsetenv("DSM_QWZ_BLOCK");
    unsetenv("DSM_QGZ_BLOCK");
    ASSERT_OK(dsm_mesh_free(&mesh));
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tolerance),
        cmocka_unit_test(test_off_node),
        cmocka_unit_test(test_bad_values),
    };
    return RUN_MPI_TESTS("test_engine_quant", tests);
}
