// Debug log: DSM_DEBUG sets the level, DSM_DEBUG_SUBSYS the subsystems,
// DSM_DEBUG_FILE the destination. Lines look like
//   host:pid:rank dsm WARN MESH message
#pragma once

namespace dsm {

enum class LogLevel { NONE = 0, WARN = 1, INFO = 2, TRACE = 3 };

enum class Subsys : unsigned { INIT = 1u, MESH = 2u, TOPO = 4u, ERROR = 8u, ENGINE = 16u, COMM = 32u };

bool log_enabled(LogLevel level, Subsys subsys) noexcept;

void log_write(LogLevel level, Subsys subsys, const char *fmt, ...) noexcept
    __attribute__((format(printf, 3, 4)));

} // namespace dsm

#define DSM_LOG(LEVEL, SUBSYS, ...)                                                          \
    do {                                                                                     \
        if (::dsm::log_enabled(::dsm::LogLevel::LEVEL, ::dsm::Subsys::SUBSYS))               \
            ::dsm::log_write(::dsm::LogLevel::LEVEL, ::dsm::Subsys::SUBSYS, __VA_ARGS__);    \
    } while (0)
#define DSM_WARN(SUBSYS, ...) DSM_LOG(WARN, SUBSYS, __VA_ARGS__)
#define DSM_INFO(SUBSYS, ...) DSM_LOG(INFO, SUBSYS, __VA_ARGS__)
#define DSM_TRACE(SUBSYS, ...) DSM_LOG(TRACE, SUBSYS, __VA_ARGS__)
