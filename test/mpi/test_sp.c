/*
 * Ulysses sequence parallelism: the all-to-all transforms put every element
 * where the contract says (checked against the global tensor, bit for bit),
 * round trips are the identity for both layouts, all dtypes, even, uneven and
 * missing heads, P = 1, 2, 4, 8; q/k/v in one call with grouped-query keys and
 * values (replicated heads, summed on the way back); the loss over the group;
 * every bad argument, on one rank or all, fails every rank without a hang.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mpi_test.h"

static int bits_of(dsm_dtype_t t) { return t == DSM_FLOAT32 ? 32 : t == DSM_FLOAT64 ? 64 : 16; }

/* A distinct value for every element of the global tensor, as raw bits. */
static uint64_t value(int64_t bi, int64_t ti, int64_t h, int64_t e) {
    uint64_t v = (uint64_t)(bi * 1000003 + ti * 1009 + h * 31 + e + 1);
    return v * 0x9E3779B97F4A7C15ull >> 17;
}

static void put(void *buf, size_t i, dsm_dtype_t t, uint64_t v) {
    switch (bits_of(t)) {
    case 32: ((uint32_t *)buf)[i] = (uint32_t)v; break;
    case 64: ((uint64_t *)buf)[i] = v; break;
    default: ((uint16_t *)buf)[i] = (uint16_t)v; break;
    }
}

static uint64_t get(const void *buf, size_t i, dsm_dtype_t t) {
    switch (bits_of(t)) {
    case 32: return ((const uint32_t *)buf)[i];
    case 64: return ((const uint64_t *)buf)[i];
    default: return ((const uint16_t *)buf)[i];
    }
}

static uint64_t mask(dsm_dtype_t t) { return bits_of(t) == 64 ? ~0ull : (1ull << bits_of(t)) - 1; }

/* Index of (bi, ti, h, e) in a [b, s, H, d] or [s, b, H, d] tensor. */
static size_t at(dsm_sp_layout_t l, int64_t b, int64_t s, int64_t H, int64_t d, int64_t bi, int64_t ti, int64_t h,
                 int64_t e) {
    (void)s;
    return l == DSM_SP_SEQ_FIRST ? (size_t)(((ti * b + bi) * H + h) * d + e) : (size_t)(((bi * s + ti) * H + h) * d + e);
}

/* The sequence-sharded piece of rank `r` of the global tensor. */
static void *make_seq_sharded(const dsm_sp_tensor_t *t, int P, int r, size_t *count) {
    const int64_t chunk = t->seq / P;
    size_t n = (size_t)(t->batch * chunk * t->heads * t->head_dim);
    void *buf = malloc(n * (size_t)(bits_of(t->dtype) / 8) + 1);
    for (int64_t bi = 0; bi < t->batch; ++bi)
        for (int64_t ti = 0; ti < chunk; ++ti)
            for (int64_t h = 0; h < t->heads; ++h)
                for (int64_t e = 0; e < t->head_dim; ++e)
                    put(buf, at(t->layout, t->batch, chunk, t->heads, t->head_dim, bi, ti, h, e), t->dtype,
                        value(bi, r * chunk + ti, h, e));
    *count = n;
    return buf;
}

static dsm_sp_t make_sp(dsm_mesh_t *mesh) {
    ASSERT_OK(dsm_mesh_create_dp_sp(MPI_COMM_WORLD, 1, -1, mesh));
    dsm_sp_t sp = NULL;
    ASSERT_OK(dsm_sp_create(*mesh, NULL, &sp));
    return sp;
}

/* This rank's place in the group: its mesh position, which node-aware
   placement may make differ from its world rank across nodes. */
static int sp_rank(dsm_sp_t sp) {
    int r = -1;
    ASSERT_OK(dsm_sp_rank(sp, &r));
    return r;
}

static void free_sp(dsm_sp_t *sp, dsm_mesh_t *mesh) {
    ASSERT_OK(dsm_sp_free(sp));
    assert_null(*sp);
    ASSERT_OK(dsm_mesh_free(mesh));
}

/* Forward: every element lands where the contract says; back: identity. */
static void round_trip(dsm_sp_t sp, const dsm_sp_tensor_t *t) {
    int P = 0, r = 0;
    ASSERT_OK(dsm_sp_size(sp, &P));
    ASSERT_OK(dsm_sp_rank(sp, &r));
    size_t n_in = 0, n_seq = 0, n_head = 0;
    ASSERT_OK(dsm_sp_counts(sp, t, &n_seq, &n_head));
    void *in = make_seq_sharded(t, P, r, &n_in);
    assert_int_equal(n_in, n_seq);
    const size_t es = (size_t)bits_of(t->dtype) / 8;
    void *mid = malloc(n_head * es + 1), *back = malloc(n_seq * es + 1);
    ASSERT_OK(dsm_sp_seq_to_head(sp, t, in, n_seq, mid, n_head));
    int64_t first = 0, count = 0;
    ASSERT_OK(dsm_sp_head_range(t->heads, t->flags, P, r, &first, &count));
    assert_int_equal(n_head, (size_t)(t->batch * t->seq * count * t->head_dim));
    for (int64_t bi = 0; bi < t->batch; ++bi)
        for (int64_t ti = 0; ti < t->seq; ++ti)
            for (int64_t h = 0; h < count; ++h)
                for (int64_t e = 0; e < t->head_dim; ++e) {
                    const size_t i = at(t->layout, t->batch, t->seq, count, t->head_dim, bi, ti, h, e);
                    const uint64_t want = value(bi, ti, first + h, e) & mask(t->dtype);
                    if (get(mid, i, t->dtype) != want)
                        fail_msg("rank %d: seq_to_head [b %lld, s %lld, head %lld, e %lld] has %llx, want %llx", r,
                                 (long long)bi, (long long)ti, (long long)(first + h), (long long)e,
                                 (unsigned long long)get(mid, i, t->dtype), (unsigned long long)want);
                }
    if (!(t->flags & DSM_SP_REPLICATE) || t->heads >= P) {
        ASSERT_OK(dsm_sp_head_to_seq(sp, t, mid, n_head, back, n_seq));
        assert_memory_equal(in, back, n_seq * es);
    }
    free(in);
    free(mid);
    free(back);
}

static void test_round_trips(void **state) {
    (void)state;
    dsm_mesh_t mesh = NULL;
    dsm_sp_t sp = make_sp(&mesh);
    int P = 0;
    ASSERT_OK(dsm_sp_size(sp, &P));
    assert_int_equal(P, test_size);
    const dsm_dtype_t dtypes[] = {DSM_FLOAT32, DSM_FLOAT16, DSM_BFLOAT16, DSM_FLOAT64};
    const int64_t heads[] = {2 * P, 7, 1, P + 1};
    for (int l = 0; l < 2; ++l)
        for (size_t k = 0; k < sizeof dtypes / sizeof dtypes[0]; ++k)
            for (size_t h = 0; h < sizeof heads / sizeof heads[0]; ++h) {
                dsm_sp_tensor_t t = {2, 3 * P, heads[h], 5, (dsm_sp_layout_t)l, dtypes[k], 0};
                round_trip(sp, &t);
            }
    /* batch 1, one token per rank, head_dim 1 */
    dsm_sp_tensor_t t = {1, P, P, 1, DSM_SP_BATCH_FIRST, DSM_FLOAT32, 0};
    round_trip(sp, &t);
    free_sp(&sp, &mesh);
}

/* Inputs in memory from dsm_sp_alloc(): read in place by the peers of a node. */
static void test_shared_inputs(void **state) {
    (void)state;
    dsm_mesh_t mesh = NULL;
    dsm_sp_t sp = make_sp(&mesh);
    const int P = test_size, r = sp_rank(sp);
    const dsm_dtype_t dtypes[] = {DSM_FLOAT32, DSM_BFLOAT16};
    for (int l = 0; l < 2; ++l)
        for (int k = 0; k < 2; ++k) {
            dsm_sp_tensor_t t = {2, 3 * P, 7, 5, (dsm_sp_layout_t)l, dtypes[k], 0};
            size_t ns = 0, nh = 0, n_in = 0;
            ASSERT_OK(dsm_sp_counts(sp, &t, &ns, &nh));
            const size_t es = (size_t)bits_of(t.dtype) / 8;
            void *src = make_seq_sharded(&t, P, r, &n_in);
            void *in = NULL, *mid = NULL, *back = malloc(ns * es + 1);
            ASSERT_OK(dsm_sp_alloc(sp, ns * es, &in));
            assert_non_null(in);
            assert_int_equal((uintptr_t)in % 64, 0);
            memcpy(in, src, ns * es);
            ASSERT_OK(dsm_sp_alloc(sp, nh * es, &mid)); /* sizes differ across ranks: 7 heads */
            ASSERT_OK(dsm_sp_seq_to_head(sp, &t, in, ns, mid, nh));
            ASSERT_OK(dsm_sp_head_to_seq(sp, &t, mid, nh, back, ns));
            assert_memory_equal(src, back, ns * es);
            /* the same transform from private memory gives the same bytes */
            void *mid2 = malloc(nh * es + 1);
            ASSERT_OK(dsm_sp_seq_to_head(sp, &t, src, ns, mid2, nh));
            assert_memory_equal(mid, mid2, nh * es);
            ASSERT_OK(dsm_sp_free_memory(sp, &mid));
            ASSERT_OK(dsm_sp_free_memory(sp, &in));
            assert_null(mid);
            assert_null(in);
            free(src);
            free(back);
            free(mid2);
        }
    void *z = NULL, *a = NULL, *b = (void *)&z;
    ASSERT_OK(dsm_sp_alloc(sp, 0, &z));
    assert_non_null(z);
    ASSERT_OK(dsm_sp_alloc(sp, 64, &a));
    ASSERT_FAILS(dsm_sp_alloc(sp, 8, r == 0 ? NULL : &b), DSM_ERR_NULL_POINTER, "ptr is NULL");
    assert_null(r == 0 ? NULL : b); /* outputs are NULL after a failure */
    int local = 0;
    void *wrong = r == P - 1 ? (void *)&local : a, *none = NULL;
    ASSERT_FAILS(dsm_sp_free_memory(sp, &wrong), DSM_ERR_INVALID_ARGUMENT, "was not returned by dsm_sp_alloc()");
    assert_ptr_equal(wrong, r == P - 1 ? (void *)&local : a); /* left as it was after a failure */
    if (P > 1) {
        void *some = r == 0 ? NULL : a;
        ASSERT_FAILS(dsm_sp_free_memory(sp, &some), DSM_ERR_MISMATCH, "some ranks passed NULL");
    }
    ASSERT_FAILS(dsm_sp_free_memory(sp, r == 0 ? NULL : &none), DSM_ERR_NULL_POINTER, "ptr is NULL");
    ASSERT_OK(dsm_sp_free_memory(sp, &none));
    /* What users do: free through the variable, which is NULL afterwards,
       so that a second free (a cleanup path that frees everything) does
       nothing. */
    void *copy = a;
    ASSERT_OK(dsm_sp_free_memory(sp, &a));
    assert_null(a);
    ASSERT_OK(dsm_sp_free_memory(sp, &a));
    assert_null(a);
    /* A copy of the pointer kept elsewhere is not nulled: freeing it is an
       error on every rank, not a double free. */
    ASSERT_FAILS(dsm_sp_free_memory(sp, &copy), DSM_ERR_INVALID_ARGUMENT, "freed already");
    (void)z; /* released by dsm_sp_free() */
    free_sp(&sp, &mesh);
}

/* Heads split as evenly as possible; replicated heads. */
static void test_head_range(void **state) {
    (void)state;
    int64_t f = 0, c = 0;
    const int64_t want_f[4] = {0, 2, 4, 6}, want_c[4] = {2, 2, 2, 1};
    for (int r = 0; r < 4; ++r) {
        ASSERT_OK(dsm_sp_head_range(7, 0, 4, r, &f, &c));
        assert_int_equal(f, want_f[r]);
        assert_int_equal(c, want_c[r]);
    }
    ASSERT_OK(dsm_sp_head_range(3, 0, 4, 3, &f, &c)); /* a rank without heads */
    assert_int_equal(c, 0);
    for (int r = 0; r < 8; ++r) { /* 2 kv heads over 8 ranks: 4 copies each */
        ASSERT_OK(dsm_sp_head_range(2, DSM_SP_REPLICATE, 8, r, &f, &c));
        assert_int_equal(f, r / 4);
        assert_int_equal(c, 1);
    }
    ASSERT_OK(dsm_sp_head_range(8, DSM_SP_REPLICATE, 4, 3, &f, &c));
    assert_int_equal(f, 6);
    assert_int_equal(c, 2);
    ASSERT_FAILS(dsm_sp_head_range(3, DSM_SP_REPLICATE, 4, 0, &f, &c), DSM_ERR_INVALID_ARGUMENT, "multiple");
    ASSERT_FAILS(dsm_sp_head_range(6, DSM_SP_REPLICATE, 4, 0, &f, &c), DSM_ERR_INVALID_ARGUMENT, "multiple");
    ASSERT_FAILS(dsm_sp_head_range(0, 0, 4, 0, &f, &c), DSM_ERR_INVALID_ARGUMENT, "heads is 0");
    ASSERT_FAILS(dsm_sp_head_range(4, 0, 0, 0, &f, &c), DSM_ERR_INVALID_ARGUMENT, "group size is 0");
    ASSERT_FAILS(dsm_sp_head_range(4, 0, 4, 4, &f, &c), DSM_ERR_INVALID_ARGUMENT, "rank 4");
    ASSERT_FAILS(dsm_sp_head_range(4, 8, 4, 0, &f, &c), DSM_ERR_INVALID_ARGUMENT, "unknown bits");
    ASSERT_FAILS(dsm_sp_head_range(4, 0, 4, 0, NULL, &c), DSM_ERR_NULL_POINTER, "first");
}

/* q, k, v in one call: q with H heads, k and v with fewer (GQA), replicated
   when there are fewer than P; the way back sums the copies. */
static void test_qkv(void **state) {
    (void)state;
    dsm_mesh_t mesh = NULL;
    dsm_sp_t sp = make_sp(&mesh);
    const int P = test_size, r = sp_rank(sp);
    const int64_t kvh = P % 2 == 0 ? P / 2 : 1; /* divides P: replication possible */
    dsm_sp_tensor_t t[3] = {{2, 2 * P, 2 * P, 4, DSM_SP_BATCH_FIRST, DSM_FLOAT32, 0},
                            {2, 2 * P, kvh, 4, DSM_SP_BATCH_FIRST, DSM_FLOAT32, DSM_SP_REPLICATE},
                            {2, 2 * P, kvh, 4, DSM_SP_BATCH_FIRST, DSM_FLOAT32, DSM_SP_REPLICATE}};
    const void *in[3];
    void *out[3], *back[3];
    size_t in_count[3], out_count[3];
    float *src[3];
    for (int k = 0; k < 3; ++k) {
        size_t ns = 0, nh = 0;
        ASSERT_OK(dsm_sp_counts(sp, &t[k], &ns, &nh));
        /* small integers: sums of copies are exact */
        src[k] = malloc(ns * sizeof(float));
        const int64_t chunk = t[k].seq / P;
        for (int64_t bi = 0; bi < 2; ++bi)
            for (int64_t ti = 0; ti < chunk; ++ti)
                for (int64_t h = 0; h < t[k].heads; ++h)
                    for (int64_t e = 0; e < 4; ++e)
                        src[k][((bi * chunk + ti) * t[k].heads + h) * 4 + e] =
                            (float)(k * 100000 + bi * 10000 + (r * chunk + ti) * 100 + h * 10 + e);
        in[k] = src[k];
        in_count[k] = ns;
        out[k] = malloc(nh * sizeof(float));
        out_count[k] = nh;
        back[k] = malloc(ns * sizeof(float));
    }
    ASSERT_OK(dsm_sp_seq_to_head_n(sp, 3, t, in, in_count, out, out_count));
    for (int k = 0; k < 3; ++k) {
        int64_t first = 0, count = 0;
        ASSERT_OK(dsm_sp_head_range(t[k].heads, t[k].flags, P, r, &first, &count));
        const float *o = out[k];
        for (int64_t bi = 0; bi < 2; ++bi)
            for (int64_t ti = 0; ti < t[k].seq; ++ti)
                for (int64_t h = 0; h < count; ++h)
                    for (int64_t e = 0; e < 4; ++e)
                        assert_true(o[((bi * t[k].seq + ti) * count + h) * 4 + e] ==
                                    (float)(k * 100000 + bi * 10000 + ti * 100 + (first + h) * 10 + e));
    }
    /* back: q is the identity; k and v come back times the copies of each head */
    const void *mid[3] = {out[0], out[1], out[2]};
    ASSERT_OK(dsm_sp_head_to_seq_n(sp, 3, t, mid, out_count, back, in_count));
    const float copies = kvh < P ? (float)(P / kvh) : 1.0f;
    for (int k = 0; k < 3; ++k)
        for (size_t i = 0; i < in_count[k]; ++i)
            assert_true(((float *)back[k])[i] == src[k][i] * (k == 0 ? 1.0f : copies));
    for (int k = 0; k < 3; ++k) {
        free(src[k]);
        free(out[k]);
        free(back[k]);
    }
    free_sp(&sp, &mesh);
}

/* Replicated bf16 heads are summed in fp32 and rounded once. */
static void test_replicated_bf16_sum(void **state) {
    (void)state;
    if (test_size < 2) skip();
    dsm_mesh_t mesh = NULL;
    dsm_sp_t sp = make_sp(&mesh);
    const int P = test_size;
    dsm_sp_tensor_t t = {1, P, 1, 2, DSM_SP_SEQ_FIRST, DSM_BFLOAT16, DSM_SP_REPLICATE};
    size_t ns = 0, nh = 0;
    ASSERT_OK(dsm_sp_counts(sp, &t, &ns, &nh));
    assert_int_equal(ns, 2);
    assert_int_equal(nh, (size_t)(P * 2));
    uint16_t mid[16], back[2];
    float one = 1.0f + 1.0f / 128.0f; /* 1 + 2^-7: exact in bf16 */
    uint32_t bits;
    memcpy(&bits, &one, 4);
    for (int i = 0; i < P * 2; ++i) mid[i] = (uint16_t)(bits >> 16);
    ASSERT_OK(dsm_sp_head_to_seq(sp, &t, mid, nh, back, ns));
    float want = one * (float)P; /* the fp32 sum (exact), rounded once to nearest even */
    memcpy(&bits, &want, 4);
    const uint16_t rounded = (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
    assert_int_equal(back[0], rounded);
    assert_int_equal(back[1], rounded);
    free_sp(&sp, &mesh);
}

/* A DP x SP mesh: the transforms run inside each SP group independently. */
static void test_dp_by_sp(void **state) {
    (void)state;
    if (test_size % 2 != 0) skip();
    dsm_mesh_t mesh = NULL;
    ASSERT_OK(dsm_mesh_create_dp_sp(MPI_COMM_WORLD, -1, 2, &mesh));
    dsm_sp_t sp = NULL;
    ASSERT_OK(dsm_sp_create(mesh, "sequence_parallel", &sp));
    int P = 0;
    ASSERT_OK(dsm_sp_size(sp, &P));
    assert_int_equal(P, 2);
    dsm_sp_tensor_t t = {3, 8, 3, 2, DSM_SP_SEQ_FIRST, DSM_FLOAT32, 0};
    round_trip(sp, &t);
    free_sp(&sp, &mesh);
}

static void test_loss(void **state) {
    (void)state;
    dsm_mesh_t mesh = NULL;
    dsm_sp_t sp = make_sp(&mesh);
    const int P = test_size, r = test_rank;
    double mean = -1, scale = -1;
    ASSERT_OK(dsm_sp_loss(sp, 2.0 * (r + 1), r + 1, &mean, &scale));
    const double tokens = P * (P + 1) / 2.0;
    assert_true(fabs(mean - 2.0) < 1e-15);
    assert_true(fabs(scale - 1.0 / tokens) < 1e-15);
    /* a chunk of the group with nothing to count is fine; all of them: 0 */
    ASSERT_OK(dsm_sp_loss(sp, r == 0 ? 3.0 : 0.0, r == 0 ? 3 : 0, &mean, &scale));
    assert_true(fabs(mean - 1.0) < 1e-15);
    ASSERT_OK(dsm_sp_loss(sp, 0.0, 0, &mean, &scale));
    assert_true(mean == 0.0 && scale == 0.0);
    /* bad values on one rank fail every rank */
    ASSERT_FAILS(dsm_sp_loss(sp, 1.0, r == P - 1 ? -4 : 1, &mean, &scale), DSM_ERR_INVALID_ARGUMENT, "tokens is -4");
    ASSERT_FAILS(dsm_sp_loss(sp, r == 0 ? NAN : 1.0, 1, &mean, &scale), DSM_ERR_INVALID_ARGUMENT, "loss_sum is nan");
    ASSERT_FAILS(dsm_sp_loss(sp, 1.0, 1, r == 0 ? NULL : &mean, &scale), DSM_ERR_NULL_POINTER, "mean");
    ASSERT_FAILS(dsm_sp_loss(NULL, 1.0, 1, &mean, &scale), DSM_ERR_NULL_POINTER, "sp");
    /* still usable */
    ASSERT_OK(dsm_sp_loss(sp, 1.0, 1, &mean, &scale));
    assert_true(fabs(mean - 1.0) < 1e-15);
    free_sp(&sp, &mesh);
}

static void test_bad_arguments(void **state) {
    (void)state;
    dsm_mesh_t mesh = NULL;
    dsm_sp_t sp = make_sp(&mesh);
    const int P = test_size, r = test_rank;
    float in[4096], out[4096];
    dsm_sp_tensor_t t = {1, 2 * P, 2 * P, 2, DSM_SP_BATCH_FIRST, DSM_FLOAT32, 0};
    size_t ns = 0, nh = 0;
    ASSERT_OK(dsm_sp_counts(sp, &t, &ns, &nh));
    dsm_sp_tensor_t b = t;
    if (P > 1) {
        b.seq = 2 * P + 1;
        ASSERT_FAILS(dsm_sp_seq_to_head(sp, &b, in, ns, out, nh), DSM_ERR_INVALID_ARGUMENT,
                     "is not a multiple of the sequence-parallel size");
    }
    /* a wrong count on one rank fails all of them, naming it */
    ASSERT_FAILS(dsm_sp_seq_to_head(sp, &t, in, r == P - 1 ? ns + 1 : ns, out, nh), DSM_ERR_INVALID_ARGUMENT,
                 "in_count is");
    ASSERT_FAILS(dsm_sp_head_to_seq(sp, &t, in, nh, out, r == 0 ? ns - 1 : ns), DSM_ERR_INVALID_ARGUMENT,
                 "out_count is");
    /* different shapes on different ranks (all valid): a mismatch, no hang */
    if (P > 1) {
        b = t;
        if (r == P - 1) b.head_dim = 1;
        size_t bs = 0, bh = 0;
        ASSERT_OK(dsm_sp_counts(sp, &b, &bs, &bh));
        ASSERT_FAILS(dsm_sp_seq_to_head(sp, &b, in, bs, out, bh), DSM_ERR_MISMATCH, "differ across ranks");
        b = t;
        if (r == 0) b.layout = DSM_SP_SEQ_FIRST;
        ASSERT_FAILS(dsm_sp_seq_to_head(sp, &b, in, ns, out, nh), DSM_ERR_MISMATCH, "seq-first");
    }
    b = t;
    b.layout = (dsm_sp_layout_t)7;
    ASSERT_FAILS(dsm_sp_seq_to_head(sp, &b, in, ns, out, nh), DSM_ERR_INVALID_ARGUMENT, "layout is 7");
    b = t;
    b.dtype = (dsm_dtype_t)42;
    ASSERT_FAILS(dsm_sp_seq_to_head(sp, &b, in, ns, out, nh), DSM_ERR_INVALID_ARGUMENT, "dtype 42");
    b = t;
    b.batch = 0;
    ASSERT_FAILS(dsm_sp_seq_to_head(sp, &b, in, ns, out, nh), DSM_ERR_INVALID_ARGUMENT, "batch is 0");
    b = t;
    b.head_dim = INT64_MAX / 2;
    ASSERT_FAILS(dsm_sp_seq_to_head(sp, &b, in, ns, out, nh), DSM_ERR_INVALID_ARGUMENT, "too large");
    b = t;
    b.dtype = DSM_INT32;
    b.flags = DSM_SP_REPLICATE;
    ASSERT_FAILS(dsm_sp_seq_to_head(sp, &b, in, ns, out, nh), DSM_ERR_INVALID_ARGUMENT, "floating-point");
    ASSERT_FAILS(dsm_sp_seq_to_head(sp, NULL, in, ns, out, nh), DSM_ERR_NULL_POINTER, "t is NULL");
    ASSERT_FAILS(dsm_sp_seq_to_head(sp, &t, r == 0 ? NULL : in, ns, out, nh), DSM_ERR_NULL_POINTER, "in is NULL");
    assert_int_equal(ns, nh);
    ASSERT_FAILS(dsm_sp_seq_to_head(sp, &t, in, ns, in + 1, nh), DSM_ERR_INVALID_ARGUMENT, "overlap");
    ASSERT_FAILS(dsm_sp_seq_to_head(NULL, &t, in, ns, out, nh), DSM_ERR_NULL_POINTER, "sp");
    ASSERT_FAILS(dsm_sp_seq_to_head_n(sp, 0, &t, NULL, NULL, NULL, NULL), DSM_ERR_INVALID_ARGUMENT, "n is 0");
    {
        const void *ins[2] = {in, in};
        void *outs[2] = {out, out + 2048};
        size_t ic[2] = {ns, ns}, oc[2] = {nh, nh};
        dsm_sp_tensor_t two[2] = {t, t};
        two[1].heads = 0;
        ASSERT_FAILS(dsm_sp_seq_to_head_n(sp, 2, two, ins, ic, outs, oc), DSM_ERR_INVALID_ARGUMENT, "tensor 1");
    }
    {
        /* outputs must be disjoint from each other and from every input (on one
           rank only: all fail); inputs may share memory */
        memset(in, 0, sizeof in);
        const void *ins[2] = {in, in};
        void *outs[2] = {out, out + 2048};
        size_t ic[2] = {ns, ns}, oc[2] = {nh, nh};
        dsm_sp_tensor_t two[2] = {t, t};
        ASSERT_OK(dsm_sp_seq_to_head_n(sp, 2, two, ins, ic, outs, oc));
        ASSERT_OK(dsm_sp_head_to_seq_n(sp, 2, two, ins, oc, outs, ic));
        if (r == P - 1) outs[1] = out + 4;
        ASSERT_FAILS(dsm_sp_seq_to_head_n(sp, 2, two, ins, ic, outs, oc), DSM_ERR_INVALID_ARGUMENT,
                     "out[0] and out[1] overlap");
        ASSERT_FAILS(dsm_sp_head_to_seq_n(sp, 2, two, ins, oc, outs, ic), DSM_ERR_INVALID_ARGUMENT,
                     "out[0] and out[1] overlap");
        outs[1] = out + 2048;
        if (r == 0) ins[1] = out + 2048 + nh - 1;
        ASSERT_FAILS(dsm_sp_seq_to_head_n(sp, 2, two, ins, ic, outs, oc), DSM_ERR_INVALID_ARGUMENT,
                     "in[1] and out[1] overlap");
        ins[1] = out + 1;
        ASSERT_FAILS(dsm_sp_head_to_seq_n(sp, 2, two, ins, oc, outs, ic), DSM_ERR_INVALID_ARGUMENT,
                     "in[1] and out[0] overlap");
        ins[1] = in;
        ASSERT_FAILS(dsm_sp_head_to_seq(sp, &t, out + 3, nh, out, ns), DSM_ERR_INVALID_ARGUMENT,
                     "in and out overlap");
    }
    ASSERT_FAILS(dsm_sp_counts(sp, NULL, &ns, &nh), DSM_ERR_NULL_POINTER, "t");
    /* still usable after every failure */
    round_trip(sp, &t);
    free_sp(&sp, &mesh);

    /* creation: unknown group, different groups, NULL outputs */
    ASSERT_OK(dsm_mesh_create_dp_sp(MPI_COMM_WORLD, 1, -1, &mesh));
    sp = (dsm_sp_t)0x1;
    ASSERT_FAILS(dsm_sp_create(mesh, "tensor_parallel", &sp), DSM_ERR_NOT_FOUND, "tensor_parallel");
    assert_null(sp);
    if (P > 1)
        ASSERT_FAILS(dsm_sp_create(mesh, r == 0 ? "data_parallel" : "sequence_parallel", &sp), DSM_ERR_MISMATCH,
                     "differ across ranks");
    ASSERT_FAILS(dsm_sp_create(mesh, NULL, r == 0 ? NULL : &sp), DSM_ERR_NULL_POINTER, "sp");
    ASSERT_FAILS(dsm_sp_create(NULL, NULL, &sp), DSM_ERR_NULL_POINTER, "mesh");
    ASSERT_OK(dsm_sp_free(NULL)); /* as every dsm_*_free(): NULL does nothing */
    dsm_sp_t none = NULL;
    ASSERT_OK(dsm_sp_free(&none));
    ASSERT_OK(dsm_mesh_free(&mesh));
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_head_range),  cmocka_unit_test(test_round_trips),
        cmocka_unit_test(test_qkv),         cmocka_unit_test(test_replicated_bf16_sum),
        cmocka_unit_test(test_dp_by_sp),    cmocka_unit_test(test_loss),
        cmocka_unit_test(test_bad_arguments), cmocka_unit_test(test_shared_inputs),
    };
    return RUN_MPI_TESTS("test_sp", tests);
}
