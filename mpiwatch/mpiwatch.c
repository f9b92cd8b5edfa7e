/*
 * libdsm_mpiwatch: the program's own blocking MPI calls under libdsm's
 * watchdog, through the MPI profiling interface (opt-in).
 *
 * Loaded before the MPI library (LD_PRELOAD=libdsm_mpiwatch.so, or linked
 * before -lmpi), its MPI_X wrappers open a wait of the watchdog around each
 * blocking call of the program: the collectives, MPI_Recv, MPI_Send and its
 * synchronous and combined forms, MPI_Probe, MPI_Wait and its variants (the
 * completions of the nonblocking calls). A call that lasts DSM_COMM_TIMEOUT
 * seconds ends the job as a wait of libdsm does: one message naming the
 * call, its communicator (its MPI name, its size, this rank's place, the
 * other members and their hosts), the peer of a point-to-point call, how
 * long, and the step of the engine; then MPI_Abort, and _exit(75) if that
 * does not return.
 *
 * Cost: a wrapper adds a load and a branch when the watchdog is off, and a
 * few stores into memory of its own thread when it runs (no clock read, no
 * system call, no lock but the first time a communicator is seen).
 *
 * Another profiling tool: each wrapper calls the next definition of MPI_X in
 * the loader's search order (dlsym(RTLD_NEXT)), not PMPI_X, so a tool loaded
 * after this library (LD_PRELOAD="libdsm_mpiwatch.so libtool.so") still
 * sees every call. A tool loaded before it that calls PMPI_X itself (as
 * most do) hides the calls from this layer: put this layer first.
 *
 * The calls libdsm makes itself are watched by libdsm (the wrappers open
 * nothing while a wait of libdsm is open on the thread). DSM_WATCH_MPI=0
 * (libdsm's parameter) turns the wrappers off while the library is loaded.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "core/watch_hooks.h"

static int on; /* set after MPI_Init when the watchdog runs */

/* The code of libdsm.so: a call made from there is libdsm's, watched by
   libdsm itself (its waits name the group and the backend) or not a wait. */
static uintptr_t dsm_lo, dsm_hi;

static int find_dsm(struct dl_phdr_info *info, size_t size, void *base) {
    (void)size;
    if ((uintptr_t)info->dlpi_addr != (uintptr_t)base || info->dlpi_name == NULL || info->dlpi_name[0] == '\0')
        return 0;
    for (int i = 0; i < info->dlpi_phnum; ++i) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X)) continue;
        const uintptr_t lo = (uintptr_t)info->dlpi_addr + ph->p_vaddr;
        if (dsm_lo == 0 || lo < dsm_lo) dsm_lo = lo;
        if (lo + ph->p_memsz > dsm_hi) dsm_hi = lo + ph->p_memsz;
    }
    return 1;
}

static void find_libdsm(void) {
    Dl_info info;
    if (dladdr((const void *)&dsm_watch_hooks_v1, &info) == 0 || info.dli_fbase == NULL) return;
    dl_iterate_phdr(find_dsm, info.dli_fbase);
}

static void *next_symbol(const char *name, void *fallback) {
    void *p = dlsym(RTLD_NEXT, name);
    return p != NULL ? p : fallback;
}

/* name##_next(): the next definition of MPI function `name` (resolved once). */
#define DECLARE(name) \
    static __typeof__(P##name) *name##_next(void) { \
        static __typeof__(P##name) *f; \
        __typeof__(P##name) *g = __atomic_load_n(&f, __ATOMIC_RELAXED); \
        if (g == NULL) { \
            g = (__typeof__(P##name) *)next_symbol(#name, (void *)P##name); \
            __atomic_store_n(&f, g, __ATOMIC_RELAXED); \
        } \
        return g; \
    }
#define NEXT(name) name##_next()
#define FROM_LIBDSM() \
    ((uintptr_t)__builtin_return_address(0) - dsm_lo < dsm_hi - dsm_lo)
#define ENTER(call, comm, role, peer) (on && !FROM_LIBDSM() ? dsm_watch_hooks_v1.enter(call, comm, role, peer) : NULL)
#define LEAVE(t) \
    do { \
        if (t) dsm_watch_hooks_v1.leave(t); \
    } while (0)

static void start_watch(void) {
    if (dsm_watch_hooks_v1.version != DSM_WATCH_HOOKS_VERSION) {
        fprintf(stderr, "libdsm_mpiwatch: libdsm's watchdog table is version %d, this layer needs %d: not watching\n",
                dsm_watch_hooks_v1.version, DSM_WATCH_HOOKS_VERSION);
        return;
    }
    find_libdsm();
    if (dsm_watch_hooks_v1.start() == 0 && dsm_watch_hooks_v1.running()) on = 1;
}

DECLARE(MPI_Init)
int MPI_Init(int *argc, char ***argv) {
    const int rc = NEXT(MPI_Init)(argc, argv);
    if (rc == MPI_SUCCESS) start_watch();
    return rc;
}

DECLARE(MPI_Init_thread)
int MPI_Init_thread(int *argc, char ***argv, int required, int *provided) {
    const int rc = NEXT(MPI_Init_thread)(argc, argv, required, provided);
    if (rc == MPI_SUCCESS) start_watch();
    return rc;
}

DECLARE(MPI_Finalize)
int MPI_Finalize(void) {
    /* MPI_Finalize is collective and may wait for the others. */
    void *const t = ENTER("MPI_Finalize", MPI_COMM_NULL, NULL, -1);
    const int rc = NEXT(MPI_Finalize)();
    LEAVE(t);
    on = 0;
    return rc;
}

DECLARE(MPI_Comm_free)
int MPI_Comm_free(MPI_Comm *comm) {
    if (on && comm != NULL) dsm_watch_hooks_v1.forget(*comm);
    return NEXT(MPI_Comm_free)(comm);
}

/* A wrapper: NAME, its parameters, the arguments passed on, the
   communicator, the peer's role (NULL: none) and the peer. */
#define WRAP(name, params, args, comm, role, peer) \
    DECLARE(name) \
    int name params { \
        void *const tok_ = ENTER(#name, comm, role, peer); \
        const int rc_ = NEXT(name) args; \
        LEAVE(tok_); \
        return rc_; \
    }

/* Collectives */
WRAP(MPI_Barrier, (MPI_Comm comm), (comm), comm, NULL, -1)
WRAP(MPI_Bcast, (void *b, int n, MPI_Datatype t, int root, MPI_Comm comm), (b, n, t, root, comm), comm, "root", root)
WRAP(MPI_Reduce, (const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, int root, MPI_Comm comm),
     (s, r, n, t, op, root, comm), comm, "root", root)
WRAP(MPI_Allreduce, (const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm comm), (s, r, n, t, op, comm),
     comm, NULL, -1)
WRAP(MPI_Gather, (const void *s, int sn, MPI_Datatype st, void *r, int rn, MPI_Datatype rt, int root, MPI_Comm comm),
     (s, sn, st, r, rn, rt, root, comm), comm, "root", root)
WRAP(MPI_Gatherv,
     (const void *s, int sn, MPI_Datatype st, void *r, const int rn[], const int d[], MPI_Datatype rt, int root,
      MPI_Comm comm),
     (s, sn, st, r, rn, d, rt, root, comm), comm, "root", root)
WRAP(MPI_Scatter, (const void *s, int sn, MPI_Datatype st, void *r, int rn, MPI_Datatype rt, int root, MPI_Comm comm),
     (s, sn, st, r, rn, rt, root, comm), comm, "root", root)
WRAP(MPI_Scatterv,
     (const void *s, const int sn[], const int d[], MPI_Datatype st, void *r, int rn, MPI_Datatype rt, int root,
      MPI_Comm comm),
     (s, sn, d, st, r, rn, rt, root, comm), comm, "root", root)
WRAP(MPI_Allgather, (const void *s, int sn, MPI_Datatype st, void *r, int rn, MPI_Datatype rt, MPI_Comm comm),
     (s, sn, st, r, rn, rt, comm), comm, NULL, -1)
WRAP(MPI_Allgatherv,
     (const void *s, int sn, MPI_Datatype st, void *r, const int rn[], const int d[], MPI_Datatype rt, MPI_Comm comm),
     (s, sn, st, r, rn, d, rt, comm), comm, NULL, -1)
WRAP(MPI_Alltoall, (const void *s, int sn, MPI_Datatype st, void *r, int rn, MPI_Datatype rt, MPI_Comm comm),
     (s, sn, st, r, rn, rt, comm), comm, NULL, -1)
WRAP(MPI_Alltoallv,
     (const void *s, const int sn[], const int sd[], MPI_Datatype st, void *r, const int rn[], const int rd[],
      MPI_Datatype rt, MPI_Comm comm),
     (s, sn, sd, st, r, rn, rd, rt, comm), comm, NULL, -1)
WRAP(MPI_Alltoallw,
     (const void *s, const int sn[], const int sd[], const MPI_Datatype st[], void *r, const int rn[], const int rd[],
      const MPI_Datatype rt[], MPI_Comm comm),
     (s, sn, sd, st, r, rn, rd, rt, comm), comm, NULL, -1)
WRAP(MPI_Reduce_scatter, (const void *s, void *r, const int rn[], MPI_Datatype t, MPI_Op op, MPI_Comm comm),
     (s, r, rn, t, op, comm), comm, NULL, -1)
WRAP(MPI_Reduce_scatter_block, (const void *s, void *r, int rn, MPI_Datatype t, MPI_Op op, MPI_Comm comm),
     (s, r, rn, t, op, comm), comm, NULL, -1)
WRAP(MPI_Scan, (const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm comm), (s, r, n, t, op, comm),
     comm, NULL, -1)
WRAP(MPI_Exscan, (const void *s, void *r, int n, MPI_Datatype t, MPI_Op op, MPI_Comm comm), (s, r, n, t, op, comm),
     comm, NULL, -1)

/* Point to point */
WRAP(MPI_Recv, (void *b, int n, MPI_Datatype t, int src, int tag, MPI_Comm comm, MPI_Status *st),
     (b, n, t, src, tag, comm, st), comm, "source rank", src)
WRAP(MPI_Send, (const void *b, int n, MPI_Datatype t, int dst, int tag, MPI_Comm comm), (b, n, t, dst, tag, comm),
     comm, "destination rank", dst)
WRAP(MPI_Ssend, (const void *b, int n, MPI_Datatype t, int dst, int tag, MPI_Comm comm), (b, n, t, dst, tag, comm),
     comm, "destination rank", dst)
WRAP(MPI_Sendrecv,
     (const void *s, int sn, MPI_Datatype st, int dst, int stag, void *r, int rn, MPI_Datatype rt, int src, int rtag,
      MPI_Comm comm, MPI_Status *status),
     (s, sn, st, dst, stag, r, rn, rt, src, rtag, comm, status), comm, "source rank", src)
WRAP(MPI_Sendrecv_replace,
     (void *b, int n, MPI_Datatype t, int dst, int stag, int src, int rtag, MPI_Comm comm, MPI_Status *status),
     (b, n, t, dst, stag, src, rtag, comm, status), comm, "source rank", src)
WRAP(MPI_Probe, (int src, int tag, MPI_Comm comm, MPI_Status *st), (src, tag, comm, st), comm, "source rank", src)
WRAP(MPI_Mprobe, (int src, int tag, MPI_Comm comm, MPI_Message *m, MPI_Status *st), (src, tag, comm, m, st), comm,
     "source rank", src)

/* Completions of nonblocking calls (the communicator is not known here) */
WRAP(MPI_Wait, (MPI_Request * r, MPI_Status *st), (r, st), MPI_COMM_NULL, NULL, -1)
WRAP(MPI_Waitall, (int n, MPI_Request r[], MPI_Status st[]), (n, r, st), MPI_COMM_NULL, NULL, -1)
WRAP(MPI_Waitany, (int n, MPI_Request r[], int *i, MPI_Status *st), (n, r, i, st), MPI_COMM_NULL, NULL, -1)
WRAP(MPI_Waitsome, (int n, MPI_Request r[], int *out, int i[], MPI_Status st[]), (n, r, out, i, st), MPI_COMM_NULL,
     NULL, -1)
