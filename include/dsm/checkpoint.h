/*
 * libdsm C API, part: checkpoints of a training engine (save, load, resume,
 * weights from a file, the asynchronous save, the load report).
 *
 * Included by <dsm.h>, the header programs include; it also compiles on
 * its own. See dsm.h for the conventions every part follows.
 */
#ifndef DSM_CHECKPOINT_H
#define DSM_CHECKPOINT_H

#include "dsm/base.h"
#include "dsm/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * @defgroup dsm_checkpoint Checkpoints
 *
 * An engine's state in one parallel HDF5 file per checkpoint (DIR/TAG.h5,
 * full-shape fp32 tensors and the training state, doc/checkpoint.md), which
 * loads on any number of ranks and any ZeRO stage; resuming a run from the
 * newest one; a model's weights from a checkpoint or a safetensors file.
 * Every call here is collective over the engine's ranks.
 * @{
 */

/** dsm_engine_load_checkpoint() flag: load the parameters only (the module's
 *  weights); optimizer state, counters, loss scaler and LR schedule stay. */
#define DSM_CKPT_LOAD_MODULE_ONLY 0x1u
/** dsm_engine_load_checkpoint() flag: keep the engine's optimizer state. */
#define DSM_CKPT_LOAD_NO_OPTIMIZER 0x2u
/** dsm_engine_load_checkpoint() flag: keep the engine's LR schedule position. */
#define DSM_CKPT_LOAD_NO_LR_SCHEDULE 0x4u
/** dsm_engine_load_checkpoint() flag: non-strict. Load the tensors whose
 *  name and shape match the engine's; parameters missing from the file or
 *  of another shape keep their values, tensors of the file the engine lacks
 *  are ignored, and dsm_engine_load_report() lists all of them (a WARN too). */
#define DSM_CKPT_LOAD_NON_STRICT 0x8u
/** dsm_engine_load_checkpoint() flag: fall back. When the checkpoint asked
 *  for (the tag, or the one `latest` names) does not verify (missing,
 *  truncated, corrupt), load the newest checkpoint of the directory that
 *  does, with a WARN for each one skipped and why; dsm_engine_load_report()
 *  lists them. */
#define DSM_CKPT_LOAD_FALLBACK 0x10u

/**
 * @brief Save a checkpoint: DIR/TAG.h5, one parallel HDF5 file holding every
 * parameter's fp32 values and the optimizer state as full-shape tensors, and
 * the training state (doc/checkpoint.md), then DIR/latest naming TAG.
 *
 * Collective over the engine's ranks, at an accumulation boundary (after
 * the dsm_step() that ends a window, or before the first) with every buffer
 * released. Each rank writes the part it owns. The commit is atomic: the
 * file is written under a temporary name, flushed, and renamed by rank 0
 * only when every rank succeeded; `latest` is rewritten last (write, flush,
 * rename). A job killed at any point leaves the previous checkpoint and
 * `latest` loadable; a failed save returns the same error on every rank,
 * never leaves a rank waiting (a write that fails on one rank, such as a
 * full disk, stops every rank), and leaves no file under the final name,
 * except a failure after the rename (flushing the directory, rewriting
 * `latest`), which leaves the complete new file with `latest` on the
 * previous tag.
 *
 * With checkpoint.writer.decoupled true and MPI at MPI_THREAD_MULTIPLE, the
 * save is asynchronous: this call checks the arguments and the directory,
 * copies the state it saves into host memory of its own (one more copy of
 * this rank's master weights and optimizer states) and returns; a thread of
 * the library writes and commits the file while training goes on. The next
 * save, load, dsm_engine_checkpoint_wait() or dsm_engine_free() waits for it,
 * and its failure is returned by the first of these calls or by the first
 * dsm_step() after it ended (every rank alike, naming the checkpoint);
 * `latest` moves only when the file is complete. Below MPI_THREAD_MULTIPLE
 * the save is synchronous (a WARN says so once). While a save runs in the
 * background the application must not call HDF5 itself unless HDF5 is
 * thread-safe. With checkpoint.keep_last N > 0, a successful save then
 * removes the complete checkpoints of the directory beyond the N newest,
 * never the one `latest` names (doc/checkpoint.md).
 *
 * @p dir must name one directory that every rank sees: a
 * node-local directory or a different path on some ranks is DSM_ERR_IO on
 * every rank naming the rank and host. A file system without room for the
 * file is DSM_ERR_IO before anything is written. Temporaries of earlier
 * saves that were killed are removed.
 *
 * @param engine       the engine
 * @param dir          the checkpoint directory, created if missing
 * @param tag          the tag (1..200 characters of A-Z a-z 0-9 . _ -, not
 *                     starting with '.'), or NULL: "global_step<N>" with N
 *                     the global step count. Ranks passing different tags:
 *                     see checkpoint.tag_validation; rank 0's tag is used.
 * @param client_state bytes stored with the checkpoint and given back by
 *                     the load (rank 0's are stored); NULL when @p size is 0
 * @param size         bytes of @p client_state
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT (a
 * bad tag or directory); DSM_ERR_STATE (between boundaries, or a buffer
 * acquired); DSM_ERR_MISMATCH (tags differ and tag_validation is Fail);
 * DSM_ERR_IO; DSM_ERR_HDF5; DSM_ERR_NOT_SUPPORTED (built without HDF5);
 * DSM_ERR_MPI. Every rank returns the same status. A save that failed on
 * every rank leaves the engine usable; DSM_ERR_MISMATCH because the ranks
 * are in different engine calls (one saves while another steps) leaves the
 * engine failed on every rank: only dsm_engine_free(), then local, is left.
 */
DSM_API dsm_status_t dsm_engine_save_checkpoint(dsm_engine_t engine, const char *dir, const char *tag,
                                                const void *client_state, size_t size);

/**
 * @brief Load a checkpoint saved by dsm_engine_save_checkpoint() at any
 * data-parallel size, sequence-parallel size and ZeRO stage: each rank reads
 * the part it owns now.
 *
 * Collective over the engine's ranks, at an accumulation boundary with every
 * buffer released. The file's parameters must be exactly the engine's (names
 * and shapes); every tensor's checksum is verified. On any error every rank
 * returns it and the engine is unchanged. Loading at the sizes it was saved
 * at continues fp32 training bit for bit. Any gradient_accumulation_steps
 * may load it: the step counters, loss scaler and LR schedule count
 * optimizer steps and are restored as saved; at an accumulation other than
 * the file's, the micro-step counter becomes global_steps x the engine's,
 * so that the next accumulation window is whole.
 *
 * @param engine  the engine
 * @param dir     the checkpoint directory
 * @param tag     the tag, or NULL: the one DIR/latest names
 * @param flags   0 or DSM_CKPT_LOAD_MODULE_ONLY, DSM_CKPT_LOAD_NO_OPTIMIZER,
 *                DSM_CKPT_LOAD_NO_LR_SCHEDULE, DSM_CKPT_LOAD_NON_STRICT,
 *                DSM_CKPT_LOAD_FALLBACK or'ed
 * @param[out] client_state the stored client bytes, to free with dsm_free()
 *                (NULL when none were stored); may be NULL to ignore them
 * @param[out] size their count; may be NULL
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT (bad
 * tag or flags); DSM_ERR_STATE; DSM_ERR_IO (missing file or `latest`, not
 * HDF5, truncated, wrong format or version, checksum mismatch);
 * DSM_ERR_MISMATCH (tensors that differ from the engine's parameters, all
 * listed, the message saying what differs; a file saved off an accumulation
 * boundary, loaded at another accumulation: naming both); DSM_ERR_HDF5;
 * DSM_ERR_NOT_SUPPORTED; DSM_ERR_OUT_OF_MEMORY; DSM_ERR_MPI. Every rank
 * returns the same status. DSM_ERR_MISMATCH because the ranks are in
 * different engine calls (one loads while another steps) leaves the engine
 * failed on every rank: only dsm_engine_free(), then local, is left. An
 * asynchronous save still writing is waited for first; if it failed, its
 * failure is returned and nothing is loaded (call again to load). With
 * DSM_CKPT_LOAD_FALLBACK, DSM_ERR_IO when no checkpoint of the directory
 * verifies, naming each one tried and why; DSM_ERR_MISMATCH is never skipped.
 */
DSM_API dsm_status_t dsm_engine_load_checkpoint(dsm_engine_t engine, const char *dir, const char *tag,
                                                unsigned flags, void **client_state, size_t *size);

/**
 * @brief Resume from a checkpoint directory if it holds one: load the
 * checkpoint DIR/latest names, or report that there is nothing to resume.
 *
 * What every restartable program does at its start, in one call: the first
 * run finds no checkpoint and starts from the beginning; a restart continues
 * from the newest one. Rank 0 looks for DIR/latest and every rank takes its
 * answer. When DIR or DIR/latest does not exist, @p *resumed is 0, nothing
 * is loaded and the status is DSM_SUCCESS. Otherwise @p *resumed is 1 and
 * the call is dsm_engine_load_checkpoint(@p engine, @p dir, NULL, @p flags,
 * ...): any error of the load (a `latest` naming a missing or corrupt file,
 * a model that differs) is returned as that call returns it, on every rank.
 *
 * Collective over the engine's ranks, at an accumulation boundary with every
 * buffer released.
 * @param engine the engine
 * @param dir    the checkpoint directory (need not exist)
 * @param flags  as dsm_engine_load_checkpoint()
 * @param[out] resumed 1 when a checkpoint was loaded, 0 when there was
 *               nothing to resume (not NULL)
 * @param[out] client_state as dsm_engine_load_checkpoint(); NULL when nothing
 *               was resumed; may be NULL
 * @param[out] size as dsm_engine_load_checkpoint(); 0 when nothing was
 *               resumed; may be NULL
 * @return DSM_SUCCESS (also when there is nothing to resume);
 * DSM_ERR_NULL_POINTER (engine, dir, resumed); DSM_ERR_INVALID_ARGUMENT (an
 * empty dir, unknown flags); DSM_ERR_IO (DIR/latest cannot be looked at, or
 * the load's); the other statuses of dsm_engine_load_checkpoint(). Every
 * rank returns the same status and the same @p *resumed.
 */
DSM_API dsm_status_t dsm_engine_resume(dsm_engine_t engine, const char *dir, unsigned flags, int *resumed,
                                       void **client_state, size_t *size);

/**
 * @brief Initialize the engine's parameters, by tensor name, from a
 * checkpoint file or a safetensors file.
 *
 * The file is a checkpoint file written by dsm_engine_save_checkpoint()
 * (`DIR/TAG.h5`, saved at any rank count and ZeRO stage; its /params only)
 * or a safetensors file (F32, BF16 or F16 tensors, such as `dsm-ckpt
 * export` and Hugging Face write).
 *
 * Collective over the engine's ranks, at an accumulation boundary with every
 * buffer released. The kind of file is told by its bytes (the HDF5
 * signature, at byte 0 or after a user block; else safetensors). Every rank reads its own part of each
 * parameter (its ZeRO partition; frozen parameters whole); values become
 * the fp32 master weights exactly (BF16 and F16 widened exactly) and the
 * compute parameters are republished from them (rounded to nearest even
 * for fp16/bf16 compute). Only the parameters change: the optimizer state,
 * the step counters, the loss scaler and the LR schedule stay as they are
 * (fresh after dsm_engine_init()), and the gradients are cleared. A
 * checkpoint's checksums are verified; a safetensors file is validated
 * whole (header length against the file, JSON, every entry's dtype, shape
 * and data offsets) before any value is read. On any error every rank
 * returns it and the engine is unchanged.
 *
 * Strict by default: every parameter of the engine (trainable and frozen)
 * must be in the file with the same shape and the file must hold no other
 * tensor; the error names each difference (the tensor and both shapes).
 * With DSM_CKPT_LOAD_NON_STRICT the tensors that match by name and shape
 * are loaded, the other parameters keep their values, and
 * dsm_engine_load_report() lists what is missing, unexpected and of another
 * shape (a WARN too); its "weights" names the file.
 *
 * @param engine the engine
 * @param path   the checkpoint .h5 file or the .safetensors file; every
 *               rank must see the same file
 * @param flags  0 or DSM_CKPT_LOAD_NON_STRICT
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT (an
 * empty path, a directory, unknown flags); DSM_ERR_STATE; DSM_ERR_IO (a
 * missing or unreadable file, a truncated or corrupt file, an unknown
 * dtype, a checksum mismatch, ranks seeing different files);
 * DSM_ERR_MISMATCH (parameters missing, unexpected or of another shape,
 * all listed); DSM_ERR_NOT_SUPPORTED (a parameter stored in a dtype other
 * than F32, BF16 and F16, or libdsm built without HDF5); DSM_ERR_HDF5;
 * DSM_ERR_OUT_OF_MEMORY; DSM_ERR_MPI. Every rank returns the same status.
 */
DSM_API dsm_status_t dsm_engine_load_weights(dsm_engine_t engine, const char *path, unsigned flags);

/**
 * @brief Wait for the asynchronous checkpoint save (checkpoint.writer.
 * decoupled) to be written and committed, and return its outcome.
 *
 * Collective over the engine's ranks, anywhere between engine calls (no
 * accumulation boundary needed). Returns at once when no save is running.
 * After DSM_SUCCESS the checkpoint is complete on disk and `latest` names it.
 * A failure is reported once (by this call, or by the engine call that
 * reported it first) and leaves the engine usable.
 *
 * @param engine the engine
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_STATE (a failed
 * engine); DSM_ERR_MISMATCH (the ranks are in different engine calls); the
 * failure of the save: DSM_ERR_IO, DSM_ERR_HDF5, DSM_ERR_OUT_OF_MEMORY or
 * DSM_ERR_MPI with a message naming the checkpoint file. Every rank returns
 * the same status.
 */
DSM_API dsm_status_t dsm_engine_checkpoint_wait(dsm_engine_t engine);

/**
 * @brief What the last successful dsm_engine_load_checkpoint() or
 * dsm_engine_load_weights() did: the
 * checkpoint it loaded, those it skipped (DSM_CKPT_LOAD_FALLBACK) and why,
 * and with DSM_CKPT_LOAD_NON_STRICT the tensors missing from the file, the
 * tensors of the file the engine lacks, and those of another shape.
 *
 * Not collective (every rank holds the same report). The JSON form:
 * `{"loaded", "dir", "tag", "weights", "skipped": [{"tag", "reason"}], "missing",
 * "unexpected", "mismatched"}` (doc/checkpoint.md; "weights" is the file of
 * dsm_engine_load_weights(), "" after a checkpoint load); before any load,
 * "loaded" is false. Free the text with dsm_free().
 * @return DSM_SUCCESS; DSM_ERR_NULL_POINTER; DSM_ERR_INVALID_ARGUMENT for an
 * unknown format; DSM_ERR_OUT_OF_MEMORY.
 */
DSM_API dsm_status_t dsm_engine_load_report(dsm_engine_t engine, dsm_format_t format, char **text);

/** @} */

#ifdef __cplusplus
}
#endif

#endif /* DSM_CHECKPOINT_H */
