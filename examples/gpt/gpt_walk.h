/*
 * gpt_walk.h: the one walk over the model that both compute paths of
 * train_gpt take (the host's gpt_model.c, CUDA's gpt_device.c).
 *
 * The walk owns what libdsm sees: which parameters are acquired and
 * released around which operation, which gradients are opened and handed
 * back, in which order, on every rank alike (collective under ZeRO-3). The
 * operations themselves come from a table (struct gpt_ops) that each path
 * fills with its own math: OpenMP + CBLAS on fp32, or the bf16 CUDA kernels.
 *
 *   forward:  [wte wpe] encoder | block 0 .. L-1 (12 parameters each) | [ln_f wte] head
 *   backward: open the embeddings' gradients | head | block L-1 .. 0 | encoder, hand them back
 *
 * Each block is gathered twice (forward and backward), as DeepSpeed's
 * ZeRO-3 does. The walk also keeps the time spent inside libdsm calls.
 */
#ifndef GPT_WALK_H
#define GPT_WALK_H

#include <mpi.h>

#include "dsm.h"
#include "gpt.h"

/* ------------------------------------------------------------ time in libdsm */

/* Seconds spent inside libdsm calls: DSM_TIMED(&sw, call) evaluates the call,
 * adds its duration to sw.total and yields its status (one thread calls). */
typedef struct {
    double total, t0;
} gpt_stopwatch;
static inline int gpt_tic(gpt_stopwatch *s) { return s->t0 = MPI_Wtime(), 0; }
static inline dsm_status_t gpt_toc(gpt_stopwatch *s, dsm_status_t st) {
    s->total += MPI_Wtime() - s->t0;
    return st;
}
#define DSM_TIMED(sw, call) (gpt_tic(sw), gpt_toc((sw), (call)))

/* ------------------------------------------------------------ the operations */

/*
 * One path's operations. w[i] and g[i] are indexed by engine parameter
 * index (gpt_wte(), gpt_layer_param(l, k), ...) and valid for the
 * parameters the walk holds at that point: fp32 on the host, bf16 on the
 * GPU. ctx is the path's own state. A non-success status ends the walk.
 */
struct gpt_ops {
    dsm_status_t (*encoder_forward)(void *ctx, const void *const *w);
    dsm_status_t (*block_forward)(void *ctx, int l, const void *const *w);
    dsm_status_t (*head_forward)(void *ctx, const void *const *w); /* ln_f, LM head, loss */
    dsm_status_t (*head_backward)(void *ctx, const void *const *w, void *const *g);
    dsm_status_t (*block_backward)(void *ctx, int l, const void *const *w, void *const *g);
    dsm_status_t (*encoder_backward)(void *ctx, void *const *g); /* into g[wte], g[wpe] */
};

/* ------------------------------------------------------------ the walk */

typedef struct {
    dsm_engine_t engine;
    GPTConfig c;
    dsm_dtype_t dtype; /* the engine's compute dtype */
    int np;
    const struct gpt_ops *ops;
    void *ctx;
    const void **w; /* while acquired: the engine's values, or their staged copy */
    void **g;       /* while open: the engine's buffer, or its staged copy */
    /* Staging, per parameter (NULL: none): wstage[i] receives the values
     * converted to fp32 at each acquire; gstage[i] is zeroed at each open and
     * added to the engine's gradient with dsm_engine_grad_add_f32() at close. */
    float **wstage, **gstage;
    gpt_stopwatch dsm; /* time in libdsm calls */
} gpt_walk;

/* A walk over engine's parameters for config c, with no staging. */
dsm_status_t gpt_walk_init(gpt_walk *walk, dsm_engine_t engine, const GPTConfig *c);
void gpt_walk_free(gpt_walk *walk);

/* The forward and the backward pass of one micro-batch (the path's ctx holds
 * the batch and, after the forward, the loss). */
dsm_status_t gpt_walk_forward(gpt_walk *walk);
dsm_status_t gpt_walk_backward(gpt_walk *walk);

#endif /* GPT_WALK_H */
