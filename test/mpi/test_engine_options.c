/*
 * dsm_engine_init_with_options() and the calls around it: NULL options are
 * the defaults; DSM_DEVICE_HOST gives a host engine and
 * dsm_engine_device() says so; DSM_DEVICE_DEFAULT (and NULL options,
 * dsm_engine_init(), dsm_engine_init_comm()) give DSM_DEVICE_HOST where no
 * rank has a CUDA device; an older, smaller options struct keeps the
 * defaults; every invalid field (size, device, backend, cuda_device), on
 * every rank or on one, fails every rank with DSM_ERR_INVALID_ARGUMENT
 * naming the field and its value; a device or backend that differs between
 * ranks fails every rank with DSM_ERR_MISMATCH, without a hang;
 * DSM_DEVICE_CUDA without a CUDA device is DSM_ERR_NOT_SUPPORTED on every
 * rank; dsm_engine_set_stream() on a host engine is DSM_ERR_NOT_SUPPORTED
 * naming the device; NULL handles and outputs are DSM_ERR_NULL_POINTER.
 *
 * Where every rank has a CUDA device, the DSM_DEVICE_CUDA engine is checked
 * instead: it reports DSM_DEVICE_CUDA and takes a stream.
 */
#include "dsm_config.h"

#include <stdlib.h>

#include "mpi_test.h"

#if DSM_HAVE_CUDA
#include <cuda_runtime_api.h>
#include "dsm/cuda.h"
#else
/* Built without CUDA: dsm/cuda.h's functions, with cudaStream_t as CUDA's
   driver_types.h declares it (what libdsm defines them with). */
struct CUstream_st;
typedef struct CUstream_st *cudaStream_t;
dsm_status_t dsm_engine_set_stream(dsm_engine_t engine, cudaStream_t stream);
dsm_status_t dsm_engine_stream(dsm_engine_t engine, cudaStream_t *stream);
#endif

static const int64_t shape_w[2] = {5, 3};

static const char *CFG = "{\"train_micro_batch_size_per_gpu\": 1, \"zero_optimization\": {\"stage\": 1},"
                         " \"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": 0.5}}}";

/* dsm_engine_init_with_options() on the mesh CFG describes over MPI_COMM_WORLD
 * (the explicit world mesh: a NULL mesh is an error). A successful free leaves
 * the init's message in dsm_last_error(). */
static dsm_status_t init_world(const dsm_param_desc_t *d, int n, const dsm_engine_options_t *o, dsm_engine_t *e) {
    dsm_mesh_t mesh = NULL;
    dsm_status_t st = dsm_mesh_create_for_config(MPI_COMM_WORLD, CFG, &mesh);
    if (st != DSM_SUCCESS) return st;
    st = dsm_engine_init_with_options(mesh, CFG, d, n, o, e);
    (void)dsm_mesh_free(&mesh);
    return st;
}

/* 1 when every rank has a CUDA device of its own (no node has more ranks
   than GPUs): where the default engine is device-resident. */
static int every_rank_has_gpu;
/* 1 when every rank sees a CUDA device, its own or shared. */
static int every_rank_sees_gpu;

static void params(dsm_param_desc_t d[2]) {
    memset(d, 0, 2 * sizeof d[0]);
    d[0].name = "w";
    d[0].ndims = 2;
    d[0].shape = shape_w;
    d[0].dtype = DSM_FLOAT32;
    d[0].trainable = 1;
    d[1] = d[0];
    d[1].name = "b";
    d[1].ndims = 1;
    d[1].shape = shape_w;
}

static int gpu_count(void) {
#if DSM_HAVE_CUDA
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
#else
    return 0;
#endif
}

static int setup(void **state) {
    (void)state;
    /* The defaults under test come from the library, not from the caller's environment. */
    unsetenv("DSM_ENGINE_DEVICE");
    unsetenv("DSM_COMM_BACKEND");
    unsetenv("DSM_CUDA_DEVICE");
    int mine = gpu_count() > 0 && gpu_count() >= test_node_size(test_rank), all = 0;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    every_rank_has_gpu = all;
    mine = gpu_count() > 0;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    every_rank_sees_gpu = all;
    return 0;
}

/* An engine from `options` on every rank (on `mesh`, or with NULL on the mesh
 * CFG describes over MPI_COMM_WORLD); its device, then freed. */
static dsm_device_t device_of(dsm_mesh_t mesh, const dsm_engine_options_t *options) {
    dsm_param_desc_t d[2];
    params(d);
    dsm_engine_t e = NULL;
    ASSERT_OK(mesh != NULL ? dsm_engine_init_with_options(mesh, CFG, d, 2, options, &e)
                           : init_world(d, 2, options, &e));
    assert_non_null(e);
    dsm_device_t device = DSM_DEVICE_DEFAULT;
    ASSERT_OK(dsm_engine_device(e, &device));
    assert_int_not_equal(device, DSM_DEVICE_DEFAULT);
    /* The engine works: one step. */
    float *g = NULL;
    ASSERT_OK(dsm_engine_grad_acquire(e, 0, (void **)&g));
    ASSERT_OK(dsm_engine_grad_release(e, 0));
    ASSERT_OK(dsm_step(e, NULL));
    ASSERT_OK(dsm_engine_free(&e));
    assert_null(e);
    return device;
}

/* The device a default engine gets on this machine. */
static dsm_device_t default_device(void) {
    return every_rank_has_gpu ? DSM_DEVICE_CUDA : DSM_DEVICE_HOST;
}

static void test_defaults(void **state) {
    (void)state;
    dsm_engine_options_t o = DSM_ENGINE_OPTIONS_INITIALIZER;
    assert_int_equal(o.size, sizeof(dsm_engine_options_t));
    assert_int_equal(o.device, DSM_DEVICE_DEFAULT);
    assert_int_equal(o.backend, DSM_BACKEND_DEFAULT);
    assert_int_equal(o.cuda_device, -1);
    if (every_rank_has_gpu) {
        /* DSM_DEVICE_DEFAULT is CUDA only where NCCL is built too. */
        dsm_device_t d = device_of(NULL, NULL);
        assert_true(d == DSM_DEVICE_CUDA || d == DSM_DEVICE_HOST);
        assert_int_equal(device_of(NULL, &o), d);
        return;
    }
    assert_int_equal(device_of(NULL, NULL), DSM_DEVICE_HOST);
    assert_int_equal(device_of(NULL, &o), DSM_DEVICE_HOST);

    /* dsm_engine_init() and dsm_engine_init_comm() are NULL options. */
    dsm_param_desc_t d[2];
    params(d);
    dsm_engine_t e = NULL;
    dsm_device_t device = DSM_DEVICE_DEFAULT;
    ASSERT_OK(dsm_engine_init_comm(MPI_COMM_WORLD, CFG, d, 2, &e));
    ASSERT_OK(dsm_engine_device(e, &device));
    assert_int_equal(device, default_device());
    ASSERT_OK(dsm_engine_free(&e));
    ASSERT_OK(dsm_engine_init_comm(MPI_COMM_WORLD, CFG, d, 2, &e));
    ASSERT_OK(dsm_engine_device(e, &device));
    assert_int_equal(device, default_device());
    ASSERT_OK(dsm_engine_free(&e));
}

static void test_host(void **state) {
    (void)state;
    dsm_engine_options_t o = DSM_ENGINE_OPTIONS_INITIALIZER;
    o.device = DSM_DEVICE_HOST;
    assert_int_equal(device_of(NULL, &o), DSM_DEVICE_HOST);

    /* On a mesh the caller built, with every backend that takes host memory. */
    dsm_mesh_t mesh = NULL;
    ASSERT_OK(dsm_mesh_create(MPI_COMM_WORLD, 1, (const int[]){test_size},
                              (const char *const[]){"data_parallel"}, &mesh));
    const dsm_backend_t backends[] = {DSM_BACKEND_DEFAULT, DSM_BACKEND_AUTO, DSM_BACKEND_MPI, DSM_BACKEND_SHM};
    for (size_t i = 0; i < sizeof backends / sizeof backends[0]; ++i) {
        o.backend = backends[i];
        assert_int_equal(device_of(mesh, &o), DSM_DEVICE_HOST);
    }
    ASSERT_OK(dsm_mesh_free(&mesh));

    /* DSM_ENGINE_DEVICE=host makes the default a host engine, GPU or not. */
    setenv("DSM_ENGINE_DEVICE", "host", 1);
    assert_int_equal(device_of(NULL, NULL), DSM_DEVICE_HOST);
    unsetenv("DSM_ENGINE_DEVICE");
}

/* A caller compiled against an older, smaller struct: the missing fields
   keep their defaults. */
static void test_older_struct(void **state) {
    (void)state;
    dsm_engine_options_t o = DSM_ENGINE_OPTIONS_INITIALIZER;
    o.size = sizeof(size_t);
    o.device = (dsm_device_t)99; /* beyond size: not read */
    o.cuda_device = -7;
    assert_int_equal(device_of(NULL, &o), default_device());
    o = (dsm_engine_options_t)DSM_ENGINE_OPTIONS_INITIALIZER;
    o.size = offsetof(dsm_engine_options_t, backend);
    o.device = DSM_DEVICE_HOST;
    o.backend = (dsm_backend_t)99;
    assert_int_equal(device_of(NULL, &o), DSM_DEVICE_HOST);
}

enum field { SIZE_ZERO, SIZE_LARGE, DEVICE, BACKEND, CUDA_DEVICE };

/* One bad field on `bad_rank` (-1: every rank) fails every rank with
   `text` in the message; the rank that found it is named. */
static void expect_bad(enum field f, int bad_rank, const char *text) {
    dsm_param_desc_t d[2];
    params(d);
    dsm_engine_options_t o = DSM_ENGINE_OPTIONS_INITIALIZER;
    o.device = DSM_DEVICE_HOST;
    if (bad_rank < 0 || bad_rank == test_rank) {
        switch (f) {
        case SIZE_ZERO: o.size = 0; break;
        case SIZE_LARGE: o.size = sizeof o + 8; break;
        case DEVICE: o.device = (dsm_device_t)99; break;
        case BACKEND: o.backend = (dsm_backend_t)99; break;
        case CUDA_DEVICE: o.cuda_device = -2; break;
        }
    }
    char rank_text[32];
    snprintf(rank_text, sizeof rank_text, "rank %d: ", bad_rank < 0 ? 0 : bad_rank);
    dsm_engine_t e = (dsm_engine_t)0x1;
    ASSERT_FAILS(init_world(d, 2, &o, &e), DSM_ERR_INVALID_ARGUMENT, text);
    assert_null(e);
    assert_non_null(strstr(dsm_last_error(), rank_text));
    assert_non_null(strstr(dsm_last_error(), "dsm_engine_init_with_options: "));
    /* The same on a mesh the caller built. */
    dsm_mesh_t mesh = NULL;
    ASSERT_OK(dsm_mesh_create(MPI_COMM_WORLD, 1, (const int[]){test_size},
                              (const char *const[]){"data_parallel"}, &mesh));
    e = (dsm_engine_t)0x1;
    ASSERT_FAILS(dsm_engine_init_with_options(mesh, CFG, d, 2, &o, &e), DSM_ERR_INVALID_ARGUMENT, text);
    assert_null(e);
    ASSERT_OK(dsm_mesh_free(&mesh));
}

static void test_bad_fields(void **state) {
    (void)state;
    char large[64];
    snprintf(large, sizeof large, "options->size is %zu, expected %zu", sizeof(dsm_engine_options_t) + 8,
             sizeof(dsm_engine_options_t));
    for (int pass = 0; pass < 2; ++pass) {
        const int who = pass == 0 ? -1 : test_size - 1; /* every rank, then the last only */
        expect_bad(SIZE_ZERO, who, "options->size is 0");
        expect_bad(SIZE_LARGE, who, large);
        expect_bad(DEVICE, who, "options->device is 99");
        expect_bad(BACKEND, who, "options->backend is 99");
        expect_bad(CUDA_DEVICE, who, "options->cuda_device is -2");
    }
}

/* Options that differ between ranks fail every rank, naming the field and both values. */
static void test_mismatch(void **state) {
    (void)state;
    if (test_size < 2) skip();
    dsm_param_desc_t d[2];
    params(d);
    dsm_engine_t e = (dsm_engine_t)0x1;
    dsm_engine_options_t o = DSM_ENGINE_OPTIONS_INITIALIZER;
    if (test_rank == 1) o.backend = DSM_BACKEND_MPI;
    ASSERT_FAILS(init_world(d, 2, &o, &e), DSM_ERR_MISMATCH,
                 "options->backend values differ across ranks: rank 0 has DSM_BACKEND_DEFAULT, rank 1 has "
                 "DSM_BACKEND_MPI");
    assert_null(e);

    o = (dsm_engine_options_t)DSM_ENGINE_OPTIONS_INITIALIZER;
    if (test_rank == test_size - 1) o.device = DSM_DEVICE_HOST;
    char text[128];
    snprintf(text, sizeof text, "options->device values differ across ranks: rank 0 has DSM_DEVICE_DEFAULT, rank %d "
             "has DSM_DEVICE_HOST", test_size - 1);
    dsm_mesh_t mesh = NULL;
    ASSERT_OK(dsm_mesh_create(MPI_COMM_WORLD, 1, (const int[]){test_size},
                              (const char *const[]){"data_parallel"}, &mesh));
    e = (dsm_engine_t)0x1;
    ASSERT_FAILS(dsm_engine_init_with_options(mesh, CFG, d, 2, &o, &e), DSM_ERR_MISMATCH, text);
    assert_null(e);
    ASSERT_OK(dsm_mesh_free(&mesh));

    /* cuda_device may differ: each rank names its own GPU. */
    o = (dsm_engine_options_t)DSM_ENGINE_OPTIONS_INITIALIZER;
    o.device = DSM_DEVICE_HOST;
    o.cuda_device = test_rank;
    assert_int_equal(device_of(NULL, &o), DSM_DEVICE_HOST);
}

/* DSM_DEVICE_CUDA: without a CUDA device on every rank, DSM_ERR_NOT_SUPPORTED
   on every rank; where ranks share a GPU, a device-resident engine (its
   collectives through the mpi backend); with a GPU of its own, one that
   takes a stream. */
static void test_cuda(void **state) {
    (void)state;
    dsm_param_desc_t d[2];
    params(d);
    dsm_engine_options_t o = DSM_ENGINE_OPTIONS_INITIALIZER;
    o.device = DSM_DEVICE_CUDA;
    dsm_engine_t e = (dsm_engine_t)0x1;
    if (every_rank_sees_gpu && !every_rank_has_gpu) {
        ASSERT_OK(init_world(d, 2, &o, &e));
        dsm_device_t device = DSM_DEVICE_DEFAULT;
        ASSERT_OK(dsm_engine_device(e, &device));
        assert_int_equal(device, DSM_DEVICE_CUDA);
        ASSERT_OK(dsm_engine_free(&e));
        return;
    }
    if (!every_rank_has_gpu) {
        dsm_status_t st = init_world(d, 2, &o, &e);
        char message[512];
        snprintf(message, sizeof message, "%s", dsm_last_error());
        dsm_device_t got = DSM_DEVICE_DEFAULT;
        if (st == DSM_SUCCESS) {
            dsm_engine_device(e, &got);
            dsm_engine_free(&e); /* every rank got one: the engine agrees */
        }
        int all = 0, mine = st == DSM_ERR_NOT_SUPPORTED;
        MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
        if (!mine)
            fail_msg("DSM_DEVICE_CUDA without a CUDA device returned %d (%s) with device %d, expected "
                     "DSM_ERR_NOT_SUPPORTED; message: %s", (int)st, dsm_status_string(st), (int)got,
                     st == DSM_SUCCESS ? "" : message);
        assert_true(all);
        assert_null(e);
        return;
    }
    ASSERT_OK(init_world(d, 2, &o, &e));
    dsm_device_t device = DSM_DEVICE_DEFAULT;
    ASSERT_OK(dsm_engine_device(e, &device));
    assert_int_equal(device, DSM_DEVICE_CUDA);
    cudaStream_t s = (cudaStream_t)0x1;
    ASSERT_OK(dsm_engine_stream(e, &s));
    assert_null(s);
#if DSM_HAVE_CUDA
    cudaStream_t mine = NULL;
    assert_int_equal(cudaStreamCreate(&mine), cudaSuccess);
    ASSERT_OK(dsm_engine_set_stream(e, mine));
    ASSERT_OK(dsm_engine_stream(e, &s));
    assert_ptr_equal(s, mine);
    float *g = NULL;
    ASSERT_OK(dsm_engine_grad_acquire(e, 0, (void **)&g));
    ASSERT_OK(dsm_engine_grad_release(e, 0));
    ASSERT_OK(dsm_step(e, NULL));
    ASSERT_OK(dsm_engine_set_stream(e, NULL));
    ASSERT_OK(dsm_engine_stream(e, &s));
    assert_null(s);
    ASSERT_OK(dsm_engine_free(&e));
    assert_int_equal(cudaStreamDestroy(mine), cudaSuccess);
#else
    ASSERT_OK(dsm_engine_free(&e));
#endif
}

/* A stream needs a device-resident CUDA engine. */
static void test_stream_on_host(void **state) {
    (void)state;
    dsm_param_desc_t d[2];
    params(d);
    dsm_engine_options_t o = DSM_ENGINE_OPTIONS_INITIALIZER;
    o.device = DSM_DEVICE_HOST;
    dsm_engine_t e = NULL;
    ASSERT_OK(init_world(d, 2, &o, &e));
    ASSERT_FAILS(dsm_engine_set_stream(e, (cudaStream_t)0x1234), DSM_ERR_NOT_SUPPORTED, "host");
    ASSERT_FAILS(dsm_engine_set_stream(e, NULL), DSM_ERR_NOT_SUPPORTED, "dsm_engine_set_stream: ");
    cudaStream_t s = (cudaStream_t)0x1;
    ASSERT_OK(dsm_engine_stream(e, &s));
    assert_null(s);
    /* The engine is still usable after the local refusals. */
    ASSERT_OK(dsm_step(e, NULL));
    ASSERT_OK(dsm_engine_free(&e));
}

static void test_null_pointers(void **state) {
    (void)state;
    dsm_param_desc_t d[2];
    params(d);
    dsm_engine_options_t o = DSM_ENGINE_OPTIONS_INITIALIZER;
    o.device = DSM_DEVICE_HOST;
    ASSERT_FAILS(init_world(d, 2, &o, NULL), DSM_ERR_NULL_POINTER,
                 "engine (the output) is NULL");
    ASSERT_FAILS(init_world(d, 2, NULL, NULL), DSM_ERR_NULL_POINTER,
                 "engine (the output) is NULL");
    /* Only the last rank passes no output: every rank fails. */
    dsm_engine_t e = NULL;
    ASSERT_FAILS(init_world(d, 2, &o, test_rank == test_size - 1 ? NULL : &e),
                 DSM_ERR_NULL_POINTER, "engine (the output) is NULL");
    assert_null(e);
    /* No implicit world mesh. */
    ASSERT_FAILS(dsm_engine_init_with_options(NULL, CFG, d, 2, &o, &e), DSM_ERR_NULL_POINTER, "mesh is NULL");
    assert_null(e);
    dsm_device_t device = DSM_DEVICE_DEFAULT;
    cudaStream_t s = NULL;
    ASSERT_FAILS(dsm_engine_device(NULL, &device), DSM_ERR_NULL_POINTER, "engine is NULL");
    ASSERT_FAILS(dsm_engine_set_stream(NULL, NULL), DSM_ERR_NULL_POINTER, "engine is NULL");
    ASSERT_FAILS(dsm_engine_stream(NULL, &s), DSM_ERR_NULL_POINTER, "engine is NULL");
    ASSERT_OK(init_world(d, 2, &o, &e));
    ASSERT_FAILS(dsm_engine_device(e, NULL), DSM_ERR_NULL_POINTER, "device is NULL");
    ASSERT_FAILS(dsm_engine_stream(e, NULL), DSM_ERR_NULL_POINTER, "stream is NULL");
    ASSERT_OK(dsm_engine_free(&e));
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_defaults, setup), cmocka_unit_test(test_host),
        cmocka_unit_test(test_older_struct),          cmocka_unit_test(test_bad_fields),
        cmocka_unit_test(test_mismatch),              cmocka_unit_test(test_cuda),
        cmocka_unit_test(test_stream_on_host),        cmocka_unit_test(test_null_pointers),
    };
    return RUN_MPI_TESTS("engine_options", tests);
}
