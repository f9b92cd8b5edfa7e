/*
 * dsm_engine_load_weights: the weights of a checkpoint saved at any rank
 * count and ZeRO stage load bit for bit into an engine at another (host and
 * simulated device, fp32 and bf16 compute), the training counters untouched;
 * safetensors files written here (F32, BF16, F16) load by name in any order;
 * non-strict loads report what they left; every bad argument and file fails
 * every rank with a message naming the culprit and leaves the engine as it was.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mpi_test.h"
#include "ckpt_test.h"

/* The weights the safetensors tests store: a distinct value per element, exact in bf16. */
static float weight_value(int param, int k) { return (float)(param + 1) * 0.5f - (float)k * 0.0625f; }

static uint16_t bf16_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)(u >> 16); /* the values above are exact in bf16 */
}

static uint16_t fp16_bits(float x) { /* exact for the values above (|x| < 4, multiples of 2^-4) */
    if (x == 0.0f) return 0;
    uint16_t sign = x < 0 ? 0x8000 : 0;
    float a = fabsf(x);
    int e = 0;
    while (a >= 2.0f) { a /= 2.0f; ++e; }
    while (a < 1.0f) { a *= 2.0f; --e; }
    return (uint16_t)(sign | (uint16_t)((e + 15) << 10) | (uint16_t)((a - 1.0f) * 1024.0f));
}

struct st_tensor {
    const char *name, *dtype; /* dtype as the header writes it */
    const char *shape;        /* JSON array text */
    size_t bytes;             /* declared data bytes */
    const void *data;         /* NULL: zeros */
};

/* Rank 0 writes a safetensors file (tensors in the order given); `extra`
   is appended inside the header object (e.g. a bad entry). */
static void write_st(const char *path, const struct st_tensor *t, int n, const char *extra) {
    if (test_rank == 0) {
        char header[4096] = "{\"__metadata__\": {\"format\": \"pt\"}";
        size_t off = 0;
        for (int i = 0; i < n; ++i) {
            char e[512];
            snprintf(e, sizeof e, ", \"%s\": {\"dtype\": \"%s\", \"shape\": %s, \"data_offsets\": [%zu, %zu]}",
                     t[i].name, t[i].dtype, t[i].shape, off, off + t[i].bytes);
            strcat(header, e);
            off += t[i].bytes;
        }
        strcat(header, extra);
        strcat(header, "}");
        while (strlen(header) % 8) strcat(header, " ");
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        const uint64_t len = strlen(header);
        unsigned char le[8];
        for (int k = 0; k < 8; ++k) le[k] = (unsigned char)(len >> (8 * k));
        fwrite(le, 1, 8, f);
        fwrite(header, 1, len, f);
        for (int i = 0; i < n; ++i) {
            if (t[i].data) fwrite(t[i].data, 1, t[i].bytes, f);
            else
                for (size_t k = 0; k < t[i].bytes; ++k) fputc(0, f);
        }
        fclose(f);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

/* A file whose bytes are `text` (rank 0 writes). */
static void write_bytes(const char *path, const void *bytes, size_t n) {
    if (test_rank == 0) {
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        fwrite(bytes, 1, n, f);
        fclose(f);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

static void ckpt_file(char *out, size_t len, const char *tag) { snprintf(out, len, "%s/%s.h5", dir, tag); }

/* Saved at world size stage s, loaded at half the ranks (and the world) at
   every other stage, fp32, bf16 and fp16 compute: the weights bit for bit (16-bit: as
   a module-only checkpoint load gives them), the counters of the new engine 0. */
static void test_round_trip(void **state) {
    (void)state;
    MPI_Comm half = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, test_rank < (test_size + 1) / 2 ? 0 : MPI_UNDEFINED, test_rank, &half);
    for (int s = 0; s <= 3; ++s) {
        char tag[32], path[512];
        snprintf(tag, sizeof tag, "lw_s%d", s);
        ckpt_file(path, sizeof path, tag);
        dsm_engine_t a = engine_on(MPI_COMM_WORLD, s, FP32, "", 0.0f);
        train(a, MPI_COMM_WORLD, 3);
        float saved[TOTAL], got[TOTAL], want[TOTAL];
        snapshot(a, saved);
        ASSERT_OK(dsm_engine_save_checkpoint(a, dir, tag, NULL, 0));
        ASSERT_OK(dsm_engine_free(&a));
        for (int s2 = 0; s2 <= 3; ++s2) {
            if (half != MPI_COMM_NULL) {
                dsm_engine_t b = engine_on(half, s2, FP32, "", 0.5f);
                ASSERT_OK(dsm_engine_load_weights(b, path, 0));
                snapshot(b, got);
                if (memcmp(got, saved, sizeof got) != 0) fail_msg("saved at stage %d, loaded at stage %d: differs", s, s2);
                dsm_step_info_t info = DSM_STEP_INFO_INITIALIZER;
                ASSERT_OK(dsm_engine_step_info(b, &info));
                assert_int_equal(info.global_steps, 0);
                train(b, half, 1); /* the optimizer starts fresh and works */
                char *text = NULL;
                ASSERT_OK(dsm_engine_load_report(b, DSM_FORMAT_TEXT, &text));
                assert_non_null(strstr(text, "loaded weights: "));
                dsm_free(text);
                ASSERT_OK(dsm_engine_free(&b));
            }
            MPI_Barrier(MPI_COMM_WORLD);
        }
        /* bf16 and fp16 compute: the same values as a module-only checkpoint load. */
        const char *half_precision = s % 2 ? FP16 : BF16;
        dsm_engine_t c = engine_on(MPI_COMM_WORLD, (s + 1) % 4, half_precision, "", 0.5f);
        dsm_engine_t d = engine_on(MPI_COMM_WORLD, (s + 1) % 4, half_precision, "", 0.25f);
        ASSERT_OK(dsm_engine_load_weights(c, path, 0));
        ASSERT_OK(dsm_engine_load_checkpoint(d, dir, tag, DSM_CKPT_LOAD_MODULE_ONLY, NULL, NULL));
        snapshot(c, got);
        snapshot(d, want);
        assert_memory_equal(got, want, sizeof got);
        ASSERT_OK(dsm_engine_free(&c));
        ASSERT_OK(dsm_engine_free(&d));
        /* The simulated device engine. */
        setenv("DSM_ENGINE_DEVICE", "sim", 1);
        dsm_engine_t e = engine_on(MPI_COMM_WORLD, s, FP32, "", 0.5f);
        unsetenv("DSM_ENGINE_DEVICE");
        ASSERT_OK(dsm_engine_load_weights(e, path, 0));
        snapshot(e, got);
        assert_memory_equal(got, saved, sizeof got);
        train(e, MPI_COMM_WORLD, 1);
        ASSERT_OK(dsm_engine_free(&e));
    }
    if (half != MPI_COMM_NULL) MPI_Comm_free(&half);
}

/* The values a safetensors file of the model holds, per parameter. */
static float st_values[NP][35];
static uint16_t st_bf16[NP][35], st_fp16[NP][35];

static void fill_values(void) {
    for (int i = 0; i < NP; ++i)
        for (int k = 0; k < numel[i]; ++k) {
            st_values[i][k] = weight_value(i, k);
            st_bf16[i][k] = bf16_bits(st_values[i][k]);
            st_fp16[i][k] = fp16_bits(st_values[i][k]);
        }
}

static void expected(float *out) {
    size_t off = 0;
    for (int i = 0; i < NP; ++i)
        for (int k = 0; k < numel[i]; ++k) out[off++] = st_values[i][k];
}

/* F32, BF16 and F16 files (tensors in another order than the engine's),
   into engines at every stage, host and simulated device. */
static void test_safetensors(void **state) {
    (void)state;
    fill_values();
    float want[TOTAL], got[TOTAL];
    expected(want);
    const char *dtypes[3] = {"F32", "BF16", "F16"};
    for (int k = 0; k < 3; ++k) {
        const void *data[NP];
        for (int i = 0; i < NP; ++i) data[i] = k == 0 ? (const void *)st_values[i] : k == 1 ? (const void *)st_bf16[i] : (const void *)st_fp16[i];
        const size_t es = k == 0 ? 4 : 2;
        const struct st_tensor t[NP] = {
            {"e", dtypes[k], "[3, 3]", 9 * es, data[3]},
            {"s", dtypes[k], "[1]", 1 * es, data[2]},
            {"w", dtypes[k], "[7, 5]", 35 * es, data[0]},
            {"b", dtypes[k], "[5]", 5 * es, data[1]},
        };
        char path[512];
        snprintf(path, sizeof path, "%s/model_%s.safetensors", dir, dtypes[k]);
        write_st(path, t, NP, "");
        for (int s = 0; s <= 3; ++s) {
            for (int sim = 0; sim <= 1; ++sim) {
                if (sim) setenv("DSM_ENGINE_DEVICE", "sim", 1);
                dsm_engine_t e = engine_on(MPI_COMM_WORLD, s, FP32, "", 0.0f);
                if (sim) unsetenv("DSM_ENGINE_DEVICE");
                ASSERT_OK(dsm_engine_load_weights(e, path, 0));
                snapshot(e, got);
                if (memcmp(got, want, sizeof got) != 0) fail_msg("%s at stage %d (sim %d): values differ", dtypes[k], s, sim);
                train(e, MPI_COMM_WORLD, 1);
                ASSERT_OK(dsm_engine_free(&e));
            }
        }
    }
}

/* A file lacking s, with b of another shape and a tensor the model lacks:
   strict names each; non-strict loads w and e and reports the rest. */
static void test_non_strict(void **state) {
    (void)state;
    fill_values();
    const struct st_tensor t[4] = {
        {"w", "F32", "[7, 5]", 35 * 4, st_values[0]},
        {"b", "F32", "[4]", 4 * 4, st_values[1]},
        {"e", "F32", "[3, 3]", 9 * 4, st_values[3]},
        {"lm_head.extra", "I64", "[2]", 2 * 8, NULL},
    };
    char path[512];
    snprintf(path, sizeof path, "%s/partial.safetensors", dir);
    write_st(path, t, 4, "");
    dsm_engine_t e = engine_on(MPI_COMM_WORLD, 2, FP32, "", 0.0f);
    float before[TOTAL], got[TOTAL];
    snapshot(e, before);
    ASSERT_FAILS(dsm_engine_load_weights(e, path, 0), DSM_ERR_MISMATCH, "parameter 's' is missing from the file");
    ASSERT_FAILS(dsm_engine_load_weights(e, path, 0), DSM_ERR_MISMATCH,
                 "tensor 'b' has shape [4] in the file but [5] in the engine");
    ASSERT_FAILS(dsm_engine_load_weights(e, path, 0), DSM_ERR_MISMATCH, "unexpected tensor 'lm_head.extra'");
    snapshot(e, got);
    assert_memory_equal(got, before, sizeof got);
    ASSERT_OK(dsm_engine_load_weights(e, path, DSM_CKPT_LOAD_NON_STRICT));
    snapshot(e, got);
    assert_memory_equal(got, st_values[0], 35 * sizeof(float));         /* w loaded */
    assert_memory_equal(got + 35, before + 35, 6 * sizeof(float));      /* b, s kept */
    assert_memory_equal(got + 41, st_values[3], 9 * sizeof(float));     /* e loaded */
    char *json = NULL;
    ASSERT_OK(dsm_engine_load_report(e, DSM_FORMAT_JSON, &json));
    const char *says[4] = {"\"missing\": [\n    \"s\"\n  ]", "\"unexpected\": [\n    \"lm_head.extra\"\n  ]",
                           "b [4] in the file, [5] in the engine", "\"weights\": \""};
    for (int k = 0; k < 4; ++k)
        if (strstr(json, says[k]) == NULL) fail_msg("the load report lacks %s: %s", says[k], json);
    dsm_free(json);
    train(e, MPI_COMM_WORLD, 1);
    ASSERT_OK(dsm_engine_free(&e));
}

/* Every bad argument and file: the same status and message on every rank,
   the engine unchanged and usable. */
static void test_bad_inputs(void **state) {
    (void)state;
    fill_values();
    dsm_engine_t e = engine_on(MPI_COMM_WORLD, 3, FP32, "", 0.0f);
    float before[TOTAL], got[TOTAL];
    snapshot(e, before);
    char path[512], good[512];

    ASSERT_FAILS(dsm_engine_load_weights(NULL, "x", 0), DSM_ERR_NULL_POINTER, "");
    ASSERT_FAILS(dsm_engine_load_weights(e, NULL, 0), DSM_ERR_NULL_POINTER, "path is NULL");
    ASSERT_FAILS(dsm_engine_load_weights(e, "", 0), DSM_ERR_INVALID_ARGUMENT, "empty");
    snprintf(path, sizeof path, "%s/absent.safetensors", dir);
    ASSERT_FAILS(dsm_engine_load_weights(e, path, 0), DSM_ERR_IO, "absent.safetensors");
    ASSERT_FAILS(dsm_engine_load_weights(e, dir, 0), DSM_ERR_INVALID_ARGUMENT, "is a directory");

    const struct st_tensor t[NP] = {
        {"w", "F32", "[7, 5]", 35 * 4, st_values[0]},
        {"b", "F32", "[5]", 5 * 4, st_values[1]},
        {"s", "F32", "[1]", 1 * 4, st_values[2]},
        {"e", "F32", "[3, 3]", 9 * 4, st_values[3]},
    };
    snprintf(good, sizeof good, "%s/good.safetensors", dir);
    write_st(good, t, NP, "");
    ASSERT_FAILS(dsm_engine_load_weights(e, good, 0x4), DSM_ERR_INVALID_ARGUMENT, "flags 0x4");

    /* Truncated: the data cut short, then the header itself. */
    static unsigned char bytes[1 << 14];
    size_t n = 0;
    if (test_rank == 0) {
        FILE *f = fopen(good, "rb");
        assert_non_null(f);
        n = fread(bytes, 1, sizeof bytes, f);
        fclose(f);
    }
    MPI_Bcast(&n, 1, MPI_UNSIGNED_LONG, 0, MPI_COMM_WORLD);
    MPI_Bcast(bytes, (int)n, MPI_BYTE, 0, MPI_COMM_WORLD);
    snprintf(path, sizeof path, "%s/cut.safetensors", dir);
    write_bytes(path, bytes, n - 4);
    ASSERT_FAILS(dsm_engine_load_weights(e, path, 0), DSM_ERR_IO, "run past the end of the file");
    write_bytes(path, bytes, 40);
    ASSERT_FAILS(dsm_engine_load_weights(e, path, 0), DSM_ERR_IO, "header length");
    write_bytes(path, bytes, 5);
    ASSERT_FAILS(dsm_engine_load_weights(e, path, 0), DSM_ERR_IO, "too short");
    /* A header length beyond the file. */
    unsigned char huge[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, '{', '}'};
    write_bytes(path, huge, sizeof huge);
    ASSERT_FAILS(dsm_engine_load_weights(e, path, 0), DSM_ERR_IO, "out of bounds");
    /* Corrupt JSON. */
    unsigned char bad_json[24] = {16, 0, 0, 0, 0, 0, 0, 0, '{', '"', 'w', '"', ':', ' ', '[', '1', ',', ' ', ' ', ' ', ' ', ' ', ' ', ' '};
    write_bytes(path, bad_json, sizeof bad_json);
    ASSERT_FAILS(dsm_engine_load_weights(e, path, 0), DSM_ERR_IO, "not valid JSON");
    /* Entries the format does not allow. */
    snprintf(path, sizeof path, "%s/bad.safetensors", dir);
    struct st_tensor u[NP];
    memcpy(u, t, sizeof u);
    u[1].dtype = "Q7";
    write_st(path, u, NP, "");
    ASSERT_FAILS(dsm_engine_load_weights(e, path, 0), DSM_ERR_IO, "unknown dtype 'Q7'");
    memcpy(u, t, sizeof u);
    u[1].dtype = "F64";
    u[1].bytes = 5 * 8;
    write_st(path, u, NP, "");
    ASSERT_FAILS(dsm_engine_load_weights(e, path, 0), DSM_ERR_NOT_SUPPORTED, "tensor 'b' has dtype 'F64'");
    memcpy(u, t, sizeof u);
    u[0].bytes = 34 * 4;
    write_st(path, u, NP, "");
    ASSERT_FAILS(dsm_engine_load_weights(e, path, 0), DSM_ERR_IO, "35 F32 elements need 35 x 4");
    write_st(path, t, NP, ", \"x\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 4]}");
    ASSERT_FAILS(dsm_engine_load_weights(e, path, 0), DSM_ERR_IO, "tensor 'x': data_offsets [8, 4]");
    write_st(path, t, NP, ", \"x\": {\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0, 4]}");
    ASSERT_FAILS(dsm_engine_load_weights(e, path, 0), DSM_ERR_IO, "shape [-1]");
    write_st(path, t, NP, ", \"x\": 3");
    ASSERT_FAILS(dsm_engine_load_weights(e, path, 0), DSM_ERR_IO, "tensor 'x': its entry is not a JSON object");
    /* Shape mismatch. */
    memcpy(u, t, sizeof u);
    u[0].shape = "[5, 7]";
    write_st(path, u, NP, "");
    ASSERT_FAILS(dsm_engine_load_weights(e, path, 0), DSM_ERR_MISMATCH,
                 "tensor 'w' has shape [5, 7] in the file but [7, 5] in the engine");
    /* A truncated checkpoint. */
    ASSERT_OK(dsm_engine_save_checkpoint(e, dir, "whole", NULL, 0));
    char ck[512];
    ckpt_file(ck, sizeof ck, "whole");
    snprintf(path, sizeof path, "%s/cut.h5", dir);
    if (test_rank == 0) {
        struct stat st;
        assert_int_equal(stat(ck, &st), 0);
        char cmd[1200];
        snprintf(cmd, sizeof cmd, "head -c %ld '%s' > '%s'", (long)st.st_size / 2, ck, path);
        assert_int_equal(system(cmd), 0);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    ASSERT_FAILS(dsm_engine_load_weights(e, path, 0), DSM_ERR_IO, "cut.h5");

    snapshot(e, got);
    assert_memory_equal(got, before, sizeof got);
    ASSERT_OK(dsm_engine_load_weights(e, good, 0));
    ASSERT_OK(dsm_engine_load_weights(e, ck, 0)); /* back to the checkpoint's */
    snapshot(e, got);
    assert_memory_equal(got, before, sizeof got);
    train(e, MPI_COMM_WORLD, 1);
    ASSERT_OK(dsm_engine_free(&e));
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_safetensors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_non_strict, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_inputs, setup, teardown),
    };
    return RUN_MPI_TESTS("test_load_weights", tests);
}
