// Small host values over a backend's group (scalars.hpp).
#include "comm/scalars.hpp"

namespace dsm {
namespace comm {

void allreduce_f64(Backend &b, double *v, size_t n, Op op) { b.allreduce(v, v, n, DSM_FLOAT64, op); }

int allreduce_int(Backend &b, int v, Op op) {
    double x = v;
    b.allreduce(&x, &x, 1, DSM_FLOAT64, op);
    return static_cast<int>(x);
}

std::vector<int> allgather_int(Backend &b, int v) {
    std::vector<int32_t> all(static_cast<size_t>(b.size()));
    const int32_t mine = v;
    b.allgather(&mine, all.data(), 1, DSM_INT32);
    return std::vector<int>(all.begin(), all.end());
}

void bcast_int(Backend &b, int *v, int root) {
    int32_t x = *v;
    b.bcast(&x, 1, DSM_INT32, root);
    *v = x;
}

void bcast_u64(Backend &b, uint64_t *v, int root) { b.bcast(v, 1, DSM_INT64, root); }

} // namespace comm
} // namespace dsm
