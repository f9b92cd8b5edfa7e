/*
 * The stop signal (dsm_engine_set_stop_signal, dsm_engine_stop_requested,
 * DSM_STOP_SIGNAL): a signal that arrives on one rank only makes every rank
 * report a stop from the dsm_step() that ends the next accumulation boundary
 * on, and not before; no signal, no stop; the process's own handler is back
 * after the engine is freed; every bad signal (one that does not exist,
 * SIGKILL, a fault signal), on every rank or on one, fails every rank with
 * DSM_ERR_INVALID_ARGUMENT naming it; signals that differ between ranks fail
 * every rank with DSM_ERR_MISMATCH; a bad DSM_STOP_SIGNAL fails
 * dsm_engine_init() on every rank naming the parameter; NULL handles and
 * outputs are DSM_ERR_NULL_POINTER.
 */
#include <signal.h>
#include <stdlib.h>

#include "mpi_test.h"

static const int64_t shape_w[1] = {6};

/* Two micro-steps per step. */
static const char *CFG = "{\"train_micro_batch_size_per_gpu\": 1, \"gradient_accumulation_steps\": 2,"
                         " \"zero_optimization\": {\"stage\": 2},"
                         " \"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": 0.1}}}";

static dsm_engine_t make_engine(void) {
    dsm_param_desc_t d = DSM_PARAM_DESC_INITIALIZER;
    d.name = "w";
    d.ndims = 1;
    d.shape = shape_w;
    d.dtype = DSM_FLOAT32;
    dsm_engine_t e = NULL;
    ASSERT_OK(dsm_engine_init_comm(MPI_COMM_WORLD, CFG, &d, 1, &e));
    return e;
}

static int stop_of(dsm_engine_t e) {
    int stop = -1;
    ASSERT_OK(dsm_engine_stop_requested(e, &stop));
    assert_true(stop == 0 || stop == 1);
    return stop;
}

/* Every rank must report `want` after the step, whatever its own signal saw. */
static void step_expect(dsm_engine_t e, int want, const char *when) {
    ASSERT_OK(dsm_step(e, NULL));
    const int got = stop_of(e);
    if (got != want) fail_msg("%s: rank %d reports stop %d, expected %d", when, test_rank, got, want);
}

static void test_no_signal_no_stop(void **state) {
    (void)state;
    dsm_engine_t e = make_engine();
    assert_int_equal(stop_of(e), 0);
    for (int k = 0; k < 4; ++k) step_expect(e, 0, "no stop signal");
    ASSERT_OK(dsm_engine_set_stop_signal(e, SIGUSR1));
    for (int k = 0; k < 2; ++k) step_expect(e, 0, "a stop signal that did not arrive");
    ASSERT_OK(dsm_engine_set_stop_signal(e, 0));
    ASSERT_OK(dsm_engine_free(&e));
}

static void test_signal_on_one_rank(void **state) {
    (void)state;
    /* The signal arrives on the last rank only, at each position in the step. */
    for (int at = 0; at < 2; ++at) {
        dsm_engine_t e = make_engine();
        ASSERT_OK(dsm_engine_set_stop_signal(e, SIGUSR1));
        step_expect(e, 0, "before the signal (micro-step 1)");
        step_expect(e, 0, "before the signal (micro-step 2, a boundary)");
        if (at == 0 && test_rank == test_size - 1) raise(SIGUSR1); /* before the first micro-step */
        step_expect(e, 0, "the signal arrived, the step has not ended (micro-step 3)");
        if (at == 1 && test_rank == test_size - 1) raise(SIGUSR1); /* before the boundary */
        step_expect(e, 1, "the signal arrived before the boundary (micro-step 4)");
        step_expect(e, 1, "once set, the stop stays (micro-step 5)");
        ASSERT_OK(dsm_engine_free(&e));
    }
}

static volatile sig_atomic_t own_handler_calls;
static void own_handler(int signum) {
    (void)signum;
    ++own_handler_calls;
}

static void test_handler_restored(void **state) {
    (void)state;
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = own_handler;
    sigemptyset(&sa.sa_mask);
    assert_int_equal(sigaction(SIGUSR2, &sa, &old), 0);
    own_handler_calls = 0;
    dsm_engine_t a = make_engine(), b = make_engine();
    ASSERT_OK(dsm_engine_set_stop_signal(a, SIGUSR2));
    ASSERT_OK(dsm_engine_set_stop_signal(b, SIGUSR2));
    raise(SIGUSR2);
    assert_int_equal(own_handler_calls, 0); /* the engines' handler has it */
    step_expect(a, 0, "engine a, micro-step 1");
    step_expect(a, 1, "engine a, boundary");
    ASSERT_OK(dsm_engine_free(&a));
    /* b still uses the signal: still the engines' handler. */
    raise(SIGUSR2);
    assert_int_equal(own_handler_calls, 0);
    step_expect(b, 0, "engine b, micro-step 1");
    step_expect(b, 1, "engine b, boundary");
    ASSERT_OK(dsm_engine_free(&b));
    raise(SIGUSR2);
    assert_int_equal(own_handler_calls, 1);
    /* Turning it off also gives the signal back. */
    dsm_engine_t c = make_engine();
    ASSERT_OK(dsm_engine_set_stop_signal(c, SIGUSR2));
    ASSERT_OK(dsm_engine_set_stop_signal(c, 0));
    raise(SIGUSR2);
    assert_int_equal(own_handler_calls, 2);
    step_expect(c, 0, "signal off");
    step_expect(c, 0, "signal off, boundary");
    ASSERT_OK(dsm_engine_free(&c));
    assert_int_equal(sigaction(SIGUSR2, &old, NULL), 0);
}

static void test_bad_signals(void **state) {
    (void)state;
    dsm_engine_t e = make_engine();
    ASSERT_FAILS(dsm_engine_set_stop_signal(e, -1), DSM_ERR_INVALID_ARGUMENT, "there is no signal -1");
    ASSERT_FAILS(dsm_engine_set_stop_signal(e, 99), DSM_ERR_INVALID_ARGUMENT, "there is no signal 99");
    ASSERT_FAILS(dsm_engine_set_stop_signal(e, SIGKILL), DSM_ERR_INVALID_ARGUMENT, "SIGKILL cannot be caught");
    ASSERT_FAILS(dsm_engine_set_stop_signal(e, SIGSTOP), DSM_ERR_INVALID_ARGUMENT, "SIGSTOP cannot be caught");
    ASSERT_FAILS(dsm_engine_set_stop_signal(e, SIGSEGV), DSM_ERR_INVALID_ARGUMENT, "SIGSEGV reports a fault");
    ASSERT_FAILS(dsm_engine_set_stop_signal(e, SIGFPE), DSM_ERR_INVALID_ARGUMENT, "SIGFPE reports a fault");
    /* One rank's bad signal fails every rank, with its message. */
    ASSERT_FAILS(dsm_engine_set_stop_signal(e, test_rank == test_size - 1 ? SIGKILL : SIGUSR1),
                 DSM_ERR_INVALID_ARGUMENT, "signum is 9: SIGKILL cannot be caught");
    /* Nothing was installed: the engine still works, with no stop. */
    step_expect(e, 0, "after refused signals");
    step_expect(e, 0, "after refused signals, boundary");
    if (test_size > 1)
        ASSERT_FAILS(dsm_engine_set_stop_signal(e, test_rank == 0 ? SIGUSR1 : SIGUSR2), DSM_ERR_MISMATCH,
                     "dsm_engine_set_stop_signal");
    ASSERT_FAILS(dsm_engine_set_stop_signal(NULL, SIGUSR1), DSM_ERR_NULL_POINTER, "engine is NULL");
    ASSERT_FAILS(dsm_engine_stop_requested(NULL, NULL), DSM_ERR_NULL_POINTER, "is NULL");
    ASSERT_FAILS(dsm_engine_stop_requested(e, NULL), DSM_ERR_NULL_POINTER, "stop is NULL");
    int stop = -1;
    ASSERT_FAILS(dsm_engine_stop_requested(NULL, &stop), DSM_ERR_NULL_POINTER, "engine is NULL");
    assert_int_equal(stop, 0);
    ASSERT_OK(dsm_engine_free(&e));
}

static void test_environment(void **state) {
    (void)state;
    /* A name, any case, with or without SIG. */
    setenv("DSM_STOP_SIGNAL", "usr1", 1);
    dsm_engine_t e = make_engine();
    unsetenv("DSM_STOP_SIGNAL");
    if (test_rank == 0) raise(SIGUSR1);
    step_expect(e, 0, "DSM_STOP_SIGNAL=usr1, micro-step 1");
    step_expect(e, 1, "DSM_STOP_SIGNAL=usr1, boundary");
    ASSERT_OK(dsm_engine_free(&e));

    const char *bad[] = {"SIGFOO", "9", "KILL", "SIGSEGV", "12x", "-3"};
    const char *says[] = {"'SIGFOO': expected a signal name", "'9': SIGKILL cannot be caught",
                          "'KILL': SIGKILL cannot be caught", "'SIGSEGV': SIGSEGV reports a fault",
                          "'12x': expected a signal name", "'-3': expected a signal name"};
    dsm_param_desc_t d = DSM_PARAM_DESC_INITIALIZER;
    d.name = "w";
    d.ndims = 1;
    d.shape = shape_w;
    d.dtype = DSM_FLOAT32;
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; ++k) {
        /* On one rank only at the end: every rank fails. */
        const int mine = k + 1 < sizeof bad / sizeof bad[0] || test_rank == test_size - 1;
        if (mine) setenv("DSM_STOP_SIGNAL", bad[k], 1);
        e = NULL;
        ASSERT_FAILS(dsm_engine_init_comm(MPI_COMM_WORLD, CFG, &d, 1, &e), DSM_ERR_INVALID_ARGUMENT, says[k]);
        assert_null(e);
        unsetenv("DSM_STOP_SIGNAL");
    }
    /* The parameter names itself. */
    setenv("DSM_STOP_SIGNAL", "nope", 1);
    ASSERT_FAILS(dsm_engine_init_comm(MPI_COMM_WORLD, CFG, &d, 1, &e), DSM_ERR_INVALID_ARGUMENT, "DSM_STOP_SIGNAL is 'nope'");
    unsetenv("DSM_STOP_SIGNAL");
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_signal_no_stop), cmocka_unit_test(test_signal_on_one_rank),
        cmocka_unit_test(test_handler_restored),  cmocka_unit_test(test_bad_signals),
        cmocka_unit_test(test_environment),
    };
    return RUN_MPI_TESTS("test_stop", tests);
}
