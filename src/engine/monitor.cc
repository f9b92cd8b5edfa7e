// csv_monitor and tensorboard files (monitor.hpp).
#include "dsm_config.h"

#include "engine/monitor.hpp"

#include <cerrno>
#include <cstring>
#include <ctime>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "core/error.hpp"

namespace dsm {
namespace engine {

namespace {

// mkdir -p; DSM_ERR_IO naming the directory that could not be made.
void make_dirs(const std::string &path) {
    std::string cur;
    size_t i = 0;
    while (i <= path.size()) {
        const size_t j = path.find('/', i);
        cur = path.substr(0, j == std::string::npos ? path.size() : j);
        if (!cur.empty() && ::mkdir(cur.c_str(), 0777) != 0 && errno != EEXIST)
            DSM_FAIL(DSM_ERR_IO, "cannot create the monitor directory '", cur, "': ", std::strerror(errno));
        if (j == std::string::npos) break;
        i = j + 1;
    }
    struct stat st;
    DSM_REQUIRE(::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode), DSM_ERR_IO, "the monitor directory '", path,
                "' is not a directory");
}

std::string join(const std::string &output_path, const std::string &job) {
    return output_path.empty() ? job : output_path + (output_path.back() == '/' ? "" : "/") + job;
}

double wall_time() {
    struct timeval tv;
    gettimeofday(&tv, nullptr);
    return static_cast<double>(tv.tv_sec) + 1e-6 * static_cast<double>(tv.tv_usec);
}

// Protocol buffer encoding, the few wire types an Event needs.
void varint(std::string &out, uint64_t v) {
    while (v >= 0x80) {
        out.push_back(static_cast<char>((v & 0x7f) | 0x80));
        v >>= 7;
    }
    out.push_back(static_cast<char>(v));
}
void fixed(std::string &out, const void *p, size_t n) { out.append(static_cast<const char *>(p), n); }
void bytes_field(std::string &out, unsigned field, const std::string &v) {
    varint(out, (field << 3) | 2);
    varint(out, v.size());
    out += v;
}

} // namespace

uint32_t crc32c(const void *data, size_t n, uint32_t crc) noexcept {
    static uint32_t table[256];
    static bool ready = [] {
        for (uint32_t i = 0; i < 256; ++i) {
            uint32_t c = i;
            for (int k = 0; k < 8; ++k) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
            table[i] = c;
        }
        return true;
    }();
    (void)ready;
    const unsigned char *p = static_cast<const unsigned char *>(data);
    crc = ~crc;
    for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
    return ~crc;
}

uint32_t masked_crc32c(const void *data, size_t n) noexcept {
    const uint32_t c = crc32c(data, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

EventFile::EventFile(const std::string &dir) {
    char host[256] = {0};
    ::gethostname(host, sizeof host - 1);
    path_ = dir + "/events.out.tfevents." + std::to_string(static_cast<long long>(std::time(nullptr))) + "." + host +
            "." + std::to_string(static_cast<long long>(::getpid()));
    f_ = std::fopen(path_.c_str(), "ab");
    DSM_REQUIRE(f_ != nullptr, DSM_ERR_IO, "cannot create the TensorBoard event file '", path_, "': ",
                std::strerror(errno));
    // Event{wall_time = 1, file_version = 3}.
    std::string e;
    const double t = wall_time();
    varint(e, (1 << 3) | 1);
    fixed(e, &t, sizeof t);
    bytes_field(e, 3, "brain.Event:2");
    record(e);
    flush();
}

EventFile::~EventFile() {
    if (f_ != nullptr) std::fclose(f_);
}

void EventFile::record(const std::string &data) {
    // TFRecord: length, its masked CRC, the data, its masked CRC (little endian).
    const uint64_t len = data.size();
    const uint32_t len_crc = masked_crc32c(&len, sizeof len), data_crc = masked_crc32c(data.data(), data.size());
    std::fwrite(&len, sizeof len, 1, f_);
    std::fwrite(&len_crc, sizeof len_crc, 1, f_);
    std::fwrite(data.data(), 1, data.size(), f_);
    std::fwrite(&data_crc, sizeof data_crc, 1, f_);
}

void EventFile::scalar(const std::string &tag, float value, int64_t step, double wall) {
    // Summary.Value{tag = 1, simple_value = 2}; Summary{value = 1};
    // Event{wall_time = 1, step = 2, summary = 5}.
    std::string v, s, e;
    bytes_field(v, 1, tag);
    varint(v, (2 << 3) | 5);
    fixed(v, &value, sizeof value);
    bytes_field(s, 1, v);
    varint(e, (1 << 3) | 1);
    fixed(e, &wall, sizeof wall);
    varint(e, 2 << 3);
    varint(e, static_cast<uint64_t>(step));
    bytes_field(e, 5, s);
    record(e);
}

void EventFile::flush() {
    if (std::fflush(f_) != 0)
        DSM_FAIL(DSM_ERR_IO, "writing the TensorBoard event file '", path_, "': ", std::strerror(errno));
}

Monitor::Monitor(const config::Config &cfg, bool writer) {
    if (!writer) return;
    if (cfg.csv_monitor.enabled) {
        csv_dir_ = join(cfg.csv_monitor.output_path, cfg.csv_monitor.job_name);
        make_dirs(csv_dir_);
        csv_ = true;
    }
    if (cfg.tensorboard.enabled) {
        const std::string dir = join(cfg.tensorboard.output_path, cfg.tensorboard.job_name);
        make_dirs(dir);
        events_ = std::make_unique<EventFile>(dir);
    }
}

Monitor::~Monitor() {
    for (auto &kv : csv_files_) std::fclose(kv.second);
}

void Monitor::write(const std::string &name, double value, int64_t step) {
    if (csv_) {
        auto it = csv_files_.find(name);
        if (it == csv_files_.end()) {
            std::string file = name;
            for (char &c : file)
                if (c == '/' || c == ' ') c = '_';
            const std::string path = csv_dir_ + "/" + file + ".csv";
            std::FILE *f = std::fopen(path.c_str(), "a");
            DSM_REQUIRE(f != nullptr, DSM_ERR_IO, "cannot open the csv_monitor file '", path, "': ",
                        std::strerror(errno));
            const size_t slash = name.rfind('/');
            std::fprintf(f, "step,%s\n", slash == std::string::npos ? name.c_str() : name.c_str() + slash + 1);
            it = csv_files_.emplace(name, f).first;
        }
        std::fprintf(it->second, "%lld,%.17g\n", static_cast<long long>(step), value);
    }
    if (events_) events_->scalar(name, static_cast<float>(value), step, wall_time());
}

void Monitor::flush() {
    for (auto &kv : csv_files_) std::fflush(kv.second);
    if (events_) events_->flush();
}

std::string Monitor::where() const {
    std::string w;
    if (csv_) w = "csv " + csv_dir_;
    if (events_) w += (w.empty() ? "" : ", ") + std::string("tensorboard ") + events_->path();
    return w;
}

} // namespace engine
} // namespace dsm
