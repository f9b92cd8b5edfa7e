/*
 * A program that blocks in its own MPI call because a peer stalls, for the
 * MPI profiling-interface layer's test (mpiwatch.sh):
 *
 *   stall MODE VICTIM [STEPS]
 *
 * Trains STEPS (default 3) steps of a one-parameter engine (so that the
 * watchdog knows the step), then rank VICTIM stalls (sleeps for ever, out of
 * MPI) while every other rank makes one blocking call of its own, outside
 * libdsm: MODE "allreduce" (MPI_Allreduce over MPI_COMM_WORLD), "recv"
 * (MPI_Recv from VICTIM), "barrier" (MPI_Barrier over a duplicate of
 * MPI_COMM_WORLD named "stall_comm"), "wait" (MPI_Irecv from VICTIM then
 * MPI_Wait). On one rank,
 * that rank is the victim's peer itself: it receives from itself a message
 * nobody sends. A stalled rank then prints nothing: with the layer
 * loaded and DSM_COMM_TIMEOUT set, the watchdog ends the job (exit status
 * 75) with a message naming the call; without it the job hangs.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mpi.h>

#include "dsm.h"

#define CHECK(call)                                                                          \
    do {                                                                                     \
        if ((call) != DSM_SUCCESS) {                                                         \
            fprintf(stderr, "stall: rank %d: %s: %s\n", rank, #call, dsm_last_error());     \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                    \
        }                                                                                    \
    } while (0)

int main(int argc, char **argv) {
    int provided = 0, rank = 0, size = 1;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc < 3) {
        if (rank == 0) fprintf(stderr, "usage: stall allreduce|recv|barrier|wait VICTIM [STEPS]\n");
        MPI_Finalize();
        return 1;
    }
    const char *mode = argv[1];
    const int victim = atoi(argv[2]) % size, steps = argc > 3 ? atoi(argv[3]) : 3;

    static const int64_t shape[1] = {8};
    dsm_param_desc_t d;
    memset(&d, 0, sizeof d);
    d.name = "w";
    d.ndims = 1;
    d.shape = shape;
    d.dtype = DSM_FLOAT32;
    d.trainable = 1;
    dsm_engine_t e;
    CHECK(dsm_engine_init_comm(MPI_COMM_WORLD,
                               "{\"train_micro_batch_size_per_gpu\": 1, \"optimizer\": {\"type\": \"SGD\"}}", &d, 1,
                               &e));
    for (int s = 0; s < steps; ++s) {
        void *g;
        CHECK(dsm_engine_grad_acquire(e, 0, &g));
        for (int i = 0; i < 8; ++i) ((float *)g)[i] = 0.5f;
        CHECK(dsm_engine_grad_release(e, 0));
        CHECK(dsm_step(e, NULL));
    }
    printf("rank %d: %d steps done, %s\n", rank, steps, size > 1 && rank == victim ? "stalling" : mode);
    fflush(stdout);

    MPI_Comm c;
    MPI_Comm_dup(MPI_COMM_WORLD, &c);
    MPI_Comm_set_name(c, "stall_comm");
    if (size > 1 && rank == victim)
        for (;;) sleep(1);
    double x = 1.0, y = 0.0;
    const int peer = size > 1 ? victim : rank;
    if (!strcmp(mode, "allreduce") && size > 1) {
        MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    } else if (!strcmp(mode, "barrier") && size > 1) {
        MPI_Barrier(c);
    } else if (!strcmp(mode, "wait")) {
        MPI_Request r;
        MPI_Irecv(&y, 1, MPI_DOUBLE, peer, 7, MPI_COMM_WORLD, &r);
        MPI_Wait(&r, MPI_STATUS_IGNORE);
    } else {
        MPI_Recv(&y, 1, MPI_DOUBLE, peer, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
    printf("rank %d: the call returned (it should not have)\n", rank);
    MPI_Comm_free(&c);
    dsm_engine_free(&e);
    MPI_Finalize();
    return 2;
}
