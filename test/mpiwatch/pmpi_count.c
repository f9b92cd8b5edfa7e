/*
 * Another MPI profiling tool, for the coexistence check of mpiwatch.sh: it
 * wraps MPI_Allreduce and MPI_Barrier the usual way (calling PMPI_X) and
 * says on stderr, once per call name, that it saw the call.
 */
#include <stdio.h>

#include <mpi.h>

static int seen_allreduce, seen_barrier;

int MPI_Allreduce(const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm comm) {
    if (!seen_allreduce++) {
        fprintf(stderr, "pmpi_count: saw MPI_Allreduce\n");
        fflush(stderr);
    }
    return PMPI_Allreduce(s, r, n, t, op, comm);
}

int MPI_Barrier(MPI_Comm comm) {
    if (!seen_barrier++) {
        fprintf(stderr, "pmpi_count: saw MPI_Barrier\n");
        fflush(stderr);
    }
    return PMPI_Barrier(comm);
}
