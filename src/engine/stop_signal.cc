// The stop signal's handler and its bookkeeping (stop_signal.hpp).
#include "engine/stop_signal.hpp"

#include <atomic>
#include <cctype>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "core/error.hpp"

namespace dsm {
namespace engine {

namespace {

// Signals 1..63 (NSIG is 65 on Linux); the handler only stores.
constexpr int kMaxSignal = 64;
volatile std::sig_atomic_t g_received[kMaxSignal + 1];

struct Use {
    int count = 0;
    struct sigaction previous;
};
std::mutex g_mutex;
Use g_use[kMaxSignal + 1];

extern "C" void on_stop_signal(int signum) {
    if (signum > 0 && signum <= kMaxSignal) g_received[signum] = 1;
}

struct Named {
    const char *name;
    int signum;
};
const Named kNames[] = {{"HUP", SIGHUP},   {"INT", SIGINT},   {"QUIT", SIGQUIT}, {"ABRT", SIGABRT},
                        {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"PIPE", SIGPIPE}, {"ALRM", SIGALRM},
                        {"TERM", SIGTERM}, {"CHLD", SIGCHLD}, {"CONT", SIGCONT}, {"TSTP", SIGTSTP},
                        {"TTIN", SIGTTIN}, {"TTOU", SIGTTOU}, {"URG", SIGURG},   {"XCPU", SIGXCPU},
                        {"XFSZ", SIGXFSZ}, {"VTALRM", SIGVTALRM}, {"PROF", SIGPROF}, {"WINCH", SIGWINCH},
                        {"KILL", SIGKILL}, {"STOP", SIGSTOP}, {"SEGV", SIGSEGV}, {"BUS", SIGBUS},
                        {"FPE", SIGFPE},   {"ILL", SIGILL},   {"TRAP", SIGTRAP}, {"SYS", SIGSYS}};

} // namespace

const char *stop_signal_name(int signum) {
    for (const Named &n : kNames)
        if (n.signum == signum) return n.name;
    return "";
}

std::string stop_signal_check(int signum) {
    if (signum == 0) return "";
    if (signum < 0 || signum > kMaxSignal || signum >= NSIG)
        return cat("there is no signal ", signum, " (1 to ", std::min(kMaxSignal, NSIG - 1), ", or 0 for none)");
    if (signum == SIGKILL || signum == SIGSTOP) return cat("SIG", stop_signal_name(signum), " cannot be caught");
    if (signum == SIGSEGV || signum == SIGBUS || signum == SIGFPE || signum == SIGILL || signum == SIGTRAP ||
        signum == SIGSYS)
        return cat("SIG", stop_signal_name(signum), " reports a fault of the process, not a request to stop");
    return "";
}

int parse_stop_signal(const std::string &text, const char *what) {
    std::string s;
    for (char c : text) s += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    int signum = -1;
    if (!s.empty() && std::isdigit(static_cast<unsigned char>(s[0]))) {
        char *end = nullptr;
        const long v = std::strtol(s.c_str(), &end, 10);
        if (*end == '\0' && v <= kMaxSignal) signum = static_cast<int>(v);
    } else {
        const std::string bare = s.rfind("SIG", 0) == 0 ? s.substr(3) : s;
        for (const Named &n : kNames)
            if (bare == n.name) signum = n.signum;
        if (bare.rfind("RTMIN+", 0) == 0 && bare.size() > 6) {
            char *end = nullptr;
            const long k = std::strtol(bare.c_str() + 6, &end, 10);
            if (*end == '\0' && k >= 0 && SIGRTMIN + k <= SIGRTMAX) signum = static_cast<int>(SIGRTMIN + k);
        }
    }
    DSM_REQUIRE(signum >= 0, DSM_ERR_INVALID_ARGUMENT, what, " is '", text,
                "': expected a signal name (USR1, SIGUSR1, TERM, RTMIN+N, ...) or number");
    const std::string why = stop_signal_check(signum);
    DSM_REQUIRE(why.empty(), DSM_ERR_INVALID_ARGUMENT, what, " is '", text, "': ", why);
    return signum;
}

void stop_signal_use(int signum) {
    if (signum == 0) return;
    std::lock_guard<std::mutex> lock(g_mutex);
    Use &u = g_use[signum];
    if (u.count++ > 0) return;
    g_received[signum] = 0;
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART; // interrupted system calls of MPI and the program resume
    if (sigaction(signum, &sa, &u.previous) != 0) {
        --u.count;
        DSM_FAIL(DSM_ERR_INVALID_ARGUMENT, "cannot install a handler for signal ", signum, ": ",
                 std::strerror(errno));
    }
}

void stop_signal_release(int signum) {
    if (signum == 0) return;
    std::lock_guard<std::mutex> lock(g_mutex);
    Use &u = g_use[signum];
    if (u.count == 0 || --u.count > 0) return;
    sigaction(signum, &u.previous, nullptr);
}

bool stop_signal_received(int signum) { return signum > 0 && signum <= kMaxSignal && g_received[signum] != 0; }

} // namespace engine
} // namespace dsm
