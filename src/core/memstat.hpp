// What the library holds in memory on this rank, by kind, now and at its
// high-water mark: host memory (the host space's buffers and staging),
// device memory (a CUDA device or the simulated one) and node-shared memory
// (buffers the shm backend maps for its peers). Every allocation of the
// device layer (device::Buffer, device::Staging), of the shared buffers
// (zero::SharedBuffer) and of ZeRO-Offload's mirror counts here.
//
// The counts are per process (one rank). The high-water marks restart from
// the current bytes at reset_peaks(): the engine calls it when it is created,
// so that dsm_engine_describe() reports the peaks since then.
#pragma once

#include <cstddef>

namespace dsm {
namespace memstat {

enum class Kind : int { HOST = 0, DEVICE = 1, SHARED = 2 };
constexpr int kKinds = 3;

void add(Kind kind, size_t bytes) noexcept;
void sub(Kind kind, size_t bytes) noexcept;
size_t current(Kind kind) noexcept;
size_t peak(Kind kind) noexcept;
// The high-water marks of every kind restart from the current bytes.
void reset_peaks() noexcept;
// "host", "device", "shared".
const char *kind_name(Kind kind) noexcept;

// What the ZeRO stages' transient memory holds, whatever its kind: gathered
// ZeRO-3 parameters (whole and ranges, the prefetched ones and the one in
// the bucket included), gradient buffers handed out and gradients waiting
// for their bucket's reduction, and staging of the collectives (send and
// receive buffers, quantized blocks). Counted while in use, from the pool's
// take to its give (idle pooled buffers are in no use), with high-water
// marks that reset_peaks() restarts too (dsm_engine_memory()).
enum class Use : int { GATHERED = 0, GRADIENTS = 1, STAGING = 2 };
constexpr int kUses = 3;

void use_add(Use use, size_t bytes) noexcept;
void use_sub(Use use, size_t bytes) noexcept;
size_t use_current(Use use) noexcept;
size_t use_peak(Use use) noexcept;

} // namespace memstat
} // namespace dsm
