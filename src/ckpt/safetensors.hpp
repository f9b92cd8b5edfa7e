// Reading model weights from a safetensors file (the format of
// https://github.com/huggingface/safetensors; doc/checkpoint.md):
//
//   8 bytes    N, the header length, little-endian uint64
//   N bytes    a JSON object {"__metadata__": {string: string, ...},
//              "<name>": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...}
//   the rest   the tensors' little-endian bytes; data_offsets are relative
//              to the first byte after the header
//
// Every part is validated before any data is read: the header length
// against the file, the JSON, each entry's dtype, shape and offsets (within
// the file, exactly the bytes the shape needs). F32, BF16 and F16 tensors
// load (converted to fp32); the format's other dtypes are named in the error
// when a parameter has one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <mpi.h>

#include "ckpt/checkpoint.hpp"

namespace dsm {
namespace ckpt {

// One tensor of a safetensors header.
struct SafetensorsEntry {
    std::string name;
    std::string dtype;          // as the file writes it ("F32", "BF16", ...)
    unsigned element_bytes = 0; // 0 for a dtype libdsm cannot load
    std::vector<int64_t> shape; // empty: a scalar
    uint64_t begin = 0, end = 0; // absolute byte offsets in the file
};

// The largest header libdsm reads (the reference reader's bound).
constexpr uint64_t kSafetensorsMaxHeader = 100000000;

// Parses and validates the header text of `path` (file_size bytes in all;
// the data starts at 8 + header.size()). Throws DSM_ERR_IO naming the file
// and the entry, the field and the value at fault.
std::vector<SafetensorsEntry> parse_safetensors_header(const std::string &path, const std::string &header,
                                                       uint64_t file_size);

// Collective over `comm`: reads the /params tensors of `content` (by name,
// every rank its piece, converted to fp32) from the safetensors file `path`.
// Tensors of other groups are not looked for. Strictness as ckpt::load:
// strict fails with DSM_ERR_MISMATCH on any tensor missing, unexpected or
// of another shape, naming it (and both shapes); non-strict marks those
// `skip` and lists them in content.missing/unexpected/mismatched. A
// parameter stored in a dtype other than F32, BF16 and F16 is
// DSM_ERR_NOT_SUPPORTED naming it and the dtype. Every rank throws the same
// error; nothing outside `content` is changed.
void load_safetensors(MPI_Comm comm, const std::string &path, Content &content);

} // namespace ckpt
} // namespace dsm
