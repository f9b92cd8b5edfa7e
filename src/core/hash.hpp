// FNV-1a, 64 bits: the one hash libdsm uses to compare things across ranks
// (a configuration, a list of tags or tensors, a bucket's parameters).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace dsm {

constexpr uint64_t kFnv1aOffset = 1469598103934665603ull;

// The hash of `n` bytes, continuing from `h` (the offset basis to start).
inline uint64_t fnv1a(const void *data, size_t n, uint64_t h = kFnv1aOffset) noexcept {
    const unsigned char *c = static_cast<const unsigned char *>(data);
    for (size_t i = 0; i < n; ++i) h = (h ^ c[i]) * 1099511628211ull;
    return h;
}

inline uint64_t fnv1a(const std::string &s, uint64_t h = kFnv1aOffset) noexcept { return fnv1a(s.data(), s.size(), h); }

} // namespace dsm
