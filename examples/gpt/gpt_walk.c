/*
 * gpt_walk.c: the model walk of gpt_walk.h: acquire, compute, release, in
 * the same order on every rank and on both compute paths.
 */
#include "gpt_walk.h"

#include <stdlib.h>
#include <string.h>

dsm_status_t gpt_walk_init(gpt_walk *walk, dsm_engine_t engine, const GPTConfig *c) {
    memset(walk, 0, sizeof *walk);
    walk->engine = engine, walk->c = *c, walk->np = gpt_num_params(c);
    dsm_status_t st = dsm_engine_dtype(engine, &walk->dtype);
    if (st != DSM_SUCCESS) return st;
    const size_t n = (size_t)walk->np;
    walk->w = calloc(n, sizeof *walk->w), walk->g = calloc(n, sizeof *walk->g);
    walk->wstage = calloc(n, sizeof *walk->wstage), walk->gstage = calloc(n, sizeof *walk->gstage);
    if (!walk->w || !walk->g || !walk->wstage || !walk->gstage) return DSM_ERR_OUT_OF_MEMORY;
    return DSM_SUCCESS;
}

void gpt_walk_free(gpt_walk *walk) {
    free(walk->w), free(walk->g), free(walk->wstage), free(walk->gstage);
    walk->w = NULL, walk->g = NULL, walk->wstage = NULL, walk->gstage = NULL;
}

/* Acquire parameters: the engine's memory, or a converted fp32 copy where
 * the path stages them. Collective under ZeRO-3. */
static dsm_status_t params_acquire(gpt_walk *k, const int *idx, int n) {
    for (int i = 0; i < n; ++i) {
        const int p = idx[i];
        const void *values;
        dsm_status_t st = DSM_TIMED(&k->dsm, dsm_engine_param_acquire(k->engine, p, &values));
        if (st != DSM_SUCCESS) return st;
        if (!k->wstage[p]) {
            k->w[p] = values;
            continue;
        }
        k->w[p] = k->wstage[p];
        st = DSM_TIMED(&k->dsm, dsm_convert(values, k->dtype, k->wstage[p], DSM_FLOAT32,
                                            (size_t)gpt_param_numel(&k->c, p)));
        if (st != DSM_SUCCESS) return st;
    }
    return DSM_SUCCESS;
}

static dsm_status_t params_release(gpt_walk *k, const int *idx, int n) {
    for (int i = 0; i < n; ++i) {
        dsm_status_t st = DSM_TIMED(&k->dsm, dsm_engine_param_release(k->engine, idx[i]));
        if (st != DSM_SUCCESS) return st;
        k->w[idx[i]] = NULL;
    }
    return DSM_SUCCESS;
}

/* Open gradients to add into: the engine's buffers (under ZeRO-0/1 they hold
 * the window's sum so far; the backward adds), or zeroed staged copies. */
static dsm_status_t grads_open(gpt_walk *k, const int *idx, int n) {
    for (int i = 0; i < n; ++i) {
        const int p = idx[i];
        if (k->gstage[p]) {
            k->g[p] = k->gstage[p];
            memset(k->g[p], 0, (size_t)gpt_param_numel(&k->c, p) * sizeof(float));
            continue;
        }
        dsm_status_t st = DSM_TIMED(&k->dsm, dsm_engine_grad_acquire(k->engine, p, &k->g[p]));
        if (st != DSM_SUCCESS) return st;
    }
    return DSM_SUCCESS;
}

/* Hand the gradients back; under ZeRO-2/3 a full bucket is reduced here. */
static dsm_status_t grads_close(gpt_walk *k, const int *idx, int n) {
    for (int i = 0; i < n; ++i) {
        const int p = idx[i];
        dsm_status_t st = k->gstage[p] ? DSM_TIMED(&k->dsm, dsm_engine_grad_add_f32(k->engine, p, k->gstage[p],
                                                                                    gpt_param_numel(&k->c, p)))
                                       : DSM_TIMED(&k->dsm, dsm_engine_grad_release(k->engine, p));
        if (st != DSM_SUCCESS) return st;
        k->g[p] = NULL;
    }
    return DSM_SUCCESS;
}

static void block_indices(int l, int idx[NUM_LAYER_PARAMS]) {
    for (int k = 0; k < NUM_LAYER_PARAMS; ++k) idx[k] = gpt_layer_param(l, k);
}

/* The forward pass: each stage's parameters acquired together before it and
 * released after it. */
dsm_status_t gpt_walk_forward(gpt_walk *k) {
    const void *const *w = k->w;
    dsm_status_t st;
    const int emb[2] = {gpt_wte(), gpt_wpe()};
    if ((st = params_acquire(k, emb, 2)) || (st = k->ops->encoder_forward(k->ctx, w)) ||
        (st = params_release(k, emb, 2)))
        return st;
    for (int l = 0; l < k->c.num_layers; ++l) {
        int idx[NUM_LAYER_PARAMS];
        block_indices(l, idx);
        if ((st = params_acquire(k, idx, NUM_LAYER_PARAMS)) || (st = k->ops->block_forward(k->ctx, l, w)) ||
            (st = params_release(k, idx, NUM_LAYER_PARAMS)))
            return st;
    }
    const int head[3] = {gpt_lnf_w(&k->c), gpt_lnf_b(&k->c), gpt_wte()};
    if ((st = params_acquire(k, head, 3)) || (st = k->ops->head_forward(k->ctx, w))) return st;
    return params_release(k, head, 3);
}

/* The backward pass. wte's gradient collects the LM head's and the
 * embedding's: it is open over the whole pass, with wpe's. Each block
 * acquires its parameters again, adds its gradients and hands them back. */
dsm_status_t gpt_walk_backward(gpt_walk *k) {
    const void *const *w = k->w;
    void *const *g = k->g;
    dsm_status_t st;
    const int emb[2] = {gpt_wte(), gpt_wpe()};
    const int head[3] = {gpt_lnf_w(&k->c), gpt_lnf_b(&k->c), gpt_wte()};
    if ((st = grads_open(k, emb, 2)) || (st = params_acquire(k, head, 3)) || (st = grads_open(k, head, 2)) ||
        (st = k->ops->head_backward(k->ctx, w, g)) || (st = params_release(k, head, 3)) ||
        (st = grads_close(k, head, 2)))
        return st;
    for (int l = k->c.num_layers - 1; l >= 0; --l) {
        int idx[NUM_LAYER_PARAMS];
        block_indices(l, idx);
        if ((st = params_acquire(k, idx, NUM_LAYER_PARAMS)) || (st = grads_open(k, idx, NUM_LAYER_PARAMS)) ||
            (st = k->ops->block_backward(k->ctx, l, w, g)) || (st = params_release(k, idx, NUM_LAYER_PARAMS)) ||
            (st = grads_close(k, idx, NUM_LAYER_PARAMS)))
            return st;
    }
    if ((st = k->ops->encoder_backward(k->ctx, g))) return st;
    return grads_close(k, emb, 2);
}
