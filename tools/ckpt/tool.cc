// dsm-ckpt: what the subcommands share (tool.hpp).
#include "tool.hpp"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "../common/cli.hpp"

namespace dsm {
namespace ckpt_tool {

// ---------------------------------------------------------------- arguments

int parse_args(const std::string &cmd, int argc, char **argv, const std::set<std::string> &value_options,
               size_t positional, const char *help, Args &out, const std::set<std::string> &flag_options) {
    bool show_help = false;
    std::vector<tools::CliOption> options;
    for (const std::string &name : value_options)
        options.push_back({name.substr(2), true, [&out, name](const char *v) {
                               out.values[name] = v;
                               return true;
                           }});
    for (const std::string &name : flag_options)
        options.push_back(tools::flag_option(name.c_str() + 2, [&out, name] { out.flags.insert(name); }));
    options.push_back(tools::flag_option("json", [&out] { out.json = true; }));
    options.push_back(tools::final_option("help", &show_help));
    auto refuse = [&cmd](const std::string &message, bool shape) {
        std::fprintf(stderr, "dsm-ckpt %s: %s", cmd.c_str(), message.c_str());
        if (shape) std::fprintf(stderr, " (see dsm-ckpt %s --help)", cmd.c_str());
        std::fputc('\n', stderr);
    };
    auto argument = [&](const char *arg) {
        if (out.positional.size() == positional) {
            refuse(std::string("unexpected argument '") + arg + "'", true);
            return false;
        }
        out.positional.push_back(arg);
        return true;
    };
    const bool ok = tools::parse_command_line(argc, argv, options, argument, refuse);
    if (show_help) {
        std::fputs(help, stdout);
        return -1;
    }
    if (!ok) return 2;
    if (out.positional.size() < positional) {
        refuse(positional == 1 ? "missing PATH (a checkpoint directory or .h5 file)"
               : out.positional.empty() ? "missing checkpoints A and B"
                                        : "missing checkpoint B",
               false);
        return 2;
    }
    return 0;
}

std::optional<std::string> value(const Args &a, const std::string &name) {
    const auto it = a.values.find(name);
    if (it == a.values.end()) return std::nullopt;
    return it->second;
}

// A tolerance: a finite number >= 0.
bool parse_tolerance(const std::string &cmd, const std::string &opt, const std::string &v, double &out) {
    char *end = nullptr;
    errno = 0;
    const double x = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0' || errno != 0 || !std::isfinite(x) || x < 0) {
        std::fprintf(stderr, "dsm-ckpt %s: %s '%s' is not a number >= 0\n", cmd.c_str(), opt.c_str(), v.c_str());
        return false;
    }
    out = x;
    return true;
}

// A damaged file can hold names that are not UTF-8, which JSON cannot carry:
// they are printed with U+FFFD in place of the bad bytes rather than failing.
void print_json(const Json &doc) {
    std::printf("%s\n", doc.dump(2, ' ', true, Json::error_handler_t::replace).c_str());
}

Opened open_checkpoint(const std::string &path, const std::optional<std::string> &tag) {
    Location loc = locate(path, tag);
    Checkpoint ck(loc.file);
    ck.require_format();
    return Opened{std::move(loc), std::move(ck)};
}

Json issues_json(const std::vector<Issue> &issues) {
    Json a = Json::array();
    for (const Issue &i : issues) a.push_back({{"path", i.path}, {"message", i.message}});
    return a;
}

Json shape_json(const std::vector<uint64_t> &shape) {
    Json a = Json::array();
    for (uint64_t d : shape) a.push_back(d);
    return a;
}

Json directory_json(const Location &loc) {
    if (!loc.directory) return nullptr;
    return Json{{"path", loc.dir},
                {"tags", loc.tags},
                {"latest", loc.latest ? Json(*loc.latest) : Json(nullptr)},
                {"latest_problem", loc.latest_problem.empty() ? Json(nullptr) : Json(loc.latest_problem)},
                {"temporary_files", loc.temporary}};
}

Json attribute_json(const Attribute &a) {
    if (a.name == "config" && a.kind == Attribute::Kind::String && Json::accept(a.s)) return Json::parse(a.s);
    return a.json();
}

std::string attr_text(const Checkpoint &ck, const char *name) {
    const Attribute *a = ck.attribute(name);
    return a != nullptr ? a->text() : "-";
}

std::string attr_plain(const Checkpoint &ck, const char *name) {
    const Attribute *a = ck.attribute(name);
    return a != nullptr && a->kind == Attribute::Kind::String ? a->s : attr_text(ck, name);
}

std::string plural(uint64_t n, const char *one, const char *many) {
    return std::to_string(n) + " " + (n == 1 ? one : many);
}

const std::vector<std::string> &training_state_attributes() {
    static const std::vector<std::string> names = {
        "global_steps",        "micro_steps",           "skipped_steps",
        "global_samples",      "optimizer_steps",       "loss_scale",
        "loss_scale_cur_iter", "loss_scale_last_overflow_iter", "loss_scale_cur_hysteresis",
        "lr_schedule_last_step"};
    return names;
}

bool provenance_attribute(const std::string &name) {
    static const std::set<std::string> names = {"tag",
                                                "libdsm_version",
                                                "zero_stage",
                                                "data_parallel_size",
                                                "sequence_parallel_size",
                                                "mesh_shape",
                                                "mesh_names",
                                                "config"};
    return names.count(name) != 0;
}

} // namespace ckpt_tool
} // namespace dsm
