/*
 * train_gpt: train a GPT-2-architecture decoder with the libdsm engine.
 *
 *   mpiexec -n 4 ./train_gpt --data SHARD.bin [CONFIG.json] [--preset tiny|small|gpt2]
 *       [--layers L] [--heads H] [--width C] [--ctx T] [--vocab V]
 *       [--steps N] [--print-every K] [--no-shuffle] [--init WEIGHTS.safetensors]
 *       [--checkpoint DIR [--save-every K]] [--target-loss X] [--peak-tflops F]
 *       [--dump-grads FILE.safetensors] [--describe] [--device host|cuda]
 *       [--loss-csv FILE.csv] [--sample N [--prompt TEXT] [--temperature X]]
 *
 * The model is GPT-2's: token and position embeddings; L pre-LayerNorm
 * blocks of causal multi-head attention and a GELU MLP, each with a
 * residual; a final LayerNorm; the LM head tied to the token embedding;
 * cross-entropy. Its forward and backward are written out in gpt_ops.c
 * (OpenMP + CBLAS); this file drives them with libdsm, the way a program of
 * its own would:
 *
 *  - the mesh the DeepSpeed configuration describes (data_parallel x
 *    sequence_parallel with "sequence_parallel_size");
 *  - the engine over the parameters, named as in GPT-2 checkpoints
 *    ("h.0.attn.c_attn.weight"), acquired and released block by block in
 *    the forward pass and again in the backward pass, so that under ZeRO-3
 *    each block is gathered when it is needed and freed after;
 *  - at sequence parallelism P > 1, the Ulysses all-to-alls around attention
 *    (dsm_sp_seq_to_head_n, dsm_sp_head_to_seq) and the token-weighted loss
 *    (dsm_sp_loss);
 *  - fp32, bf16 or fp16 (the configuration; the math is fp32 on the compute
 *    dtype's values), gradient accumulation, clipping, the LR schedule;
 *  - the data-parallel sampler over the sequences of a token shard;
 *  - checkpoints with resume (on any number of ranks) and the stop signal
 *    (DSM_STOP_SIGNAL), metrics with MFU (dsm_engine_set_flops), and initial
 *    weights from a safetensors file (dsm_engine_load_weights).
 *
 * With --device cuda (builds with CUDA kernels) the same calls drive a
 * device-resident engine on the example's CUDA stream, and the kernels of
 * examples/gpt/cuda compute in bf16 on the GPU (gpt_device.c); without a GPU
 * that run prints why and exits 77.
 *
 * The data is an llm.c token shard (gpt_shard writes one): sample i is the
 * T tokens [i T, (i + 1) T); position t predicts token t + 1, the last
 * position predicts nothing (as Hugging Face's GPT2LMHeadModel with
 * labels = input_ids). Rank 0 prints "step N loss X ..." lines (the mean
 * loss of the global batch), then "final loss X (initial Y)", the figures
 * of the run (tokens/s, MFU, libdsm's share of the step) and exits 0; 2 when
 * --target-loss is given and the final loss is above it; 3 on the stop
 * signal; 4 when the loss of a step is NaN or infinite (training diverged:
 * every rank stops at that step, nothing is saved); 1 on an error (every
 * rank reports it).
 *
 * --loss-csv writes every step's loss (rank 0: step, loss, lr, grad_norm,
 * ms, tokens/s). --sample N ends the run by generating N tokens after the
 * prompt's bytes (the model's own forward over the last T tokens, sampled at
 * the temperature, every rank alike so that ZeRO-3's gathers agree) and rank
 * 0 prints them as text: with a byte-level shard (gpt_shard --text) the
 * model writes like its corpus.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>

#include <mpi.h>

#include "dsm.h"
#include "gpt.h"
#if GPT_WITH_CUDA
#include "gpt_device.h"
#endif

/* ------------------------------------------------------------ presets */

struct preset {
    const char *name;
    int layers, heads, width, ctx, vocab;
};
static const struct preset presets[] = {
    {"tiny", 2, 4, 32, 32, 256},        /* the tests: seconds */
    {"small", 4, 4, 256, 256, 256},     /* the CPU benchmark */
    {"gpt2", 12, 12, 768, 1024, 50257}, /* GPT-2 124M */
};

#define DEFAULT_CONFIG "examples/gpt/gpt_tiny.json"
#define FINAL_WINDOW 10 /* steps averaged for the final loss */
#define SEED_INIT 1000

/* ------------------------------------------------------------ options */

struct options {
    const char *config, *data, *init, *ckpt_dir, *dump_grads, *loss_csv, *prompt;
    struct preset p;
    long steps, save_every, print_every, sample;
    int shuffle, describe, cuda;
    double target_loss, peak_tflops, temperature;
};

static long parse_long(const char *s, int *bad) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*end != '\0' || end == s || v < 1) *bad = 1;
    return v;
}

static int parse_options(int argc, char **argv, struct options *o) {
    int bad = 0;
    memset(o, 0, sizeof *o);
    o->config = DEFAULT_CONFIG;
    o->p = presets[0];
    o->steps = 20, o->save_every = 50, o->print_every = 0, o->shuffle = 1;
    o->target_loss = -1.0;
    o->prompt = "\n", o->temperature = 0.8;
    for (int a = 1; a < argc && !bad; ++a) {
        const char *s = argv[a], *v = a + 1 < argc ? argv[a + 1] : NULL;
        if (strcmp(s, "--preset") == 0 && v) {
            size_t i = 0;
            while (i < sizeof presets / sizeof presets[0] && strcmp(presets[i].name, v) != 0) ++i;
            if (i == sizeof presets / sizeof presets[0]) {
                fprintf(stderr, "train_gpt: unknown preset \"%s\" (tiny, small, gpt2)\n", v);
                bad = 1;
            } else {
                o->p = presets[i];
            }
            ++a;
        } else if (strcmp(s, "--layers") == 0 && v) o->p.layers = (int)parse_long(argv[++a], &bad);
        else if (strcmp(s, "--heads") == 0 && v) o->p.heads = (int)parse_long(argv[++a], &bad);
        else if (strcmp(s, "--width") == 0 && v) o->p.width = (int)parse_long(argv[++a], &bad);
        else if (strcmp(s, "--ctx") == 0 && v) o->p.ctx = (int)parse_long(argv[++a], &bad);
        else if (strcmp(s, "--vocab") == 0 && v) o->p.vocab = (int)parse_long(argv[++a], &bad);
        else if (strcmp(s, "--steps") == 0 && v) o->steps = parse_long(argv[++a], &bad);
        else if (strcmp(s, "--save-every") == 0 && v) o->save_every = parse_long(argv[++a], &bad);
        else if (strcmp(s, "--print-every") == 0 && v) o->print_every = parse_long(argv[++a], &bad);
        else if (strcmp(s, "--data") == 0 && v) o->data = argv[++a];
        else if (strcmp(s, "--init") == 0 && v) o->init = argv[++a];
        else if (strcmp(s, "--checkpoint") == 0 && v) o->ckpt_dir = argv[++a];
        else if (strcmp(s, "--dump-grads") == 0 && v) o->dump_grads = argv[++a];
        else if (strcmp(s, "--loss-csv") == 0 && v) o->loss_csv = argv[++a];
        else if (strcmp(s, "--sample") == 0 && v) o->sample = parse_long(argv[++a], &bad);
        else if (strcmp(s, "--prompt") == 0 && v) o->prompt = argv[++a];
        else if (strcmp(s, "--temperature") == 0 && v) {
            char *end;
            o->temperature = strtod(argv[++a], &end);
            if (*end != '\0' || end == argv[a] || !(o->temperature > 0.0 && o->temperature <= 100.0)) {
                fprintf(stderr, "train_gpt: --temperature must be in (0, 100], got \"%s\"\n", argv[a]);
                bad = 1;
            }
        }
        else if (strcmp(s, "--target-loss") == 0 && v) o->target_loss = atof(argv[++a]);
        else if (strcmp(s, "--peak-tflops") == 0 && v) o->peak_tflops = atof(argv[++a]);
        else if (strcmp(s, "--no-shuffle") == 0) o->shuffle = 0;
        else if (strcmp(s, "--describe") == 0) o->describe = 1;
        else if (strcmp(s, "--device") == 0 && v && (strcmp(v, "host") == 0 || strcmp(v, "cuda") == 0))
            o->cuda = strcmp(argv[++a], "cuda") == 0;
        else if (s[0] != '-') o->config = s;
        else {
            fprintf(stderr, "train_gpt: unknown or incomplete option \"%s\"\n", s);
            bad = 1;
        }
    }
    if (!bad && o->data == NULL) {
        fprintf(stderr, "train_gpt: --data SHARD.bin is required (gpt_shard writes one)\n");
        bad = 1;
    }
    if (!bad && o->p.width % o->p.heads != 0) {
        fprintf(stderr, "train_gpt: width %d is not a multiple of heads %d\n", o->p.width, o->p.heads);
        bad = 1;
    }
    if (!bad && o->sample > 0 && o->prompt[0] == '\0') {
        fprintf(stderr, "train_gpt: --prompt is empty (--sample needs at least one token to start from)\n");
        bad = 1;
    }
    if (!bad && o->sample > 0 && o->p.vocab > 256) {
        fprintf(stderr, "train_gpt: --sample prints tokens as bytes: it needs a byte-level vocabulary (at most 256), "
                        "not %d\n", o->p.vocab);
        bad = 1;
    }
    for (const char *q = o->prompt; !bad && o->sample > 0 && *q; ++q)
        if ((unsigned char)*q >= o->p.vocab) {
            fprintf(stderr, "train_gpt: --prompt byte %u is outside the vocabulary of %d\n", (unsigned char)*q,
                    o->p.vocab);
            bad = 1;
        }
    if (!bad && o->p.vocab > 65536) {
        fprintf(stderr, "train_gpt: vocab %d does not fit the shard's uint16 tokens\n", o->p.vocab);
        bad = 1;
    }
    return !bad;
}

/* ------------------------------------------------------------ data */

/* An llm.c token shard: 256 int32 (magic 20240520, version 1, token count,
 * then zeros), then the uint16 tokens. Mapped read-only. */
struct shard {
    const uint16_t *tokens;
    int64_t ntok;
    void *map;
    size_t map_len;
};

static int shard_open(const char *path, int vocab, struct shard *s, char *msg, size_t msg_len) {
    memset(s, 0, sizeof *s);
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        snprintf(msg, msg_len, "cannot open the token shard %s", path);
        return 0;
    }
    struct stat st;
    int32_t header[256];
    if (fstat(fd, &st) != 0 || st.st_size < (off_t)sizeof header ||
        pread(fd, header, sizeof header, 0) != (ssize_t)sizeof header) {
        snprintf(msg, msg_len, "%s: shorter than the 1024-byte shard header", path);
        close(fd);
        return 0;
    }
    if (header[0] != 20240520 || header[1] != 1) {
        snprintf(msg, msg_len, "%s: not a token shard (magic %d, version %d; expected 20240520, 1)", path,
                 header[0], header[1]);
        close(fd);
        return 0;
    }
    const int64_t ntok = header[2];
    if (ntok < 1 || (off_t)(sizeof header + (size_t)ntok * 2) != st.st_size) {
        snprintf(msg, msg_len, "%s: the header says %lld tokens, the file holds %lld bytes after it", path,
                 (long long)ntok, (long long)(st.st_size - (off_t)sizeof header));
        close(fd);
        return 0;
    }
    s->map_len = (size_t)st.st_size;
    s->map = mmap(NULL, s->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (s->map == MAP_FAILED) {
        s->map = NULL;
        snprintf(msg, msg_len, "%s: mmap failed", path);
        return 0;
    }
    s->tokens = (const uint16_t *)((const char *)s->map + sizeof header);
    s->ntok = ntok;
    for (int64_t i = 0; i < ntok; ++i)
        if (s->tokens[i] >= vocab) {
            snprintf(msg, msg_len, "%s: token %lld is %u, outside the vocabulary of %d", path, (long long)i,
                     s->tokens[i], vocab);
            return 0;
        }
    return 1;
}

static void shard_close(struct shard *s) {
    if (s->map) munmap(s->map, s->map_len);
    memset(s, 0, sizeof *s);
}

/* ------------------------------------------------------------ initial weights */

/* A counter-based generator (as in examples/c/train_mlp.c): the value depends
 * only on (stream, i), so each rank fills only what it stores under ZeRO-3. */
static uint64_t mix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double uniform(uint64_t stream, uint64_t i) {
    return ((double)(mix64(mix64(stream) ^ i) >> 11) + 0.5) * 0x1p-53;
}
static double gauss(uint64_t stream, uint64_t i) {
    const double u1 = uniform(stream, 2 * i), u2 = uniform(stream, 2 * i + 1);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* GPT-2's initialization: weights N(0, 0.02), the residual projections
 * (c_proj) N(0, 0.02 / sqrt(2 L)), LayerNorm weights 1, biases 0. */
static int init_param(void *user_data, int index, const char *name, int64_t offset, int64_t count,
                      float *values) {
    const GPTConfig *c = user_data;
    const size_t len = strlen(name);
    int is_weight = len > 7 && strcmp(name + len - 7, ".weight") == 0;
    const int is_ln = strstr(name, "ln_") != NULL;
    double std = 0.02;
    if (strstr(name, "c_proj.weight")) std = 0.02 / sqrt(2.0 * c->num_layers);
    for (int64_t k = 0; k < count; ++k)
        values[k] = !is_weight ? 0.0f : is_ln ? 1.0f
                                              : (float)(std * gauss(SEED_INIT + (uint64_t)index, (uint64_t)(offset + k)));
    return 0;
}

/* ------------------------------------------------------------ the model's state */

/* Activations of one block, kept from forward for backward. */
struct layer_acts {
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *att, *attproj, *res2;
    float *ln2, *ln2_mean, *ln2_rstd, *fch, *fch_gelu, *fcproj, *res3;
    float *qh, *kh, *vh; /* head-sharded q, k, v (sequence parallelism only) */
};

struct model {
    GPTConfig c;
    dsm_engine_t engine;
    dsm_dtype_t dtype;
    dsm_sp_t sp;    /* NULL without a sequence_parallel dimension */
    int P, sp_rank; /* sequence-parallel size and rank */
    int B, T, Tl;   /* sequences per micro-batch, tokens per sequence, per rank */
    int N;          /* B * Tl: this rank's tokens */
    int Hp, hf;     /* this rank's heads (all at P = 1) and the first */
    int np;
    float **w, **g;          /* each parameter's fp32 values / gradient while acquired */
    float **wslot, **gslot;  /* their fp32 copies for 16-bit compute dtypes */
    float *dwte, *dwpe;      /* the embeddings' gradients over the whole backward */
    int64_t *tok, *pos, *lab, *seqs, *idx;
    float *encoded, *lnf, *lnf_mean, *lnf_rstd, *logits;
    struct layer_acts *la;
    /* gradients of activations, reused by every block */
    float *dres, *dln, *dqkv, *datty, *dfch, *dfch_gelu, *dlnf;
    /* sequence parallelism: all-to-all inputs (dsm_sp_alloc) and outputs */
    float *qs, *ks, *vs, *oh, *spd, *dqh, *dkh, *dvh; /* inputs */
    float *doh, *dqs, *dks, *dvs;                      /* outputs */
    double t_dsm; /* seconds spent in libdsm calls */
};

/* Time spent in libdsm: every engine and SP call of the step goes through
 * DSM(), which adds its duration to m->t_dsm (one thread calls libdsm). */
static double dsm_t0_;
static dsm_status_t dsm_st_;
#define DSM(m, call) \
    (dsm_t0_ = MPI_Wtime(), dsm_st_ = (call), (m)->t_dsm += MPI_Wtime() - dsm_t0_, dsm_st_)

/* Acquire parameters: their values as fp32, the engine's own memory at fp32
 * compute (no copy), else a converted copy. Collective under ZeRO-3. */
static dsm_status_t params_acquire(struct model *m, const int *idx, int n) {
    for (int i = 0; i < n; ++i) {
        const void *values;
        dsm_status_t st = DSM(m, dsm_engine_param_acquire(m->engine, idx[i], &values));
        if (st != DSM_SUCCESS) return st;
        if (m->dtype == DSM_FLOAT32) {
            m->w[idx[i]] = (float *)values;
        } else {
            m->w[idx[i]] = m->wslot[idx[i]];
            st = DSM(m, dsm_convert(values, m->dtype, m->wslot[idx[i]], DSM_FLOAT32,
                                    (size_t)gpt_param_numel(&m->c, idx[i])));
            if (st != DSM_SUCCESS) return st;
        }
    }
    return DSM_SUCCESS;
}

static dsm_status_t params_release(struct model *m, const int *idx, int n) {
    for (int i = 0; i < n; ++i) {
        dsm_status_t st = DSM(m, dsm_engine_param_release(m->engine, idx[i]));
        if (st != DSM_SUCCESS) return st;
        m->w[idx[i]] = NULL;
    }
    return DSM_SUCCESS;
}

/* Open the gradients of parameters to add into: at fp32 the engine's buffers
 * (under ZeRO-0/1 they hold the window's sum so far; the backward adds), else
 * zeroed fp32 copies that grads_close() adds with dsm_engine_grad_add_f32(). */
static dsm_status_t grads_open(struct model *m, const int *idx, int n) {
    for (int i = 0; i < n; ++i) {
        if (m->dtype == DSM_FLOAT32) {
            void *buf;
            dsm_status_t st = DSM(m, dsm_engine_grad_acquire(m->engine, idx[i], &buf));
            if (st != DSM_SUCCESS) return st;
            m->g[idx[i]] = buf;
        } else {
            m->g[idx[i]] = m->gslot[idx[i]];
            memset(m->g[idx[i]], 0, (size_t)gpt_param_numel(&m->c, idx[i]) * sizeof(float));
        }
    }
    return DSM_SUCCESS;
}

/* Hand the gradients back; under ZeRO-2/3 a full bucket is reduced here. */
static dsm_status_t grads_close(struct model *m, const int *idx, int n) {
    for (int i = 0; i < n; ++i) {
        dsm_status_t st = m->dtype == DSM_FLOAT32
                              ? DSM(m, dsm_engine_grad_release(m->engine, idx[i]))
                              : DSM(m, dsm_engine_grad_add_f32(m->engine, idx[i], m->g[idx[i]],
                                                               gpt_param_numel(&m->c, idx[i])));
        if (st != DSM_SUCCESS) return st;
        m->g[idx[i]] = NULL;
    }
    return DSM_SUCCESS;
}

static void layer_indices(const struct model *m, int l, int idx[NUM_LAYER_PARAMS]) {
    for (int k = 0; k < NUM_LAYER_PARAMS; ++k) idx[k] = gpt_layer_param(l, k);
    (void)m;
}

/* ------------------------------------------------------------ attention, sequence-parallel */

/* The attention of one block on this rank's tokens: at P = 1 straight on the
 * fused qkv; at P > 1 q, k and v go to "all tokens, my heads" in one
 * all-to-all, and the output comes back to "my tokens, all heads". */
static dsm_status_t attention_block_forward(struct model *m, struct layer_acts *a) {
    const int C = m->c.channels, NH = m->c.num_heads, hs = C / NH;
    if (m->P == 1) {
        attention_forward(a->atty, C, a->att, a->qkv, a->qkv + C, a->qkv + 2 * C, 3 * C, m->B, m->T, NH, hs);
        return DSM_SUCCESS;
    }
    for (int n = 0; n < m->N; ++n) { /* split the fused qkv: [N, 3C] -> 3 x [N, C] */
        memcpy(m->qs + (size_t)n * C, a->qkv + (size_t)n * 3 * C, (size_t)C * sizeof(float));
        memcpy(m->ks + (size_t)n * C, a->qkv + (size_t)n * 3 * C + C, (size_t)C * sizeof(float));
        memcpy(m->vs + (size_t)n * C, a->qkv + (size_t)n * 3 * C + 2 * C, (size_t)C * sizeof(float));
    }
    const dsm_sp_tensor_t t = {m->B, m->T, NH, hs, DSM_SP_BATCH_FIRST, DSM_FLOAT32, 0};
    const dsm_sp_tensor_t t3[3] = {t, t, t};
    const size_t seq_n = (size_t)m->N * C, head_n = (size_t)m->B * m->T * m->Hp * hs;
    const size_t seq3[3] = {seq_n, seq_n, seq_n}, head3[3] = {head_n, head_n, head_n};
    const void *in[3] = {m->qs, m->ks, m->vs};
    void *out[3] = {a->qh, a->kh, a->vh};
    dsm_status_t st = DSM(m, dsm_sp_seq_to_head_n(m->sp, 3, t3, in, seq3, out, head3));
    if (st != DSM_SUCCESS) return st;
    attention_forward(m->oh, m->Hp * hs, a->att, a->qh, a->kh, a->vh, m->Hp * hs, m->B, m->T, m->Hp, hs);
    return DSM(m, dsm_sp_head_to_seq(m->sp, &t, m->oh, head_n, a->atty, seq_n));
}

/* Its backward: from datty (the gradient of the output, [N, C]) the
 * gradient of the fused qkv in m->dqkv (overwritten). */
static dsm_status_t attention_block_backward(struct model *m, struct layer_acts *a, const float *datty) {
    const int C = m->c.channels, NH = m->c.num_heads, hs = C / NH;
    if (m->P == 1) {
        attention_backward(m->dqkv, m->dqkv + C, m->dqkv + 2 * C, 3 * C, datty, C, a->att, a->qkv, a->qkv + C,
                           a->qkv + 2 * C, m->B, m->T, NH, hs);
        return DSM_SUCCESS;
    }
    const dsm_sp_tensor_t t = {m->B, m->T, NH, hs, DSM_SP_BATCH_FIRST, DSM_FLOAT32, 0};
    const dsm_sp_tensor_t t3[3] = {t, t, t};
    const size_t seq_n = (size_t)m->N * C, head_n = (size_t)m->B * m->T * m->Hp * hs;
    const size_t seq3[3] = {seq_n, seq_n, seq_n}, head3[3] = {head_n, head_n, head_n};
    /* the output's gradient goes the way the output came: to head-sharded */
    dsm_status_t st = DSM(m, dsm_sp_seq_to_head(m->sp, &t, datty, seq_n, m->doh, head_n));
    if (st != DSM_SUCCESS) return st;
    attention_backward(m->dqh, m->dkh, m->dvh, m->Hp * hs, m->doh, m->Hp * hs, a->att, a->qh, a->kh, a->vh,
                       m->B, m->T, m->Hp, hs);
    const void *in[3] = {m->dqh, m->dkh, m->dvh};
    void *out[3] = {m->dqs, m->dks, m->dvs};
    if ((st = DSM(m, dsm_sp_head_to_seq_n(m->sp, 3, t3, in, head3, out, seq3))) != DSM_SUCCESS) return st;
    for (int n = 0; n < m->N; ++n) { /* and back into the fused layout */
        memcpy(m->dqkv + (size_t)n * 3 * C, m->dqs + (size_t)n * C, (size_t)C * sizeof(float));
        memcpy(m->dqkv + (size_t)n * 3 * C + C, m->dks + (size_t)n * C, (size_t)C * sizeof(float));
        memcpy(m->dqkv + (size_t)n * 3 * C + 2 * C, m->dvs + (size_t)n * C, (size_t)C * sizeof(float));
    }
    return DSM_SUCCESS;
}

/* ------------------------------------------------------------ forward and backward */

/*
 * The forward pass of one micro-batch (m->tok, m->pos, m->lab): the sum of
 * this rank's token losses in *loss_sum and their number in *count. Block l's
 * twelve parameters are acquired together before it and released after it,
 * in the same order on every rank.
 */
static dsm_status_t forward(struct model *m, double *loss_sum, int64_t *count) {
    const GPTConfig *c = &m->c;
    const int N = m->N, C = c->channels;
    dsm_status_t st;
    const int emb[2] = {gpt_wte(), gpt_wpe()};
    if ((st = params_acquire(m, emb, 2))) return st;
    encoder_forward(m->encoded, m->tok, m->pos, m->w[gpt_wte()], m->w[gpt_wpe()], N, C);
    if ((st = params_release(m, emb, 2))) return st;

    const float *x = m->encoded;
    for (int l = 0; l < c->num_layers; ++l) {
        int idx[NUM_LAYER_PARAMS];
        layer_indices(m, l, idx);
        if ((st = params_acquire(m, idx, NUM_LAYER_PARAMS))) return st;
        float **w = m->w + gpt_layer_param(l, 0);
        struct layer_acts *a = &m->la[l];
        layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, x, w[LN1_W], w[LN1_B], N, C);
        matmul_forward(a->qkv, a->ln1, w[QKV_W], w[QKV_B], N, C, 3 * C);
        if ((st = attention_block_forward(m, a))) return st;
        matmul_forward(a->attproj, a->atty, w[ATTPROJ_W], w[ATTPROJ_B], N, C, C);
        residual_forward(a->res2, x, a->attproj, N * C);
        layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, w[LN2_W], w[LN2_B], N, C);
        matmul_forward(a->fch, a->ln2, w[FC_W], w[FC_B], N, C, 4 * C);
        gelu_forward(a->fch_gelu, a->fch, N * 4 * C);
        matmul_forward(a->fcproj, a->fch_gelu, w[FCPROJ_W], w[FCPROJ_B], N, 4 * C, C);
        residual_forward(a->res3, a->res2, a->fcproj, N * C);
        if ((st = params_release(m, idx, NUM_LAYER_PARAMS))) return st;
        x = a->res3;
    }

    const int head[3] = {gpt_lnf_w(c), gpt_lnf_b(c), gpt_wte()};
    if ((st = params_acquire(m, head, 3))) return st;
    layernorm_forward(m->lnf, m->lnf_mean, m->lnf_rstd, x, m->w[head[0]], m->w[head[1]], N, C);
    *loss_sum = classifier_forward(m->logits, m->lnf, m->w[gpt_wte()], m->lab, N, C, c->vocab_size,
                                   c->padded_vocab_size, count);
    return params_release(m, head, 3);
}

/*
 * The backward pass: the gradient of dloss x (this rank's loss sum), where
 * dloss is the SP group's 1/tokens times the loss scale. Each block acquires
 * its parameters again (a second gather under ZeRO-3, as DeepSpeed's
 * backward does), adds its gradients and hands them back.
 */
static dsm_status_t backward(struct model *m, float dloss) {
    const GPTConfig *c = &m->c;
    const int N = m->N, C = c->channels, L = c->num_layers;
    dsm_status_t st;
    memset(m->dwte, 0, (size_t)gpt_param_numel(c, gpt_wte()) * sizeof(float));
    memset(m->dwpe, 0, (size_t)gpt_param_numel(c, gpt_wpe()) * sizeof(float));

    const int head[3] = {gpt_lnf_w(c), gpt_lnf_b(c), gpt_wte()};
    const float *x_last = L > 0 ? m->la[L - 1].res3 : m->encoded;
    if ((st = params_acquire(m, head, 3)) || (st = grads_open(m, head, 2))) return st;
    classifier_backward(m->dlnf, m->dwte, m->logits, m->lnf, m->w[gpt_wte()], m->lab, dloss, N, C,
                        c->vocab_size, c->padded_vocab_size);
    memset(m->dres, 0, (size_t)N * C * sizeof(float));
    layernorm_backward(m->dres, m->g[head[0]], m->g[head[1]], m->dlnf, x_last, m->w[head[0]], m->lnf_mean,
                       m->lnf_rstd, N, C);
    if ((st = params_release(m, head, 3)) || (st = grads_close(m, head, 2))) return st;

    for (int l = L - 1; l >= 0; --l) {
        int idx[NUM_LAYER_PARAMS];
        layer_indices(m, l, idx);
        if ((st = params_acquire(m, idx, NUM_LAYER_PARAMS)) || (st = grads_open(m, idx, NUM_LAYER_PARAMS)))
            return st;
        float **w = m->w + gpt_layer_param(l, 0), **g = m->g + gpt_layer_param(l, 0);
        struct layer_acts *a = &m->la[l];
        const float *x = l > 0 ? m->la[l - 1].res3 : m->encoded;
        /* m->dres: the gradient of res3 on entry, of x on exit */
        memset(m->dfch_gelu, 0, (size_t)N * 4 * C * sizeof(float));
        matmul_backward(m->dfch_gelu, g[FCPROJ_W], g[FCPROJ_B], m->dres, a->fch_gelu, w[FCPROJ_W], N, 4 * C, C);
        memset(m->dfch, 0, (size_t)N * 4 * C * sizeof(float));
        gelu_backward(m->dfch, a->fch, m->dfch_gelu, N * 4 * C);
        memset(m->dln, 0, (size_t)N * C * sizeof(float));
        matmul_backward(m->dln, g[FC_W], g[FC_B], m->dfch, a->ln2, w[FC_W], N, C, 4 * C);
        layernorm_backward(m->dres, g[LN2_W], g[LN2_B], m->dln, a->res2, w[LN2_W], a->ln2_mean, a->ln2_rstd, N, C);
        memset(m->datty, 0, (size_t)N * C * sizeof(float));
        matmul_backward(m->datty, g[ATTPROJ_W], g[ATTPROJ_B], m->dres, a->atty, w[ATTPROJ_W], N, C, C);
        if ((st = attention_block_backward(m, a, m->datty))) return st;
        memset(m->dln, 0, (size_t)N * C * sizeof(float));
        matmul_backward(m->dln, g[QKV_W], g[QKV_B], m->dqkv, a->ln1, w[QKV_W], N, C, 3 * C);
        layernorm_backward(m->dres, g[LN1_W], g[LN1_B], m->dln, x, w[LN1_W], a->ln1_mean, a->ln1_rstd, N, C);
        if ((st = params_release(m, idx, NUM_LAYER_PARAMS)) || (st = grads_close(m, idx, NUM_LAYER_PARAMS)))
            return st;
    }

    encoder_backward(m->dwte, m->dwpe, m->dres, m->tok, m->pos, N, C);
    if ((st = DSM(m, dsm_engine_grad_add_f32(m->engine, gpt_wte(), m->dwte, gpt_param_numel(c, gpt_wte())))))
        return st;
    return DSM(m, dsm_engine_grad_add_f32(m->engine, gpt_wpe(), m->dwpe, gpt_param_numel(c, gpt_wpe())));
}

/* ------------------------------------------------------------ sampling */

/*
 * n tokens generated after the prompt's bytes, into out (n + 1 bytes): each
 * the model's next-token distribution at the last position of the window
 * (the last T tokens so far) sharpened by the temperature and sampled with
 * the counter-based generator, so that every rank draws the same tokens and
 * makes the same acquires (collective under ZeRO-3). One sequence of the
 * micro-batch's buffers serves (P = 1).
 */
static dsm_status_t generate(struct model *m, const char *prompt, long n, double temperature, char *out) {
    const GPTConfig *c = &m->c;
    const int T = m->T, V = c->vocab_size, Vp = c->padded_vocab_size, B = m->B, N = m->N;
    const size_t plen = strlen(prompt);
    int64_t *seq = malloc((plen + (size_t)n) * sizeof(int64_t));
    double *w = malloc((size_t)V * sizeof(double));
    if (!seq || !w) {
        free(seq), free(w);
        return DSM_ERR_OUT_OF_MEMORY;
    }
    for (size_t i = 0; i < plen; ++i) seq[i] = (unsigned char)prompt[i];
    size_t len = plen;
    dsm_status_t st = DSM_SUCCESS;
    m->B = 1, m->N = T;
    for (long k = 0; k < n && st == DSM_SUCCESS; ++k) {
        const size_t first = len > (size_t)T ? len - (size_t)T : 0, used = len - first;
        for (int t = 0; t < T; ++t) {
            m->tok[t] = (size_t)t < used ? seq[first + (size_t)t] : 0;
            m->pos[t] = t, m->lab[t] = -100;
        }
        double loss;
        int64_t count;
        if ((st = forward(m, &loss, &count)) != DSM_SUCCESS) break;
        /* classifier_forward left the probabilities in m->logits */
        const float *p = m->logits + (used - 1) * (size_t)Vp;
        double total = 0.0;
        for (int j = 0; j < V; ++j) total += (w[j] = pow((double)p[j] + 1e-30, 1.0 / temperature));
        double u = uniform(SEED_INIT + 7, (uint64_t)k) * total;
        int j = 0;
        while (j < V - 1 && (u -= w[j]) > 0.0) ++j;
        seq[len++] = j;
    }
    m->B = B, m->N = N;
    for (size_t i = plen; i < len; ++i) out[i - plen] = (char)seq[i];
    out[len - plen] = '\0';
    free(seq), free(w);
    return st;
}

/* ------------------------------------------------------------ buffers */

static float *falloc(size_t n, int *ok) {
    float *p = calloc(n ? n : 1, sizeof(float));
    if (!p) *ok = 0;
    return p;
}

/* Everything the passes need. The all-to-all inputs come from dsm_sp_alloc()
 * (collective), so that ranks of a node read them in place. */
static dsm_status_t model_alloc(struct model *m, int host_compute, int *ok) {
    const GPTConfig *c = &m->c;
    const size_t N = (size_t)m->N, C = (size_t)c->channels, Vp = (size_t)c->padded_vocab_size;
    const size_t hs = C / (size_t)c->num_heads, heads_n = (size_t)m->B * m->T * m->Hp * hs;
    m->np = gpt_num_params(c);
    m->w = calloc((size_t)m->np, sizeof *m->w), m->g = calloc((size_t)m->np, sizeof *m->g);
    m->wslot = calloc((size_t)m->np, sizeof *m->wslot), m->gslot = calloc((size_t)m->np, sizeof *m->gslot);
    m->la = calloc((size_t)c->num_layers, sizeof *m->la);
    if (!m->w || !m->g || !m->wslot || !m->gslot || !m->la) {
        *ok = 0;
        return DSM_SUCCESS;
    }
    if (m->dtype != DSM_FLOAT32 && host_compute) {
        /* fp32 copies: one block's worth shared by every block, and the rest */
        for (int i = 0; i < m->np; ++i) {
            const int layer = i >= 2 && i < gpt_lnf_w(c), k = (i - 2) % NUM_LAYER_PARAMS;
            if (layer && i >= 2 + NUM_LAYER_PARAMS) {
                m->wslot[i] = m->wslot[2 + k], m->gslot[i] = m->gslot[2 + k];
                continue;
            }
            m->wslot[i] = falloc((size_t)gpt_param_numel(c, i), ok);
            m->gslot[i] = falloc((size_t)gpt_param_numel(c, i), ok);
        }
    }
    m->dwte = falloc(Vp * C, ok), m->dwpe = falloc((size_t)c->max_seq_len * C, ok);
    m->tok = calloc(N, sizeof(int64_t)), m->pos = calloc(N, sizeof(int64_t)), m->lab = calloc(N, sizeof(int64_t));
    m->seqs = calloc((size_t)m->B * m->T, sizeof(int64_t)), m->idx = calloc((size_t)m->B, sizeof(int64_t));
    if (!m->tok || !m->pos || !m->lab || !m->seqs || !m->idx) *ok = 0;
    if (!host_compute) return DSM_SUCCESS; /* the device path has buffers of its own */
    m->encoded = falloc(N * C, ok), m->lnf = falloc(N * C, ok), m->lnf_mean = falloc(N, ok);
    m->lnf_rstd = falloc(N, ok), m->logits = falloc(N * Vp, ok);
    for (int l = 0; l < c->num_layers; ++l) {
        struct layer_acts *a = &m->la[l];
        a->ln1 = falloc(N * C, ok), a->ln1_mean = falloc(N, ok), a->ln1_rstd = falloc(N, ok);
        a->qkv = falloc(N * 3 * C, ok), a->atty = falloc(N * C, ok);
        a->att = falloc((size_t)m->B * m->Hp * m->T * m->T, ok);
        a->attproj = falloc(N * C, ok), a->res2 = falloc(N * C, ok), a->ln2 = falloc(N * C, ok);
        a->ln2_mean = falloc(N, ok), a->ln2_rstd = falloc(N, ok), a->fch = falloc(N * 4 * C, ok);
        a->fch_gelu = falloc(N * 4 * C, ok), a->fcproj = falloc(N * C, ok), a->res3 = falloc(N * C, ok);
        if (m->P > 1) a->qh = falloc(heads_n, ok), a->kh = falloc(heads_n, ok), a->vh = falloc(heads_n, ok);
    }
    m->dres = falloc(N * C, ok), m->dln = falloc(N * C, ok), m->dqkv = falloc(N * 3 * C, ok);
    m->dfch = falloc(N * 4 * C, ok), m->dfch_gelu = falloc(N * 4 * C, ok), m->dlnf = falloc(N * C, ok);
    if (m->P == 1) {
        m->datty = falloc(N * C, ok);
        return DSM_SUCCESS;
    }
    m->doh = falloc(heads_n, ok), m->dqs = falloc(N * C, ok), m->dks = falloc(N * C, ok), m->dvs = falloc(N * C, ok);
    float **shared[] = {&m->qs, &m->ks, &m->vs, &m->datty, &m->oh, &m->dqh, &m->dkh, &m->dvh};
    const size_t sizes[] = {N * C, N * C, N * C, N * C, heads_n, heads_n, heads_n, heads_n};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; ++i) {
        dsm_status_t st = dsm_sp_alloc(m->sp, sizes[i] * sizeof(float), (void **)shared[i]);
        if (st != DSM_SUCCESS) return st; /* on every rank of the group alike */
    }
    return DSM_SUCCESS;
}

static void model_free(struct model *m) {
    if (m->P > 1 && m->sp) {
        float **shared[] = {&m->qs, &m->ks, &m->vs, &m->datty, &m->oh, &m->dqh, &m->dkh, &m->dvh};
        for (size_t i = 0; i < sizeof shared / sizeof shared[0]; ++i)
            if (*shared[i] && dsm_sp_free_memory(m->sp, (void **)shared[i]) != DSM_SUCCESS)
                fprintf(stderr, "train_gpt: dsm_sp_free_memory: %s\n", dsm_last_error());
    } else {
        free(m->datty);
    }
    if (m->wslot)
        for (int i = 0; i < m->np; ++i)
            if (i < 2 || i >= gpt_lnf_w(&m->c) || i < 2 + NUM_LAYER_PARAMS) free(m->wslot[i]), free(m->gslot[i]);
    for (int l = 0; m->la && l < m->c.num_layers; ++l) {
        struct layer_acts *a = &m->la[l];
        float *p[] = {a->ln1, a->ln1_mean, a->ln1_rstd, a->qkv, a->atty, a->att, a->attproj, a->res2, a->ln2,
                      a->ln2_mean, a->ln2_rstd, a->fch, a->fch_gelu, a->fcproj, a->res3, a->qh, a->kh, a->vh};
        for (size_t i = 0; i < sizeof p / sizeof p[0]; ++i) free(p[i]);
    }
    float *p[] = {m->dwte, m->dwpe, m->encoded, m->lnf, m->lnf_mean, m->lnf_rstd, m->logits, m->dres, m->dln,
                  m->dqkv, m->dfch, m->dfch_gelu, m->dlnf, m->doh, m->dqs, m->dks, m->dvs};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; ++i) free(p[i]);
    free(m->w), free(m->g), free(m->wslot), free(m->gslot), free(m->la);
    free(m->tok), free(m->pos), free(m->lab), free(m->seqs), free(m->idx);
}

/* ------------------------------------------------------------ gradient dump */

/* Write every parameter's gradient (fp32) and the loss to a safetensors file:
 * the comparison with the PyTorch reference (one rank, ZeRO-0/1, where the
 * engine's buffers hold the micro-step's whole gradient). */
static dsm_status_t dump_grads(struct model *m, const char *path, double loss, char *msg, size_t msg_len) {
    const GPTConfig *c = &m->c;
    size_t hcap = 256 + (size_t)m->np * 160, hlen = 0, off = 4;
    char *header = malloc(hcap);
    if (!header) return DSM_ERR_OUT_OF_MEMORY;
    hlen += (size_t)snprintf(header + hlen, hcap - hlen, "{\"loss\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}");
    for (int i = 0; i < m->np; ++i) {
        char name[64];
        int nd;
        int64_t shape[2];
        gpt_param_info(c, i, name, sizeof name, &nd, shape);
        const size_t bytes = (size_t)gpt_param_numel(c, i) * 4;
        if (nd == 1)
            hlen += (size_t)snprintf(header + hlen, hcap - hlen, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[%lld],"
                                     "\"data_offsets\":[%zu,%zu]}", name, (long long)shape[0], off, off + bytes);
        else
            hlen += (size_t)snprintf(header + hlen, hcap - hlen, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[%lld,%lld],"
                                     "\"data_offsets\":[%zu,%zu]}", name, (long long)shape[0], (long long)shape[1],
                                     off, off + bytes);
        off += bytes;
    }
    hlen += (size_t)snprintf(header + hlen, hcap - hlen, "}");
    while (hlen % 8) header[hlen++] = ' ';
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(header);
        snprintf(msg, msg_len, "cannot write %s", path);
        return DSM_ERR_IO;
    }
    const uint64_t len = hlen;
    const float l32 = (float)loss;
    fwrite(&len, 8, 1, f), fwrite(header, 1, hlen, f), fwrite(&l32, 4, 1, f);
    free(header);
    dsm_status_t st = DSM_SUCCESS;
    for (int i = 0; i < m->np && st == DSM_SUCCESS; ++i) {
        const size_t n = (size_t)gpt_param_numel(c, i);
        float *tmp = malloc(n * sizeof(float));
        void *buf;
        if (!tmp) st = DSM_ERR_OUT_OF_MEMORY;
        if (st == DSM_SUCCESS && (st = dsm_engine_grad_acquire(m->engine, i, &buf)) == DSM_SUCCESS) {
            st = dsm_convert(buf, m->dtype, tmp, DSM_FLOAT32, n);
            dsm_status_t st2 = dsm_engine_grad_release(m->engine, i);
            if (st == DSM_SUCCESS) st = st2;
        }
        if (st == DSM_SUCCESS && fwrite(tmp, sizeof(float), n, f) != n) {
            snprintf(msg, msg_len, "cannot write %s", path);
            st = DSM_ERR_IO;
        }
        free(tmp);
    }
    if (fclose(f) != 0 && st == DSM_SUCCESS) st = DSM_ERR_IO;
    return st;
}

/* ------------------------------------------------------------------ main */

/* The example's own error message, for errors libdsm did not report. */
static char message[512];

#define CHECK(call)                                                                              \
    do {                                                                                         \
        dsm_status_t st_ = (call);                                                               \
        if (st_ != DSM_SUCCESS) {                                                                \
            fprintf(stderr, "rank %d: %s: %s\n", rank, dsm_status_string(st_),                  \
                    message[0] ? message : dsm_last_error());                                    \
            goto done;                                                                           \
        }                                                                                        \
    } while (0)

/* A decision every rank must take alike (allocation, file checks). */
#define AGREE(ok_)                                                                               \
    do {                                                                                         \
        int all_;                                                                                \
        MPI_Allreduce(&(ok_), &all_, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);                       \
        if (!all_) {                                                                             \
            if (!(ok_)) fprintf(stderr, "rank %d: %s\n", rank, message[0] ? message : "out of memory"); \
            goto done;                                                                           \
        }                                                                                        \
    } while (0)

/* The client state of a checkpoint: what the engine does not know. */
struct client_state {
    double initial_loss;
    int64_t samples; /* the sampler position after the checkpoint's last micro-batch */
};

/* One of the engine's timers from its description ("timers_seconds"). */
static double engine_timer(const char *json, const char *name) {
    const char *t = strstr(json, "\"timers_seconds\"");
    char key[64];
    snprintf(key, sizeof key, "\"%s\":", name);
    const char *k = t ? strstr(t, key) : NULL;
    return k ? atof(k + strlen(key)) : 0.0;
}

int main(int argc, char **argv) {
    int provided, rank = 0, world = 1;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);

    struct options o;
    if (!parse_options(argc, argv, &o)) { /* the same arguments everywhere: every rank stops */
        if (rank == 0)
            fprintf(stderr, "usage: %s --data SHARD.bin [CONFIG.json] [--preset tiny|small|gpt2] [--layers L] "
                            "[--heads H] [--width C] [--ctx T] [--vocab V] [--steps N] [--print-every K] "
                            "[--no-shuffle] [--init W.safetensors] [--checkpoint DIR [--save-every K]] "
                            "[--target-loss X] [--peak-tflops F] [--dump-grads FILE] [--describe] "
                            "[--device host|cuda] [--loss-csv FILE] [--sample N [--prompt TEXT] [--temperature X]]\n",
                    argv[0]);
        MPI_Finalize();
        return 1;
    }

    int exit_code = 1, ok = 1;
    struct model m;
    memset(&m, 0, sizeof m);
    struct shard data;
    memset(&data, 0, sizeof data);
    dsm_sampler_t sampler = NULL;
    dsm_param_desc_t *params = NULL;
    char (*names)[64] = NULL;
    int64_t (*shapes)[2] = NULL;
    double *history = NULL;
    char *desc = NULL, *text = NULL;
    FILE *csv = NULL;
#if GPT_WITH_CUDA
    gpt_device_t gpu = NULL;
#endif

    GPTConfig *c = &m.c;
    c->max_seq_len = o.p.ctx, c->vocab_size = o.p.vocab, c->num_layers = o.p.layers;
    c->num_heads = o.p.heads, c->channels = o.p.width;
    c->padded_vocab_size = (o.p.vocab + 63) / 64 * 64;
    m.T = o.p.ctx;

    /* The data, on every rank (mapped: the pages are shared). */
    ok = shard_open(o.data, c->vocab_size, &data, message, sizeof message);
    AGREE(ok);
    const int64_t num_samples = data.ntok / m.T;
    if (num_samples < 1) snprintf(message, sizeof message, "%s: %lld tokens, fewer than one sequence of %d",
                                  o.data, (long long)data.ntok, m.T), ok = 0;
    AGREE(ok);

    /* The parameters, named as in GPT-2 checkpoints. LayerNorms and biases
     * take no weight decay. */
    const int np = gpt_num_params(c);
    params = calloc((size_t)np, sizeof *params), names = calloc((size_t)np, sizeof *names);
    shapes = calloc((size_t)np, sizeof *shapes);
    history = calloc((size_t)o.steps, sizeof *history);
    if (!params || !names || !shapes || !history) ok = 0;
    AGREE(ok);
    for (int i = 0; i < np; ++i) {
        dsm_param_desc_t *p = &params[i];
        gpt_param_info(c, i, names[i], sizeof names[i], &p->ndims, shapes[i]);
        p->name = names[i], p->shape = shapes[i], p->dtype = DSM_FLOAT32, p->trainable = 1;
        p->no_weight_decay = p->ndims == 1;
        p->init_fn = init_param, p->init_user_data = c;
    }

    /* The mesh the configuration describes; the model runs on the CPU, so a
     * host engine, GPUs or not. */
    dsm_engine_options_t eopt = DSM_ENGINE_OPTIONS_INITIALIZER;
    eopt.device = DSM_DEVICE_HOST;
    if (o.cuda) { /* every rank needs a GPU; without one, the run is skipped (77) */
        int have = 0;
#if GPT_WITH_CUDA
        have = gpt_device_available(message, sizeof message) == DSM_SUCCESS;
#else
        snprintf(message, sizeof message, "this build has no CUDA kernels (configure found no nvcc)");
#endif
        int all;
        MPI_Allreduce(&have, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        if (!all) {
            if (!have) printf("train_gpt: --device cuda skipped on rank %d: %s\n", rank, message);
            exit_code = 77;
            goto done;
        }
        eopt.device = DSM_DEVICE_CUDA;
        if (o.dump_grads) {
            snprintf(message, sizeof message, "--dump-grads works on the host path only");
            CHECK(DSM_ERR_INVALID_ARGUMENT);
        }
    }
    dsm_mesh_t job_mesh = NULL, mesh;
    CHECK(dsm_mesh_create_for_config(MPI_COMM_WORLD, o.config, &job_mesh));
    const dsm_status_t init_st = dsm_engine_init_with_options(job_mesh, o.config, params, np, &eopt, &m.engine);
    dsm_mesh_free(&job_mesh);
    CHECK(init_st);
    CHECK(dsm_engine_dtype(m.engine, &m.dtype));
    CHECK(dsm_engine_borrow_mesh(m.engine, &mesh));
    int ndims, dp_size = 1;
    CHECK(dsm_mesh_ndims(mesh, &ndims));
    CHECK(dsm_mesh_size(mesh, "data_parallel", &dp_size));
    m.P = 1;
    if (ndims == 2) { /* data_parallel x sequence_parallel */
        CHECK(dsm_sp_create(mesh, NULL, &m.sp));
        CHECK(dsm_sp_size(m.sp, &m.P));
        CHECK(dsm_sp_rank(m.sp, &m.sp_rank));
    }
    if (o.cuda && m.P != 1) {
        if (rank == 0) fprintf(stderr, "train_gpt: --device cuda runs without sequence parallelism\n");
        goto done;
    }
    if (m.T % m.P != 0 || c->num_heads % m.P != 0) {
        if (rank == 0)
            fprintf(stderr, "train_gpt: sequence parallelism %d must divide the context %d and the heads %d\n",
                    m.P, m.T, c->num_heads);
        goto done;
    }
    m.Tl = m.T / m.P;
    m.Hp = c->num_heads / m.P, m.hf = m.sp_rank * m.Hp;

    int64_t train_batch, micro_batch, accumulation;
    CHECK(dsm_engine_batch(m.engine, &train_batch, &micro_batch, &accumulation, NULL));
    m.B = (int)micro_batch;
    m.N = m.B * m.Tl;
    CHECK(model_alloc(&m, !o.cuda, &ok));
    AGREE(ok);
#if GPT_WITH_CUDA
    if (o.cuda) CHECK(gpt_device_create(m.engine, c, m.B, m.T, &m.t_dsm, message, sizeof message, &gpu));
#endif

    /* Initial weights from a file (e.g. the PyTorch reference's), by name. */
    if (o.init) CHECK(dsm_engine_load_weights(m.engine, o.init, 0));

    /* MFU: the FLOPs of a sample (a sequence of T tokens), forward and
     * backward: 6 N + 12 L C T per token (the PaLM paper's count, N the
     * parameters, attention's full square), and the peak of one rank. */
    const double flops_per_sample = (6.0 * (double)gpt_total_params(c) +
                                     12.0 * c->num_layers * (double)c->channels * m.T) * m.T;
    CHECK(dsm_engine_set_flops(m.engine, flops_per_sample, o.peak_tflops * 1e12));

    /* The data-parallel sampler over the shard's sequences: the ranks of an
     * SP group get the same sequences, and each keeps its chunk. */
    dsm_sampler_options_t sopt = DSM_SAMPLER_OPTIONS_INITIALIZER;
    sopt.shuffle = o.shuffle, sopt.seed = 1234;
    CHECK(dsm_sampler_create_for_engine(m.engine, num_samples, &sopt, &sampler));

    if (rank == 0)
        printf("train_gpt: %d layers, %d heads, width %d, context %d, vocabulary %d (%d padded): %lld "
               "parameters; %d ranks (data parallel %d x sequence parallel %d), %s compute; global batch "
               "%lld = %lld per rank x %lld accumulation x %d; %lld sequences in %s\n",
               c->num_layers, c->num_heads, c->channels, m.T, c->vocab_size, c->padded_vocab_size,
               (long long)gpt_total_params(c), world, dp_size, m.P, dsm_dtype_name(m.dtype),
               (long long)train_batch, (long long)micro_batch, (long long)accumulation, dp_size,
               (long long)num_samples, o.data);

    /* Resume from DIR/latest when there is one: the engine's state, and the
     * sampler's position (valid at any number of ranks) from the client state. */
    struct client_state cs = {-1.0, 0};
    dsm_step_info_t info = DSM_STEP_INFO_INITIALIZER;
    long first = 0;
    int64_t epoch = 0, batch = 0, epoch_batches;
    if (o.ckpt_dir) {
        char latest[4096];
        snprintf(latest, sizeof latest, "%s/latest", o.ckpt_dir);
        FILE *f = rank == 0 ? fopen(latest, "r") : NULL;
        int resume = f != NULL;
        if (f) fclose(f);
        MPI_Bcast(&resume, 1, MPI_INT, 0, MPI_COMM_WORLD);
        if (resume) {
            void *blob = NULL;
            size_t size = 0;
            CHECK(dsm_engine_load_checkpoint(m.engine, o.ckpt_dir, NULL, 0, &blob, &size));
            if (size == sizeof cs) memcpy(&cs, blob, sizeof cs);
            dsm_free(blob);
            CHECK(dsm_engine_step_info(m.engine, &info));
            CHECK(dsm_sampler_resume(sampler, cs.samples, &epoch));
            first = (long)info.global_steps;
            if (rank == 0) printf("resumed from %s at step %ld\n", latest, first);
        }
    }
    CHECK(dsm_sampler_epoch_batches(sampler, epoch, &epoch_batches));

    if (o.loss_csv && rank == 0) {
        csv = fopen(o.loss_csv, first > 0 ? "a" : "w");
        if (!csv) snprintf(message, sizeof message, "cannot write the loss curve to %s", o.loss_csv), ok = 0;
        else if (first == 0) fprintf(csv, "step,loss,lr,grad_norm,ms,tokens_per_s\n");
    }
    AGREE(ok);
    if ((o.sample > 0 && (m.P != 1 || o.cuda)) && rank == 0)
        printf("train_gpt: --sample runs on the host path without sequence parallelism: no sample in this run\n");
    const long print_every = o.print_every > 0 ? o.print_every : o.steps >= 20 ? o.steps / 10 : 1;
    double t_loop = 0.0, t_dsm0 = 0.0, t_timed = 0.0;
    long timed_steps = 0;
    MPI_Barrier(MPI_COMM_WORLD);
    for (long step = first; step < o.steps; ++step) {
        const double t0 = MPI_Wtime(), dsm0 = m.t_dsm;
        double window = 0.0; /* the SP group's mean loss, summed over the window */
        for (int64_t mi = 0; mi < accumulation; ++mi) {
            /* The next micro-batch of sequences, and this rank's chunk of
             * each: tokens, positions, labels shifted by one. */
            int64_t count, chunk, valid;
            CHECK(dsm_sampler_batch(sampler, epoch, batch, m.idx, (size_t)m.B, &count));
            if (count != m.B) { /* a short last micro-batch: repeat its first sequences */
                for (int64_t i = count; i < m.B; ++i) m.idx[i] = m.idx[i % count];
            }
            for (int i = 0; i < m.B; ++i)
                for (int t = 0; t < m.T; ++t) m.seqs[(size_t)i * m.T + t] = data.tokens[m.idx[i] * m.T + t];
            CHECK(dsm_sp_shard_batch(m.P, m.sp_rank, m.B, m.T, m.seqs, NULL, NULL, 0, (size_t)m.N, m.tok, m.pos,
                                     m.lab, &chunk, &valid));
            cs.samples = 0;
            CHECK(dsm_sampler_position(sampler, epoch, batch, &cs.samples));
            if (++batch == epoch_batches) {
                ++epoch, batch = 0;
                CHECK(dsm_sampler_epoch_batches(sampler, epoch, &epoch_batches));
            }

            double loss_sum, mean, scale, loss_scale;
            int64_t tokens;
            CHECK(dsm_engine_loss_scale(m.engine, &loss_scale));
#if GPT_WITH_CUDA
            if (gpu) { /* P = 1: the scale is known before the forward, which fuses it */
                CHECK(gpt_device_forward(gpu, m.tok, m.pos, m.lab, valid ? (float)(loss_scale / (double)valid) : 0.0f,
                                         &loss_sum, &tokens));
                mean = tokens ? loss_sum / (double)tokens : 0.0;
                CHECK(dsm_engine_log_loss(m.engine, mean));
                CHECK(gpt_device_backward(gpu));
                CHECK(DSM(&m, dsm_step(m.engine, &info)));
                window += mean;
                continue;
            }
#endif
            CHECK(forward(&m, &loss_sum, &tokens));
            /* The token-weighted loss over the SP group, and the scale that
             * makes the engine's sum over the group the mean's gradient. */
            if (m.sp) {
                CHECK(DSM(&m, dsm_sp_loss(m.sp, loss_sum, tokens, &mean, &scale)));
            } else {
                mean = tokens ? loss_sum / (double)tokens : 0.0, scale = tokens ? 1.0 / (double)tokens : 0.0;
            }
            CHECK(dsm_engine_log_loss(m.engine, mean));
            CHECK(backward(&m, (float)(scale * loss_scale)));
            if (o.dump_grads) {
                int stage_ok = world == 1 && accumulation == 1;
                if (!stage_ok) {
                    snprintf(message, sizeof message, "--dump-grads needs 1 rank and no gradient accumulation");
                    CHECK(DSM_ERR_INVALID_ARGUMENT);
                }
                CHECK(dump_grads(&m, o.dump_grads, mean, message, sizeof message));
                printf("loss %.9f; gradients written to %s\n", mean, o.dump_grads);
                exit_code = 0;
                goto done;
            }
            CHECK(DSM(&m, dsm_step(m.engine, &info)));
            window += mean;
        }
        if (!info.boundary) {
            if (rank == 0) fprintf(stderr, "train_gpt: step %ld did not end at a boundary\n", step);
            goto done;
        }
        const double dt = MPI_Wtime() - t0;
        /* The loss of the global batch: the mean over micro-steps and ranks
         * (the ranks of an SP group hold the same value). */
        double sum, loss = window / (double)accumulation;
        MPI_Allreduce(&loss, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        history[step] = sum / world;
        if (!isfinite(history[step])) { /* every rank has the same sum: all stop here, before a save */
            if (rank == 0)
                fprintf(stderr, "train_gpt: the loss is %s at step %lld (lr %.3e, grad_norm %g, loss_scale %g): "
                                "training diverged; stopping without saving\n",
                        isnan(history[step]) ? "NaN" : "infinite", (long long)info.global_steps, info.lr,
                        info.grad_norm, info.loss_scale);
            exit_code = 4;
            goto done;
        }
        if (cs.initial_loss < 0) cs.initial_loss = history[step];
        if (step >= first + 2) { /* the first two steps warm up (page faults, ZeRO-3's recorded order) */
            t_loop += dt, t_dsm0 += m.t_dsm - dsm0, ++timed_steps;
        }
        t_timed += dt;
        if (csv) {
            fprintf(csv, "%lld,%.6f,%.6e,%.6f,%.3f,%.1f\n", (long long)info.global_steps, history[step], info.lr,
                    info.grad_norm, dt * 1e3, (double)train_batch * m.T / dt);
            fflush(csv);
        }
        if (rank == 0 && (step % print_every == 0 || step == o.steps - 1))
            printf("step %5lld  loss %.6f  lr %.3e  grad_norm %.6f  loss_scale %g  %.1f ms  %.0f tokens/s\n",
                   (long long)info.global_steps, history[step], info.lr, info.grad_norm, info.loss_scale,
                   dt * 1e3, (double)train_batch * m.T / dt);
        int stop = 0;
        CHECK(dsm_engine_stop_requested(m.engine, &stop));
        if (o.ckpt_dir && ((step + 1) % o.save_every == 0 || step == o.steps - 1 || stop)) {
            CHECK(dsm_engine_save_checkpoint(m.engine, o.ckpt_dir, NULL, &cs, sizeof cs));
            if (rank == 0) printf("saved a checkpoint of step %lld in %s\n", (long long)info.global_steps, o.ckpt_dir);
        }
        if (stop && step < o.steps - 1) {
            if (rank == 0)
                printf("train_gpt: stopped on the stop signal after step %lld%s\n", (long long)info.global_steps,
                       o.ckpt_dir ? " (checkpoint saved)" : " (no --checkpoint: nothing saved)");
            exit_code = 3;
            goto done;
        }
    }
    if (first >= o.steps) {
        if (rank == 0) printf("train_gpt: the checkpoint is at step %ld already; nothing to do\n", first);
        exit_code = 0;
        goto done;
    }

    const long last = o.steps - first < FINAL_WINDOW ? o.steps - first : FINAL_WINDOW;
    double final_loss = 0.0;
    for (long s = o.steps - last; s < o.steps; ++s) final_loss += history[s];
    final_loss /= (double)last;

    /* The figures: tokens/s of the job, the model's FLOP/s per rank and MFU,
     * and libdsm's share of the step (rank 0's time inside its calls; the
     * engine's own timers beside it). Steps after the first two. */
    CHECK(dsm_engine_describe(m.engine, DSM_FORMAT_JSON, &desc));
    double t_max;
    MPI_Allreduce(&t_loop, &t_max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0) {
        printf("final loss %.6f (initial %.6f)\n", final_loss, cs.initial_loss);
        if (timed_steps > 0 && t_max > 0) {
            const double tps = (double)timed_steps * train_batch * m.T / t_max;
            const double flops = (double)timed_steps * train_batch * flops_per_sample / t_max / world;
            printf("figures: %.1f tokens/s over %ld steps; %.3f GFLOP/s per rank", tps, timed_steps, flops / 1e9);
            if (o.peak_tflops > 0) printf(", MFU %.1f%% of %.3f TFLOP/s", 100.0 * flops / (o.peak_tflops * 1e12),
                                          o.peak_tflops);
            printf("\nlibdsm share: %.2f%% of the step in libdsm calls (acquire, release, gradients, dsm_step, "
                   "SP transforms); engine timers over the run: reduce %.4f s, optimizer %.4f s, gather %.4f s "
                   "of %.3f s (%.2f%%)\n",
                   100.0 * t_dsm0 / t_loop, engine_timer(desc, "reduce"), engine_timer(desc, "optimizer"),
                   engine_timer(desc, "gather"), t_timed,
                   100.0 * (engine_timer(desc, "reduce") + engine_timer(desc, "optimizer") +
                            engine_timer(desc, "gather")) / t_timed);
        }
    }
    dsm_free(desc), desc = NULL;
    if (o.sample > 0 && m.P == 1 && !o.cuda) {
        text = malloc((size_t)o.sample + 1);
        ok = text != NULL;
        AGREE(ok);
        CHECK(generate(&m, o.prompt, o.sample, o.temperature, text));
        if (rank == 0) {
            printf("sample: %ld tokens after the prompt, temperature %g:\n%s", o.sample, o.temperature, o.prompt);
            for (long i = 0; i < o.sample; ++i) /* control bytes shown as '?' */
                putchar((unsigned char)text[i] < 32 && text[i] != '\n' && text[i] != '\t' ? '?' : text[i]);
            printf("\n");
        }
    }
    if (o.describe) {
        CHECK(dsm_engine_describe(m.engine, DSM_FORMAT_TEXT, &desc));
        if (rank == 0) fputs(desc, stdout);
        dsm_free(desc), desc = NULL;
    }
    exit_code = 0;
    if (o.target_loss >= 0 && !(final_loss <= o.target_loss)) {
        if (rank == 0) printf("train_gpt: final loss %.6f is above the target %g\n", final_loss, o.target_loss);
        exit_code = 2;
    }

done:
    dsm_free(desc);
    free(text);
    if (csv) fclose(csv);
#if GPT_WITH_CUDA
    gpt_device_free(&gpu);
#endif
    model_free(&m);
    dsm_sp_free(&m.sp);
    dsm_sampler_free(&sampler);
    if (dsm_engine_free(&m.engine) != DSM_SUCCESS) {
        fprintf(stderr, "rank %d: dsm_engine_free failed: %s\n", rank, dsm_last_error());
        exit_code = 1;
    }
    shard_close(&data);
    free(params), free(names), free(shapes), free(history);
    fflush(stdout);
    MPI_Finalize();
    return exit_code;
}
