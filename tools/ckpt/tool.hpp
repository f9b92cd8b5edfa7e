// dsm-ckpt's subcommands and what they share: the command line, opening a
// checkpoint, the JSON pieces several outputs hold, the attributes they
// group. See dsm-ckpt.cc for the exit statuses and the output conventions.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ckpt_read.hpp"

namespace dsm {
namespace ckpt_tool {

// Each subcommand gets its arguments with its own name as argv[0] and
// returns the exit status; it throws Error (1) or UsageError (2) for main to
// print.
int cmd_info(int argc, char **argv);
int cmd_verify(int argc, char **argv);
int cmd_export(int argc, char **argv);
int cmd_diff(int argc, char **argv);
int cmd_clean(int argc, char **argv);

// ---------------------------------------------------------------- arguments

struct Args {
    std::vector<std::string> positional;
    std::map<std::string, std::string> values; // options that take a value
    std::set<std::string> flags;                // options without one that were given
    bool json = false;
};

// Parses a subcommand's arguments (getopt_long, see tools/common/cli.hpp):
// `value_options` and `flag_options` by their names with "--", --json and
// --help; exactly `positional` other arguments. Returns 0, 2 after printing
// a usage error, or -1 after printing `help` (--help, -h).
int parse_args(const std::string &cmd, int argc, char **argv, const std::set<std::string> &value_options,
               size_t positional, const char *help, Args &out, const std::set<std::string> &flag_options = {});

// The value of an option given with one, nullopt where it was not given.
std::optional<std::string> value(const Args &a, const std::string &name);

// A tolerance: a finite number >= 0; refused "OPT 'TEXT' is not a number >= 0".
bool parse_tolerance(const std::string &cmd, const std::string &opt, const std::string &v, double &out);

// A document on standard output, indented, ASCII.
void print_json(const Json &doc);

// ---------------------------------------------------------------- shared pieces

// An opened checkpoint with where it came from; throws Error / UsageError.
struct Opened {
    Location loc;
    Checkpoint ck;
};

Opened open_checkpoint(const std::string &path, const std::optional<std::string> &tag);

Json issues_json(const std::vector<Issue> &issues);
Json shape_json(const std::vector<uint64_t> &shape);
// A directory's tags, `latest` and temporary files; null for a file.
Json directory_json(const Location &loc);

// The tag of a leftover of an interrupted save (see cmd_clean.cc), "" for
// one that belongs to no tag, nullopt for any other name.
std::optional<std::string> leftover_tag(const std::string &name);

// An attribute's value for JSON output. The configuration is JSON text: it is
// given as the object it holds (as its text when that is not valid JSON).
Json attribute_json(const Attribute &a);

// An attribute's text ("-" where absent); attr_plain: a string without its quotes.
std::string attr_text(const Checkpoint &ck, const char *name);
std::string attr_plain(const Checkpoint &ck, const char *name);

std::string plural(uint64_t n, const char *one, const char *many);

// The root attributes describing where training stands (doc/checkpoint.md),
// listed first by info.
const std::vector<std::string> &training_state_attributes();

// Setup attributes that differ between two saves of one training run without
// the model state differing: resharding (ZeRO stage, group sizes, mesh), the
// name it was saved under, the library that wrote it. diff reports them and
// does not count them.
bool provenance_attribute(const std::string &name);

} // namespace ckpt_tool
} // namespace dsm
