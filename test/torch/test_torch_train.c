/*
 * Trains a TorchScript model with the PyTorch bridge (dsm/torch.h) on the
 * data of test/torch/torch_reference.py and compares with PyTorch's own
 * training under DistributedDataParallel (its ref_wW_gG.bin): every rank's
 * loss of every micro-step, and every parameter's final values, within a
 * relative tolerance (per loss |a - b| / |b|, per parameter
 * ||a - b|| / ||b||).
 *
 *   test_torch_train --model M --data D --config JSON --gas G --steps S --micro B
 *                    [--ref FILE --tol T] [--save-at K --ckpt DIR] [--resume DIR]
 *                    [--dump FILE] [--mode whole|blocks|auto] [--expect-mode MODE]
 *
 * Rank r's rows of micro-step m of step s: ((s*G + m)*W + r)*B .. +B, as the
 * reference. --save-at K saves a checkpoint (dsm_torch_save_checkpoint) after
 * step K; --resume DIR loads DIR's latest first and goes on from its step.
 * --dump writes the final fp32 parameters (rank 0) for a bitwise comparison.
 * Exit 0 when everything agrees on every rank.
 */
#include <dsm/torch.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define IN 8
#define OUT 4
#define NROWS 4096

static int rank, world;

static void die(const char *what, dsm_status_t st) {
    fprintf(stderr, "rank %d: %s: %s: %s\n", rank, what, dsm_status_string(st), dsm_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
}

int main(int argc, char **argv) {
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    const char *model_path = NULL, *data_path = NULL, *config = NULL, *ref_path = NULL, *ckpt = NULL;
    const char *resume = NULL, *dump = NULL, *mode = "auto", *expect_mode = NULL;
    int gas = 1, steps = 50, micro = 4, save_at = -1;
    double tol = 1e-6;
    for (int i = 1; i < argc; ++i) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) { fprintf(stderr, "%s needs a value\n", a); return 2; }
        if (!strcmp(a, "--model")) model_path = v;
        else if (!strcmp(a, "--data")) data_path = v;
        else if (!strcmp(a, "--config")) config = v;
        else if (!strcmp(a, "--ref")) ref_path = v;
        else if (!strcmp(a, "--tol")) tol = atof(v);
        else if (!strcmp(a, "--gas")) gas = atoi(v);
        else if (!strcmp(a, "--steps")) steps = atoi(v);
        else if (!strcmp(a, "--micro")) micro = atoi(v);
        else if (!strcmp(a, "--save-at")) save_at = atoi(v);
        else if (!strcmp(a, "--ckpt")) ckpt = v;
        else if (!strcmp(a, "--resume")) resume = v;
        else if (!strcmp(a, "--dump")) dump = v;
        else if (!strcmp(a, "--mode")) mode = v;
        else if (!strcmp(a, "--expect-mode")) expect_mode = v;
        else { fprintf(stderr, "unknown option %s\n", a); return 2; }
        ++i;
    }
    if (!model_path || !data_path || !config) { fprintf(stderr, "--model, --data and --config are required\n"); return 2; }

    /* The data: inputs [NROWS, IN] then targets [NROWS, OUT]. */
    float *data = malloc(sizeof(float) * NROWS * (IN + OUT));
    FILE *f = fopen(data_path, "rb");
    if (!f || fread(data, sizeof(float), NROWS * (IN + OUT), f) != NROWS * (IN + OUT)) {
        fprintf(stderr, "cannot read %s\n", data_path);
        return 2;
    }
    fclose(f);
    const float *x = data, *y = data + NROWS * IN;

    dsm_mesh_t mesh;
    dsm_status_t st = dsm_mesh_create(MPI_COMM_WORLD, 1, (int[]){world}, (const char *[]){"data_parallel"}, &mesh);
    if (st) die("dsm_mesh_create", st);
    dsm_torch_options_t opts = DSM_TORCH_OPTIONS_INITIALIZER;
    opts.loss = DSM_TORCH_LOSS_MSE;
    opts.zero3_mode = !strcmp(mode, "whole") ? DSM_TORCH_ZERO3_WHOLE
                      : !strcmp(mode, "blocks") ? DSM_TORCH_ZERO3_BLOCKS : DSM_TORCH_ZERO3_AUTO;
    dsm_torch_model_t model;
    st = dsm_torch_model_create(mesh, model_path, config, &opts, &model);
    if (st) die("dsm_torch_model_create", st);
    dsm_mesh_free(&mesh);
    char *text = NULL;
    if ((st = dsm_torch_model_describe(model, DSM_FORMAT_TEXT, &text))) die("dsm_torch_model_describe", st);
    if (rank == 0) printf("%s", text);
    if (expect_mode) {
        char want[64];
        snprintf(want, sizeof want, "ZeRO-3 mode %s:", expect_mode);
        if (!strstr(text, want)) {
            fprintf(stderr, "rank %d: expected \"%s\" in the description:\n%s", rank, want, text);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    dsm_free(text);
    dsm_engine_t engine;
    dsm_torch_model_borrow_engine(model, &engine);

    int64_t start = 0;
    if (resume) {
        if ((st = dsm_torch_load_checkpoint(model, resume, NULL, 0))) die("dsm_torch_load_checkpoint", st);
        dsm_step_info_t info = DSM_STEP_INFO_INITIALIZER;
        dsm_engine_step_info(engine, &info);
        start = info.global_steps;
        if (rank == 0) printf("resumed from %s at step %lld\n", resume, (long long)start);
    }

    /* The reference: losses [steps*gas][world] then the parameters. */
    double *ref_loss = NULL;
    float *ref_w = NULL;
    size_t ref_nw = 0;
    if (ref_path) {
        f = fopen(ref_path, "rb");
        if (!f) { fprintf(stderr, "cannot open %s\n", ref_path); return 2; }
        fseek(f, 0, SEEK_END);
        const long bytes = ftell(f);
        fseek(f, 0, SEEK_SET);
        const size_t nl = (size_t)steps * gas * world;
        ref_loss = malloc(sizeof(double) * nl);
        ref_nw = ((size_t)bytes - nl * sizeof(double)) / sizeof(float);
        ref_w = malloc(sizeof(float) * ref_nw);
        if (fread(ref_loss, sizeof(double), nl, f) != nl || fread(ref_w, sizeof(float), ref_nw, f) != ref_nw) {
            fprintf(stderr, "%s is short\n", ref_path);
            return 2;
        }
        fclose(f);
    }

    int bad = 0;
    double worst_loss = 0.0;
    for (int64_t s = start; s < steps; ++s) {
        for (int m = 0; m < gas; ++m) {
            const int64_t row = ((s * gas + m) * world + rank) * micro;
            if (row + micro > NROWS) { fprintf(stderr, "not enough rows\n"); MPI_Abort(MPI_COMM_WORLD, 2); }
            dsm_torch_tensor_t in = DSM_TORCH_TENSOR_INITIALIZER, lab = DSM_TORCH_TENSOR_INITIALIZER;
            in.data = (void *)(x + row * IN);
            in.ndim = 2;
            in.shape[0] = micro;
            in.shape[1] = IN;
            lab.data = (void *)(y + row * OUT);
            lab.ndim = 2;
            lab.shape[0] = micro;
            lab.shape[1] = OUT;
            double loss = 0.0;
            dsm_step_info_t info = DSM_STEP_INFO_INITIALIZER;
            if ((st = dsm_torch_train_step(model, &in, 1, &lab, &loss, &info))) die("dsm_torch_train_step", st);
            if (info.boundary != (m == gas - 1)) {
                fprintf(stderr, "rank %d: step %lld micro %d: boundary %d\n", rank, (long long)s, m, info.boundary);
                bad = 1;
            }
            if (ref_loss) {
                const double r = ref_loss[(s * gas + m) * world + rank];
                const double rel = fabs(loss - r) / fabs(r);
                if (rel > worst_loss) worst_loss = rel;
                if (!(rel <= tol) && !bad) {
                    fprintf(stderr, "rank %d: step %lld micro %d: loss %.9g, PyTorch DDP %.9g (relative %.3g > %.3g)\n",
                            rank, (long long)s, m, loss, r, rel, tol);
                    bad = 1;
                }
            }
        }
        if (save_at == s + 1 && ckpt) {
            if ((st = dsm_torch_save_checkpoint(model, ckpt, NULL))) die("dsm_torch_save_checkpoint", st);
        }
    }

    /* The final parameters. */
    int nparams = 0;
    dsm_engine_num_params(engine, &nparams);
    size_t off = 0;
    double worst_w = 0.0;
    FILE *out = dump && rank == 0 ? fopen(dump, "wb") : NULL;
    for (int i = 0; i < nparams; ++i) {
        int64_t n = 0;
        dsm_engine_param_numel(engine, i, &n);
        float *v = malloc(sizeof(float) * (size_t)n);
        if ((st = dsm_engine_param_read_f32(engine, i, v, n))) die("dsm_engine_param_read_f32", st);
        if (out) fwrite(v, sizeof(float), (size_t)n, out);
        if (ref_w) {
            if (off + (size_t)n > ref_nw) { fprintf(stderr, "the reference has fewer weights\n"); bad = 1; break; }
            double d2 = 0.0, r2 = 0.0;
            for (int64_t k = 0; k < n; ++k) {
                const double d = (double)v[k] - ref_w[off + k];
                d2 += d * d;
                r2 += (double)ref_w[off + k] * ref_w[off + k];
            }
            const double rel = sqrt(d2) / sqrt(r2);
            if (rel > worst_w) worst_w = rel;
            if (!(rel <= tol)) {
                fprintf(stderr, "rank %d: parameter %d: final values differ from PyTorch DDP's by %.3g (relative > %.3g)\n",
                        rank, i, rel, tol);
                bad = 1;
            }
        }
        off += (size_t)n;
        free(v);
    }
    if (out) fclose(out);
    if (ref_w && off != ref_nw) { fprintf(stderr, "the reference has %zu weights, the model %zu\n", ref_nw, off); bad = 1; }

    /* Inference on this rank's first rows: finite, the right size. */
    {
        float pred[4 * OUT];
        dsm_torch_tensor_t in = DSM_TORCH_TENSOR_INITIALIZER, o = DSM_TORCH_TENSOR_INITIALIZER;
        in.data = (void *)x;
        in.ndim = 2;
        in.shape[0] = 4;
        in.shape[1] = IN;
        o.data = pred;
        o.ndim = 2;
        o.shape[0] = 4;
        o.shape[1] = OUT;
        if ((st = dsm_torch_inference(model, &in, 1, &o))) die("dsm_torch_inference", st);
        for (int k = 0; k < 4 * OUT; ++k)
            if (!isfinite(pred[k])) { fprintf(stderr, "inference gave %g\n", pred[k]); bad = 1; }
    }

    int any = 0;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    double wl = 0, ww = 0;
    MPI_Reduce(&worst_loss, &wl, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Reduce(&worst_w, &ww, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0 && ref_path)
        printf("%s: %d ranks, %lld steps x %d micro-steps: worst loss difference %.3g, worst parameter difference %.3g "
               "(relative, tolerance %.3g)\n", any ? "FAIL" : "ok", world, (long long)(steps - start), gas, wl, ww, tol);
    if ((st = dsm_torch_model_free(&model))) die("dsm_torch_model_free", st);
    free(data);
    free(ref_loss);
    free(ref_w);
    MPI_Finalize();
    return any ? 1 : 0;
}
