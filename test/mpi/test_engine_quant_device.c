/*
 * ZeRO++ qwZ and qgZ on a device-resident engine: the gathers and the
 * gradient reduction quantized by the space's kernels on its queue
 * (comm/quantize_space.hpp, comm/qgz_device.hpp).
 *
 * - simulated device (DSM_ENGINE_DEVICE=sim, every machine): the device
 *   path (the space's kernels through its deferred queue, qgZ as
 *   SpaceQuantizedReduce over the host backends) computes the host
 *   engine's values after steps with qwZ (the same bits), qgZ, both, and
 *   both with hpZ (the same up to the order of qgZ's fp32 additions, which
 *   a backend may hand over in another order: nearly every value within a
 *   few ulps, none further than the step of one int4 rounding of a node's
 *   sum can move it (none at all on one node), the update within 0.5% of
 *   the host's), fp32 and bf16, with and without overlap_comm, on the job's nodes and on
 *   simulated ones (2 equal nodes, and 3+1); the bytes dsm_engine_describe() reports are the host's,
 *   and it names the kernels ("simulated").
 * - CUDA (skipped without a device): the same steps on the device-resident
 *   engine stay within the host test's tolerance of the unquantized host
 *   step (2% of the update's norm with qwZ alone, 20% with qgZ) and within
 *   0.5% of the quantized host step's update, every element within the
 *   steps of the int4 roundings the two may take differently; where the
 *   data-parallel group cannot use NCCL (ranks sharing a GPU), qgZ fails
 *   dsm_engine_init() on every rank with DSM_ERR_NOT_SUPPORTED naming the
 *   backend, and qwZ still runs.
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

static void make_config(char *buf, size_t len, const variant_t *v, const char *optimizer) {
    snprintf(buf, len,
             "{\"train_micro_batch_size_per_gpu\": 1, \"gradient_accumulation_steps\": 1, %s"
             " \"steps_per_print\": 1000000, \"gradient_clipping\": 0.0,"
             " \"zero_optimization\": {\"stage\": %d, \"overlap_comm\": %s, \"reduce_bucket_size\": 2000,"
             " \"stage3_param_persistence_threshold\": 0, \"stage3_prefetch_bucket_size\": 600,"
             " \"zero_hpz_partition_size\": %d, \"zero_quantized_weights\": %s,"
             " \"zero_quantized_gradients\": %s},"
             " \"optimizer\": %s}",
             v->precision, v->stage, v->overlap ? "true" : "false", v->hpz, v->qwz ? "true" : "false",
             v->qgz ? "true" : "false", optimizer);
}

/* The quantized bytes of the last step (gather off, reduce on, reduce off) and the kernels' place. */
typedef struct {
    unsigned long long g_off, r_on, r_off;
    char kernels[16];
} report_t;

static report_t describe(dsm_engine_t e) {
    char *text = NULL;
    ASSERT_OK(dsm_engine_describe(e, DSM_FORMAT_JSON, &text));
    report_t r;
    memset(&r, 0, sizeof r);
    const char *z = strstr(text, "\"zeropp_quantization\"");
    assert_non_null(z);
    r.g_off = test_json_after(z, "\"gather\"", "\"sent_off_node\":");
    r.r_on = test_json_after(z, "\"reduce\"", "\"sent_on_node\":");
    r.r_off = test_json_after(z, "\"reduce\"", "\"sent_off_node\":");
    const char *k = strstr(z, "\"kernels\":\"");
    assert_non_null(k);
    k += strlen("\"kernels\":\"");
    size_t i = 0;
    while (k[i] && k[i] != '"' && i + 1 < sizeof r.kernels) {
        r.kernels[i] = k[i];
        ++i;
    }
    dsm_free(text);
    return r;
}

/* Train `steps` SGD steps on `device` (DSM_ENGINE_DEVICE); the final values in out. */
/* The gradient rank r adds at step s to element j of parameter i, from the
   value v it read (as test_engine_quant.c's): a part common to the ranks,
   so that every parameter's mean gradient, the small ones' too, is of the
   order of the largest; one that depends on the rank, in magnitudes that
   vary between blocks; one that depends on the values read. */
static float grad_of(int i, int64_t j, int r, int s, float v) {
    return 0.05f * v + 0.5f * test_hashf(71u + (unsigned)i, (unsigned)j) +
           0.002f * test_hashf((unsigned)(r * 131 + s * 7), (unsigned)j) * (1.0f + (float)((j * 31 + i * 17) % 97));
}

#define SGD_LR 0.5

/* The largest |gradient| a rank adds in the first steps: from p0, with a
   tenth more for the values the steps moved (0.05 x lr x G). */
static double grad_max(void) {
    static float p0[MAXN];
    double m = 0;
    for (int i = 0; i < NP; ++i) {
        init_fn(NULL, i, names[i], 0, shape[i], p0);
        for (int64_t j = 0; j < shape[i]; ++j)
            for (int r = 0; r < test_size; ++r) m = fmax(m, fabs((double)grad_of(i, j, r, 0, p0[j])));
    }
    return 1.1 * m;
}

/* How far one element may be from the other run's after `steps` SGD steps
   when two runs of the same quantized plan add the same blocks in another
   order (fp32 additions a few ulps apart): a value of an int4 rounding
   whose input moved by an ulp may go to the neighbouring step. Step 1 (each
   rank's own blocks) has the same input in both when `same_kernels`; step 2
   (a node's sum, rounded where the job spans nodes) may move the mean
   gradient by one step of the node's block, n x (G + G / 14) / 7 for n
   members, over the mean: (G + G / 14) / 7. bf16: the value read may then
   round to the neighbouring bf16 (0.05 x 2^-8 relative in the gradient). */
static double flip_bound(int steps, int nodes, int same_kernels, int bf16, double G) {
    const double step = (G + G / 14.0) / 7.0;
    const double per_step = (same_kernels ? 0.0 : G / 7.0) + (nodes > 1 ? step : 0.0);
    return steps * SGD_LR * (per_step + (bf16 ? 0.05 * ldexp(1.0, -8) : 0.0));
}

static dsm_status_t train(dsm_mesh_t mesh, const char *device, const variant_t *v, int steps, float out[NP][MAXN],
                          report_t *rep) {
    char cfg[1200];
    make_config(cfg, sizeof cfg, v, "{\"type\": \"SGD\", \"params\": {\"lr\": 0.5}}");
    dsm_param_desc_t d[NP];
    params(d);
    dsm_engine_t e = NULL;
    setenv("DSM_ENGINE_DEVICE", device, 1);
    const dsm_status_t st = dsm_engine_init(mesh, cfg, d, NP, &e);
    unsetenv("DSM_ENGINE_DEVICE");
    if (st != DSM_SUCCESS) return st;
    static float vals[MAXN], g[MAXN];
    for (int s = 0; s < steps; ++s) {
        for (int i = 0; i < NP; ++i) {
            const void *p;
            ASSERT_OK(dsm_engine_param_acquire(e, i, &p));
            ASSERT_OK(dsm_engine_param_release(e, i));
        }
        for (int i = NP - 1; i >= 0; --i) {
            const void *p;
            void *grad;
            ASSERT_OK(dsm_engine_param_acquire(e, i, &p));
            engine_read_f32(e, p, vals, (size_t)shape[i]);
            for (int64_t j = 0; j < shape[i]; ++j) g[j] = grad_of(i, j, test_rank, s, vals[j]);
            ASSERT_OK(dsm_engine_grad_acquire(e, i, &grad));
            engine_write_f32(e, grad, g, (size_t)shape[i]);
            ASSERT_OK(dsm_engine_grad_release(e, i));
            ASSERT_OK(dsm_engine_param_release(e, i));
        }
        ASSERT_OK(dsm_step(e, NULL));
    }
    if (rep) *rep = describe(e);
    for (int i = 0; i < NP; ++i) ASSERT_OK(dsm_engine_param_read_f32(e, i, out[i], shape[i]));
    ASSERT_OK(dsm_engine_free(&e));
    return DSM_SUCCESS;
}

static const char *precisions[2] = {"", "\"bf16\": {\"enabled\": true},"};

static void cases_for(int pr, int overlap, int hpz, variant_t c[5]) {
    const variant_t v[5] = {
        {precisions[pr], 3, overlap, 1, 1, 0}, {precisions[pr], 3, overlap, 1, 0, 1},
        {precisions[pr], 3, overlap, 1, 1, 1}, {precisions[pr], 3, overlap, hpz, 1, 1},
        {precisions[pr], 2, overlap, 1, 0, 1},
    };
    memcpy(c, v, sizeof v);
}

/* ||(q - p0) - (u - p0)|| / ||u - p0||. */
static double update_error(float q[NP][MAXN], float u[NP][MAXN]) {
    double diff = 0, norm = 0;
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

static void test_sim_bits(void **state) {
    (void)state;
    static float host[NP][MAXN], sim[NP][MAXN];
    /* The job's nodes; on one node also two simulated ones (block) and two
       uneven ones (all ranks but the last on one node). */
    char uneven[256] = "";
    for (int r = 0; r < test_size && test_size >= 3; ++r) strcat(uneven, r == test_size - 1 ? "b" : "a,");
    const char *sims[3] = {NULL, test_size % 2 == 0 && test_size >= 2 && test_nnodes == 1 ? "2:block" : NULL,
                           test_size >= 3 && test_nnodes == 1 ? uneven : NULL};
    for (int s = 0; s < 3; ++s) {
        if (s > 0 && sims[s] == NULL) continue;
        if (sims[s]) setenv("DSM_SIM_NODES", sims[s], 1);
        dsm_mesh_t mesh = test_dp_mesh();
        const int hpz = test_size % 2 == 0 && test_size > 1 && s != 2 ? 2 : 1;
        const double G = grad_max();
        for (int pr = 0; pr < 2; ++pr)
            for (int overlap = 0; overlap <= 1; ++overlap) {
                if (s > 0 && overlap > 0) continue;
                variant_t c[5];
                cases_for(pr, overlap, hpz, c);
                for (int k = 0; k < 5; ++k) {
                    report_t rh, rs;
                    ASSERT_OK(train(mesh, "host", &c[k], 2, host, &rh));
                    ASSERT_OK(train(mesh, "sim", &c[k], 2, sim, &rs));
                    assert_string_equal(rh.kernels, "host");
                    assert_string_equal(rs.kernels, "simulated");
                    /* The same values up to the order of qgZ's fp32 additions
                       (the backends may hand the peers' blocks over in
                       another order): nearly every value within a few ulps,
                       the update within 0.5% of the host's. qwZ alone: the
                       same bits. */
                    long off = 0, all = 0;
                    const int nodes = sims[s] ? 2 : test_nnodes;
                    const double hard = flip_bound(2, nodes, 1, pr, G);
                    for (int i = 0; i < NP; ++i)
                        for (int64_t j = 0; j < shape[i]; ++j, ++all) {
                            const double d = fabs((double)sim[i][j] - host[i][j]);
                            const double ulps = 1e-6 * (1.0 + fabs(host[i][j]));
                            if (c[k].qgz ? d > ulps : memcmp(&host[i][j], &sim[i][j], sizeof(float)) != 0) {
                                if (off++ == 0 && !c[k].qgz)
                                    fail_msg("nodes %s, %s stage %d overlap %d hpZ %d qwZ %d: '%s'[%lld]: simulated "
                                             "device %.9g, host %.9g (must be the same bits)",
                                             sims[s] ? sims[s] : "(the job's)", pr ? "bf16" : "fp32", c[k].stage,
                                             overlap, c[k].hpz, c[k].qwz, names[i], (long long)j, sim[i][j], host[i][j]);
                                if (!(d <= ulps + hard))
                                    fail_msg("nodes %s, %s stage %d overlap %d hpZ %d qwZ %d qgZ %d: '%s'[%lld] (of %lld): "
                                             "simulated device %.9g, host %.9g: %.3g apart, more than a rounding step "
                                             "taken differently (%.3g)", sims[s] ? sims[s] : "(the job's)",
                                             pr ? "bf16" : "fp32", c[k].stage, overlap, c[k].hpz, c[k].qwz, c[k].qgz,
                                             names[i], (long long)j, (long long)shape[i], sim[i][j], host[i][j], d,
                                             ulps + hard);
                            }
                        }
                    const double e = update_error(sim, host);
                    if (off > all / 100 + 1 || !(e <= 0.005))
                        fail_msg("nodes %s, %s stage %d overlap %d hpZ %d qwZ %d qgZ %d: %ld of %ld values differ from "
                                 "the host's by more than a few ulps, the update by %.2e of its norm",
                                 sims[s] ? sims[s] : "(the job's)", pr ? "bf16" : "fp32", c[k].stage, overlap, c[k].hpz,
                                 c[k].qwz, c[k].qgz, off, all, e);
                    if (rh.g_off != rs.g_off || rh.r_on != rs.r_on || rh.r_off != rs.r_off)
                        fail_msg("quantized bytes differ: host %llu/%llu/%llu, simulated device %llu/%llu/%llu",
                                 rh.g_off, rh.r_on, rh.r_off, rs.g_off, rs.r_on, rs.r_off);
                }
            }
        ASSERT_OK(dsm_mesh_free(&mesh));
        if (sims[s]) unsetenv("DSM_SIM_NODES");
    }
}

static void test_cuda_tolerance(void **state) {
    (void)state;
#if DSM_HAVE_CUDA
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) count = 0;
    int most = count;
    MPI_Allreduce(&count, &most, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (most == 0) {
        if (test_rank == 0) print_message("[          ] no CUDA device: the device-resident engine is not run\n");
        skip();
        return;
    }
    static float plain[NP][MAXN], quant[NP][MAXN], hostq[NP][MAXN];
    dsm_mesh_t mesh = test_dp_mesh();
    const int hpz = test_size % 2 == 0 && test_size > 1 ? 2 : 1;
    const double G = grad_max();
    for (int pr = 0; pr < 2; ++pr)
        for (int overlap = 0; overlap <= 1; ++overlap) {
            variant_t c[5];
            cases_for(pr, overlap, hpz, c);
            for (int k = 0; k < 5; ++k) {
                variant_t base = c[k];
                base.qwz = base.qgz = 0;
                base.hpz = 1;
                report_t rc;
                ASSERT_OK(train(mesh, "host", &base, 1, plain, NULL));
                ASSERT_OK(train(mesh, "host", &c[k], 1, hostq, NULL));
                const dsm_status_t st = train(mesh, "cuda", &c[k], 1, quant, &rc);
                if (st == DSM_ERR_NOT_SUPPORTED && c[k].qgz) {
                    /* Ranks sharing a GPU: the mpi backend, which qgZ on device memory refuses. */
                    const char *msg = dsm_last_error();
                    if (strstr(msg, "zero_quantized_gradients") == NULL || strstr(msg, "nccl backend") == NULL)
                        fail_msg("qgZ on the device refused with an unclear message: %s", msg);
                    continue;
                }
                ASSERT_OK(st);
                assert_string_equal(rc.kernels, "cuda");
                const double err = update_error(quant, plain), tol = c[k].qgz ? 0.20 : 0.02;
                const double dh = update_error(quant, hostq);
                if (test_rank == 0 && overlap == 0)
                    print_message("[          ] cuda %s stage %d hpZ %d qwZ %d qgZ %d: update error %.4f (against "
                                  "the quantized host step %.2e)\n", pr ? "bf16" : "fp32", c[k].stage, c[k].hpz,
                                  c[k].qwz, c[k].qgz, err, dh);
                if (!(err <= tol))
                    fail_msg("cuda %s stage %d overlap %d hpZ %d qwZ %d qgZ %d: the step's update differs by %.4f of "
                             "its norm from the unquantized one (tolerance %.2f)", pr ? "bf16" : "fp32", c[k].stage,
                             overlap, c[k].hpz, c[k].qwz, c[k].qgz, err, tol);
                /* Against the quantized host step: the same plan, other
                   kernels (each rank's rounding may take the neighbouring
                   step where its input differs by an ulp), and with qwZ
                   the gathered values within an int8 step's ulps. */
                if (!(dh <= 0.005))
                    fail_msg("cuda %s stage %d overlap %d hpZ %d qwZ %d qgZ %d: the update differs by %.2e of its norm "
                             "from the quantized host step's (at most 0.5%%)", pr ? "bf16" : "fp32", c[k].stage, overlap,
                             c[k].hpz, c[k].qwz, c[k].qgz, dh);
                const double hard = (c[k].qgz ? flip_bound(1, test_nnodes, 0, pr, G) : flip_bound(1, 1, 1, pr, G)) +
                                    (c[k].qwz ? SGD_LR * 0.05 * 0.5 / 127 : 0.0);
                for (int i = 0; i < NP; ++i)
                    for (int64_t j = 0; j < shape[i]; ++j) {
                        const double d = fabs((double)quant[i][j] - hostq[i][j]);
                        if (!(d <= hard + 1e-6 * (1.0 + fabs(hostq[i][j]))))
                            fail_msg("cuda %s stage %d overlap %d hpZ %d qwZ %d qgZ %d: '%s'[%lld] (of %lld): device "
                                     "%.9g, quantized host step %.9g: %.3g apart (bound %.3g)", pr ? "bf16" : "fp32",
                                     c[k].stage, overlap, c[k].hpz, c[k].qwz, c[k].qgz, names[i], (long long)j,
                                     (long long)shape[i], quant[i][j], hostq[i][j], d, hard);
                    }
            }
        }
    ASSERT_OK(dsm_mesh_free(&mesh));
#else
    skip();
#endif
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sim_bits),
        cmocka_unit_test(test_cuda_tolerance),
    };
    return RUN_MPI_TESTS("test_engine_quant_device", tests);
}
