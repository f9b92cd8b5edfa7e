// The CUDA kernels of libdsm, for the device side of a step, one file per
// concern: optimizer_cuda.cu (the optimizers), reduce_cuda.cu (inspection
// and Lamb's norms), convert_cuda.cu (conversions and copies), space_cuda.cu
// (the device space's small kernels):
//
// - fused optimizer updates over a flat fp32 partition: Adam/AdamW, SGD,
//   Lion, Adagrad and Lamb's two passes, each computing exactly what the
//   portable CPU kernel of optim/kernels.hpp computes, bit for bit, from the
//   same constants (optim::AdamK and friends); the gradient is read as fp32,
//   fp16 or bf16 and multiplied by the constants' `scale` (the unscale) in
//   the same pass, and the updated parameters can be written as fp16 or bf16
//   in the same pass too;
// - the same updates as multi-tensor launches (optim/multi_tensor.hpp): one
//   kernel over a table of segments, each segment's constants picked by its
//   weight decay flag, the gradients optionally zeroed in the same pass, with
//   the per-tensor kernels' bits; and the multi-tensor accumulation of one
//   rank's gradients into its partition;
// - inspect(): one pass over a gradient giving the overflow flag (any Inf or
//   NaN) and the sum of squares for the global norm, deterministically;
// - conversions between fp32, fp16 and bf16, bit for bit as core/half.hpp;
// - strided 2-D copies (the Ulysses pack and unpack of sp/geometry.hpp) as
//   cudaMemcpy2DAsync calls.
//
// Every entry point takes a cudaStream_t, enqueues its work on it and
// returns without synchronizing; pointers are device memory (or any memory
// the device can address). Arguments are checked on the host before any
// CUDA call (DSM_ERR_NULL_POINTER, DSM_ERR_INVALID_ARGUMENT); a failed launch
// or copy throws DSM_ERR_CUDA with CUDA's description of the error. A call
// with n == 0 does nothing (no CUDA call at all), except inspect() and
// lamb1(), which always write their result.
//
// Same bits as the CPU: the kernels round every multiply and add separately
// (__fmul_rn, __fadd_rn: never contracted into an FMA), as the portable CPU
// kernels do (SSE2 has no FMA), and divide and take square roots with IEEE
// rounding (__fdiv_rn, __fsqrt_rn), so they do not depend on --fmad,
// --prec-div or --prec-sqrt. Subnormals must be kept: NVCCFLAGS must not have
// --use_fast_math or --ftz=true (the configured default keeps them).
//
// Only the reductions (inspect, lamb1) differ from the CPU: they add in
// another order, so their sums agree with the CPU's to rounding only. Their
// order is fixed (kReduceBlocks blocks of kReduceThreads threads whatever
// the device, each thread taking fixed groups of 4 elements from element 0,
// per-block trees, then one block adding the partials in block order), so
// the same input gives the same bits on every run, every device and at
// every address.
//
// Without DSM_HAVE_CUDA_KERNELS (no nvcc) nothing here is defined: callers
// check that macro (dsm_config.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "optim/kernels.hpp"
#include "optim/multi_tensor.hpp"

// The stream type, declared exactly as CUDA's driver_types.h declares it, so
// that this header does not need the CUDA include path.
struct CUstream_st;
typedef struct CUstream_st *cudaStream_t;

namespace dsm {
namespace cuda {

// ---------------------------------------------------------------- shared with the *_cuda.cu files

// The fixed shape of the reductions.
constexpr unsigned kReduceBlocks = 1024;
constexpr unsigned kReduceThreads = 256;

// What inspect() and lamb1() write.
struct ReduceResult {
    double sum[2];      // inspect: sum[0] = sum of (inv_scale * g)^2, sum[1] = 0;
                        // lamb1: sum[0] = sum of p^2, sum[1] = sum of u^2 (as optim::Kernels::lamb1)
    unsigned nonfinite; // inspect: 1 when some element is Inf or NaN, else 0; lamb1: 0
    unsigned reserved;
};

// Device memory for one reduction, allocated by the caller (cudaMalloc of
// sizeof(Reduction)); no initialization needed. `result` comes first: copy
// sizeof(ReduceResult) bytes from the Reduction's address to read it. One
// Reduction must not serve two reductions in flight at once.
struct Reduction {
    ReduceResult result;
    double block_sum[2][kReduceBlocks]; // scratch: per-block partial sums
    unsigned block_nonfinite[kReduceBlocks];
};

// The launchers of the *_cuda.cu files, without argument checks: use the checked
// functions below. Each returns nullptr when its work was enqueued, else
// CUDA's description of the error (cudaGetErrorString).
namespace detail {

enum class Fmt : int { NONE = -1, F32 = 0, F16 = 1, BF16 = 2 };

struct Arrays {
    float *p = nullptr;
    const void *g = nullptr;
    Fmt g_fmt = Fmt::F32;
    void *p16 = nullptr;
    Fmt p16_fmt = Fmt::NONE;
    size_t n = 0;
};

const char *launch_adam(const optim::AdamK &k, const Arrays &a, float *m, float *v, cudaStream_t s) noexcept;
const char *launch_sgd(const optim::SgdK &k, const Arrays &a, float *buf, cudaStream_t s) noexcept;
const char *launch_lion(const optim::LionK &k, const Arrays &a, float *m, cudaStream_t s) noexcept;
const char *launch_adagrad(const optim::AdagradK &k, const Arrays &a, float *sum, cudaStream_t s) noexcept;
const char *launch_lamb1(const optim::LambK &k, const Arrays &a, float *m, float *v, Reduction *out,
                         cudaStream_t s) noexcept;
const char *launch_lamb2(const optim::LambK &k, float neg_coef, const Arrays &a, const float *m, const float *v,
                         cudaStream_t s) noexcept;
const char *launch_inspect(const void *x, Fmt fmt, size_t n, float inv_scale, Reduction *out,
                           cudaStream_t s) noexcept;
const char *launch_convert(const void *src, Fmt sf, void *dst, Fmt df, size_t n, cudaStream_t s) noexcept;
// Multi-tensor launches (optim/multi_tensor.hpp): one kernel over a table of
// segments in device memory. An update's arrays are indexed by the segments'
// offsets; the segment's kMtDecay flag picks the constants `on`, else `off`.
// zero_grads: the gradient elements read are set to zero after the update
// (the fused zeroing). g and p16 as in Arrays.
struct MtArrays {
    float *p = nullptr;
    const void *g = nullptr;
    Fmt g_fmt = Fmt::F32;
    float *s0 = nullptr, *s1 = nullptr;
    void *p16 = nullptr;
    Fmt p16_fmt = Fmt::NONE;
    bool zero_grads = false;
    const MtSeg *segs = nullptr; // device memory
    const uint32_t *chunk_seg = nullptr; // device memory: mt_chunk_index() of the table, or NULL (a search)
    unsigned nsegs = 0;
    uint64_t chunks = 0;
};
const char *launch_mt_adam(const optim::AdamK &on, const optim::AdamK &off, const MtArrays &a, cudaStream_t s) noexcept;
const char *launch_mt_sgd(const optim::SgdK &on, const optim::SgdK &off, const MtArrays &a, cudaStream_t s) noexcept;
const char *launch_mt_lion(const optim::LionK &on, const optim::LionK &off, const MtArrays &a, cudaStream_t s) noexcept;
const char *launch_mt_adagrad(const optim::AdagradK &on, const optim::AdagradK &off, const MtArrays &a,
                              cudaStream_t s) noexcept;
// dst[seg.offset + i] += a * src[i] for each segment, src the segment's aux
// (an address, element format sf), dst in format df: the bits of
// amp::Math::accumulate_into per segment (a 16-bit dst widened, added in
// fp32, rounded once). Segments' destinations must not overlap (mt_batches).
// The table travels in the launch's parameters (no upload, no wait): `segs`
// is host memory, at most kMtParamSegs segments (first_chunk from 0).
constexpr unsigned kMtParamSegs = 96;
const char *launch_mt_axpy(Fmt sf, void *dst, Fmt df, const MtSeg *segs, unsigned nsegs, float a,
                           cudaStream_t s) noexcept;
// The bound of a step's memory traffic (dsm-bench zero --model --device cuda):
// the two passes an update with clipping needs, with next to no arithmetic.
// pass 0 reads g (n elements, fp32 or 16-bit) and writes one partial sum per
// block into partial (kBoundBlocks floats); pass 1 reads g, p, m and v,
// writes p, m and v, with a 16-bit g also p16 (g's format), and zeroes g:
// fp32 36 bytes per element in all, 16-bit 32. Device memory, 16-byte
// aligned.
constexpr unsigned kBoundBlocks = 4096;
const char *launch_bound(int pass, void *g, Fmt g_fmt, float *p, float *m, float *v, void *p16, size_t n,
                         float *partial, cudaStream_t s) noexcept;
// The device space's small kernels (device/space.hpp): x *= factor in fp32
// (amp::scale_inplace), dst += a * src (amp::accumulate), x[i] = v.
const char *launch_scale(void *x, Fmt f, size_t n, float factor, cudaStream_t s) noexcept;
const char *launch_axpy(const void *src, Fmt f, float *dst, size_t n, float a, cudaStream_t s) noexcept;
const char *launch_fill(float *x, size_t n, float v, cudaStream_t s) noexcept;
// height rows of width bytes from src (rows spitch apart) to dst (dpitch apart).
const char *launch_copy_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                           cudaStream_t s) noexcept;

} // namespace detail
} // namespace cuda
} // namespace dsm

// ---------------------------------------------------------------- the checked API
// nvcc does not see MPI's headers, which dsm.h (and so core/error.hpp)
// includes: the .cu files see only the part above.
#ifndef __CUDACC__
#include <algorithm>
#include <vector>

#include "core/error.hpp"
#include "cuda/device.hpp"
#include "dsm.h"

namespace dsm {
namespace cuda {

// The arrays of one update, n elements each.
struct Flat {
    float *p = nullptr;                 // fp32 master parameters, updated in place
    const void *g = nullptr;            // the gradient; the kernel multiplies it by the constants' scale
    dsm_dtype_t g_type = DSM_FLOAT32;   // DSM_FLOAT32, DSM_FLOAT16 or DSM_BFLOAT16
    void *p16 = nullptr;                // optional: receives the updated p rounded to p16_type
    dsm_dtype_t p16_type = DSM_FLOAT16; // DSM_FLOAT16 or DSM_BFLOAT16
    size_t n = 0;
};

namespace detail {

inline Fmt fmt_of(dsm_dtype_t t, const char *what, bool fp32_ok) {
    switch (t) {
    case DSM_FLOAT32:
        if (fp32_ok) return Fmt::F32;
        break;
    case DSM_FLOAT16: return Fmt::F16;
    case DSM_BFLOAT16: return Fmt::BF16;
    default: break;
    }
    DSM_FAIL(DSM_ERR_INVALID_ARGUMENT, what, ": dtype ", static_cast<int>(t), " is not ",
             fp32_ok ? "float32, float16 or bfloat16" : "float16 or bfloat16");
}

inline size_t fmt_size(Fmt f) noexcept { return f == Fmt::F32 ? 4 : 2; }

// A device pointer must be aligned to its element: the GPU faults otherwise.
inline void aligned(const void *p, size_t es, const char *what) {
    DSM_REQUIRE(reinterpret_cast<uintptr_t>(p) % es == 0, DSM_ERR_INVALID_ARGUMENT, what, " (", p,
                ") is not aligned to its ", es, "-byte elements");
}

inline void need(const void *p, size_t es, const char *what) {
    DSM_REQUIRE(p != nullptr, DSM_ERR_NULL_POINTER, what, " is NULL");
    aligned(p, es, what);
}

inline void check_launch(const char *err, const char *what) {
    if (err != nullptr) DSM_FAIL(DSM_ERR_CUDA, "dsm::cuda::", what, ": ", err);
}

// The checked Arrays of f (false: n == 0, nothing to do). `grad`: f.g is
// read; `copy`: f.p16 may be set.
inline bool arrays_of(const Flat &f, bool grad, bool copy, const char *what, Arrays &a) {
    a.g_fmt = grad ? fmt_of(f.g_type, "gradient", true) : Fmt::F32;
    a.p16_fmt = Fmt::NONE;
    if (f.p16 != nullptr) {
        DSM_REQUIRE(copy, DSM_ERR_INVALID_ARGUMENT, what, " writes no 16-bit copy of p: p16 must be NULL");
        a.p16_fmt = fmt_of(f.p16_type, "p16", false);
    }
    if (f.n == 0) return false;
    need(f.p, 4, "p");
    if (grad) need(f.g, fmt_size(a.g_fmt), "g");
    if (f.p16 != nullptr) aligned(f.p16, 2, "p16");
    a.p = f.p;
    a.g = grad ? f.g : nullptr;
    a.p16 = f.p16;
    a.n = f.n;
    return true;
}

} // namespace detail

// ---------------------------------------------------------------- optimizers
// One update of f.n elements with the constants of optim/kernels.hpp, as the
// CPU kernel of the same name (optim::Kernels) with g = f.g * k.scale. The
// arrays must not overlap.

inline void adam(const optim::AdamK &k, const Flat &f, float *m, float *v, cudaStream_t stream) {
    detail::Arrays a;
    if (!detail::arrays_of(f, true, true, "adam", a)) return;
    detail::need(m, 4, "m");
    detail::need(v, 4, "v");
    detail::check_launch(detail::launch_adam(k, a, m, v, stream), "adam");
}

// buf is not read when k.mode is 0 (no momentum) and may then be NULL.
inline void sgd(const optim::SgdK &k, const Flat &f, float *buf, cudaStream_t stream) {
    DSM_REQUIRE(k.mode >= 0 && k.mode <= 2, DSM_ERR_INVALID_ARGUMENT, "sgd: mode ", k.mode,
                " (0: no momentum, 1: momentum, 2: nesterov)");
    detail::Arrays a;
    if (!detail::arrays_of(f, true, true, "sgd", a)) return;
    if (k.mode != 0) detail::need(buf, 4, "buf");
    detail::check_launch(detail::launch_sgd(k, a, k.mode != 0 ? buf : nullptr, stream), "sgd");
}

inline void lion(const optim::LionK &k, const Flat &f, float *m, cudaStream_t stream) {
    detail::Arrays a;
    if (!detail::arrays_of(f, true, true, "lion", a)) return;
    detail::need(m, 4, "m");
    detail::check_launch(detail::launch_lion(k, a, m, stream), "lion");
}

inline void adagrad(const optim::AdagradK &k, const Flat &f, float *sum, cudaStream_t stream) {
    detail::Arrays a;
    if (!detail::arrays_of(f, true, true, "adagrad", a)) return;
    detail::need(sum, 4, "sum");
    detail::check_launch(detail::launch_adagrad(k, a, sum, stream), "adagrad");
}

// Lamb pass 1: m and v updated; out->result.sum = {sum of p^2, sum of u^2}
// over the n elements (p is read, not written; f.p16 must be NULL). The
// caller sums these over the parameter's pieces and ranks, computes the
// trust ratio as optimizer.cc does, and calls lamb2 with its neg_coef.
inline void lamb1(const optim::LambK &k, const Flat &f, float *m, float *v, Reduction *out, cudaStream_t stream) {
    detail::Arrays a;
    DSM_ARG_NOT_NULL(out);
    detail::aligned(out, alignof(Reduction), "out");
    if (detail::arrays_of(f, true, false, "lamb1", a)) {
        detail::need(m, 4, "m");
        detail::need(v, 4, "v");
    }
    detail::check_launch(detail::launch_lamb1(k, a, m, v, out, stream), "lamb1");
}

// Lamb pass 2: p += neg_coef * u, u recomputed from m and v as in pass 1
// (f.g is not read).
inline void lamb2(const optim::LambK &k, float neg_coef, const Flat &f, const float *m, const float *v,
                  cudaStream_t stream) {
    detail::Arrays a;
    if (!detail::arrays_of(f, false, true, "lamb2", a)) return;
    detail::need(m, 4, "m");
    detail::need(v, 4, "v");
    detail::check_launch(detail::launch_lamb2(k, neg_coef, a, m, v, stream), "lamb2");
}

// ---------------------------------------------------------------- multi-tensor tables
// The device tables of multi-tensor updates, each kept while its segments
// stay the same: a step's table is uploaded at the first step after the
// layout changes, then reused. Several tables (kSlots, least recently used
// replaced): an update that runs in pieces (publish()'s slices) has one
// per piece.
//
// Exception-safe: a slot answers for its segments only once its table is on
// the device. When the allocation or the upload throws, the slot is left
// empty (invalid), so the next get() with the same segments plans and
// uploads again instead of handing out a missing or partial table.
class MtTables {
public:
    static constexpr size_t kSlots = 64;
    // How a table's device memory is obtained: DeviceBuffer(bytes) unless
    // given (tests inject a failing allocation).
    using Alloc = DeviceBuffer (*)(size_t bytes);
    explicit MtTables(Alloc alloc = nullptr) noexcept : alloc_(alloc) {}
    // The device table of mt_plan(entries); *nsegs and *chunks are its size,
    // *chunk_seg its mt_chunk_index() (on the device after the table). An
    // upload waits for the stream's earlier work (a pageable copy).
    const MtSeg *get(const std::vector<MtEntry> &entries, cudaStream_t stream, unsigned *nsegs, uint64_t *chunks,
                     const uint32_t **chunk_seg) {
        ++clock_;
        Slot *hit = nullptr;
        for (Slot &s : slots_)
            if (s.valid && s.key.size() == entries.size() && equal(s.key, entries)) hit = &s;
        if (hit == nullptr) {
            // Plan on the host first: nothing in a slot changes if this throws.
            MtTable table = mt_plan(entries);
            DSM_REQUIRE(table.segs.size() <= UINT32_MAX, DSM_ERR_INVALID_ARGUMENT, "multi-tensor launch of ",
                        table.segs.size(), " segments");
            std::vector<uint32_t> index = mt_chunk_index(table);
            if (slots_.size() < kSlots) {
                slots_.emplace_back();
                hit = &slots_.back();
            } else {
                hit = &slots_.front();
                for (Slot &s : slots_)
                    if (s.used < hit->used) hit = &s;
            }
            // Invalid until its new table is on the device (the upload below
            // may overwrite the old one's memory, then throw).
            hit->valid = false;
            hit->used = 0;
            // One buffer: the segments, then the chunks' segment indices.
            const size_t segs_bytes = table.segs.size() * sizeof(MtSeg);
            const size_t bytes = std::max<size_t>(segs_bytes + index.size() * sizeof(uint32_t), 1);
            if (hit->dev.bytes() < bytes) {
                hit->dev = DeviceBuffer(); // freeing waits for the device
                hit->dev = alloc_ ? alloc_(bytes) : DeviceBuffer(bytes);
            }
            if (!table.segs.empty()) {
                copy_bytes_async(hit->dev.get(), table.segs.data(), segs_bytes, stream);
                copy_bytes_async(static_cast<char *>(hit->dev.get()) + segs_bytes, index.data(),
                                 index.size() * sizeof(uint32_t), stream);
            }
            // Moved, the vectors keep their storage, which the copies read.
            hit->table = std::move(table);
            hit->index = std::move(index);
            hit->segs_bytes = segs_bytes;
            hit->key = entries;
            hit->valid = true; // last: the slot now answers for these segments
            ++uploads_;
        }
        hit->used = clock_;
        *nsegs = static_cast<unsigned>(hit->table.segs.size());
        *chunks = hit->table.chunks;
        *chunk_seg = reinterpret_cast<const uint32_t *>(static_cast<const char *>(hit->dev.get()) + hit->segs_bytes);
        return static_cast<const MtSeg *>(hit->dev.get());
    }
    // Tables uploaded so far (tests: a step with the same segments uploads none).
    uint64_t uploads() const noexcept { return uploads_; }

private:
    static bool equal(const std::vector<MtEntry> &a, const std::vector<MtEntry> &b) noexcept {
        for (size_t i = 0; i < a.size(); ++i)
            if (a[i].offset != b[i].offset || a[i].count != b[i].count || a[i].aux != b[i].aux) return false;
        return true;
    }
    struct Slot {
        std::vector<MtEntry> key;
        MtTable table;
        std::vector<uint32_t> index;
        size_t segs_bytes = 0;
        DeviceBuffer dev;
        uint64_t used = 0;
        bool valid = false;
    };
    std::vector<Slot> slots_;
    uint64_t clock_ = 0, uploads_ = 0;
    Alloc alloc_ = nullptr;
};

// ---------------------------------------------------------------- precision

// out->result: nonfinite = 1 when some g[i] is Inf or NaN (the raw elements:
// unscaling by a finite value makes no new ones), sum[0] = the sum over i of
// (double(g[i]) * double(inv_scale))^2, each product rounded to double and
// added in the fixed order described above (the CPU's amp::norm_part computes
// the same terms). g may be NULL when n == 0; the result is written anyway.
inline void inspect(const void *g, dsm_dtype_t type, size_t n, float inv_scale, Reduction *out,
                    cudaStream_t stream) {
    const detail::Fmt f = detail::fmt_of(type, "inspect", true);
    DSM_ARG_NOT_NULL(out);
    detail::aligned(out, alignof(Reduction), "out");
    if (n > 0) detail::need(g, detail::fmt_size(f), "g");
    detail::check_launch(detail::launch_inspect(n > 0 ? g : nullptr, f, n, inv_scale, out, stream), "inspect");
}

// dst[i] = src[i] converted, dtypes float32, float16 and bfloat16, bit for
// bit as core/half.hpp (16-bit to 16-bit goes through fp32, as amp::convert).
// The same dtype is a plain copy. src and dst must not overlap.
inline void convert(const void *src, dsm_dtype_t src_type, void *dst, dsm_dtype_t dst_type, size_t n,
                    cudaStream_t stream) {
    const detail::Fmt sf = detail::fmt_of(src_type, "convert source", true);
    const detail::Fmt df = detail::fmt_of(dst_type, "convert destination", true);
    if (n == 0) return;
    detail::need(src, detail::fmt_size(sf), "src");
    detail::need(dst, detail::fmt_size(df), "dst");
    detail::check_launch(detail::launch_convert(src, sf, dst, df, n, stream), "convert");
}

// ---------------------------------------------------------------- strided copies
// `height` rows of `width` bytes from src (rows `spitch` apart) to dst
// (`dpitch` apart), enqueued as one cudaMemcpy2DAsync (or cudaMemcpyAsync
// when the rows touch) with cudaMemcpyDefault, so each side may be device or
// host memory: the Ulysses copies of sp/geometry.hpp on a device.
inline void copy_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                    cudaStream_t stream) {
    if (width == 0 || height == 0) return;
    DSM_ARG_NOT_NULL(dst);
    DSM_ARG_NOT_NULL(src);
    DSM_REQUIRE(dpitch >= width && spitch >= width, DSM_ERR_INVALID_ARGUMENT, "copy_2d: rows of ", width,
                " bytes with pitches ", dpitch, " and ", spitch);
    detail::check_launch(detail::launch_copy_2d(dst, dpitch, src, spitch, width, height, stream), "copy_2d");
}

} // namespace cuda
} // namespace dsm
#endif // !__CUDACC__
