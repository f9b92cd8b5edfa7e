/*
 * The optimizer's update slice by slice inside publish (overlap_comm): each
 * slice of allgather_bucket_size elements is updated, converted and its
 * allgather started before the next slice is updated. Training gives the
 * same parameter bits as with overlap_comm false (one update of the whole
 * partition, then the gathers), at every ZeRO stage, in fp32, bf16 and
 * fp16, on the host and on the simulated device (whose deferred queue and
 * poisoned memory show an update that runs after its slice was sent), with
 * slices that are not multiples of the optimizer's grain, partitions of
 * several grains, and every optimizer: the element-wise ones in pieces,
 * Lamb (trust ratios over whole parameters) in one update before the
 * slices. The parameters move in every run, so equal bits are not the bits
 * of an engine that did nothing.
 */
#include <stdlib.h>

/* overlap_comm runs its progress thread only with MPI_THREAD_MULTIPLE. */
#define MPI_TEST_THREAD_LEVEL MPI_THREAD_MULTIPLE
#include "mpi_test.h"
#include "engine_memory.h"

#define NP 4
static const int64_t shape[NP] = {150001, 3, 65536, 40007};
static const char *names[NP] = {"w", "b", "v", "u"};
#define MAXN 150001

static int init_fn(void *user, int index, const char *name, int64_t offset, int64_t count, float *values) {
    (void)user;
    (void)name;
    for (int64_t i = 0; i < count; ++i) values[i] = 0.5f * test_hashf(11u + (unsigned)index, (unsigned)(offset + i));
    return 0;
}

static void params(dsm_param_desc_t d[NP]) {
    test_vector_params(d, NP, names, shape, init_fn);
    d[1].no_weight_decay = 1;
}

typedef struct {
    int stage;
    const char *precision; /* "" or "\"bf16\": {\"enabled\": true}, " ... */
    const char *optimizer; /* the "optimizer" object */
    const char *device;    /* DSM_ENGINE_DEVICE */
    long long allgather;   /* allgather_bucket_size */
} run_t;

static const char *ADAMW = "{\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.1}}";

/* Three steps; out: every parameter's final values, one after the other. */
static void train(const run_t *r, int overlap, float *out) {
    char cfg[1024];
    snprintf(cfg, sizeof cfg,
             "{\"train_micro_batch_size_per_gpu\": 1, %s \"steps_per_print\": 1000000,"
             " \"zero_optimization\": {\"stage\": %d, \"overlap_comm\": %s, \"reduce_bucket_size\": 50000,"
             " \"allgather_bucket_size\": %lld, \"stage3_param_persistence_threshold\": 70000},"
             " \"optimizer\": %s}",
             r->precision, r->stage, overlap ? "true" : "false", r->allgather, r->optimizer);
    dsm_param_desc_t d[NP];
    params(d);
    dsm_engine_t e = NULL;
    setenv("DSM_ENGINE_DEVICE", r->device, 1);
    ASSERT_OK(dsm_engine_init_comm(MPI_COMM_WORLD, cfg, d, NP, &e));
    unsetenv("DSM_ENGINE_DEVICE");
    static float v[MAXN], g[MAXN];
    for (int s = 0; s < 3; ++s) {
        for (int i = 0; i < NP; ++i) {
            ASSERT_OK(dsm_engine_param_read_f32(e, i, v, shape[i]));
            for (int64_t j = 0; j < shape[i]; ++j)
                g[j] = 0.1f * v[j] + 0.01f * test_hashf(1000u * (unsigned)s + 97u * (unsigned)test_rank + (unsigned)i,
                                                        (unsigned)j);
            ASSERT_OK(dsm_engine_grad_add_f32(e, i, g, shape[i]));
        }
        ASSERT_OK(dsm_step(e, NULL));
    }
    size_t off = 0;
    for (int i = 0; i < NP; ++i) {
        ASSERT_OK(dsm_engine_param_read_f32(e, i, out + off, shape[i]));
        off += (size_t)shape[i];
    }
    ASSERT_OK(dsm_engine_free(&e));
}

#define TOTAL (150001 + 3 + 65536 + 40007)

static void check(const run_t *r) {
    static float on[TOTAL], off[TOTAL], init[TOTAL];
    char what[512];
    snprintf(what, sizeof what, "stage %d, %s%s on %s, allgather_bucket_size %lld", r->stage, r->precision,
             r->optimizer, r->device, r->allgather);
    train(r, 0, off);
    train(r, 1, on);
    for (size_t j = 0; j < TOTAL; ++j)
        if (memcmp(&on[j], &off[j], sizeof(float)) != 0)
            fail_msg("%s: element %zu: overlap_comm on %.9g, off %.9g (must be the same bits)", what, j, on[j], off[j]);
    size_t off0 = 0, moved = 0;
    for (int i = 0; i < NP; ++i) {
        init_fn(NULL, i, NULL, 0, shape[i], init + off0);
        off0 += (size_t)shape[i];
    }
    for (size_t j = 0; j < TOTAL; ++j) moved += init[j] != on[j];
    if (moved < TOTAL / 2) fail_msg("%s: only %zu of %d parameters changed in three steps", what, moved, TOTAL);
}

static void test_stages_precisions(void **state) {
    (void)state;
    const char *precisions[] = {"", "\"bf16\": {\"enabled\": true}, ",
                                "\"fp16\": {\"enabled\": true, \"initial_scale_power\": 4}, "};
    for (int stage = 0; stage <= 3; ++stage)
        for (int p = 0; p < 3; ++p) {
            const run_t r = {stage, precisions[p], ADAMW, "host", 5000};
            check(&r);
        }
}

static void test_devices_slices(void **state) {
    (void)state;
    /* Slices smaller than a grain, one grain, several grains, the whole. */
    const long long slices[] = {1000, 16384, 70000, 1000000};
    const int stages[] = {1, 2, 3, 2};
    for (int k = 0; k < 4; ++k) {
        const run_t r = {stages[k], "\"bf16\": {\"enabled\": true}, ", ADAMW, "sim", slices[k]};
        check(&r);
    }
    const run_t host = {2, "", ADAMW, "host", 16384};
    check(&host);
}

static void test_optimizers(void **state) {
    (void)state;
    const char *opts[] = {
        "{\"type\": \"SGD\", \"params\": {\"lr\": 0.01, \"momentum\": 0.9, \"weight_decay\": 0.01}}",
        "{\"type\": \"Lion\", \"params\": {\"lr\": 0.001, \"weight_decay\": 0.1}}",
        "{\"type\": \"Adagrad\", \"params\": {\"lr\": 0.01}}",
        "{\"type\": \"Adam\", \"params\": {\"lr\": 0.01}}",
        "{\"type\": \"Lamb\", \"params\": {\"lr\": 0.01, \"weight_decay\": 0.01}}",
    };
    for (int o = 0; o < 5; ++o) {
        const run_t r = {o % 2 ? 1 : 3, "", opts[o], o % 2 ? "sim" : "host", 7000};
        check(&r);
    }
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stages_precisions),
        cmocka_unit_test(test_devices_slices),
        cmocka_unit_test(test_optimizers),
    };
    return RUN_MPI_TESTS("test_engine_publish", tests);
}
