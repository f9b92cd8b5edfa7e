/*
 * gpt_model.h: the host path of train_gpt: the model's activations on this
 * rank, its operations (gpt.h's forward and backward functions, Ulysses
 * sequence parallelism around attention) in the table the walk takes
 * (gpt_walk.h), sampling, and the gradient dump the PyTorch comparison reads.
 */
#ifndef GPT_MODEL_H
#define GPT_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "dsm.h"
#include "gpt.h"
#include "gpt_walk.h"

/* Activations of one block, kept from forward for backward. */
struct layer_acts {
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *att, *attproj, *res2;
    float *ln2, *ln2_mean, *ln2_rstd, *fch, *fch_gelu, *fcproj, *res3;
    float *qh, *kh, *vh; /* head-sharded q, k, v (sequence parallelism only) */
};

struct gpt_model {
    GPTConfig c;
    gpt_walk walk;  /* the engine, the parameters while held, the time in libdsm */
    dsm_sp_t sp;    /* NULL without a sequence_parallel dimension */
    int P, sp_rank; /* sequence-parallel size and rank */
    int B, T, Tl;   /* sequences per micro-batch, tokens per sequence, per rank */
    int N;          /* B * Tl: this rank's tokens */
    int Hp, hf;     /* this rank's heads (all at P = 1) and the first */
    int64_t *tok, *pos, *lab, *seqs, *idx; /* the micro-batch (idx, seqs: whole sequences) */
    double loss_sum;                       /* after a forward: this rank's token losses */
    int64_t count;                         /* and their number */
    float dloss;                           /* for the backward: d(objective) / d(loss_sum) */
    float *dwte, *dwpe;                    /* the embeddings' gradients over the whole backward */
    float *encoded, *lnf, *lnf_mean, *lnf_rstd, *logits;
    struct layer_acts *la;
    /* gradients of activations, reused by every block */
    float *dres, *dln, *dqkv, *datty, *dfch, *dfch_gelu, *dlnf;
    /* sequence parallelism: all-to-all inputs (dsm_sp_alloc) and outputs */
    float *qs, *ks, *vs, *oh, *spd, *dqh, *dkh, *dvh; /* inputs */
    float *doh, *dqs, *dks, *dvs;                      /* outputs */
};

/* Everything the passes need, once m->c, walk, sp, P, sp_rank, B, T, Tl, N,
 * Hp and hf are set: the batch buffers always, the activations and the
 * operations' table when host_compute (else the device path has its own).
 * Allocation failures clear *ok (for the ranks to agree on); the all-to-all
 * inputs come from dsm_sp_alloc(), collective, whose status is returned. */
dsm_status_t gpt_model_alloc(struct gpt_model *m, int host_compute, int *ok);
void gpt_model_free(struct gpt_model *m);

/* The forward pass of the micro-batch in m->tok, m->pos, m->lab: the sum of
 * this rank's token losses in *loss_sum, their number in *count. */
dsm_status_t gpt_model_forward(struct gpt_model *m, double *loss_sum, int64_t *count);
/* The backward pass of dloss x (this rank's loss sum): every gradient added. */
dsm_status_t gpt_model_backward(struct gpt_model *m, float dloss);

/* n tokens generated after the prompt's bytes into out (n + 1 bytes), at the
 * temperature, from stream `seed` of counter_rng.h: every rank draws the same
 * tokens (collective under ZeRO-3). P = 1. */
dsm_status_t gpt_generate(struct gpt_model *m, const char *prompt, long n, double temperature, uint64_t seed,
                          char *out);

/* Every parameter's gradient (fp32) and the loss, to a safetensors file. */
dsm_status_t gpt_dump_grads(struct gpt_model *m, const char *path, double loss, char *msg, size_t msg_len);

#endif /* GPT_MODEL_H */
