// torch.ops.dsm.seq_to_head and torch.ops.dsm.head_to_seq: libdsm's Ulysses
// all-to-all (dsm_sp_seq_to_head / dsm_sp_head_to_seq) as TorchScript
// operators with autograd; each one's backward is the other's forward.
//
// A call checks its tensor on this rank first (device, dtype, dimensions,
// heads). With a group set, a rank whose tensor fails still calls the
// library, with a descriptor the library rejects, so that the library's own
// agreement makes every rank fail before any data moves; the ranks then
// exchange the lowest failing rank's message (group.cc) and all throw it.
#include <torch/autograd.h>
#include <torch/library.h>
#include <torch/types.h>

#include <sstream>
#include <string>
#include <vector>

#include "group.hpp"

namespace dsm_torch_ops {

namespace {

using torch::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

enum class Dir { kSeqToHead, kHeadToSeq };

const char *op_name(Dir dir) { return dir == Dir::kSeqToHead ? "dsm::seq_to_head" : "dsm::head_to_seq"; }

std::string dtype_text(c10::ScalarType t) {
    switch (t) {
    case c10::kFloat: return "torch.float32";
    case c10::kDouble: return "torch.float64";
    case c10::kHalf: return "torch.float16";
    case c10::kBFloat16: return "torch.bfloat16";
    case c10::kLong: return "torch.int64";
    case c10::kInt: return "torch.int32";
    case c10::kShort: return "torch.int16";
    case c10::kChar: return "torch.int8";
    case c10::kByte: return "torch.uint8";
    case c10::kBool: return "torch.bool";
    default: return std::string("torch.") + c10::toString(t);
    }
}

std::string shape_text(c10::IntArrayRef s) {
    std::ostringstream os;
    os << '[';
    for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
    os << ']';
    return os.str();
}

// What one call does, from the tensor and the arguments.
struct Plan {
    dsm_sp_tensor_t t{};             // the global shape for the library
    bool native = true;              // x's dims are [b, s, H, d] or [s, b, H, d]
    std::vector<int64_t> perm;       // not native: x.permute(perm) is [b, s, H, d]
    std::vector<int64_t> out_shape;  // the output, in the library's layout
    int64_t heads = 0;               // H
};

// This rank's checks; "" when the call can go on, else the failure, naming the value.
std::string plan(Dir dir, const Tensor &x, int64_t seq_dim, int64_t head_dim, int64_t heads, bool replicate,
                 int P, int rank, Plan *p) {
    std::ostringstream why;
    if (!x.defined()) return "x is an undefined tensor";
    if (x.device().type() != c10::kCPU) {
        why << "x is on " << x.device() << "; the operators take CPU tensors";
        return why.str();
    }
    dsm_dtype_t dtype;
    switch (x.scalar_type()) {
    case c10::kFloat: dtype = DSM_FLOAT32; break;
    case c10::kDouble: dtype = DSM_FLOAT64; break;
    case c10::kHalf: dtype = DSM_FLOAT16; break;
    case c10::kBFloat16: dtype = DSM_BFLOAT16; break;
    default:
        why << "x has dtype " << dtype_text(x.scalar_type())
            << " (torch.float32, torch.float64, torch.float16 or torch.bfloat16)";
        return why.str();
    }
    if (x.dim() != 4) {
        why << "x has " << x.dim() << " dimensions " << shape_text(x.sizes())
            << "; expected 4: batch, sequence and heads in any order, then the head dimension";
        return why.str();
    }
    const int64_t sd = seq_dim < 0 ? seq_dim + 4 : seq_dim, hd = head_dim < 0 ? head_dim + 4 : head_dim;
    if (sd < 0 || sd > 2) {
        why << "seq_dim is " << seq_dim << " (0, 1 or 2 of x's 4 dimensions; the last is the head dimension)";
        return why.str();
    }
    if (hd < 0 || hd > 2) {
        why << "head_dim is " << head_dim << " (0, 1 or 2 of x's 4 dimensions; the last is the head dimension)";
        return why.str();
    }
    if (sd == hd) {
        why << "seq_dim and head_dim are both " << sd;
        return why.str();
    }
    const int64_t bd = 3 - sd - hd;
    const unsigned flags = replicate ? DSM_SP_REPLICATE : 0u;
    const bool fwd = dir == Dir::kSeqToHead;
    p->heads = fwd ? x.size(hd) : heads;
    if (p->heads < 1) {
        why << (fwd ? "x has " : "heads is ") << p->heads << (fwd ? " heads" : "") << " (must be >= 1)";
        return why.str();
    }
    int64_t first = 0, count = 0;
    if (dsm_sp_head_range(p->heads, flags, P, rank, &first, &count) != DSM_SUCCESS) return dsm_last_error();
    if (!fwd && x.size(hd) != count) {
        why << "x has " << x.size(hd) << " heads in dimension " << hd << " but rank " << rank << " of " << P
            << " holds " << count << " of the " << p->heads << " heads";
        return why.str();
    }
    p->native = hd == 2;
    p->t.layout = p->native && sd == 0 ? DSM_SP_SEQ_FIRST : DSM_SP_BATCH_FIRST;
    if (!p->native) p->perm = {bd, sd, hd, 3};
    p->t.batch = x.size(bd);
    p->t.seq = fwd ? x.size(sd) * P : x.size(sd);
    p->t.heads = p->heads;
    p->t.head_dim = x.size(3);
    p->t.dtype = dtype;
    p->t.flags = flags;
    const int64_t s_out = fwd ? p->t.seq : p->t.seq / P, h_out = fwd ? count : p->heads;
    if (p->t.layout == DSM_SP_SEQ_FIRST)
        p->out_shape = {s_out, p->t.batch, h_out, p->t.head_dim};
    else
        p->out_shape = {p->t.batch, s_out, h_out, p->t.head_dim};
    return "";
}

// One transform of x on the group set; *heads gets H.
Tensor transform(Dir dir, const Tensor &x, int64_t seq_dim, int64_t head_dim, int64_t heads, bool replicate,
                 int64_t *total_heads) {
    Held held;
    const Group &g = held.group;
    const char *name = op_name(dir);
    if (const int n = ranks_without_group(g))
        TORCH_CHECK(false, name, ": no sequence-parallel group is set on this job of ", n,
                    " MPI ranks: call dsm_torch_ops_set_mesh() first (a NULL mesh for no sequence parallelism)");
    Plan p;
    const std::string local = plan(dir, x, seq_dim, head_dim, heads, replicate, g.size, g.rank, &p);
    if (g.sp == nullptr) { // no sequence parallelism: the identity
        TORCH_CHECK(local.empty(), name, ": ", local);
        if (total_heads) *total_heads = p.heads;
        return x.clone(at::MemoryFormat::Contiguous);
    }
    Tensor in, out;
    dsm_sp_tensor_t t{};
    t.batch = 0; // rejected by the library on every rank: see agreed_failure()
    t.seq = g.size;
    t.heads = t.head_dim = 1;
    t.layout = DSM_SP_BATCH_FIRST;
    t.dtype = DSM_FLOAT32;
    if (local.empty()) {
        in = (p.native ? x : x.permute(p.perm)).contiguous();
        out = torch::empty(p.out_shape, x.options().memory_format(at::MemoryFormat::Contiguous));
        t = p.t;
    }
    const void *in_ptr = in.defined() ? in.data_ptr() : nullptr;
    void *out_ptr = out.defined() ? out.data_ptr() : nullptr;
    const size_t in_count = in.defined() ? static_cast<size_t>(in.numel()) : 0;
    const size_t out_count = out.defined() ? static_cast<size_t>(out.numel()) : 0;
    const dsm_status_t st = dir == Dir::kSeqToHead ? dsm_sp_seq_to_head(g.sp, &t, in_ptr, in_count, out_ptr, out_count)
                                                   : dsm_sp_head_to_seq(g.sp, &t, in_ptr, in_count, out_ptr, out_count);
    if (st != DSM_SUCCESS) {
        std::string why = dsm_last_error();
        if (st == DSM_ERR_INVALID_ARGUMENT || st == DSM_ERR_NULL_POINTER || st == DSM_ERR_MISMATCH)
            why = agreed_failure(g, local, why);
        TORCH_CHECK(false, name, ": ", why);
    }
    if (total_heads) *total_heads = p.heads;
    if (p.native) return out;
    std::vector<int64_t> inverse(4);
    for (int64_t i = 0; i < 4; ++i) inverse[static_cast<size_t>(p.perm[static_cast<size_t>(i)])] = i;
    return out.permute(inverse).contiguous();
}

// The gradient of an output that none came for.
Tensor zeros_like_output(AutogradContext *ctx) {
    return torch::zeros(ctx->saved_data["sizes"].toIntVector(),
                        torch::dtype(static_cast<c10::ScalarType>(ctx->saved_data["dtype"].toInt())));
}

class HeadToSeq;

class SeqToHead : public torch::autograd::Function<SeqToHead> {
public:
    static Tensor forward(AutogradContext *ctx, const Tensor &x, int64_t seq_dim, int64_t head_dim, bool replicate) {
        int64_t heads = 0;
        Tensor y = transform(Dir::kSeqToHead, x, seq_dim, head_dim, 0, replicate, &heads);
        ctx->saved_data["seq_dim"] = seq_dim;
        ctx->saved_data["head_dim"] = head_dim;
        ctx->saved_data["heads"] = heads;
        ctx->saved_data["replicate"] = replicate;
        ctx->saved_data["sizes"] = y.sizes().vec();
        ctx->saved_data["dtype"] = static_cast<int64_t>(y.scalar_type());
        return y;
    }
    static variable_list backward(AutogradContext *ctx, variable_list grads);
};

class HeadToSeq : public torch::autograd::Function<HeadToSeq> {
public:
    static Tensor forward(AutogradContext *ctx, const Tensor &x, int64_t heads, int64_t seq_dim, int64_t head_dim,
                          bool replicate) {
        Tensor y = transform(Dir::kHeadToSeq, x, seq_dim, head_dim, heads, replicate, nullptr);
        ctx->saved_data["seq_dim"] = seq_dim;
        ctx->saved_data["head_dim"] = head_dim;
        ctx->saved_data["replicate"] = replicate;
        ctx->saved_data["sizes"] = y.sizes().vec();
        ctx->saved_data["dtype"] = static_cast<int64_t>(y.scalar_type());
        return y;
    }
    static variable_list backward(AutogradContext *ctx, variable_list grads) {
        // Every rank runs the all-to-all, also where no gradient came (zeros).
        Tensor g = grads[0].defined() ? grads[0]
                                      : zeros_like_output(ctx);
        return {SeqToHead::apply(g, ctx->saved_data["seq_dim"].toInt(), ctx->saved_data["head_dim"].toInt(),
                                 ctx->saved_data["replicate"].toBool()),
                Tensor(), Tensor(), Tensor(), Tensor()};
    }
};

variable_list SeqToHead::backward(AutogradContext *ctx, variable_list grads) {
    Tensor g = grads[0].defined() ? grads[0]
                                  : zeros_like_output(ctx);
    return {HeadToSeq::apply(g, ctx->saved_data["heads"].toInt(), ctx->saved_data["seq_dim"].toInt(),
                             ctx->saved_data["head_dim"].toInt(), ctx->saved_data["replicate"].toBool()),
            Tensor(), Tensor(), Tensor()};
}

Tensor seq_to_head(const Tensor &x, int64_t seq_dim, int64_t head_dim, bool replicate) {
    return SeqToHead::apply(x, seq_dim, head_dim, replicate);
}

Tensor head_to_seq(const Tensor &x, int64_t heads, int64_t seq_dim, int64_t head_dim, bool replicate) {
    return HeadToSeq::apply(x, heads, seq_dim, head_dim, replicate);
}

} // namespace

} // namespace dsm_torch_ops

// A fragment: the namespace "dsm" may hold other operators of libdsm's bridges.
TORCH_LIBRARY_FRAGMENT(dsm, m) {
    m.def("seq_to_head(Tensor x, int seq_dim=1, int head_dim=2, bool replicate=False) -> Tensor",
          &dsm_torch_ops::seq_to_head);
    m.def("head_to_seq(Tensor x, int heads, int seq_dim=1, int head_dim=2, bool replicate=False) -> Tensor",
          &dsm_torch_ops::head_to_seq);
}
