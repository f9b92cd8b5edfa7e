/*
 * libdsm: DeepSpeed's distributed-training runtime for MPI codes.
 *
 * The public header: programs include <dsm.h>, which includes the parts of
 * the API, one per subsystem, under dsm/ (dsm/base.h: statuses and errors,
 * version, data types and their conversion, descriptions; dsm/mesh.h;
 * dsm/config.h; dsm/engine.h; dsm/checkpoint.h: the engine's checkpoints;
 * dsm/sp.h: sequence parallelism; dsm/data.h: the sampler), each of which
 * also compiles on its own. C99, usable from C and C++; every name starts
 * with dsm_ or DSM_. Every function returns a dsm_status_t (DSM_SUCCESS = 0)
 * and puts its outputs last, except four that cannot fail:
 * dsm_status_string(), dsm_last_error() and dsm_dtype_name() return a string
 * and dsm_free() returns nothing.
 *
 * Collective calls: a function marked "Collective over C" must be called by
 * every rank of C with matching arguments. If any rank's arguments are bad,
 * every rank returns the same error status, and the message of
 * dsm_last_error() names the rank and the bad value; no rank hangs. A rank
 * that stops answering (stopped, or on a node that dropped off the network)
 * does not hang the others either: a wait of libdsm longer than
 * DSM_COMM_TIMEOUT seconds prints a message naming it and ends the job with
 * MPI_Abort and exit status 75 (doc/environment.md, "The watchdog").
 *
 * Thread safety: functions on different handles may be called concurrently
 * from different threads; calls on the same handle (a mesh and its slices
 * count as one) must be serialized by the caller, and collective calls follow the MPI rules for the communicator
 * (MPI_THREAD_MULTIPLE is needed only if threads call libdsm concurrently).
 * The last-error message is per thread.
 */
#ifndef DSM_H
#define DSM_H

#include "dsm/base.h"
#include "dsm/mesh.h"
#include "dsm/config.h"
#include "dsm/engine.h"
#include "dsm/checkpoint.h"
#include "dsm/sp.h"
#include "dsm/data.h"

#endif /* DSM_H */
