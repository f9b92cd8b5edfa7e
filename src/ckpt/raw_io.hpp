// The data of a checkpoint's tensors moved with plain POSIX I/O at the
// offsets HDF5 gave their datasets (doc/performance.md, "Checkpoint save and
// load").
//
// A checkpoint's datasets are contiguous and allocated when they are
// created (write.cc): each one's elements lie in one range of the file, in
// row-major order, as little-endian fp32. HDF5 writes the metadata (the
// collective part); each rank then writes its own pieces with pwrite()
// through a descriptor of its own, as a plain program writing the same
// bytes would: no MPI-IO layer in between, and the writeback of each piece
// started as soon as it is written (sync_file_range), so that the disk
// works while the next piece is copied. A load maps the file (FileMap),
// checksums each piece where the page cache holds it, and copies it into
// the caller's memory only once every rank verified every checksum: one
// copy, and nothing changed by a load that fails. A dataset stored
// otherwise (a file rewritten by another program: chunked, filtered) is
// read through HDF5. Internal to src/ckpt.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

namespace dsm {
namespace ckpt {

// Whether this build may move fp32 values between memory and a file's
// little-endian fp32 bytes without conversion.
constexpr bool kRawFloatIo =
#if defined(__BYTE_ORDER__) && defined(__ORDER_LITTLE_ENDIAN__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    true;
#else
    false;
#endif

// A descriptor of one file, closed at the end; fd() < 0 when the open
// failed (error() says why).
class RawFile {
public:
    RawFile() = default;
    // Opened for writing (an existing file).
    explicit RawFile(const std::string &path);
    ~RawFile() { close(); }
    RawFile(const RawFile &) = delete;
    RawFile &operator=(const RawFile &) = delete;
    RawFile(RawFile &&o) noexcept : fd_(o.fd_), error_(std::move(o.error_)) { o.fd_ = -1; }
    RawFile &operator=(RawFile &&o) noexcept {
        if (this != &o) {
            close();
            fd_ = o.fd_;
            error_ = std::move(o.error_);
            o.fd_ = -1;
        }
        return *this;
    }
    int fd() const noexcept { return fd_; }
    const std::string &error() const noexcept { return error_; }
    // `bytes` of `src` at file offset `at`, whole, in pieces of at most
    // kPiece bytes whose writeback starts as soon as each is written.
    // Returns "" or the reason (strerror).
    std::string write(const void *src, size_t bytes, uint64_t at);
    // `count` floats as little-endian fp32 at `at` (converted in pieces on
    // a big-endian machine). "" or the reason.
    std::string write_floats(const float *src, size_t count, uint64_t at);
    // fdatasync: "" or the reason.
    std::string sync();
    void close() noexcept;

    static constexpr size_t kPiece = size_t(16) << 20;

private:
    int fd_ = -1;
    std::string error_;
};

// A file mapped read-only, whole; unmapped at the end. data() is null when
// the file could not be mapped (error() says why).
class FileMap {
public:
    explicit FileMap(const std::string &path);
    ~FileMap();
    FileMap(const FileMap &) = delete;
    FileMap &operator=(const FileMap &) = delete;
    const char *data() const noexcept { return data_; }
    uint64_t size() const noexcept { return size_; }
    const std::string &error() const noexcept { return error_; }
    // Asks the kernel to read [at, at + bytes) ahead (best-effort).
    void will_need(uint64_t at, uint64_t bytes) const noexcept;

private:
    char *data_ = nullptr;
    uint64_t size_ = 0;
    std::string error_;
};

// dst[i] = src[i] for `count` floats, with every thread in blocks.
void copy_floats(float *dst, const float *src, size_t count);

} // namespace ckpt
} // namespace dsm
