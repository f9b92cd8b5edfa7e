// "optimizer" and "scheduler": DeepSpeed's type names, parameters and defaults.
#include "config/config_internal.hpp"

#include <strings.h>

#include <cmath>

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

enum class Kind { LR, INT, INT_OR_NULL, BOOL, WARMUP_TYPE };

struct ParamSpec {
    const char *name;
    Kind kind;
    Json def;        // null with `required` = must be given
    bool required;
    int64_t min;     // integers
};

std::vector<ParamSpec> schedule_params(SchedulerType t) {
    const ParamSpec last{"last_batch_iteration", Kind::INT, Json(-1), false, -1};
    switch (t) {
    case SchedulerType::WARMUP_LR:
    case SchedulerType::WARMUP_DECAY_LR: {
        // WarmupLR warms up to each group's base lr unless warmup_max_lr is
        // given (null here); WarmupDecayLR's default is 0.001, as in DeepSpeed.
        std::vector<ParamSpec> v = {{"warmup_min_lr", Kind::LR, Json(0.0), false, 0},
                                    {"warmup_max_lr", Kind::LR,
                                     t == SchedulerType::WARMUP_LR ? Json() : Json(0.001), false, 0},
                                    {"warmup_num_steps", Kind::INT, Json(1000), false, 0},
                                    {"warmup_type", Kind::WARMUP_TYPE, Json("log"), false, 0},
                                    last};
        if (t == SchedulerType::WARMUP_DECAY_LR)
            v.push_back({"total_num_steps", Kind::INT, Json(), true, 1});
        return v;
    }
    case SchedulerType::WARMUP_COSINE_LR:
        return {{"total_num_steps", Kind::INT, Json(), true, 1},
                {"warmup_min_ratio", Kind::LR, Json(0.0), false, 0},
                {"warmup_num_steps", Kind::INT, Json(1000), false, 0},
                {"cos_min_ratio", Kind::LR, Json(0.0001), false, 0},
                {"warmup_type", Kind::WARMUP_TYPE, Json("log"), false, 0},
                last};
    case SchedulerType::ONE_CYCLE:
        return {{"cycle_min_lr", Kind::LR, Json(), true, 0},
                {"cycle_max_lr", Kind::LR, Json(), true, 0},
                {"decay_lr_rate", Kind::LR, Json(0.0), false, 0},
                {"cycle_first_step_size", Kind::INT, Json(2000), false, 1},
                {"cycle_second_step_size", Kind::INT_OR_NULL, Json(), false, 1},
                {"cycle_first_stair_count", Kind::INT, Json(0), false, 0},
                {"cycle_second_stair_count", Kind::INT_OR_NULL, Json(), false, 0},
                {"decay_step_size", Kind::INT, Json(0), false, 0},
                {"cycle_momentum", Kind::BOOL, Json(true), false, 0},
                {"cycle_min_mom", Kind::LR, Json(0.8), false, 0},
                {"cycle_max_mom", Kind::LR, Json(0.9), false, 0},
                {"decay_mom_rate", Kind::LR, Json(0.0), false, 0},
                last};
    case SchedulerType::LR_RANGE_TEST:
        return {{"lr_range_test_min_lr", Kind::LR, Json(0.001), false, 0},
                {"lr_range_test_step_size", Kind::INT, Json(2000), false, 1},
                {"lr_range_test_step_rate", Kind::LR, Json(1.0), false, 0},
                {"lr_range_test_staircase", Kind::BOOL, Json(false), false, 0},
                last};
    case SchedulerType::NONE: break;
    }
    return {};
}

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
    Node p = sch.child("params");
    s.params = Json::object();
    for (const ParamSpec &spec : schedule_params(s.type)) {
        const Json *v = p.get(spec.name);
        if (v == nullptr) {
            DSM_REQUIRE(!spec.required, DSM_ERR_CONFIG, p.key_path(spec.name), ": required by ", s.type_name);
            s.params[spec.name] = spec.def;
            continue;
        }
        switch (spec.kind) {
        case Kind::LR:
            if (!lr_value(*v)) p.fail(spec.name, "a number >= 0 or a list of them (one per parameter group)", *v);
            break;
        case Kind::INT:
        case Kind::INT_OR_NULL: {
            int64_t x = 0;
            if (!as_int(*v, &x)) p.fail(spec.name, "an integer", *v);
            if (x < spec.min) p.fail(spec.name, range_text(spec.min, INT64_MAX), *v);
            break;
        }
        case Kind::BOOL:
            if (!v->is_boolean()) p.fail(spec.name, "true or false", *v);
            break;
        case Kind::WARMUP_TYPE:
            if (!v->is_string() || (v->get<std::string>() != "log" && v->get<std::string>() != "linear"))
                p.fail(spec.name, "\"log\" or \"linear\"", *v);
            break;
        }
        s.params[spec.name] = *v;
    }
    p.finish();
    sch.finish();
    s.schedule = schedule_params_from_json(s.type, s.params);
    s.last_batch_iteration = last_batch_iteration_from_json(s.params);
    check_schedule_params(s);
}

} // namespace config
} // namespace dsm
