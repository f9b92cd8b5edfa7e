// The tools' command lines: see cli.hpp.
#include "cli.hpp"

#include <cerrno>
#include <cstdlib>
#include <getopt.h>

namespace dsm {
namespace tools {

CliOption flag_option(const char *name, std::function<void()> set) {
    return CliOption{name, false, [set](const char *) {
                         set();
                         return true;
                     }};
}

CliOption final_option(const char *name, bool *seen) {
    return CliOption{name, false, [seen](const char *) {
                         *seen = true;
                         return false;
                     }};
}

bool parse_command_line(int argc, char **argv, const std::vector<CliOption> &options,
                        const std::function<bool(const char *)> &argument, const CliRefuse &refuse) {
    constexpr int kFirst = 256; // getopt_long's value for options[0]
    std::vector<struct option> table;
    int help = -1;
    for (size_t i = 0; i < options.size(); ++i) {
        table.push_back({options[i].name.c_str(), options[i].has_value ? required_argument : no_argument, nullptr,
                         kFirst + static_cast<int>(i)});
        if (options[i].name == "help") help = static_cast<int>(i);
    }
    table.push_back({nullptr, 0, nullptr, 0});
    // '-': the other arguments in order (as code 1), whatever POSIXLY_CORRECT
    // says; ':': a missing value is reported as ':', not printed.
    const char *const shorts = help >= 0 ? "-:h" : "-:";
    opterr = 0;
    optind = 0; // start over (a second parse in one process)
    for (;;) {
        const int c = getopt_long(argc, argv, shorts, table.data(), nullptr);
        if (c == -1) break;
        const CliOption *opt = c >= kFirst ? &options[static_cast<size_t>(c - kFirst)]
                               : c == 'h'  ? &options[static_cast<size_t>(help)]
                                           : nullptr;
        const CliOption *named = optopt >= kFirst ? &options[static_cast<size_t>(optopt - kFirst)] : nullptr;
        if (c == 1) {
            if (!argument(optarg)) return false;
        } else if (c == ':') {
            refuse((named != nullptr ? "--" + named->name : std::string("-") + static_cast<char>(optopt)) +
                       " needs a value",
                   false);
            return false;
        } else if (c == '?') {
            // An option without a value given one (--json=1), an unknown or
            // ambiguous long option, an unknown short one.
            if (named != nullptr) {
                refuse("--" + named->name + " takes no value", false);
            } else if (optopt > 0) {
                refuse(std::string("unknown option '-") + static_cast<char>(optopt) + "'", true);
            } else {
                std::string text = argv[optind - 1];
                text = text.substr(0, text.find('='));
                std::vector<std::string> could; // the options it abbreviates
                for (const CliOption &o : options)
                    if (text.size() > 2 && ("--" + o.name).compare(0, text.size(), text) == 0)
                        could.push_back("--" + o.name);
                refuse((could.size() > 1 ? "ambiguous option '" + text + "' (" + one_of(could) + ")"
                                         : "unknown option '" + text + "'"),
                       true);
            }
            return false;
        } else if (!opt->set(opt->has_value ? optarg : nullptr)) {
            return false;
        }
    }
    for (int i = optind; i < argc; ++i) // after "--"
        if (!argument(argv[i])) return false;
    return true;
}

bool parse_integer(const char *text, long long min, long long max, long long *out) {
    const char *p = text;
    bool ok = *p != '\0';
    if (*p == '-') ++p;
    if (*p == '\0') ok = false;
    for (const char *c = p; ok && *c != '\0'; ++c) ok = *c >= '0' && *c <= '9';
    if (!ok) return false;
    char *end = nullptr;
    errno = 0;
    const long long v = std::strtoll(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || v < min || v > max) return false;
    *out = v;
    return true;
}

std::string one_of(const std::vector<std::string> &values) {
    std::string list;
    for (size_t i = 0; i < values.size(); ++i)
        list += (i == 0 ? "" : i + 1 == values.size() ? " or " : ", ") + values[i];
    return list;
}

} // namespace tools
} // namespace dsm
