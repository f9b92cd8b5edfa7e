// ZeRO++ qgZ's hierarchical quantized reduce-scatter (qgz.hpp) on the
// memory of a space: the device-resident engine's (CUDA, over the nccl
// backend) and the simulated device's (over the host backends). The same
// two exchanges, the same plan (qgz_plan.hpp), the same blocks and bytes
// as the host's QuantizedReduce; the quantization, the fp32 accumulation
// and the first copy of this member's own values run as the space's kernels
// (quantize_space.hpp) on its queue:
//   - the own contribution of each owner this member collects for is
//     widened to fp32 into `out` (its own) or the accumulator;
//   - step 1: each block is quantized into the backend's staging memory for
//     its collector, sent (alltoall_packed on the space's queue: on NCCL
//     the sends follow the quantize kernels on the stream), and
//     dequantized-added in fp32 into the collector's sums;
//   - step 2: each collector quantizes the node's sums for the owners on
//     other nodes, and each owner adds them into `out`.
// On NCCL the call returns once the stream has run the unpacks (the backend
// waits, as its staging is reused); `out` is then final.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "comm/backend.hpp"
#include "comm/qgz.hpp"
#include "comm/qgz_plan.hpp"
#include "comm/quantize_space.hpp"
#include "device/space.hpp"

namespace dsm {
namespace comm {

class SpaceQuantizedReduce {
public:
    // As QuantizedReduce's constructor; `space` holds the buffers. The
    // group's backend must take the space's memory in alltoall_packed's
    // callbacks: a host backend for a host-addressable space, the nccl
    // backend for CUDA (DSM_ERR_NOT_SUPPORTED otherwise).
    SpaceQuantizedReduce(Backend *group, std::vector<int> nodes, size_t block, int bits, device::Space &space);

    // QuantizedReduce::reduce_scatter on the space's memory (`send` and `out`
    // there), ordered on the space's queue.
    void reduce_scatter(const void *send, const std::vector<size_t> &counts, dsm_dtype_t dtype, float *out,
                        QuantBytes *bytes);

private:
    Backend *group_;
    QgzTopology topo_;
    size_t block_;
    int bits_;
    device::Space &space_;
    std::unique_ptr<quant::SpaceKernels> kernels_;
    device::Buffer acc_; // the node's sums of the owners this member collects for
};

} // namespace comm
} // namespace dsm
