// DeepSpeed's batch arithmetic: train_batch_size (TB),
// train_micro_batch_size_per_gpu (MB), gradient_accumulation_steps (GAS) and
// the data-parallel size W, with DeepSpeed's derivation rules and messages.
#include "config/config.hpp"

#include "core/error.hpp"

namespace dsm {
namespace config {

namespace {

// Python's a // b (floor division), as DeepSpeed computes; b != 0.
int64_t floordiv(int64_t a, int64_t b) {
    int64_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
    return q;
}

int64_t mul(int64_t a, int64_t b) {
    int64_t r = 0;
    DSM_REQUIRE(!__builtin_mul_overflow(a, b, &r), DSM_ERR_CONFIG, "batch arithmetic overflows: ", a, " * ",
                b);
    return r;
}

// DeepSpeed's wording, then the value's origin: the key the user gave
// ("train_micro_batch_size_per_gpu = -1") or how libdsm derived it.
[[noreturn]] void not_positive(const char *what, int64_t v, const std::string &origin) {
    DSM_FAIL(DSM_ERR_CONFIG, what, ": ", v, " has to be greater than 0 (", origin, ")");
}

} // namespace

void resolve_batch(Config &cfg, const int64_t *tb, const int64_t *mb, const int64_t *gas, int64_t w,
                   const std::string &w_note) {
    cfg.train_batch_size_given = tb != nullptr;
    cfg.train_micro_batch_size_per_gpu_given = mb != nullptr;
    cfg.gradient_accumulation_steps_given = gas != nullptr;
    int64_t t = tb ? *tb : 0, m = mb ? *mb : 0, g = gas ? *gas : 0;
    // A given value that is not positive is reported as given, before it
    // enters the derivation (where a micro batch of -1 would surface as a
    // train batch of -W).
    if (tb && t <= 0) not_positive("Train batch size", t, cat("train_batch_size = ", t));
    if (mb && m <= 0) not_positive("Micro batch size per gpu", m, cat("train_micro_batch_size_per_gpu = ", m));
    if (gas && g <= 0) not_positive("Gradient accumulation steps", g, cat("gradient_accumulation_steps = ", g));
    // How each value came about, for the messages below.
    std::string t_from = cat("train_batch_size = ", t), m_from = cat("train_micro_batch_size_per_gpu = ", m),
                g_from = cat("gradient_accumulation_steps = ", g);
    if (tb && mb && gas) {
        // all given: nothing to derive
    } else if (tb && mb) {
        g = floordiv(floordiv(t, m), w);
        g_from = cat("derived: gradient_accumulation_steps = train_batch_size ", t,
                     " // train_micro_batch_size_per_gpu ", m, " // world_size ", w);
    } else if (tb && gas) {
        m = floordiv(floordiv(t, w), g);
        m_from = cat("derived: train_micro_batch_size_per_gpu = train_batch_size ", t, " // world_size ", w,
                     " // gradient_accumulation_steps ", g);
    } else if (mb && gas) {
        t = mul(mul(m, g), w);
    } else if (tb) {
        g = 1;
        m = floordiv(t, w);
        m_from = cat("derived: train_micro_batch_size_per_gpu = train_batch_size ", t, " // world_size ", w);
    } else if (mb) {
        t = mul(m, w);
        g = 1;
    } else {
        DSM_FAIL(DSM_ERR_CONFIG, "Either train_batch_size or train_micro_batch_size_per_gpu needs to be provided");
    }
    cfg.train_batch_size = t;
    cfg.train_micro_batch_size_per_gpu = m;
    cfg.gradient_accumulation_steps = g;

    if (t <= 0) not_positive("Train batch size", t, t_from);
    if (m <= 0) not_positive("Micro batch size per gpu", m, m_from);
    if (g <= 0) not_positive("Gradient accumulation steps", g, g_from);
    DSM_REQUIRE(t == mul(mul(m, g), w), DSM_ERR_CONFIG,
                "Check batch related parameters. train_batch_size is not equal to "
                "micro_batch_per_gpu * gradient_acc_step * world_size ",
                t, " != ", m, " * ", g, " * ", w, w_note.empty() ? "" : " (", w_note, w_note.empty() ? "" : ")");
}

void resolve_data_parallel(Config &cfg, const ConfigContext &ctx, bool sp_given) {
    DSM_REQUIRE(ctx.world_size >= 1, DSM_ERR_CONFIG, "world size: expected an integer >= 1, got ", ctx.world_size);
    DSM_REQUIRE(ctx.mesh_data_parallel >= 0, DSM_ERR_CONFIG,
                "mesh data-parallel size: expected an integer >= 0, got ", ctx.mesh_data_parallel);
    cfg.world_size = ctx.world_size;
    if (ctx.mesh_data_parallel > 0) {
        cfg.data_parallel_world_size = ctx.mesh_data_parallel;
        cfg.data_parallel_source = "mesh";
    } else if (sp_given) {
        int64_t sp = cfg.sequence_parallel_size;
        DSM_REQUIRE(ctx.world_size % sp == 0, DSM_ERR_CONFIG, "sequence_parallel_size: ", sp,
                    " does not divide the world size ", ctx.world_size,
                    ", so the data-parallel size world / sequence_parallel_size is not an integer");
        cfg.data_parallel_world_size = ctx.world_size / sp;
        cfg.data_parallel_source = "sequence_parallel_size";
    } else {
        cfg.data_parallel_world_size = ctx.world_size;
        cfg.data_parallel_source = "world";
    }
    if (ctx.mesh_sequence_parallel > 0) {
        // The mesh decides; a configuration that names another size above 1 contradicts it.
        DSM_REQUIRE(!sp_given || cfg.sequence_parallel_size == 1 ||
                        cfg.sequence_parallel_size == ctx.mesh_sequence_parallel,
                    DSM_ERR_CONFIG, "sequence_parallel_size: the configuration says ", cfg.sequence_parallel_size,
                    " but the mesh's sequence_parallel dimension has ", ctx.mesh_sequence_parallel, " ranks");
        cfg.sequence_parallel_size = ctx.mesh_sequence_parallel;
    }
    if (cfg.data_parallel_size > 0)
        DSM_REQUIRE(cfg.data_parallel_size == cfg.data_parallel_world_size, DSM_ERR_CONFIG,
                    "data_parallel_size: ", cfg.data_parallel_size, " differs from the data-parallel size ",
                    cfg.data_parallel_world_size, " of this job (from the ", cfg.data_parallel_source, ")");
}

} // namespace config
} // namespace dsm
