/*
 * Checkpoints: round trips at every ZeRO stage and precision continue bit for
 * bit; loads reshard across rank counts, stages and a sequence-parallel mesh,
 * and resume at another gradient accumulation (the global batch kept);
 * `latest`, client state and load flags; every bad file, argument and
 * injected fault fails every rank with a clear message and changes nothing.
 */
#include <hdf5.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mpi_test.h"
#include "ckpt_test.h"

/* Save after 3 steps, go on 2; a new engine loads and goes on 2: the same bits. */
static void test_round_trip(void **state) {
    (void)state;
    const char *precisions[3] = {FP32, FP16, BF16};
    for (int stage = 0; stage <= 3; ++stage)
        for (int p = 0; p < 3; ++p) {
            char tag[32];
            snprintf(tag, sizeof tag, "rt_s%d_p%d", stage, p);
            dsm_engine_t a = engine_on(MPI_COMM_WORLD, stage, precisions[p], "", 0.0f);
            train(a, MPI_COMM_WORLD, 3);
            float saved[TOTAL], want[TOTAL], got[TOTAL];
            snapshot(a, saved);
            ASSERT_OK(dsm_engine_save_checkpoint(a, dir, tag, NULL, 0));
            dsm_step_info_t ia = DSM_STEP_INFO_INITIALIZER, ib = DSM_STEP_INFO_INITIALIZER;
            ASSERT_OK(dsm_engine_step_info(a, &ia));
            train(a, MPI_COMM_WORLD, 2);
            snapshot(a, want);
            dsm_engine_t b = engine_on(MPI_COMM_WORLD, stage, precisions[p], "", 0.5f);
            ASSERT_OK(dsm_engine_load_checkpoint(b, dir, tag, 0, NULL, NULL));
            ASSERT_OK(dsm_engine_step_info(b, &ib));
            assert_int_equal(ib.global_steps, ia.global_steps);
            assert_int_equal(ib.micro_steps, ia.micro_steps);
            assert_int_equal(ib.global_samples, ia.global_samples);
            assert_true(ib.loss_scale == ia.loss_scale && ib.lr == ia.lr);
            snapshot(b, got);
            assert_memory_equal(got, saved, sizeof got);
            train(b, MPI_COMM_WORLD, 2);
            snapshot(b, got);
            if (memcmp(got, want, sizeof got) != 0)
                fail_msg("stage %d precision %d: training after the load differs from training on", stage, p);
            ASSERT_OK(dsm_engine_free(&a));
            ASSERT_OK(dsm_engine_free(&b));
        }
}

/*
 * ZeRO-Offload, the device simulated in host memory: a load into the same
 * engine reaches the device copies (the values read after it are the saved
 * ones, and training on from there repeats the first continuation bit for
 * bit); the checkpoint loads into an engine without offload.
 */
static void test_offload(void **state) {
    (void)state;
    for (int stage = 1; stage <= 3; stage += 2) {
        char cfg[1024], tag[32];
        snprintf(cfg, sizeof cfg,
                 "{\"train_micro_batch_size_per_gpu\": 1, \"steps_per_print\": 1000000,"
                 " \"zero_optimization\": {\"stage\": %d, \"reduce_bucket_size\": 16,"
                 " \"stage3_param_persistence_threshold\": 4, \"offload_optimizer\": {\"device\": \"cpu\"}%s},"
                 " \"optimizer\": %s}",
                 stage, stage == 3 ? ", \"offload_param\": {\"device\": \"cpu\"}" : "", ADAMW);
        snprintf(tag, sizeof tag, "offload_s%d", stage);
        float bias = 0.0f;
        dsm_param_desc_t d[NP];
        params(d, &bias);
        dsm_engine_t a = NULL;
        setenv("DSM_SIM_DEVICE_MEMORY", "1", 1);
        ASSERT_OK(dsm_engine_init_comm(MPI_COMM_WORLD, cfg, d, NP, &a));
        unsetenv("DSM_SIM_DEVICE_MEMORY");
        train(a, MPI_COMM_WORLD, 3);
        float saved[TOTAL], want[TOTAL], got[TOTAL];
        snapshot(a, saved);
        ASSERT_OK(dsm_engine_save_checkpoint(a, dir, tag, NULL, 0));
        train(a, MPI_COMM_WORLD, 2);
        snapshot(a, want);
        assert_true(memcmp(want, saved, sizeof want) != 0);
        ASSERT_OK(dsm_engine_load_checkpoint(a, dir, tag, 0, NULL, NULL));
        snapshot(a, got);
        if (memcmp(got, saved, sizeof got) != 0) fail_msg("stage %d: the values after the load are not the saved ones", stage);
        train(a, MPI_COMM_WORLD, 2);
        snapshot(a, got);
        if (memcmp(got, want, sizeof got) != 0) fail_msg("stage %d: training after the load differs", stage);
        ASSERT_OK(dsm_engine_free(&a));
        dsm_engine_t b = engine_on(MPI_COMM_WORLD, stage, FP32, "", 0.5f);
        ASSERT_OK(dsm_engine_load_checkpoint(b, dir, tag, 0, NULL, NULL));
        snapshot(b, got);
        assert_memory_equal(got, saved, sizeof got);
        ASSERT_OK(dsm_engine_free(&b));
        /* Other initial values, the frozen parameter's too, read (so copied to the device) before the load. */
        bias = 0.5f;
        params(d, &bias);
        setenv("DSM_SIM_DEVICE_MEMORY", "1", 1);
        ASSERT_OK(dsm_engine_init_comm(MPI_COMM_WORLD, cfg, d, NP, &b));
        unsetenv("DSM_SIM_DEVICE_MEMORY");
        snapshot(b, got);
        assert_true(memcmp(got, saved, sizeof got) != 0);
        ASSERT_OK(dsm_engine_load_checkpoint(b, dir, tag, 0, NULL, NULL));
        snapshot(b, got);
        if (memcmp(got, saved, sizeof got) != 0)
            fail_msg("stage %d: after a load into a fresh offloading engine the values are not the saved ones", stage);
        ASSERT_OK(dsm_engine_free(&b));
    }
}

/* Saved at one size and stage, loaded at another: the same values. */
static void reshard(MPI_Comm save_comm, int save_stage, const char *save_extra, MPI_Comm load_comm,
                    int load_stage, const char *load_extra, const char *tag) {
    float saved[TOTAL], got[TOTAL];
    if (save_comm != MPI_COMM_NULL) {
        dsm_engine_t a = engine_on(save_comm, save_stage, FP32, save_extra, 0.0f);
        train(a, save_comm, 2);
        snapshot(a, saved);
        ASSERT_OK(dsm_engine_save_checkpoint(a, dir, tag, NULL, 0));
        ASSERT_OK(dsm_engine_free(&a));
    }
    /* Every rank learns the saved values from world rank 0 (a saver). */
    MPI_Bcast(saved, TOTAL, MPI_FLOAT, 0, MPI_COMM_WORLD);
    if (load_comm != MPI_COMM_NULL) {
        dsm_engine_t b = engine_on(load_comm, load_stage, FP32, load_extra, 0.25f);
        ASSERT_OK(dsm_engine_load_checkpoint(b, dir, tag, 0, NULL, NULL));
        snapshot(b, got);
        if (memcmp(got, saved, sizeof got) != 0)
            fail_msg("%s: the values loaded (stage %d) differ from the values saved (stage %d)", tag, load_stage,
                     save_stage);
        train(b, load_comm, 1); /* the optimizer state is usable */
        ASSERT_OK(dsm_engine_free(&b));
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

static void test_reshard(void **state) {
    (void)state;
    MPI_Comm half = MPI_COMM_NULL; /* the first half of the ranks (all of one rank) */
    MPI_Comm_split(MPI_COMM_WORLD, test_rank < (test_size + 1) / 2 ? 0 : MPI_UNDEFINED, test_rank, &half);
    char tag[32];
    for (int s1 = 0; s1 <= 3; ++s1) {
        const int s2 = (s1 + 1) % 4, s3 = (s1 + 2) % 4;
        snprintf(tag, sizeof tag, "rs_a%d", s1);
        reshard(MPI_COMM_WORLD, s1, "", half, s2, "", tag);
        snprintf(tag, sizeof tag, "rs_b%d", s1);
        reshard(half, s1, "", MPI_COMM_WORLD, s3, "", tag);
    }
    if (test_size >= 4 && test_size % 2 == 0) { /* data x sequence parallel, 2 wide */
        const char *sp = ", \"sequence_parallel_size\": 2";
        reshard(MPI_COMM_WORLD, 3, sp, half, 1, "", "rs_sp_a");
        reshard(half, 2, "", MPI_COMM_WORLD, 0, sp, "rs_sp_b");
    }
    if (half != MPI_COMM_NULL) MPI_Comm_free(&half);
}

static void test_latest_and_client_state(void **state) {
    (void)state;
    dsm_engine_t a = engine_on(MPI_COMM_WORLD, 1, FP32, "", 0.0f);
    train(a, MPI_COMM_WORLD, 1);
    ASSERT_OK(dsm_engine_save_checkpoint(a, dir, "one", "first", 5));
    train(a, MPI_COMM_WORLD, 1);
    ASSERT_OK(dsm_engine_save_checkpoint(a, dir, NULL, "second!", 7)); /* global_step2 */
    char latest[64];
    read_latest(dir, latest, sizeof latest);
    assert_string_equal(latest, "global_step2");
    dsm_engine_t b = engine_on(MPI_COMM_WORLD, 2, FP32, "", 0.0f);
    void *blob = NULL;
    size_t size = 0;
    ASSERT_OK(dsm_engine_load_checkpoint(b, dir, NULL, 0, &blob, &size));
    assert_int_equal(size, 7);
    assert_memory_equal(blob, "second!", 7);
    dsm_free(blob);
    dsm_step_info_t info = DSM_STEP_INFO_INITIALIZER;
    ASSERT_OK(dsm_engine_step_info(b, &info));
    assert_int_equal(info.global_steps, 2);
    ASSERT_OK(dsm_engine_load_checkpoint(b, dir, "one", 0, &blob, &size));
    assert_int_equal(size, 5);
    assert_memory_equal(blob, "first", 5);
    dsm_free(blob);
    ASSERT_OK(dsm_engine_step_info(b, &info));
    assert_int_equal(info.global_steps, 1);
    /* No client state saved: NULL and 0. */
    ASSERT_OK(dsm_engine_save_checkpoint(a, dir, "none", NULL, 0));
    blob = (void *)1;
    ASSERT_OK(dsm_engine_load_checkpoint(b, dir, "none", 0, &blob, &size));
    assert_null(blob);
    assert_int_equal(size, 0);
    ASSERT_OK(dsm_engine_free(&a));
    ASSERT_OK(dsm_engine_free(&b));
}

static void test_flags(void **state) {
    (void)state;
    dsm_engine_t a = engine_on(MPI_COMM_WORLD, 2, FP32, "", 0.0f);
    train(a, MPI_COMM_WORLD, 3);
    float saved[TOTAL], got[TOTAL];
    snapshot(a, saved);
    ASSERT_OK(dsm_engine_save_checkpoint(a, dir, "flags", NULL, 0));
    dsm_step_info_t ia = DSM_STEP_INFO_INITIALIZER, ib = DSM_STEP_INFO_INITIALIZER;
    ASSERT_OK(dsm_engine_step_info(a, &ia));

    /* Module only: the weights, not the counters or the schedule. */
    dsm_engine_t b = engine_on(MPI_COMM_WORLD, 0, FP32, "", 0.5f);
    ASSERT_OK(dsm_engine_load_checkpoint(b, dir, "flags", DSM_CKPT_LOAD_MODULE_ONLY, NULL, NULL));
    snapshot(b, got);
    assert_memory_equal(got, saved, sizeof got);
    ASSERT_OK(dsm_engine_step_info(b, &ib));
    assert_int_equal(ib.global_steps, 0);
    ASSERT_OK(dsm_engine_free(&b));

    /* No LR schedule: the counters move, the schedule stays at its start. */
    b = engine_on(MPI_COMM_WORLD, 1, FP32, "", 0.5f);
    dsm_step_info_t fresh = DSM_STEP_INFO_INITIALIZER;
    ASSERT_OK(dsm_engine_step_info(b, &fresh));
    ASSERT_OK(dsm_engine_load_checkpoint(b, dir, "flags", DSM_CKPT_LOAD_NO_LR_SCHEDULE, NULL, NULL));
    ASSERT_OK(dsm_engine_step_info(b, &ib));
    assert_int_equal(ib.global_steps, ia.global_steps);
    assert_true(ib.lr == fresh.lr && ib.lr != ia.lr);
    /* Unknown flag bits. */
    ASSERT_FAILS(dsm_engine_load_checkpoint(b, dir, "flags", 0x80u, NULL, NULL), DSM_ERR_INVALID_ARGUMENT, "0x80");
    ASSERT_OK(dsm_engine_free(&b));

    /* Another optimizer (SGD with momentum): Adam's state is missing unless
       the load skips the optimizer state. */
    char cfg[1024];
    config_with(cfg, sizeof cfg, 1, "{\"type\": \"SGD\", \"params\": {\"lr\": 0.01, \"momentum\": 0.9}}", FP32,
                "");
    dsm_param_desc_t d[NP];
    float bias = 0.5f;
    params(d, &bias);
    ASSERT_OK(dsm_engine_init_comm(MPI_COMM_WORLD, cfg, d, NP, &b));
    ASSERT_FAILS(dsm_engine_load_checkpoint(b, dir, "flags", 0, NULL, NULL), DSM_ERR_MISMATCH,
                 "/optimizer/momentum_buffer/w");
    ASSERT_OK(dsm_engine_load_checkpoint(b, dir, "flags", DSM_CKPT_LOAD_NO_OPTIMIZER, NULL, NULL));
    snapshot(b, got);
    assert_memory_equal(got, saved, sizeof got);
    ASSERT_OK(dsm_engine_free(&b));
    ASSERT_OK(dsm_engine_free(&a));
}

/* A copy of `from` with its first `bytes` bytes only (rank 0). */
/* SGD keeps a momentum_buffer only with momentum, as torch.optim.SGD does:
   without it the engine neither allocates nor saves one, and a checkpoint
   saved with momentum still loads (its buffer is not needed). */
static dsm_engine_t sgd_engine(double momentum) {
    char opt[128], cfg[1024];
    snprintf(opt, sizeof opt, "{\"type\": \"SGD\", \"params\": {\"lr\": 0.01, \"momentum\": %g}}", momentum);
    config_with(cfg, sizeof cfg, 1, opt, FP32, "");
    dsm_param_desc_t d[NP];
    float bias = 0.5f;
    params(d, &bias);
    dsm_engine_t e = NULL;
    ASSERT_OK(dsm_engine_init_comm(MPI_COMM_WORLD, cfg, d, NP, &e));
    return e;
}

/* Whether the checkpoint file of `tag` has the HDF5 link `path` (rank 0
   reads, every rank gets the answer). */
static int ckpt_has(const char *tag, const char *path) {
    int rank = 0, has = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) {
        char file[512];
        snprintf(file, sizeof file, "%s/%s.h5", dir, tag);
        const hid_t f = H5Fopen(file, H5F_ACC_RDONLY, H5P_DEFAULT);
        assert_true(f >= 0);
        has = H5Lexists(f, "/optimizer", H5P_DEFAULT) > 0 && H5Lexists(f, path, H5P_DEFAULT) > 0;
        H5Fclose(f);
    }
    MPI_Bcast(&has, 1, MPI_INT, 0, MPI_COMM_WORLD);
    return has;
}

static void test_sgd_without_momentum(void **state) {
    (void)state;
    dsm_engine_t with = sgd_engine(0.9), without = sgd_engine(0.0);
    char *text = NULL;
    ASSERT_OK(dsm_engine_describe(without, DSM_FORMAT_JSON, &text));
    if (strstr(text, "\"optimizer_state\"") != NULL) fail_msg("SGD without momentum holds optimizer state: %s", text);
    dsm_free(text);
    ASSERT_OK(dsm_engine_describe(with, DSM_FORMAT_JSON, &text));
    assert_non_null(strstr(text, "\"optimizer_state\""));
    dsm_free(text);

    train(with, MPI_COMM_WORLD, 2);
    ASSERT_OK(dsm_engine_save_checkpoint(with, dir, "momentum", NULL, 0));
    assert_true(ckpt_has("momentum", "/optimizer/momentum_buffer"));
    float saved[TOTAL], got[TOTAL];
    snapshot(with, saved);
    /* A checkpoint with a momentum_buffer loads without momentum. */
    ASSERT_OK(dsm_engine_load_checkpoint(without, dir, "momentum", 0, NULL, NULL));
    snapshot(without, got);
    assert_memory_equal(got, saved, sizeof got);

    train(without, MPI_COMM_WORLD, 1);
    ASSERT_OK(dsm_engine_save_checkpoint(without, dir, "plain", NULL, 0));
    assert_false(ckpt_has("plain", "/optimizer/momentum_buffer"));
    snapshot(without, saved);
    ASSERT_OK(dsm_engine_free(&without));
    without = sgd_engine(0.0);
    ASSERT_OK(dsm_engine_load_checkpoint(without, dir, "plain", 0, NULL, NULL));
    snapshot(without, got);
    assert_memory_equal(got, saved, sizeof got);
    ASSERT_OK(dsm_engine_free(&without));
    ASSERT_OK(dsm_engine_free(&with));
}

static void copy_prefix(const char *from, const char *to, long bytes) {
    FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
    assert_non_null(in);
    assert_non_null(out);
    for (long i = 0; i < bytes; ++i) {
        const int c = fgetc(in);
        if (c == EOF) break;
        fputc(c, out);
    }
    fclose(in);
    fclose(out);
}

static long file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

/* Zero the magic of the integrity record in the user block: the file then
   reads as one written without the record (format version 1, or rewritten
   by another program), so the loader's own checks of attributes and
   objects are what refuse it. */
static void strip_integrity_record(const char *path) {
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    static const char zeros[8] = {0};
    fwrite(zeros, 1, sizeof zeros, f);
    fclose(f);
}

/* Every bad file fails every rank with its message; the engine keeps its values. */
static void expect_bad_load(dsm_engine_t e, const char *d, const char *tag, dsm_status_t status, const char *text) {
    float before[TOTAL], after[TOTAL];
    snapshot(e, before);
    dsm_step_info_t i0 = DSM_STEP_INFO_INITIALIZER, i1 = DSM_STEP_INFO_INITIALIZER;
    ASSERT_OK(dsm_engine_step_info(e, &i0));
    ASSERT_FAILS(dsm_engine_load_checkpoint(e, d, tag, 0, NULL, NULL), status, text);
    snapshot(e, after);
    assert_memory_equal(before, after, sizeof before);
    ASSERT_OK(dsm_engine_step_info(e, &i1));
    assert_int_equal(i0.global_steps, i1.global_steps);
}

static void test_bad_files(void **state) {
    (void)state;
    char bad[300], path[600], good[600];
    snprintf(bad, sizeof bad, "%s/bad", dir);
    dsm_engine_t a = engine_on(MPI_COMM_WORLD, 2, FP32, "", 0.0f);
    train(a, MPI_COMM_WORLD, 1);
    ASSERT_OK(dsm_engine_save_checkpoint(a, bad, "good", NULL, 0));
    snprintf(good, sizeof good, "%s/good.h5", bad);
    dsm_engine_t e = engine_on(MPI_COMM_WORLD, 1, FP32, "", 0.5f);

    char missing[400];
    snprintf(missing, sizeof missing, "%s/no_such_dir", dir);
    expect_bad_load(e, missing, NULL, DSM_ERR_IO, "does not exist");
    expect_bad_load(e, bad, "absent", DSM_ERR_IO, "absent.h5' does not exist");
    if (test_rank == 0) {
        /* latest naming a missing tag */
        snprintf(path, sizeof path, "%s/latest", bad);
        FILE *f = fopen(path, "w");
        fputs("gone\n", f);
        fclose(f);
        /* not HDF5 */
        snprintf(path, sizeof path, "%s/text.h5", bad);
        f = fopen(path, "w");
        fputs("this is not an HDF5 file\n", f);
        fclose(f);
        /* truncated */
        snprintf(path, sizeof path, "%s/truncated.h5", bad);
        copy_prefix(good, path, file_size(good) / 2);
        /* a format version this libdsm does not read, and a flipped bit in a tensor */
        char v2[600], flipped[600];
        snprintf(v2, sizeof v2, "%s/version3.h5", bad);
        snprintf(flipped, sizeof flipped, "%s/flipped.h5", bad);
        copy_prefix(good, v2, file_size(good));
        copy_prefix(good, flipped, file_size(good));
        hid_t file = H5Fopen(v2, H5F_ACC_RDWR, H5P_DEFAULT);
        hid_t attr = H5Aopen(file, "format_version", H5P_DEFAULT);
        const int64_t three = 3;
        H5Awrite(attr, H5T_NATIVE_INT64, &three);
        H5Aclose(attr);
        H5Fclose(file);
        strip_integrity_record(v2);
        file = H5Fopen(flipped, H5F_ACC_RDONLY, H5P_DEFAULT);
        hid_t dset = H5Dopen2(file, "/params/w", H5P_DEFAULT);
        const haddr_t offset = H5Dget_offset(dset);
        H5Dclose(dset);
        H5Fclose(file);
        FILE *fb = fopen(flipped, "r+b");
        fseek(fb, (long)offset + 9, SEEK_SET);
        const int c = fgetc(fb);
        fseek(fb, (long)offset + 9, SEEK_SET);
        fputc(c ^ 0x10, fb);
        fclose(fb);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    expect_bad_load(e, bad, NULL, DSM_ERR_IO, "names tag 'gone'");
    expect_bad_load(e, bad, "text", DSM_ERR_IO, "not a readable HDF5 file");
    expect_bad_load(e, bad, "truncated", DSM_ERR_IO, "truncated.h5");
    expect_bad_load(e, bad, "version3", DSM_ERR_IO, "format_version 3");
    expect_bad_load(e, bad, "flipped", DSM_ERR_IO, "checksum mismatch in /params/w");

    /* Parameters that differ from the file's: all differences listed. */
    static const int64_t other_w[2] = {5, 7};
    dsm_param_desc_t d[NP];
    params(d, NULL);
    d[0].shape = other_w;
    d[1].name = "bias";
    char cfg[1024];
    config(cfg, sizeof cfg, 1, FP32, "");
    dsm_engine_t m;
    ASSERT_OK(dsm_engine_init_comm(MPI_COMM_WORLD, cfg, d, NP, &m));
    expect_bad_load(m, bad, "good", DSM_ERR_MISMATCH, "unexpected tensor 'b'");
    ASSERT_FAILS(dsm_engine_load_checkpoint(m, bad, "good", 0, NULL, NULL), DSM_ERR_MISMATCH,
                 "parameter 'bias' is missing");
    ASSERT_FAILS(dsm_engine_load_checkpoint(m, bad, "good", 0, NULL, NULL), DSM_ERR_MISMATCH,
                 "/params/w has shape [7, 5] in the checkpoint but [5, 7] in the engine");
    ASSERT_OK(dsm_engine_free(&m));
    /* The engine still works after all that. */
    ASSERT_OK(dsm_engine_load_checkpoint(e, bad, "good", 0, NULL, NULL));
    train(e, MPI_COMM_WORLD, 1);
    ASSERT_OK(dsm_engine_free(&e));
    ASSERT_OK(dsm_engine_free(&a));
}


/* Hostile files: copies of a good checkpoint with one thing changed, each
   refused on every rank with a message naming it, the engine unchanged. */
static void set_i64(hid_t file, const char *obj, const char *name, int64_t v) {
    hid_t o = H5Oopen(file, obj, H5P_DEFAULT);
    hid_t attr = H5Aopen(o, name, H5P_DEFAULT);
    H5Awrite(attr, H5T_NATIVE_INT64, &v);
    H5Aclose(attr);
    H5Oclose(o);
}
static void set_f64(hid_t file, const char *name, double v) {
    hid_t attr = H5Aopen_by_name(file, "/", name, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(attr, H5T_NATIVE_DOUBLE, &v);
    H5Aclose(attr);
}
static void set_str(hid_t file, const char *obj, const char *name, const char *v) {
    H5Adelete_by_name(file, obj, name, H5P_DEFAULT);
    hid_t type = H5Tcopy(H5T_C_S1), space = H5Screate(H5S_SCALAR);
    H5Tset_size(type, strlen(v) + 1);
    hid_t attr = H5Acreate_by_name(file, obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(attr, type, v);
    H5Aclose(attr);
    H5Sclose(space);
    H5Tclose(type);
}

enum hostile {
    H_NEG_STEPS, H_NEG_OPT_STEPS, H_NAN_SCALE, H_BAD_STAGE, H_STEPS_CHANGED, H_SOFT_LINK, H_HARD_LINK,
    H_EXTERNAL_LINK, H_SWAPPED, H_RENAMED, H_TRAINABLE, H_CHECKSUM_ARRAY, H_NO_ROOT_SUM, H_DTYPE, H_EDITED, H_COUNT
};

static void make_hostile(const char *good, const char *path, enum hostile h) {
    copy_prefix(good, path, file_size(good));
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    switch (h) {
    case H_NEG_STEPS: set_i64(f, "/", "global_steps", -5); break;
    case H_EDITED: set_i64(f, "/", "global_steps", 1); break; /* the integrity record kept */
    case H_NEG_OPT_STEPS: set_i64(f, "/", "optimizer_steps", -1); break;
    case H_NAN_SCALE: set_f64(f, "loss_scale", NAN); break;
    case H_BAD_STAGE: set_i64(f, "/", "zero_stage", 7); break;
    case H_STEPS_CHANGED: set_i64(f, "/", "global_steps", 0); set_i64(f, "/", "micro_steps", 0);
        set_i64(f, "/", "optimizer_steps", 0); break;
    case H_SOFT_LINK:
        H5Ldelete(f, "/optimizer/exp_avg/w", H5P_DEFAULT);
        H5Lcreate_soft("/optimizer/exp_avg_sq/w", f, "/optimizer/exp_avg/w", H5P_DEFAULT, H5P_DEFAULT);
        break;
    case H_HARD_LINK:
        H5Ldelete(f, "/optimizer/exp_avg/w", H5P_DEFAULT);
        H5Lcreate_hard(f, "/optimizer/exp_avg_sq/w", f, "/optimizer/exp_avg/w", H5P_DEFAULT, H5P_DEFAULT);
        break;
    case H_EXTERNAL_LINK:
        H5Ldelete(f, "/params/w", H5P_DEFAULT);
        H5Lcreate_external(good, "/params/w", f, "/params/w", H5P_DEFAULT, H5P_DEFAULT);
        break;
    case H_SWAPPED: /* two tensors of one shape and name, their links exchanged */
        H5Lmove(f, "/optimizer/exp_avg/w", f, "/tmp_w", H5P_DEFAULT, H5P_DEFAULT);
        H5Lmove(f, "/optimizer/exp_avg_sq/w", f, "/optimizer/exp_avg/w", H5P_DEFAULT, H5P_DEFAULT);
        H5Lmove(f, "/tmp_w", f, "/optimizer/exp_avg_sq/w", H5P_DEFAULT, H5P_DEFAULT);
        break;
    case H_RENAMED: set_str(f, "/params/w", "name", "x"); break;
    case H_TRAINABLE: set_i64(f, "/params/w", "trainable", 5); break;
    case H_CHECKSUM_ARRAY: {
        H5Adelete_by_name(f, "/params/w", "checksum", H5P_DEFAULT);
        const hsize_t two = 2;
        const uint64_t v[2] = {1, 2};
        hid_t space = H5Screate_simple(1, &two, NULL);
        hid_t attr = H5Acreate_by_name(f, "/params/w", "checksum", H5T_STD_U64LE, space, H5P_DEFAULT, H5P_DEFAULT,
                                       H5P_DEFAULT);
        H5Awrite(attr, H5T_NATIVE_UINT64, v);
        H5Aclose(attr);
        H5Sclose(space);
        break;
    }
    case H_NO_ROOT_SUM: H5Adelete(f, "attrs_checksum"); break;
    case H_DTYPE: { /* /params/w rewritten as float64 with the same values and attributes */
        hid_t d = H5Dopen2(f, "/params/w", H5P_DEFAULT);
        hid_t space = H5Dget_space(d);
        const hssize_t n = H5Sget_simple_extent_npoints(space);
        double *v = malloc((size_t)n * sizeof *v);
        H5Dread(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v);
        H5Dclose(d);
        H5Ldelete(f, "/params/w", H5P_DEFAULT);
        d = H5Dcreate2(f, "/params/w", H5T_IEEE_F64LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        H5Dwrite(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v);
        H5Dclose(d);
        H5Sclose(space);
        free(v);
        break;
    }
    case H_COUNT: break;
    }
    H5Fclose(f);
    if (h != H_EDITED) strip_integrity_record(path);
}

static void test_hostile_files(void **state) {
    (void)state;
    static const struct {
        enum hostile h;
        const char *tag, *text;
    } cases[] = {
        {H_NEG_STEPS, "neg_steps", "attribute 'global_steps' is -5"},
        {H_NEG_OPT_STEPS, "neg_opt_steps", "attribute 'optimizer_steps' is -1"},
        {H_NAN_SCALE, "nan_scale", "attribute 'loss_scale'"},
        {H_BAD_STAGE, "bad_stage", "attribute 'zero_stage' is 7"},
        {H_STEPS_CHANGED, "steps_changed", "checksum mismatch in the root attributes"},
        {H_SOFT_LINK, "soft_link", "/optimizer/exp_avg/w is a soft link"},
        {H_HARD_LINK, "hard_link", "has 2 links"},
        {H_EXTERNAL_LINK, "external_link", "/params/w is a external link"},
        {H_SWAPPED, "swapped", "holds a tensor of /optimizer/exp_avg_sq"},
        {H_RENAMED, "renamed", "holds the tensor named 'x'"},
        {H_TRAINABLE, "trainable", "attribute 'trainable' is 5"},
        {H_CHECKSUM_ARRAY, "checksum_array", "attribute 'checksum' is not a scalar"},
        {H_NO_ROOT_SUM, "no_root_sum", "attribute 'attrs_checksum'"},
        {H_DTYPE, "dtype", "is not 32-bit little-endian float"},
        {H_EDITED, "edited", "checksum mismatch in its HDF5 metadata"},
    };
    char bad[300], good[600], path[600];
    snprintf(bad, sizeof bad, "%s/hostile", dir);
    dsm_engine_t a = engine_on(MPI_COMM_WORLD, 2, FP32, "", 0.0f);
    train(a, MPI_COMM_WORLD, 2);
    ASSERT_OK(dsm_engine_save_checkpoint(a, bad, "good", NULL, 0));
    snprintf(good, sizeof good, "%s/good.h5", bad);
    if (test_rank == 0)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
            snprintf(path, sizeof path, "%s/%s.h5", bad, cases[i].tag);
            make_hostile(good, path, cases[i].h);
        }
    MPI_Barrier(MPI_COMM_WORLD);
    dsm_engine_t e = engine_on(MPI_COMM_WORLD, 1, FP32, "", 0.5f);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i)
        expect_bad_load(e, bad, cases[i].tag, DSM_ERR_IO, cases[i].text);
    /* The engine still loads the good file and steps, then frees locally. */
    ASSERT_OK(dsm_engine_load_checkpoint(e, bad, "good", 0, NULL, NULL));
    dsm_step_info_t info = DSM_STEP_INFO_INITIALIZER;
    ASSERT_OK(dsm_engine_step_info(e, &info));
    assert_int_equal(info.global_steps, 2);
    ASSERT_OK(dsm_engine_free(&e));
    ASSERT_OK(dsm_engine_free(&a));
}

/*
 * Resuming at another gradient accumulation (the global batch kept: micro
 * batch x accumulation x data-parallel ranks = 4). A checkpoint saved at
 * step 3 by 2 ranks x accumulation 2 (micro-step 6; 1 rank x 2 x micro
 * batch 2 on one rank) resumes at 1 rank x 4, 1 rank x 1 (micro batch 4),
 * 2 ranks x 1 and 4 ranks x 1: step 3, micro-step 3 x the new accumulation,
 * the next window ends at a boundary, and training goes on bit for bit as
 * the run that never stopped: the gradients are sums of small dyadic
 * numbers (exact in any order) of the samples dsm_sampler_locate() finds at
 * the engine's micro-step, the same global batches at every layout when
 * the global batch divides the dataset. In fp16 a step skipped on overflow
 * before the save checks the loss scale and skipped_steps too. A file saved
 * off a boundary resumes only at its own accumulation: a mismatch naming
 * both.
 */
struct acc_layout {
    int ranks, accumulation, micro_batch;
};

static dsm_engine_t engine_acc(MPI_Comm comm, int stage, const char *precision, struct acc_layout l) {
    char cfg[1024];
    snprintf(cfg, sizeof cfg,
             "{\"train_batch_size\": 4, \"train_micro_batch_size_per_gpu\": %d, \"gradient_accumulation_steps\": %d,"
             " \"steps_per_print\": 1000000, \"zero_optimization\": {\"stage\": %d, \"reduce_bucket_size\": 16,"
             " \"stage3_param_persistence_threshold\": 4}, \"optimizer\": %s,"
             " \"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_num_steps\": 5,"
             " \"warmup_min_lr\": 0.001, \"warmup_max_lr\": 0.01}}%s}",
             l.micro_batch, l.accumulation, stage, ADAMW, precision);
    float bias = 0.0f;
    dsm_param_desc_t d[NP];
    params(d, &bias);
    dsm_engine_t e = NULL;
    ASSERT_OK(dsm_engine_init_comm(comm, cfg, d, NP, &e));
    return e;
}

/* `steps` optimizer steps of layout `l`, the data from `smp` (16 samples,
   shuffled: an epoch is 4 steps) at the engine's micro-step: sample `id`
   of step `t` adds c(id, t, i, k) to element k of parameter i, a micro-step
   the mean over its micro-batch. With `overflow`, step 1's first micro-step
   on rank 0 adds an Inf. Every micro-step but the window's last is off a
   boundary. */
static void train_acc(dsm_engine_t e, dsm_sampler_t smp, int rank, struct acc_layout l, int steps, int overflow) {
    for (int s = 0; s < steps; ++s)
        for (int m = 0; m < l.accumulation; ++m) {
            dsm_step_info_t info = DSM_STEP_INFO_INITIALIZER;
            ASSERT_OK(dsm_engine_step_info(e, &info));
            const int64_t t = info.global_steps;
            int64_t epoch, batch, ids[4], count;
            ASSERT_OK(dsm_sampler_locate(smp, info.micro_steps, &epoch, &batch));
            ASSERT_OK(dsm_sampler_batch(smp, epoch, batch, ids, 4, &count));
            assert_int_equal(count, l.micro_batch);
            double scale = 1;
            ASSERT_OK(dsm_engine_loss_scale(e, &scale));
            for (int i = 2; i >= 0; --i) {
                const void *v;
                void *g;
                float grad[35];
                ASSERT_OK(dsm_engine_param_acquire(e, i, &v));
                ASSERT_OK(dsm_engine_grad_acquire(e, i, &g));
                engine_read_f32(e, g, grad, (size_t)numel[i]);
                for (int k = 0; k < numel[i]; ++k) {
                    float sum = 0.0f;
                    for (int j = 0; j < l.micro_batch; ++j)
                        sum += (float)((ids[j] * 7 + t * 5 + i * 11 + k * 3) % 17 - 8) / 16.0f;
                    grad[k] += (float)scale * sum / (float)l.micro_batch;
                }
                if (overflow && t == 1 && m == 0 && rank == 0 && i == 0) grad[0] = INFINITY;
                engine_write_f32(e, g, grad, (size_t)numel[i]);
                ASSERT_OK(dsm_engine_grad_release(e, i));
                ASSERT_OK(dsm_engine_param_release(e, i));
            }
            ASSERT_OK(dsm_step(e, &info));
            if (info.boundary != (m == l.accumulation - 1))
                fail_msg("%d ranks x accumulation %d: micro-step %d of step %lld: boundary %d", l.ranks,
                         l.accumulation, m, (long long)t, info.boundary);
        }
}

static dsm_sampler_t sampler_acc(dsm_engine_t e) {
    dsm_sampler_options_t o = DSM_SAMPLER_OPTIONS_INITIALIZER;
    o.shuffle = 1, o.seed = 7;
    dsm_sampler_t smp = NULL;
    ASSERT_OK(dsm_sampler_create_for_engine(e, 16, &o, &smp));
    return smp;
}

/* The ranks [0, n) of the world; MPI_COMM_NULL on the others. */
static MPI_Comm first_ranks(int n) {
    MPI_Comm c = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, test_rank < n ? 0 : MPI_UNDEFINED, test_rank, &c);
    return c;
}

static void test_resume_accumulation(void **state) {
    (void)state;
    const struct acc_layout save = test_size >= 2 ? (struct acc_layout){2, 2, 1} : (struct acc_layout){1, 2, 2};
    const struct acc_layout resume[4] = {{1, 4, 1}, {1, 1, 4}, {2, 1, 2}, {4, 1, 1}};
    const char *precisions[2] = {FP32, FP16};
    for (int p = 0; p < 2; ++p) {
        /* The run that never stops: 3 steps, the save, 2 more. */
        float want[TOTAL];
        dsm_step_info_t saved = DSM_STEP_INFO_INITIALIZER, end = DSM_STEP_INFO_INITIALIZER;
        MPI_Comm sc = first_ranks(save.ranks);
        if (sc != MPI_COMM_NULL) {
            int rank;
            MPI_Comm_rank(sc, &rank);
            dsm_engine_t a = engine_acc(sc, 2, precisions[p], save);
            dsm_sampler_t smp = sampler_acc(a);
            train_acc(a, smp, rank, save, 3, p == 1);
            ASSERT_OK(dsm_engine_save_checkpoint(a, dir, "acc", NULL, 0));
            ASSERT_OK(dsm_engine_step_info(a, &saved));
            assert_int_equal(saved.micro_steps, 6);
            assert_int_equal(saved.skipped_steps, p == 1 ? 1 : 0);
            train_acc(a, smp, rank, save, 2, 0);
            ASSERT_OK(dsm_engine_step_info(a, &end));
            snapshot(a, want);
            ASSERT_OK(dsm_sampler_free(&smp));
            ASSERT_OK(dsm_engine_free(&a));
            MPI_Comm_free(&sc);
        }
        MPI_Bcast(want, TOTAL, MPI_FLOAT, 0, MPI_COMM_WORLD);
        MPI_Bcast(&saved, sizeof saved, MPI_BYTE, 0, MPI_COMM_WORLD);
        MPI_Bcast(&end, sizeof end, MPI_BYTE, 0, MPI_COMM_WORLD);
        for (int r = 0; r < 4; ++r) {
            const struct acc_layout l = resume[r];
            if (l.ranks > test_size) continue;
            MPI_Comm c = first_ranks(l.ranks);
            if (c != MPI_COMM_NULL) {
                dsm_engine_t b = engine_acc(c, 1 + 2 * (r % 2), precisions[p], l);
                ASSERT_OK(dsm_engine_load_checkpoint(b, dir, "acc", 0, NULL, NULL));
                dsm_step_info_t ib = DSM_STEP_INFO_INITIALIZER;
                ASSERT_OK(dsm_engine_step_info(b, &ib));
                if (ib.global_steps != 3 || ib.micro_steps != 3 * l.accumulation ||
                    ib.global_samples != saved.global_samples || ib.skipped_steps != saved.skipped_steps ||
                    ib.lr != saved.lr || ib.loss_scale != saved.loss_scale)
                    fail_msg("precision %d, %d ranks x accumulation %d: resumed at step %lld, micro-step %lld, "
                             "samples %lld, skipped %lld, lr %g, loss scale %g; expected 3, %d, %lld, %lld, %g, %g",
                             p, l.ranks, l.accumulation, (long long)ib.global_steps, (long long)ib.micro_steps,
                             (long long)ib.global_samples, (long long)ib.skipped_steps, ib.lr, ib.loss_scale,
                             3 * l.accumulation, (long long)saved.global_samples, (long long)saved.skipped_steps,
                             saved.lr, saved.loss_scale);
                int rank;
                MPI_Comm_rank(c, &rank);
                dsm_sampler_t smp = sampler_acc(b);
                train_acc(b, smp, rank, l, 2, 0);
                ASSERT_OK(dsm_sampler_free(&smp));
                float got[TOTAL];
                snapshot(b, got);
                ASSERT_OK(dsm_engine_step_info(b, &ib));
                if (ib.global_steps != end.global_steps || ib.micro_steps != 5 * l.accumulation ||
                    ib.global_samples != end.global_samples || ib.lr != end.lr || ib.loss_scale != end.loss_scale)
                    fail_msg("precision %d, %d ranks x accumulation %d: 2 steps after the resume: step %lld, "
                             "micro-step %lld, samples %lld, lr %g, loss scale %g; expected %lld, %d, %lld, %g, %g",
                             p, l.ranks, l.accumulation, (long long)ib.global_steps, (long long)ib.micro_steps,
                             (long long)ib.global_samples, ib.lr, ib.loss_scale, (long long)end.global_steps,
                             5 * l.accumulation, (long long)end.global_samples, end.lr, end.loss_scale);
                if (memcmp(got, want, sizeof got) != 0)
                    fail_msg("precision %d, %d ranks x accumulation %d: training after the resume differs from "
                             "the run that never stopped", p, l.ranks, l.accumulation);
                ASSERT_OK(dsm_engine_free(&b));
                MPI_Comm_free(&c);
            }
            MPI_Barrier(MPI_COMM_WORLD);
        }
    }
    /* Off a boundary (micro-step 7 of accumulation 2, a file edited as format
       version 1, without the attributes' checksum): refused at accumulation
       4, the engine unchanged; loaded at accumulation 2, the counter kept. */
    if (test_rank == 0) {
        char good[600], path[600];
        snprintf(good, sizeof good, "%s/acc.h5", dir);
        snprintf(path, sizeof path, "%s/acc_off.h5", dir);
        copy_prefix(good, path, file_size(good));
        hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
        set_i64(f, "/", "micro_steps", 7);
        set_i64(f, "/", "format_version", 1);
        H5Adelete(f, "attrs_checksum");
        H5Fclose(f);
        strip_integrity_record(path);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Comm one = first_ranks(1);
    if (one != MPI_COMM_NULL) {
        dsm_engine_t e = engine_acc(one, 1, FP32, (struct acc_layout){1, 4, 1});
        expect_bad_load(e, dir, "acc_off", DSM_ERR_MISMATCH, "gradient_accumulation_steps 2, not 4");
        ASSERT_FAILS(dsm_engine_load_checkpoint(e, dir, "acc_off", 0, NULL, NULL), DSM_ERR_MISMATCH, "micro-step 7");
        ASSERT_OK(dsm_engine_free(&e));
        e = engine_acc(one, 1, FP32, (struct acc_layout){1, 2, 2});
        ASSERT_OK(dsm_engine_load_checkpoint(e, dir, "acc_off", 0, NULL, NULL));
        dsm_step_info_t info = DSM_STEP_INFO_INITIALIZER;
        ASSERT_OK(dsm_engine_step_info(e, &info));
        assert_int_equal(info.micro_steps, 7);
        ASSERT_OK(dsm_engine_free(&e));
        MPI_Comm_free(&one);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

static void test_bad_arguments(void **state) {
    (void)state;
    dsm_engine_t e = engine_on(MPI_COMM_WORLD, 1, FP32, ", \"gradient_accumulation_steps\": 2", 0.0f);
    ASSERT_FAILS(dsm_engine_save_checkpoint(e, NULL, "t", NULL, 0), DSM_ERR_NULL_POINTER, "dir is NULL");
    ASSERT_FAILS(dsm_engine_save_checkpoint(e, "", "t", NULL, 0), DSM_ERR_INVALID_ARGUMENT, "directory is empty");
    ASSERT_FAILS(dsm_engine_save_checkpoint(e, dir, "../escape", NULL, 0), DSM_ERR_INVALID_ARGUMENT,
                 "must not start with '.'");
    ASSERT_FAILS(dsm_engine_save_checkpoint(e, dir, "a/b", NULL, 0), DSM_ERR_INVALID_ARGUMENT, "character '/'");
    ASSERT_FAILS(dsm_engine_save_checkpoint(e, dir, "", NULL, 0), DSM_ERR_INVALID_ARGUMENT, "1..200 characters");
    ASSERT_FAILS(dsm_engine_save_checkpoint(e, dir, "t", NULL, 3), DSM_ERR_NULL_POINTER, "client_state is NULL");
    ASSERT_FAILS(dsm_engine_load_checkpoint(e, dir, "x/../y", 0, NULL, NULL), DSM_ERR_INVALID_ARGUMENT,
                 "character '/'");
    /* Bad on one rank only: every rank fails. */
    ASSERT_FAILS(dsm_engine_save_checkpoint(e, test_rank == test_size - 1 ? NULL : dir, "t", NULL, 0),
                 DSM_ERR_NULL_POINTER, "dir is NULL");
    /* Between accumulation boundaries, or with a buffer acquired. */
    void *g;
    ASSERT_OK(dsm_engine_grad_acquire(e, 0, &g));
    ASSERT_FAILS(dsm_engine_save_checkpoint(e, dir, "t", NULL, 0), DSM_ERR_STATE, "still acquired");
    ASSERT_OK(dsm_engine_grad_release(e, 0));
    ASSERT_OK(dsm_step(e, NULL)); /* micro-step 1 of 2 */
    ASSERT_FAILS(dsm_engine_save_checkpoint(e, dir, "t", NULL, 0), DSM_ERR_STATE, "between accumulation boundaries");
    ASSERT_FAILS(dsm_engine_load_checkpoint(e, dir, NULL, 0, NULL, NULL), DSM_ERR_STATE,
                 "between accumulation boundaries");
    ASSERT_OK(dsm_step(e, NULL));
    ASSERT_OK(dsm_engine_save_checkpoint(e, dir, "t", NULL, 0));
    ASSERT_OK(dsm_engine_free(&e));

    /* Different tags across ranks: rank 0's under "Warn", an error under "Fail". */
    if (test_size > 1) {
        char tag[32];
        snprintf(tag, sizeof tag, "tag_r%d", test_rank);
        e = engine_on(MPI_COMM_WORLD, 0, FP32, ", \"checkpoint\": {\"tag_validation\": \"Fail\"}", 0.0f);
        ASSERT_FAILS(dsm_engine_save_checkpoint(e, dir, tag, NULL, 0), DSM_ERR_MISMATCH, "different checkpoint tags");
        ASSERT_OK(dsm_engine_free(&e));
        e = engine_on(MPI_COMM_WORLD, 0, FP32, ", \"checkpoint\": {\"tag_validation\": \"Ignore\"}", 0.0f);
        ASSERT_OK(dsm_engine_save_checkpoint(e, dir, tag, NULL, 0));
        char latest[64];
        read_latest(dir, latest, sizeof latest);
        assert_string_equal(latest, "tag_r0");
        ASSERT_OK(dsm_engine_free(&e));
    }
}

/* A save that fails at any point leaves the previous checkpoint and latest. */
static void test_faults(void **state) {
    (void)state;
    char fdir[300], path[600], latest[64];
    snprintf(fdir, sizeof fdir, "%s/faults", dir);
    dsm_engine_t e = engine_on(MPI_COMM_WORLD, 3, FP32, "", 0.0f);
    train(e, MPI_COMM_WORLD, 1);
    ASSERT_OK(dsm_engine_save_checkpoint(e, fdir, "before", "old", 3));
    train(e, MPI_COMM_WORLD, 1);
    /* create: rank 0 alone creates the metadata; its failure reaches every rank. */
    const char *points[4] = {"create", "data", "rename", "latest"};
    for (int k = 0; k < 4; ++k) {
        char spec[64], tag[32];
        snprintf(spec, sizeof spec, "%s:%d", points[k], k == 1 ? test_size - 1 : 0);
        snprintf(tag, sizeof tag, "fault_%s", points[k]);
        setenv("DSM_CKPT_FAULT", spec, 1);
        ASSERT_FAILS(dsm_engine_save_checkpoint(e, fdir, tag, NULL, 0), DSM_ERR_IO, "injected fault");
        unsetenv("DSM_CKPT_FAULT");
        snprintf(path, sizeof path, "%s/%s.h5", fdir, tag);
        /* Before the rename nothing is under the final name; after it the
           file is complete, but latest was not moved. */
        assert_int_equal(file_exists(path), k == 3);
        snprintf(path, sizeof path, "%s/.%s.h5.tmp", fdir, tag);
        assert_false(file_exists(path));
        read_latest(fdir, latest, sizeof latest);
        assert_string_equal(latest, "before");
    }
    /* The engine is usable, and the previous checkpoint loads. */
    void *blob = NULL;
    size_t size = 0;
    ASSERT_OK(dsm_engine_load_checkpoint(e, fdir, NULL, 0, &blob, &size));
    assert_int_equal(size, 3);
    assert_memory_equal(blob, "old", 3);
    dsm_free(blob);
    ASSERT_OK(dsm_engine_load_checkpoint(e, fdir, "fault_latest", 0, NULL, NULL));
    ASSERT_OK(dsm_engine_free(&e));
}

/* checkpoint.writer.decoupled below MPI_THREAD_MULTIPLE (this program asks
   for MPI_THREAD_SERIALIZED): the save is made at the call, complete on
   return; waiting finds nothing to wait for. */
static void test_decoupled_below_thread_multiple(void **state) {
    (void)state;
    int level = MPI_THREAD_SINGLE;
    MPI_Query_thread(&level);
    if (level == MPI_THREAD_MULTIPLE) skip();
    char path[600], latest[64];
    dsm_engine_t e = engine_on(MPI_COMM_WORLD, 1, FP32, ", \"checkpoint\": {\"writer\": {\"decoupled\": true}}", 0.0f);
    train(e, MPI_COMM_WORLD, 1);
    ASSERT_OK(dsm_engine_save_checkpoint(e, dir, "sync", NULL, 0));
    snprintf(path, sizeof path, "%s/sync.h5", dir);
    assert_true(file_exists(path));
    read_latest(dir, latest, sizeof latest);
    assert_string_equal(latest, "sync");
    ASSERT_OK(dsm_engine_checkpoint_wait(e));
    /* A failure is the save's own. */
    char spec[32];
    snprintf(spec, sizeof spec, "write:%d", test_size - 1);
    setenv("DSM_CKPT_FAULT", spec, 1);
    ASSERT_FAILS(dsm_engine_save_checkpoint(e, dir, "bad", NULL, 0), DSM_ERR_IO, "injected fault");
    unsetenv("DSM_CKPT_FAULT");
    ASSERT_OK(dsm_engine_checkpoint_wait(e));
    ASSERT_OK(dsm_engine_free(&e));
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reshard, setup, teardown),
        cmocka_unit_test_setup_teardown(test_resume_accumulation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_latest_and_client_state, setup, teardown),
        cmocka_unit_test_setup_teardown(test_flags, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sgd_without_momentum, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_files, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hostile_files, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_arguments, setup, teardown),
        cmocka_unit_test_setup_teardown(test_faults, setup, teardown),
        cmocka_unit_test_setup_teardown(test_offload, setup, teardown),
        cmocka_unit_test_setup_teardown(test_decoupled_below_thread_multiple, setup, teardown),
    };
    return RUN_MPI_TESTS("test_checkpoint", tests);
}
