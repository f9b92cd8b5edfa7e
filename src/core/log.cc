#include "dsm_config.h"

#include "core/log.hpp"

#include <strings.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <mutex>
#include <string>

#include <mpi.h>

#include "core/param.hpp"

namespace dsm {

namespace {

DSM_PARAM(log, DEBUG, param::Text(), "WARN",
          "Log level: NONE, WARN, INFO or TRACE.");
DSM_PARAM(log, DEBUG_SUBSYS, param::Text(), "ALL",
          "Subsystems to log, comma separated: INIT, MESH, TOPO, ERROR, ENGINE, COMM or ALL; a leading ^ logs all "
          "but the listed ones.");
DSM_PARAM(log, DEBUG_FILE, param::Text(), "",
          "Write the log to this file instead of stderr; %h is replaced by the host name, %p by the "
          "process id and %r by the MPI rank in MPI_COMM_WORLD.");

struct LogState {
    LogLevel level = LogLevel::WARN;
    unsigned subsys = ~0u;
    FILE *out = stderr;
    std::string host;
    std::mutex mutex;
};

const char *level_name(LogLevel l) {
    switch (l) {
    case LogLevel::WARN: return "WARN";
    case LogLevel::INFO: return "INFO";
    case LogLevel::TRACE: return "TRACE";
    default: return "NONE";
    }
}

const char *subsys_name(Subsys s) {
    switch (s) {
    case Subsys::INIT: return "INIT";
    case Subsys::MESH: return "MESH";
    case Subsys::TOPO: return "TOPO";
    case Subsys::ERROR: return "ERROR";
    case Subsys::ENGINE: return "ENGINE";
    case Subsys::COMM: return "COMM";
    }
    return "?";
}

int world_rank() {
    int init = 0, fini = 0, rank = -1;
    MPI_Initialized(&init);
    MPI_Finalized(&fini);
    if (init && !fini) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    return rank;
}

// Parse the environment once. Bad values are reported on stderr and ignored:
// logging must never make a call fail.
LogState &state() {
    static LogState st;
    static std::once_flag once;
    std::call_once(once, [] {
        char host[256] = "?";
        gethostname(host, sizeof host - 1);
        st.host = host;
        std::string lvl = param_DEBUG().value();
        const LogLevel levels[] = {LogLevel::NONE, LogLevel::WARN, LogLevel::INFO, LogLevel::TRACE};
        bool ok = false;
        for (LogLevel l : levels)
            if (strcasecmp(lvl.c_str(), level_name(l)) == 0) st.level = l, ok = true;
        if (!ok)
            std::fprintf(stderr, "libdsm: DSM_DEBUG=\"%s\" is not NONE, WARN, INFO or TRACE; using WARN\n",
                         lvl.c_str());

        std::string sub = param_DEBUG_SUBSYS().value();
        bool invert = !sub.empty() && sub[0] == '^';
        if (invert) sub.erase(0, 1);
        unsigned mask = 0;
        size_t pos = 0;
        while (pos <= sub.size()) {
            size_t end = sub.find(',', pos);
            if (end == std::string::npos) end = sub.size();
            std::string tok = sub.substr(pos, end - pos);
            const Subsys all[] = {Subsys::INIT, Subsys::MESH, Subsys::TOPO, Subsys::ERROR, Subsys::ENGINE, Subsys::COMM};
            bool known = strcasecmp(tok.c_str(), "ALL") == 0;
            if (known) mask = ~0u;
            for (Subsys s : all)
                if (strcasecmp(tok.c_str(), subsys_name(s)) == 0)
                    mask |= static_cast<unsigned>(s), known = true;
            if (!known && !tok.empty())
                std::fprintf(stderr, "libdsm: DSM_DEBUG_SUBSYS: unknown subsystem \"%s\" ignored\n",
                             tok.c_str());
            pos = end + 1;
        }
        st.subsys = invert ? ~mask : mask;

        std::string file = param_DEBUG_FILE().value();
        if (!file.empty()) {
            std::string path;
            for (size_t i = 0; i < file.size(); ++i) {
                if (file[i] == '%' && i + 1 < file.size()) {
                    char c = file[++i];
                    if (c == 'h') path += st.host;
                    else if (c == 'p') path += std::to_string(getpid());
                    else if (c == 'r') path += std::to_string(world_rank());
                    else path += '%', path += c;
                } else {
                    path += file[i];
                }
            }
            FILE *f = std::fopen(path.c_str(), "a");
            if (f != nullptr) st.out = f;
            else std::fprintf(stderr, "libdsm: DSM_DEBUG_FILE: cannot open \"%s\"; logging to stderr\n",
                              path.c_str());
        }
    });
    return st;
}

} // namespace

bool log_enabled(LogLevel level, Subsys subsys) noexcept {
    LogState &st = state();
    return level <= st.level && (st.subsys & static_cast<unsigned>(subsys)) != 0;
}

void log_write(LogLevel level, Subsys subsys, const char *fmt, ...) noexcept {
    LogState &st = state();
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    std::lock_guard<std::mutex> lock(st.mutex);
    std::fprintf(st.out, "%s:%d:%d dsm %s %s %s\n", st.host.c_str(), static_cast<int>(getpid()),
                 world_rank(), level_name(level), subsys_name(subsys), msg);
    std::fflush(st.out);
}

} // namespace dsm

DSM_PARAM_LINK(log)
