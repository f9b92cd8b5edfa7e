/*
 * Reading a DeepSpeed configuration on every rank: the same verdict
 * everywhere (a file missing on one rank fails all), batch arithmetic with W
 * from the world, sequence_parallel_size or the mesh, and the describe calls.
 */
#include "mpi_test.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static int last(void) { return test_rank == test_size - 1; }

static void test_inline_and_batch(void **state) {
    (void)state;
    dsm_config_t cfg = NULL;
    ASSERT_OK(dsm_config_load(MPI_COMM_WORLD, "{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": 3}",
                              0, &cfg));
    int64_t tb = 0, mb = 0, gas = 0, w = 0;
    ASSERT_OK(dsm_config_batch(cfg, &tb, &mb, &gas, &w));
    assert_int_equal(tb, 6 * test_size);
    assert_int_equal(mb, 2);
    assert_int_equal(gas, 3);
    assert_int_equal(w, test_size);
    ASSERT_OK(dsm_config_batch(cfg, NULL, NULL, NULL, NULL));
    char *text = NULL;
    ASSERT_OK(dsm_config_describe(cfg, DSM_FORMAT_JSON, &text));
    assert_non_null(strstr(text, "\"train_batch_size\""));
    dsm_free(text);
    ASSERT_OK(dsm_config_describe(cfg, DSM_FORMAT_TEXT, &text));
    assert_non_null(strstr(text, "gradient_accumulation_steps = 3\n"));
    dsm_free(text);
    ASSERT_FAILS(dsm_config_describe(cfg, (dsm_format_t)5, &text), DSM_ERR_INVALID_ARGUMENT, "format 5");
    ASSERT_OK(dsm_config_free(&cfg));
    assert_null(cfg);
    ASSERT_OK(dsm_config_free(&cfg));
    ASSERT_OK(dsm_config_free(NULL));
}

static void test_file_and_missing_file(void **state) {
    (void)state;
    char path[256];
    const char *tmp = getenv("TMPDIR");
    long id = (long)getppid();
    MPI_Bcast(&id, 1, MPI_LONG, 0, MPI_COMM_WORLD);
    snprintf(path, sizeof path, "%s/dsm-config-test-%ld.json", tmp != NULL ? tmp : "/tmp", id);
    if (test_rank == 0) {
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fputs("{\n  \"train_batch_size\": 64,\n  \"gradient_accumulation_steps\": 2,\n"
              "  \"zero_optimization\": {\"stage\": 2}\n}\n", f);
        fclose(f);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    dsm_config_t cfg = NULL;
    if (64 % (2 * test_size) == 0) {
        ASSERT_OK(dsm_config_load(MPI_COMM_WORLD, path, 0, &cfg));
        int64_t mb = 0;
        ASSERT_OK(dsm_config_batch(cfg, NULL, &mb, NULL, NULL));
        assert_int_equal(mb, 64 / (2 * test_size));
        ASSERT_OK(dsm_config_free(&cfg));
    }
    /* Missing on the last rank only: every rank fails, naming that rank and the path. */
    char missing[300], text[400];
    snprintf(missing, sizeof missing, "%s.missing", path);
    snprintf(text, sizeof text, "rank %d: ", test_size - 1);
    ASSERT_FAILS(dsm_config_load(MPI_COMM_WORLD, last() ? missing : path, 0, &cfg), DSM_ERR_IO, text);
    ASSERT_FAILS(dsm_config_load(MPI_COMM_WORLD, last() ? missing : path, 0, &cfg), DSM_ERR_IO, ".missing");
    assert_null(cfg);
    MPI_Barrier(MPI_COMM_WORLD);
    if (test_rank == 0) unlink(path);
}

static void test_invalid_everywhere(void **state) {
    (void)state;
    dsm_config_t cfg = NULL;
    ASSERT_FAILS(dsm_config_load(MPI_COMM_WORLD, "{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 4}}", 0, &cfg),
                 DSM_ERR_CONFIG, "zero_optimization.stage");
    ASSERT_FAILS(dsm_config_load(MPI_COMM_WORLD, "{\"train_batch_size\": 8,\n \"fp16\": {\"enabled\": tru}}", 0, &cfg),
                 DSM_ERR_CONFIG, "line 2");
    ASSERT_FAILS(dsm_config_load(MPI_COMM_WORLD, "{\"train_batch_size\": 8, \"train_batch_size\": 8}", 0, &cfg),
                 DSM_ERR_CONFIG, "train_batch_size");
    /* Schedule parameters are checked when the configuration is read. */
    ASSERT_FAILS(dsm_config_load(MPI_COMM_WORLD, "{\"train_batch_size\": 8, \"scheduler\": {\"type\": \"WarmupDecayLR\","
                                 " \"params\": {\"warmup_num_steps\": 100, \"total_num_steps\": 50}}}", 0, &cfg),
                 DSM_ERR_CONFIG, "scheduler.params.total_num_steps");
    ASSERT_FAILS(dsm_config_resolve("{\"train_batch_size\": 8, \"scheduler\": {\"type\": \"WarmupLR\","
                                    " \"params\": {\"warmup_num_steps\": 0}}}", 1, 0, 0, &cfg),
                 DSM_ERR_CONFIG, "scheduler.params.warmup_num_steps");
    assert_null(cfg);
}

static void test_one_bad_rank(void **state) {
    (void)state;
    if (test_size < 2) skip();
    dsm_config_t cfg = NULL;
    const char *good = "{\"train_micro_batch_size_per_gpu\": 1}";
    char text[64];
    snprintf(text, sizeof text, "rank %d: config is NULL", test_size - 1);
    ASSERT_FAILS(dsm_config_load(MPI_COMM_WORLD, last() ? NULL : good, 0, &cfg), DSM_ERR_NULL_POINTER, text);
    snprintf(text, sizeof text, "rank %d: cfg (the output) is NULL", test_size - 1);
    ASSERT_FAILS(dsm_config_load(MPI_COMM_WORLD, good, 0, last() ? NULL : &cfg), DSM_ERR_NULL_POINTER, text);
    snprintf(text, sizeof text, "rank %d: flags is 6", test_size - 1);
    ASSERT_FAILS(dsm_config_load(MPI_COMM_WORLD, good, last() ? 6u : 0u, &cfg), DSM_ERR_INVALID_ARGUMENT, text);
    /* Valid on every rank, but different: the first differing key is named, with both values and ranks. */
    ASSERT_FAILS(dsm_config_load(MPI_COMM_WORLD, last() ? "{\"train_micro_batch_size_per_gpu\": 4}" : good, 0, &cfg),
                 DSM_ERR_MISMATCH, "resolved configurations differ across ranks");
    snprintf(text, sizeof text, "train_batch_size: rank 0 has %d, rank %d has %d", test_size, test_size - 1,
             4 * test_size);
    ASSERT_FAILS(dsm_config_load(MPI_COMM_WORLD, last() ? "{\"train_micro_batch_size_per_gpu\": 4}" : good, 0, &cfg),
                 DSM_ERR_MISMATCH, text);
    assert_null(cfg);
    ASSERT_OK(dsm_config_load(MPI_COMM_WORLD, good, 0, &cfg)); /* nothing left half done */
    ASSERT_OK(dsm_config_free(&cfg));
}

/* A temporary directory made by rank 0 and known to every rank (the ranks share a file system). */
static void shared_temp_dir(char *dir, size_t size) {
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, size, "%s/dsm-config-load-XXXXXX", tmp != NULL && *tmp ? tmp : "/tmp");
    if (test_rank == 0) assert_non_null(mkdtemp(dir));
    MPI_Bcast(dir, (int)size, MPI_CHAR, 0, MPI_COMM_WORLD);
}

static void write_text(const char *path, const char *text, size_t len) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

/* A directory, a FIFO, a device: refused by what they are, on every rank, without blocking. */
static void test_not_regular_files(void **state) {
    (void)state;
    char dir[256], fifo[300], good[300], text[400];
    dsm_config_t cfg = NULL;
    shared_temp_dir(dir, sizeof dir);
    snprintf(fifo, sizeof fifo, "%s/fifo.json", dir);
    snprintf(good, sizeof good, "%s/good.json", dir);
    if (test_rank == 0) {
        assert_int_equal(mkfifo(fifo, 0600), 0);
        write_text(good, "{\"train_micro_batch_size_per_gpu\": 1}", 37);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    snprintf(text, sizeof text, "rank 0: cannot read configuration file '%s': is a directory", dir);
    ASSERT_FAILS(dsm_config_load(MPI_COMM_WORLD, dir, 0, &cfg), DSM_ERR_IO, text);
    snprintf(text, sizeof text, "'%s': is a FIFO (named pipe)", fifo);
    ASSERT_FAILS(dsm_config_load(MPI_COMM_WORLD, fifo, 0, &cfg), DSM_ERR_IO, text);
    ASSERT_FAILS(dsm_config_load(MPI_COMM_WORLD, "/dev/zero", 0, &cfg), DSM_ERR_IO,
                 "rank 0: cannot read configuration file '/dev/zero': is a character device");
    assert_null(cfg);
    /* Only on the last rank: every rank fails with its message. */
    snprintf(text, sizeof text, "rank %d: cannot read configuration file '%s': is a FIFO", test_size - 1, fifo);
    ASSERT_FAILS(dsm_config_load(MPI_COMM_WORLD, last() ? fifo : good, 0, &cfg), DSM_ERR_IO, text);
    snprintf(text, sizeof text, "rank %d: cannot read configuration file '/dev/zero'", test_size - 1);
    ASSERT_FAILS(dsm_config_load(MPI_COMM_WORLD, last() ? "/dev/zero" : good, 0, &cfg), DSM_ERR_IO, text);
    snprintf(text, sizeof text, "rank %d: cannot read configuration file '%s': is a directory", test_size - 1, dir);
    ASSERT_FAILS(dsm_config_load(MPI_COMM_WORLD, last() ? dir : good, 0, &cfg), DSM_ERR_IO, text);
    assert_null(cfg);
    ASSERT_OK(dsm_config_load(MPI_COMM_WORLD, good, 0, &cfg)); /* nothing left half done */
    ASSERT_OK(dsm_config_free(&cfg));
    MPI_Barrier(MPI_COMM_WORLD);
    if (test_rank == 0) {
        unlink(fifo);
        unlink(good);
        rmdir(dir);
    }
}

/* {"train_micro_batch_size_per_gpu": 1, "k": {"k": ... {}}}: `depth` levels in all, keys of `key_len` bytes. */
static char *nested(size_t depth, size_t key_len) {
    size_t cap = 64 + depth * (key_len + 8);
    char *text = malloc(cap), *p = text;
    assert_non_null(text);
    p += sprintf(p, "{\"train_micro_batch_size_per_gpu\": 1");
    for (size_t i = 1; i < depth; ++i) {
        p += sprintf(p, i == 1 ? ", \"" : "\"");
        memset(p, 'k', key_len);
        p += key_len;
        p += sprintf(p, "\": {");
    }
    for (size_t i = 0; i < depth; ++i) *p++ = '}';
    *p = '\0';
    return text;
}

/* A NUL byte, the size limit and the depth limit: errors naming the offset or the limit, on every rank. */
static void test_nul_and_limits(void **state) {
    (void)state;
    char dir[256], path[300], big[300], text[400];
    dsm_config_t cfg = NULL;
    shared_temp_dir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/nul.json", dir);
    snprintf(big, sizeof big, "%s/big.json", dir);
    if (test_rank == 0) {
        write_text(path, "{\"train_micro_batch_size_per_gpu\": 1}\0{\"x\": 2}", 46);
        write_text(big, "{\"train_micro_batch_size_per_gpu\": 1}", 37);
        assert_int_equal(truncate(big, (off_t)64 * 1024 * 1024 + 1), 0); /* sparse */
    }
    MPI_Barrier(MPI_COMM_WORLD);
    snprintf(text, sizeof text, "rank 0: configuration '%s': a NUL byte (\\0) at byte offset 37", path);
    ASSERT_FAILS(dsm_config_load(MPI_COMM_WORLD, path, 0, &cfg), DSM_ERR_CONFIG, text);
    snprintf(text, sizeof text, "configuration '%s': 67108865 bytes, larger than the limit of 64 MiB", big);
    ASSERT_FAILS(dsm_config_load(MPI_COMM_WORLD, big, 0, &cfg), DSM_ERR_CONFIG, text);
    snprintf(text, sizeof text, "rank %d: configuration '%s': 67108865 bytes", test_size - 1, big);
    ASSERT_FAILS(dsm_config_load(MPI_COMM_WORLD, last() ? big : "{\"train_micro_batch_size_per_gpu\": 1}", 0, &cfg),
                 DSM_ERR_CONFIG, text);

    /* Depth: exactly at the limit accepted, one level more refused naming the limit. */
    char *at = nested(1000, 1), *over = nested(1001, 1);
    ASSERT_OK(dsm_config_load(MPI_COMM_WORLD, at, 0, &cfg));
    ASSERT_OK(dsm_config_free(&cfg));
    ASSERT_FAILS(dsm_config_load(MPI_COMM_WORLD, over, 0, &cfg), DSM_ERR_CONFIG,
                 "rank 0: configuration (inline JSON): objects and arrays nest deeper than the limit of 1000 levels");
    snprintf(text, sizeof text, "rank %d: configuration (inline JSON): objects and arrays nest deeper", test_size - 1);
    ASSERT_FAILS(dsm_config_load(MPI_COMM_WORLD, last() ? over : at, 0, &cfg), DSM_ERR_CONFIG, text);
    free(over);
    free(at);
    /* Deep but legal, with long keys: cheap (paths copied per level took 1000 * 1000 / 2 * 4 KB = 2 GB). */
    at = nested(1000, 4000);
    double t0 = MPI_Wtime();
    ASSERT_OK(dsm_config_load(MPI_COMM_WORLD, at, 0, &cfg));
    if (test_deadlines()) assert_true(MPI_Wtime() - t0 < 30.0); /* the multinode stage's deadline */
    ASSERT_OK(dsm_config_free(&cfg));
    free(at);
    /* One million levels stop at the limit. */
    over = nested(1000000, 1);
    ASSERT_FAILS(dsm_config_load(MPI_COMM_WORLD, over, 0, &cfg), DSM_ERR_CONFIG, "limit of 1000 levels");
    free(over);
    assert_null(cfg);
    MPI_Barrier(MPI_COMM_WORLD);
    if (test_rank == 0) {
        unlink(path);
        unlink(big);
        rmdir(dir);
    }
}

/* A configuration that resolves differently on one rank: the first differing key, both values, both ranks. */
static void test_mismatch_names_the_key(void **state) {
    (void)state;
    if (test_size < 2) skip();
    dsm_config_t cfg = NULL;
    char text[200];
    const char *a = "{\"train_micro_batch_size_per_gpu\": 1, \"zero_optimization\": {\"stage\": 1}}";
    const char *b = "{\"train_micro_batch_size_per_gpu\": 1, \"zero_optimization\": {\"stage\": 2}}";
    snprintf(text, sizeof text, "the first differing key is zero_optimization.stage: rank 0 has 1, rank %d has 2",
             test_size - 1);
    ASSERT_FAILS(dsm_config_load(MPI_COMM_WORLD, last() ? b : a, 0, &cfg), DSM_ERR_MISMATCH, text);
    /* Rank 1 differs first when every rank but 0 differs. */
    ASSERT_FAILS(dsm_config_load(MPI_COMM_WORLD, test_rank == 0 ? a : b, 0, &cfg), DSM_ERR_MISMATCH,
                 "zero_optimization.stage: rank 0 has 1, rank 1 has 2");
    /* A key only one side has (a scheduler's parameters). */
    const char *c = "{\"train_micro_batch_size_per_gpu\": 1, \"zero_optimization\": {\"stage\": 1}, "
                    "\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_num_steps\": 5}}}";
    snprintf(text, sizeof text,
             "the first differing key is scheduler: rank 0 has null, rank %d has {\"type\":\"WarmupLR\"",
             test_size - 1);
    ASSERT_FAILS(dsm_config_load(MPI_COMM_WORLD, last() ? c : a, 0, &cfg), DSM_ERR_MISMATCH, text);
    assert_null(cfg);
}

static void test_strict_and_unknown_keys(void **state) {
    (void)state;
    const char *text = "{\"train_micro_batch_size_per_gpu\": 1, \"no_such_key\": 3}";
    dsm_config_t cfg = NULL;
    ASSERT_OK(dsm_config_load(MPI_COMM_WORLD, text, 0, &cfg));
    ASSERT_OK(dsm_config_free(&cfg));
    ASSERT_FAILS(dsm_config_load(MPI_COMM_WORLD, text, DSM_CONFIG_STRICT, &cfg), DSM_ERR_CONFIG, "no_such_key");
}

static void test_data_parallel_size_from_mesh_and_sp(void **state) {
    (void)state;
    if (test_size % 2) skip();
    dsm_config_t cfg = NULL;
    int64_t w = 0, tb = 0;
    /* sequence_parallel_size in the configuration: W = world / 2. */
    ASSERT_OK(dsm_config_load(MPI_COMM_WORLD,
                              "{\"sequence_parallel_size\": 2, \"train_micro_batch_size_per_gpu\": 1}", 0, &cfg));
    ASSERT_OK(dsm_config_batch(cfg, &tb, NULL, NULL, &w));
    assert_int_equal(w, test_size / 2);
    assert_int_equal(tb, test_size / 2);
    ASSERT_OK(dsm_config_free(&cfg));
    /* A mesh's data_parallel dimension. */
    dsm_mesh_t mesh = NULL;
    ASSERT_OK(dsm_mesh_create_dp_sp(MPI_COMM_WORLD, -1, 2, &mesh));
    ASSERT_OK(dsm_config_load_for_mesh(mesh, "{\"train_micro_batch_size_per_gpu\": 3}", 0, &cfg));
    ASSERT_OK(dsm_config_batch(cfg, &tb, NULL, NULL, &w));
    assert_int_equal(w, test_size / 2);
    assert_int_equal(tb, 3 * test_size / 2);
    /* The resolved sequence_parallel_size is the mesh's; a configuration that says otherwise fails every rank. */
    char *text = NULL;
    ASSERT_OK(dsm_config_describe(cfg, DSM_FORMAT_TEXT, &text));
    assert_non_null(strstr(text, "\nsequence_parallel_size = 2\n"));
    dsm_free(text);
    ASSERT_OK(dsm_config_free(&cfg));
    ASSERT_FAILS(dsm_config_load_for_mesh(mesh, "{\"train_micro_batch_size_per_gpu\": 3, \"sequence_parallel_size\": 4}",
                                          0, &cfg),
                 DSM_ERR_CONFIG, "the configuration says 4 but the mesh's sequence_parallel dimension has 2 ranks");
    assert_null(cfg);
    ASSERT_FAILS(dsm_config_load_for_mesh(NULL, "{}", 0, &cfg), DSM_ERR_NULL_POINTER, "mesh is NULL");
    ASSERT_OK(dsm_mesh_free(&mesh));
}

static void test_resolve_and_lr(void **state) {
    (void)state;
    dsm_config_t cfg = NULL;
    const char *text = "{\"train_batch_size\": 32, \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.001}},"
                       " \"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_min_lr\": 0,"
                       " \"warmup_max_lr\": 0.001, \"warmup_num_steps\": 10, \"warmup_type\": \"linear\"}}}";
    ASSERT_OK(dsm_config_resolve(text, 8, 4, 0, &cfg));
    int64_t w = 0, mb = 0;
    ASSERT_OK(dsm_config_batch(cfg, NULL, &mb, NULL, &w));
    assert_int_equal(w, 4);
    assert_int_equal(mb, 8);
    char *out = NULL;
    /* The other ranks of the world form the sequence_parallel dimension (world 8 / data parallel 4). */
    ASSERT_OK(dsm_config_describe(cfg, DSM_FORMAT_JSON, &out));
    assert_non_null(strstr(out, "\"sequence_parallel_size\": 2"));
    dsm_free(out);
    ASSERT_OK(dsm_config_describe_lr(cfg, 10, DSM_FORMAT_JSON, &out));
    assert_non_null(strstr(out, "\"dsm-lr\""));
    dsm_free(out);
    ASSERT_FAILS(dsm_config_describe_lr(cfg, -1, DSM_FORMAT_TEXT, &out), DSM_ERR_INVALID_ARGUMENT, "-1");
    ASSERT_OK(dsm_config_free(&cfg));
    ASSERT_FAILS(dsm_config_resolve(text, 0, 0, 0, &cfg), DSM_ERR_INVALID_ARGUMENT, "world_size is 0");
    ASSERT_FAILS(dsm_config_resolve(text, 8, 3, 0, &cfg), DSM_ERR_INVALID_ARGUMENT, "data_parallel_size is 3");
    ASSERT_FAILS(dsm_config_resolve(NULL, 8, 0, 0, &cfg), DSM_ERR_NULL_POINTER, "config is NULL");
    ASSERT_FAILS(dsm_config_resolve(text, 8, 0, 0, NULL), DSM_ERR_NULL_POINTER, "cfg is NULL");
    ASSERT_FAILS(dsm_config_batch(NULL, NULL, NULL, NULL, NULL), DSM_ERR_NULL_POINTER, "cfg is NULL");
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_inline_and_batch),       cmocka_unit_test(test_file_and_missing_file),
        cmocka_unit_test(test_invalid_everywhere),     cmocka_unit_test(test_one_bad_rank),
        cmocka_unit_test(test_strict_and_unknown_keys), cmocka_unit_test(test_data_parallel_size_from_mesh_and_sp),
        cmocka_unit_test(test_resolve_and_lr),         cmocka_unit_test(test_not_regular_files),
        cmocka_unit_test(test_nul_and_limits),         cmocka_unit_test(test_mismatch_names_the_key),
    };
    return RUN_MPI_TESTS("config_load", tests);
}
