// ZeRO-3's gathers that do not run as plain allgathers (zero/stage_partitioned.hpp):
// hpZ's secondary partitions (kept after each forward gather, read by the
// backward's single-copy gather) and qwZ's int8 gathers, on the host and on
// a device space.
#include "zero/stage_partitioned.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <tuple>

#include "comm/qgz_device.hpp"
#include "comm/quantize.hpp"
#include "comm/quantize_space.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/hash.hpp"
#include "core/watchdog.hpp"
#include "mpi.h"
#include "zero/plan.hpp"
#include "zero/stage.hpp"

namespace dsm {
namespace zero {

// hpZ: copy this rank's piece of parameter `j`'s secondary partition out of
// its gathered values.
void Partitioned::keep_secondary(int j, const char *whole) {
    const zero::Slot *s = layout_->slot_of(j);
    const int g = hpz_->rank();
    for (const Piece &pc : secondary_layout_.param_pieces(j))
        if (pc.part == g)
            space_->copy(static_cast<char *>(secondary_.data()) + (pc.flat_offset - secondary_begin_) * esize_,
                         whole + (pc.flat_offset - s->offset) * esize_, pc.count * esize_);
}

// hpZ: each member of the group exposes its secondary slice and copies the
// listed parameters' pieces straight out of its peers' slices into place
// (one copy of each byte; an allgatherv copies this member's piece into the
// backend's window and then every piece out of it).
bool Partitioned::gather_direct(const std::vector<int> &list, const Source &src, const std::vector<char *> &dst) {
    const std::vector<comm::Backend::Exposed> exposed{{secondary_.data(), secondary_.bytes()}};
    auto begin_of = [&](int part) { return std::max(secondary_layout_.part_begin(part), persist_end_); };
    const watchdog::Context ctx("ZeRO-3 parameter gather (hpZ)", "first parameter", list.empty() ? -1 : list.front());
    return src.group->alltoall_direct(
        exposed,
        [&](int peer, std::vector<comm::Backend::Piece> &pieces) {
            for (size_t k = 0; k < list.size(); ++k) {
                const size_t base = layout_->slot_of(list[k])->offset;
                for (const Piece &pc : src.layout->param_pieces(list[k]))
                    if (pc.part == peer && pc.count)
                        pieces.push_back(comm::Backend::Piece{0, (pc.flat_offset - begin_of(peer)) * esize_,
                                                              dst[k] + (pc.flat_offset - base) * esize_,
                                                              pc.count * esize_});
            }
        },
        queue());
}

// qwZ's dequantization works through a gathered piece in parts of about
// this many bytes, so that what is done with a part next (hpZ's copy into
// the secondary partition) reads it from the cache.
constexpr size_t kHotBytes = size_t(128) << 10;

// qwZ's gather as the host and a space run it alike: its plan of pieces
// and the bytes of each part.
struct Partitioned::QwzGather {
    size_t block;
    int bits;
    GatherPlan plan;
    std::vector<size_t> bytes, full; // per part: its pieces quantized, and at full precision
    size_t total = 0;                // sum of bytes
    size_t packed(size_t count) const { return comm::quant::packed_bytes(count, bits, block); }
};

Partitioned::QwzGather Partitioned::plan_quantized(const std::vector<int> &list, const Source &src) const {
    QwzGather g{s_.qwz_block, comm::quant::kWeightBits, plan_gather(*src.layout, list), {}, {}, 0};
    const size_t n = static_cast<size_t>(src.group->size());
    g.bytes.assign(n, 0);
    g.full.assign(n, 0);
    for (const auto &jp : g.plan.pieces) {
        g.bytes[static_cast<size_t>(jp.second.part)] += g.packed(jp.second.count);
        g.full[static_cast<size_t>(jp.second.part)] += jp.second.count * esize_;
    }
    for (size_t b : g.bytes) g.total += b;
    return g;
}

// This rank's pieces, in the plan's order, each quantized on its own into `w`.
template <class Quantize>
void Partitioned::pack_quantized(const QwzGather &g, const Source &src, char *w, Quantize quantize) const {
    for (const auto &jp : g.plan.pieces)
        if (jp.second.part == src.part) {
            quantize(src.base + (jp.second.flat_offset - src.begin) * esize_, jp.second.count, w);
            w += g.packed(jp.second.count);
        }
}

// This rank's block goes to every other rank of the group.
void Partitioned::count_quantized(const QwzGather &g, const Source &src) {
    const int n = src.group->size(), me = src.group->rank();
    const size_t mine = g.bytes[static_cast<size_t>(src.part)], mine_full = g.full[static_cast<size_t>(src.part)];
    for (int p = 0; p < n; ++p) {
        if (p == me) continue;
        const bool on = nodes_.size() == static_cast<size_t>(n) && nodes_[static_cast<size_t>(p)] == nodes_[static_cast<size_t>(me)];
        (on ? qwz_bytes_.sent_on : qwz_bytes_.sent_off) += mine;
        (on ? qwz_bytes_.full_on : qwz_bytes_.full_off) += mine_full;
    }
}

// qwZ: the allgatherv of gather_from() with each piece quantized into its
// owner's block of bytes in place of the pack's copy, and dequantized into
// its parameter in place of the unpack's copy. Each piece is quantized on
// its own (its blocks start with it), so a rank packs its pieces without
// reading another's and each piece dequantizes where it lands.
void Partitioned::gather_quantized(const std::vector<int> &list, const Source &src, const std::vector<char *> &dst) {
    if (qkernels_) return gather_quantized_space(list, src, dst);
    namespace q = comm::quant;
    const QwzGather g = plan_quantized(list, src);
    const size_t block = g.block;
    const int bits = g.bits;
    // From the pool: buffers of the same sizes every step, not fresh pages
    // to fault in.
    Buffer send = pool_.take(g.bytes[static_cast<size_t>(src.part)] + 64, false);
    Buffer recv = pool_.take(g.total + 64, false);
    pack_quantized(g, src, static_cast<char *>(send.data()), [&](const char *from, size_t count, char *to) {
        q::quantize(from, s_.dtype, count, bits, block, to);
    });
    src.group->allgatherv(send.data(), recv.data(), g.bytes, DSM_UINT8, queue());
    // hpZ: this rank's slices of the secondary partition, as [begin, end) in
    // each parameter and where they go, copied out of each part of the
    // parameter right after it is dequantized, while it is in the cache
    // (keep_secondary() reads it back from memory).
    struct Keep {
        size_t begin, end, to;
    };
    std::vector<std::vector<Keep>> keep(list.size());
    if (src.keep) {
        const int g = hpz_->rank();
        for (size_t k = 0; k < list.size(); ++k) {
            const size_t base = layout_->slot_of(list[k])->offset;
            for (const Piece &pc : secondary_layout_.param_pieces(list[k]))
                if (pc.part == g)
                    keep[k].push_back(Keep{pc.flat_offset - base, pc.flat_offset - base + pc.count,
                                           (pc.flat_offset - secondary_begin_) * esize_});
        }
    }
    const size_t part = std::max(block, kHotBytes / esize_ / block * block); // values per cache-sized part
    const char *r = static_cast<const char *>(recv.data());
    for (const auto &jp : g.plan.pieces) {
        const size_t k = static_cast<size_t>(std::find(list.begin(), list.end(), jp.first) - list.begin());
        const size_t count = jp.second.count, at = jp.second.param_offset;
        for (size_t a = 0; a < count; a += part) {
            const size_t len = std::min(part, count - a), lo = at + a, hi = lo + len;
            q::dequantize_part(r, count, bits, block, a, len, dst[k] + lo * esize_, s_.dtype);
            for (const Keep &kp : keep[k]) {
                const size_t b = std::max(lo, kp.begin), e = std::min(hi, kp.end);
                if (b < e)
                    space_->copy(static_cast<char *>(secondary_.data()) + kp.to + (b - kp.begin) * esize_,
                                 dst[k] + b * esize_, (e - b) * esize_);
            }
        }
        r += g.packed(count);
    }
    pool_.give(std::move(send));
    pool_.give(std::move(recv));
    count_quantized(g, src);
}

// qwZ on a device space (CUDA, simulated): gather_quantized() with the
// space's kernels (comm/quantize_space.hpp), so the quantization, the
// allgatherv (on the space's queue: NCCL orders it after the kernels on the
// stream) and the dequantization into the compute dtype stay on the device.
// The same plan, pieces and bytes as the host's.
void Partitioned::gather_quantized_space(const std::vector<int> &list, const Source &src,
                                         const std::vector<char *> &dst) {
    const QwzGather g = plan_quantized(list, src);
    Buffer send(*space_, g.bytes[static_cast<size_t>(src.part)] + 64, false), recv(*space_, g.total + 64, false);
    pack_quantized(g, src, static_cast<char *>(send.data()), [&](const char *from, size_t count, char *to) {
        qkernels_->quantize(from, s_.dtype, count, g.bits, g.block, to);
    });
    src.group->allgatherv(send.data(), recv.data(), g.bytes, DSM_UINT8, queue());
    const char *r = static_cast<const char *>(recv.data());
    for (const auto &jp : g.plan.pieces) {
        const size_t k = static_cast<size_t>(std::find(list.begin(), list.end(), jp.first) - list.begin());
        qkernels_->dequantize(r, jp.second.count, g.bits, g.block, dst[k] + jp.second.param_offset * esize_, s_.dtype,
                              false);
        r += g.packed(jp.second.count);
    }
    if (src.keep)
        for (size_t k = 0; k < list.size(); ++k) keep_secondary(list[k], dst[k]);
    count_quantized(g, src);
}

} // namespace zero
} // namespace dsm
