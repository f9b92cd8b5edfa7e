/*
 * mesh_demo: build a data-parallel x sequence-parallel mesh over all ranks,
 * show where each rank landed, and use the per-dimension communicators.
 *
 *   mpiexec -n 4 ./mesh_demo          (2 x 2 by default)
 *   mpiexec -n 8 ./mesh_demo 4        (sequence-parallel size 4)
 */
#include <stdio.h>
#include <stdlib.h>

#include <mpi.h>

#include "dsm.h"

#define CHECK(call)                                                              \
    do {                                                                         \
        dsm_status_t st_ = (call);                                               \
        if (st_ != DSM_SUCCESS) {                                                \
            fprintf(stderr, "%s failed: %s\n", #call, dsm_last_error());     \
            MPI_Abort(MPI_COMM_WORLD, 1);                                        \
        }                                                                        \
    } while (0)

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv); /* the application owns MPI */
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int sp = argc > 1 ? atoi(argv[1]) : (size % 2 == 0 ? 2 : 1);

    /* DeepSpeed's mesh_param = (dp, sp); dp = -1 is inferred from the size. */
    dsm_mesh_t mesh;
    CHECK(dsm_mesh_create_dp_sp(MPI_COMM_WORLD, -1, sp, &mesh));

    char *table = NULL;
    CHECK(dsm_mesh_describe(mesh, DSM_FORMAT_TEXT, &table));
    if (rank == 0) printf("%s\n", table);
    dsm_free(table);

    /* Sum a value over each sequence-parallel group and each data-parallel group. */
    MPI_Comm sp_comm, dp_comm;
    int sp_rank, dp_rank;
    CHECK(dsm_mesh_comm(mesh, "sequence_parallel", &sp_comm));
    CHECK(dsm_mesh_comm(mesh, "data_parallel", &dp_comm));
    CHECK(dsm_mesh_rank(mesh, "sequence_parallel", &sp_rank));
    CHECK(dsm_mesh_rank(mesh, "data_parallel", &dp_rank));
    int one = 1, sp_sum = 0, dp_sum = 0;
    MPI_Allreduce(&one, &sp_sum, 1, MPI_INT, MPI_SUM, sp_comm);
    MPI_Allreduce(&one, &dp_sum, 1, MPI_INT, MPI_SUM, dp_comm);

    /* One line per rank, in rank order. */
    for (int r = 0; r < size; ++r) {
        if (r == rank)
            printf("rank %d: data_parallel rank %d of %d, sequence_parallel rank %d of %d\n", rank,
                   dp_rank, dp_sum, sp_rank, sp_sum);
        fflush(stdout);
        MPI_Barrier(MPI_COMM_WORLD);
    }

    CHECK(dsm_mesh_free(&mesh));
    MPI_Finalize();
    return 0;
}
