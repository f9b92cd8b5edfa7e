/*
 * The PyTorch bridge's step time and memory (test/torch/bench_torch.sh).
 *
 *   bench_torch --model M --width H --micro B --steps S --stage Z [--prefetch N] [--bucket N] [--overlap]
 *               [--whole] [--memory]
 *
 * ZeRO-3 runs with stage3_param_persistence_threshold 0 (every parameter
 * partitioned), stage3_max_reuse_distance 0 (a released parameter is freed)
 * and stage3_prefetch_bucket_size N elements (0: no prefetch), so that the
 * gathered memory is what the model's order needs; --bucket N sets
 * reduce_bucket_size (gradients wait for their bucket's reduction);
 * --overlap sets overlap_comm (a bucket is reduced while the backward goes
 * on, as DistributedDataParallel does).
 * Trains M (an nn.Sequential taking and giving [B, H]) on random data with
 * AdamW and mse, and prints on rank 0, after 5 warm-up steps:
 *   dsm_step_ms X libdsm_share Y      the median step over the ranks' slowest,
 *                                     and the part of the steps spent in libdsm
 *                                     calls (dsm_torch_model_describe's timers)
 *   memory partitions P gathered_peak G grad_peak R staging_peak T total_peak A
 *                                     dsm_engine_memory() on rank 0 (--memory)
 */
#include <dsm/torch.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double json_number(const char *text, const char *key) {
    const char *p = strstr(text, key);
    return p ? atof(p + strlen(key)) : -1.0;
}

static int cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int provided, rank, world;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    const char *model_path = NULL;
    int width = 512, micro = 64, steps = 50, stage = 0, memory = 0, prefetch = 0, whole = 0, overlap = 0;
    char bucket[96] = "";
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--memory")) { memory = 1; continue; }
        if (!strcmp(argv[i], "--whole")) { whole = 1; continue; }
        if (!strcmp(argv[i], "--overlap")) { overlap = 1; continue; }
        if (i + 1 >= argc) { fprintf(stderr, "%s needs a value\n", argv[i]); return 2; }
        if (!strcmp(argv[i], "--model")) model_path = argv[++i];
        else if (!strcmp(argv[i], "--width")) width = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--micro")) micro = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--steps")) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--stage")) stage = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--prefetch")) prefetch = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--bucket")) snprintf(bucket, sizeof bucket, ", \"reduce_bucket_size\": %s", argv[++i]);
        else { fprintf(stderr, "unknown option %s\n", argv[i]); return 2; }
    }
    if (!model_path) { fprintf(stderr, "--model is required\n"); return 2; }
    char config[512];
    snprintf(config, sizeof config,
             "{\"train_micro_batch_size_per_gpu\": %d, \"gradient_accumulation_steps\": 1,"
             " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.001}},"
             " \"zero_optimization\": {\"stage\": %d, \"stage3_param_persistence_threshold\": 0,"
             " \"stage3_max_reuse_distance\": 0, \"stage3_prefetch_bucket_size\": %d%s%s}}",
             micro, stage, prefetch, overlap ? ", \"overlap_comm\": true" : "", bucket);
    dsm_mesh_t mesh;
    dsm_mesh_create(MPI_COMM_WORLD, 1, (int[]){world}, (const char *[]){"data_parallel"}, &mesh);
    dsm_torch_model_t model;
    dsm_torch_options_t opts = DSM_TORCH_OPTIONS_INITIALIZER;
    opts.zero3_mode = whole ? DSM_TORCH_ZERO3_WHOLE : DSM_TORCH_ZERO3_AUTO;
    dsm_status_t st = dsm_torch_model_create(mesh, model_path, config, &opts, &model);
    if (st) { fprintf(stderr, "rank %d: %s\n", rank, dsm_last_error()); MPI_Abort(MPI_COMM_WORLD, 1); }
    dsm_mesh_free(&mesh);
    float *x = malloc(sizeof(float) * (size_t)micro * width), *y = malloc(sizeof(float) * (size_t)micro * width);
    srand(1 + rank);
    for (int i = 0; i < micro * width; ++i) {
        x[i] = (float)rand() / RAND_MAX - 0.5f;
        y[i] = (float)rand() / RAND_MAX - 0.5f;
    }
    dsm_torch_tensor_t in = DSM_TORCH_TENSOR_INITIALIZER, lab = DSM_TORCH_TENSOR_INITIALIZER;
    in.data = x;
    in.ndim = 2;
    in.shape[0] = micro;
    in.shape[1] = width;
    lab = in;
    lab.data = y;
    double *t = malloc(sizeof(double) * (size_t)(steps + 5));
    double libdsm0 = 0, step0 = 0;
    for (int s = 0; s < steps + 5; ++s) {
        if (s == 5) {
            char *text = NULL;
            dsm_torch_model_describe(model, DSM_FORMAT_JSON, &text);
            libdsm0 = json_number(text, "\"libdsm_seconds\": ");
            step0 = json_number(text, "\"step_seconds\": ");
            dsm_free(text);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = MPI_Wtime();
        double loss;
        st = dsm_torch_train_step(model, &in, 1, &lab, &loss, NULL);
        if (st) { fprintf(stderr, "rank %d: %s\n", rank, dsm_last_error()); MPI_Abort(MPI_COMM_WORLD, 1); }
        t[s] = MPI_Wtime() - t0;
    }
    MPI_Allreduce(MPI_IN_PLACE, t, steps + 5, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    qsort(t + 5, (size_t)steps, sizeof(double), cmp);
    char *text = NULL;
    dsm_torch_model_describe(model, DSM_FORMAT_JSON, &text);
    double share = (json_number(text, "\"libdsm_seconds\": ") - libdsm0) / (json_number(text, "\"step_seconds\": ") - step0);
    dsm_free(text);
    MPI_Allreduce(MPI_IN_PLACE, &share, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0) printf("dsm_step_ms %.4f libdsm_share %.4f\n", t[5 + steps / 2] * 1e3, share);
    if (memory) {
        dsm_engine_t engine;
        dsm_torch_model_borrow_engine(model, &engine);
        dsm_engine_memory_t m = DSM_ENGINE_MEMORY_INITIALIZER;
        if ((st = dsm_engine_memory(engine, &m))) { fprintf(stderr, "%s\n", dsm_last_error()); MPI_Abort(MPI_COMM_WORLD, 1); }
        if (rank == 0)
            printf("memory partitions %llu gathered_peak %llu grad_peak %llu staging_peak %llu total_peak %llu\n",
                   (unsigned long long)m.partitions, (unsigned long long)m.gathered_params_peak,
                   (unsigned long long)m.grad_buffers_peak, (unsigned long long)m.staging_peak,
                   (unsigned long long)m.total_peak);
    }
    dsm_torch_model_free(&model);
    free(x);
    free(y);
    free(t);
    MPI_Finalize();
    return 0;
}
