// RAII owner of an MPI communicator. Move-only: a moved-from Comm holds
// MPI_COMM_NULL, so exactly one object frees each communicator.
#pragma once

#include <mpi.h>

namespace dsm {

class Comm {
public:
    Comm() = default;
    explicit Comm(MPI_Comm c) noexcept : comm_(c) {}
    ~Comm() { reset(); }
    Comm(Comm &&o) noexcept : comm_(o.release()) {}
    Comm &operator=(Comm &&o) noexcept {
        if (this != &o) {
            reset();
            comm_ = o.release();
        }
        return *this;
    }
    Comm(const Comm &) = delete;
    Comm &operator=(const Comm &) = delete;

    MPI_Comm get() const noexcept { return comm_; }
    MPI_Comm release() noexcept {
        MPI_Comm c = comm_;
        comm_ = MPI_COMM_NULL;
        return c;
    }
    // Free the communicator; returns the MPI error code (never throws). After
    // MPI_Finalize nothing can be freed: the handle is dropped.
    int reset() noexcept;

    // MPI_Comm_dup of `parent` with MPI_ERRORS_RETURN set.
    static Comm dup(MPI_Comm parent);
    // MPI_Comm_split of `parent` with MPI_ERRORS_RETURN set.
    static Comm split(MPI_Comm parent, int color, int key);

private:
    MPI_Comm comm_ = MPI_COMM_NULL;
};

} // namespace dsm
