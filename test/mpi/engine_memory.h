/*
 * The engine's parameter and gradient pointers, read and written from the
 * host whatever the engine's device: on the device-resident engine (CUDA)
 * they are device memory and go through a copy; on the host and the
 * simulated device they are host memory. For the C tests that compute
 * forward and backward on the host (include after mpi_test.h), and the
 * deterministic values they train on (test_hashf), the data-parallel mesh
 * they train on and the figures they read from dsm_engine_describe().
 */
#ifndef DSM_TEST_ENGINE_MEMORY_H
#define DSM_TEST_ENGINE_MEMORY_H

#include "dsm_config.h"

#if DSM_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

/* A deterministic value in [-1, 1) from two integers (parameter values,
   gradients). */
static inline float test_hashf(unsigned a, unsigned b) {
    unsigned h = a * 2654435761u ^ (b + 0x9e3779b9u + (a << 6) + (a >> 2));
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    return (float)(h & 0xffffff) / (float)0x800000 - 1.0f;
}

/* Descriptors of n one-dimensional trainable fp32 parameters: names[i] of
   shape[i] elements, initialized by `init`. */
static inline void test_vector_params(dsm_param_desc_t *d, int n, const char *const *names, const int64_t *shape,
                                      dsm_param_init_fn init) {
    memset(d, 0, (size_t)n * sizeof d[0]);
    for (int i = 0; i < n; ++i) {
        d[i].name = names[i];
        d[i].ndims = 1;
        d[i].shape = &shape[i];
        d[i].dtype = DSM_FLOAT32;
        d[i].trainable = 1;
        d[i].init_fn = init;
    }
}

/* A mesh of one "data_parallel" dimension of every rank. */
static inline dsm_mesh_t test_dp_mesh(void) {
    dsm_mesh_t mesh = NULL;
    const int shp[1] = {test_size};
    const char *dims[1] = {"data_parallel"};
    ASSERT_OK(dsm_mesh_create(MPI_COMM_WORLD, 1, shp, dims, &mesh));
    return mesh;
}

/* The number after `key` in the object after `object` of a JSON text. */
static inline const char *test_json_at(const char *text, const char *object, const char *key) {
    const char *o = strstr(text, object);
    if (o == NULL) fail_msg("no %s in %s", object, text);
    const char *k = strstr(o, key);
    if (k == NULL) fail_msg("no %s after %s in %s", key, object, text);
    return k + strlen(key);
}
static inline unsigned long long test_json_after(const char *text, const char *object, const char *key) {
    return strtoull(test_json_at(text, object, key), NULL, 10);
}

static inline int engine_on_cuda(dsm_engine_t e) {
    dsm_device_t d = DSM_DEVICE_HOST;
    assert_int_equal(dsm_engine_device(e, &d), DSM_SUCCESS);
    return d == DSM_DEVICE_CUDA;
}

/* `bytes` between the engine's memory and host memory, either way: a CUDA
   copy on a device-resident engine (cudaMemcpyDefault tells the direction
   from the pointers), else memcpy. */
static inline void engine_copy(dsm_engine_t e, void *dst, const void *src, size_t bytes) {
#if DSM_HAVE_CUDA
    if (engine_on_cuda(e)) {
        assert_int_equal(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault), cudaSuccess);
        return;
    }
#endif
    (void)e;
    memcpy(dst, src, bytes);
}

/* n elements of the engine's compute dtype at `src` as fp32 into `dst`. */
static inline void engine_read_f32(dsm_engine_t e, const void *src, float *dst, size_t n) {
    dsm_dtype_t dt;
    size_t es = 0;
    assert_int_equal(dsm_engine_dtype(e, &dt), DSM_SUCCESS);
    assert_int_equal(dsm_dtype_size(dt, &es), DSM_SUCCESS);
    void *tmp = malloc(n * es + 1);
    engine_copy(e, tmp, src, n * es);
    assert_int_equal(dsm_convert(tmp, dt, dst, DSM_FLOAT32, n), DSM_SUCCESS);
    free(tmp);
}

/* fp32 `src` (n elements) written to `dst` in the engine's compute dtype. */
static inline void engine_write_f32(dsm_engine_t e, void *dst, const float *src, size_t n) {
    dsm_dtype_t dt;
    size_t es = 0;
    assert_int_equal(dsm_engine_dtype(e, &dt), DSM_SUCCESS);
    assert_int_equal(dsm_dtype_size(dt, &es), DSM_SUCCESS);
    void *tmp = malloc(n * es + 1);
    assert_int_equal(dsm_convert(src, DSM_FLOAT32, tmp, dt, n), DSM_SUCCESS);
    engine_copy(e, dst, tmp, n * es);
    free(tmp);
}

#endif
