/*
 * libdsm C API, part: sequence parallelism (Ulysses).
 *
 * Included by <dsm.h>, the header programs include; it also compiles on
 * its own. See dsm.h for the conventions every part follows.
 */
#ifndef DSM_SP_H
#define DSM_SP_H

#include "dsm/base.h"
#include "dsm/mesh.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * @defgroup dsm_sp Sequence parallelism (Ulysses)
 *
 * DeepSpeed-Ulysses (arXiv 2309.14509): the ranks of a sequence-parallel
 * group of size P each hold s/P consecutive tokens of every sequence; around
 * attention one all-to-all per tensor swaps "my tokens, all heads" for "all
 * tokens, my heads" (dsm_sp_seq_to_head()) and back (dsm_sp_head_to_seq()).
 *
 * Heads are split as evenly as possible: with H heads over P ranks, rank j
 * holds H/P heads, plus one more when j < H mod P (7 heads over 4 ranks:
 * 2, 2, 2, 1), starting at head j*(H/P) + min(j, H mod P); see
 * dsm_sp_head_range(). A tensor with DSM_SP_REPLICATE (the keys and values of
 * grouped-query attention when they have fewer heads than P) gives every rank
 * one head, head j*H/P, which needs P to be a multiple of H; with H >= P it
 * needs H to be a multiple of P. Each rank's key/value heads are then the
 * ones its query heads use provided the query heads are split evenly too (a
 * query head count that is a multiple of P and of the key/value head count):
 * the library does not know which query heads go with which key/value heads,
 * so it cannot check this; with an uneven query split (6 query and 2
 * key/value heads over 4 ranks) some rank would hold a query head without
 * its key/value head.
 *
 * Tensors are dense, row-major, in one of two layouts (dsm_sp_layout_t), of
 * any dtype (bytes are moved, never combined, except when head-to-sequence
 * sums the replicas of a DSM_SP_REPLICATE tensor: FLOAT32, FLOAT64, FLOAT16
 * and BFLOAT16 only, added in fp32 or fp64 and rounded once).
 * @{
 */

/** A sequence-parallel group (an opaque handle). */
typedef struct dsm_sp_s *dsm_sp_t;

/** Layouts of an attention tensor (b: batch, s: sequence, H: heads, d: head dim). */
typedef enum dsm_sp_layout {
    DSM_SP_BATCH_FIRST = 0, /**< [b, s, H, d] */
    DSM_SP_SEQ_FIRST = 1    /**< [s, b, H, d] */
} dsm_sp_layout_t;

/** dsm_sp_tensor_t::flags: replicate the heads over the ranks when there are fewer heads than ranks (GQA keys/values). */
#define DSM_SP_REPLICATE 1u

/**
 * The global shape of an attention tensor: the whole sequence and every
 * head, as the single-rank computation sees it.
 */
typedef struct dsm_sp_tensor {
    int64_t batch;          /**< b >= 1 */
    int64_t seq;            /**< s: the whole sequence, a multiple of the group size */
    int64_t heads;          /**< H >= 1 */
    int64_t head_dim;       /**< d >= 1 */
    dsm_sp_layout_t layout; /**< DSM_SP_BATCH_FIRST or DSM_SP_SEQ_FIRST */
    dsm_dtype_t dtype;      /**< element type */
    unsigned flags;         /**< 0 or DSM_SP_REPLICATE */
} dsm_sp_tensor_t;

/**
 * @brief Create the sequence-parallel context of a group of the mesh.
 *
 * Collective over the mesh. @p group names a dimension or a flattened group
 * (see dsm_mesh_size()); NULL means "sequence_parallel". The context owns
 * a communication backend over the group (shared memory inside a node, MPI
 * across nodes, as the engine's) and must be freed with dsm_sp_free()
 * before the mesh.
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_NOT_FOUND for an
 * unknown group; DSM_ERR_MISMATCH when ranks name different groups;
 * DSM_ERR_OUT_OF_MEMORY; DSM_ERR_MPI. Every rank returns the same status.
 */
DSM_API dsm_status_t dsm_sp_create(dsm_mesh_t mesh, const char *group, dsm_sp_t *sp);

/**
 * @brief Free a context and set the handle to NULL. NULL and a pointer to
 * NULL are allowed and do nothing (as every dsm_*_free()).
 *
 * Collective over the group. Memory from dsm_sp_alloc() that is still
 * allocated is released with it.
 * @return DSM_SUCCESS; DSM_ERR_MPI.
 */
DSM_API dsm_status_t dsm_sp_free(dsm_sp_t *sp);

/** @brief The group's size P. Not collective. @return DSM_SUCCESS; DSM_ERR_NULL_POINTER. */
DSM_API dsm_status_t dsm_sp_size(dsm_sp_t sp, int *size);

/** @brief This rank's rank in the group. Not collective. @return DSM_SUCCESS; DSM_ERR_NULL_POINTER. */
DSM_API dsm_status_t dsm_sp_rank(dsm_sp_t sp, int *rank);

/**
 * @brief Memory for the inputs of the transforms that the ranks of a node
 * can read directly: with it, a transform inside a node is one copy from the
 * peers' inputs into each rank's output.
 *
 * Collective over the group: every rank calls it in the same order (sizes
 * may differ, e.g. for head-sharded tensors with uneven heads). The memory is
 * 64-byte aligned and zeroed; inside a node it lies in a shared window
 * (MPI_Win_allocate_shared) of the group's backend, across nodes (or with
 * the plain MPI backend) it is private memory and the transforms work as
 * with any other memory. Tensors passed as the @p in of dsm_sp_seq_to_head()
 * and the other transforms that lie in such memory on every rank of a node
 * are read in place by the peers: no packing, no intermediate buffer, no
 * kernel copy; others go through the node's shared window or MPI.
 * The shared window lives in /dev/shm: when the node's ranks together ask
 * for more than it has room for (one rank's request is enough), every rank
 * returns DSM_ERR_OUT_OF_MEMORY, with a message naming /dev/shm, the bytes
 * needed and the bytes available, and nothing is allocated.
 * @param bytes 0 is allowed (a valid pointer to no bytes)
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_OUT_OF_MEMORY (on
 * every rank when one fails); DSM_ERR_MPI.
 */
DSM_API dsm_status_t dsm_sp_alloc(dsm_sp_t sp, size_t bytes, void **ptr);

/**
 * @brief Free memory from dsm_sp_alloc() and set @p *ptr to NULL, as the
 * other free functions do (a NULL @p *ptr is accepted and does nothing, so a
 * second free through the same variable is harmless).
 *
 * Collective over the group, in the same order on every rank (every rank
 * passes a block of its own, or every rank NULL).
 * @param ptr the address of the pointer dsm_sp_alloc() returned:
 *            dsm_sp_free_memory(sp, (void **)&buf)
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER (sp, ptr); DSM_ERR_INVALID_ARGUMENT
 * for a pointer that dsm_sp_alloc() of this context did not return (or a
 * copy of one freed already); DSM_ERR_MISMATCH (NULL on some ranks only);
 * DSM_ERR_MPI. On error @p *ptr is left as it was.
 */
DSM_API dsm_status_t dsm_sp_free_memory(dsm_sp_t sp, void **ptr);

/**
 * @brief The heads rank @p rank of a group of @p size holds after
 * dsm_sp_seq_to_head(): heads [*first, *first + *count).
 *
 * Not collective; needs no context. @p flags as dsm_sp_tensor_t::flags.
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT
 * (heads < 1, size < 1, rank outside [0, size), or DSM_SP_REPLICATE with
 * heads and size that do not divide, naming them).
 */
DSM_API dsm_status_t dsm_sp_head_range(int64_t heads, unsigned flags, int size, int rank, int64_t *first,
                                       int64_t *count);

/**
 * @brief Element counts of this rank's two forms of @p t: sequence-sharded
 * (b * s/P * H * d) and head-sharded (b * s * count * d, count from
 * dsm_sp_head_range()).
 *
 * Not collective. @return DSM_SUCCESS; DSM_ERR_NULL_POINTER;
 * DSM_ERR_INVALID_ARGUMENT for a bad shape (naming the field and value).
 */
DSM_API dsm_status_t dsm_sp_counts(dsm_sp_t sp, const dsm_sp_tensor_t *t, size_t *seq_sharded,
                                   size_t *head_sharded);

/**
 * @brief Sequence-to-head all-to-all: [b, s/P, H, d] (this rank's tokens,
 * every head) becomes [b, s, count, d] (every token in rank order, this
 * rank's heads), or the same in the sequence-first layout.
 *
 * Collective over the group: every rank passes the same @p t. One
 * all-to-all; the layout permutation is done while packing and unpacking.
 * @p in holds @p in_count elements (the sequence-sharded count of
 * dsm_sp_counts()), @p out @p out_count (the head-sharded count); they must
 * not overlap (DSM_ERR_INVALID_ARGUMENT "in and out overlap").
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT (a bad
 * shape, s not a multiple of P, a wrong count: naming the value and the
 * expected one; overlapping in and out); DSM_ERR_MISMATCH when ranks pass different shapes
 * (detected before any data moves); DSM_ERR_MPI. Every rank returns the
 * same status.
 */
DSM_API dsm_status_t dsm_sp_seq_to_head(dsm_sp_t sp, const dsm_sp_tensor_t *t, const void *in,
                                        size_t in_count, void *out, size_t out_count);

/**
 * @brief Head-to-sequence all-to-all, the inverse of dsm_sp_seq_to_head():
 * [b, s, count, d] becomes [b, s/P, H, d] (used for the attention output and
 * for gradients in the backward pass).
 *
 * For a DSM_SP_REPLICATE tensor the copies of a head are summed (the
 * gradient of the replication), so that a round trip multiplies such a
 * tensor by the number of copies of each head (P/H when H < P).
 * Counts, errors and collectiveness as dsm_sp_seq_to_head(), with the roles
 * of the two counts swapped.
 */
DSM_API dsm_status_t dsm_sp_head_to_seq(dsm_sp_t sp, const dsm_sp_tensor_t *t, const void *in,
                                        size_t in_count, void *out, size_t out_count);

/**
 * @brief dsm_sp_seq_to_head() of @p n tensors in one all-to-all (q, k and v
 * of attention together: n = 3, the shapes may differ, e.g. in heads).
 *
 * @p in, @p in_count, @p out, @p out_count are arrays of @p n. Each output
 * must be disjoint from every input and from every other output (the
 * outputs are written while the inputs are still read, in any order); the
 * inputs may share memory (the same tensor sent twice). Errors as
 * dsm_sp_seq_to_head(), naming the tensor's index; overlapping buffers are
 * DSM_ERR_INVALID_ARGUMENT naming both ("in[1] and out[0] overlap",
 * "out[0] and out[1] overlap").
 */
DSM_API dsm_status_t dsm_sp_seq_to_head_n(dsm_sp_t sp, int n, const dsm_sp_tensor_t t[],
                                          const void *const in[], const size_t in_count[],
                                          void *const out[], const size_t out_count[]);

/**
 * @brief dsm_sp_head_to_seq() of @p n tensors in one all-to-all; arrays,
 * disjoint outputs and errors as dsm_sp_seq_to_head_n().
 */
DSM_API dsm_status_t dsm_sp_head_to_seq_n(dsm_sp_t sp, int n, const dsm_sp_tensor_t t[],
                                          const void *const in[], const size_t in_count[],
                                          void *const out[], const size_t out_count[]);

/** The ignore index of the labels: positions whose loss does not count. */
#define DSM_IGNORE_INDEX (-100)

/**
 * @brief This rank's chunk of a batch of sequences for causal language
 * modelling.
 *
 * Not collective; needs no context. @p tokens, @p positions and @p labels
 * are [batch, seq] (row-major); @p positions NULL means 0..seq-1, @p labels
 * NULL means the tokens. The labels are shifted: position t is labelled with
 * labels[t + 1], and the last position with DSM_IGNORE_INDEX. A sequence is
 * cut into @p size chunks of chunk = ceil(seq / size) positions; rank @p rank
 * gets positions [rank * chunk, (rank + 1) * chunk), and positions past the
 * end of the sequence are padding: token @p pad_token, label
 * DSM_IGNORE_INDEX, and a position that continues the row's count (the
 * row's last position plus one, plus two, ...; with @p positions NULL simply
 * its index). Outputs are [batch, chunk] and must not overlap the inputs;
 * @p out_len is their capacity in elements (at least batch * chunk). @p
 * valid (may be NULL) gets the number of labels of the chunk that are not
 * DSM_IGNORE_INDEX, for dsm_sp_loss().
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT (batch
 * or seq < 1, size < 1, rank outside [0, size), out_len too small, batch *
 * seq too large to address, a padding position past INT64_MAX: naming the
 * value).
 */
DSM_API dsm_status_t dsm_sp_shard_batch(int size, int rank, int64_t batch, int64_t seq, const int64_t *tokens,
                                        const int64_t *positions, const int64_t *labels, int64_t pad_token,
                                        size_t out_len, int64_t *out_tokens, int64_t *out_positions,
                                        int64_t *out_labels, int64_t *chunk, int64_t *valid);

/**
 * @brief The token-weighted mean loss over the group and the scale of this
 * rank's gradients.
 *
 * Collective over the group. Each rank passes the sum of its per-token
 * losses and the number of tokens that count (labels not
 * DSM_IGNORE_INDEX). @p mean gets sum(loss_sum) / sum(tokens) over the
 * group; @p grad_scale gets 1 / sum(tokens): a rank that multiplies the
 * gradient of its local loss sum by it makes the engine's sum over the group
 * (see dsm_engine_init()) the gradient of the whole sequence's mean loss.
 * When no token of the group counts, both are 0.
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT
 * (negative tokens, non-finite loss sum: on every rank); DSM_ERR_MPI.
 */
DSM_API dsm_status_t dsm_sp_loss(dsm_sp_t sp, double loss_sum, int64_t tokens, double *mean, double *grad_scale);

/** @} */

#ifdef __cplusplus
}
#endif

#endif /* DSM_SP_H */
