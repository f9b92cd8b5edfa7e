// The definitions of the checkpoint format (doc/checkpoint.md) that both the
// library's parallel writer and reader (write.cc, read.cc) and the serial tool
// dsm-ckpt use: format name and version, tag rules, link names, checksums.
// No MPI, no HDF5 (nlohmann::json only): the tool links this without the library.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dsm {
namespace ckpt {

constexpr const char *kFormat = "dsm-checkpoint"; // root attribute `format`
constexpr int64_t kFormatVersion = 2;             // root attribute `format_version` (1 still read)
constexpr size_t kMaxTag = 200;                   // longest tag

// A tag as doc/checkpoint.md allows it: 1 to kMaxTag of [A-Za-z0-9._-], no
// leading '.' (so no tag names a hidden file or leaves the directory).
bool valid_tag(const std::string &tag) noexcept;

// "%" -> "%25", "/" -> "%2F", a leading "." -> "%2E": one HDF5 link name.
std::string escape_name(const std::string &name);

// Whether `path` holds the HDF5 signature where HDF5 looks for it (byte 0,
// 512, 1024, 2048, ...: after a user block, such as a checkpoint's
// integrity record). False for a file that cannot be read.
bool hdf5_signature(const std::string &path);

// A shape for messages: "[4, 3]" ("[]" for a scalar).
std::string shape_text(const std::vector<int64_t> &shape);

// splitmix64 as doc/checkpoint.md writes it.
constexpr uint64_t splitmix64(uint64_t z) noexcept {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// The checksum terms of elements [offset, offset + count) of a tensor:
// sum of splitmix64(i * 0x9E3779B97F4A7C15 + bits(x_i)) mod 2^64. A sum, so
// pieces add up to the whole in any order, on any rank. Vectorized (the
// instruction set simd::isa() picks: checksum.hpp) and threaded with OpenMP
// for large pieces; the value never depends on either.
uint64_t checksum(const float *data, size_t offset, size_t count) noexcept;

// The same over bytes (b_i: the byte's value), from byte `offset` on.
uint64_t checksum_bytes(const unsigned char *data, size_t offset, size_t size) noexcept;

// The checksum format version 2 keeps in the root attribute
// `attrs_checksum`: checksum_bytes over the compact JSON text (dump()) of the
// root attributes other than `attrs_checksum` itself, keys in byte order.
uint64_t root_attributes_checksum(const nlohmann::json &attrs);

// ---------------------------------------------------------------- integrity record
//
// A checkpoint of format version 2 starts with an HDF5 user block (which
// HDF5 skips) holding a record of the file as libdsm wrote it: its size, the
// extents of its datasets' data, and a checksum of every other byte, which
// is HDF5's metadata. Checking it before HDF5 reads the file means HDF5
// never parses metadata that libdsm did not write, so a corrupt file is an
// error, never a crash inside HDF5. Layout (little-endian, doc/checkpoint.md):
//   "DSMCKPT1" | u64 user block size | u64 file size | u64 extent count N |
//   N x (u64 offset, u64 length) | u64 metadata checksum | u64 record checksum
struct Extent {
    uint64_t offset = 0, length = 0;
};

// The user block that holds the record of `datasets` extents: a power of
// two of at least `block` and 4096 bytes.
uint64_t userblock_size(size_t datasets, uint64_t block) noexcept;

// Write the record into the user block of the closed file `path`
// (user block of `ub` bytes). Returns "" or why it failed.
std::string write_integrity(const std::string &path, uint64_t ub, const std::vector<Extent> &extents);

// Check the record of `path`: Absent when the file has none (format version
// 1, or a file rewritten by another program), Verified when the file is as
// libdsm wrote it; Corrupt otherwise, with the reason in `why`.
enum class Integrity { Absent, Verified, Corrupt };
Integrity check_integrity(const std::string &path, std::string &why);

} // namespace ckpt
} // namespace dsm
