// The metrics files (engine/monitor.hpp): CRC-32C against its published
// check value, TensorBoard event files read back record by record (lengths,
// CRCs, the Event and Summary fields), the CSV files' names, headers and
// rows as DeepSpeed's csv_monitor writes them, and the errors.
#include <cstdio>
#include <cstring>
#include <dirent.h>
#include <fstream>
#include <sstream>
#include <string>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

#include "config/config.hpp"
#include "engine/monitor.hpp"

#include "cxx_test.h"

using dsm::engine::crc32c;
using dsm::engine::masked_crc32c;

namespace {

std::string temp_dir() {
    char t[] = "/tmp/dsm-test-monitor-XXXXXX";
    assert_non_null(mkdtemp(t));
    return t;
}

std::string slurp(const std::string &path) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
}

std::vector<std::string> list(const std::string &dir) {
    std::vector<std::string> names;
    DIR *d = opendir(dir.c_str());
    if (d == nullptr) return names;
    while (dirent *e = readdir(d))
        if (e->d_name[0] != '.') names.push_back(e->d_name);
    closedir(d);
    return names;
}

// A protocol-buffer reader of the few wire types an Event uses.
struct Reader {
    const unsigned char *p, *end;
    uint64_t varint() {
        uint64_t v = 0;
        for (int shift = 0; p < end; shift += 7) {
            const unsigned char b = *p++;
            v |= static_cast<uint64_t>(b & 0x7f) << shift;
            if (!(b & 0x80)) return v;
        }
        fail_msg("truncated varint");
        return 0;
    }
    bool more() const { return p < end; }
};

struct Scalar {
    std::string tag;
    float value = 0;
    int64_t step = -1;
    std::string file_version;
};

Scalar decode_event(const std::string &data) {
    Scalar s;
    Reader r{reinterpret_cast<const unsigned char *>(data.data()),
             reinterpret_cast<const unsigned char *>(data.data()) + data.size()};
    while (r.more()) {
        const uint64_t key = r.varint();
        const unsigned field = static_cast<unsigned>(key >> 3), type = static_cast<unsigned>(key & 7);
        if (type == 1) { // wall_time
            assert_int_equal(field, 1);
            r.p += 8;
        } else if (type == 0) { // step
            assert_int_equal(field, 2);
            s.step = static_cast<int64_t>(r.varint());
        } else if (type == 2) {
            const uint64_t n = r.varint();
            const std::string body(reinterpret_cast<const char *>(r.p), n);
            r.p += n;
            if (field == 3) {
                s.file_version = body;
            } else { // summary { value { tag, simple_value } }
                assert_int_equal(field, 5);
                Reader sr{reinterpret_cast<const unsigned char *>(body.data()),
                          reinterpret_cast<const unsigned char *>(body.data()) + body.size()};
                assert_int_equal(sr.varint(), (1 << 3) | 2);
                const uint64_t vn = sr.varint();
                Reader vr{sr.p, sr.p + vn};
                assert_int_equal(vr.varint(), (1 << 3) | 2);
                const uint64_t tn = vr.varint();
                s.tag.assign(reinterpret_cast<const char *>(vr.p), tn);
                vr.p += tn;
                assert_int_equal(vr.varint(), (2 << 3) | 5);
                std::memcpy(&s.value, vr.p, 4);
            }
        } else {
            fail_msg("unexpected wire type %u", type);
        }
    }
    return s;
}

// Every record of a TFRecord file, its two CRCs checked.
std::vector<std::string> records(const std::string &bytes) {
    std::vector<std::string> out;
    size_t at = 0;
    while (at < bytes.size()) {
        assert_true(at + 12 <= bytes.size());
        uint64_t len;
        uint32_t len_crc, data_crc;
        std::memcpy(&len, bytes.data() + at, 8);
        std::memcpy(&len_crc, bytes.data() + at + 8, 4);
        assert_int_equal(len_crc, masked_crc32c(&len, 8));
        assert_true(at + 12 + len + 4 <= bytes.size());
        const std::string data = bytes.substr(at + 12, len);
        std::memcpy(&data_crc, bytes.data() + at + 12 + len, 4);
        assert_int_equal(data_crc, masked_crc32c(data.data(), data.size()));
        out.push_back(data);
        at += 12 + len + 4;
    }
    return out;
}

} // namespace

static void test_crc32c(void **) {
    // The CRC-32C check value (RFC 3720, iSCSI): "123456789" -> 0xE3069283.
    assert_int_equal(crc32c("123456789", 9), 0xE3069283u);
    assert_int_equal(crc32c("", 0), 0u);
    // 32 zero bytes (RFC 3720 B.4): 0x8A9136AA.
    const unsigned char zeros[32] = {0};
    assert_int_equal(crc32c(zeros, sizeof zeros), 0x8A9136AAu);
    // Chained equals whole.
    assert_int_equal(crc32c("6789", 4, crc32c("12345", 5)), 0xE3069283u);
}

static void test_event_file(void **) {
    const std::string dir = temp_dir();
    std::string path;
    {
        dsm::engine::EventFile f(dir);
        path = f.path();
        f.scalar("Train/Samples/lr", 0.25f, 64, 1.0);
        f.scalar("loss", -3.5f, 1LL << 40, 2.0);
        f.flush();
    }
    assert_true(path.find(dir + "/events.out.tfevents.") == 0);
    const std::vector<std::string> recs = records(slurp(path));
    assert_int_equal(recs.size(), 3);
    assert_string_equal(decode_event(recs[0]).file_version.c_str(), "brain.Event:2");
    Scalar a = decode_event(recs[1]), b = decode_event(recs[2]);
    assert_string_equal(a.tag.c_str(), "Train/Samples/lr");
    assert_true(a.value == 0.25f && a.step == 64);
    assert_string_equal(b.tag.c_str(), "loss");
    assert_true(b.value == -3.5f && b.step == (1LL << 40));
    std::remove(path.c_str());
    rmdir(dir.c_str());
}

static void test_csv_and_dirs(void **) {
    const std::string root = temp_dir();
    dsm::config::Config cfg;
    cfg.csv_monitor.enabled = true;
    cfg.csv_monitor.output_path = root + "/deep/er";
    cfg.csv_monitor.job_name = "run";
    cfg.tensorboard.enabled = true;
    cfg.tensorboard.output_path = root + "/tb/";
    {
        dsm::engine::Monitor m(cfg, true);
        assert_true(m.enabled());
        m.write("Train/Samples/lr", 0.5, 8);
        m.write("Train/Samples/lr", 0.25, 16);
        m.write("my metric", 3, 16);
        m.flush();
        assert_true(m.where().find("csv " + root + "/deep/er/run") == 0);
    }
    // DeepSpeed's names: '/' and ' ' as '_', header "step,<last part>".
    assert_string_equal(slurp(root + "/deep/er/run/Train_Samples_lr.csv").c_str(), "step,lr\n8,0.5\n16,0.25\n");
    assert_string_equal(slurp(root + "/deep/er/run/my_metric.csv").c_str(), "step,my metric\n16,3\n");
    const std::vector<std::string> tb = list(root + "/tb/DeepSpeedJobName");
    assert_int_equal(tb.size(), 1);
    assert_int_equal(records(slurp(root + "/tb/DeepSpeedJobName/" + tb[0])).size(), 4);
    // Not the writer: nothing is created.
    cfg.csv_monitor.output_path = root + "/other";
    dsm::engine::Monitor quiet(cfg, false);
    assert_false(quiet.enabled());
    struct stat st;
    assert_int_not_equal(::stat((root + "/other").c_str(), &st), 0);
    // A directory that cannot be made: DSM_ERR_IO naming it.
    const std::string file = root + "/plain";
    std::fclose(std::fopen(file.c_str(), "w"));
    cfg.csv_monitor.output_path = file;
    expect_error_at([&] { dsm::engine::Monitor m(cfg, true); }, DSM_ERR_IO, {"monitor directory '" + file}, __LINE__);
    const std::string cmd = "rm -rf '" + root + "'";
    assert_int_equal(system(cmd.c_str()), 0);
}

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc32c),
        cmocka_unit_test(test_event_file),
        cmocka_unit_test(test_csv_and_dirs),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
