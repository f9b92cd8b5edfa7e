// See raw_io.hpp.
#include "dsm_config.h"

#include "ckpt/raw_io.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

namespace dsm {
namespace ckpt {

RawFile::RawFile(const std::string &path) {
    fd_ = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd_ < 0) error_ = std::strerror(errno);
}

void RawFile::close() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
}

std::string RawFile::write(const void *src, size_t bytes, uint64_t at) {
    const char *p = static_cast<const char *>(src);
    while (bytes > 0) {
        const size_t piece = std::min(bytes, kPiece);
        size_t left = piece;
        uint64_t where = at;
        while (left > 0) {
            const ssize_t w = ::pwrite(fd_, p, left, static_cast<off_t>(where));
            if (w < 0 && errno == EINTR) continue;
            if (w < 0) return std::strerror(errno);
            if (w == 0) return "no progress (pwrite wrote 0 bytes)";
            p += w;
            left -= static_cast<size_t>(w);
            where += static_cast<uint64_t>(w);
        }
#ifdef SYNC_FILE_RANGE_WRITE
        // Start the piece's writeback now (asynchronous): the disk writes it
        // while the next piece is copied, and the final sync waits for less.
        (void)::sync_file_range(fd_, static_cast<off_t>(at), static_cast<off_t>(piece), SYNC_FILE_RANGE_WRITE);
#endif
        at += piece;
        bytes -= piece;
    }
    return "";
}

std::string RawFile::write_floats(const float *src, size_t count, uint64_t at) {
    if (kRawFloatIo) return write(src, count * sizeof(float), at);
    std::vector<uint32_t> le(std::min(count, kPiece / sizeof(float)));
    while (count > 0) {
        const size_t k = std::min(count, le.size());
        std::memcpy(le.data(), src, k * sizeof(float));
        for (uint32_t &w : le) w = __builtin_bswap32(w);
        const std::string why = write(le.data(), k * sizeof(float), at);
        if (!why.empty()) return why;
        src += k;
        count -= k;
        at += k * sizeof(float);
    }
    return "";
}

std::string RawFile::sync() {
    if (::fdatasync(fd_) != 0) return std::strerror(errno);
    return "";
}

FileMap::FileMap(const std::string &path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        error_ = std::strerror(errno);
        return;
    }
    struct stat st;
    if (::fstat(fd, &st) != 0) {
        error_ = std::strerror(errno);
    } else if (st.st_size > 0) {
        void *p = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            error_ = std::strerror(errno);
        } else {
            data_ = static_cast<char *>(p);
            size_ = static_cast<uint64_t>(st.st_size);
            (void)::madvise(p, size_, MADV_SEQUENTIAL);
        }
    } else {
        error_ = "the file is empty";
    }
    ::close(fd); // the mapping stays
}

FileMap::~FileMap() {
    if (data_ != nullptr) ::munmap(data_, size_);
}

void FileMap::will_need(uint64_t at, uint64_t bytes) const noexcept {
    if (data_ == nullptr || at >= size_) return;
    const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    const uint64_t a = at / page * page, b = std::min(size_, at + bytes);
    (void)::madvise(data_ + a, b - a, MADV_WILLNEED);
}

void copy_floats(float *dst, const float *src, size_t count) {
    constexpr size_t kBlock = size_t(1) << 18; // floats per thread's block
    const long blocks = static_cast<long>((count + kBlock - 1) / kBlock);
#pragma omp parallel for schedule(static) if (blocks > 1)
    for (long b = 0; b < blocks; ++b) {
        const size_t at = static_cast<size_t>(b) * kBlock;
        std::memcpy(dst + at, src + at, std::min(kBlock, count - at) * sizeof(float));
    }
}

} // namespace ckpt
} // namespace dsm
