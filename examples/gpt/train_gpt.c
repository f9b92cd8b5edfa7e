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
 * (OpenMP + CBLAS) and, for the GPU, in cuda/; one walk over the model
 * (gpt_walk.c) drives either with libdsm, the way a program of its own
 * would. The files, top down:
 *
 *   train_gpt.c   options, the parameters, the training loop (this file)
 *   gpt_data.c    the token shard and the sampler's micro-batches
 *   gpt_walk.c    the model walk: acquire, compute, release, on every rank alike
 *   gpt_model.c   the host's operations table, sequence parallelism, sampling
 *   gpt_device.c  the CUDA operations table (--device cuda)
 *   gpt_ops.c     the forward and backward of each operation (gpt.h)
 *
 * What libdsm does here:
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

#include <mpi.h>

#include "counter_rng.h"
#include "dsm.h"
#include "gpt.h"
#include "gpt_data.h"
#include "gpt_model.h"
#include "gpt_walk.h"
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

/* ------------------------------------------------------------ initial weights */

/* GPT-2's initialization: weights N(0, 0.02), the residual projections
 * (c_proj) N(0, 0.02 / sqrt(2 L)), LayerNorm weights 1, biases 0; from the
 * counter-based generator, so each rank fills only what it stores under
 * ZeRO-3. */
static int init_param(void *user_data, int index, const char *name, int64_t offset, int64_t count,
                      float *values) {
    const GPTConfig *c = user_data;
    const size_t len = strlen(name);
    int is_weight = len > 7 && strcmp(name + len - 7, ".weight") == 0;
    const int is_ln = strstr(name, "ln_") != NULL;
    double std = 0.02;
    if (strstr(name, "c_proj.weight")) std = 0.02 / sqrt(2.0 * c->num_layers);
    for (int64_t k = 0; k < count; ++k)
        values[k] = !is_weight ? 0.0f
                    : is_ln    ? 1.0f
                               : (float)(std * rng_gauss(SEED_INIT + (uint64_t)index, (uint64_t)(offset + k)));
    return 0;
}

/* ------------------------------------------------------------ a run */

/* The client state of a checkpoint: what the engine does not know. */
struct client_state {
    double initial_loss;
    int64_t samples; /* the sampler position after the checkpoint's last micro-batch */
};

/* Everything a run holds; run_free() releases it whatever happened. */
struct run {
    struct options o;
    int rank, world;
    char message[512]; /* the example's own error message, for errors libdsm did not report */
    struct gpt_model m;
    struct gpt_shard data;
    struct gpt_loader loader;
    dsm_sampler_t sampler;
    dsm_param_desc_t *params;
    char (*names)[64];
    int64_t (*shapes)[2];
    double *history; /* the loss of each step */
    FILE *csv;
#if GPT_WITH_CUDA
    gpt_device_t gpu;
#endif
    int dp_size;
    int64_t train_batch, micro_batch, accumulation;
    double flops_per_sample;
    struct client_state cs;
    long first; /* the first step of this run (after a resume) */
    double t_loop, t_dsm, t_timed; /* timed steps: the loop, inside libdsm; every step */
    long timed_steps;
};

/* An error: every rank that has one says so; the run ends with 1. */
static int fail(struct run *r, dsm_status_t st) {
    fprintf(stderr, "rank %d: %s: %s\n", r->rank, dsm_status_string(st),
            r->message[0] ? r->message : dsm_last_error());
    return 1;
}
#define TRY(call)                                                                                \
    do {                                                                                         \
        dsm_status_t st_ = (call);                                                               \
        if (st_ != DSM_SUCCESS) return fail(r, st_);                                             \
    } while (0)

/* A decision every rank takes alike (allocation, file checks): 1 when every
 * rank is ok, else 0 and the ranks that are not say why. */
static int agree(struct run *r, int ok) {
    int all;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all && !ok) fprintf(stderr, "rank %d: %s\n", r->rank, r->message[0] ? r->message : "out of memory");
    return all;
}
#define AGREE(ok)                                                                                \
    do {                                                                                         \
        if (!agree(r, (ok))) return 1;                                                           \
    } while (0)

/* The data, the engine over the parameters, the mesh's sequence parallelism,
 * the buffers, the sampler, a resume: 0, or the exit status. */
static int setup(struct run *r) {
    const struct options *o = &r->o;
    struct gpt_model *m = &r->m;
    GPTConfig *c = &m->c;
    c->max_seq_len = o->p.ctx, c->vocab_size = o->p.vocab, c->num_layers = o->p.layers;
    c->num_heads = o->p.heads, c->channels = o->p.width;
    c->padded_vocab_size = (o->p.vocab + 63) / 64 * 64;
    m->T = o->p.ctx;

    /* The data, on every rank (mapped: the pages are shared). */
    AGREE(gpt_shard_open(o->data, c->vocab_size, &r->data, r->message, sizeof r->message));
    const int64_t num_samples = r->data.ntok / m->T;
    if (num_samples < 1)
        snprintf(r->message, sizeof r->message, "%s: %lld tokens, fewer than one sequence of %d", o->data,
                 (long long)r->data.ntok, m->T);
    AGREE(num_samples >= 1);

    /* The parameters, named as in GPT-2 checkpoints. LayerNorms and biases
     * take no weight decay. */
    const int np = gpt_num_params(c);
    r->params = calloc((size_t)np, sizeof *r->params), r->names = calloc((size_t)np, sizeof *r->names);
    r->shapes = calloc((size_t)np, sizeof *r->shapes);
    r->history = calloc((size_t)o->steps, sizeof *r->history);
    AGREE(r->params && r->names && r->shapes && r->history);
    for (int i = 0; i < np; ++i) {
        dsm_param_desc_t *p = &r->params[i];
        gpt_param_info(c, i, r->names[i], sizeof r->names[i], &p->ndims, r->shapes[i]);
        p->name = r->names[i], p->shape = r->shapes[i], p->dtype = DSM_FLOAT32, p->trainable = 1;
        p->no_weight_decay = p->ndims == 1;
        p->init_fn = init_param, p->init_user_data = c;
    }

    /* The mesh the configuration describes; the model runs on the CPU, so a
     * host engine, GPUs or not, unless --device cuda. */
    dsm_engine_options_t eopt = DSM_ENGINE_OPTIONS_INITIALIZER;
    eopt.device = DSM_DEVICE_HOST;
    if (o->cuda) { /* every rank needs a GPU; without one, the run is skipped (77) */
        int have = 0;
#if GPT_WITH_CUDA
        have = gpt_device_available(r->message, sizeof r->message) == DSM_SUCCESS;
#else
        snprintf(r->message, sizeof r->message, "this build has no CUDA kernels (configure found no nvcc)");
#endif
        int all;
        MPI_Allreduce(&have, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        if (!all) {
            if (!have) printf("train_gpt: --device cuda skipped on rank %d: %s\n", r->rank, r->message);
            return 77;
        }
        eopt.device = DSM_DEVICE_CUDA;
        if (o->dump_grads) {
            snprintf(r->message, sizeof r->message, "--dump-grads works on the host path only");
            return fail(r, DSM_ERR_INVALID_ARGUMENT);
        }
    }
    dsm_engine_t engine = NULL;
    TRY(dsm_engine_init_comm_with_options(MPI_COMM_WORLD, o->config, r->params, np, &eopt, &engine));
    TRY(gpt_walk_init(&m->walk, engine, c));
    dsm_mesh_t mesh;
    int ndims;
    TRY(dsm_engine_borrow_mesh(engine, &mesh));
    TRY(dsm_mesh_ndims(mesh, &ndims));
    TRY(dsm_mesh_size(mesh, "data_parallel", &r->dp_size));
    m->P = 1;
    if (ndims == 2) { /* data_parallel x sequence_parallel */
        TRY(dsm_sp_create(mesh, NULL, &m->sp));
        TRY(dsm_sp_size(m->sp, &m->P));
        TRY(dsm_sp_rank(m->sp, &m->sp_rank));
    }
    if (o->cuda && m->P != 1) {
        if (r->rank == 0) fprintf(stderr, "train_gpt: --device cuda runs without sequence parallelism\n");
        return 1;
    }
    if (m->T % m->P != 0 || c->num_heads % m->P != 0) {
        if (r->rank == 0)
            fprintf(stderr, "train_gpt: sequence parallelism %d must divide the context %d and the heads %d\n",
                    m->P, m->T, c->num_heads);
        return 1;
    }
    m->Tl = m->T / m->P;
    m->Hp = c->num_heads / m->P, m->hf = m->sp_rank * m->Hp;

    TRY(dsm_engine_batch(engine, &r->train_batch, &r->micro_batch, &r->accumulation, NULL));
    m->B = (int)r->micro_batch;
    m->N = m->B * m->Tl;
    int ok = 1;
    TRY(gpt_model_alloc(m, !o->cuda, &ok));
    AGREE(ok);
#if GPT_WITH_CUDA
    if (o->cuda) TRY(gpt_device_create(&m->walk, m->B, m->T, r->message, sizeof r->message, &r->gpu));
#endif

    /* Initial weights from a file (e.g. the PyTorch reference's), by name. */
    if (o->init) TRY(dsm_engine_load_weights(engine, o->init, 0));

    /* MFU: the FLOPs of a sample (a sequence of T tokens), forward and
     * backward: 6 N + 12 L C T per token (the PaLM paper's count, N the
     * parameters, attention's full square), and the peak of one rank. */
    r->flops_per_sample = (6.0 * (double)gpt_total_params(c) + 12.0 * c->num_layers * (double)c->channels * m->T) *
                          m->T;
    TRY(dsm_engine_set_flops(engine, r->flops_per_sample, o->peak_tflops * 1e12));

    /* The data-parallel sampler over the shard's sequences: the ranks of an
     * SP group get the same sequences, and each keeps its chunk. */
    dsm_sampler_options_t sopt = DSM_SAMPLER_OPTIONS_INITIALIZER;
    sopt.shuffle = o->shuffle, sopt.seed = 1234;
    TRY(dsm_sampler_create_for_engine(engine, num_samples, &sopt, &r->sampler));

    if (r->rank == 0)
        printf("train_gpt: %d layers, %d heads, width %d, context %d, vocabulary %d (%d padded): %lld "
               "parameters; %d ranks (data parallel %d x sequence parallel %d), %s compute; global batch "
               "%lld = %lld per rank x %lld accumulation x %d; %lld sequences in %s\n",
               c->num_layers, c->num_heads, c->channels, m->T, c->vocab_size, c->padded_vocab_size,
               (long long)gpt_total_params(c), r->world, r->dp_size, m->P, dsm_dtype_name(m->walk.dtype),
               (long long)r->train_batch, (long long)r->micro_batch, (long long)r->accumulation, r->dp_size,
               (long long)num_samples, o->data);

    /* Resume from DIR/latest when there is one: the engine's state, and the
     * sampler's position (valid at any number of ranks) from the client state. */
    r->cs.initial_loss = -1.0, r->cs.samples = 0;
    int resumed = 0;
    if (o->ckpt_dir) {
        void *blob = NULL;
        size_t size = 0;
        TRY(dsm_engine_resume(engine, o->ckpt_dir, 0, &resumed, &blob, &size));
        if (resumed && size == sizeof r->cs) memcpy(&r->cs, blob, sizeof r->cs);
        dsm_free(blob);
    }
    if (resumed) {
        dsm_step_info_t info = DSM_STEP_INFO_INITIALIZER;
        TRY(dsm_engine_step_info(engine, &info));
        r->first = (long)info.global_steps;
        if (r->rank == 0) printf("resumed from %s/latest at step %ld\n", o->ckpt_dir, r->first);
    }
    TRY(gpt_loader_start(&r->loader, &r->data, r->sampler, resumed ? r->cs.samples : -1));

    ok = 1;
    if (o->loss_csv && r->rank == 0) {
        r->csv = fopen(o->loss_csv, r->first > 0 ? "a" : "w");
        if (!r->csv) snprintf(r->message, sizeof r->message, "cannot write the loss curve to %s", o->loss_csv), ok = 0;
        else if (r->first == 0) fprintf(r->csv, "step,loss,lr,grad_norm,ms,tokens_per_s\n");
    }
    AGREE(ok);
    if (o->sample > 0 && (m->P != 1 || o->cuda) && r->rank == 0)
        printf("train_gpt: --sample runs on the host path without sequence parallelism: no sample in this run\n");
    return 0;
}

/* One micro-step: the next micro-batch, forward, backward, dsm_step(); its
 * mean loss (over the SP group) in *mean. 0, or the exit status (--dump-grads
 * ends the run after the first). */
static int micro_step(struct run *r, dsm_step_info_t *info, double *mean) {
    struct gpt_model *m = &r->m;
    dsm_engine_t engine = m->walk.engine;
    int64_t valid, tokens;
    double loss_sum, scale, loss_scale;
    TRY(gpt_loader_next(&r->loader, m->B, m->T, m->P, m->sp_rank, m->idx, m->seqs, (size_t)m->N, m->tok, m->pos,
                        m->lab, &valid, &r->cs.samples));
    TRY(dsm_engine_loss_scale(engine, &loss_scale));
#if GPT_WITH_CUDA
    if (r->gpu) { /* P = 1: the scale is known before the forward, which fuses it */
        TRY(gpt_device_forward(r->gpu, m->tok, m->pos, m->lab, valid ? (float)(loss_scale / (double)valid) : 0.0f,
                               &loss_sum, &tokens));
        *mean = tokens ? loss_sum / (double)tokens : 0.0;
        TRY(dsm_engine_log_loss(engine, *mean));
        TRY(gpt_device_backward(r->gpu));
        TRY(DSM_TIMED(&m->walk.dsm, dsm_step(engine, info)));
        return 0;
    }
#endif
    TRY(gpt_model_forward(m, &loss_sum, &tokens));
    /* The token-weighted loss over the SP group, and the scale that makes
     * the engine's sum over the group the mean's gradient. */
    if (m->sp) {
        TRY(DSM_TIMED(&m->walk.dsm, dsm_sp_loss(m->sp, loss_sum, tokens, mean, &scale)));
    } else {
        *mean = tokens ? loss_sum / (double)tokens : 0.0, scale = tokens ? 1.0 / (double)tokens : 0.0;
    }
    TRY(dsm_engine_log_loss(engine, *mean));
    TRY(gpt_model_backward(m, (float)(scale * loss_scale)));
    if (r->o.dump_grads) {
        if (r->world != 1 || r->accumulation != 1) {
            snprintf(r->message, sizeof r->message, "--dump-grads needs 1 rank and no gradient accumulation");
            return fail(r, DSM_ERR_INVALID_ARGUMENT);
        }
        TRY(gpt_dump_grads(m, r->o.dump_grads, *mean, r->message, sizeof r->message));
        printf("loss %.9f; gradients written to %s\n", *mean, r->o.dump_grads);
        return -1;
    }
    TRY(DSM_TIMED(&m->walk.dsm, dsm_step(engine, info)));
    return 0;
}

/* The training loop: 0, or the exit status. */
static int train(struct run *r) {
    const struct options *o = &r->o;
    struct gpt_model *m = &r->m;
    dsm_engine_t engine = m->walk.engine;
    dsm_step_info_t info = DSM_STEP_INFO_INITIALIZER;
    const long print_every = o->print_every > 0 ? o->print_every : o->steps >= 20 ? o->steps / 10 : 1;
    MPI_Barrier(MPI_COMM_WORLD);
    for (long step = r->first; step < o->steps; ++step) {
        const double t0 = MPI_Wtime(), dsm0 = m->walk.dsm.total;
        double window = 0.0; /* the SP group's mean loss, summed over the window */
        for (int64_t mi = 0; mi < r->accumulation; ++mi) {
            double mean;
            const int code = micro_step(r, &info, &mean);
            if (code) return code < 0 ? 0 : code;
            window += mean;
        }
        if (!info.boundary) {
            if (r->rank == 0) fprintf(stderr, "train_gpt: step %ld did not end at a boundary\n", step);
            return 1;
        }
        const double dt = MPI_Wtime() - t0;
        /* The loss of the global batch: the mean over micro-steps and ranks
         * (the ranks of an SP group hold the same value). */
        TRY(dsm_engine_mean_loss(engine, window / (double)r->accumulation, 1.0, &r->history[step]));
        const double loss = r->history[step];
        if (!isfinite(loss)) { /* every rank has the same mean: all stop here, before a save */
            if (r->rank == 0)
                fprintf(stderr, "train_gpt: the loss is %s at step %lld (lr %.3e, grad_norm %g, loss_scale %g): "
                                "training diverged; stopping without saving\n",
                        isnan(loss) ? "NaN" : "infinite", (long long)info.global_steps, info.lr, info.grad_norm,
                        info.loss_scale);
            return 4;
        }
        if (r->cs.initial_loss < 0) r->cs.initial_loss = loss;
        if (step >= r->first + 2) { /* the first two steps warm up (page faults, ZeRO-3's recorded order) */
            r->t_loop += dt, r->t_dsm += m->walk.dsm.total - dsm0, ++r->timed_steps;
        }
        r->t_timed += dt;
        const double tps = (double)r->train_batch * m->T / dt;
        if (r->csv) {
            fprintf(r->csv, "%lld,%.6f,%.6e,%.6f,%.3f,%.1f\n", (long long)info.global_steps, loss, info.lr,
                    info.grad_norm, dt * 1e3, tps);
            fflush(r->csv);
        }
        if (r->rank == 0 && (step % print_every == 0 || step == o->steps - 1))
            printf("step %5lld  loss %.6f  lr %.3e  grad_norm %.6f  loss_scale %g  %.1f ms  %.0f tokens/s\n",
                   (long long)info.global_steps, loss, info.lr, info.grad_norm, info.loss_scale, dt * 1e3, tps);
        int stop = 0;
        TRY(dsm_engine_stop_requested(engine, &stop));
        if (o->ckpt_dir && ((step + 1) % o->save_every == 0 || step == o->steps - 1 || stop)) {
            TRY(dsm_engine_save_checkpoint(engine, o->ckpt_dir, NULL, &r->cs, sizeof r->cs));
            if (r->rank == 0)
                printf("saved a checkpoint of step %lld in %s\n", (long long)info.global_steps, o->ckpt_dir);
        }
        if (stop && step < o->steps - 1) {
            if (r->rank == 0)
                printf("train_gpt: stopped on the stop signal after step %lld%s\n", (long long)info.global_steps,
                       o->ckpt_dir ? " (checkpoint saved)" : " (no --checkpoint: nothing saved)");
            return 3;
        }
    }
    return 0;
}

/* One of the engine's timers from its description ("timers_seconds"). */
static double engine_timer(const char *json, const char *name) {
    const char *t = strstr(json, "\"timers_seconds\"");
    char key[64];
    snprintf(key, sizeof key, "\"%s\":", name);
    const char *k = t ? strstr(t, key) : NULL;
    return k ? atof(k + strlen(key)) : 0.0;
}

/* The end of a run: the final loss, the figures, the sample, the target. */
static int finish(struct run *r) {
    const struct options *o = &r->o;
    struct gpt_model *m = &r->m;
    dsm_engine_t engine = m->walk.engine;
    const long last = o->steps - r->first < FINAL_WINDOW ? o->steps - r->first : FINAL_WINDOW;
    double final_loss = 0.0;
    for (long s = o->steps - last; s < o->steps; ++s) final_loss += r->history[s];
    final_loss /= (double)last;

    /* The figures: tokens/s of the job, the model's FLOP/s per rank and MFU,
     * and libdsm's share of the step (rank 0's time inside its calls; the
     * engine's own timers beside it). Steps after the first two. */
    char *desc = NULL;
    TRY(dsm_engine_describe(engine, DSM_FORMAT_JSON, &desc));
    double t_max;
    MPI_Allreduce(&r->t_loop, &t_max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (r->rank == 0) {
        printf("final loss %.6f (initial %.6f)\n", final_loss, r->cs.initial_loss);
        if (r->timed_steps > 0 && t_max > 0) {
            const double steps = (double)r->timed_steps;
            const double tps = steps * r->train_batch * m->T / t_max;
            const double flops = steps * r->train_batch * r->flops_per_sample / t_max / r->world;
            printf("figures: %.1f tokens/s over %ld steps; %.3f GFLOP/s per rank", tps, r->timed_steps, flops / 1e9);
            if (o->peak_tflops > 0)
                printf(", MFU %.1f%% of %.3f TFLOP/s", 100.0 * flops / (o->peak_tflops * 1e12), o->peak_tflops);
            const double reduce = engine_timer(desc, "reduce"), optimizer = engine_timer(desc, "optimizer");
            const double gather = engine_timer(desc, "gather");
            printf("\nlibdsm share: %.2f%% of the step in libdsm calls (acquire, release, gradients, dsm_step, "
                   "SP transforms); engine timers over the run: reduce %.4f s, optimizer %.4f s, gather %.4f s "
                   "of %.3f s (%.2f%%)\n",
                   100.0 * r->t_dsm / r->t_loop, reduce, optimizer, gather, r->t_timed,
                   100.0 * (reduce + optimizer + gather) / r->t_timed);
        }
    }
    dsm_free(desc), desc = NULL;
    if (o->sample > 0 && m->P == 1 && !o->cuda) {
        char *text = malloc((size_t)o->sample + 1);
        AGREE(text != NULL);
        const dsm_status_t st = gpt_generate(m, o->prompt, o->sample, o->temperature, SEED_INIT + 7, text);
        if (st == DSM_SUCCESS && r->rank == 0) {
            printf("sample: %ld tokens after the prompt, temperature %g:\n%s", o->sample, o->temperature, o->prompt);
            for (long i = 0; i < o->sample; ++i) /* control bytes shown as '?' */
                putchar((unsigned char)text[i] < 32 && text[i] != '\n' && text[i] != '\t' ? '?' : text[i]);
            printf("\n");
        }
        free(text);
        TRY(st);
    }
    if (o->describe) {
        TRY(dsm_engine_describe(engine, DSM_FORMAT_TEXT, &desc));
        if (r->rank == 0) fputs(desc, stdout);
        dsm_free(desc);
    }
    if (o->target_loss >= 0 && !(final_loss <= o->target_loss)) {
        if (r->rank == 0) printf("train_gpt: final loss %.6f is above the target %g\n", final_loss, o->target_loss);
        return 2;
    }
    return 0;
}

/* setup, train, finish: the exit status. */
static int run(struct run *r) {
    int code = setup(r);
    if (code == 0) code = train(r);
    if (code != 0) return code;
    if (r->first >= r->o.steps) {
        if (r->rank == 0) printf("train_gpt: the checkpoint is at step %ld already; nothing to do\n", r->first);
        return 0;
    }
    if (r->o.dump_grads) return 0;
    return finish(r);
}

/* Releases what a run holds; 1 when freeing the engine failed. */
static int run_free(struct run *r) {
    int failed = 0;
    if (r->csv) fclose(r->csv);
#if GPT_WITH_CUDA
    gpt_device_free(&r->gpu);
#endif
    gpt_model_free(&r->m);
    dsm_sp_free(&r->m.sp);
    dsm_sampler_free(&r->sampler);
    if (dsm_engine_free(&r->m.walk.engine) != DSM_SUCCESS) {
        fprintf(stderr, "rank %d: dsm_engine_free failed: %s\n", r->rank, dsm_last_error());
        failed = 1;
    }
    gpt_walk_free(&r->m.walk);
    gpt_shard_close(&r->data);
    free(r->params), free(r->names), free(r->shapes), free(r->history);
    return failed;
}

int main(int argc, char **argv) {
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    static struct run r; /* zeroed */
    MPI_Comm_rank(MPI_COMM_WORLD, &r.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &r.world);
    if (!parse_options(argc, argv, &r.o)) { /* the same arguments everywhere: every rank stops */
        if (r.rank == 0)
            fprintf(stderr, "usage: %s --data SHARD.bin [CONFIG.json] [--preset tiny|small|gpt2] [--layers L] "
                            "[--heads H] [--width C] [--ctx T] [--vocab V] [--steps N] [--print-every K] "
                            "[--no-shuffle] [--init W.safetensors] [--checkpoint DIR [--save-every K]] "
                            "[--target-loss X] [--peak-tflops F] [--dump-grads FILE] [--describe] "
                            "[--device host|cuda] [--loss-csv FILE] [--sample N [--prompt TEXT] [--temperature X]]\n",
                    argv[0]);
        MPI_Finalize();
        return 1;
    }
    int code = run(&r);
    if (run_free(&r)) code = 1;
    fflush(stdout);
    MPI_Finalize();
    return code;
}
