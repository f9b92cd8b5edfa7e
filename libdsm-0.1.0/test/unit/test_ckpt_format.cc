// The checkpoint format's shared definitions (src/ckpt/format.hpp): the
// checksum pinned to values computed from doc/checkpoint.md's formula by an
// independent implementation (Python), for every code path (scalar tail,
// vector clones, OpenMP blocks, offsets, pieces in any order); tag rules and
// link-name escaping.
#include "ckpt/format.hpp"

#include <vector>

#include "cxx_test.h"

using namespace dsm::ckpt;

static std::vector<float> ramp(size_t n) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i % 97) * 0.5f - 20.0f;
    return v;
}

static void test_checksum_pinned(void **) {
    const float small[] = {1.0f, -2.5f, 0.0f, 3.25f};
    assert_true(checksum(small, 0, 4) == 0xd7ce45eb737743d1ull);
    assert_true(checksum(small, 1000, 4) == 0xc65213d5fd0408b7ull);
    assert_true(checksum(small, 0, 0) == 0);
    const std::vector<float> big = ramp(200003); // several OpenMP blocks and a ragged tail
    assert_true(checksum(big.data(), 0, big.size()) == 0xa59e416f96916715ull);
    const unsigned char client[] = {'c', 'l', 'i', 'e', 'n', 't'};
    assert_true(checksum_bytes(client, 0, sizeof client) == 0x402dc6a9aadda183ull);
}

// The sum of the pieces' checksums is the whole one, for any cut.
static void test_checksum_pieces(void **) {
    const std::vector<float> v = ramp(200003);
    const uint64_t whole = checksum(v.data(), 0, v.size());
    for (size_t cut : {size_t(1), size_t(7), size_t(65536), size_t(65537), size_t(131075), v.size() - 1}) {
        const uint64_t a = checksum(v.data(), 0, cut), b = checksum(v.data() + cut, cut, v.size() - cut);
        assert_true(a + b == whole);
        assert_true(b + a == whole);
    }
    const unsigned char bytes[] = {1, 2, 3, 250, 251};
    assert_true(checksum_bytes(bytes, 0, 2) + checksum_bytes(bytes + 2, 2, 3) == checksum_bytes(bytes, 0, 5));
    // One flipped bit anywhere changes it.
    std::vector<float> w = v;
    reinterpret_cast<unsigned char *>(w.data())[4 * 150001 + 2] ^= 0x10;
    assert_true(checksum(w.data(), 0, w.size()) != whole);
}

static void test_tags_and_names(void **) {
    assert_true(valid_tag("global_step10"));
    assert_true(valid_tag("a.b-c_D9"));
    assert_true(valid_tag(std::string(kMaxTag, 'x')));
    assert_false(valid_tag(""));
    assert_false(valid_tag(std::string(kMaxTag + 1, 'x')));
    assert_false(valid_tag(".hidden"));
    assert_false(valid_tag(".."));
    assert_false(valid_tag("a/b"));
    assert_false(valid_tag("../x"));
    assert_false(valid_tag("sp ace"));
    assert_false(valid_tag("t\xc3\xa9"));
    assert_string_equal(escape_name("layer.0/w").c_str(), "layer.0%2Fw");
    assert_string_equal(escape_name(".x%y").c_str(), "%2Ex%25y");
    assert_string_equal(escape_name("plain").c_str(), "plain");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_checksum_pinned),
        cmocka_unit_test(test_checksum_pieces),
        cmocka_unit_test(test_tags_and_names),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
