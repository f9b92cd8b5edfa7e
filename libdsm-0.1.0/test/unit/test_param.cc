// The environment parameter registry.
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>

#include "core/error.hpp"
#include "core/param.hpp"

// CMocka last: its fail() macro would break the C++ headers.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

extern "C" { // this CMocka header has no C++ guards
#include <cmocka.h>
}

static void test_registry_names(void **) {
    std::set<std::string> seen;
    for (const dsm::Param &p : dsm::params()) {
        assert_int_equal(std::strncmp(p.name, "DSM_", 4), 0);
        assert_true(std::strlen(p.help) > 10);
        assert_true(seen.insert(p.name).second);
    }
    assert_true(seen.count("DSM_DEBUG") == 1);
    assert_true(seen.count("DSM_MESH_PLACEMENT") == 1);
    assert_true(seen.count("DSM_SIM_NODES") == 1);
}

static void test_default_and_environment(void **) {
    unsetenv("DSM_MESH_PLACEMENT");
    assert_string_equal(dsm::param_string("DSM_MESH_PLACEMENT").c_str(), "node");
    assert_false(dsm::param_is_set("DSM_MESH_PLACEMENT"));
    setenv("DSM_MESH_PLACEMENT", "NONE", 1);
    assert_true(dsm::param_is_set("DSM_MESH_PLACEMENT"));
    assert_string_equal(dsm::param_choice("DSM_MESH_PLACEMENT", {"node", "none"}).c_str(), "none");
    setenv("DSM_MESH_PLACEMENT", "", 1); // empty = unset
    assert_false(dsm::param_is_set("DSM_MESH_PLACEMENT"));
    unsetenv("DSM_MESH_PLACEMENT");
}

static void test_bad_choice_names_value(void **) {
    setenv("DSM_BIND", "sideways", 1);
    try {
        dsm::param_choice("DSM_BIND", {"none", "spread", "gpu"});
        fail_msg("no error for DSM_BIND=sideways");
    } catch (const dsm::Error &e) {
        assert_int_equal(e.status(), DSM_ERR_INVALID_ARGUMENT);
        assert_non_null(std::strstr(e.what(), "DSM_BIND"));
        assert_non_null(std::strstr(e.what(), "sideways"));
        assert_non_null(std::strstr(e.what(), "spread"));
    }
    unsetenv("DSM_BIND");
}

static void test_unregistered_is_internal_error(void **) {
    try {
        dsm::param_string("DSM_NOT_A_PARAMETER");
        fail_msg("no error for an unregistered parameter");
    } catch (const dsm::Error &e) {
        assert_int_equal(e.status(), DSM_ERR_INTERNAL);
    }
}

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_registry_names),
        cmocka_unit_test(test_default_and_environment),
        cmocka_unit_test(test_bad_choice_names_value),
        cmocka_unit_test(test_unregistered_is_internal_error),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
