// The command lines of the tools (dsm-info, dsm-bench, dsm-ckpt): long
// options read by getopt_long, so that every tool takes "--opt VALUE" and
// "--opt=VALUE", an unambiguous prefix of a long option, options anywhere
// among the arguments, "--" before arguments that start with '-', and -h for
// --help; and refuses a bad command line with the same messages.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace dsm {
namespace tools {

struct CliOption {
    std::string name; // without the leading "--"
    bool has_value;
    // Called for each occurrence in order, with the value (nullptr for an
    // option without one); false: refused (it has said why).
    std::function<bool(const char *value)> set;
};

// An option without a value that calls `set`.
CliOption flag_option(const char *name, std::function<void()> set);
// An option without a value that sets *seen and ends the parse, as --help
// and --version do (all there is to do; parse_command_line returns false).
CliOption final_option(const char *name, bool *seen);

// How a command line is refused: `message` ("unknown option '--x'",
// "--tag needs a value", ...); `shape` is true where the command line's shape
// is wrong (an unknown option, an unexpected argument), where a tool points
// at its help.
using CliRefuse = std::function<void(const std::string &message, bool shape)>;

// Reads argv[1..argc) (argv[0]: the program or subcommand name) against
// `options`: each option's set, each other argument to `argument` (in
// order; false: refused). -h stands for the option named "help" where there
// is one. Returns false after a refusal.
bool parse_command_line(int argc, char **argv, const std::vector<CliOption> &options,
                        const std::function<bool(const char *)> &argument, const CliRefuse &refuse);

// An integer option's value: decimal digits with an optional leading '-',
// nothing else (no spaces, no sign '+', no suffix, no other base), no
// overflow, within [min, max]. False (and *out unchanged) otherwise.
bool parse_integer(const char *text, long long min, long long max, long long *out);

// "A, B or C".
std::string one_of(const std::vector<std::string> &values);

} // namespace tools
} // namespace dsm
