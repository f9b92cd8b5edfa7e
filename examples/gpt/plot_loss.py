#!/usr/bin/env python3
"""Plot the loss curves of train_gpt and of its PyTorch reference.

  plot_loss.py TRAIN_GPT.log REFERENCE.log OUT.png [TITLE]
  plot_loss.py --csv LOSS.csv OUT.png [TITLE]

Each log holds "step N loss X ..." lines (train_gpt --print-every 1,
gpt_reference.py train --print-every 1); LOSS.csv is what train_gpt
--loss-csv writes (step,loss,...): one curve. Needs matplotlib.
"""
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read(path):
    steps, losses = [], []
    with open(path) as f:
        for line in f:
            w = line.split()
            if len(w) >= 4 and w[0] == "step" and w[2] == "loss":
                steps.append(int(w[1]))
                losses.append(float(w[3]))
    return steps, losses


def read_csv(path):
    steps, losses = [], []
    with open(path) as f:
        next(f)  # the header: step,loss,lr,grad_norm,ms,tokens_per_s
        for line in f:
            w = line.split(",")
            steps.append(int(w[0]))
            losses.append(float(w[1]))
    return steps, losses


def plot_csv(path, out, title):
    s, l = read_csv(path)
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    ax.plot(s, l, color="tab:blue", linewidth=1)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss (nats per token)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out)
    print(f"plot_loss: {out}: {len(l)} steps, loss {l[0]:.4f} -> {l[-1]:.4f}")


def main():
    if sys.argv[1] == "--csv":
        plot_csv(sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else "train_gpt (libdsm): training loss")
        return
    ours, ref, out = sys.argv[1:4]
    title = sys.argv[4] if len(sys.argv) > 4 else "GPT loss: train_gpt (libdsm) and the PyTorch reference"
    s1, l1 = read(ours)
    s2, l2 = read(ref)
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    ax.plot(s2, l2, label="PyTorch reference (1 process)", color="tab:orange", linewidth=2.5, alpha=0.6)
    ax.plot(s1, l1, label="train_gpt on libdsm (2 ranks, ZeRO-1)", color="tab:blue", linewidth=1)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss (nats per token)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out)
    n = min(len(l1), len(l2))
    worst = max(abs(a - b) / b for a, b in zip(l1[:n], l2[:n]))
    print(f"plot_loss: {out}: {n} steps; largest relative difference of the losses {worst:.2e}; "
          f"final {l1[-1]:.4f} (train_gpt) and {l2[-1]:.4f} (reference)")


if __name__ == "__main__":
    main()
