/*
 * Bad input to the PyTorch bridge (dsm/torch.h): every rank returns the
 * error, with a message naming the bad thing, no rank crashes or hangs, and
 * the model stays usable after a bad step; a model sets the Ulysses
 * operators' group from its mesh and clears it when freed. The files come from
 * test/torch/torch_reference.py models DIR.
 *
 *   test_torch_errors DIR
 */
#include <dsm/torch.h>
#include <dsm_torch_ops.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, world, failures;
static char dir[4096];

static const char *path(const char *name) {
    static char buf[8][4200];
    static int k;
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

/* The status is @p want and the message holds every one of the strings. */
static void expect(const char *what, dsm_status_t st, dsm_status_t want, ...) {
    const char *msg = dsm_last_error();
    int ok = st == want;
    va_list ap;
    va_start(ap, want);
    for (const char *s = va_arg(ap, const char *); s; s = va_arg(ap, const char *))
        if (!strstr(msg, s)) {
            ok = 0;
            fprintf(stderr, "rank %d: %s: the message lacks \"%s\"\n", rank, what, s);
        }
    va_end(ap);
    if (!ok) {
        fprintf(stderr, "rank %d: %s: got %s (%s), want %s\n", rank, what, dsm_status_string(st), msg,
                dsm_status_string(want));
        ++failures;
    } else if (rank == 0) {
        printf("ok: %s: %s\n", what, msg);
    }
}

static const char *config(int stage) {
    static char buf[512];
    snprintf(buf, sizeof buf,
             "{\"train_micro_batch_size_per_gpu\": 4, \"gradient_accumulation_steps\": 1,"
             " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}},"
             " \"zero_optimization\": {\"stage\": %d}}", stage);
    return buf;
}

static dsm_torch_tensor_t tensor(void *data, dsm_dtype_t dtype, int64_t d0, int64_t d1) {
    dsm_torch_tensor_t t = DSM_TORCH_TENSOR_INITIALIZER;
    t.data = data;
    t.dtype = dtype;
    t.ndim = 2;
    t.shape[0] = d0;
    t.shape[1] = d1;
    return t;
}

int main(int argc, char **argv) {
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (argc != 2) { fprintf(stderr, "usage: test_torch_errors DIR\n"); return 2; }
    snprintf(dir, sizeof dir, "%s", argv[1]);
    dsm_mesh_t mesh;
    dsm_mesh_create(MPI_COMM_WORLD, 1, (int[]){world}, (const char *[]){"data_parallel"}, &mesh);
    dsm_torch_model_t model = NULL;
    dsm_status_t st;
    char rankname[32];
    snprintf(rankname, sizeof rankname, "rank %d", world - 1);

    /* Files. */
    st = dsm_torch_model_create(mesh, path("missing.pt"), config(0), NULL, &model);
    expect("missing file", st, DSM_ERR_IO, "missing.pt", "No such file", NULL);
    if (model) { ++failures; fprintf(stderr, "rank %d: model not NULL after an error\n", rank); }
    st = dsm_torch_model_create(mesh, path(rank == world - 1 ? "missing.pt" : "mlp.pt"), config(0), NULL, &model);
    expect("file missing on the last rank", st, DSM_ERR_IO, "missing.pt", world > 1 ? rankname : "", NULL);
    st = dsm_torch_model_create(mesh, path("corrupt.pt"), config(0), NULL, &model);
    expect("corrupt file", st, DSM_ERR_IO, "corrupt.pt", "not a TorchScript archive", NULL);
    st = dsm_torch_model_create(mesh, path("sdpa.pt"), config(0), NULL, &model);
    expect("operator of a newer PyTorch", st, DSM_ERR_NOT_SUPPORTED, "aten::scaled_dot_product_attention",
           "LibTorch 1.", "PyTorch 2.0", "sdpa.pt", NULL);
    st = dsm_torch_model_create(mesh, path("noparams.pt"), config(0), NULL, &model);
    expect("model without parameters", st, DSM_ERR_INVALID_ARGUMENT, "no parameters", NULL);
    if (world > 1) {
        st = dsm_torch_model_create(mesh, path(rank == world - 1 ? "mlp_seed1.pt" : "mlp.pt"), config(0), NULL, &model);
        expect("parameters that differ between ranks", st, DSM_ERR_MISMATCH, "parameter '0.0.weight'",
               "differs between ranks", rankname, NULL);
    }
    st = dsm_torch_model_create(mesh, path("mlp.pt"),
                                "{\"train_micro_batch_size_per_gpu\": 4, \"optimizer\": {\"type\": \"AdamW\"},"
                                " \"torch\": {\"loss\": \"hinge\"}}", NULL, &model);
    expect("unknown loss in the configuration", st, DSM_ERR_CONFIG, "torch.loss", "hinge", NULL);
    dsm_torch_options_t bad = DSM_TORCH_OPTIONS_INITIALIZER;
    bad.size = 1000;
    st = dsm_torch_model_create(mesh, path("mlp.pt"), config(0), &bad, &model);
    expect("options->size", st, DSM_ERR_INVALID_ARGUMENT, "options->size is 1000", NULL);
    bad = (dsm_torch_options_t)DSM_TORCH_OPTIONS_INITIALIZER;
    bad.zero3_mode = DSM_TORCH_ZERO3_BLOCKS;
    st = dsm_torch_model_create(mesh, path("bn.pt"), config(3), &bad, &model);
    expect("block by block for a model that is not a sequence", st, DSM_ERR_NOT_SUPPORTED, "not a torch.nn.Sequential",
           NULL);

    /* Steps with bad arrays, at ZeRO-0 and ZeRO-3 (block by block). */
    float x[4 * 8], y[4 * 4];
    int32_t xi[4 * 8];
    for (int i = 0; i < 32; ++i) { x[i] = (float)(i % 7) / 7.0f; xi[i] = i; }
    for (int i = 0; i < 16; ++i) y[i] = (float)(i % 3) / 3.0f;
    for (int stage = 0; stage <= 3; stage += 3) {
        st = dsm_torch_model_create(mesh, path("mlp.pt"), config(stage), NULL, &model);
        expect(stage ? "create (ZeRO-3)" : "create (ZeRO-0)", st, DSM_SUCCESS, NULL);
        if (st) break;
        const int last = rank == world - 1;
        dsm_torch_tensor_t in = tensor(x, DSM_FLOAT32, 4, last ? 7 : 8), lab = tensor(y, DSM_FLOAT32, 4, 4);
        double loss;
        st = dsm_torch_train_step(model, &in, 1, &lab, &loss, NULL);
        expect("input of the wrong shape on the last rank", st, DSM_ERR_INVALID_ARGUMENT, "inputs[0]", "[4, 7]",
               world > 1 ? rankname : "", NULL);
        in = tensor(last ? (void *)xi : (void *)x, last ? DSM_INT32 : DSM_FLOAT32, 4, 8);
        st = dsm_torch_train_step(model, &in, 1, &lab, &loss, NULL);
        expect("input of the wrong dtype on the last rank", st, DSM_ERR_INVALID_ARGUMENT, "inputs[0]", "Int", NULL);
        in = tensor(x, DSM_FLOAT32, 4, 8);
        lab = tensor(y, DSM_FLOAT32, 4, last ? 3 : 4);
        st = dsm_torch_train_step(model, &in, 1, &lab, &loss, NULL);
        expect("labels of the wrong shape on the last rank", st, DSM_ERR_INVALID_ARGUMENT, "labels", "[4, 3]", NULL);
        lab = tensor(y, DSM_FLOAT32, 4, 4);
        in.ndim = last ? 9 : 2;
        st = dsm_torch_train_step(model, &in, 1, &lab, &loss, NULL);
        expect("ndim out of range", st, DSM_ERR_INVALID_ARGUMENT, "inputs[0].ndim is 9", NULL);
        in = tensor(last ? NULL : x, DSM_FLOAT32, 4, 8);
        st = dsm_torch_train_step(model, &in, 1, &lab, &loss, NULL);
        expect("NULL data", st, DSM_ERR_NULL_POINTER, "inputs[0].data is NULL", NULL);
        /* Still usable: a good step, and inference. */
        in = tensor(x, DSM_FLOAT32, 4, 8);
        dsm_step_info_t info = DSM_STEP_INFO_INITIALIZER;
        st = dsm_torch_train_step(model, &in, 1, &lab, &loss, &info);
        expect("a good step after the bad ones", st, DSM_SUCCESS, NULL);
        if (st == DSM_SUCCESS && info.global_steps != 1) {
            fprintf(stderr, "rank %d: global_steps %lld after one good step\n", rank, (long long)info.global_steps);
            ++failures;
        }
        float pred[4 * 4];
        dsm_torch_tensor_t o = tensor(pred, DSM_FLOAT32, 4, last ? 3 : 4);
        st = dsm_torch_inference(model, &in, 1, &o);
        expect("inference output of the wrong size", st, DSM_ERR_INVALID_ARGUMENT, "output", "[4, 3]", NULL);
        o = tensor(pred, DSM_FLOAT32, 4, 4);
        st = dsm_torch_inference(model, &in, 1, &o);
        expect("inference", st, DSM_SUCCESS, NULL);
        st = dsm_torch_export_torchscript(model, path("/no/such/dir/x.pt"));
        expect("export to a directory that does not exist", st, DSM_ERR_IO, "/no/such/dir/x.pt", NULL);
        st = dsm_torch_model_free(&model);
        expect("free", st, DSM_SUCCESS, NULL);
    }
    /* The Ulysses operators (libdsm_torch_ops) work on the mesh's
     * "sequence_parallel" group from the model's creation to its free. */
    if (world > 1) {
        dsm_mesh_t sp_mesh;
        dsm_mesh_create(MPI_COMM_WORLD, 2, (int[]){1, world}, (const char *[]){"data_parallel", "sequence_parallel"},
                        &sp_mesh);
        int before = 0, during = 0, after = 0;
        dsm_torch_ops_group_size(&before);
        st = dsm_torch_model_create(sp_mesh, path("mlp.pt"), config(0), NULL, &model);
        expect("create on a sequence-parallel mesh", st, DSM_SUCCESS, NULL);
        dsm_torch_ops_group_size(&during);
        st = dsm_torch_model_free(&model);
        expect("free on a sequence-parallel mesh", st, DSM_SUCCESS, NULL);
        dsm_torch_ops_group_size(&after);
        if (before != 1 || during != world || after != 1) {
            fprintf(stderr, "rank %d: the operators' group size is %d before the model, %d with it, %d after it "
                            "(want 1, %d, 1)\n", rank, before, during, after, world);
            ++failures;
        }
        dsm_mesh_free(&sp_mesh);
    }
    dsm_mesh_free(&mesh);
    int any = 0;
    MPI_Allreduce(&failures, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0) printf("%s\n", any ? "FAIL" : "all bad input reported on every rank");
    MPI_Finalize();
    return any ? 1 : 0;
}
