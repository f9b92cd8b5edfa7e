// Training metrics to files, as DeepSpeed's csv_monitor and tensorboard
// blocks write them: under output_path/job_name, on the engine's first rank,
// one scalar per event with the global sample count as its step.
//  - csv_monitor: one CSV file per metric, named after it with '/' and ' '
//    turned into '_' ("Train_Samples_lr.csv"), a "step,<last part of the
//    name>" header, then "step,value" rows;
//  - tensorboard: one event file (events.out.tfevents.<time>.<host>.<pid>),
//    TFRecord-framed Event protocol buffers with simple_value summaries,
//    which TensorBoard's readers open.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include "config/config.hpp"

namespace dsm {
namespace engine {

// CRC-32C (Castagnoli) of `n` bytes, and TFRecord's masked form of it.
uint32_t crc32c(const void *data, size_t n, uint32_t crc = 0) noexcept;
uint32_t masked_crc32c(const void *data, size_t n) noexcept;

// An append-only TensorBoard event file.
class EventFile {
public:
    // Creates dir/events.out.tfevents.<seconds>.<host>.<pid> and writes the
    // file_version event; DSM_ERR_IO naming the file.
    explicit EventFile(const std::string &dir);
    ~EventFile();
    EventFile(const EventFile &) = delete;
    EventFile &operator=(const EventFile &) = delete;
    void scalar(const std::string &tag, float value, int64_t step, double wall_time);
    void flush();
    const std::string &path() const noexcept { return path_; }

private:
    void record(const std::string &data);
    std::string path_;
    std::FILE *f_ = nullptr;
};

class Monitor {
public:
    // `writer`: this rank writes (the engine's first rank); the others keep
    // nothing. Creates the directories (DSM_ERR_IO naming them).
    Monitor(const config::Config &cfg, bool writer);
    ~Monitor();
    Monitor(const Monitor &) = delete;
    Monitor &operator=(const Monitor &) = delete;

    bool enabled() const noexcept { return csv_ || events_; }
    void write(const std::string &name, double value, int64_t step);
    void flush();
    // Where it writes ("" when it does not), for dsm_engine_describe().
    std::string where() const;

private:
    bool csv_ = false;
    std::string csv_dir_;
    std::map<std::string, std::FILE *> csv_files_;
    std::unique_ptr<EventFile> events_;
};

} // namespace engine
} // namespace dsm
