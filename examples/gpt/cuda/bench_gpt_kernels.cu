/*
 * bench_gpt_kernels.cu: test_gpt_kernels --bench [B T [PEAK]]: the GPT CUDA
 * kernels' times at GPT-2 124M sizes, per kernel (ms, TFLOP/s, GB/s) and for
 * a whole training step's kernels without libdsm (tokens/s, MFU): the
 * kernels' own ceiling for train_gpt --device cuda.
 */
#include "test_util.cuh"

/* ----------------------------------------------------------------- bench */

struct Timer {
    cudaEvent_t a, b;
    Timer() {
        CK(cudaEventCreate(&a));
        CK(cudaEventCreate(&b));
    }
    ~Timer() {
        cudaEventDestroy(a);
        cudaEventDestroy(b);
    }
};

/* Runs f reps times after 2 warm-ups; returns ms per call. */
template <typename F> static float time_ms(F f, int reps) {
    Timer t;
    f();
    f();
    CK(cudaEventRecord(t.a));
    for (int i = 0; i < reps; ++i) f();
    CK(cudaEventRecord(t.b));
    CK(cudaEventSynchronize(t.b));
    float ms;
    CK(cudaEventElapsedTime(&ms, t.a, t.b));
    return ms / reps;
}

static void row(const char *op, float ms, double flop, double bytes) {
    printf("%-34s %9.3f %9.1f %9.1f\n", op, ms, flop > 0 ? flop / ms * 1e-9 : 0.0,
           bytes > 0 ? bytes / ms * 1e-6 : 0.0);
}

static int bench(gpt_cuda_t ctx, int B, int T) {
    const int C = 768, NH = 12, V = 50257, Vp = 50304, reps = 20;
    const size_t BT = (size_t)B * T;
    printf("GPT-2 124M layer sizes: B %d T %d C %d NH %d V %d (Vp %d), bf16, grads bf16\n", B, T,
           C, NH, V, Vp);
    printf("TFLOP/s: 2 * multiply-adds / time (attention: its four T x T products, full\n"
           "squares as computed, not the causal half); GB/s: the bytes each kernel must\n"
           "read and write once / time. Each row: mean of %d calls after 2 warm-ups.\n", reps);
    printf("%-34s %9s %9s %9s\n", "op", "ms", "TFLOP/s", "GB/s");
    Dev x(BT * 4 * C * 2), y(BT * 4 * C * 2), z(BT * 4 * C * 2), w(4 * C * C * 2),
        bias(4 * C * 2), gw(4 * C * C * 2), gb(4 * C * 2), mean(BT * 4), rstd(BT * 4),
        wte((size_t)Vp * C * 2), wpe((size_t)T * C * 2), gwte((size_t)Vp * C * 2),
        gwpe((size_t)T * C * 2), logits(BT * Vp * 2), losses(BT * 4),
        att((size_t)B * NH * T * T * 2), scr(gpt_attention_scratch_bytes(B, T, NH, C / NH));
    CK(cudaMemset(x.p, 0, x.n));
    CK(cudaMemset(w.p, 0, w.n));
    CK(cudaMemset(wte.p, 0, wte.n));
    CK(cudaMemset(wpe.p, 0, wpe.n));
    CK(cudaMemset(gw.p, 0, gw.n));
    CK(cudaMemset(gb.p, 0, gb.n));
    CK(cudaMemset(gwte.p, 0, gwte.n));
    CK(cudaMemset(gwpe.p, 0, gwpe.n));
    CK(cudaMemset(logits.p, 0, logits.n));
    ivec tok(BT), pos(BT);
    for (size_t i = 0; i < BT; ++i) {
        tok[i] = (int64_t)((i * 2654435761u) % V);
        pos[i] = (int64_t)(i % T);
    }
    int64_t *dtok = dev_ids(tok), *dpos = dev_ids(pos);
    const int N = (int)BT, hs = C / NH;
    bf16p qkv = (bf16p)x.p, dqkv = (bf16p)z.p;
    double a = 2.0 * BT, c = C;
    row("encoder_forward", time_ms([&] { GK(gpt_encoder_forward(ctx, y.p, dtok, dpos, wte.p, wpe.p, N, C)); }, reps),
        0, BT * c * 2 * 3);
    row("encoder_backward (host grouping)", time_ms([&] { GK(gpt_encoder_backward(ctx, gwte.p, gwpe.p, GPT_GRAD_BF16, x.p, tok.data(), pos.data(), N, C, Vp, T)); }, reps),
        0, BT * c * 2 * 3);
    row("layernorm_forward", time_ms([&] { GK(gpt_layernorm_forward(ctx, y.p, (float *)mean.p, (float *)rstd.p, x.p, w.p, bias.p, (int)BT, C)); }, reps),
        0, BT * c * 2 * 2);
    row("layernorm_backward", time_ms([&] { GK(gpt_layernorm_backward(ctx, z.p, gw.p, gb.p, GPT_GRAD_BF16, y.p, x.p, w.p, (float *)mean.p, (float *)rstd.p, (int)BT, C)); }, reps),
        0, BT * c * 2 * 4);
    const int shapes[4][2] = {{C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}};
    const char *names[4] = {"c_attn", "attn.c_proj", "c_fc", "mlp.c_proj"};
    for (int s = 0; s < 4; ++s) {
        int IC = shapes[s][0], OC = shapes[s][1];
        char n[64];
        snprintf(n, sizeof n, "matmul_forward %s", names[s]);
        row(n, time_ms([&] { GK(gpt_matmul_forward(ctx, y.p, x.p, w.p, GPT_W_IN_OUT, bias.p, (int)BT, IC, OC)); }, reps),
            a * IC * OC, 0);
        snprintf(n, sizeof n, "matmul_backward %s", names[s]);
        row(n, time_ms([&] { GK(gpt_matmul_backward(ctx, z.p, gw.p, gb.p, GPT_GRAD_BF16, y.p, x.p, w.p, GPT_W_IN_OUT, (int)BT, IC, OC)); }, reps),
            2 * a * IC * OC, 0);
    }
    double attf = 2.0 * B * NH * (double)T * T * (C / NH);
    row("attention_forward", time_ms([&] { GK(gpt_attention_forward(ctx, y.p, C, att.p, qkv, qkv + C, qkv + 2 * C, 3 * C, B, T, NH, hs, scr.p)); }, reps),
        2 * attf, 0);
    row("attention_backward", time_ms([&] { GK(gpt_attention_backward(ctx, dqkv, dqkv + C, dqkv + 2 * C, 3 * C, y.p, C, att.p, qkv, qkv + C, qkv + 2 * C, B, T, NH, hs, scr.p)); }, reps),
        4 * attf, 0);
    row("gelu_forward (4C)", time_ms([&] { GK(gpt_gelu_forward(ctx, y.p, x.p, BT * 4 * C)); }, reps),
        0, BT * 4 * c * 2 * 2);
    row("gelu_backward (4C, +=)", time_ms([&] { GK(gpt_gelu_backward(ctx, z.p, x.p, y.p, BT * 4 * C)); }, reps),
        0, BT * 4 * c * 2 * 4);
    row("residual_backward (both +=)", time_ms([&] { GK(gpt_residual_backward(ctx, z.p, x.p, y.p, BT * C)); }, reps),
        0, BT * c * 2 * 5);
    row("residual_forward", time_ms([&] { GK(gpt_residual_forward(ctx, z.p, x.p, y.p, BT * C)); }, reps),
        0, BT * c * 2 * 3);
    row("matmul_forward lm_head (wte)", time_ms([&] { GK(gpt_matmul_forward(ctx, logits.p, x.p, wte.p, GPT_W_OUT_IN, nullptr, (int)BT, C, Vp)); }, reps),
        a * C * Vp, 0);
    row("fused_classifier", time_ms([&] { GK(gpt_fused_classifier(ctx, logits.p, (float *)losses.p, dtok, 1.f / BT, (int)BT, V, Vp)); }, reps),
        0, BT * (double)Vp * 2 * 3);
    row("matmul_backward lm_head (wte)", time_ms([&] { GK(gpt_matmul_backward(ctx, x.p, gwte.p, nullptr, GPT_GRAD_BF16, logits.p, y.p, wte.p, GPT_W_OUT_IN, (int)BT, C, Vp)); }, reps),
        2 * a * C * Vp, 0);
    cudaFree(dtok);
    cudaFree(dpos);
    return 0;
}

/* One training step's kernels of GPT-2 124M (L blocks on one set of
 * buffers, as the trainer calls them: examples/gpt/gpt_device.c), without
 * libdsm: the kernels' own ceiling for tokens/s and MFU. FLOPs per token:
 * 6 P + 6 L C T (P parameters; attention's 12 L C T of PaLM's appendix B
 * halved for the causal mask, as llm.c counts). */
static void bench_step(gpt_cuda_t ctx, int B, int T, double peak_tflops) {
    const int C = 768, NH = 12, hs = C / NH, L = 12, V = 50257, Vp = 50304, N = B * T, reps = 5;
    const size_t n = (size_t)N, c = C, H = 2;
    const gpt_grad_dtype_t g = GPT_GRAD_BF16;
    Dev wte((size_t)Vp * c * H), wpe((size_t)T * c * H), gwte((size_t)Vp * c * H),
        gwpe((size_t)T * c * H), lnw(c * H), lnb(c * H), glnw(c * H), glnb(c * H),
        qkvw(3 * c * c * H), qkvb(3 * c * H), projw(c * c * H), projb(c * H), fcw(4 * c * c * H),
        fcb(4 * c * H), fcpw(4 * c * c * H), fcpb(c * H), gqkvw(3 * c * c * H), gqkvb(3 * c * H),
        gprojw(c * c * H), gprojb(c * H), gfcw(4 * c * c * H), gfcb(4 * c * H),
        gfcpw(4 * c * c * H), gfcpb(c * H), enc(n * c * H), ln1(n * c * H), qkv(3 * n * c * H),
        att((size_t)B * NH * T * T * H), atty(n * c * H), res2(n * c * H), ln2(n * c * H),
        fch(4 * n * c * H), fchg(4 * n * c * H), res3(n * c * H), lnf(n * c * H),
        logits(n * Vp * H), losses(n * 4), mean(n * 4), rstd(n * 4), dres(n * c * H),
        dln(n * c * H), dqkv(3 * n * c * H), datty(n * c * H), dfch(4 * n * c * H),
        dfchg(4 * n * c * H), dlnf(n * c * H), scr(gpt_attention_scratch_bytes(B, T, NH, hs));
    for (Dev *d : {&wte, &wpe, &lnw, &lnb, &qkvw, &qkvb, &projw, &projb, &fcw, &fcb, &fcpw, &fcpb,
                   &enc, &logits, &gwte, &gwpe, &glnw, &glnb, &gqkvw, &gqkvb, &gprojw, &gprojb,
                   &gfcw, &gfcb, &gfcpw, &gfcpb})
        CK(cudaMemset(d->p, 0, d->n));
    ivec tok(n), pos(n);
    for (size_t i = 0; i < n; ++i) {
        tok[i] = (int64_t)((i * 2654435761u) % V);
        pos[i] = (int64_t)(i % T);
    }
    int64_t *dtok = dev_ids(tok), *dpos = dev_ids(pos);
    char *q = (char *)qkv.p, *dq = (char *)dqkv.p;
    cudaStream_t st = nullptr; /* the context's stream is the caller's: sync all */
    auto step = [&] {
        GK(gpt_encoder_forward(ctx, enc.p, dtok, dpos, wte.p, wpe.p, N, C));
        const void *x = enc.p;
        for (int l = 0; l < L; ++l) {
            GK(gpt_layernorm_forward(ctx, ln1.p, (float *)mean.p, (float *)rstd.p, x, lnw.p, lnb.p, N, C));
            GK(gpt_matmul_forward(ctx, qkv.p, ln1.p, qkvw.p, GPT_W_IN_OUT, qkvb.p, N, C, 3 * C));
            GK(gpt_attention_forward(ctx, atty.p, C, att.p, q, q + 2 * c, q + 4 * c, 3 * C, B, T, NH, hs, scr.p));
            GK(gpt_matmul_forward(ctx, ln2.p, atty.p, projw.p, GPT_W_IN_OUT, projb.p, N, C, C));
            GK(gpt_residual_forward(ctx, res2.p, x, ln2.p, n * c));
            GK(gpt_layernorm_forward(ctx, ln2.p, (float *)mean.p, (float *)rstd.p, res2.p, lnw.p, lnb.p, N, C));
            GK(gpt_matmul_forward(ctx, fch.p, ln2.p, fcw.p, GPT_W_IN_OUT, fcb.p, N, C, 4 * C));
            GK(gpt_gelu_forward(ctx, fchg.p, fch.p, 4 * n * c));
            GK(gpt_matmul_forward(ctx, res3.p, fchg.p, fcpw.p, GPT_W_IN_OUT, fcpb.p, N, 4 * C, C));
            GK(gpt_residual_forward(ctx, res3.p, res2.p, res3.p, n * c));
            x = enc.p; /* one set of buffers: every block reads the embeddings */
        }
        GK(gpt_layernorm_forward(ctx, lnf.p, (float *)mean.p, (float *)rstd.p, res3.p, lnw.p, lnb.p, N, C));
        GK(gpt_matmul_forward(ctx, logits.p, lnf.p, wte.p, GPT_W_OUT_IN, nullptr, N, C, Vp));
        GK(gpt_fused_classifier(ctx, logits.p, (float *)losses.p, dtok, 1.f / N, N, V, Vp));
        CK(cudaMemsetAsync(dlnf.p, 0, dlnf.n, st));
        GK(gpt_matmul_backward(ctx, dlnf.p, gwte.p, nullptr, g, logits.p, lnf.p, wte.p, GPT_W_OUT_IN, N, C, Vp));
        CK(cudaMemsetAsync(dres.p, 0, dres.n, st));
        GK(gpt_layernorm_backward(ctx, dres.p, glnw.p, glnb.p, g, dlnf.p, res3.p, lnw.p, (float *)mean.p, (float *)rstd.p, N, C));
        for (int l = 0; l < L; ++l) {
            for (Dev *d : {&dfchg, &dfch, &dln, &datty}) CK(cudaMemsetAsync(d->p, 0, d->n, st));
            GK(gpt_matmul_backward(ctx, dfchg.p, gfcpw.p, gfcpb.p, g, dres.p, fchg.p, fcpw.p, GPT_W_IN_OUT, N, 4 * C, C));
            GK(gpt_gelu_backward(ctx, dfch.p, fch.p, dfchg.p, 4 * n * c));
            GK(gpt_matmul_backward(ctx, dln.p, gfcw.p, gfcb.p, g, dfch.p, ln2.p, fcw.p, GPT_W_IN_OUT, N, C, 4 * C));
            GK(gpt_layernorm_backward(ctx, dres.p, glnw.p, glnb.p, g, dln.p, res2.p, lnw.p, (float *)mean.p, (float *)rstd.p, N, C));
            GK(gpt_matmul_backward(ctx, datty.p, gprojw.p, gprojb.p, g, dres.p, atty.p, projw.p, GPT_W_IN_OUT, N, C, C));
            GK(gpt_attention_backward(ctx, dq, dq + 2 * c, dq + 4 * c, 3 * C, datty.p, C, att.p, q, q + 2 * c, q + 4 * c, B, T, NH, hs, scr.p));
            CK(cudaMemsetAsync(dln.p, 0, dln.n, st));
            GK(gpt_matmul_backward(ctx, dln.p, gqkvw.p, gqkvb.p, g, dqkv.p, ln1.p, qkvw.p, GPT_W_IN_OUT, N, C, 3 * C));
            GK(gpt_layernorm_backward(ctx, dres.p, glnw.p, glnb.p, g, dln.p, enc.p, lnw.p, (float *)mean.p, (float *)rstd.p, N, C));
        }
        GK(gpt_encoder_backward(ctx, gwte.p, gwpe.p, g, dres.p, tok.data(), pos.data(), N, C, Vp, T));
        CK(cudaDeviceSynchronize()); /* as the trainer's loss read does */
    };
    step();
    Timer t;
    CK(cudaEventRecord(t.a));
    for (int r = 0; r < reps; ++r) step();
    CK(cudaEventRecord(t.b));
    CK(cudaEventSynchronize(t.b));
    float ms;
    CK(cudaEventElapsedTime(&ms, t.a, t.b));
    ms /= reps;
    double P = (double)Vp * C + (double)T * C + L * (12.0 * C * C + 13.0 * C) + 2.0 * C;
    double flops = (6 * P + 6.0 * L * C * T) * N;
    printf("\nstep of GPT-2 124M (L %d, %.1fM parameters, B %d T %d, kernels only, no libdsm):\n",
           L, P / 1e6, B, T);
    printf("  %.2f ms, %.0f tokens/s, %.1f TFLOP/s (FLOPs/token 6P + 6LCT)", ms, N / (ms * 1e-3),
           flops / (ms * 1e-3) / 1e12);
    if (peak_tflops > 0)
        printf(", MFU %.1f%% of %.0f TFLOP/s bf16 dense\n",
               100.0 * flops / (ms * 1e-3) / (peak_tflops * 1e12), peak_tflops);
    else
        printf(" (no MFU: pass the device's bf16 dense peak in TFLOP/s as the 4th argument)\n");
    cudaFree(dtok);
    cudaFree(dpos);
}

int gpt_kernels_bench(gpt_cuda_t ctx, const cudaDeviceProp &prop, int argc, char **argv) {
    int B = argc > 2 ? atoi(argv[2]) : 4, T = argc > 3 ? atoi(argv[3]) : 1024;
    if (B <= 0 || T <= 0) {
        fprintf(stderr, "--bench B T: bad sizes B %s T %s\n", argc > 2 ? argv[2] : "", argc > 3 ? argv[3] : "");
        return 2;
    }
    /* bf16 dense peaks of the data-center parts (SXM), unless given */
    double peak = argc > 4 ? atof(argv[4])
                  : strstr(prop.name, "H100") || strstr(prop.name, "H200") ? 989.4
                  : strstr(prop.name, "B200")                              ? 2250.0
                  : strstr(prop.name, "A100")                              ? 312.0
                                                                           : 0.0;
    int rc = bench(ctx, B, T);
    bench_step(ctx, B, T, peak);
    return rc;
}
