// qgZ's hierarchical quantized reduce-scatter on a space's memory (qgz_device.hpp).
#include "comm/qgz_device.hpp"

#include "comm/quantize.hpp"
#include "core/error.hpp"

namespace dsm {
namespace comm {

SpaceQuantizedReduce::SpaceQuantizedReduce(Backend *group, std::vector<int> nodes, size_t block, int bits,
                                           device::Space &space)
    : group_(group), topo_(nodes), block_(block), bits_(bits), space_(space) {
    DSM_REQUIRE(group_ != nullptr, DSM_ERR_NULL_POINTER, "qgZ: no group");
    DSM_REQUIRE(static_cast<int>(nodes.size()) == group_->size(), DSM_ERR_INVALID_ARGUMENT, "qgZ: ", nodes.size(),
                " node colors for a group of ", group_->size());
    quant::check_block(block_, "qgZ");
    quant::check_bits(bits_);
    const Capabilities caps = group_->capabilities();
    const bool host = space_.host_addressable();
    DSM_REQUIRE(host ? caps.host_memory && !caps.stream_ordered : caps.stream_ordered, DSM_ERR_NOT_SUPPORTED,
                "zero_optimization.zero_quantized_gradients on ", space_.name(), " memory needs ",
                host ? "a host backend (mpi or shm)" : "the nccl backend", " for the data-parallel group, which uses ",
                group_->name());
    kernels_ = quant::make_space_kernels(space_);
}

void SpaceQuantizedReduce::reduce_scatter(const void *send, const std::vector<size_t> &counts, dsm_dtype_t dtype,
                                          float *out, QuantBytes *bytes) {
    const int me = group_->rank();
    DSM_REQUIRE(dtype == DSM_FLOAT32 || dtype == DSM_FLOAT16 || dtype == DSM_BFLOAT16, DSM_ERR_INVALID_ARGUMENT,
                "qgZ of dtype ", static_cast<int>(dtype), " (expected FLOAT32, FLOAT16 or BFLOAT16)");
    const size_t es = dtype == DSM_FLOAT32 ? 4 : 2;
    const QgzPlan p = plan_qgz(topo_, me, counts, es, bits_, block_);
    if (acc_.bytes() < p.acc_values * sizeof(float)) acc_ = device::Buffer(space_, p.acc_values * sizeof(float), false);
    const char *src = static_cast<const char *>(send);
    float *acc = static_cast<float *>(acc_.data());
    auto sum_of = [&](size_t k) { return p.collected[k] == me ? out : acc + p.acc_at[k]; };
    auto block_of = [&](int o) { return src + p.off[static_cast<size_t>(o)] * es; };
    auto qb = [&](size_t c) { return quant::packed_bytes(c, bits_, block_); };
    const Queue queue = space_.queue();

    // This member's own contribution, at full precision.
    for (size_t k = 0; k < p.collected.size(); ++k) {
        const size_t c = counts[static_cast<size_t>(p.collected[k])];
        if (c > 0) kernels_->widen(block_of(p.collected[k]), dtype, c, sum_of(k));
    }

    // 1. Inside the node: each block to its collector, added in fp32.
    if (p.step1)
        group_->alltoall_packed(
            p.send1, p.recv1,
            [&](int peer, void *buf) {
                char *w = static_cast<char *>(buf);
                for (int o : p.pack1[static_cast<size_t>(peer)]) {
                    const size_t c = counts[static_cast<size_t>(o)];
                    kernels_->quantize(block_of(o), dtype, c, bits_, block_, w);
                    w += qb(c);
                }
                kernels_->settle();
            },
            [&](int, const void *buf) {
                const char *r = static_cast<const char *>(buf);
                for (size_t k = 0; k < p.collected.size(); ++k) {
                    const size_t c = counts[static_cast<size_t>(p.collected[k])];
                    kernels_->dequantize(r, c, bits_, block_, sum_of(k), DSM_FLOAT32, true);
                    r += qb(c);
                }
                kernels_->settle();
            },
            queue);

    // 2. Between the nodes: each node's sum to its owner, added in fp32.
    if (p.step2)
        group_->alltoall_packed(
            p.send2, p.recv2,
            [&](int peer, void *buf) {
                kernels_->quantize(sum_of(p.slot(peer)), DSM_FLOAT32, counts[static_cast<size_t>(peer)], bits_, block_,
                                   buf);
                kernels_->settle();
            },
            [&](int, const void *buf) {
                kernels_->dequantize(buf, counts[static_cast<size_t>(me)], bits_, block_, out, DSM_FLOAT32, true);
                kernels_->settle();
            },
            queue);
    if (bytes) *bytes += p.bytes;
}

} // namespace comm
} // namespace dsm
