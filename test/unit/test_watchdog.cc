// The watchdog (core/watchdog.hpp): its parameter and alias, the message it
// composes from the contexts and the wait, and, in child processes, that a
// wait longer than the timeout ends the process with status 75 and the
// message while a wait that makes progress does not.
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include "core/error.hpp"
#include "core/watchdog.hpp"

// CMocka last: its fail() macro would break the C++ headers.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

extern "C" { // this CMocka header has no C++ guards
#include <cmocka.h>
}

namespace wd = dsm::watchdog;

namespace {

std::string error_of_timeout() {
    try {
        (void)wd::timeout_seconds();
    } catch (const dsm::Error &e) {
        assert_int_equal(e.status(), DSM_ERR_INVALID_ARGUMENT);
        return e.message();
    }
    fail_msg("no error");
    return "";
}

bool has(const std::string &text, const char *what) { return text.find(what) != std::string::npos; }

// Runs `body` in a child process whose stderr comes back in *err; returns
// its exit status (-1: killed by a signal).
template <typename F> int in_child(F &&body, std::string *err) {
    int fd[2];
    assert_int_equal(pipe(fd), 0);
    const pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fd[0]);
        dup2(fd[1], 2);
        body();
        _exit(0);
    }
    close(fd[1]);
    char buf[4096];
    ssize_t n;
    while ((n = read(fd[0], buf, sizeof buf)) > 0) err->append(buf, static_cast<size_t>(n));
    close(fd[0]);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

} // namespace

static void test_timeout_and_alias(void **) {
    unsetenv("DSM_COMM_TIMEOUT");
    unsetenv("DSM_NCCL_TIMEOUT");
    assert_int_equal(wd::timeout_seconds(), 1800);
    setenv("DSM_NCCL_TIMEOUT", "7", 1);
    assert_int_equal(wd::timeout_seconds(), 7); // the former name, when the new one is unset
    setenv("DSM_COMM_TIMEOUT", "3", 1);
    assert_int_equal(wd::timeout_seconds(), 3); // the new name wins
    setenv("DSM_COMM_TIMEOUT", "0", 1);
    assert_int_equal(wd::timeout_seconds(), 0);
    setenv("DSM_COMM_TIMEOUT", "soon", 1);
    std::string e = error_of_timeout();
    assert_true(has(e, "DSM_COMM_TIMEOUT=\"soon\""));
    setenv("DSM_COMM_TIMEOUT", "-1", 1);
    e = error_of_timeout();
    assert_true(has(e, "DSM_COMM_TIMEOUT=\"-1\""));
    unsetenv("DSM_COMM_TIMEOUT");
    setenv("DSM_NCCL_TIMEOUT", "later", 1);
    e = error_of_timeout();
    assert_true(has(e, "DSM_NCCL_TIMEOUT=\"later\""));
    unsetenv("DSM_NCCL_TIMEOUT");
}

// The message names the contexts, the operation, the group, the missing
// ranks and the step; nothing is recorded while the timeout is 0.
static void test_message(void **) {
    setenv("DSM_COMM_TIMEOUT", "0", 1);
    wd::start();
    wd::Group g;
    g.label = "data_parallel";
    g.backend = "shm";
    g.size = 4;
    g.rank = 0;
    g.world = {10, 11, 12, 13};
    g.arrivals = [](std::vector<int> *missing, std::string *note) {
        missing->push_back(2);
        *note = "from the test";
        return true;
    };
    {
        const wd::WaitScope w("reduce_scatterv", &g);
        assert_true(wd::describe_current(1).empty()); // off: no record
    }
    setenv("DSM_COMM_TIMEOUT", "1000", 1);
    wd::start();
    assert_true(wd::running());
    wd::note_hosts({12}, {"nodeX"});
    wd::set_step(41, 82);
    assert_true(wd::describe_current(1).empty()); // no wait open
    {
        const wd::Context step("dsm_step");
        const wd::Context bucket("gradient reduce-scatter", "bucket", 3);
        const wd::WaitScope w("reduce_scatterv", &g);
        const std::string m = wd::describe_current(12);
        assert_true(has(m, "has waited 12 s (DSM_COMM_TIMEOUT=1000) in dsm_step: gradient reduce-scatter, bucket 3: "
                           "shm reduce_scatterv over data_parallel (4 ranks; this rank is group rank 0), at step 41, "
                           "micro-step 82."));
        assert_true(has(m, "ranks that did not arrive (from the test): rank 12 (group rank 2, host nodeX)."));
        assert_true(has(m, "looks the same as a stalled one"));
        assert_true(has(m, "exit status 75"));
        {
            // A nested wait without a group keeps the outer group; its
            // operation is named.
            const wd::WaitScope inner("agreement", nullptr);
            assert_true(has(wd::describe_current(1), "shm agreement over data_parallel"));
        }
        // Contexts carried to another thread (the progress thread's tasks).
        const wd::Context::Saved saved = wd::Context::current();
        std::string there;
        std::thread([&] {
            const wd::Context c(saved);
            const wd::WaitScope w2("allgatherv", nullptr);
            there = wd::describe_current(1);
        }).join();
        assert_true(has(there, "in dsm_step: gradient reduce-scatter, bucket 3: allgatherv, at step 41, micro-step 82."));
    }
    {
        // A bucket named by its index and parameters (a note), carried to
        // another thread with its context; cut at kNote - 1 characters.
        const wd::Context bucket("gradient bucket", "bucket", 2, "parameters 3 [0+64], 4 [0+17]");
        const wd::Context::Saved saved = wd::Context::current();
        std::string there;
        std::thread([&] {
            const wd::Context c(saved);
            const wd::WaitScope w2("reduce_scatterv", nullptr);
            there = wd::describe_current(1);
        }).join();
        assert_true(has(there, "in gradient bucket, bucket 2 (parameters 3 [0+64], 4 [0+17]): reduce_scatterv"));
        const wd::Context longer("more", "bucket", 5, std::string(500, 'x'));
        const wd::WaitScope w3("allreduce", nullptr);
        const std::string m = wd::describe_current(1);
        assert_true(has(m, ("more, bucket 5 (" + std::string(wd::kNote - 4, 'x') + "...): allreduce").c_str()));
        // The program's own MPI call (the MPI profiling layer): nothing opens
        // while a wait of libdsm is open on this thread.
        assert_null(wd::open_program_wait("the program's own MPI call", nullptr, -1, "MPI_Allreduce", nullptr));
    }
    {
        void *t = wd::open_program_wait("the program's own MPI call (outside libdsm)", "source rank", 1, "MPI_Recv", &g);
        assert_non_null(t);
        const std::string m = wd::describe_current(3);
        assert_true(has(m, "in the program's own MPI call (outside libdsm), source rank 1: shm MPI_Recv over data_parallel"));
        wd::close_program_wait(t);
        assert_true(wd::describe_current(1).empty());
    }
    assert_true(wd::describe_current(1).empty());
    // Without arrival information: says that MPI does not tell.
    wd::Group m;
    m.label = "sequence_parallel";
    m.backend = "mpi";
    m.size = 2;
    m.rank = 1;
    m.world = {12, 3};
    {
        const wd::WaitScope w("allreduce", &m);
        const std::string t = wd::describe_current(1);
        assert_true(has(t, "The mpi backend cannot tell which ranks did not arrive (MPI does not say)."));
        assert_true(has(t, "The other ranks of the group: rank 12 (group rank 0, host nodeX)."));
    }
    setenv("DSM_COMM_TIMEOUT", "0", 1);
    wd::start();
    unsetenv("DSM_COMM_TIMEOUT");
}

// A wait that lasts past the timeout ends the process with status 75 and
// the message (no MPI here: _exit); one that makes progress does not.
static void test_expiry_in_child(void **) {
    std::string err;
    int status = in_child(
        [] {
            setenv("DSM_COMM_TIMEOUT", "1", 1);
            wd::start();
            const wd::Context c("test wait");
            const wd::WaitScope w("barrier", nullptr);
            std::this_thread::sleep_for(std::chrono::seconds(30));
            _exit(1);
        },
        &err);
    // Status 75 and the message: ended by the watchdog (the sleep would
    // have ended it with status 1).
    assert_int_equal(status, wd::kExitStatus);
    assert_true(has(err, "(DSM_COMM_TIMEOUT=1) in test wait: barrier"));
    err.clear();
    // A wait that reports progress every few milliseconds for longer than
    // the timeout plus a poll interval is never ended: only a stall of this
    // thread for the whole timeout (2 s) while the watchdog runs would end
    // it, not a late scheduling.
    status = in_child(
        [] {
            setenv("DSM_COMM_TIMEOUT", "2", 1);
            wd::start();
            const wd::WaitScope w("shm node synchronizations", nullptr);
            for (int i = 0; i < 700; ++i) {
                std::this_thread::sleep_for(std::chrono::milliseconds(5));
                wd::WaitScope::progress();
            }
        },
        &err);
    assert_int_equal(status, 0);
    assert_true(err.empty());
}

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_timeout_and_alias),
        cmocka_unit_test(test_message),
        cmocka_unit_test(test_expiry_in_child),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
