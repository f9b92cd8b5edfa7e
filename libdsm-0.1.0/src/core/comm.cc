#include "dsm_config.h"

#include "core/comm.hpp"

#include "core/error.hpp"

namespace dsm {

int Comm::reset() noexcept {
    int rc = MPI_SUCCESS;
    if (comm_ != MPI_COMM_NULL) {
        int fini = 0;
        MPI_Finalized(&fini);
        if (!fini) rc = MPI_Comm_free(&comm_);
        comm_ = MPI_COMM_NULL;
    }
    return rc;
}

Comm Comm::dup(MPI_Comm parent) {
    MPI_Comm c = MPI_COMM_NULL;
    DSM_CHECK_MPI(MPI_Comm_dup(parent, &c));
    Comm owned(c);
    DSM_CHECK_MPI(MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN));
    return owned;
}

Comm Comm::split(MPI_Comm parent, int color, int key) {
    MPI_Comm c = MPI_COMM_NULL;
    DSM_CHECK_MPI(MPI_Comm_split(parent, color, key, &c));
    Comm owned(c);
    DSM_CHECK_MPI(MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN));
    return owned;
}

} // namespace dsm
