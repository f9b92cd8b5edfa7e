/*
 * libdsm Fortran bindings: the thin C shim under module dsm (fortran/dsm.f90).
 *
 * Only what Fortran cannot bind directly lives here: communicators cross the
 * boundary as MPI_Fint (the handle of `use mpi`, and the MPI_VAL of an
 * mpi_f08 type(MPI_Comm)), passed by reference so that their size follows
 * the Fortran default INTEGER, and are converted with MPI_Comm_f2c /
 * MPI_Comm_c2f. Everything else in the module calls the C API of dsm.h
 * itself.
 *
 * These dsm_f_* functions are exported from libdsmf, not libdsm, and are not
 * part of the C API: they are declared here only, not in dsm.h.
 */
#include <mpi.h>

#include "dsm.h"

dsm_status_t dsm_f_mesh_create(const MPI_Fint *comm, int ndims, const int shape[],
                               const char *const names[], int placement, int bind,
                               dsm_mesh_t *mesh);
dsm_status_t dsm_f_mesh_create_dp_sp(const MPI_Fint *comm, int dp, int sp, dsm_mesh_t *mesh);
dsm_status_t dsm_f_mesh_create_for_config(const MPI_Fint *comm, const char *config, dsm_mesh_t *mesh);
dsm_status_t dsm_f_mesh_comm(dsm_mesh_t mesh, const char *group, MPI_Fint *comm);
dsm_status_t dsm_f_mesh_flatten(dsm_mesh_t mesh, int nnames, const char *const names[],
                                const char *flat_name, MPI_Fint *comm);
dsm_status_t dsm_f_config_load(const MPI_Fint *comm, const char *config, unsigned flags,
                               dsm_config_t *cfg);
dsm_status_t dsm_f_engine_init_comm(const MPI_Fint *comm, const char *config,
                                    const dsm_param_desc_t *params, int nparams,
                                    dsm_engine_t *engine);
dsm_status_t dsm_f_engine_init_comm_with_options(const MPI_Fint *comm, const char *config,
                                                 const dsm_param_desc_t *params, int nparams,
                                                 const dsm_engine_options_t *options, dsm_engine_t *engine);

/* Collective over comm: dsm_mesh_create_with_options(), with the options
 * given as their two fields (DSM_PLACEMENT_*, DSM_BIND_*). */
dsm_status_t dsm_f_mesh_create(const MPI_Fint *comm, int ndims, const int shape[],
                               const char *const names[], int placement, int bind,
                               dsm_mesh_t *mesh) {
    dsm_mesh_options_t options = DSM_MESH_OPTIONS_INITIALIZER;
    options.placement = (dsm_placement_t)placement;
    options.bind = (dsm_bind_t)bind;
    return dsm_mesh_create_with_options(MPI_Comm_f2c(*comm), ndims, shape, names, &options, mesh);
}

/* Collective over comm: dsm_mesh_create_dp_sp(). */
dsm_status_t dsm_f_mesh_create_dp_sp(const MPI_Fint *comm, int dp, int sp, dsm_mesh_t *mesh) {
    return dsm_mesh_create_dp_sp(MPI_Comm_f2c(*comm), dp, sp, mesh);
}

/* Collective over comm: dsm_mesh_create_for_config(). */
dsm_status_t dsm_f_mesh_create_for_config(const MPI_Fint *comm, const char *config, dsm_mesh_t *mesh) {
    return dsm_mesh_create_for_config(MPI_Comm_f2c(*comm), config, mesh);
}

/* Not collective: dsm_mesh_comm(); *comm is the Fortran handle of
 * MPI_COMM_NULL on error. */
dsm_status_t dsm_f_mesh_comm(dsm_mesh_t mesh, const char *group, MPI_Fint *comm) {
    MPI_Comm c = MPI_COMM_NULL;
    dsm_status_t status = dsm_mesh_comm(mesh, group, &c);
    if (comm != NULL) *comm = MPI_Comm_c2f(status == DSM_SUCCESS ? c : MPI_COMM_NULL);
    return status;
}

/* Collective over the mesh communicator: dsm_mesh_flatten(); *comm is the
 * Fortran handle of MPI_COMM_NULL on error. */
dsm_status_t dsm_f_mesh_flatten(dsm_mesh_t mesh, int nnames, const char *const names[],
                                const char *flat_name, MPI_Fint *comm) {
    MPI_Comm c = MPI_COMM_NULL;
    dsm_status_t status = dsm_mesh_flatten(mesh, nnames, names, flat_name, &c);
    if (comm != NULL) *comm = MPI_Comm_c2f(status == DSM_SUCCESS ? c : MPI_COMM_NULL);
    return status;
}

/* Collective over comm: dsm_config_load(). */
dsm_status_t dsm_f_config_load(const MPI_Fint *comm, const char *config, unsigned flags,
                               dsm_config_t *cfg) {
    return dsm_config_load(MPI_Comm_f2c(*comm), config, flags, cfg);
}

/* Collective over comm: dsm_engine_init_comm(). */
dsm_status_t dsm_f_engine_init_comm(const MPI_Fint *comm, const char *config,
                                    const dsm_param_desc_t *params, int nparams,
                                    dsm_engine_t *engine) {
    return dsm_engine_init_comm(MPI_Comm_f2c(*comm), config, params, nparams, engine);
}

/* Collective over comm: dsm_engine_init_comm_with_options(). */
dsm_status_t dsm_f_engine_init_comm_with_options(const MPI_Fint *comm, const char *config,
                                                 const dsm_param_desc_t *params, int nparams,
                                                 const dsm_engine_options_t *options, dsm_engine_t *engine) {
    return dsm_engine_init_comm_with_options(MPI_Comm_f2c(*comm), config, params, nparams, options, engine);
}
