// Small host values over a backend's group: the flags, indices and sums the
// layers above agree between their ranks (the engine's gradient norm, its
// mean loss, a checkpoint's client size). Each is one collective of the
// backend, so the backend's byte accounting and the watchdog (a wait on the
// backend's group) see it. The values live in host memory: use a backend
// that accepts it (the engine keeps "mpi" backends for these, whose sums
// have MPI's bits).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "comm/backend.hpp"

namespace dsm {
namespace comm {

// Collective: v = op over the members of v (in place, n values).
void allreduce_f64(Backend &b, double *v, size_t n, Op op);

// Collective: op over the members of one int. Carried as a float64, which
// holds every int exactly (the result is the same as an integer reduction).
int allreduce_int(Backend &b, int v, Op op);

// Collective: every member's int, by group rank.
std::vector<int> allgather_int(Backend &b, int v);

// Collective: the root's value on every member.
void bcast_int(Backend &b, int *v, int root);
void bcast_u64(Backend &b, uint64_t *v, int root);

} // namespace comm
} // namespace dsm
