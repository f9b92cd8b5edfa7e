/*
 * The CUDA path of the GPT example: one kernel (or cuBLAS/cuBLASLt call)
 * per operation, each forward beside its backward, callable from C.
 *
 * Data types
 *   - Activations, parameters and activation gradients: bf16
 *     (__nv_bfloat16, passed as void *). Arithmetic inside every kernel is
 *     fp32; cuBLAS/cuBLASLt products use CUBLAS_COMPUTE_32F.
 *   - Parameter gradients: the dtype the engine hands out
 *     (dsm_engine_grad_acquire() gives the compute dtype: bf16 with
 *     "bf16": {"enabled": true}, fp32 without): every backward that
 *     produces a parameter gradient takes a gpt_grad_dtype_t and ADDS
 *     (+=) into that buffer, as the engine's accumulation wants. Each
 *     addition sums its terms in fp32 and rounds once into the buffer
 *     (cuBLASLt is held to split-K plans that reduce in fp32).
 *   - LayerNorm statistics (mean, rstd) and per-token losses: fp32.
 *   - Tokens, positions and labels: int64_t, as the host path (gpt.h).
 *
 * The functions mirror the host path's (../gpt.h) one for one: its
 * arguments in its order, with the context first and, where they apply,
 * the gradient dtype, the weight layout and the attention scratch added;
 * and its rule: a backward ADDS
 * (+=) into every gradient it is given, activation gradients included,
 * except attention_backward, which overwrites dq, dk, dv. The host path's
 * classifier_forward/backward (LM head + loss) is here
 * gpt_matmul_forward(logits, x, wte, GPT_W_OUT_IN) + gpt_fused_classifier
 * + gpt_matmul_backward(dx, dwte, ..., wte, GPT_W_OUT_IN), which adds into
 * dx (zero it first where the host path overwrites it). Sizes: N = B T.
 *
 * Layouts (all row-major, C order)
 *   activations       (B, T, C) = (N, C) with N = B T tokens; qkv (B, T, 3C)
 *                     with q | k | v, each C wide and split into NH heads
 *                     of hs = C / NH (attention takes q, k, v pointers and
 *                     a row stride: 3C on a fused qkv, NH hs on separate
 *                     tensors such as Ulysses' head shards)
 *   wte               (Vp, C)   token embedding, also the LM head (tied)
 *   wpe               (maxT, C) position embedding
 *   ln*.weight/bias   (C)
 *   Linear weights    either layout, chosen per call (gpt_wlayout_t):
 *     GPT_W_IN_OUT    (IC, OC): GPT-2 checkpoints' Conv1D (c_attn, c_proj,
 *                     c_fc of the Hugging Face files, and of the example's
 *                     parameters: gpt.h), y = x W + b
 *     GPT_W_OUT_IN    (OC, IC): torch.nn.Linear, and wte as the LM head,
 *                     y = x W^T + b
 *   biases            (OC)
 *   logits            (B*T, Vp); columns V..Vp-1 are padding
 *
 * Every function enqueues its work on the context's stream and returns
 * without waiting (encoder_backward: see its comment).
 * Pointers are device pointers unless named *_host. Return value: 0 on
 * success, else -1 with a message in gpt_cuda_error() (a CUDA or cuBLAS
 * error, or a bad argument, named with its value; a NULL context gives -1
 * alone). Not thread safe per context: one context per host thread.
 */
#ifndef GPT_KERNELS_H
#define GPT_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Opaque: cuBLAS and cuBLASLt handles, their workspace, the stream, and
 *  the scratch that encoder_backward reuses. */
typedef struct gpt_cuda_s *gpt_cuda_t;

/** dtype of the parameter-gradient buffers the backwards add into. */
typedef enum { GPT_GRAD_BF16 = 0, GPT_GRAD_F32 = 1 } gpt_grad_dtype_t;

/** Layout of a Linear weight (see the top of this file). */
typedef enum { GPT_W_OUT_IN = 0, GPT_W_IN_OUT = 1 } gpt_wlayout_t;

/** Creates a context on the current CUDA device. @p stream is a
 *  cudaStream_t (NULL: the legacy default stream); the kernels, cuBLAS and
 *  cuBLASLt run on it, so passing the stream given to
 *  dsm_engine_set_stream() orders them with the engine's work. */
int gpt_cuda_create(void *stream, gpt_cuda_t *ctx);
/** Frees the context and sets *ctx to NULL (NULL is accepted). */
void gpt_cuda_free(gpt_cuda_t *ctx);
/** Changes the stream of the context (and of its cuBLAS handles). The
 *  context's scratch (cuBLAS workspace, partial sums) is reused by every
 *  call: work still pending on the old stream must be ordered before the
 *  new stream's (an event, or a synchronization). */
int gpt_cuda_set_stream(gpt_cuda_t ctx, void *stream);
/** The last error message of this context (never NULL; "" when none).
 *  With ctx == NULL: the last error of gpt_cuda_create(). */
const char *gpt_cuda_error(gpt_cuda_t ctx);

/* ---------------------------------------------------------------- encoder */

/** out[n] = wte[tok[n]] + wpe[pos[n]] for the N tokens (tok, pos: int64_t
 *  on the device; ids must be < Vp and positions < maxT: not checked on
 *  the device, they are by the backward on the host). */
int gpt_encoder_forward(gpt_cuda_t ctx, void *out, const int64_t *tok, const int64_t *pos,
                        const void *wte, const void *wpe, int N, int C);
/** dwte[tok[n]] += dout[n]; dwpe[pos[n]] += dout[n] (either may be NULL to
 *  skip it). @p tok_host, @p pos_host: the same tokens and positions in
 *  host memory: the rows are grouped by id on the host (a sort of N ids)
 *  and the grouping is copied to the device through the context's
 *  page-locked staging (the call waits only for the previous call's copy),
 *  so that each row of dwte and dwpe is summed in a fixed order, in fp32,
 *  and rounded once (deterministic). Vp, maxT: rows of dwte and dwpe (an id outside them is
 *  an error naming it, before anything is written). */
int gpt_encoder_backward(gpt_cuda_t ctx, void *dwte, void *dwpe, gpt_grad_dtype_t gdt,
                         const void *dout, const int64_t *tok_host, const int64_t *pos_host,
                         int N, int C, int Vp, int maxT);

/* -------------------------------------------------------------- layernorm */

/** out = (inp - mean) * rstd * weight + bias over the last dimension
 *  (eps 1e-5), N rows of C; saves mean and rstd (fp32, N each; either
 *  may be NULL when no backward follows). */
int gpt_layernorm_forward(gpt_cuda_t ctx, void *out, float *mean, float *rstd,
                          const void *inp, const void *weight, const void *bias, int N, int C);
/** dinp += d/dinp, dweight += sum_rows dout * xhat, dbias += sum_rows dout
 *  (dinp is the residual stream's gradient: it ADDS). Needs the mean and
 *  rstd saved by the forward. */
int gpt_layernorm_backward(gpt_cuda_t ctx, void *dinp, void *dweight, void *dbias,
                           gpt_grad_dtype_t gdt, const void *dout, const void *inp,
                           const void *weight, const float *mean, const float *rstd, int N, int C);

/* ----------------------------------------------------------------- matmul */

/** out(N,OC) = inp(N,IC) W + bias (bias may be NULL), through cuBLASLt
 *  with the bias fused in its epilogue (a bias not 16-byte aligned is
 *  added by a kernel after; matrices of any alignment are accepted:
 *  cuBLASLt is told theirs, and cuBLAS's GEMM takes those it refuses). */
int gpt_matmul_forward(gpt_cuda_t ctx, void *out, const void *inp, const void *weight,
                       gpt_wlayout_t wl, const void *bias, int N, int IC, int OC);
/** dinp(N,IC) += dout W^T (NULL to skip), dweight += the weight's
 *  gradient in the weight's own layout (NULL to skip), dbias += sum_rows
 *  dout (NULL to skip). */
int gpt_matmul_backward(gpt_cuda_t ctx, void *dinp, void *dweight, void *dbias,
                        gpt_grad_dtype_t gdt, const void *dout, const void *inp,
                        const void *weight, gpt_wlayout_t wl, int N, int IC, int OC);

/* -------------------------------------------------------------- attention */

/** Bytes of device scratch gpt_attention_forward/backward need (one
 *  buffer, shared by every layer; the caller allocates it). */
size_t gpt_attention_scratch_bytes(int B, int T, int NH, int hs);
/** Causal multi-head self-attention on B sequences of T tokens, NH heads
 *  of hs channels: q, k, v and out address element (b, t, h, e) at
 *  [(b T + t) stride + h hs + e] (out with ostride). Saves att (B,NH,T,T,
 *  bf16: the probabilities, zeros above the diagonal) for the backward.
 *  Scores are scaled by 1/sqrt(hs). */
int gpt_attention_forward(gpt_cuda_t ctx, void *out, int ostride, void *att, const void *q,
                          const void *k, const void *v, int stride, int B, int T, int NH, int hs,
                          void *scratch);
/** dq, dk, dv (OVERWRITTEN, with stride) from dout (ostride), the saved
 *  att and the forward's q, k, v. */
int gpt_attention_backward(gpt_cuda_t ctx, void *dq, void *dk, void *dv, int stride,
                           const void *dout, int ostride, const void *att, const void *q,
                           const void *k, const void *v, int B, int T, int NH, int hs,
                           void *scratch);

/* ------------------------------------------------------------ elementwise */

/** out = GELU(inp), tanh approximation (GPT-2's); n elements. */
int gpt_gelu_forward(gpt_cuda_t ctx, void *out, const void *inp, size_t n);
/** dinp += dout * GELU'(inp) (dinp must not alias dout). */
int gpt_gelu_backward(gpt_cuda_t ctx, void *dinp, const void *inp, const void *dout, size_t n);
/** out = a + b, n elements (out may alias a or b). */
int gpt_residual_forward(gpt_cuda_t ctx, void *out, const void *a, const void *b, size_t n);
/** da += dout, db += dout (either may be NULL; neither may alias dout). */
int gpt_residual_backward(gpt_cuda_t ctx, void *da, void *db, const void *dout, size_t n);

/** dst = src converted, n elements; *_f32: 1 for fp32, 0 for bf16 (rounded
 *  to nearest even). For an fp32 engine, whose parameters these kernels
 *  take as bf16 working copies. */
int gpt_cast(gpt_cuda_t ctx, void *dst, int dst_f32, const void *src, int src_f32, size_t n);

/* ------------------------------------------------------------- classifier */

/** Softmax over the first V of Vp columns of each of the N rows of
 *  logits, losses[i] = -log p[i][targets[i]] (fp32), and the logits
 *  OVERWRITTEN by their gradient dloss * (p - onehot) (zero in the padded
 *  columns; zero everywhere when dloss is 0, as the host path gives for a
 *  micro-batch without a counted token, so that the backward can always
 *  read them as dlogits). A target < 0 ignores its row (loss 0, gradient
 *  0: the host path's -100 labels); a target >= V makes its row's loss NaN (so a bad id shows in the
 *  loss) and its gradient zero. dloss is the loss's weight per token (1/(B*T) for the batch mean). */
int gpt_fused_classifier(gpt_cuda_t ctx, void *logits, float *losses, const int64_t *targets,
                         float dloss, int N, int V, int Vp);

#ifdef __cplusplus
}
#endif

#endif
