// dsm-ckpt: writing safetensors files (https://github.com/huggingface/safetensors):
//
//   8 bytes    N, the header length, little-endian uint64
//   N bytes    a JSON object {"__metadata__": {string: string, ...},
//              "<name>": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...}
//              (dsm-ckpt writes one dtype for every tensor: "F32", "BF16" or "F16")
//              padded with spaces to a multiple of 8 (so that the data is aligned)
//   the rest   each tensor's little-endian bytes, in header order, back to back;
//              data_offsets are relative to the first byte after the header
//
// The reference reader requires the data ranges to tile the buffer exactly
// (sorted by offset, no gap, the last one ending at the end of the file); the
// writer lays them out in header order, so they do.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace dsm {
namespace ckpt_tool {

struct SafetensorsEntry {
    std::string name;
    std::vector<uint64_t> shape; // empty: a scalar
    uint64_t elements = 0;
};

// The padded header text (without the 8-byte length) for tensors of `dtype`
// ("F32", "BF16", "F16"), `element_bytes` each. Throws Error for a name the
// format cannot hold: "__metadata__", a duplicate, invalid UTF-8.
std::string safetensors_header(const std::vector<SafetensorsEntry> &entries,
                               const std::vector<std::pair<std::string, std::string>> &metadata,
                               const std::string &dtype = "F32", unsigned element_bytes = 4);

// Streams one safetensors file: the header (from safetensors_header) is
// written at construction, since every name and shape is known before any
// data, then the data of each entry in header order, in pieces of any size.
// Throws Error on I/O failure, naming the file `shown` (the file is created
// at `path`, a temporary name).
class SafetensorsWriter {
public:
    SafetensorsWriter(const std::string &path, const std::string &shown, const std::string &header,
                      uint64_t data_bytes);
    SafetensorsWriter(const SafetensorsWriter &) = delete;
    SafetensorsWriter &operator=(const SafetensorsWriter &) = delete;
    ~SafetensorsWriter();

    // n elements of `element_bytes` (4: float, 2: uint16_t bit patterns) in
    // native byte order; written little-endian.
    void write(const void *x, unsigned element_bytes, size_t n);
    // Checks that every declared byte was written, flushes and closes.
    void finish();

private:
    std::string shown_;
    FILE *f_ = nullptr;
    uint64_t expected_ = 0, written_ = 0;
    std::vector<unsigned char> buf_;
};

} // namespace ckpt_tool
} // namespace dsm
