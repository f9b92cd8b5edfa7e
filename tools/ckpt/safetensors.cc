// dsm-ckpt: safetensors output (see safetensors.hpp).
#include "safetensors.hpp"

#include <cerrno>
#include <cstring>
#include <set>

#include <nlohmann/json.hpp>

#include "ckpt_read.hpp"

namespace dsm {
namespace ckpt_tool {

namespace {

bool host_little_endian() {
    const uint32_t one = 1;
    unsigned char c;
    std::memcpy(&c, &one, 1);
    return c == 1;
}

} // namespace

std::string safetensors_header(const std::vector<SafetensorsEntry> &entries,
                               const std::vector<std::pair<std::string, std::string>> &metadata,
                               const std::string &dtype, unsigned element_bytes) {
    // ordered_json keeps the insertion order: the header lists the tensors in
    // the order of their data, as the reference writer does.
    Json h = Json::object();
    if (!metadata.empty()) {
        Json m = Json::object();
        for (const auto &kv : metadata) m[kv.first] = kv.second;
        h["__metadata__"] = m;
    }
    std::set<std::string> seen;
    uint64_t offset = 0;
    for (const SafetensorsEntry &e : entries) {
        if (e.name == "__metadata__")
            throw Error("a tensor named \"__metadata__\" cannot be stored in safetensors (the name is reserved)");
        if (!seen.insert(e.name).second) throw Error("two tensors are named \"" + e.name + "\"");
        const uint64_t bytes = e.elements * element_bytes;
        h[e.name] = Json{{"dtype", dtype}, {"shape", e.shape}, {"data_offsets", {offset, offset + bytes}}};
        offset += bytes;
    }
    std::string text;
    try {
        text = h.dump();
    } catch (const nlohmann::json::exception &) {
        throw Error("a tensor name or metadata value is not valid UTF-8, which JSON cannot hold");
    }
    text.append((8 - text.size() % 8) % 8, ' ');
    return text;
}

SafetensorsWriter::SafetensorsWriter(const std::string &path, const std::string &shown, const std::string &header,
                                     uint64_t data_bytes)
    : shown_(shown), expected_(data_bytes) {
    f_ = std::fopen(path.c_str(), "wb");
    if (f_ == nullptr) throw Error(shown_ + ": cannot create: " + std::strerror(errno));
    unsigned char len[8];
    for (int k = 0; k < 8; ++k) len[k] = static_cast<unsigned char>(uint64_t(header.size()) >> (8 * k));
    if (std::fwrite(len, 1, 8, f_) != 8 || std::fwrite(header.data(), 1, header.size(), f_) != header.size())
        throw Error(shown_ + ": cannot write: " + std::strerror(errno));
}

SafetensorsWriter::~SafetensorsWriter() {
    if (f_ != nullptr) std::fclose(f_);
}

void SafetensorsWriter::write(const void *x, unsigned element_bytes, size_t n) {
    const uint64_t size = uint64_t(n) * element_bytes;
    if (written_ + size > expected_) throw Error(shown_ + ": more data than the header declares");
    const unsigned char *bytes = static_cast<const unsigned char *>(x);
    if (!host_little_endian()) {
        // The format is little-endian whatever the machine.
        const unsigned w = element_bytes;
        buf_.resize(size);
        for (size_t k = 0; k < n; ++k)
            for (unsigned b = 0; b < w; ++b) buf_[w * k + b] = bytes[w * k + w - 1 - b];
        bytes = buf_.data();
    }
    if (std::fwrite(bytes, element_bytes, n, f_) != n) throw Error(shown_ + ": cannot write: " + std::strerror(errno));
    written_ += size;
}

void SafetensorsWriter::finish() {
    if (written_ != expected_)
        throw Error(shown_ + ": " + std::to_string(written_) + " data bytes written, the header declares " +
                    std::to_string(expected_));
    FILE *f = f_;
    f_ = nullptr;
    const bool flushed = std::fflush(f) == 0;
    if (std::fclose(f) != 0 || !flushed) throw Error(shown_ + ": cannot write: " + std::strerror(errno));
}

} // namespace ckpt_tool
} // namespace dsm
