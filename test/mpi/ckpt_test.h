/*
 * Shared by the checkpoint tests (test_checkpoint, test_checkpoint_async):
 * a small model of four parameters (one frozen), its configurations, a few
 * steps of training, snapshots of its values, and a scratch directory per
 * test. Include after mpi_test.h.
 */
#ifndef DSM_CKPT_TEST_H
#define DSM_CKPT_TEST_H

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "engine_memory.h"

enum { NP = 4 };
static const int64_t shape_w[2] = {7, 5}, shape_b[1] = {5}, shape_s[1] = {1}, shape_e[2] = {3, 3};
static const int64_t numel[NP] = {35, 5, 1, 9};
static char dir[256];

static inline int init_fn(void *user, int index, const char *name, int64_t offset, int64_t count, float *dst) {
    (void)name;
    const float bias = user ? *(const float *)user : 0.0f;
    for (int64_t i = 0; i < count; ++i)
        dst[i] = bias + 0.05f * (float)(index + 1) + 0.003f * (float)((offset + i) % 11);
    return 0;
}

/* w [7,5], b [5], s [1] trainable; e [3,3] frozen. `bias` shifts the initial values. */
static inline void params(dsm_param_desc_t d[NP], const float *bias) {
    memset(d, 0, NP * sizeof d[0]);
    const char *names[NP] = {"w", "b", "s", "e"};
    const int64_t *shapes[NP] = {shape_w, shape_b, shape_s, shape_e};
    const int nd[NP] = {2, 1, 1, 2};
    for (int i = 0; i < NP; ++i) {
        d[i].name = names[i];
        d[i].ndims = nd[i];
        d[i].shape = shapes[i];
        d[i].dtype = DSM_FLOAT32;
        d[i].trainable = i < 3;
        d[i].no_weight_decay = i == 1;
        d[i].init_fn = init_fn;
        d[i].init_user_data = (void *)bias;
    }
}

static const char *ADAMW = "{\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}}";

static inline void config_with(char *buf, size_t len, int stage, const char *optimizer, const char *precision,
                        const char *extra) {
    snprintf(buf, len,
             "{\"train_micro_batch_size_per_gpu\": 1, \"steps_per_print\": 1000000,"
             " \"zero_optimization\": {\"stage\": %d, \"reduce_bucket_size\": 16,"
             " \"stage3_param_persistence_threshold\": 4}, \"optimizer\": %s,"
             " \"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_num_steps\": 5,"
             " \"warmup_min_lr\": 0.001, \"warmup_max_lr\": 0.01}}%s%s}",
             stage, optimizer, precision, extra);
}

static inline void config(char *buf, size_t len, int stage, const char *precision, const char *extra) {
    config_with(buf, len, stage, ADAMW, precision, extra);
}

static const char *FP32 = "", *FP16 = ", \"fp16\": {\"enabled\": true, \"initial_scale_power\": 8}",
                  *BF16 = ", \"bf16\": {\"enabled\": true}";

static inline dsm_engine_t engine_on(MPI_Comm comm, int stage, const char *precision, const char *extra, float bias) {
    char cfg[1024];
    config(cfg, sizeof cfg, stage, precision, extra);
    dsm_param_desc_t d[NP];
    params(d, &bias);
    dsm_engine_t e = NULL;
    ASSERT_OK(dsm_engine_init_comm(comm, cfg, d, NP, &e));
    return e;
}

/* Every parameter as fp32, concatenated (the frozen one included). */
static inline void snapshot(dsm_engine_t e, float *out) {
    size_t off = 0;
    for (int i = 0; i < NP; ++i) {
        const void *v;
        ASSERT_OK(dsm_engine_param_acquire(e, i, &v));
        engine_read_f32(e, v, out + off, (size_t)numel[i]);
        ASSERT_OK(dsm_engine_param_release(e, i));
        off += (size_t)numel[i];
    }
}
#define TOTAL (35 + 5 + 1 + 9)

/* `steps` steps of a fixed quadratic loss whose target depends on the rank
   and the global step, so that every rank contributes differently. */
static inline void train(dsm_engine_t e, MPI_Comm comm, int steps) {
    int rank = 0;
    MPI_Comm_rank(comm, &rank);
    for (int s = 0; s < steps; ++s) {
        dsm_step_info_t info = DSM_STEP_INFO_INITIALIZER;
        ASSERT_OK(dsm_engine_step_info(e, &info));
        double scale = 1;
        ASSERT_OK(dsm_engine_loss_scale(e, &scale));
        for (int i = 2; i >= 0; --i) { /* backward order */
            const void *v;
            void *g;
            float val[35], grad[35];
            ASSERT_OK(dsm_engine_param_acquire(e, i, &v));
            engine_read_f32(e, v, val, (size_t)numel[i]);
            ASSERT_OK(dsm_engine_grad_acquire(e, i, &g));
            engine_read_f32(e, g, grad, (size_t)numel[i]);
            for (int k = 0; k < numel[i]; ++k)
                grad[k] += (float)scale * (val[k] - 0.1f * (float)((rank + 1) * (k % 3 + 1)) -
                                           0.01f * (float)info.global_steps);
            engine_write_f32(e, g, grad, (size_t)numel[i]);
            ASSERT_OK(dsm_engine_grad_release(e, i));
            ASSERT_OK(dsm_engine_param_release(e, i));
        }
        ASSERT_OK(dsm_step(e, NULL));
    }
}

static inline int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static inline void read_latest(const char *d, char *out, size_t len) {
    char path[512];
    snprintf(path, sizeof path, "%s/latest", d);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    assert_non_null(fgets(out, (int)len, f));
    fclose(f);
    out[strcspn(out, "\n")] = 0;
}

static inline int setup(void **state) {
    (void)state;
    if (test_rank == 0) {
        snprintf(dir, sizeof dir, "%s", "/tmp/dsm-test-ckpt-XXXXXX");
        if (mkdtemp(dir) == NULL) return 1;
    }
    MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    return 0;
}

static inline int teardown(void **state) {
    (void)state;
    MPI_Barrier(MPI_COMM_WORLD);
    if (test_rank == 0) {
        char cmd[400];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd) != 0) return 1;
    }
    return 0;
}

#endif
