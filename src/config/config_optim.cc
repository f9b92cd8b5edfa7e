// "optimizer" and "scheduler": DeepSpeed's type names, parameters and defaults.
#include "config/config_internal.hpp"

#include <strings.h>

#include <cmath>
#include <functional>
#include <optional>

#include "config/settings.hpp"
#include "core/error.hpp"

namespace dsm {
namespace config {

const char *scheduler_name(SchedulerType t) {
    switch (t) {
    case SchedulerType::NONE: return "none";
    case SchedulerType::WARMUP_LR: return "WarmupLR";
    case SchedulerType::WARMUP_DECAY_LR: return "WarmupDecayLR";
    case SchedulerType::WARMUP_COSINE_LR: return "WarmupCosineLR";
    case SchedulerType::ONE_CYCLE: return "OneCycle";
    case SchedulerType::LR_RANGE_TEST: return "LRRangeTest";
    }
    return "?";
}

namespace {

bool iequal(const std::string &a, const char *b) { return strcasecmp(a.c_str(), b) == 0; }

// DeepSpeed optimizers and schedules that libdsm does not implement.
const char *const unsupported_optimizers[] = {"onebitadam", "zerooneadam", "onebitlamb", "muadam",
                                              "muadamw",    "musgd",       "muon"};

void read_betas(Node &p, OptimizerConfig &o) {
    const Json *b = p.get("betas");
    if (b == nullptr) return;
    if (!b->is_array() || b->size() != 2 || !(*b)[0].is_number() || !(*b)[1].is_number())
        p.fail("betas", "a list of two numbers", *b);
    o.beta1 = (*b)[0].get<double>();
    o.beta2 = (*b)[1].get<double>();
    if (!(o.beta1 >= 0.0 && o.beta1 < 1.0 && o.beta2 >= 0.0 && o.beta2 < 1.0))
        p.fail("betas", "two numbers in [0, 1)", *b);
}

} // namespace

void read_optimizer(Node &root, Config &cfg) {
    OptimizerConfig &o = cfg.optimizer;
    Node opt = root.child("optimizer");
    if (!opt.present()) return;
    opt.get_bool("legacy_fusion", false);
    o.type_name = opt.get_string("type", "");
    if (o.type_name.empty()) {
        DSM_REQUIRE(!opt.has("params"), DSM_ERR_CONFIG, opt.key_path("type"),
                    ": missing; \"optimizer.params\" needs an optimizer type");
        opt.finish();
        return;
    }
    static const char *const names[] = {"adam", "adamw", "sgd", "lamb", "lion", "adagrad"};
    static const OptimizerType types[] = {OptimizerType::ADAM, OptimizerType::ADAMW, OptimizerType::SGD,
                                          OptimizerType::LAMB, OptimizerType::LION, OptimizerType::ADAGRAD};
    for (size_t i = 0; i < 6; ++i)
        if (iequal(o.type_name, names[i])) o.type = types[i];
    if (o.type == OptimizerType::NONE) {
        for (const char *n : unsupported_optimizers)
            DSM_REQUIRE(!iequal(o.type_name, n), DSM_ERR_NOT_SUPPORTED, opt.key_path("type"), ": \"",
                        o.type_name, "\" is not supported by libdsm (supported: Adam, AdamW, SGD, Lamb, Lion, Adagrad)");
        opt.fail("type", "one of Adam, AdamW, SGD, Lamb, Lion, Adagrad", Json(o.type_name));
    }

    // Defaults of DeepSpeed's implementations (FusedAdam, FusedLamb, FusedLion,
    // DeepSpeedCPUAdagrad) and of torch.optim.SGD.
    o.lr = o.type == OptimizerType::ADAGRAD ? 1e-2 : 1e-3;
    o.beta1 = 0.9;
    o.beta2 = 0.999; // FusedLion and the CPU Lion too
    o.eps = o.type == OptimizerType::ADAGRAD ? 1e-10 : 1e-8;
    Node p = opt.child("params");
    if (p.present()) o.params = *p.object();
    const Json *mgn = p.get("max_grad_norm");
    if (mgn != nullptr)
        DSM_FAIL(DSM_ERR_CONFIG, p.key_path("max_grad_norm"), ": ", show(*mgn),
                 " is not accepted as an optimizer parameter; use the top-level \"gradient_clipping\"");
    o.lr = p.get_number("lr", o.lr, 0.0, INFINITY);
    o.weight_decay = p.get_number("weight_decay", 0.0, 0.0, INFINITY);
    switch (o.type) {
    case OptimizerType::ADAM:
    case OptimizerType::ADAMW:
        o.torch_adam = p.get_bool("torch_adam", false);
        o.adam_w_mode = p.get_bool("adam_w_mode", true) || o.type == OptimizerType::ADAMW;
        read_betas(p, o);
        o.eps = p.get_number("eps", o.eps, 0.0, INFINITY);
        o.bias_correction = p.get_bool("bias_correction", true);
        if (p.get_bool("amsgrad", false))
            DSM_FAIL(DSM_ERR_NOT_SUPPORTED, p.key_path("amsgrad"), ": AMSGrad is not supported by libdsm");
        break;
    case OptimizerType::LAMB:
        read_betas(p, o);
        o.eps = p.get_number("eps", o.eps, 0.0, INFINITY);
        o.bias_correction = p.get_bool("bias_correction", true);
        o.max_coeff = p.get_number("max_coeff", o.max_coeff, 0.0, INFINITY);
        o.min_coeff = p.get_number("min_coeff", o.min_coeff, 0.0, INFINITY);
        if (o.min_coeff > o.max_coeff)
            p.fail("min_coeff", cat("a number <= max_coeff (", o.max_coeff, ")"), Json(o.min_coeff));
        break;
    case OptimizerType::LION: read_betas(p, o); break;
    case OptimizerType::ADAGRAD:
        o.eps = p.get_number("eps", o.eps, 0.0, INFINITY);
        o.lr_decay = p.get_number("lr_decay", 0.0, 0.0, INFINITY);
        o.initial_accumulator_value = p.get_number("initial_accumulator_value", 0.0, 0.0, INFINITY);
        break;
    case OptimizerType::SGD:
        o.momentum = p.get_number("momentum", 0.0, 0.0, INFINITY);
        o.dampening = p.get_number("dampening", 0.0, 0.0, INFINITY);
        o.nesterov = p.get_bool("nesterov", false);
        if (o.nesterov && (o.momentum <= 0.0 || o.dampening != 0.0))
            p.fail("nesterov", "false unless momentum > 0 and dampening == 0", Json(true));
        break;
    case OptimizerType::NONE: break;
    }
    p.finish();
    opt.finish();
}

namespace {

using optim::LrScheduleParams;

bool nonneg_number(const Json &v) { return v.is_number() && std::isfinite(v.get<double>()) && v.get<double>() >= 0; }

// A learning rate (or ratio, momentum): a number >= 0, or a non-empty list of
// them (one per parameter group).
bool lr_value(const Json &v) {
    if (nonneg_number(v)) return true;
    if (!v.is_array() || v.empty()) return false;
    for (const Json &x : v)
        if (!nonneg_number(x)) return false;
    return true;
}

// One key of "scheduler.params", read once: read() checks the value given
// (DSM_ERR_CONFIG naming the key and the value) and writes it into the typed
// configuration; value() is the value in force afterwards, as JSON (what
// describe_lr lists for a key left out: DeepSpeed's default). Ranges that
// involve several keys are checked by check_schedule_params().
struct ScheduleKey {
    const char *name;
    bool required;
    std::function<void(Node &p, const Json &v, SchedulerConfig &s)> read;
    std::function<Json(const SchedulerConfig &s)> value;
};

// "Float or list": a number >= 0, or one per parameter group.
ScheduleKey list_key(const char *name, std::vector<double> LrScheduleParams::*field, bool required = false) {
    return {name, required,
            [name, field](Node &p, const Json &v, SchedulerConfig &s) {
                if (!lr_value(v)) p.fail(name, "a number >= 0 or a list of them (one per parameter group)", v);
                s.schedule.*field =
                    v.is_array() ? v.get<std::vector<double>>() : std::vector<double>{v.get<double>()};
            },
            [field](const SchedulerConfig &s) {
                const std::vector<double> &x = s.schedule.*field;
                return x.empty() ? Json() : x.size() == 1 ? Json(x[0]) : Json(x);
            }};
}

// A number >= 0 that DeepSpeed does not take per group.
ScheduleKey number_key(const char *name, double LrScheduleParams::*field) {
    return {name, false,
            [name, field](Node &p, const Json &v, SchedulerConfig &s) {
                if (!nonneg_number(v)) p.fail(name, "a number >= 0", v);
                s.schedule.*field = v.get<double>();
            },
            [field](const SchedulerConfig &s) { return Json(s.schedule.*field); }};
}

int64_t read_integer(Node &p, const char *name, const Json &v, int64_t min) {
    int64_t x = 0;
    if (!as_int(v, &x)) p.fail(name, "an integer", v);
    if (x < min) p.fail(name, range_text(min, INT64_MAX), v);
    return x;
}

ScheduleKey int_key(const char *name, int64_t LrScheduleParams::*field, int64_t min) {
    return {name, false,
            [name, field, min](Node &p, const Json &v, SchedulerConfig &s) {
                s.schedule.*field = read_integer(p, name, v, min);
            },
            [field](const SchedulerConfig &s) { return Json(s.schedule.*field); }};
}

// An integer that may be left unset (null, DeepSpeed's None), or must be given.
ScheduleKey opt_int_key(const char *name, std::optional<int64_t> LrScheduleParams::*field, int64_t min,
                        bool required) {
    return {name, required,
            [name, field, min](Node &p, const Json &v, SchedulerConfig &s) {
                s.schedule.*field = read_integer(p, name, v, min);
            },
            [field](const SchedulerConfig &s) {
                const std::optional<int64_t> &x = s.schedule.*field;
                return x ? Json(*x) : Json();
            }};
}

ScheduleKey bool_key(const char *name, bool LrScheduleParams::*field) {
    return {name, false,
            [name, field](Node &p, const Json &v, SchedulerConfig &s) {
                if (!v.is_boolean()) p.fail(name, "true or false", v);
                s.schedule.*field = v.get<bool>();
            },
            [field](const SchedulerConfig &s) { return Json(s.schedule.*field); }};
}

ScheduleKey warmup_type_key() {
    return {"warmup_type", false,
            [](Node &p, const Json &v, SchedulerConfig &s) {
                if (!v.is_string() || (v.get<std::string>() != "log" && v.get<std::string>() != "linear"))
                    p.fail("warmup_type", "\"log\" or \"linear\"", v);
                s.schedule.warmup_type = v.get<std::string>();
            },
            [](const SchedulerConfig &s) { return Json(s.schedule.warmup_type); }};
}

// Every schedule's: the step count a schedule restored by hand starts after.
ScheduleKey last_batch_iteration_key() {
    return {"last_batch_iteration", false,
            [](Node &p, const Json &v, SchedulerConfig &s) {
                s.last_batch_iteration = read_integer(p, "last_batch_iteration", v, -1);
            },
            [](const SchedulerConfig &s) { return Json(s.last_batch_iteration); }};
}

// The keys of each schedule, with the fields of LrScheduleParams they write
// (defaults: those of LrScheduleParams, DeepSpeed's).
std::vector<ScheduleKey> schedule_keys(SchedulerType t) {
    using P = LrScheduleParams;
    switch (t) {
    case SchedulerType::WARMUP_LR:
    case SchedulerType::WARMUP_DECAY_LR: {
        std::vector<ScheduleKey> v = {list_key("warmup_min_lr", &P::warmup_min_lr),
                                      list_key("warmup_max_lr", &P::warmup_max_lr),
                                      int_key("warmup_num_steps", &P::warmup_num_steps, 0),
                                      warmup_type_key(), last_batch_iteration_key()};
        if (t == SchedulerType::WARMUP_DECAY_LR)
            v.push_back(opt_int_key("total_num_steps", &P::total_num_steps, 1, true));
        return v;
    }
    case SchedulerType::WARMUP_COSINE_LR:
        return {opt_int_key("total_num_steps", &P::total_num_steps, 1, true),
                number_key("warmup_min_ratio", &P::warmup_min_ratio),
                int_key("warmup_num_steps", &P::warmup_num_steps, 0),
                number_key("cos_min_ratio", &P::cos_min_ratio),
                warmup_type_key(),
                last_batch_iteration_key()};
    case SchedulerType::ONE_CYCLE:
        return {list_key("cycle_min_lr", &P::cycle_min_lr, true),
                list_key("cycle_max_lr", &P::cycle_max_lr, true),
                number_key("decay_lr_rate", &P::decay_lr_rate),
                int_key("cycle_first_step_size", &P::cycle_first_step_size, 1),
                opt_int_key("cycle_second_step_size", &P::cycle_second_step_size, 1, false),
                int_key("cycle_first_stair_count", &P::cycle_first_stair_count, 0),
                opt_int_key("cycle_second_stair_count", &P::cycle_second_stair_count, 0, false),
                int_key("decay_step_size", &P::decay_step_size, 0),
                bool_key("cycle_momentum", &P::cycle_momentum),
                list_key("cycle_min_mom", &P::cycle_min_mom),
                list_key("cycle_max_mom", &P::cycle_max_mom),
                number_key("decay_mom_rate", &P::decay_mom_rate),
                last_batch_iteration_key()};
    case SchedulerType::LR_RANGE_TEST:
        return {list_key("lr_range_test_min_lr", &P::lr_range_test_min_lr),
                int_key("lr_range_test_step_size", &P::lr_range_test_step_size, 1),
                number_key("lr_range_test_step_rate", &P::lr_range_test_step_rate),
                bool_key("lr_range_test_staircase", &P::lr_range_test_staircase),
                last_batch_iteration_key()};
    case SchedulerType::NONE: break;
    }
    return {};
}

} // namespace

void read_scheduler(Node &root, Config &cfg) {
    SchedulerConfig &s = cfg.scheduler;
    Node sch = root.child("scheduler");
    if (!sch.present()) return;
    s.type_name = sch.get_string("type", "");
    if (s.type_name.empty()) {
        DSM_REQUIRE(!sch.has("params"), DSM_ERR_CONFIG, sch.key_path("type"),
                    ": missing; \"scheduler.params\" needs a scheduler type");
        sch.finish();
        return;
    }
    static const SchedulerType all[] = {SchedulerType::WARMUP_LR, SchedulerType::WARMUP_DECAY_LR,
                                        SchedulerType::WARMUP_COSINE_LR, SchedulerType::ONE_CYCLE,
                                        SchedulerType::LR_RANGE_TEST};
    for (SchedulerType t : all)
        if (s.type_name == scheduler_name(t)) s.type = t;
    if (s.type == SchedulerType::NONE)
        sch.fail("type", "one of WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest",
                 Json(s.type_name));
    s.schedule = LrScheduleParams();
    s.schedule.type = lr_schedule_type(s.type);
    // WarmupDecayLR warms up to 0.001 unless told otherwise (DeepSpeed's
    // default), WarmupLR to each group's base lr (warmup_max_lr empty).
    if (s.type == SchedulerType::WARMUP_DECAY_LR) s.schedule.warmup_max_lr = {0.001};
    s.last_batch_iteration = -1;
    Node p = sch.child("params");
    s.params = Json::object();
    for (const ScheduleKey &key : schedule_keys(s.type)) {
        const Json *v = p.get(key.name);
        if (v != nullptr) key.read(p, *v, s);
        else DSM_REQUIRE(!key.required, DSM_ERR_CONFIG, p.key_path(key.name), ": required by ", s.type_name);
        s.params[key.name] = v != nullptr ? *v : key.value(s);
    }
    p.finish();
    sch.finish();
    check_schedule_params(s);
}

} // namespace config
} // namespace dsm
