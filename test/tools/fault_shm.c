/*
 * The driver of test/tools/fault_shm.sh, which runs it under a /dev/shm too
 * small for what it asks. Every rank prints one line per check, prefixed
 * with "rank R:", and the script reads them; the program exits 0 when it got
 * through (expected errors included) and 1 on an unexpected one.
 *
 *   fault_shm engine NUMEL STEPS [STAGE]
 *       A ZeRO engine (stage STAGE, default 2) over MPI_COMM_WORLD with one fp32 parameter of NUMEL
 *       elements, trained STEPS steps with a constant gradient:
 *       "rank R: engine init STATUS MESSAGE", then "rank R: trained S steps,
 *       norm N" (or "rank R: step STATUS MESSAGE").
 *   fault_shm sp BYTES PART
 *       A sequence-parallel context over every rank. The last rank asks
 *       dsm_sp_alloc() for BYTES, the others for 4096: "rank R: sp_alloc
 *       STATUS MESSAGE". Then every rank asks for PART bytes twice (the
 *       script picks PART so that one fits and two do not): "rank R: sp_alloc
 *       part STATUS MESSAGE" and "rank R: sp_alloc second part STATUS
 *       MESSAGE". Then a small allocation and a
 *       transform round trip in it: "rank R: small ok".
 * STATUS is the dsm_status_t value; MESSAGE dsm_last_error() (or "-").
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "dsm.h"

static int rank = 0, size = 1;

static void report(const char *what, dsm_status_t st) {
    printf("rank %d: %s %d %s\n", rank, what, (int)st, st == DSM_SUCCESS ? "-" : dsm_last_error());
    fflush(stdout);
}

static int fail(const char *what) {
    printf("rank %d: FAIL %s: %s\n", rank, what, dsm_last_error());
    fflush(stdout);
    return 1;
}

static int run_engine(long long numel, int steps, int stage) {
    const int64_t shape[1] = {numel};
    dsm_param_desc_t d;
    memset(&d, 0, sizeof d);
    d.name = "w";
    d.ndims = 1;
    d.shape = shape;
    d.dtype = DSM_FLOAT32;
    d.trainable = 1;
    char cfg[256];
    snprintf(cfg, sizeof cfg,
             "{\"train_micro_batch_size_per_gpu\": 1, \"zero_optimization\": {\"stage\": %d},"
             " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}}}",
             stage);
    dsm_engine_t e = NULL;
    dsm_status_t st = dsm_engine_init_comm(MPI_COMM_WORLD, cfg, &d, 1, &e);
    report("engine init", st);
    if (st != DSM_SUCCESS) return 0;
    dsm_step_info_t info = DSM_STEP_INFO_INITIALIZER;
    for (int s = 0; s < steps; ++s) {
        void *g = NULL;
        if ((st = dsm_engine_grad_acquire(e, 0, &g)) != DSM_SUCCESS) break;
        float *gf = (float *)g;
        for (long long i = 0; i < numel; ++i) gf[i] += 1e-3f * (float)((i % 7) + 1);
        if ((st = dsm_engine_grad_release(e, 0)) != DSM_SUCCESS) break;
        if ((st = dsm_step(e, &info)) != DSM_SUCCESS) break;
    }
    if (st != DSM_SUCCESS) {
        report("step", st);
        dsm_engine_free(&e);
        return 1;
    }
    printf("rank %d: trained %lld steps, norm %s\n", rank, (long long)info.global_steps,
           info.grad_norm > 0 && isfinite(info.grad_norm) ? "ok" : "bad");
    fflush(stdout);
    return dsm_engine_free(&e) == DSM_SUCCESS ? 0 : fail("dsm_engine_free");
}

static int run_sp(size_t bytes, size_t part) {
    dsm_mesh_t mesh = NULL;
    dsm_sp_t sp = NULL;
    if (dsm_mesh_create_dp_sp(MPI_COMM_WORLD, 1, -1, &mesh) != DSM_SUCCESS) return fail("dsm_mesh_create_dp_sp");
    if (dsm_sp_create(mesh, NULL, &sp) != DSM_SUCCESS) return fail("dsm_sp_create");

    void *p = NULL;
    dsm_status_t st = dsm_sp_alloc(sp, rank == size - 1 ? bytes : 4096, &p);
    report("sp_alloc", st);
    if (st == DSM_SUCCESS && dsm_sp_free_memory(sp, &p) != DSM_SUCCESS) return fail("dsm_sp_free_memory");

    void *h1 = NULL, *h2 = NULL;
    st = dsm_sp_alloc(sp, part, &h1);
    report("sp_alloc part", st);
    if (h1 != NULL) memset(h1, 1, part); /* every page can be written */
    st = dsm_sp_alloc(sp, part, &h2);
    report("sp_alloc second part", st);
    if (h2 != NULL) memset(h2, 1, part);
    if (h2 != NULL && dsm_sp_free_memory(sp, &h2) != DSM_SUCCESS) return fail("dsm_sp_free_memory");
    if (h1 != NULL && dsm_sp_free_memory(sp, &h1) != DSM_SUCCESS) return fail("dsm_sp_free_memory");

    /* still usable: a small allocation and a round trip through it */
    dsm_sp_tensor_t t = {1, 2 * size, 2 * size, 4, DSM_SP_BATCH_FIRST, DSM_FLOAT32, 0};
    size_t ns = 0, nh = 0;
    if (dsm_sp_counts(sp, &t, &ns, &nh) != DSM_SUCCESS) return fail("dsm_sp_counts");
    float *in = NULL;
    if (dsm_sp_alloc(sp, (ns + nh + ns) * sizeof(float), (void **)&in) != DSM_SUCCESS)
        return fail("small dsm_sp_alloc");
    float *mid = in + ns, *back = mid + nh;
    for (size_t i = 0; i < ns; ++i) in[i] = (float)(rank * 1000 + (int)i);
    if (dsm_sp_seq_to_head(sp, &t, in, ns, mid, nh) != DSM_SUCCESS) return fail("dsm_sp_seq_to_head");
    if (dsm_sp_head_to_seq(sp, &t, mid, nh, back, ns) != DSM_SUCCESS) return fail("dsm_sp_head_to_seq");
    if (memcmp(in, back, ns * sizeof(float)) != 0) return fail("round trip differs");
    if (dsm_sp_free_memory(sp, (void **)&in) != DSM_SUCCESS) return fail("dsm_sp_free_memory");
    printf("rank %d: small ok\n", rank);
    fflush(stdout);
    if (dsm_sp_free(&sp) != DSM_SUCCESS) return fail("dsm_sp_free");
    return dsm_mesh_free(&mesh) == DSM_SUCCESS ? 0 : fail("dsm_mesh_free");
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int rc = 2;
    if ((argc == 4 || argc == 5) && strcmp(argv[1], "engine") == 0)
        rc = run_engine(atoll(argv[2]), atoi(argv[3]), argc == 5 ? atoi(argv[4]) : 2);
    else if (argc == 4 && strcmp(argv[1], "sp") == 0)
        rc = run_sp((size_t)strtoull(argv[2], NULL, 10), (size_t)strtoull(argv[3], NULL, 10));
    else if (rank == 0)
        fprintf(stderr, "usage: fault_shm engine NUMEL STEPS [STAGE] | fault_shm sp BYTES PART\n");
    MPI_Finalize();
    return rc;
}
