/*
 * The sampler of an engine on a data_parallel x sequence_parallel mesh (SP 2
 * when the world size is even): the ranks of one sequence-parallel group get
 * identical micro-batches, the data-parallel ranks disjoint ones (apart from
 * DistributedSampler's padding), and the data-parallel ranks together cover
 * the dataset every epoch; resuming from the engine's micro_steps; and the C
 * entry points' bad arguments.
 */
#include <stddef.h>
#include <stdlib.h>

#include "mpi_test.h"

#define MB 2

static const char *CFG = "{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": 1,"
                         " \"zero_optimization\": {\"stage\": 1}, \"optimizer\": {\"type\": \"SGD\","
                         " \"params\": {\"lr\": 0.1}}}";
static const int64_t shape_w[1] = {10};

typedef struct {
    dsm_mesh_t mesh;
    dsm_engine_t engine;
    int dp, sp, dp_rank;
} setup_t;

static void make_engine(setup_t *s) {
    s->sp = test_size % 2 == 0 ? 2 : 1;
    s->dp = test_size / s->sp;
    ASSERT_OK(dsm_mesh_create_dp_sp(MPI_COMM_WORLD, s->dp, s->sp, &s->mesh));
    ASSERT_OK(dsm_mesh_rank(s->mesh, "data_parallel", &s->dp_rank));
    dsm_param_desc_t d;
    memset(&d, 0, sizeof d);
    d.name = "w";
    d.ndims = 1;
    d.shape = shape_w;
    d.dtype = DSM_FLOAT32;
    d.trainable = 1;
    ASSERT_OK(dsm_engine_init(s->mesh, CFG, &d, 1, &s->engine));
}

static void free_engine(setup_t *s) {
    ASSERT_OK(dsm_engine_free(&s->engine));
    ASSERT_OK(dsm_mesh_free(&s->mesh));
}

/* This rank's indices of one epoch, MB per micro-batch, -1 where a short last micro-batch ends. */
static void epoch_indices(dsm_sampler_t smp, int64_t epoch, int64_t nb, int64_t *out) {
    for (int64_t b = 0; b < nb; ++b) {
        int64_t count = -1;
        for (int i = 0; i < MB; ++i) out[b * MB + i] = -1;
        ASSERT_OK(dsm_sampler_batch(smp, epoch, b, out + b * MB, MB, &count));
        assert_true(count >= 1 && count <= MB);
        if (count < MB) assert_int_equal(b, nb - 1);
    }
}

static void check_dataset(const setup_t *s, int64_t n, int shuffle, int drop_last) {
    dsm_sampler_options_t o = DSM_SAMPLER_OPTIONS_INITIALIZER;
    o.shuffle = shuffle;
    o.drop_last = drop_last;
    o.seed = 1234;
    /* DistributedSampler's per-rank count, then micro-batches of MB. */
    const int64_t per_rank = drop_last ? n / s->dp : (n + s->dp - 1) / s->dp;
    const int64_t want_nb = drop_last ? per_rank / MB : (per_rank + MB - 1) / MB;
    dsm_sampler_t smp = (dsm_sampler_t)0x1, ref = NULL;
    if (want_nb == 0) {
        ASSERT_FAILS(dsm_sampler_create_for_engine(s->engine, n, &o, &smp), DSM_ERR_INVALID_ARGUMENT,
                     "no micro-batch");
        assert_null(smp);
        return;
    }
    ASSERT_OK(dsm_sampler_create_for_engine(s->engine, n, &o, &smp));
    ASSERT_OK(dsm_sampler_create(n, s->dp, s->dp_rank, MB, &o, &ref));
    int64_t nb = 0;
    ASSERT_OK(dsm_sampler_num_batches(smp, &nb));
    assert_int_equal(nb, want_nb);
    const int64_t len = nb * MB;
    int64_t *mine = malloc((size_t)len * sizeof *mine), *theirs = malloc((size_t)len * sizeof *theirs);
    int64_t *all = malloc((size_t)(len * test_size) * sizeof *all);
    int *dp_of = malloc((size_t)test_size * sizeof *dp_of), *count = calloc((size_t)n, sizeof *count);
    int64_t *first_epoch = malloc((size_t)len * sizeof *first_epoch);
    MPI_Allgather(&s->dp_rank, 1, MPI_INT, dp_of, 1, MPI_INT, MPI_COMM_WORLD);
    for (int64_t epoch = 0; epoch < 3; ++epoch) {
        epoch_indices(smp, epoch, nb, mine);
        epoch_indices(ref, epoch, nb, theirs);
        assert_memory_equal(mine, theirs, (size_t)len * sizeof *mine); /* the engine's dp size and rank */
        if (epoch == 0) memcpy(first_epoch, mine, (size_t)len * sizeof *mine);
        if (epoch > 0 && shuffle && n >= 20) assert_memory_not_equal(mine, first_epoch, (size_t)len * sizeof *mine);
        if (epoch > 0 && !shuffle) assert_memory_equal(mine, first_epoch, (size_t)len * sizeof *mine);
        MPI_Allgather(mine, (int)len, MPI_INT64_T, all, (int)len, MPI_INT64_T, MPI_COMM_WORLD);
        memset(count, 0, (size_t)n * sizeof *count);
        int64_t seen = 0;
        for (int q = 0; q < test_size; ++q) {
            const int64_t *v = all + q * len;
            if (dp_of[q] == s->dp_rank) {
                /* Same data-parallel rank (this rank's sequence-parallel group): the same samples. */
                assert_memory_equal(v, mine, (size_t)len * sizeof *v);
            }
            /* Count each data-parallel rank once: at the first world rank that has it. */
            int first = 1;
            for (int p = 0; p < q; ++p) first &= dp_of[p] != dp_of[q];
            if (!first) continue;
            for (int64_t i = 0; i < len; ++i) {
                if (v[i] < 0) continue;
                assert_true(v[i] < n);
                ++count[v[i]];
                ++seen;
            }
        }
        if (drop_last) {
            /* No repeats: each data-parallel rank's samples are disjoint from the others'. */
            assert_int_equal(seen, nb * MB * s->dp);
            for (int64_t i = 0; i < n; ++i) assert_true(count[i] <= 1);
            if (n % (s->dp * MB) == 0)
                for (int64_t i = 0; i < n; ++i) assert_int_equal(count[i], 1);
        } else {
            /* Every sample, and the padding's repeats: per_rank * dp positions in all. */
            assert_int_equal(seen, per_rank * s->dp);
            for (int64_t i = 0; i < n; ++i) assert_true(count[i] >= 1);
            if (n % s->dp == 0)
                for (int64_t i = 0; i < n; ++i) assert_int_equal(count[i], 1);
        }
    }
    free(mine);
    free(theirs);
    free(all);
    free(dp_of);
    free(count);
    free(first_epoch);
    ASSERT_OK(dsm_sampler_free(&smp));
    assert_null(smp);
    ASSERT_OK(dsm_sampler_free(&ref));
}

static void test_engine_sampler(void **state) {
    (void)state;
    setup_t s;
    make_engine(&s);
    const int64_t sizes[] = {1, 3, 7, 16, 37, 64};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; ++k)
        for (int flags = 0; flags < 4; ++flags) check_dataset(&s, sizes[k], flags & 1, (flags >> 1) & 1);
    free_engine(&s);
}

/* Resume: after k micro-steps the engine's counter locates micro-batch k of the run. */
static void test_resume(void **state) {
    (void)state;
    setup_t s;
    make_engine(&s);
    dsm_sampler_t smp;
    ASSERT_OK(dsm_sampler_create_for_engine(s.engine, 11, NULL, &smp)); /* ceil(ceil(11 / dp) / 2) per epoch */
    int64_t nb;
    ASSERT_OK(dsm_sampler_num_batches(smp, &nb));
    for (int64_t k = 0; k < 2 * nb + 1; ++k) {
        dsm_step_info_t info = DSM_STEP_INFO_INITIALIZER;
        ASSERT_OK(dsm_engine_step_info(s.engine, &info));
        assert_int_equal(info.micro_steps, k);
        int64_t epoch = -1, batch = -1, idx[MB], count;
        ASSERT_OK(dsm_sampler_locate(smp, info.micro_steps, &epoch, &batch));
        assert_int_equal(epoch, k / nb);
        assert_int_equal(batch, k % nb);
        ASSERT_OK(dsm_sampler_batch(smp, epoch, batch, idx, MB, &count));
        ASSERT_OK(dsm_step(s.engine, NULL));
    }
    ASSERT_OK(dsm_sampler_free(&smp));
    free_engine(&s);
}

static void test_bad_arguments(void **state) {
    (void)state;
    dsm_sampler_t smp = (dsm_sampler_t)0x1, none = NULL;
    dsm_sampler_options_t o = DSM_SAMPLER_OPTIONS_INITIALIZER;
    int64_t nb_old = 0, idx_old[6], count_old = 0;
    ASSERT_FAILS(dsm_sampler_create(0, 1, 0, 1, NULL, &smp), DSM_ERR_INVALID_ARGUMENT, "num_samples is 0");
    assert_null(smp);
    ASSERT_FAILS(dsm_sampler_create(10, 0, 0, 1, NULL, &smp), DSM_ERR_INVALID_ARGUMENT, "replicas is 0");
    ASSERT_FAILS(dsm_sampler_create(10, 2, 5, 1, NULL, &smp), DSM_ERR_INVALID_ARGUMENT, "rank is 5, outside [0, 2)");
    ASSERT_FAILS(dsm_sampler_create(10, 2, 0, -3, NULL, &smp), DSM_ERR_INVALID_ARGUMENT, "micro_batch is -3");
    ASSERT_FAILS(dsm_sampler_create(10, 2, 0, 1, NULL, NULL), DSM_ERR_NULL_POINTER, "sampler (the output) is NULL");
    o.size = 4;
    ASSERT_FAILS(dsm_sampler_create(10, 2, 0, 1, &o, &smp), DSM_ERR_INVALID_ARGUMENT, "options->size is 4");
    o.size = sizeof o + 8; /* a newer header's struct: fields this library cannot honour */
    ASSERT_FAILS(dsm_sampler_create(10, 2, 0, 1, &o, &smp), DSM_ERR_INVALID_ARGUMENT, "expected at most");
    /* an older, shorter struct: the fields it lacks keep their defaults */
    o.size = offsetof(dsm_sampler_options_t, seed);
    o.shuffle = 0;
    o.drop_last = 1; /* beyond o.size: not read, so the default (0) holds */
    ASSERT_OK(dsm_sampler_create(10, 2, 0, 6, &o, &smp));
    ASSERT_OK(dsm_sampler_num_batches(smp, &nb_old));
    assert_int_equal(nb_old, 1); /* 5 samples per rank, one short micro-batch kept */
    ASSERT_OK(dsm_sampler_batch(smp, 0, 0, idx_old, 6, &count_old));
    assert_int_equal(count_old, 5);
    assert_int_equal(idx_old[1], 2); /* not shuffled: 0, 2, 4, ... */
    ASSERT_OK(dsm_sampler_free(&smp));
    o.size = sizeof o;
    o.shuffle = 1;
    o.drop_last = 1;
    ASSERT_FAILS(dsm_sampler_create(10, 2, 0, 6, &o, &smp), DSM_ERR_INVALID_ARGUMENT,
                 "no micro-batch at all with drop_last");
    ASSERT_FAILS(dsm_sampler_create_for_engine(NULL, 10, NULL, &smp), DSM_ERR_NULL_POINTER, "engine is NULL");
    ASSERT_OK(dsm_sampler_free(NULL)); /* as every dsm_*_free(): NULL does nothing */
    ASSERT_OK(dsm_sampler_free(&none));
    int64_t nb, idx[4], count = 9, epoch, batch;
    ASSERT_FAILS(dsm_sampler_num_batches(NULL, &nb), DSM_ERR_NULL_POINTER, "sampler is NULL");
    ASSERT_FAILS(dsm_sampler_batch(NULL, 0, 0, idx, 4, &count), DSM_ERR_NULL_POINTER, "sampler is NULL");
    assert_int_equal(count, 0);
    ASSERT_FAILS(dsm_sampler_locate(NULL, 0, &epoch, &batch), DSM_ERR_NULL_POINTER, "sampler is NULL");
    ASSERT_OK(dsm_sampler_create(10, 2, 1, 4, NULL, &smp)); /* 5 samples: micro-batches of 4 and 1 */
    ASSERT_FAILS(dsm_sampler_num_batches(smp, NULL), DSM_ERR_NULL_POINTER, "num_batches is NULL");
    ASSERT_FAILS(dsm_sampler_batch(smp, 0, 0, NULL, 4, &count), DSM_ERR_NULL_POINTER, "indices is NULL");
    ASSERT_FAILS(dsm_sampler_batch(smp, 0, 0, idx, 4, NULL), DSM_ERR_NULL_POINTER, "count is NULL");
    ASSERT_FAILS(dsm_sampler_batch(smp, 0, 0, idx, 3, &count), DSM_ERR_INVALID_ARGUMENT, "len is 3");
    ASSERT_FAILS(dsm_sampler_batch(smp, -2, 0, idx, 4, &count), DSM_ERR_INVALID_ARGUMENT, "epoch is -2");
    ASSERT_FAILS(dsm_sampler_batch(smp, 0, 2, idx, 4, &count), DSM_ERR_INVALID_ARGUMENT, "batch is 2, outside [0, 2)");
    ASSERT_OK(dsm_sampler_batch(smp, 0, 1, idx, 1, &count));
    assert_int_equal(count, 1);
    ASSERT_FAILS(dsm_sampler_locate(smp, -1, &epoch, &batch), DSM_ERR_INVALID_ARGUMENT, "micro_steps is -1");
    ASSERT_FAILS(dsm_sampler_locate(smp, 0, NULL, &batch), DSM_ERR_NULL_POINTER, "epoch is NULL");
    ASSERT_OK(dsm_sampler_locate(smp, 5, &epoch, &batch));
    assert_int_equal(epoch, 2);
    assert_int_equal(batch, 1);
    /* Positions and resuming: 10 samples over 2 replicas, micro-batches of 4. */
    int64_t samples = -1;
    ASSERT_FAILS(dsm_sampler_position(NULL, 0, 0, &samples), DSM_ERR_NULL_POINTER, "sampler is NULL");
    ASSERT_FAILS(dsm_sampler_position(smp, 0, 0, NULL), DSM_ERR_NULL_POINTER, "samples is NULL");
    ASSERT_FAILS(dsm_sampler_position(smp, -1, 0, &samples), DSM_ERR_INVALID_ARGUMENT, "epoch is -1");
    ASSERT_FAILS(dsm_sampler_position(smp, 0, 2, &samples), DSM_ERR_INVALID_ARGUMENT, "batch is 2");
    assert_int_equal(samples, 0);
    ASSERT_OK(dsm_sampler_position(smp, 3, 0, &samples));
    assert_int_equal(samples, 3 * 10 + 8);
    ASSERT_OK(dsm_sampler_position(smp, 3, 1, &samples));
    assert_int_equal(samples, 4 * 10);
    ASSERT_FAILS(dsm_sampler_resume(NULL, 0, &epoch), DSM_ERR_NULL_POINTER, "sampler is NULL");
    ASSERT_FAILS(dsm_sampler_resume(smp, 0, NULL), DSM_ERR_NULL_POINTER, "epoch is NULL");
    ASSERT_FAILS(dsm_sampler_resume(smp, -5, &epoch), DSM_ERR_INVALID_ARGUMENT, "samples is -5");
    ASSERT_FAILS(dsm_sampler_epoch_batches(NULL, 0, &nb), DSM_ERR_NULL_POINTER, "sampler is NULL");
    ASSERT_FAILS(dsm_sampler_epoch_batches(smp, 0, NULL), DSM_ERR_NULL_POINTER, "num_batches is NULL");
    ASSERT_FAILS(dsm_sampler_epoch_batches(smp, -1, &nb), DSM_ERR_INVALID_ARGUMENT, "epoch is -1");
    ASSERT_OK(dsm_sampler_free(&smp));
    assert_null(smp);
    /* 38 samples consumed (epoch 3, 8 of its 10) resume on 1 replica with
       micro-batches of 1: epoch 3 has the 2 samples left, each in one micro-batch. */
    ASSERT_OK(dsm_sampler_create(10, 1, 0, 1, NULL, &smp));
    ASSERT_OK(dsm_sampler_resume(smp, 38, &epoch));
    assert_int_equal(epoch, 3);
    ASSERT_OK(dsm_sampler_epoch_batches(smp, 3, &nb));
    assert_int_equal(nb, 2);
    ASSERT_OK(dsm_sampler_epoch_batches(smp, 4, &nb));
    assert_int_equal(nb, 10);
    ASSERT_OK(dsm_sampler_position(smp, 3, 0, &samples));
    assert_int_equal(samples, 39);
    ASSERT_OK(dsm_sampler_free(&smp));
}

static void test_shard_batch(void **state) {
    (void)state;
    /* The sequence-parallel ranks of the world each take their chunk of a 2 x 5 batch. */
    const int64_t tok[10] = {10, 11, 12, 13, 14, 20, 21, 22, 23, 24};
    int64_t t[10], p[10], l[10], chunk = -1, valid = -1;
    ASSERT_OK(dsm_sp_shard_batch(test_size, test_rank, 2, 5, tok, NULL, NULL, 0, 10, t, p, l, &chunk, &valid));
    assert_int_equal(chunk, (5 + test_size - 1) / test_size);
    int64_t expect_valid = 0;
    for (int64_t b = 0; b < 2; ++b)
        for (int64_t k = 0; k < chunk; ++k) {
            const int64_t pos = test_rank * chunk + k;
            assert_int_equal(t[b * chunk + k], pos < 5 ? tok[b * 5 + pos] : 0);
            assert_int_equal(p[b * chunk + k], pos);
            assert_int_equal(l[b * chunk + k], pos < 4 ? tok[b * 5 + pos + 1] : DSM_IGNORE_INDEX);
            expect_valid += pos < 4;
        }
    assert_int_equal(valid, expect_valid);
    int64_t total = 0;
    MPI_Allreduce(&valid, &total, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    assert_int_equal(total, 8); /* 2 rows of 4 predicted tokens */
    ASSERT_OK(dsm_sp_shard_batch(1, 0, 2, 5, tok, NULL, NULL, 0, 10, t, p, l, &chunk, NULL));
    ASSERT_FAILS(dsm_sp_shard_batch(1, 0, 2, 5, tok, NULL, NULL, 0, 10, t, p, l, NULL, &valid), DSM_ERR_NULL_POINTER,
                 "chunk is NULL");
    ASSERT_FAILS(dsm_sp_shard_batch(4, 4, 2, 5, tok, NULL, NULL, 0, 10, t, p, l, &chunk, &valid),
                 DSM_ERR_INVALID_ARGUMENT, "rank is 4, outside [0, 4)");
    assert_int_equal(chunk, 0);
    ASSERT_FAILS(dsm_sp_shard_batch(1, 0, 2, 5, tok, NULL, NULL, 0, 9, t, p, l, &chunk, &valid),
                 DSM_ERR_INVALID_ARGUMENT, "out_len is 9");
    ASSERT_FAILS(dsm_sp_shard_batch(1, 0, 2, 5, NULL, NULL, NULL, 0, 10, t, p, l, &chunk, &valid),
                 DSM_ERR_NULL_POINTER, "tokens is NULL");
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_engine_sampler),
        cmocka_unit_test(test_resume),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_shard_batch),
    };
    return RUN_MPI_TESTS("test_sp_data", tests);
}
