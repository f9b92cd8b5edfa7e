/*
 * The CUDA path's kernels against plain fp32 C references on small sizes,
 * and (--bench, bench_gpt_kernels.cu) their times at GPT-2 124M sizes. The
 * references are in test_reference.cuh, the shared helpers in test_util.cuh.
 *
 * Each check runs the kernel on bf16 inputs and the reference on the same
 * values widened to fp32, then compares: the error of a tensor is
 * max|gpu - ref| / max(max|ref|, 1e-6) (relative to the tensor's scale),
 * and must stay below TOL_OP = 1.6e-2 (two bf16 roundings, 2^-8 each, with
 * margin) for a single kernel, TOL_CHAIN = 4e-2 where bf16 intermediates
 * are rounded on the way (attention: probabilities and head products in
 * bf16; backward GEMMs fed by them). fp32 gradient buffers get the same
 * tolerance: their inputs (dout, activations) are bf16 anyway.
 *
 * Then a whole tiny GPT-2 (2 blocks) forward and backward, called as the
 * trainer calls the kernels, against the same model composed of the
 * references: the loss within 1e-2, each parameter gradient within
 * TOL_MODEL = 6e-2 of its scale (bf16 activations all along).
 *
 * Without a usable GPU it prints a line saying so and exits 77 (automake's
 * skip).
 *
 *   test_gpt_kernels            correctness checks, exit 0 / 1 / 77
 *   test_gpt_kernels --bench [B T [PEAK]]  times per kernel and of a whole
 *       step's kernels at GPT-2 124M sizes (default B 4, T 1024; PEAK: the
 *       device's bf16 dense TFLOP/s for the MFU, else H100/H200/B200/A100
 *       SXM figures by name)
 */
#include "test_reference.cuh"

static const float TOL_OP = 1.6e-2f, TOL_CHAIN = 4e-2f;

/* ---------------------------------------------------------------- checks */

static const char *gname(gpt_grad_dtype_t g) { return g == GPT_GRAD_BF16 ? "bf16" : "fp32"; }

static void check_encoder(gpt_cuda_t ctx, gpt_grad_dtype_t gdt) {
    /* positions offset as on a sequence-parallel rank (tokens 8.. of 24) */
    const int B = 3, T = 7, C = 40, V = 11, maxT = 24, N = B * T;
    ivec tok(N), pos(N);
    for (int i = 0; i < N; ++i) {
        tok[i] = (i * 7 + i / 5) % V; /* repeats */
        pos[i] = 8 + i % T;
    }
    vec wte = rnd((size_t)V * C), wpe = rnd((size_t)maxT * C), dout = rnd((size_t)N * C);
    vec dwte = rnd((size_t)V * C, 0.5f), dwpe = rnd((size_t)maxT * C, 0.5f);
    int64_t *dtok = dev_ids(tok), *dpos = dev_ids(pos);
    Dev Dwte(wte), Dwpe(wpe), Dout{vec((size_t)N * C)}, Ddout(dout);
    Dev Gwte(dwte, gdt == GPT_GRAD_F32), Gwpe(dwpe, gdt == GPT_GRAD_F32);
    GK(gpt_encoder_forward(ctx, Dout.p, dtok, dpos, Dwte.p, Dwpe.p, N, C));
    GK(gpt_encoder_backward(ctx, Gwte.p, Gwpe.p, gdt, Ddout.p, tok.data(), pos.data(), N, C, V,
                            maxT));
    vec out((size_t)N * C);
    ref_encoder_fwd(out, tok, pos, wte, wpe, N, C);
    ref_encoder_bwd(dwte, dwpe, dout, tok, pos, N, C);
    char w[80];
    compare("encoder_forward out", Dout.get(), out, TOL_OP);
    snprintf(w, sizeof w, "encoder_backward dwte (%s, +=)", gname(gdt));
    compare(w, Gwte.get(), dwte, TOL_OP);
    snprintf(w, sizeof w, "encoder_backward dwpe (%s, +=)", gname(gdt));
    compare(w, Gwpe.get(), dwpe, TOL_OP);
    /* a bad id is an error naming it, and nothing is written */
    tok[5] = V;
    bad(ctx, "encoder_backward token 11 of 11",
        gpt_encoder_backward(ctx, Gwte.p, Gwpe.p, gdt, Ddout.p, tok.data(), pos.data(), N, C, V, maxT),
        "token 11 at row 5");
    tok[5] = 0;
    pos[3] = -1;
    bad(ctx, "encoder_backward position -1",
        gpt_encoder_backward(ctx, Gwte.p, Gwpe.p, gdt, Ddout.p, tok.data(), pos.data(), N, C, V, maxT),
        "position -1 at row 3");
    compare("encoder_backward: bad ids wrote nothing", Gwte.get(), dwte, TOL_OP);
    cudaFree(dtok);
    cudaFree(dpos);
}

static void check_layernorm(gpt_cuda_t ctx, gpt_grad_dtype_t gdt) {
    const int N = 37, C = 72;
    vec x = rnd((size_t)N * C, 2.f), w = rnd(C), b = rnd(C), dout = rnd((size_t)N * C);
    for (auto &v : x) v = bfround(v + 0.5f); /* a mean away from 0 */
    vec dx = rnd((size_t)N * C), dw = rnd(C, 0.5f), db = rnd(C, 0.5f);
    Dev Dx(x), Dw(w), Db(b), Dout(x), Ddout(dout), Ddx(dx);
    Dev Gw(dw, gdt == GPT_GRAD_F32), Gb(db, gdt == GPT_GRAD_F32);
    Dev Dmean(vec(N), true), Drstd(vec(N), true);
    GK(gpt_layernorm_forward(ctx, Dout.p, (float *)Dmean.p, (float *)Drstd.p, Dx.p, Dw.p, Db.p, N, C));
    GK(gpt_layernorm_backward(ctx, Ddx.p, Gw.p, Gb.p, gdt, Ddout.p, Dx.p, Dw.p, (const float *)Dmean.p,
                              (const float *)Drstd.p, N, C));
    vec out((size_t)N * C), mean(N), rstd(N);
    ref_layernorm_fwd(out, mean, rstd, x, w, b, N, C);
    ref_layernorm_bwd(dx, dw, db, dout, x, w, mean, rstd, N, C);
    char s[80];
    compare("layernorm_forward out", Dout.get(), out, TOL_OP);
    compare("layernorm_forward mean (fp32)", Dmean.get(), mean, 1e-5f);
    compare("layernorm_forward rstd (fp32)", Drstd.get(), rstd, 1e-4f);
    compare("layernorm_backward dinp (+=)", Ddx.get(), dx, TOL_OP);
    snprintf(s, sizeof s, "layernorm_backward dweight (%s, +=)", gname(gdt));
    compare(s, Gw.get(), dw, TOL_OP);
    snprintf(s, sizeof s, "layernorm_backward dbias (%s, +=)", gname(gdt));
    compare(s, Gb.get(), db, TOL_OP);
}

/* skew: every pointer moved by that many bf16 elements (or fp32 for fp32
 * gradients), as a parameter inside a flat buffer may be: 2-byte aligned
 * matrices and an unaligned bias. */
static void check_matmul(gpt_cuda_t ctx, gpt_grad_dtype_t gdt, gpt_wlayout_t wl, bool with_bias,
                         int skew = 0) {
    const int N = 24, IC = 64, OC = 40;
    bool in_out = wl == GPT_W_IN_OUT;
    vec x = rnd((size_t)N * IC), W = rnd((size_t)IC * OC, 0.2f), bias = rnd(OC);
    vec dout = rnd((size_t)N * OC), dW = rnd((size_t)IC * OC, 0.5f), db = rnd(OC, 0.5f);
    vec dx = rnd((size_t)N * IC, 0.5f);
    Dev Dx(x), DW(W), Db(bias), Dout(vec((size_t)N * OC)), Ddout(dout), Ddx(dx);
    Dev GW(dW, gdt == GPT_GRAD_F32), Gb(db, gdt == GPT_GRAD_F32);
    if (skew) {
        for (Dev *d : {&Dx, &DW, &Db, &Dout, &Ddout, &Ddx, &GW, &Gb}) d->shift(skew);
    }
    GK(gpt_matmul_forward(ctx, Dout.p, Dx.p, DW.p, wl, with_bias ? Db.p : nullptr, N, IC, OC));
    GK(gpt_matmul_backward(ctx, Ddx.p, GW.p, with_bias ? Gb.p : nullptr, gdt, Ddout.p, Dx.p, DW.p,
                           wl, N, IC, OC));
    vec out((size_t)N * OC), db0 = db;
    ref_matmul_fwd(out, x, W, in_out, with_bias ? &bias : nullptr, N, IC, OC);
    ref_matmul_bwd(dx, dW, db, dout, x, W, in_out, N, IC, OC);
    char s[96], l[48];
    snprintf(l, sizeof l, "%s", in_out ? "in_out" : "out_in");
    if (skew) snprintf(l + strlen(l), sizeof l - strlen(l), " skewed %d", skew);
    snprintf(s, sizeof s, "matmul_forward %s%s", l, with_bias ? " +bias" : "");
    compare(s, Dout.get(), out, TOL_OP);
    snprintf(s, sizeof s, "matmul_backward %s dinp (+=)", l);
    compare(s, Ddx.get(), dx, TOL_OP);
    snprintf(s, sizeof s, "matmul_backward %s dweight (%s, +=)", l, gname(gdt));
    compare(s, GW.get(), dW, TOL_OP);
    snprintf(s, sizeof s, "matmul_backward %s dbias (%s, +=)%s", l, gname(gdt),
             with_bias ? "" : " untouched");
    compare(s, Gb.get(), with_bias ? db : db0, TOL_OP);
}

/* On a fused qkv (stride 3C), then on separate q, k, v tensors (stride C)
 * with a wider output row (ostride C + 8), against the same reference. */
static void check_attention(gpt_cuda_t ctx) {
    const int B = 2, T = 19, C = 32, NH = 4, hs = C / NH, N = B * T;
    vec qkv = rnd((size_t)N * 3 * C, 1.5f), dout = rnd((size_t)N * C);
    vec out((size_t)N * C), att((size_t)B * NH * T * T), dqkv((size_t)N * 3 * C);
    ref_attention_fwd(out, att, qkv, B, T, C, NH);
    ref_attention_bwd(dqkv, dout, qkv, att, B, T, C, NH);
    Dev Datt{vec(att.size())}, Dscr(gpt_attention_scratch_bytes(B, T, NH, hs));
    {
        Dev Dqkv(qkv), Dout{vec((size_t)N * C)}, Ddout(dout), Ddqkv{vec(qkv.size(), 7.f)};
        bf16p q = (bf16p)Dqkv.p, dq = (bf16p)Ddqkv.p;
        GK(gpt_attention_forward(ctx, Dout.p, C, Datt.p, q, q + C, q + 2 * C, 3 * C, B, T, NH, hs,
                                 Dscr.p));
        GK(gpt_attention_backward(ctx, dq, dq + C, dq + 2 * C, 3 * C, Ddout.p, C, Datt.p, q, q + C,
                                  q + 2 * C, B, T, NH, hs, Dscr.p));
        compare("attention_forward att (zeros above diagonal)", Datt.get(), att, TOL_OP);
        compare("attention_forward out (fused qkv)", Dout.get(), out, TOL_CHAIN);
        compare("attention_backward dqkv (overwritten)", Ddqkv.get(), dqkv, TOL_CHAIN);
    }
    const int os = C + 8;
    vec part[3], dpart[3], wide((size_t)N * os), dwide((size_t)N * os, 0.f), outw((size_t)N * os);
    for (int k = 0; k < 3; ++k) {
        part[k].resize((size_t)N * C);
        dpart[k].resize((size_t)N * C);
        for (int n = 0; n < N; ++n)
            for (int c = 0; c < C; ++c) {
                part[k][(size_t)n * C + c] = qkv[(size_t)n * 3 * C + k * C + c];
                dpart[k][(size_t)n * C + c] = dqkv[(size_t)n * 3 * C + k * C + c];
            }
    }
    for (int n = 0; n < N; ++n)
        for (int c = 0; c < os; ++c) {
            wide[(size_t)n * os + c] = c < C ? out[(size_t)n * C + c] : -3.f;
            dwide[(size_t)n * os + c] = c < C ? dout[(size_t)n * C + c] : 0.f;
            outw[(size_t)n * os + c] = -3.f; /* the gap must stay */
        }
    Dev Dq(part[0]), Dk(part[1]), Dv(part[2]), Dout(outw), Ddout(dwide);
    Dev Ddq{vec((size_t)N * C)}, Ddk{vec((size_t)N * C)}, Ddv{vec((size_t)N * C)};
    GK(gpt_attention_forward(ctx, Dout.p, os, Datt.p, Dq.p, Dk.p, Dv.p, C, B, T, NH, hs, Dscr.p));
    GK(gpt_attention_backward(ctx, Ddq.p, Ddk.p, Ddv.p, C, Ddout.p, os, Datt.p, Dq.p, Dk.p, Dv.p, B,
                              T, NH, hs, Dscr.p));
    compare("attention_forward out (separate, ostride)", Dout.get(), wide, TOL_CHAIN);
    compare("attention_backward dq (separate)", Ddq.get(), dpart[0], TOL_CHAIN);
    compare("attention_backward dk (separate)", Ddk.get(), dpart[1], TOL_CHAIN);
    compare("attention_backward dv (separate)", Ddv.get(), dpart[2], TOL_CHAIN);
}

static void check_elementwise(gpt_cuda_t ctx) {
    const size_t n = 3001;
    vec x = rnd(n, 4.f), y = rnd(n), dout = rnd(n), d0 = rnd(n, 0.5f), d1 = rnd(n, 0.5f);
    Dev Dx(x), Dy(y), Dout{vec(n)}, Ddout(dout), Dres{vec(n)}, Ddx(d0), Dda(d0), Ddb(d1);
    vec g(n), dg(n), r(n), da(n), db(n);
    for (size_t i = 0; i < n; ++i) {
        g[i] = gelu(x[i]);
        dg[i] = d0[i] + dout[i] * gelu_grad(x[i]);
        r[i] = x[i] + y[i];
        da[i] = d0[i] + dout[i];
        db[i] = d1[i] + dout[i];
    }
    GK(gpt_gelu_forward(ctx, Dout.p, Dx.p, n));
    compare("gelu_forward", Dout.get(), g, TOL_OP);
    GK(gpt_gelu_backward(ctx, Ddx.p, Dx.p, Ddout.p, n));
    compare("gelu_backward (+=)", Ddx.get(), dg, TOL_OP);
    GK(gpt_residual_forward(ctx, Dres.p, Dx.p, Dy.p, n));
    compare("residual_forward", Dres.get(), r, TOL_OP);
    Dev Dx32(x, true), Dc16{vec(n)}, Dc32(vec(n), true);
    GK(gpt_cast(ctx, Dc16.p, 0, Dx32.p, 1, n));
    GK(gpt_cast(ctx, Dc32.p, 1, Dc16.p, 0, n));
    compare("cast fp32 -> bf16 (exact on bf16 values)", Dc16.get(), x, 0.f);
    compare("cast bf16 -> fp32", Dc32.get(), x, 0.f);
    {
        /* bits, against the host's rounding (libdsm's dsm_convert): ties to
         * even, infinities, the largest finite values, subnormals, and NaNs,
         * which keep their sign and payload's top bits and become quiet */
        const uint32_t in[] = {0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x7f7fffffu, 0xff7fffffu, 0x7f800000u,
                               0xff800000u, 0x00000001u, 0x80008000u, 0x7fc00000u, 0xffc00000u, 0x7f800001u,
                               0xff812345u, 0x7fbfffffu, 0x7fe5a000u, 0x00000000u, 0x80000000u};
        const size_t m = sizeof in / sizeof in[0];
        Dev Din(m * 4), Dout(m * 2);
        CK(cudaMemcpy(Din.p, in, sizeof in, cudaMemcpyHostToDevice));
        GK(gpt_cast(ctx, Dout.p, 0, Din.p, 1, m));
        uint16_t got[sizeof in / sizeof in[0]];
        CK(cudaMemcpy(got, Dout.p, sizeof got, cudaMemcpyDeviceToHost));
        int bad = 0;
        for (size_t i = 0; i < m; ++i) {
            uint32_t u = in[i];
            uint16_t want = (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)((u >> 16) | 0x0040u)
                                                          : (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
            if (got[i] != want) {
                if (!bad) printf("    0x%08x: got 0x%04x want 0x%04x\n", u, got[i], want);
                ++bad;
            }
        }
        printf("%-44s %s  %d of %zu differ\n", "cast fp32 -> bf16 bits (NaN, inf, ties)", bad ? "FAIL" : "ok  ", bad, m);
        failures += bad != 0;
    }
    GK(gpt_residual_backward(ctx, Dda.p, Ddb.p, Ddout.p, n));
    compare("residual_backward da (+=)", Dda.get(), da, TOL_OP);
    compare("residual_backward db (+=)", Ddb.get(), db, TOL_OP);
}

static void check_classifier(gpt_cuda_t ctx) {
    const int N = 9, V = 1000, Vp = 1024;
    vec logits = rnd((size_t)N * Vp, 6.f);
    ivec tg(N);
    for (int i = 0; i < N; ++i) tg[i] = (i * 397) % V;
    tg[3] = -100; /* ignored row, as the host path marks them */
    int64_t *dtg = dev_ids(tg);
    float dloss = 1.f / (N - 1);
    Dev Dl(logits), Dloss(vec(N), true);
    GK(gpt_fused_classifier(ctx, Dl.p, (float *)Dloss.p, dtg, dloss, N, V, Vp));
    vec dl((size_t)N * Vp), losses(N);
    ref_classifier(dl, losses, logits, tg, dloss, N, V, Vp);
    compare("fused_classifier losses (fp32)", Dloss.get(), losses, 1e-4f);
    compare("fused_classifier dlogits (padding zero)", Dl.get(), dl, TOL_OP);
    /* dloss 0 (no counted token in the batch): the same losses, and a zero
     * gradient, which the backward reads in place of the logits */
    Dl.put(logits);
    GK(gpt_fused_classifier(ctx, Dl.p, (float *)Dloss.p, dtg, 0.f, N, V, Vp));
    compare("fused_classifier dloss 0: losses (fp32)", Dloss.get(), losses, 1e-4f);
    compare("fused_classifier dloss 0: dlogits all zero", Dl.get(), vec((size_t)N * Vp, 0.f), 0.f);
    cudaFree(dtg);
}

/* A whole tiny GPT-2 (2 blocks), forward and backward, called as the
 * trainer calls the kernels (examples/gpt/gpt_device.c), against the same
 * model composed of the fp32 references: the mean loss, and every
 * parameter's gradient (bf16, accumulated onto random initial values).
 * Activations are rounded to bf16 at every step on the GPU, so the
 * tolerance is TOL_MODEL = 6e-2 of each gradient's scale. */
static const float TOL_MODEL = 6e-2f;
enum { P_LN1W, P_LN1B, P_QKVW, P_QKVB, P_PROJW, P_PROJB, P_LN2W, P_LN2B, P_FCW, P_FCB, P_FCPW, P_FCPB, P_N };

static void check_model(gpt_cuda_t ctx, bool no_counted_token = false) {
    const int B = 2, T = 8, C = 32, NH = 4, hs = C / NH, L = 2, V = 50, Vp = 64, N = B * T;
    const size_t n = (size_t)N, c = C;
    const size_t psz[P_N] = {c, c, 3 * c * c, 3 * c, c * c, c, c, c, 4 * c * c, 4 * c, 4 * c * c, c};
    /* parameters (bf16 values), gradients' initial values, tokens */
    vec wte = rnd((size_t)Vp * c, 0.3f), wpe = rnd((size_t)T * c, 0.3f);
    for (size_t i = (size_t)V * c; i < (size_t)Vp * c; ++i) wte[i] = 0.f; /* padded rows */
    vec lnfw = rnd(c, 0.2f), lnfb = rnd(c, 0.2f);
    for (auto &x : lnfw) x = bfround(1.f + x);
    std::vector<vec> P((size_t)L * P_N), G((size_t)L * P_N);
    for (int l = 0; l < L; ++l)
        for (int k = 0; k < P_N; ++k) {
            P[(size_t)l * P_N + k] = rnd(psz[k], k == P_FCPW || k == P_PROJW ? 0.1f : 0.3f);
            if (k == P_LN1W || k == P_LN2W)
                for (auto &x : P[(size_t)l * P_N + k]) x = bfround(1.f + x);
            G[(size_t)l * P_N + k] = rnd(psz[k], 0.01f);
        }
    vec gwte = rnd((size_t)Vp * c, 0.01f), gwpe = rnd((size_t)T * c, 0.01f);
    vec glnfw = rnd(c, 0.01f), glnfb = rnd(c, 0.01f);
    ivec tok(n), pos(n), lab(n);
    for (int i = 0; i < N; ++i) {
        tok[i] = (i * 13 + 5) % V;
        pos[i] = i % T;
        lab[i] = (i * 7 + 3) % V;
    }
    lab[N - 1] = -100;
    /* no counted token (a micro-batch of T = 1): dloss 0, and every
     * gradient must stay as it was, as on the host */
    if (no_counted_token)
        for (int i = 0; i < N; ++i) lab[i] = -100;
    const int counted = no_counted_token ? 0 : N - 1;
    const float dloss = counted ? 1.f / counted : 0.f;
    const char *pre = no_counted_token ? "model, no counted token:" : "model:";

    /* ---- the reference, fp32 */
    struct Acts { vec ln1, m1, r1, qkv, att, atty, proj, res2, ln2, m2, r2, fch, fchg, fcp, res3; };
    std::vector<Acts> A((size_t)L);
    vec enc(n * c);
    ref_encoder_fwd(enc, tok, pos, wte, wpe, N, C);
    const vec *x = &enc;
    for (int l = 0; l < L; ++l) {
        Acts &a = A[(size_t)l];
        const vec *p = &P[(size_t)l * P_N];
        a.ln1.resize(n * c); a.m1.resize(n); a.r1.resize(n); a.qkv.resize(3 * n * c);
        a.att.resize((size_t)B * NH * T * T); a.atty.resize(n * c); a.proj.resize(n * c);
        a.res2.resize(n * c); a.ln2.resize(n * c); a.m2.resize(n); a.r2.resize(n);
        a.fch.resize(4 * n * c); a.fchg.resize(4 * n * c); a.fcp.resize(n * c); a.res3.resize(n * c);
        ref_layernorm_fwd(a.ln1, a.m1, a.r1, *x, p[P_LN1W], p[P_LN1B], N, C);
        ref_matmul_fwd(a.qkv, a.ln1, p[P_QKVW], true, &p[P_QKVB], N, C, 3 * C);
        ref_attention_fwd(a.atty, a.att, a.qkv, B, T, C, NH);
        ref_matmul_fwd(a.proj, a.atty, p[P_PROJW], true, &p[P_PROJB], N, C, C);
        for (size_t i = 0; i < n * c; ++i) a.res2[i] = (*x)[i] + a.proj[i];
        ref_layernorm_fwd(a.ln2, a.m2, a.r2, a.res2, p[P_LN2W], p[P_LN2B], N, C);
        ref_matmul_fwd(a.fch, a.ln2, p[P_FCW], true, &p[P_FCB], N, C, 4 * C);
        for (size_t i = 0; i < 4 * n * c; ++i) a.fchg[i] = gelu(a.fch[i]);
        ref_matmul_fwd(a.fcp, a.fchg, p[P_FCPW], true, &p[P_FCPB], N, 4 * C, C);
        for (size_t i = 0; i < n * c; ++i) a.res3[i] = a.res2[i] + a.fcp[i];
        x = &a.res3;
    }
    vec lnf(n * c), mf(n), rf(n), logits(n * Vp), dlogits(n * Vp), losses(n);
    ref_layernorm_fwd(lnf, mf, rf, *x, lnfw, lnfb, N, C);
    ref_matmul_fwd(logits, lnf, wte, false, nullptr, N, C, Vp);
    ref_classifier(dlogits, losses, logits, lab, dloss, N, V, Vp);
    double ref_loss = 0;
    for (int i = 0; i < N; ++i) ref_loss += losses[i];
    if (counted) ref_loss /= counted;
    vec rgwte = gwte, rgwpe = gwpe, rglnfw = glnfw, rglnfb = glnfb;
    std::vector<vec> RG = G;
    vec dlnf(n * c, 0.f), dres(n * c, 0.f), nob(Vp, 0.f);
    ref_matmul_bwd(dlnf, rgwte, nob, dlogits, lnf, wte, false, N, C, Vp);
    ref_layernorm_bwd(dres, rglnfw, rglnfb, dlnf, *x, lnfw, mf, rf, N, C);
    for (int l = L - 1; l >= 0; --l) {
        Acts &a = A[(size_t)l];
        const vec *p = &P[(size_t)l * P_N];
        vec *g = &RG[(size_t)l * P_N];
        const vec &xin = l > 0 ? A[(size_t)l - 1].res3 : enc;
        vec dfchg(4 * n * c, 0.f), dfch(4 * n * c), dln2(n * c, 0.f), datty(n * c, 0.f),
            dqkv(3 * n * c), dln1(n * c, 0.f);
        ref_matmul_bwd(dfchg, g[P_FCPW], g[P_FCPB], dres, a.fchg, p[P_FCPW], true, N, 4 * C, C);
        for (size_t i = 0; i < 4 * n * c; ++i) dfch[i] = dfchg[i] * gelu_grad(a.fch[i]);
        ref_matmul_bwd(dln2, g[P_FCW], g[P_FCB], dfch, a.ln2, p[P_FCW], true, N, C, 4 * C);
        ref_layernorm_bwd(dres, g[P_LN2W], g[P_LN2B], dln2, a.res2, p[P_LN2W], a.m2, a.r2, N, C);
        ref_matmul_bwd(datty, g[P_PROJW], g[P_PROJB], dres, a.atty, p[P_PROJW], true, N, C, C);
        ref_attention_bwd(dqkv, datty, a.qkv, a.att, B, T, C, NH);
        ref_matmul_bwd(dln1, g[P_QKVW], g[P_QKVB], dqkv, a.ln1, p[P_QKVW], true, N, C, 3 * C);
        ref_layernorm_bwd(dres, g[P_LN1W], g[P_LN1B], dln1, xin, p[P_LN1W], a.m1, a.r1, N, C);
    }
    ref_encoder_bwd(rgwte, rgwpe, dres, tok, pos, N, C);

    /* ---- the kernels, in the trainer's order */
    const gpt_grad_dtype_t gd = GPT_GRAD_BF16;
    Dev Dwte(wte), Dwpe(wpe), Dlnfw(lnfw), Dlnfb(lnfb), Gwte(gwte), Gwpe(gwpe), Glnfw(glnfw),
        Glnfb(glnfb);
    std::vector<Dev *> DP, DG;
    for (size_t i = 0; i < P.size(); ++i) {
        DP.push_back(new Dev(P[i]));
        DG.push_back(new Dev(G[i]));
    }
    int64_t *dtok = dev_ids(tok), *dpos = dev_ids(pos), *dlab = dev_ids(lab);
    struct DActs { Dev *ln1, *m1, *r1, *qkv, *att, *atty, *res2, *ln2, *m2, *r2, *fch, *fchg, *res3; };
    std::vector<DActs> DA((size_t)L);
    std::vector<Dev *> owned;
    auto bf = [&](size_t k) { Dev *d = new Dev(vec(k)); owned.push_back(d); return d; };
    auto f32 = [&](size_t k) { Dev *d = new Dev(vec(k), true); owned.push_back(d); return d; };
    for (auto &a : DA) {
        a.ln1 = bf(n * c); a.m1 = f32(n); a.r1 = f32(n); a.qkv = bf(3 * n * c);
        a.att = bf((size_t)B * NH * T * T); a.atty = bf(n * c); a.res2 = bf(n * c); a.ln2 = bf(n * c);
        a.m2 = f32(n); a.r2 = f32(n); a.fch = bf(4 * n * c); a.fchg = bf(4 * n * c); a.res3 = bf(n * c);
    }
    Dev *Denc = bf(n * c), *Dlnf = bf(n * c), *Dmf = f32(n), *Drf = f32(n), *Dlogits = bf(n * Vp),
        *Dlosses = f32(n), *Ddres = bf(n * c), *Ddln = bf(n * c), *Ddqkv = bf(3 * n * c),
        *Ddatty = bf(n * c), *Ddfch = bf(4 * n * c), *Ddfchg = bf(4 * n * c), *Ddlnf = bf(n * c);
    Dev Dscr(gpt_attention_scratch_bytes(B, T, NH, hs));
    GK(gpt_encoder_forward(ctx, Denc->p, dtok, dpos, Dwte.p, Dwpe.p, N, C));
    const void *dx = Denc->p;
    for (int l = 0; l < L; ++l) {
        DActs &a = DA[(size_t)l];
        Dev **w = &DP[(size_t)l * P_N];
        char *q = (char *)a.qkv->p;
        GK(gpt_layernorm_forward(ctx, a.ln1->p, (float *)a.m1->p, (float *)a.r1->p, dx, w[P_LN1W]->p, w[P_LN1B]->p, N, C));
        GK(gpt_matmul_forward(ctx, a.qkv->p, a.ln1->p, w[P_QKVW]->p, GPT_W_IN_OUT, w[P_QKVB]->p, N, C, 3 * C));
        GK(gpt_attention_forward(ctx, a.atty->p, C, a.att->p, q, q + 2 * c, q + 4 * c, 3 * C, B, T, NH, hs, Dscr.p));
        GK(gpt_matmul_forward(ctx, a.ln2->p, a.atty->p, w[P_PROJW]->p, GPT_W_IN_OUT, w[P_PROJB]->p, N, C, C));
        GK(gpt_residual_forward(ctx, a.res2->p, dx, a.ln2->p, n * c));
        GK(gpt_layernorm_forward(ctx, a.ln2->p, (float *)a.m2->p, (float *)a.r2->p, a.res2->p, w[P_LN2W]->p, w[P_LN2B]->p, N, C));
        GK(gpt_matmul_forward(ctx, a.fch->p, a.ln2->p, w[P_FCW]->p, GPT_W_IN_OUT, w[P_FCB]->p, N, C, 4 * C));
        GK(gpt_gelu_forward(ctx, a.fchg->p, a.fch->p, 4 * n * c));
        GK(gpt_matmul_forward(ctx, a.res3->p, a.fchg->p, w[P_FCPW]->p, GPT_W_IN_OUT, w[P_FCPB]->p, N, 4 * C, C));
        GK(gpt_residual_forward(ctx, a.res3->p, a.res2->p, a.res3->p, n * c));
        dx = a.res3->p;
    }
    GK(gpt_layernorm_forward(ctx, Dlnf->p, (float *)Dmf->p, (float *)Drf->p, dx, Dlnfw.p, Dlnfb.p, N, C));
    GK(gpt_matmul_forward(ctx, Dlogits->p, Dlnf->p, Dwte.p, GPT_W_OUT_IN, nullptr, N, C, Vp));
    GK(gpt_fused_classifier(ctx, Dlogits->p, (float *)Dlosses->p, dlab, dloss, N, V, Vp));
    vec got_losses = Dlosses->get();
    double loss = 0;
    for (int i = 0; i < N; ++i) loss += got_losses[i];
    if (counted) loss /= counted;
    GK(gpt_matmul_backward(ctx, Ddlnf->p, Gwte.p, nullptr, gd, Dlogits->p, Dlnf->p, Dwte.p, GPT_W_OUT_IN, N, C, Vp));
    GK(gpt_layernorm_backward(ctx, Ddres->p, Glnfw.p, Glnfb.p, gd, Ddlnf->p, dx, Dlnfw.p, (float *)Dmf->p, (float *)Drf->p, N, C));
    for (int l = L - 1; l >= 0; --l) {
        DActs &a = DA[(size_t)l];
        Dev **w = &DP[(size_t)l * P_N], **g = &DG[(size_t)l * P_N];
        const void *xin = l > 0 ? DA[(size_t)l - 1].res3->p : Denc->p;
        for (Dev *d : {Ddfchg, Ddfch, Ddln, Ddatty}) CK(cudaMemset(d->p, 0, d->n * 2));
        char *q = (char *)a.qkv->p, *dq = (char *)Ddqkv->p;
        GK(gpt_matmul_backward(ctx, Ddfchg->p, g[P_FCPW]->p, g[P_FCPB]->p, gd, Ddres->p, a.fchg->p, w[P_FCPW]->p, GPT_W_IN_OUT, N, 4 * C, C));
        GK(gpt_gelu_backward(ctx, Ddfch->p, a.fch->p, Ddfchg->p, 4 * n * c));
        GK(gpt_matmul_backward(ctx, Ddln->p, g[P_FCW]->p, g[P_FCB]->p, gd, Ddfch->p, a.ln2->p, w[P_FCW]->p, GPT_W_IN_OUT, N, C, 4 * C));
        GK(gpt_layernorm_backward(ctx, Ddres->p, g[P_LN2W]->p, g[P_LN2B]->p, gd, Ddln->p, a.res2->p, w[P_LN2W]->p, (float *)a.m2->p, (float *)a.r2->p, N, C));
        GK(gpt_matmul_backward(ctx, Ddatty->p, g[P_PROJW]->p, g[P_PROJB]->p, gd, Ddres->p, a.atty->p, w[P_PROJW]->p, GPT_W_IN_OUT, N, C, C));
        GK(gpt_attention_backward(ctx, dq, dq + 2 * c, dq + 4 * c, 3 * C, Ddatty->p, C, a.att->p, q, q + 2 * c, q + 4 * c, B, T, NH, hs, Dscr.p));
        CK(cudaMemset(Ddln->p, 0, Ddln->n * 2));
        GK(gpt_matmul_backward(ctx, Ddln->p, g[P_QKVW]->p, g[P_QKVB]->p, gd, Ddqkv->p, a.ln1->p, w[P_QKVW]->p, GPT_W_IN_OUT, N, C, 3 * C));
        GK(gpt_layernorm_backward(ctx, Ddres->p, g[P_LN1W]->p, g[P_LN1B]->p, gd, Ddln->p, xin, w[P_LN1W]->p, (float *)a.m1->p, (float *)a.r1->p, N, C));
    }
    GK(gpt_encoder_backward(ctx, Gwte.p, Gwpe.p, gd, Ddres->p, tok.data(), pos.data(), N, C, Vp, T));

    float lerr = (float)fabs(loss - ref_loss) / fmaxf((float)fabs(ref_loss), 1e-6f);
    bool lok = lerr <= 1e-2f;
    char w[96];
    snprintf(w, sizeof w, "%s mean loss", pre);
    printf("%-44s %s  %.6f vs %.6f (rel %.2e, tol 1.0e-02)\n", w, lok ? "ok  " : "FAIL", loss, ref_loss, lerr);
    if (!lok) ++failures;
    snprintf(w, sizeof w, "%s d wte (LM head + embedding)", pre);
    compare(w, Gwte.get(), rgwte, TOL_MODEL);
    snprintf(w, sizeof w, "%s d wpe", pre);
    compare(w, Gwpe.get(), rgwpe, TOL_MODEL);
    snprintf(w, sizeof w, "%s d ln_f.weight", pre);
    compare(w, Glnfw.get(), rglnfw, TOL_MODEL);
    snprintf(w, sizeof w, "%s d ln_f.bias", pre);
    compare(w, Glnfb.get(), rglnfb, TOL_MODEL);
    const char *names[P_N] = {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                              "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                              "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"};
    for (int l = 0; l < L; ++l)
        for (int k = 0; k < P_N; ++k) {
            snprintf(w, sizeof w, "%s d h.%d.%s", pre, l, names[k]);
            compare(w, DG[(size_t)l * P_N + k]->get(), RG[(size_t)l * P_N + k], TOL_MODEL);
        }
    for (Dev *d : DP) delete d;
    for (Dev *d : DG) delete d;
    for (Dev *d : owned) delete d;
    cudaFree(dtok);
    cudaFree(dpos);
    cudaFree(dlab);
}

static void check_bad_arguments(gpt_cuda_t ctx) {
    bad(ctx, "matmul_forward N 0",
        gpt_matmul_forward(ctx, nullptr, nullptr, nullptr, GPT_W_IN_OUT, nullptr, 0, 8, 8), "N 0");
    bad(ctx, "attention stride 30 < NH hs 32",
        gpt_attention_forward(ctx, nullptr, 30, nullptr, nullptr, nullptr, nullptr, 30, 1, 4, 4, 8,
                              nullptr),
        "stride 30 ostride 30");
    bad(ctx, "classifier V 65 > Vp 64",
        gpt_fused_classifier(ctx, nullptr, nullptr, nullptr, 1.f, 4, 65, 64), "V 65 Vp 64");
    bad(ctx, "layernorm C -1",
        gpt_layernorm_forward(ctx, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 4, -1),
        "C -1");
    bad(ctx, "matmul_forward weight NULL",
        gpt_matmul_forward(ctx, ctx /* any non-NULL */, ctx, nullptr, GPT_W_IN_OUT, nullptr, 4, 8,
                           8),
        "weight is NULL");
    bad(ctx, "gelu_backward dinp == dout",
        gpt_gelu_backward(ctx, ctx, ctx, ctx, 16), "dinp aliases dout");
    bad(ctx, "encoder_forward tok NULL",
        gpt_encoder_forward(ctx, ctx, nullptr, nullptr, ctx, ctx, 4, 8), "is NULL");
    bad(ctx, "layernorm_backward mean NULL",
        gpt_layernorm_backward(ctx, nullptr, nullptr, nullptr, GPT_GRAD_BF16, nullptr, nullptr,
                               nullptr, nullptr, nullptr, 4, 8),
        "mean or rstd is NULL");
}

int main(int argc, char **argv) {
    bool do_bench = argc > 1 && !strcmp(argv[1], "--bench");
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        printf("SKIP: no usable CUDA device (%s); the GPT CUDA kernels are not checked\n",
               e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount: 0 devices");
        return 77;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device 0: %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
    cudaStream_t stream;
    CK(cudaStreamCreate(&stream));
    gpt_cuda_t ctx = nullptr;
    if (gpt_cuda_create(stream, &ctx)) {
        fprintf(stderr, "gpt_cuda_create: %s\n", gpt_cuda_error(nullptr));
        return 1;
    }
    int rc;
    if (do_bench) {
        rc = gpt_kernels_bench(ctx, prop, argc, argv);
    } else {
        for (gpt_grad_dtype_t g : {GPT_GRAD_BF16, GPT_GRAD_F32}) {
            check_encoder(ctx, g);
            check_layernorm(ctx, g);
            for (gpt_wlayout_t wl : {GPT_W_OUT_IN, GPT_W_IN_OUT}) {
                check_matmul(ctx, g, wl, true);
                check_matmul(ctx, g, wl, false);
                /* every matrix moved off its 256-byte alignment: by 2 and
                 * 6 bytes (bf16), 4 and 12 (fp32 gradients) */
                check_matmul(ctx, g, wl, true, 1);
                check_matmul(ctx, g, wl, false, 3);
            }
        }
        check_attention(ctx);
        check_elementwise(ctx);
        check_classifier(ctx);
        check_model(ctx);
        check_model(ctx, true);
        check_bad_arguments(ctx);
        CK(cudaDeviceSynchronize());
        printf("%s: %d failure(s)\n", failures ? "FAIL" : "PASS", failures);
        rc = failures ? 1 : 0;
    }
    gpt_cuda_free(&ctx);
    cudaStreamDestroy(stream);
    return rc;
}
