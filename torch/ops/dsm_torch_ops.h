/*
 * libdsm_torch_ops: libdsm's Ulysses all-to-all transforms as TorchScript
 * operators, torch.ops.dsm.seq_to_head and torch.ops.dsm.head_to_seq, with
 * their gradients. A PyTorch model's attention calls them; the program that
 * runs the model says which sequence-parallel group they work on with the
 * functions below. A C header: the operators themselves are reached through
 * TorchScript (torch.ops.dsm.*) or the dispatcher, not through C.
 */
#ifndef DSM_TORCH_OPS_H
#define DSM_TORCH_OPS_H

#include <dsm.h>

#if defined(DSM_BUILDING_TORCH_OPS) && defined(__GNUC__)
#define DSM_TORCH_OPS_API __attribute__((visibility("default")))
#else
#define DSM_TORCH_OPS_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/**
 * @defgroup dsm_torch_ops Ulysses operators for TorchScript models
 *
 * Loading the library (linking it, or torch.ops.load_library() in Python)
 * registers two operators in the namespace "dsm":
 *
 *     dsm::seq_to_head(Tensor x, int seq_dim=1, int head_dim=2, bool replicate=False) -> Tensor
 *     dsm::head_to_seq(Tensor x, int heads, int seq_dim=1, int head_dim=2, bool replicate=False) -> Tensor
 *
 * x is a 4-D attention tensor whose last dimension is the head dimension d;
 * seq_dim and head_dim (0, 1 or 2, distinct, negative counting from the
 * end) name its sequence and head dimensions, the third is the batch.
 * seq_to_head() takes this rank's tokens of every head ([b, s/P, H, d] for
 * the default dims) and returns every token of this rank's heads ([b, s,
 * count, d]); head_to_seq() is its inverse and needs the total head count
 * @c heads. Heads are split as dsm_sp_head_range() says (uneven counts
 * allowed); @c replicate is DSM_SP_REPLICATE (grouped-query keys and values
 * with fewer heads than ranks). The layouts [b, s, H, d] and [s, b, H, d]
 * are transformed in place of the all-to-all's packing; others ([b, H, s, d])
 * are made contiguous in [b, s, H, d] first. Outputs are new contiguous
 * tensors in x's dimension order. Each operator's gradient is the other's
 * all-to-all (exact: the transforms only move elements, except that
 * head_to_seq() sums the copies of a replicated head, the gradient of the
 * replication). Float32, float64, float16 and bfloat16 CPU tensors.
 *
 * The operators work on a process-wide group set by dsm_torch_ops_set_mesh():
 * - a group of P ranks: one all-to-all over it per call (forward and backward);
 * - no sequence parallelism (a NULL mesh, a mesh without the group, P = 1):
 *   copies (the identity);
 * - nothing set: the identity in a process that is not a multi-rank MPI job
 *   (a Python process that scripts the model), and an error ("no
 *   sequence-parallel group is set") on a job of more than one rank, where
 *   the identity would silently give each rank a wrong attention.
 *
 * Errors are thrown as c10::Error from the operator (TorchScript's forward
 * or autograd's backward) with a message that starts with the operator's
 * name and names the bad value. With a group set, a bad input on any rank
 * (wrong dimensions, dtype, device, head count; shapes that differ across
 * ranks) makes every rank of the group throw, with the message of the
 * lowest failing rank, before any data moves: no rank hangs.
 *
 * Thread safety: the functions below and the operators serialize on one
 * process-wide lock. The operators are collective over the group: every rank
 * must call them in the same order, as any collective.
 * @{
 */

/**
 * @brief Set the sequence-parallel group of the operators: @p group of
 * @p mesh (NULL: "sequence_parallel").
 *
 * Collective over @p mesh; every rank passes the same group. It creates a
 * libdsm sequence-parallel context over the group (dsm_sp_create()) and
 * replaces (frees) the one set before, collectively over that one's group.
 * A NULL @p mesh, or a NULL @p group on a mesh without a
 * "sequence_parallel" group, means no sequence parallelism: the operators
 * are the identity on any number of ranks (not collective then, except for
 * freeing the previous group). Call it before the model's first forward and
 * dsm_torch_ops_clear() before freeing @p mesh.
 * @return DSM_SUCCESS; DSM_ERR_NOT_FOUND for a named @p group the mesh does
 * not have; the statuses of dsm_sp_create() (DSM_ERR_MISMATCH when ranks
 * name different groups); DSM_ERR_MPI. On error nothing is set (the
 * operators are as after dsm_torch_ops_clear()).
 */
DSM_TORCH_OPS_API dsm_status_t dsm_torch_ops_set_mesh(dsm_mesh_t mesh, const char *group);

/**
 * @brief Forget the group: free its context (collectively over the group)
 * and go back to "nothing set". Does nothing when nothing is set.
 * @return DSM_SUCCESS; DSM_ERR_MPI.
 */
DSM_TORCH_OPS_API dsm_status_t dsm_torch_ops_clear(void);

/**
 * @brief The size P of the group the operators work on: 1 when nothing or no
 * sequence parallelism is set. Not collective.
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER.
 */
DSM_TORCH_OPS_API dsm_status_t dsm_torch_ops_group_size(int *size);

/** @} */

#ifdef __cplusplus
}
#endif

#endif /* DSM_TORCH_OPS_H */
