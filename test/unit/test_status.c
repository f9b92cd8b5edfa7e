/* The C API that needs no MPI communicator: statuses, last error, version, dtypes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "dsm.h"

static void test_version_agrees(void **state) {
    (void)state;
    int major = -1, minor = -1, patch = -1;
    assert_int_equal(dsm_library_version(&major, &minor, &patch), DSM_SUCCESS);
    assert_int_equal(major, DSM_VERSION_MAJOR);
    assert_int_equal(minor, DSM_VERSION_MINOR);
    assert_int_equal(patch, DSM_VERSION_PATCH);
    char text[64];
    snprintf(text, sizeof text, "%d.%d.%d", major, minor, patch);
    assert_string_equal(text, DSM_VERSION_STRING);
    assert_int_equal(DSM_VERSION, major * 10000 + minor * 100 + patch);
    assert_int_equal(dsm_library_version(NULL, NULL, NULL), DSM_SUCCESS);
}

static void test_status_values_pinned(void **state) {
    (void)state;
    assert_int_equal(DSM_SUCCESS, 0);
    assert_int_equal(DSM_ERR_INVALID_ARGUMENT, 1);
    assert_int_equal(DSM_ERR_NULL_POINTER, 2);
    assert_int_equal(DSM_ERR_NOT_FOUND, 3);
    assert_int_equal(DSM_ERR_MISMATCH, 4);
    assert_int_equal(DSM_ERR_OUT_OF_MEMORY, 5);
    assert_int_equal(DSM_ERR_MPI, 6);
    assert_int_equal(DSM_ERR_NOT_SUPPORTED, 7);
    assert_int_equal(DSM_ERR_IO, 8);
    assert_int_equal(DSM_ERR_CONFIG, 9);
    assert_int_equal(DSM_ERR_HDF5, 10);
    assert_int_equal(DSM_ERR_CUDA, 11);
    assert_int_equal(DSM_ERR_NCCL, 12);
    assert_int_equal(DSM_ERR_HWLOC, 13);
    assert_int_equal(DSM_ERR_INTERNAL, 14);
    assert_int_equal(DSM_ERR_NUMERIC, 15);
    assert_int_equal(DSM_ERR_STATE, 16);
}

static void test_status_strings(void **state) {
    (void)state;
    for (int s = 0; s <= DSM_ERR_STATE; ++s) {
        const char *text = dsm_status_string((dsm_status_t)s);
        assert_non_null(text);
        assert_true(strlen(text) > 0);
        assert_string_not_equal(text, "unknown status");
        /* A category that reads in front of any message of its status
           ("STATUS: MESSAGE", as the examples print them): no sentence of
           its own that a message could contradict. */
        assert_null(strchr(text, ':'));
    }
    /* Messages of DSM_ERR_MISMATCH name arguments that differ, ranks at
       different collective points, or a checkpoint that does not match. */
    assert_string_equal(dsm_status_string(DSM_ERR_MISMATCH), "mismatch across ranks or with a checkpoint");
    assert_string_equal(dsm_status_string(DSM_SUCCESS), "success");
    assert_string_equal(dsm_status_string((dsm_status_t)12345), "unknown status");
    assert_string_equal(dsm_status_string((dsm_status_t)-1), "unknown status");
}

static void test_last_error(void **state) {
    (void)state;
    assert_non_null(dsm_last_error());
    size_t size = 0;
    assert_int_equal(dsm_dtype_size((dsm_dtype_t)99, &size), DSM_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dsm_last_error(), "dsm_dtype_size"));
    assert_non_null(strstr(dsm_last_error(), "99"));
    assert_int_equal(dsm_dtype_size(DSM_FLOAT32, NULL), DSM_ERR_NULL_POINTER);
    assert_non_null(strstr(dsm_last_error(), "size is NULL"));
    /* A successful call leaves the last message alone. */
    assert_int_equal(dsm_dtype_size(DSM_FLOAT32, &size), DSM_SUCCESS);
    assert_non_null(strstr(dsm_last_error(), "size is NULL"));
}

static void test_dtypes(void **state) {
    (void)state;
    const struct { dsm_dtype_t t; size_t size; const char *name; } expect[] = {
        {DSM_FLOAT32, 4, "float32"}, {DSM_FLOAT16, 2, "float16"}, {DSM_BFLOAT16, 2, "bfloat16"},
        {DSM_FLOAT64, 8, "float64"}, {DSM_INT8, 1, "int8"},       {DSM_UINT8, 1, "uint8"},
        {DSM_INT32, 4, "int32"},     {DSM_INT64, 8, "int64"},
    };
    for (size_t i = 0; i < sizeof expect / sizeof expect[0]; ++i) {
        size_t size = 0;
        assert_int_equal(dsm_dtype_size(expect[i].t, &size), DSM_SUCCESS);
        assert_int_equal(size, expect[i].size);
        assert_string_equal(dsm_dtype_name(expect[i].t), expect[i].name);
        assert_int_equal((int)expect[i].t, (int)i);
    }
    assert_string_equal(dsm_dtype_name((dsm_dtype_t)42), "invalid");
}

static void test_features(void **state) {
    (void)state;
    int on = -1;
    assert_int_equal(dsm_library_feature("mpi", &on), DSM_SUCCESS);
    assert_int_equal(on, 1);
    const char *names[] = {"hwloc", "hdf5", "cuda", "nccl", "fortran"};
    for (size_t i = 0; i < 5; ++i) {
        on = -1;
        assert_int_equal(dsm_library_feature(names[i], &on), DSM_SUCCESS);
        assert_true(on == 0 || on == 1);
    }
    assert_int_equal(dsm_library_feature("gpu-magic", &on), DSM_ERR_NOT_FOUND);
    assert_non_null(strstr(dsm_last_error(), "gpu-magic"));
    assert_int_equal(dsm_library_feature(NULL, &on), DSM_ERR_NULL_POINTER);
    assert_int_equal(dsm_library_feature("mpi", NULL), DSM_ERR_NULL_POINTER);
}

static void test_info_describe(void **state) {
    (void)state;
    char *text = NULL;
    assert_int_equal(dsm_info_describe(DSM_FORMAT_TEXT, &text), DSM_SUCCESS);
    assert_non_null(strstr(text, DSM_VERSION_STRING));
    assert_non_null(strstr(text, "DSM_DEBUG"));
    dsm_free(text);
    assert_int_equal(dsm_info_describe(DSM_FORMAT_JSON, &text), DSM_SUCCESS);
    assert_non_null(strstr(text, "\"parameters\""));
    assert_non_null(strstr(text, "\"DSM_MESH_PLACEMENT\""));
    dsm_free(text);
    text = (char *)1;
    assert_int_equal(dsm_info_describe((dsm_format_t)7, &text), DSM_ERR_INVALID_ARGUMENT);
    assert_null(text);
    assert_non_null(strstr(dsm_last_error(), "format 7"));
    assert_int_equal(dsm_info_describe(DSM_FORMAT_TEXT, NULL), DSM_ERR_NULL_POINTER);
    dsm_free(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version_agrees), cmocka_unit_test(test_status_values_pinned),
        cmocka_unit_test(test_status_strings), cmocka_unit_test(test_last_error),
        cmocka_unit_test(test_dtypes),         cmocka_unit_test(test_features),
        cmocka_unit_test(test_info_describe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
