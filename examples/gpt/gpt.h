/*
 * gpt.h: the GPT-2 model of examples/gpt, host compute (OpenMP + CBLAS).
 *
 * The shapes and names are those of the GPT-2 checkpoints (Hugging Face
 * `GPT2Model`): linear layers are Conv1D, weight [in, out], y = x W + b; the
 * LM head is tied to wte. Every operation has a forward and, right under it
 * in gpt_ops.c, its backward; backwards ADD into the gradients they are given
 * (the engine's buffers accumulate over micro-steps), except where said.
 */
#ifndef GPT_H
#define GPT_H

#include <stddef.h>
#include <stdint.h>

/* ------------------------------------------------------------ configuration */

typedef struct {
    int max_seq_len;       /* T: context length (positions of wpe) */
    int vocab_size;        /* V: real vocabulary (the softmax's size) */
    int padded_vocab_size; /* Vp: rows of wte, V rounded up to a multiple of 64 */
    int num_layers;        /* L */
    int num_heads;         /* NH */
    int channels;          /* C: width; C % NH == 0 */
} GPTConfig;

/* ------------------------------------------------------------ parameters */

/* The parameters of one block, in the order of the engine's list. */
enum {
    LN1_W, LN1_B, QKV_W, QKV_B, ATTPROJ_W, ATTPROJ_B,
    LN2_W, LN2_B, FC_W, FC_B, FCPROJ_W, FCPROJ_B, NUM_LAYER_PARAMS
};
extern const char *const gpt_layer_param_names[NUM_LAYER_PARAMS]; /* "ln_1.weight", ... */

/* Engine index of each parameter: wte, wpe, the blocks, ln_f. */
static inline int gpt_wte(void) { return 0; }
static inline int gpt_wpe(void) { return 1; }
static inline int gpt_layer_param(int l, int k) { return 2 + l * NUM_LAYER_PARAMS + k; }
static inline int gpt_lnf_w(const GPTConfig *c) { return 2 + c->num_layers * NUM_LAYER_PARAMS; }
static inline int gpt_lnf_b(const GPTConfig *c) { return 3 + c->num_layers * NUM_LAYER_PARAMS; }
static inline int gpt_num_params(const GPTConfig *c) { return 4 + c->num_layers * NUM_LAYER_PARAMS; }

/* Name ("h.3.attn.c_attn.weight"), number of dims and shape of parameter i. */
void gpt_param_info(const GPTConfig *c, int i, char *name, size_t name_len, int *ndims, int64_t shape[2]);
int64_t gpt_param_numel(const GPTConfig *c, int i);
int64_t gpt_total_params(const GPTConfig *c);

/* ------------------------------------------------------------ operations */

/* out[n] = wte[tok[n]] + wpe[pos[n]]; N tokens. */
void encoder_forward(float *out, const int64_t *tok, const int64_t *pos, const float *wte,
                     const float *wpe, int N, int C);
void encoder_backward(float *dwte, float *dwpe, const float *dout, const int64_t *tok,
                      const int64_t *pos, int N, int C);

/* LayerNorm over C channels, eps 1e-5; keeps mean and rstd for backward. */
void layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
                       const float *b, int N, int C);
void layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                        const float *w, const float *mean, const float *rstd, int N, int C);

/* out[N, OC] = inp[N, C] w[C, OC] + b[OC] (b may be NULL). */
void matmul_forward(float *out, const float *inp, const float *w, const float *b, int N, int C, int OC);
void matmul_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                     const float *w, int N, int C, int OC);

/*
 * Causal attention on head-sharded tensors: B sequences of T tokens, NH heads
 * of hs channels. q, k, v and out address element (b, t, h, e) at
 * [(b * T + t) * stride + h * hs + e]: stride 3C on the fused qkv of one rank,
 * NH * hs on separate tensors. att [B, NH, T, T] keeps the probabilities.
 * The backward overwrites dq, dk, dv (same strides as q, k, v).
 */
void attention_forward(float *out, int ostride, float *att, const float *q, const float *k,
                       const float *v, int stride, int B, int T, int NH, int hs);
void attention_backward(float *dq, float *dk, float *dv, int stride, const float *dout, int ostride,
                        const float *att, const float *q, const float *k, const float *v, int B,
                        int T, int NH, int hs);

/* GELU, tanh approximation (GPT-2's "gelu_new"). */
void gelu_forward(float *out, const float *inp, int N);
void gelu_backward(float *dinp, const float *inp, const float *dout, int N);

/* out = a + b. Its backward is dout added to both inputs' gradients. */
void residual_forward(float *out, const float *a, const float *b, int N);
void residual_backward(float *da, float *db, const float *dout, int N);

/*
 * The LM head and cross-entropy fused: logits[N, Vp] = x[N, C] wte^T, softmax
 * over the first V columns, in place (logits become probabilities). Returns
 * the sum of -log p(label) over tokens whose label is not -100, and their
 * number in *count.
 */
double classifier_forward(float *logits, const float *x, const float *wte, const int64_t *labels,
                          int N, int C, int V, int Vp, int64_t *count);
/* dlogits = (probs - onehot(label)) * dloss for counted tokens, 0 elsewhere
 * (in place over the probabilities); then dx (overwritten) and dwte (added). */
void classifier_backward(float *dx, float *dwte, float *probs, const float *x, const float *wte,
                         const int64_t *labels, float dloss, int N, int C, int V, int Vp);

#endif /* GPT_H */
