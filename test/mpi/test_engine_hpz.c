/*
 * ZeRO++ hpZ (zero_optimization.zero_hpz_partition_size) on ZeRO stage 3:
 *
 * - bits: training with hpZ gives the same parameter bits as plain ZeRO-3,
 *   for every divisor of the data-parallel size, fp32 / bf16 / fp16, with
 *   and without overlap_comm, persistent parameters and prefetch, gradient
 *   accumulation; every later gather of a parameter in a step (the backward,
 *   the next micro-steps: from the secondary partitions) gives the bits of
 *   its first (the forward: from the primary ones).
 * - off-node bytes: on simulated nodes (DSM_SIM_NODES, two or four nodes on
 *   one host; the real nodes where the job spans several with the same
 *   number of ranks on each), the bytes each rank sends off its node in a
 *   step go from 3 to 2 parameter passes (forward allgather, gradient
 *   reduce-scatter; the backward gather stays in the node), 6 to 3 with two
 *   micro-steps; summed over the ranks a pass is (nodes - 1) x the parameter
 *   bytes. dsm_engine_describe() reports them, the group size, whether the
 *   group is inside a node, and the secondary partition's bytes.
 * - bad values: a size that does not divide the data-parallel size, or a
 *   negative one, fails dsm_engine_init() on every rank with DSM_ERR_CONFIG
 *   naming the value; stages 0-2 ignore it (the engine has no hpZ group).
 */
#include "dsm_config.h"

#include <stdlib.h>

#include "mpi_test.h"
#include "engine_memory.h"

#define NP 4
static const int64_t shape[NP] = {1000, 37, 515, 8};
static const char *names[NP] = {"a", "b", "c", "d"};
#define MAXN 1000


static int init_fn(void *user, int index, const char *name, int64_t offset, int64_t count, float *values) {
    (void)user;
    (void)name;
    for (int64_t i = 0; i < count; ++i) values[i] = 0.5f * test_hashf(7u + (unsigned)index, (unsigned)(offset + i));
    return 0;
}

static void params(dsm_param_desc_t d[NP]) { test_vector_params(d, NP, names, shape, init_fn); }

/* One configuration of a run. */
typedef struct {
    const char *precision; /* "", "\"bf16\": {...}," ... */
    int overlap, threshold, reuse0, prefetch, gas;
} variant_t;

static void make_config(char *buf, size_t len, const variant_t *v, int stage, int hpz) {
    char reuse[64] = "";
    if (v->reuse0) snprintf(reuse, sizeof reuse, ", \"stage3_max_reuse_distance\": 0");
    snprintf(buf, len,
             "{\"train_micro_batch_size_per_gpu\": 1, \"gradient_accumulation_steps\": %d, %s"
             " \"steps_per_print\": 1000000,"
             " \"zero_optimization\": {\"stage\": %d, \"overlap_comm\": %s, \"reduce_bucket_size\": 700,"
             " \"stage3_param_persistence_threshold\": %d, \"stage3_prefetch_bucket_size\": %d%s,"
             " \"zero_hpz_partition_size\": %d},"
             " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.1}}}",
             v->gas, v->precision, stage, v->overlap ? "true" : "false", v->threshold, v->prefetch, reuse, hpz);
}

typedef struct {
    unsigned long long off_node, sent, secondary;
    int partition_size, within_node;
} report_t;

static report_t describe(dsm_engine_t e) {
    char *text = NULL;
    ASSERT_OK(dsm_engine_describe(e, DSM_FORMAT_JSON, &text));
    report_t r;
    r.off_node = test_json_after(text, "\"last_step\"", "\"bytes_off_node\":");
    r.sent = test_json_after(text, "\"last_step\"", "\"bytes_sent\":");
    r.secondary = test_json_after(text, "\"hpz\"", "\"secondary_partition_bytes\":");
    r.partition_size = (int)test_json_after(text, "\"hpz\"", "\"partition_size\":");
    r.within_node = strstr(text, "\"group_within_node\":true") != NULL;
    dsm_free(text);
    ASSERT_OK(dsm_engine_describe(e, DSM_FORMAT_TEXT, &text));
    assert_non_null(strstr(text, "off the node; last step"));
    if (r.partition_size > 1) assert_non_null(strstr(text, "hpZ: secondary partitions over"));
    dsm_free(text);
    return r;
}

/*
 * Train `steps` steps; out: every parameter's final values (fp32). Each
 * micro-step reads the parameters in order (forward) and again in reverse
 * (backward), checking that the second read has the bits of the first, and
 * adds a gradient that depends on the values and the rank.
 */
static report_t train(dsm_mesh_t mesh, const variant_t *v, int hpz, int steps, float out[NP][MAXN]) {
    char cfg[1024];
    make_config(cfg, sizeof cfg, v, 3, hpz);
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
    for (int s = 0; s < steps; ++s)
        for (int k = 0; k < v->gas; ++k) {
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
                    fail_msg("step %d micro-step %d: parameter '%s' gathered again differs from its first gather", s,
                             k, names[i]);
                engine_read_f32(e, p, vals, (size_t)shape[i]);
                for (int64_t j = 0; j < shape[i]; ++j)
                    g[j] = 0.05f * vals[j] + 0.01f * test_hashf((unsigned)(test_rank * 131 + s * 7 + k), (unsigned)j);
                ASSERT_OK(dsm_engine_grad_acquire(e, i, &grad));
                engine_write_f32(e, grad, g, (size_t)shape[i]);
                ASSERT_OK(dsm_engine_grad_release(e, i));
                ASSERT_OK(dsm_engine_param_release(e, i));
            }
            ASSERT_OK(dsm_step(e, NULL));
        }
    const report_t r = describe(e);
    if (out)
        for (int i = 0; i < NP; ++i) ASSERT_OK(dsm_engine_param_read_f32(e, i, out[i], shape[i]));
    ASSERT_OK(dsm_engine_free(&e));
    return r;
}

static const variant_t variants[] = {
    {"", 0, 0, 1, 600, 2},
    {"", 1, 40, 1, 600, 2},
    {"\"bf16\": {\"enabled\": true},", 0, 40, 1, 0, 2},
    {"\"bf16\": {\"enabled\": true},", 1, 0, 1, 2000, 1},
    {"", 1, 40, 0, 50000000, 2}, /* DeepSpeed's defaults: released parameters stay while reused */
    {"\"fp16\": {\"enabled\": true, \"initial_scale_power\": 8},", 0, 0, 1, 600, 2},
};

static void test_bits(void **state) {
    (void)state;
    static float plain[NP][MAXN], hpz[NP][MAXN];
    dsm_mesh_t mesh = test_dp_mesh();
    for (size_t k = 0; k < sizeof variants / sizeof variants[0]; ++k) {
        train(mesh, &variants[k], 1, 3, plain);
        for (int h = 2; h <= test_size; ++h) {
            if (test_size % h) continue;
            const report_t r = train(mesh, &variants[k], h, 3, hpz);
            assert_int_equal(r.partition_size, h);
            for (int i = 0; i < NP; ++i)
                if (memcmp(plain[i], hpz[i], (size_t)shape[i] * sizeof(float)) != 0)
                    fail_msg("variant %zu, zero_hpz_partition_size %d: parameter '%s' differs from plain ZeRO-3", k,
                             h, names[i]);
        }
    }
    ASSERT_OK(dsm_mesh_free(&mesh));
}

/* The secondary partition's bytes: the flat layout (offsets aligned to 16
   elements, padded to 16 x h) over h ranks, without the persistent region. */
static unsigned long long secondary_bytes(int h, size_t es) {
    size_t off = 0;
    for (int i = 0; i < NP; ++i) off = (off + (size_t)shape[i] + 15) / 16 * 16;
    const size_t unit = 16 * (size_t)h, total = off < unit ? unit : (off + unit - 1) / unit * unit;
    return (unsigned long long)(total / (size_t)h * es);
}

/* The nodes of the run: the real ones when there are several, each with the
   same number of ranks (>= 2), else `sim` simulated (block order); 0 when
   the real nodes do not suit. *per_node: ranks per node. */
static int use_nodes(int sim, int *per_node) {
    if (test_nnodes > 1) {
        for (int r = 0; r < test_size; ++r)
            if (test_node_size(r) != test_node_size(0)) return 0;
        *per_node = test_node_size(0);
        return *per_node >= 2 ? test_nnodes : 0;
    }
    if (test_size % sim) return 0;
    char spec[32];
    snprintf(spec, sizeof spec, "%d:block", sim);
    setenv("DSM_SIM_NODES", spec, 1);
    *per_node = test_size / sim;
    return sim;
}

/* Off-node bytes per step with and without hpZ on `nodes` nodes of `per`
   ranks, hpZ groups of `h` ranks. */
static void off_node_case(int nodes, int per, int h, int gas) {
    /* A group across nodes is the whole data-parallel group here: its
       gathers cross the nodes as the primary ones do. */
    const variant_t v = {"", 0, 0, 1, 600, gas};
    dsm_mesh_t mesh = test_dp_mesh();
    const report_t plain = train(mesh, &v, 1, 2, NULL), hpz = train(mesh, &v, h, 2, NULL);
    ASSERT_OK(dsm_mesh_free(&mesh));
    const int within = h <= per;
    assert_int_equal(hpz.partition_size, h);
    assert_int_equal(hpz.within_node, within);
    assert_int_equal(plain.partition_size, 1);
    assert_true(plain.secondary == 0);
    if (hpz.secondary != secondary_bytes(h, 4))
        fail_msg("secondary partition: %llu bytes, expected %llu", hpz.secondary, secondary_bytes(h, 4));
    /* Per step: forward, backward and reduce-scatter per micro-step (plain);
       hpZ: the first forward, the reduce-scatters, and the gathers in a
       group that spans nodes. */
    const unsigned long long passes_plain = 3ull * (unsigned long long)gas,
                             passes_hpz = within ? 1ull + (unsigned long long)gas : passes_plain;
    if (plain.off_node * passes_hpz != hpz.off_node * passes_plain)
        fail_msg("rank %d, %d nodes x %d, hpZ %d, %d micro-steps: %llu bytes off the node per step with hpZ, %llu "
                 "without; expected the ratio %llu/%llu", test_rank, nodes, per, h, gas, hpz.off_node,
                 plain.off_node, passes_hpz, passes_plain);
    unsigned long long sums[2] = {plain.off_node, hpz.off_node}, tot[2];
    MPI_Allreduce(sums, tot, 2, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    unsigned long long param_bytes = 0;
    for (int i = 0; i < NP; ++i) param_bytes += (unsigned long long)shape[i] * 4;
    const unsigned long long pass = (unsigned long long)(nodes - 1) * param_bytes;
    if (tot[0] != passes_plain * pass || tot[1] != passes_hpz * pass)
        fail_msg("%d nodes x %d, hpZ %d: %llu and %llu bytes off the nodes per step (plain, hpZ), expected %llu and "
                 "%llu", nodes, per, h, tot[0], tot[1], passes_plain * pass, passes_hpz * pass);
    assert_true(hpz.sent > 0 && plain.sent > 0);
}

static void test_off_node(void **state) {
    (void)state;
    const int sims[2] = {2, 4};
    int ran = 0;
    for (int k = 0; k < 2; ++k) {
        int per = 0;
        const int nodes = use_nodes(sims[k], &per);
        if (nodes > 1 && test_size > 1) {
            for (int h = 2; h <= test_size; h *= 2) {
                if (test_size % h || (h > per && h != test_size)) continue; /* a group across nodes: all ranks */
                off_node_case(nodes, per, h, 1);
                if (h == per) off_node_case(nodes, per, h, 2);
            }
            ran = 1;
        }
        unsetenv("DSM_SIM_NODES");
        if (test_nnodes > 1) break;
    }
    if (!ran) skip();
}

static void test_bad_values(void **state) {
    (void)state;
    char cfg[1024], want[160];
    const variant_t v = {"", 0, 0, 0, 600, 1};
    dsm_param_desc_t d[NP];
    params(d);
    dsm_mesh_t mesh = test_dp_mesh();
    dsm_engine_t e = NULL;
    /* A size that does not divide the data-parallel size (larger ones included). */
    const int bad[3] = {test_size + 1, test_size >= 4 ? 3 : 2 * test_size, 2 * test_size};
    for (int k = 0; k < 3; ++k) {
        make_config(cfg, sizeof cfg, &v, 3, bad[k]);
        snprintf(want, sizeof want, "zero_optimization.zero_hpz_partition_size: %d does not divide the data-parallel "
                 "size %d", bad[k], test_size);
        ASSERT_FAILS(dsm_engine_init(mesh, cfg, d, NP, &e), DSM_ERR_CONFIG, want);
        assert_null(e);
    }
    make_config(cfg, sizeof cfg, &v, 3, -1);
    ASSERT_FAILS(dsm_engine_init(mesh, cfg, d, NP, &e), DSM_ERR_CONFIG, "zero_optimization.zero_hpz_partition_size");
    assert_non_null(strstr(dsm_last_error(), "-1"));
    assert_null(e);
    /* 0 and 1: off. */
    for (int h = 0; h <= 1; ++h) {
        make_config(cfg, sizeof cfg, &v, 3, h);
        ASSERT_OK(dsm_engine_init(mesh, cfg, d, NP, &e));
        assert_int_equal(describe(e).partition_size, 1);
        ASSERT_OK(dsm_engine_free(&e));
    }
    /* Stages 0-2 ignore it (DeepSpeed does), with a warning: any value. */
    for (int stage = 0; stage <= 2; ++stage) {
        make_config(cfg, sizeof cfg, &v, stage, test_size + 1);
        ASSERT_OK(dsm_engine_init(mesh, cfg, d, NP, &e));
        const report_t r = describe(e);
        assert_int_equal(r.partition_size, 1);
        assert_true(r.secondary == 0);
        ASSERT_OK(dsm_engine_free(&e));
    }
    ASSERT_OK(dsm_mesh_free(&mesh));
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bits),
        cmocka_unit_test(test_off_node),
        cmocka_unit_test(test_bad_values),
    };
    return RUN_MPI_TESTS("test_engine_hpz", tests);
}
