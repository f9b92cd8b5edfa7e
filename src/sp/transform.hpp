// DeepSpeed-Ulysses sequence parallelism: the all-to-all transforms between
// sequence-sharded [b, s/P, H, d] and head-sharded [b, s, H_j, d] tensors
// (and the sequence-first layouts), and the token-weighted loss over the
// group. See the dsm_sp group of dsm.h and doc/sequence-parallel.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <mpi.h>

#include "comm/backend.hpp"
#include "dsm.h"
#include "sp/geometry.hpp"

namespace dsm {
namespace sp {

// Heads [first, first + count) of `rank` out of `size` (dsm_sp_head_range()).
HeadRange head_range(int64_t heads, unsigned flags, int size, int rank);

// DSM_ERR_INVALID_ARGUMENT naming the field when `t` is not a valid tensor
// for a group of `size` (s a multiple of size, replication possible, sizes
// that fit in memory). `what` names the tensor in messages.
void check_tensor(const dsm_sp_tensor_t &t, int size, const std::string &what);

// Elements of this rank's sequence-sharded and head-sharded forms.
struct Counts {
    size_t seq_sharded = 0, head_sharded = 0;
};
Counts counts(const dsm_sp_tensor_t &t, int size, int rank);

enum class Direction { SEQ_TO_HEAD, HEAD_TO_SEQ };

class Context {
public:
    // Collective over `comm` (a dup is kept by the backend). `node_color`
    // names this rank's node as the mesh placement does.
    Context(MPI_Comm comm, int node_color);
    ~Context();
    Context(const Context &) = delete;
    Context &operator=(const Context &) = delete;

    int size() const noexcept { return size_; }
    int rank() const noexcept { return rank_; }
    comm::Backend &backend() noexcept { return *backend_; }

    // One all-to-all for `n` tensors (the dsm_sp_*_n calls). Collective;
    // every rank throws the same error.
    void transform(Direction dir, int n, const dsm_sp_tensor_t t[], const void *const in[], const size_t in_count[],
                   void *const out[], const size_t out_count[]);

    // dsm_sp_alloc() / dsm_sp_free_memory(). Collective; a NULL output
    // (have_output false) on any rank fails every rank before allocating.
    // free() frees *where and sets it to NULL.
    void *alloc(size_t bytes, bool have_output);
    void free(void **where);

    // dsm_sp_loss(). Collective.
    void loss(double loss_sum, int64_t tokens, double *mean, double *grad_scale);

    // Collective release of the backend; afterwards the context is unusable.
    void close();

private:
    std::unique_ptr<comm::Backend> backend_;
    int size_ = 1, rank_ = 0;
    std::vector<unsigned char> staging_; // replicated head-to-sequence blocks
    std::set<void *> allocations_;       // from alloc(), not yet freed
};

} // namespace sp
} // namespace dsm
