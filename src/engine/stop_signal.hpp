// A signal that asks training to stop at the next step boundary
// (dsm_engine_set_stop_signal, DSM_STOP_SIGNAL): a process-wide handler
// that only records that the signal arrived; the engines read the record at
// their dsm_step and agree on it across ranks.
#pragma once

#include <string>

namespace dsm {
namespace engine {

// The signal number for a name ("USR1", "SIGUSR1", "sigterm") or a number
// ("10"); throws DSM_ERR_INVALID_ARGUMENT naming `what` and the text when it
// is neither or names a signal stop_signal_check() refuses.
int parse_stop_signal(const std::string &text, const char *what);

// Empty if `signum` can be a stop signal (0 means none); else why not.
std::string stop_signal_check(int signum);

// The handler for `signum` is installed while at least one engine uses it
// (counted); the last release restores the handler that was there before.
void stop_signal_use(int signum);
void stop_signal_release(int signum);

// Whether `signum` has arrived since the process started using it.
bool stop_signal_received(int signum);

const char *stop_signal_name(int signum);

} // namespace engine
} // namespace dsm
