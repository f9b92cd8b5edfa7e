/* The entry points of the watchdog for the MPI profiling-interface layer
 * (libdsm_mpiwatch, mpiwatch/): one table, exported by libdsm as the data
 * symbol dsm_watch_hooks_v1, so that the program's own MPI calls are watched
 * by the same watchdog thread, with the same message and the same step, as
 * libdsm's waits. Not a public API: the layer and libdsm are built and
 * installed together (the version field is checked). C, for the layer. */
#ifndef DSM_CORE_WATCH_HOOKS_H
#define DSM_CORE_WATCH_HOOKS_H

#include <mpi.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DSM_WATCH_HOOKS_VERSION 1

struct dsm_watch_hooks {
    int version; /* DSM_WATCH_HOOKS_VERSION */
    /* After MPI_Init: reads DSM_COMM_TIMEOUT and starts the watchdog thread
       when it is not 0. Returns 0, or -1 when the value is malformed (the
       message is on stderr). Local. */
    int (*start)(void);
    /* Whether the watchdog runs (nonzero); the wrappers skip enter/leave
       when it does not. */
    int (*running)(void);
    /* A blocking MPI call of the program on this thread: `call` (a static
       string, "MPI_Allreduce"), `comm` (MPI_COMM_NULL: none, e.g. MPI_Wait),
       `peer_role` and `peer` (a static string, "source"/"destination", and
       a rank of comm; NULL: none). Returns a token for leave(): NULL when
       nothing was opened (the watchdog is off, or libdsm itself is waiting
       on this thread: its own record names the wait). */
    void *(*enter)(const char *call, MPI_Comm comm, const char *peer_role, int peer);
    void (*leave)(void *token);
    /* Before MPI_Comm_free: forgets what it knew of `comm`. */
    void (*forget)(MPI_Comm comm);
};

extern const struct dsm_watch_hooks dsm_watch_hooks_v1;

#ifdef __cplusplus
}
#endif

#endif
