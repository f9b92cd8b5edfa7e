// Typed environment parameters (DSM_PARAM) and their registry. The test
// declares parameters of its own: the library's are declared in the files
// that use them, which this test does not link.
#include <cstdint>
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

namespace {

DSM_PARAM(sim, TEST_PARAM_TEXT, dsm::param::Text(), "plain", "Testing: a text parameter of test_param.");
DSM_PARAM(log, TEST_PARAM_CHOICE, dsm::param::Choice({"node", "none"}), "node",
          "Testing: a choice parameter of test_param.");
DSM_PARAM(mesh, TEST_PARAM_INT, dsm::param::Int(1, 64), "", "Testing: an int parameter of test_param.");
DSM_PARAM(mesh, TEST_PARAM_DEVICE, dsm::param::Int(0, 9, "a device number", -1), "",
          "Testing: an int parameter with its own expectation.");
DSM_PARAM(comm, TEST_PARAM_SIZE, dsm::param::Size(4096, size_t(1) << 30), "60K",
          "Testing: a size parameter of test_param.");
DSM_PARAM(ckpt, TEST_PARAM_BOOL, dsm::param::Bool(), "1", "Testing: a bool parameter of test_param.");

// The error of `f`, which must fail with DSM_ERR_INVALID_ARGUMENT.
template <typename F> std::string error_of(F &&f) {
    try {
        f();
    } catch (const dsm::Error &e) {
        assert_int_equal(e.status(), DSM_ERR_INVALID_ARGUMENT);
        return e.message();
    }
    fail_msg("no error");
    return "";
}

} // namespace

static void test_registry(void **) {
    std::set<std::string> seen;
    const std::vector<const dsm::ParamBase *> all = dsm::params();
    for (const dsm::ParamBase *p : all) {
        assert_int_equal(std::strncmp(p->name(), "DSM_", 4), 0);
        assert_true(std::strlen(p->help()) > 10);
        assert_true(seen.insert(p->name()).second);
    }
    for (const char *n : {"DSM_TEST_PARAM_TEXT", "DSM_TEST_PARAM_CHOICE", "DSM_TEST_PARAM_INT", "DSM_TEST_PARAM_SIZE",
                          "DSM_TEST_PARAM_BOOL", "DSM_TEST_PARAM_DEVICE"})
        assert_true(seen.count(n) == 1);
    // The library's own parameter of this layer (core/log.cc).
    assert_true(seen.count("DSM_DEBUG") == 1);
    // Listed by subsystem, then by name.
    for (size_t i = 1; i < all.size(); ++i) {
        const dsm::ParamBase *a = all[i - 1], *b = all[i];
        assert_true(a->subsys() < b->subsys() || (a->subsys() == b->subsys() && std::strcmp(a->name(), b->name()) < 0));
    }
    assert_string_equal(param_TEST_PARAM_SIZE().type(), "size");
    assert_string_equal(param_TEST_PARAM_BOOL().type(), "bool");
    assert_string_equal(param_TEST_PARAM_CHOICE().type(), "choice");
    assert_string_equal(param_TEST_PARAM_INT().type(), "int");
    assert_string_equal(param_TEST_PARAM_TEXT().type(), "string");
    assert_string_equal(param_TEST_PARAM_SIZE().default_value(), "60K");
}

static void test_default_and_environment(void **) {
    unsetenv("DSM_TEST_PARAM_CHOICE");
    assert_string_equal(param_TEST_PARAM_CHOICE().value().c_str(), "node");
    assert_false(param_TEST_PARAM_CHOICE().is_set());
    setenv("DSM_TEST_PARAM_CHOICE", "NONE", 1); // case-insensitive; the value as declared
    assert_true(param_TEST_PARAM_CHOICE().is_set());
    assert_string_equal(param_TEST_PARAM_CHOICE().value().c_str(), "none");
    assert_string_equal(param_TEST_PARAM_CHOICE().raw().c_str(), "NONE");
    setenv("DSM_TEST_PARAM_CHOICE", "", 1); // empty = unset
    assert_false(param_TEST_PARAM_CHOICE().is_set());
    assert_string_equal(param_TEST_PARAM_CHOICE().value().c_str(), "node");
    unsetenv("DSM_TEST_PARAM_CHOICE");
    setenv("DSM_TEST_PARAM_TEXT", "a,b:c", 1);
    assert_string_equal(param_TEST_PARAM_TEXT().value().c_str(), "a,b:c");
    unsetenv("DSM_TEST_PARAM_TEXT");
    assert_string_equal(param_TEST_PARAM_TEXT().value().c_str(), "plain");
}

static void test_bad_choice_names_value(void **) {
    setenv("DSM_TEST_PARAM_CHOICE", "sideways", 1);
    const std::string m = error_of([] { param_TEST_PARAM_CHOICE().value(); });
    assert_string_equal(m.c_str(), "environment DSM_TEST_PARAM_CHOICE=\"sideways\": expected one of node, none");
    // Not cached: asked again, it fails again.
    assert_string_equal(error_of([] { param_TEST_PARAM_CHOICE().value(); }).c_str(), m.c_str());
    unsetenv("DSM_TEST_PARAM_CHOICE");
    assert_string_equal(param_TEST_PARAM_CHOICE().value().c_str(), "node");
}

static void test_int(void **) {
    unsetenv("DSM_TEST_PARAM_INT");
    assert_int_equal(param_TEST_PARAM_INT().value(), 0); // empty
    assert_int_equal(param_TEST_PARAM_DEVICE().value(), -1);
    setenv("DSM_TEST_PARAM_INT", "64", 1);
    assert_int_equal(param_TEST_PARAM_INT().value(), 64);
    setenv("DSM_TEST_PARAM_INT", "007", 1);
    assert_int_equal(param_TEST_PARAM_INT().value(), 7);
    for (const char *bad : {"0", "65", "-2", "four", "3x", "+3", " 3", "99999999999999999999999"}) {
        setenv("DSM_TEST_PARAM_INT", bad, 1);
        assert_string_equal(error_of([] { param_TEST_PARAM_INT().value(); }).c_str(),
                            dsm::cat("environment DSM_TEST_PARAM_INT=\"", bad, "\": expected an integer from 1 to 64")
                                .c_str());
    }
    unsetenv("DSM_TEST_PARAM_INT");
    setenv("DSM_TEST_PARAM_DEVICE", "gpu0", 1);
    assert_string_equal(error_of([] { param_TEST_PARAM_DEVICE().value(); }).c_str(),
                        "environment DSM_TEST_PARAM_DEVICE=\"gpu0\": expected a device number");
    unsetenv("DSM_TEST_PARAM_DEVICE");
}

static void test_size(void **) {
    unsetenv("DSM_TEST_PARAM_SIZE");
    assert_int_equal(param_TEST_PARAM_SIZE().value(), 60 * 1024);
    const std::pair<const char *, size_t> good[] = {
        {"4096", 4096}, {"64k", 65536}, {"1M", size_t(1) << 20}, {"1024M", size_t(1) << 30}, {"1g", size_t(1) << 30}};
    for (const auto &g : good) {
        setenv("DSM_TEST_PARAM_SIZE", g.first, 1);
        assert_int_equal(param_TEST_PARAM_SIZE().value(), g.second);
    }
    for (const char *bad : {"abc", "-4096", "100", "4095", "2G", "64KB", "2048M", "1T", "99999999999999999999"}) {
        setenv("DSM_TEST_PARAM_SIZE", bad, 1);
        const std::string m = error_of([] { param_TEST_PARAM_SIZE().value(); });
        assert_non_null(std::strstr(m.c_str(), dsm::cat("DSM_TEST_PARAM_SIZE=\"", bad, "\"").c_str()));
        assert_non_null(std::strstr(m.c_str(), "a byte count from 4096 to 1073741824"));
    }
    unsetenv("DSM_TEST_PARAM_SIZE");
}

static void test_bool(void **) {
    unsetenv("DSM_TEST_PARAM_BOOL");
    assert_true(param_TEST_PARAM_BOOL().value());
    setenv("DSM_TEST_PARAM_BOOL", "0", 1);
    assert_false(param_TEST_PARAM_BOOL().value());
    setenv("DSM_TEST_PARAM_BOOL", "yes", 1);
    assert_string_equal(error_of([] { param_TEST_PARAM_BOOL().value(); }).c_str(),
                        "environment DSM_TEST_PARAM_BOOL=\"yes\": expected one of 0, 1");
    unsetenv("DSM_TEST_PARAM_BOOL");
}

// The parsed value is cached per text: a change of the environment is seen.
static void test_cache_follows_environment(void **) {
    for (int round = 0; round < 3; ++round) {
        setenv("DSM_TEST_PARAM_INT", "5", 1);
        assert_int_equal(param_TEST_PARAM_INT().value(), 5);
        assert_int_equal(param_TEST_PARAM_INT().value(), 5);
        setenv("DSM_TEST_PARAM_INT", "6", 1);
        assert_int_equal(param_TEST_PARAM_INT().value(), 6);
    }
    unsetenv("DSM_TEST_PARAM_INT");
    assert_int_equal(param_TEST_PARAM_INT().value(), 0);
}

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_registry),
        cmocka_unit_test(test_default_and_environment),
        cmocka_unit_test(test_bad_choice_names_value),
        cmocka_unit_test(test_int),
        cmocka_unit_test(test_size),
        cmocka_unit_test(test_bool),
        cmocka_unit_test(test_cache_follows_environment),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
