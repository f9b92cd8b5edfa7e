#!/usr/bin/env python3
"""The loss curves of doc/zeropp-loss.png: examples/c/train_mlp trained with
ZeRO-3 fp16 (examples/c/train_mlp_fp16_zero3.json) and with the same
configuration plus ZeRO++ hpZ, qwZ and qgZ (examples/c/train_mlp_zeropp.json),
on 4 ranks as 2 simulated nodes of 2 (DSM_SIM_NODES=2:block): the loss of
the global batch at each step the example prints.

usage: scripts/plot_zeropp_loss.py [--build DIR] [--steps N] [--out PNG] [--mpiexec CMD]
Needs matplotlib (Debian: python3-matplotlib).
"""
import argparse, json, os, re, subprocess, sys, tempfile

def run(build, src, config, steps, mpiexec):
    with open(config) as f:
        cfg = json.load(f)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as t:
        json.dump(cfg, t)
        path = t.name
    env = dict(os.environ, DSM_SIM_NODES="2:block", OMP_NUM_THREADS="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_mpi_yield_when_idle="1")
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    try:
        out = subprocess.run(mpiexec.split() + ["-n", "4", os.path.join(build, "examples/c/train_mlp"), path,
                                                "--steps", str(steps)],
                             env=env, capture_output=True, text=True)
        if out.returncode not in (0, 2):  # 2: a short run whose loss did not fall 5x yet
            sys.exit("train_mlp failed (%d): %s" % (out.returncode, out.stdout + out.stderr))
        out = out.stdout
    finally:
        os.unlink(path)
    steps_, losses = [], []
    for line in out.splitlines():
        m = re.match(r"step\s+(\d+)\s+loss\s+([0-9.eE+-]+)", line)
        if m:
            steps_.append(int(m.group(1)))
            losses.append(float(m.group(2)))
    final = re.search(r"final loss ([0-9.eE+-]+)", out)
    return steps_, losses, float(final.group(1)) if final else float("nan")

def main():
    here = os.path.dirname(os.path.abspath(__file__))
    src = os.path.dirname(here)
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=src)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--out", default=os.path.join(src, "doc", "zeropp-loss.png"))
    ap.add_argument("--mpiexec", default="mpiexec")
    a = ap.parse_args()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    runs = [("ZeRO-3 fp16", "train_mlp_fp16_zero3.json"),
            ("ZeRO-3 fp16 + hpZ 2 + qwZ (int8) + qgZ (int4)", "train_mlp_zeropp.json")]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    finals = []
    for label, cfg in runs:
        path = os.path.join(src, "examples", "c", cfg)
        # train_mlp prints every step below 20 steps, else every tenth of the
        # run: the same deterministic run twice, the first 19 steps and the
        # whole, give the start step by step and the rest every steps/10.
        s0, l0, _ = run(a.build, src, path, 19, a.mpiexec)
        s1, l1, final = run(a.build, src, path, a.steps, a.mpiexec)
        pts = dict(zip(s1, l1))
        pts.update(zip(s0, l0))
        s, l = zip(*sorted(pts.items()))
        finals.append(final)
        ax.plot(s, l, marker=".", markersize=3, label="%s (final %.5f)" % (label, final), linewidth=1.2)
        print("%s: %d steps, final loss %.6f" % (label, len(s), final))
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (global batch)")
    ax.set_title("train_mlp, 4 ranks on 2 simulated nodes: with and without ZeRO++ quantization")
    ax.title.set_fontsize(9)
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(a.out)
    print("final loss ratio %.4f; wrote %s" % (finals[1] / finals[0], a.out))

if __name__ == "__main__":
    sys.exit(main())
