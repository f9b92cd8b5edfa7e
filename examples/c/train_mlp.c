/*
 * train_mlp: train a multi-layer perceptron with the libdsm engine.
 *
 *   mpiexec -n 4 ./train_mlp [CONFIG.json] [--steps N] [--describe]
 *                            [--checkpoint DIR [--save-every K]]
 *
 * The model is 16 -> 64 (tanh) -> 64 (tanh) -> 4, with its forward and
 * backward pass written out in plain C. It learns a regression task made from
 * a fixed seed: the targets are the outputs of a fixed random "teacher"
 * network plus a little noise, on inputs drawn afresh for every sample. The
 * ZeRO stage, the precision, the optimizer and the learning-rate schedule
 * all come from the DeepSpeed configuration (default
 * examples/c/train_mlp.json, or inline JSON text starting with '{'); the
 * program is the same for every one of them.
 *
 * N is the number of optimizer steps (accumulation boundaries; default 200).
 * Rank 0 prints the loss of the global batch every few steps and at the end
 * "final loss X (initial Y)", where Y is the loss of the first global batch
 * (before any update) and X the mean over the last 10 steps (one batch is
 * noisy). With --describe it then prints the engine's description: ZeRO
 * stage, dtypes and the memory of each buffer on rank 0.
 *
 * With --checkpoint DIR it saves a checkpoint every K steps (default 50) and
 * at the end into DIR (DIR/global_step<N>.h5, DIR/latest), and, when DIR
 * already holds one, first resumes from the checkpoint DIR/latest names, on
 * any number of ranks: training goes on from that step up to step N with the
 * same samples it would have seen without the interruption.
 *
 * With DSM_STOP_SIGNAL set (e.g. DSM_STOP_SIGNAL=USR1), that signal, sent
 * to any rank, stops the training at the next step boundary: with
 * --checkpoint the program saves a checkpoint of that step first, then it
 * exits with status 3 (examples/slurm/dsm-job.sh requeues the job on it).
 *
 * Exit status: 0 when the loss fell by at least a factor of 5, 2 when it did
 * not, 3 when it stopped on the signal, 1 on an error (every rank reports
 * it: libdsm fails collective calls on every rank together).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "counter_rng.h"
#include "dsm.h"

/* ------------------------------------------------------------------ model */

#define NLAYERS 3
#define D_IN 16
#define D_OUT 4
#define MAX_WIDTH 64

/* widths[l] -> widths[l + 1] is layer l ("fc1" is layer 0). */
static const int widths[NLAYERS + 1] = {D_IN, 64, 64, D_OUT};

/* The teacher: 16 -> 32 (tanh) -> 4. */
#define T_HIDDEN 32

#define DEFAULT_CONFIG "examples/c/train_mlp.json"
#define DEFAULT_STEPS 200
#define REQUIRED_FACTOR 5.0 /* the loss must fall by this much */
#define FINAL_WINDOW 10     /* steps averaged for the final loss */
#define NOISE 0.05          /* standard deviation of the target noise */

/* Independent streams of the one hash-based generator. */
enum { SEED_INIT = 1000, SEED_TEACHER = 2000, SEED_INPUT = 3000, SEED_NOISE = 4000 };

/* The counter-based generator shared by the examples (examples/common):
 * the value depends only on (stream, i), so every rank computes the same
 * number for the same element without sharing state. That is what the
 * engine's init_fn requires (under ZeRO-3 each rank fills only the elements
 * it stores), and it lets each rank make its own share of a global batch. */

/*
 * init_fn of the weights: PyTorch's default for nn.Linear, uniform in
 * [-1/sqrt(fan_in), 1/sqrt(fan_in)], from a hash of the element index.
 * user_data points to the layer's fan_in.
 */
static int init_weight(void *user_data, int index, const char *name, int64_t offset,
                       int64_t count, float *values) {
    (void)name;
    const double bound = 1.0 / sqrt((double)*(const int *)user_data);
    for (int64_t k = 0; k < count; ++k)
        values[k] = (float)(bound * (2.0 * rng_uniform(SEED_INIT + (uint64_t)index,
                                                   (uint64_t)(offset + k)) - 1.0));
    return 0;
}

/* y[s][o] = b[o] + sum_i w[o][i] x[s][i]: w is [out][in], as in nn.Linear. */
static void linear_forward(int n, int in, int out, const float *x, const float *w,
                           const float *b, float *y) {
    for (int s = 0; s < n; ++s)
        for (int o = 0; o < out; ++o) {
            float acc = b[o];
            for (int i = 0; i < in; ++i) acc += w[o * in + i] * x[s * in + i];
            y[s * out + o] = acc;
        }
}

/* gw = dy^T x and gb = column sums of dy: the gradients of the layer's parameters. */
static void linear_backward_params(int n, int in, int out, const float *x, const float *dy,
                                   float *gw, float *gb) {
    memset(gw, 0, (size_t)out * (size_t)in * sizeof *gw);
    memset(gb, 0, (size_t)out * sizeof *gb);
    for (int s = 0; s < n; ++s)
        for (int o = 0; o < out; ++o) {
            const float d = dy[s * out + o];
            gb[o] += d;
            for (int i = 0; i < in; ++i) gw[o * in + i] += d * x[s * in + i];
        }
}

/* dx = dy w: the gradient of the layer's input. */
static void linear_backward_input(int n, int in, int out, const float *w, const float *dy,
                                  float *dx) {
    for (int s = 0; s < n; ++s)
        for (int i = 0; i < in; ++i) {
            float acc = 0.0f;
            for (int o = 0; o < out; ++o) acc += dy[s * out + o] * w[o * in + i];
            dx[s * in + i] = acc;
        }
}

/* The teacher's weights, made once from their own stream. */
static float teacher_a[T_HIDDEN * D_IN], teacher_b[D_OUT * T_HIDDEN];

static void make_teacher(void) {
    /* Unit-variance pre-activations, so that the hidden units use tanh's
     * curved range without saturating, and targets of variance near 0.5. */
    for (int k = 0; k < T_HIDDEN * D_IN; ++k)
        teacher_a[k] = (float)(1.0 / sqrt((double)D_IN) * rng_gauss(SEED_TEACHER, (uint64_t)k));
    for (int k = 0; k < D_OUT * T_HIDDEN; ++k)
        teacher_b[k] = (float)(1.2 / sqrt((double)T_HIDDEN) *
                               rng_gauss(SEED_TEACHER + 1, (uint64_t)k));
}

/*
 * Samples [first, first + n) of the endless synthetic data set: inputs
 * x ~ N(0, 1), targets teacher(x) + noise. A sample depends only on its
 * global index, so the ranks need not exchange data.
 */
static void make_batch(int64_t first, int n, float *x, float *t) {
    static const float zero_bias[T_HIDDEN];
    float h[T_HIDDEN];
    for (int s = 0; s < n; ++s) {
        const uint64_t g = (uint64_t)(first + s);
        for (int i = 0; i < D_IN; ++i) x[s * D_IN + i] = (float)rng_gauss(SEED_INPUT, g * D_IN + i);
        linear_forward(1, D_IN, T_HIDDEN, x + s * D_IN, teacher_a, zero_bias, h);
        for (int j = 0; j < T_HIDDEN; ++j) h[j] = tanhf(h[j]);
        for (int o = 0; o < D_OUT; ++o) {
            float y = 0.0f;
            for (int j = 0; j < T_HIDDEN; ++j) y += teacher_b[o * T_HIDDEN + j] * h[j];
            t[s * D_OUT + o] = y + (float)(NOISE * rng_gauss(SEED_NOISE, g * D_OUT + o));
        }
    }
}

/* ------------------------------------------------------ engine helpers */

/* Parameter indices: the position in the list given to dsm_engine_init(). */
static int weight_index(int layer) { return 2 * layer; }
static int bias_index(int layer) { return 2 * layer + 1; }

/* Scratch space of the training loop, sized by the micro-batch. */
struct work {
    dsm_dtype_t dtype;          /* the engine's compute dtype */
    int n;                      /* samples per micro-batch */
    float *x, *t;               /* inputs and targets */
    float *act[NLAYERS + 1];    /* act[0] = x, act[l + 1] = output of layer l */
    float *dz, *dx;             /* gradients of a layer's output and input */
    float *w, *b;               /* one layer's parameters in fp32 */
    float *gw, *gb;             /* one layer's parameter gradients in fp32 */
};

/*
 * The model's math is fp32 whatever the engine computes in:
 * dsm_engine_param_read_f32() copies a parameter out as fp32 (acquire, a
 * gather under ZeRO-3, convert, release: the gathered copy is freed at
 * once), and dsm_engine_grad_add_f32() adds an fp32 gradient into its
 * buffer (a 16-bit buffer is read, added to in fp32 and written back,
 * rounding once; under ZeRO-2/3 the release may reduce a full bucket).
 * Both are collective where the acquire or release is.
 */

/*
 * Forward pass over the micro-batch in wk->x, wk->t. Parameters are
 * acquired in layer order, the same on every rank. Returns the mean squared
 * error over the micro-batch in *loss.
 */
static dsm_status_t forward(dsm_engine_t engine, struct work *wk, double *loss) {
    dsm_status_t st;
    wk->act[0] = wk->x;
    for (int l = 0; l < NLAYERS; ++l) {
        const int in = widths[l], out = widths[l + 1];
        if ((st = dsm_engine_param_read_f32(engine, weight_index(l), wk->w, (int64_t)out * in)) ||
            (st = dsm_engine_param_read_f32(engine, bias_index(l), wk->b, out)))
            return st;
        linear_forward(wk->n, in, out, wk->act[l], wk->w, wk->b, wk->act[l + 1]);
        if (l + 1 < NLAYERS)
            for (int k = 0; k < wk->n * out; ++k) wk->act[l + 1][k] = tanhf(wk->act[l + 1][k]);
    }
    double sum = 0.0;
    const float *y = wk->act[NLAYERS];
    for (int k = 0; k < wk->n * D_OUT; ++k) sum += (double)(y[k] - wk->t[k]) * (y[k] - wk->t[k]);
    *loss = sum / (wk->n * D_OUT);
    return DSM_SUCCESS;
}

/*
 * Backward pass: the gradient of (mean loss over the micro-batch) x
 * loss_scale, layer by layer in reverse order. Each layer re-fetches its
 * weight for the input gradient (under ZeRO-3 a second gather, as DeepSpeed
 * does in backward; the first layer needs none), then adds its weight and
 * bias gradients. The order of calls is the same on every rank.
 */
static dsm_status_t backward(dsm_engine_t engine, struct work *wk, double loss_scale) {
    dsm_status_t st;
    /* d(mean of (y - t)^2)/dy, times the loss scale: in fp16 small gradients
     * would otherwise flush to zero. The engine divides it out again, with
     * the accumulation steps: no division by them here. */
    const float c = (float)(2.0 * loss_scale / (wk->n * D_OUT));
    const float *y = wk->act[NLAYERS];
    for (int k = 0; k < wk->n * D_OUT; ++k) wk->dz[k] = c * (y[k] - wk->t[k]);

    for (int l = NLAYERS - 1; l >= 0; --l) {
        const int in = widths[l], out = widths[l + 1];
        linear_backward_params(wk->n, in, out, wk->act[l], wk->dz, wk->gw, wk->gb);
        if (l > 0) {
            if ((st = dsm_engine_param_read_f32(engine, weight_index(l), wk->w, (int64_t)out * in)))
                return st;
            linear_backward_input(wk->n, in, out, wk->w, wk->dz, wk->dx);
        }
        if ((st = dsm_engine_grad_add_f32(engine, weight_index(l), wk->gw, (int64_t)out * in)) ||
            (st = dsm_engine_grad_add_f32(engine, bias_index(l), wk->gb, out)))
            return st;
        if (l > 0) /* through tanh: d tanh(z)/dz = 1 - tanh(z)^2 */
            for (int k = 0; k < wk->n * in; ++k)
                wk->dz[k] = wk->dx[k] * (1.0f - wk->act[l][k] * wk->act[l][k]);
    }
    return DSM_SUCCESS;
}

/* ------------------------------------------------------------------ main */

/* On failure: every rank prints the status and the message (which names the
 * function), then the program cleans up and exits 1. */
#define CHECK(call)                                                                      \
    do {                                                                                 \
        dsm_status_t st_ = (call);                                                       \
        if (st_ != DSM_SUCCESS) {                                                        \
            fprintf(stderr, "rank %d: %s: %s\n", rank, dsm_status_string(st_),          \
                    dsm_last_error());                                               \
            goto done;                                                                   \
        }                                                                                \
    } while (0)

static void usage(const char *prog) {
    fprintf(stderr, "usage: %s [CONFIG.json] [--steps N] [--describe] [--checkpoint DIR [--save-every K]]\n",
            prog);
}

int main(int argc, char **argv) {
    int provided, rank = 0, world = 1;
    /* libdsm calls MPI from the thread that calls it; FUNNELED is enough. */
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);

    const char *config = DEFAULT_CONFIG;
    long steps = DEFAULT_STEPS;
    int describe = 0, bad_usage = 0;
    const char *ckpt_dir = NULL;
    long save_every = 50;
    for (int a = 1; a < argc; ++a) {
        if (strcmp(argv[a], "--steps") == 0 && a + 1 < argc) {
            char *end;
            steps = strtol(argv[++a], &end, 10);
            if (*end != '\0' || steps < 1) bad_usage = 1;
        } else if (strcmp(argv[a], "--describe") == 0) {
            describe = 1;
        } else if (strcmp(argv[a], "--checkpoint") == 0 && a + 1 < argc) {
            ckpt_dir = argv[++a];
        } else if (strcmp(argv[a], "--save-every") == 0 && a + 1 < argc) {
            char *end;
            save_every = strtol(argv[++a], &end, 10);
            if (*end != '\0' || save_every < 1) bad_usage = 1;
        } else if (argv[a][0] != '-') {
            config = argv[a];
        } else {
            bad_usage = 1;
        }
    }
    if (bad_usage) { /* the same arguments on every rank: all stop here */
        if (rank == 0) usage(argv[0]);
        MPI_Finalize();
        return 1;
    }

    int exit_code = 1;
    dsm_engine_t engine = NULL;
    struct work wk;
    memset(&wk, 0, sizeof wk);
    double *history = NULL;

    /* The model: names as a PyTorch state_dict would have them; the biases
     * are excluded from weight decay, as usual. */
    static char names[2 * NLAYERS][32];
    static int64_t shapes[NLAYERS][2];
    static int fan_in[NLAYERS];
    dsm_param_desc_t params[2 * NLAYERS];
    memset(params, 0, sizeof params);
    for (int l = 0; l < NLAYERS; ++l) {
        shapes[l][0] = widths[l + 1];
        shapes[l][1] = widths[l];
        fan_in[l] = widths[l];
        snprintf(names[weight_index(l)], sizeof names[0], "fc%d.weight", l + 1);
        snprintf(names[bias_index(l)], sizeof names[0], "fc%d.bias", l + 1);
        dsm_param_desc_t *w = &params[weight_index(l)], *b = &params[bias_index(l)];
        w->name = names[weight_index(l)];
        w->ndims = 2;
        w->shape = shapes[l];
        w->dtype = DSM_FLOAT32;
        w->trainable = 1;
        w->init_fn = init_weight; /* each rank fills only what it stores */
        w->init_user_data = &fan_in[l];
        b->name = names[bias_index(l)];
        b->ndims = 1;
        b->shape = &shapes[l][0];
        b->dtype = DSM_FLOAT32;
        b->trainable = 1;
        b->no_weight_decay = 1; /* no init_values, no init_fn: zeros */
    }
    make_teacher();

    /* The engine on the mesh the configuration describes over
     * MPI_COMM_WORLD (read once for both); it partitions the model over its
     * "data_parallel" dimension. The forward and backward passes below run
     * on the CPU, so the engine keeps the model in host memory, GPUs or not
     * (the default is device-resident where every rank has a GPU). */
    dsm_engine_options_t options = DSM_ENGINE_OPTIONS_INITIALIZER;
    options.device = DSM_DEVICE_HOST;
    CHECK(dsm_engine_init_comm_with_options(MPI_COMM_WORLD, config, params, 2 * NLAYERS, &options, &engine));
    CHECK(dsm_engine_dtype(engine, &wk.dtype));

    /* Which share of each global batch is this rank's: its data-parallel
     * rank, which node-aware placement may make differ from its MPI rank. */
    dsm_mesh_t mesh;
    int ndims, dp_rank, dp_size;
    CHECK(dsm_engine_borrow_mesh(engine, &mesh));
    CHECK(dsm_mesh_ndims(mesh, &ndims));
    if (ndims != 1) { /* the same configuration on every rank: all stop here */
        if (rank == 0)
            fprintf(stderr, "train_mlp: sequence parallelism is not supported by this example "
                            "(every sequence-parallel rank would see the same samples)\n");
        goto done;
    }
    CHECK(dsm_mesh_rank(mesh, "data_parallel", &dp_rank));
    CHECK(dsm_mesh_size(mesh, "data_parallel", &dp_size));

    /* The batch sizes after DeepSpeed's arithmetic (train_batch_size may be
     * derived): this rank's micro-batch and the micro-steps per step. */
    int64_t train_batch, micro_batch, accumulation, data_parallel;
    CHECK(dsm_engine_batch(engine, &train_batch, &micro_batch, &accumulation, &data_parallel));

    wk.n = (int)micro_batch;
    const size_t n = (size_t)micro_batch, max_w = (size_t)MAX_WIDTH * MAX_WIDTH;
    int ok = (wk.x = malloc(n * D_IN * sizeof(float))) && (wk.t = malloc(n * D_OUT * sizeof(float))) &&
             (wk.dz = malloc(n * MAX_WIDTH * sizeof(float))) &&
             (wk.dx = malloc(n * MAX_WIDTH * sizeof(float))) &&
             (wk.w = malloc(max_w * sizeof(float))) && (wk.b = malloc(MAX_WIDTH * sizeof(float))) &&
             (wk.gw = malloc(max_w * sizeof(float))) && (wk.gb = malloc(MAX_WIDTH * sizeof(float))) &&
             (history = malloc((size_t)steps * sizeof(double)));
    for (int l = 1; ok && l <= NLAYERS; ++l)
        ok = (wk.act[l] = malloc(n * (size_t)widths[l] * sizeof(float))) != NULL;
    int all_ok;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all_ok) { /* agreed, so that no rank goes on alone */
        if (!ok) fprintf(stderr, "rank %d: out of memory\n", rank);
        goto done;
    }

    if (rank == 0)
        printf("train_mlp: %s, %d ranks (data parallel %d), %s compute; global batch %lld = "
               "%lld per rank x %lld accumulation steps x %lld; %ld steps\n",
               config, world, dp_size, dsm_dtype_name(wk.dtype), (long long)train_batch,
               (long long)micro_batch, (long long)accumulation, (long long)data_parallel, steps);

    /* Resume from DIR/latest when there is one. The checkpoint's client
     * state carries the loss of the very first batch, for the final check. */
    dsm_step_info_t info = DSM_STEP_INFO_INITIALIZER;
    long first = 0;
    double initial_loss = -1.0;
    if (ckpt_dir != NULL) {
        int resumed = 0; /* 0: no DIR/latest yet, the first run */
        void *blob = NULL;
        size_t size = 0;
        CHECK(dsm_engine_resume(engine, ckpt_dir, 0, &resumed, &blob, &size));
        if (size == sizeof initial_loss) memcpy(&initial_loss, blob, sizeof initial_loss);
        dsm_free(blob);
        CHECK(dsm_engine_step_info(engine, &info));
        first = (long)info.global_steps;
        if (rank == 0 && resumed) printf("resumed from %s/latest at step %ld\n", ckpt_dir, first);
    }

    const long print_every = steps >= 20 ? steps / 10 : 1;
    for (long step = first; step < steps; ++step) {
        double window = 0.0; /* this rank's loss over the accumulation window */
        for (int64_t m = 0; m < accumulation; ++m) {
            /* Global batch `step` holds samples [step * TB, (step + 1) * TB);
             * micro-step m of data-parallel rank r takes its m-th slice r. */
            make_batch(step * train_batch + (m * dp_size + dp_rank) * micro_batch, wk.n, wk.x, wk.t);
            double loss, scale;
            CHECK(forward(engine, &wk, &loss));
            /* For the metrics files, when the configuration enables
               csv_monitor or tensorboard (else it costs nothing). */
            CHECK(dsm_engine_log_loss(engine, loss));
            /* The scale may change at each boundary (fp16 dynamic scaling). */
            CHECK(dsm_engine_loss_scale(engine, &scale));
            CHECK(backward(engine, &wk, scale));
            /* Every micro-step; the optimizer runs at the boundary. */
            CHECK(dsm_step(engine, &info));
            window += loss;
        }
        if (!info.boundary) { /* the window above is exactly one accumulation window */
            if (rank == 0) fprintf(stderr, "train_mlp: step %ld did not end at a boundary\n", step);
            goto done;
        }
        /* The loss of the global batch: the mean over micro-steps and ranks. */
        CHECK(dsm_engine_mean_loss(engine, window / (double)accumulation, 1.0, &history[step]));
        if (initial_loss < 0) initial_loss = history[step];
        if (rank == 0 && (step % print_every == 0 || step == steps - 1))
            printf("step %5lld  loss %.6f  lr %.3e  loss_scale %g  grad_norm %.4f  skipped %lld\n",
                   (long long)info.global_steps, history[step], info.lr, info.loss_scale,
                   info.grad_norm, (long long)info.skipped_steps);
        /* The stop signal: the same answer on every rank, at a boundary. */
        int stop = 0;
        CHECK(dsm_engine_stop_requested(engine, &stop));
        if (ckpt_dir != NULL && ((step + 1) % save_every == 0 || step == steps - 1 || stop)) {
            CHECK(dsm_engine_save_checkpoint(engine, ckpt_dir, NULL, &initial_loss, sizeof initial_loss));
            if (rank == 0) printf("saved a checkpoint of step %lld in %s\n", (long long)info.global_steps, ckpt_dir);
        }
        if (stop && step < steps - 1) {
            if (rank == 0)
                printf("train_mlp: stopped on the stop signal after step %lld%s\n", (long long)info.global_steps,
                       ckpt_dir != NULL ? " (checkpoint saved)" : " (no --checkpoint: nothing saved)");
            exit_code = 3;
            goto done;
        }
    }
    if (first >= steps) { /* resumed at or past the last step: nothing to train */
        if (rank == 0) printf("train_mlp: the checkpoint is at step %ld already; nothing to do\n", first);
        exit_code = 0;
        goto done;
    }

    /* The mean over the last steps this run trained (up to FINAL_WINDOW). */
    const long last = steps - first < FINAL_WINDOW ? steps - first : FINAL_WINDOW;
    double final_loss = 0.0;
    for (long s = steps - last; s < steps; ++s) final_loss += history[s];
    final_loss /= (double)last;
    if (rank == 0) printf("final loss %.6f (initial %.6f)\n", final_loss, initial_loss);

    if (describe) {
        char *text = NULL;
        CHECK(dsm_engine_describe(engine, DSM_FORMAT_TEXT, &text));
        if (rank == 0) fputs(text, stdout);
        dsm_free(text);
    }

    /* Every rank has the same losses (averaged by the engine), so every rank decides alike. */
    if (final_loss * REQUIRED_FACTOR <= initial_loss) {
        exit_code = 0;
    } else {
        exit_code = 2;
        if (rank == 0)
            printf("train_mlp: the loss fell by less than a factor of %g\n", REQUIRED_FACTOR);
    }

done:
    /* dsm_engine_free is collective; it is also the one call an engine
     * accepts after a failed collective call. */
    if (dsm_engine_free(&engine) != DSM_SUCCESS) {
        fprintf(stderr, "rank %d: dsm_engine_free failed: %s\n", rank, dsm_last_error());
        exit_code = 1;
    }
    for (int l = 1; l <= NLAYERS; ++l) free(wk.act[l]);
    free(wk.x), free(wk.t), free(wk.dz), free(wk.dx), free(wk.w), free(wk.b);
    free(wk.gw), free(wk.gb), free(history);
    fflush(stdout);
    MPI_Finalize();
    return exit_code;
}
