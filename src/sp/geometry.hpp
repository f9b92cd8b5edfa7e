// The geometry of the Ulysses copies, defined once: which bytes of a tensor
// go to which block of the all-to-all. Each copy is one strided copy
// (`height` rows of `width` bytes, the tensor's rows `tensor_pitch` apart
// from `tensor_offset`, the block's `block_pitch` apart), which the host runs
// with memcpy (copy_host) and a device as one 2-D copy on its stream
// (cudaMemcpy2DAsync: cuda::copy_2d). The pack goes tensor -> block, the
// unpack block -> tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/error.hpp"

namespace dsm {
namespace sp {

// Heads [first, first + count) of a rank (head_range(), dsm_sp_head_range()).
struct HeadRange {
    int64_t first = 0, count = 0;
};

// A tensor's sizes: element bytes, head_dim, batch, seq, seq / P, heads.
struct Geometry {
    size_t es = 0, d = 0, b = 0, s = 0, chunk = 0, H = 0;
    bool seq_first = false;
};

struct Strided {
    size_t tensor_offset = 0, tensor_pitch = 0, block_pitch = 0, width = 0, height = 0;
};

// Between a sequence-sharded tensor ([b, chunk, H, d] or [chunk, b, H, d]:
// rows of H*d elements) and a block holding heads h of every row.
inline Strided heads_copy(const Geometry &g, const HeadRange &h) {
    DSM_REQUIRE(h.first >= 0 && h.count >= 0 && static_cast<size_t>(h.first + h.count) <= g.H,
                DSM_ERR_INVALID_ARGUMENT, "copy_heads: heads [", h.first, ", ", h.first + h.count, ") outside the ",
                g.H, " heads");
    Strided c;
    c.width = static_cast<size_t>(h.count) * g.d * g.es;
    c.height = c.width == 0 ? 0 : g.b * g.chunk;
    c.tensor_offset = static_cast<size_t>(h.first) * g.d * g.es;
    c.tensor_pitch = g.H * g.d * g.es;
    c.block_pitch = c.width;
    return c;
}

// Between a head-sharded tensor ([b, s, c, d] or [s, b, c, d], c = h.count)
// and a block holding the tokens of chunk j.
inline Strided tokens_copy(const Geometry &g, size_t j, const HeadRange &h) {
    DSM_REQUIRE(h.count >= 0, DSM_ERR_INVALID_ARGUMENT, "copy_tokens: ", h.count, " heads");
    const size_t token = static_cast<size_t>(h.count) * g.d * g.es;
    const size_t piece = g.chunk * token; // one batch row's tokens
    Strided c;
    if (piece == 0 || g.b == 0) return c;
    DSM_REQUIRE((j + 1) * g.chunk <= g.s, DSM_ERR_INVALID_ARGUMENT, "copy_tokens: chunk ", j, " of ", g.chunk,
                " tokens lies outside the sequence of ", g.s);
    if (g.seq_first) { // the chunk's tokens are contiguous for the whole batch
        c.tensor_offset = j * g.b * piece;
        c.width = c.tensor_pitch = c.block_pitch = g.b * piece;
        c.height = 1;
    } else {
        c.tensor_offset = j * piece;
        c.tensor_pitch = g.s * token;
        c.block_pitch = c.width = piece;
        c.height = g.b;
    }
    return c;
}

// The copy on the host.
template <bool kToBlock> void copy_host(const Strided &c, unsigned char *tensor, unsigned char *block) {
    if (c.width == 0 || c.height == 0) return;
    unsigned char *t = tensor + c.tensor_offset;
    if (c.height == 1 || (c.tensor_pitch == c.width && c.block_pitch == c.width)) {
        if (kToBlock) std::memcpy(block, t, c.width * c.height);
        else std::memcpy(t, block, c.width * c.height);
        return;
    }
    for (size_t r = 0; r < c.height; ++r) {
        if (kToBlock) std::memcpy(block + r * c.block_pitch, t + r * c.tensor_pitch, c.width);
        else std::memcpy(t + r * c.tensor_pitch, block + r * c.block_pitch, c.width);
    }
}

} // namespace sp
} // namespace dsm
