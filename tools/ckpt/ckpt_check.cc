// dsm-ckpt: a checkpoint's root attributes and optimizer states checked against
// doc/checkpoint.md (see ckpt_read.hpp).
#include "ckpt_read.hpp"

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include <dirent.h>
#include <csignal>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

namespace dsm {
namespace ckpt_tool {

// ---------------------------------------------------------------- checks

void Checkpoint::require_format() const {
    const Attribute *f = attribute("format");
    const Attribute *v = attribute("format_version");
    if (f == nullptr || f->kind != Attribute::Kind::String)
        throw Error(file_ + ": not a libdsm checkpoint (no string attribute 'format')");
    if (f->s != "dsm-checkpoint")
        throw Error(file_ + ": not a libdsm checkpoint (format is \"" + f->s + "\", expected \"dsm-checkpoint\")");
    if (v == nullptr || v->kind != Attribute::Kind::Int)
        throw Error(file_ + ": no integer attribute 'format_version'");
    if (v->i < 1 || v->i > dsm::ckpt::kFormatVersion)
        throw Error(file_ + ": format_version " + v->text() + " is not supported (this dsm-ckpt reads versions 1 to " +
                    std::to_string(dsm::ckpt::kFormatVersion) + ")");
}

int64_t Checkpoint::format_version() const {
    const Attribute *v = attribute("format_version");
    return v != nullptr && v->kind == Attribute::Kind::Int ? v->i : 1;
}

// The root attributes as JSON of the types the library reads them as
// (integers, doubles, strings, arrays), checksummed as the library does.
uint64_t Checkpoint::root_attributes_checksum() const {
    nlohmann::json all = nlohmann::json::object(); // keys in byte order, as the library dumps them
    for (const Attribute &a : attributes_) {
        switch (a.kind) {
        case Attribute::Kind::Int:
            all[a.name] = a.is_unsigned ? nlohmann::json(static_cast<uint64_t>(a.i)) : nlohmann::json(a.i);
            break;
        case Attribute::Kind::Float: all[a.name] = a.f; break;
        case Attribute::Kind::String: all[a.name] = a.s; break;
        case Attribute::Kind::IntArray: {
            nlohmann::json arr = nlohmann::json::array();
            for (int64_t x : a.ints) arr.push_back(a.is_unsigned ? nlohmann::json(static_cast<uint64_t>(x)) : nlohmann::json(x));
            all[a.name] = arr;
            break;
        }
        case Attribute::Kind::FloatArray: all[a.name] = a.floats; break;
        default: break;
        }
    }
    return dsm::ckpt::root_attributes_checksum(all);
}

void Checkpoint::check_root_attributes() {
    using K = Attribute::Kind;
    struct Expected {
        const char *name;
        K kind;
    };
    static const Expected kExpected[] = {
        {"format", K::String},
        {"format_version", K::Int},
        {"libdsm_version", K::String},
        {"tag", K::String},
        {"global_steps", K::Int},
        {"micro_steps", K::Int},
        {"skipped_steps", K::Int},
        {"global_samples", K::Int},
        {"optimizer_steps", K::Int},
        {"loss_scale", K::Float},
        {"loss_scale_cur_iter", K::Int},
        {"loss_scale_last_overflow_iter", K::Int},
        {"loss_scale_cur_hysteresis", K::Int},
        {"lr_schedule_last_step", K::Int},
        {"zero_stage", K::Int},
        {"data_parallel_size", K::Int},
        {"sequence_parallel_size", K::Int},
        {"mesh_shape", K::IntArray},
        {"mesh_names", K::String},
        {"compute_dtype", K::String},
        {"optimizer", K::String},
        {"config", K::String},
    };
    static const char *const kKindName[] = {"an integer", "a float", "a string", "an integer array",
                                            "a float array", "other"};
    for (const Expected &e : kExpected) {
        const Attribute *a = attribute(e.name);
        if (a == nullptr) {
            problem("/", std::string("missing attribute '") + e.name + "'");
        } else if (a->kind != e.kind) {
            problem("/", std::string("attribute '") + e.name + "' is " + a->type + ", expected " +
                             kKindName[static_cast<int>(e.kind)]);
        } else if ((e.kind == K::Int || e.kind == K::IntArray) && (a->bits != 64 || a->is_unsigned)) {
            warning("/", std::string("attribute '") + e.name + "' is " + a->type + "; the format says int64");
        } else if (e.kind == K::Float && a->bits != 64) {
            warning("/", std::string("attribute '") + e.name + "' is " + a->type + "; the format says float64");
        }
    }
    // The values the format constrains. A wrong kind was reported above.
    auto int_attr = [&](const char *name) -> const Attribute * {
        const Attribute *a = attribute(name);
        return a != nullptr && a->kind == K::Int ? a : nullptr;
    };
    auto str_attr = [&](const char *name) -> const Attribute * {
        const Attribute *a = attribute(name);
        return a != nullptr && a->kind == K::String ? a : nullptr;
    };
    auto at_least = [&](const char *name, int64_t min) {
        const Attribute *a = int_attr(name);
        if (a != nullptr && a->i < min)
            problem("/", std::string("attribute '") + name + "' is " + a->text() + ", expected >= " +
                             std::to_string(min));
    };
    for (const char *name : {"global_steps", "micro_steps", "skipped_steps", "global_samples", "optimizer_steps",
                             "loss_scale_cur_iter", "loss_scale_cur_hysteresis"})
        at_least(name, 0);
    at_least("loss_scale_last_overflow_iter", -1);
    at_least("lr_schedule_last_step", -1);
    at_least("data_parallel_size", 1);
    at_least("sequence_parallel_size", 1);
    if (const Attribute *a = int_attr("zero_stage"); a != nullptr && (a->i < 0 || a->i > 3))
        problem("/", "attribute 'zero_stage' is " + a->text() + ", expected 0..3");
    if (const Attribute *a = attribute("loss_scale");
        a != nullptr && a->kind == K::Float && !(a->f > 0 && std::isfinite(a->f)))
        problem("/", "attribute 'loss_scale' is " + a->text() + ", expected a positive finite number");
    auto one_of = [&](const char *name, std::initializer_list<const char *> allowed) {
        const Attribute *a = str_attr(name);
        if (a == nullptr) return;
        for (const char *v : allowed)
            if (a->s == v) return;
        std::string list;
        for (const char *v : allowed) list += std::string(list.empty() ? "" : ", ") + v;
        problem("/", std::string("attribute '") + name + "' is " + a->text() + ", expected one of " + list);
    };
    one_of("compute_dtype", {"float32", "float16", "bfloat16"});
    one_of("optimizer", {"adam", "adamw", "sgd", "lamb", "lion", "adagrad"});
    if (const Attribute *a = str_attr("config"); a != nullptr && !Json::accept(a->s))
        problem("/", "attribute 'config' is not valid JSON");
    if (const Attribute *a = str_attr("tag"); a != nullptr) {
        if (!valid_tag(a->s)) {
            problem("/", "attribute 'tag' is " + a->text() + ", not a valid tag");
        } else {
            // A renamed file still loads by its new name; say so, do not fail.
            const size_t slash = file_.find_last_of('/');
            const std::string base = slash == std::string::npos ? file_ : file_.substr(slash + 1);
            if (base != a->s + ".h5")
                warning("/", "attribute 'tag' is " + a->text() + " but the file is named " + base);
        }
    }
    const Attribute *shape = attribute("mesh_shape");
    const Attribute *names = str_attr("mesh_names");
    if (shape != nullptr && shape->kind == K::IntArray && names != nullptr) {
        const size_t count = names->s.empty() ? 0 : std::count(names->s.begin(), names->s.end(), ',') + size_t(1);
        if (count != shape->ints.size())
            problem("/", "attribute 'mesh_names' has " + std::to_string(count) + " names for " +
                             std::to_string(shape->ints.size()) + " dimensions of 'mesh_shape'");
        for (int64_t s : shape->ints)
            if (s < 1) problem("/", "attribute 'mesh_shape' has a size " + std::to_string(s) + " < 1");
    }
    // Format version 2: the checksum over the root attributes.
    if (format_version() >= 2) {
        const Attribute *sum = attribute("attrs_checksum");
        if (sum == nullptr) problem("/", "missing attribute 'attrs_checksum'");
        else if (sum->kind != K::Int || sum->bits != 64 || !sum->is_unsigned)
            problem("/", "attribute 'attrs_checksum' is " + sum->type + ", expected uint64");
        else if (static_cast<uint64_t>(sum->i) != root_attributes_checksum())
            problem("/", "checksum mismatch in the root attributes (the file is corrupt)");
    }
}

// Each optimizer state of each trainable parameter, and nothing else: a state
// of a missing or frozen parameter, or of another shape, cannot be loaded.
void Checkpoint::check_optimizer_states() {
    std::map<std::string, const Tensor *> params;
    for (const Tensor &t : tensors_)
        if (t.param()) params[t.link] = &t;
    std::map<std::string, std::set<std::string>> states; // state -> links
    for (const Tensor &t : tensors_) {
        if (t.param()) continue;
        states[t.state].insert(t.link);
        const auto p = params.find(t.link);
        if (p == params.end()) {
            problem(t.path, "has no parameter /params/" + t.link);
            continue;
        }
        if (p->second->float32 && t.float32 && p->second->shape != t.shape)
            problem(t.path, "has shape " + shape_text(t.shape) + ", its parameter " + shape_text(p->second->shape));
        if (p->second->trainable && *p->second->trainable == 0)
            problem(t.path, "is a state of a frozen parameter (trainable 0)");
        if (t.name && p->second->name && *t.name != *p->second->name)
            problem(t.path, "attribute 'name' is \"" + *t.name + "\", its parameter's \"" + *p->second->name + "\"");
    }
    // Every state kept for some parameter is kept for every trainable one.
    for (const auto &s : states)
        for (const auto &p : params)
            if (p.second->trainable && *p.second->trainable == 1 && !s.second.count(p.first))
                problem("/optimizer/" + s.first + "/" + p.first, "missing (trainable parameter " + p.second->path + ")");

    const Attribute *opt = attribute("optimizer");
    if (opt == nullptr || opt->kind != Attribute::Kind::String) return;
    static const std::map<std::string, std::set<std::string>> kStates = {
        {"adam", {"exp_avg", "exp_avg_sq"}}, {"adamw", {"exp_avg", "exp_avg_sq"}},
        {"lamb", {"exp_avg", "exp_avg_sq"}}, {"lion", {"exp_avg"}},
        {"sgd", {"momentum_buffer"}},        {"adagrad", {"sum"}},
    };
    const auto expected = kStates.find(opt->s);
    if (expected == kStates.end()) return;
    for (const auto &s : states)
        if (!expected->second.count(s.first))
            warning("/optimizer/" + s.first, "is not a state of optimizer \"" + opt->s + "\"");
    const bool any_trainable = std::any_of(params.begin(), params.end(), [](const auto &p) {
        return p.second->trainable && *p.second->trainable == 1;
    });
    // SGD keeps a momentum buffer only with momentum: its absence is normal.
    if (any_trainable && opt->s != "sgd")
        for (const std::string &s : expected->second)
            if (!states.count(s))
                warning("/optimizer/" + s, "missing (optimizer \"" + opt->s + "\" keeps it)");
}

} // namespace ckpt_tool
} // namespace dsm
