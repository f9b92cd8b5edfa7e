#!/usr/bin/env python3
"""The PyTorch reference of examples/gpt: the same GPT-2 model, data and training.

  gpt_reference.py init  --preset tiny --out W.safetensors [--seed S]
  gpt_reference.py grads --preset tiny --init W.safetensors --data SHARD --batch B --compare C.safetensors
  gpt_reference.py train --preset small --init W.safetensors --data SHARD --steps N --batch GB
                         [--ranks R] [--threads 1] [--lr ...] [--warmup W] [--total T]

Parameters are named and shaped as train_gpt's (GPT-2 checkpoint names,
Conv1D weights [in, out], wte [padded vocab, C] tied to the LM head), so a
safetensors file written here initialises both. The loss is the mean
cross-entropy of positions 0..T-2 predicting tokens 1..T-1 of each
T-token sample (sample i = tokens [iT, (i+1)T) of the llm.c shard).

`grads` computes the loss and every gradient on samples 0..B-1 and compares
them with the file train_gpt --dump-grads wrote (exit 1 above the tolerance).
`train` runs AdamW with gradient clipping and the WarmupCosineLR schedule of
the example's configuration on global batches of consecutive samples (what
train_gpt --no-shuffle reads), on R processes under DistributedDataParallel
(gloo) when --ranks > 1, and prints one "step N loss X" line per step and
the tokens/s of the steps after the first two.
"""
import argparse
import json
import math
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# Attention through F.scaled_dot_product_attention where this PyTorch has it
# (2.0 and later; DSM_REFERENCE_SDPA=0 for the explicit softmax), else written out.
USE_SDPA = hasattr(F, "scaled_dot_product_attention") and os.environ.get("DSM_REFERENCE_SDPA", "1") != "0"

PRESETS = {  # layers, heads, width, context, vocabulary
    "tiny": (2, 4, 32, 32, 256),
    "small": (4, 4, 256, 256, 256),
    "gpt2": (12, 12, 768, 1024, 50257),
}


# ---------------------------------------------------------------- safetensors

def save_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        a = t.detach().cpu().contiguous().float().numpy()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        blobs.append(a.tobytes())
        off += a.nbytes
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        assert e["dtype"] == "F32", f"{path}: {name} is {e['dtype']}, expected F32"
        a, b = e["data_offsets"]
        out[name] = torch.from_numpy(np.frombuffer(data[a:b], dtype=np.float32).copy()).reshape(e["shape"])
    return out


# ---------------------------------------------------------------- the model

class Conv1D(nn.Module):
    """GPT-2's linear layer: weight [in, out], y = x W + b."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).reshape(*x.shape[:-1], -1)


class Attention(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.c_attn = Conv1D(C, 3 * C)
        self.c_proj = Conv1D(C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.NH, C // self.NH).transpose(1, 2) for t in (q, k, v))
        if USE_SDPA:  # PyTorch 2.x's fused attention (no T x T matrix kept)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.NH)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, C):
        super().__init__()
        self.c_fc = Conv1D(C, 4 * C)
        self.c_proj = Conv1D(4 * C, C)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.attn = Attention(C, NH)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        self.mlp = MLP(C)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, L, NH, C, T, V):
        super().__init__()
        self.V, self.Vp = V, (V + 63) // 64 * 64
        self.wte = nn.Embedding(self.Vp, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList(Block(C, NH) for _ in range(L))
        self.ln_f = nn.LayerNorm(C, eps=1e-5)
        for name, p in self.named_parameters():  # GPT-2's initialization
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif "ln_" in name:
                nn.init.ones_(p)
            else:
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * L) if "c_proj" in name else 0.02)

    def forward(self, idx):
        """Mean cross-entropy of positions 0..T-2 predicting tokens 1..T-1."""
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # the LM head tied to wte
        logits = logits[:, :-1, :self.V]
        return F.cross_entropy(logits.reshape(-1, self.V), idx[:, 1:].reshape(-1))


def read_shard(path, T):
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(1024), dtype=np.int32)
        assert header[0] == 20240520 and header[1] == 1, f"{path}: not a token shard"
        tokens = np.frombuffer(f.read(), dtype=np.uint16)
    assert len(tokens) == header[2], f"{path}: {len(tokens)} tokens, header says {header[2]}"
    n = len(tokens) // T
    return torch.from_numpy(tokens[: n * T].astype(np.int64)).view(n, T)


def make_model(args):
    L, NH, C, T, V = PRESETS[args.preset]
    model = GPT(L, NH, C, T, V)
    if getattr(args, "init", None):
        state = load_safetensors(args.init)
        missing = set(dict(model.named_parameters())) ^ set(state)
        assert not missing, f"{args.init}: names differ: {sorted(missing)}"
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(state[name])
    return model, T


# ---------------------------------------------------------------- commands

def cmd_init(args):
    torch.manual_seed(args.seed)
    model, _ = make_model(args)
    save_safetensors(args.out, dict(model.named_parameters()))
    print(f"gpt_reference: initial weights of the {args.preset} preset written to {args.out}")


def cmd_grads(args):
    model, T = make_model(args)
    data = read_shard(args.data, T)
    loss = model(data[: args.batch])
    loss.backward()
    theirs = load_safetensors(args.compare)
    worst, ok = 0.0, True
    dl = abs(theirs["loss"].item() - loss.item()) / abs(loss.item())
    print(f"loss: reference {loss.item():.7f}, train_gpt {theirs['loss'].item():.7f}, relative difference {dl:.2e}")
    ok = dl <= args.tol
    for name, p in model.named_parameters():
        g, h = p.grad, theirs[name]
        assert g.shape == h.shape, f"{name}: shapes {tuple(g.shape)} and {tuple(h.shape)}"
        # relative to the tensor's own scale: ||a - b|| / ||a||
        rel = ((g - h).norm() / g.norm().clamp_min(1e-30)).item()
        worst = max(worst, rel)
        if rel > args.tol:
            print(f"{name}: relative difference {rel:.2e} above {args.tol:g}")
            ok = False
    print(f"gradients: {len(list(model.parameters()))} tensors, largest relative difference {worst:.2e} "
          f"(tolerance {args.tol:g})")
    sys.exit(0 if ok else 1)


def lr_at(args, t):
    """WarmupCosineLR (linear warmup) at schedule step t (-1 before the first
    update), as the engine computes it (dsm-info lr prints the same table)."""
    if t < 0:
        return 0.0
    if t < args.warmup:
        ratio = t / args.warmup
    else:
        p = min(1.0, (t - args.warmup + 1) / max(1, args.total - args.warmup))
        ratio = max(0.0, args.cos_min + (1 - args.cos_min) * (1 + math.cos(math.pi * p)) / 2)
    return args.lr * ratio


def train_worker(rank, args):
    torch.set_num_threads(args.threads)
    world = args.ranks
    if world > 1:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(args.port))
        torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    model, T = make_model(args)
    data = read_shard(args.data, T)
    net = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.wd}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=0.0, betas=(0.9, 0.95), eps=1e-8)
    per_rank = args.batch // world
    micro = args.micro or per_rank
    accum = per_rank // micro
    n = data.shape[0]
    timed, t_sum = 0, 0.0
    for step in range(args.steps):
        t0 = time.perf_counter()
        first = step * args.batch + rank * per_rank
        total = 0.0
        for m in range(accum):
            idx = torch.tensor([(first + m * micro + i) % n for i in range(micro)])
            loss = net(data[idx]) / accum
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        for g in opt.param_groups:  # update step + 1 runs at the schedule's step - 1, as DeepSpeed's
            g["lr"] = lr_at(args, step - 1)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if world > 1:
            t = torch.tensor([total])
            torch.distributed.all_reduce(t)
            total = t.item() / world
        dt = time.perf_counter() - t0
        if step >= 2:
            timed, t_sum = timed + 1, t_sum + dt
        if rank == 0 and (step % args.print_every == 0 or step == args.steps - 1):
            print(f"step {step + 1:5d}  loss {total:.6f}  {dt * 1e3:.1f} ms", flush=True)
    if rank == 0 and timed:
        print(f"figures: {timed * args.batch * T / t_sum:.1f} tokens/s over {timed} steps "
              f"({world} ranks x {args.threads} threads; PyTorch {torch.__version__}, attention "
              f"{'scaled_dot_product_attention' if USE_SDPA else 'explicit softmax'})", flush=True)
    if world > 1:
        torch.distributed.destroy_process_group()


def cmd_train(args):
    if args.ranks > 1:
        torch.multiprocessing.spawn(train_worker, args=(args,), nprocs=args.ranks)
    else:
        train_worker(0, args)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("init", "grads", "train"):
        p = sub.add_parser(name)
        p.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
        if name == "init":
            p.add_argument("--out", required=True)
            p.add_argument("--seed", type=int, default=0)
        else:
            p.add_argument("--init", required=True)
            p.add_argument("--data", required=True)
            p.add_argument("--batch", type=int, required=True)
        if name == "grads":
            p.add_argument("--compare", required=True)
            p.add_argument("--tol", type=float, default=1e-4)
        if name == "train":
            p.add_argument("--steps", type=int, default=20)
            p.add_argument("--micro", type=int, default=0)
            p.add_argument("--ranks", type=int, default=1)
            p.add_argument("--threads", type=int, default=1)
            p.add_argument("--port", type=int, default=29517)
            p.add_argument("--lr", type=float, default=1e-3)
            p.add_argument("--wd", type=float, default=0.1)
            p.add_argument("--clip", type=float, default=1.0)
            p.add_argument("--warmup", type=int, default=10)
            p.add_argument("--total", type=int, default=300)
            p.add_argument("--cos-min", type=float, default=0.1)
            p.add_argument("--print-every", type=int, default=1)
    args = ap.parse_args()
    {"init": cmd_init, "grads": cmd_grads, "train": cmd_train}[args.cmd](args)


if __name__ == "__main__":
    main()
