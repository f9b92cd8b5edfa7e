/*
 * A small training job for the checkpoint tool tests: a linear layer
 * ("fc.weight" [4, 3], "fc.bias" [3]) and a frozen embedding ("emb" [5]),
 * AdamW under ZeRO-1, trained on fixed data.
 *
 *   make_checkpoint DIR [--steps N] [--save-every K] [--resume] [--rows R]
 *                       [--rank-dir] [--nonfinite] [--large] [--stage Z] [--overlap]
 *
 * Trains N steps (default 4), saving DIR/global_step<S>.h5 every K steps
 * (default 2) with the client state "step S". --resume first loads the
 * checkpoint DIR/latest names and prints "resumed TAG at step S". --rows
 * makes fc.weight [R, 3] (default 4), for checkpoints of a given size;
 * --rank-dir gives each rank its own directory DIR/rank<r> (a job whose
 * ranks disagree on the directory). --nonfinite: the frozen embedding
 * starts as [x, NaN, x, +inf, x] (and stays so, being frozen), for the
 * tools' non-finite checks. --large: its element 2 is 70000 (beyond the fp16
 * range), for the checks of an fp16 export. --stage: the ZeRO stage (default
 * 1); --overlap: zero_optimization.overlap_comm on, with MPI at
 * MPI_THREAD_MULTIPLE (so that a progress thread runs the collectives).
 * --until S: train until global step S (instead of N more steps);
 * --fallback: resume with DSM_CKPT_LOAD_FALLBACK (an unreadable newest
 * checkpoint falls back to the one before); --print-steps: rank 0 prints
 * "step S" after each step (for the chaos test).
 * Prints "final step S" and exits 0; on an error
 * prints "rank R: " and the error on every rank that has one and exits 1.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "dsm.h"

#define CHECK(call)                                                                        \
    do {                                                                                   \
        dsm_status_t st_ = (call);                                                         \
        if (st_ != DSM_SUCCESS) {                                                          \
            fprintf(stderr, "make_checkpoint: rank %d: %s: %s\n", rank, #call,           \
                    dsm_last_error());                                                 \
            MPI_Finalize();                                                                \
            return 1;                                                                      \
        }                                                                                  \
    } while (0)

static int init_fn(void *user, int index, const char *name, int64_t offset, int64_t count, float *dst) {
    const int flags = user != NULL ? *(const int *)user : 0;
    const int nonfinite = flags & 1, large = flags & 2;
    for (int64_t i = 0; i < count; ++i) {
        const int64_t at = offset + i;
        dst[i] = 0.1f * (float)(index + 1) + 0.01f * (float)at;
        if (nonfinite && !strcmp(name, "emb") && at == 1) dst[i] = NAN;
        if (nonfinite && !strcmp(name, "emb") && at == 3) dst[i] = INFINITY;
        if (large && !strcmp(name, "emb") && at == 2) dst[i] = 70000.0f;
    }
    return 0;
}

static int rank = 0;

int main(int argc, char **argv) {
    int overlap = 0, stage = 1, provided = 0;
    for (int a = 2; a < argc; ++a)
        if (!strcmp(argv[a], "--overlap")) overlap = 1;
    MPI_Init_thread(&argc, &argv, overlap ? MPI_THREAD_MULTIPLE : MPI_THREAD_SINGLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (argc < 2) {
        fprintf(stderr, "usage: make_checkpoint DIR [--steps N] [--save-every K] [--resume] [--rows R] [--rank-dir] [--nonfinite] [--large] [--stage Z] [--overlap]\n");
        MPI_Finalize();
        return 2;
    }
    const char *dir = argv[1];
    int steps = 4, every = 2, resume = 0, rank_dir = 0, print_steps = 0;
    long long until = -1;
    unsigned load_flags = 0;
    long rows = 4;
    static int nonfinite = 0;
    for (int a = 2; a < argc; ++a) {
        if (!strcmp(argv[a], "--steps") && a + 1 < argc) steps = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--save-every") && a + 1 < argc) every = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--resume")) resume = 1;
        else if (!strcmp(argv[a], "--until") && a + 1 < argc) until = atoll(argv[++a]);
        else if (!strcmp(argv[a], "--fallback")) load_flags |= DSM_CKPT_LOAD_FALLBACK;
        else if (!strcmp(argv[a], "--print-steps")) print_steps = 1;
        else if (!strcmp(argv[a], "--rows") && a + 1 < argc) rows = atol(argv[++a]);
        else if (!strcmp(argv[a], "--rank-dir")) rank_dir = 1;
        else if (!strcmp(argv[a], "--nonfinite")) nonfinite |= 1;
        else if (!strcmp(argv[a], "--large")) nonfinite |= 2;
        else if (!strcmp(argv[a], "--overlap")) overlap = 1;
        else if (!strcmp(argv[a], "--stage") && a + 1 < argc) stage = atoi(argv[++a]);
        else {
            fprintf(stderr, "make_checkpoint: unknown argument '%s'\n", argv[a]);
            MPI_Finalize();
            return 2;
        }
    }
    if (rows < 1) {
        fprintf(stderr, "make_checkpoint: --rows %ld: expected a positive count\n", rows);
        MPI_Finalize();
        return 2;
    }
    char own_dir[4096];
    if (rank_dir) {
        snprintf(own_dir, sizeof own_dir, "%s/rank%d", dir, rank);
        dir = own_dir;
    }
    const int64_t w_shape[2] = {rows, 3};
    static const int64_t b_shape[1] = {3}, e_shape[1] = {5};
    dsm_param_desc_t d[3];
    memset(d, 0, sizeof d);
    const char *names[3] = {"fc.weight", "fc.bias", "emb"};
    const int64_t *shapes[3] = {w_shape, b_shape, e_shape};
    const int ndims[3] = {2, 1, 1};
    for (int i = 0; i < 3; ++i) {
        d[i].name = names[i];
        d[i].ndims = ndims[i];
        d[i].shape = shapes[i];
        d[i].dtype = DSM_FLOAT32;
        d[i].trainable = i < 2;
        d[i].no_weight_decay = i == 1;
        d[i].init_fn = init_fn;
        d[i].init_user_data = &nonfinite;
    }
    char cfg[512];
    snprintf(cfg, sizeof cfg,
             "{\"train_micro_batch_size_per_gpu\": 1, \"steps_per_print\": 1000000,"
             " \"zero_optimization\": {\"stage\": %d, \"overlap_comm\": %s},"
             " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}}}",
             stage, overlap ? "true" : "false");
    dsm_engine_t e;
    CHECK(dsm_engine_init_comm(MPI_COMM_WORLD, cfg, d, 3, &e));
    dsm_step_info_t info = DSM_STEP_INFO_INITIALIZER;
    if (resume) {
        void *blob = NULL;
        size_t size = 0;
        CHECK(dsm_engine_load_checkpoint(e, dir, NULL, load_flags, &blob, &size));
        CHECK(dsm_engine_step_info(e, &info));
        if (rank == 0) printf("resumed %.*s at step %lld\n", (int)size, blob ? (char *)blob : "",
                              (long long)info.global_steps);
        dsm_free(blob);
    }
    if (until >= 0) steps = until > info.global_steps ? (int)(until - info.global_steps) : 0;
    for (int s = 0; s < steps; ++s) {
        for (int p = 0; p < 2; ++p) {
            const void *v;
            void *g;
            int64_t n;
            CHECK(dsm_engine_param_numel(e, p, &n));
            CHECK(dsm_engine_param_acquire(e, p, &v));
            CHECK(dsm_engine_grad_acquire(e, p, &g));
            for (int64_t i = 0; i < n; ++i) ((float *)g)[i] += ((const float *)v)[i] - 0.5f * (float)(rank + 1);
            CHECK(dsm_engine_grad_release(e, p));
            CHECK(dsm_engine_param_release(e, p));
        }
        CHECK(dsm_step(e, &info));
        if (print_steps && rank == 0) {
            printf("step %lld\n", (long long)info.global_steps);
            fflush(stdout);
        }
        if (every > 0 && info.global_steps % every == 0) {
            char client[64];
            snprintf(client, sizeof client, "step %lld", (long long)info.global_steps);
            CHECK(dsm_engine_save_checkpoint(e, dir, NULL, client, strlen(client)));
        }
    }
    CHECK(dsm_engine_step_info(e, &info));
    if (rank == 0) printf("final step %lld\n", (long long)info.global_steps);
    CHECK(dsm_engine_free(&e));
    MPI_Finalize();
    return 0;
}
