// The one registry of environment parameters. Nothing in libdsm reads the
// environment except through here, so `dsm-info --env` lists every variable
// with its default and help.
#pragma once

#include <initializer_list>
#include <string>
#include <vector>

namespace dsm {

struct Param {
    const char *name;
    const char *default_value;
    const char *help;
};

// Every parameter libdsm knows, in the order dsm-info lists them.
const std::vector<Param> &params();

// The value of a registered parameter: the environment's if set and non-empty,
// else the default. An unregistered name is a bug (DSM_ERR_INTERNAL).
std::string param_string(const char *name);

// Whether the environment sets the parameter.
bool param_is_set(const char *name);

// The value, which must be one of `choices` (case-insensitive; the result is
// the matching choice); otherwise DSM_ERR_INVALID_ARGUMENT naming the variable,
// the value and the choices.
std::string param_choice(const char *name, std::initializer_list<const char *> choices);

} // namespace dsm
