#!/usr/bin/env python3
"""PyTorch's side of the PyTorch bridge's tests (libdsm_torch).

  torch_reference.py models DIR
      writes the TorchScript models the tests train and break:
        mlp.pt       nn.Sequential of 12 blocks (Linear+Tanh), seed 0
        mlp_seed1.pt the same model from seed 1 (parameters that differ)
        bn.pt        a model that is not a Sequential, with BatchNorm buffers
        noparams.pt  a model without parameters
        corrupt.pt   bytes that are not a TorchScript archive
        sdpa.pt      an archive whose code calls aten::scaled_dot_product_attention
                     (PyTorch 2.0+), as a newer PyTorch writes it
        data.bin     float32 inputs [N, 8] then targets [N, 4]
  torch_reference.py bench DIR --hidden H --blocks K --micro B --world W --steps S
      writes DIR/bench.pt (K blocks of Linear(H, H)+Tanh in an nn.Sequential,
      input and output H wide) and times S steps of its training under
      DistributedDataParallel (gloo, W processes, one thread each, AdamW,
      mse, after 5 warm-up steps); prints "ddp_step_ms X".
  torch_reference.py ddp DIR --world W --gas G --steps S --micro B --clip C --lr LR
      trains DIR/mlp.pt under DistributedDataParallel (gloo, W processes):
      each micro-step, rank r takes rows ((s*G + m)*W + r)*B .. +B of the data,
      the loss (mse) is divided by G, gradients accumulate (no_sync), then
      clip_grad_norm_(C) and AdamW at the window's end. Writes DIR/ref_wW_gG.bin:
      float64 losses [S*G][W], then every parameter's final fp32 values in
      named_parameters() order.
"""
import argparse
import os
import struct
import sys
import zipfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

IN, HID, OUT, BLOCKS, N = 8, 16, 4, 12, 4096


def make_mlp(seed):
    torch.manual_seed(seed)
    layers = [torch.nn.Sequential(torch.nn.Linear(IN, HID), torch.nn.Tanh())]
    for _ in range(BLOCKS - 2):
        layers.append(torch.nn.Sequential(torch.nn.Linear(HID, HID), torch.nn.Tanh()))
    layers.append(torch.nn.Linear(HID, OUT))
    return torch.nn.Sequential(*layers)


class BatchNormNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(2)
        self.fc1 = torch.nn.Linear(IN, HID)
        self.bn = torch.nn.BatchNorm1d(HID)
        self.fc2 = torch.nn.Linear(HID, OUT)

    def forward(self, x):
        return self.fc2(torch.relu(self.bn(self.fc1(x))))


class NoParams(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x)


class Relu(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x)


def models(d):
    os.makedirs(d, exist_ok=True)
    torch.jit.script(make_mlp(0)).save(os.path.join(d, "mlp.pt"))
    torch.jit.script(make_mlp(1)).save(os.path.join(d, "mlp_seed1.pt"))
    torch.jit.script(BatchNormNet()).save(os.path.join(d, "bn.pt"))
    torch.jit.script(NoParams()).save(os.path.join(d, "noparams.pt"))
    with open(os.path.join(d, "corrupt.pt"), "wb") as f:
        f.write(b"PK\x03\x04 this is not a TorchScript archive" * 10)
    # A file as PyTorch 2.x writes for a model calling
    # F.scaled_dot_product_attention: the code of a scripted model, rewritten.
    src = os.path.join(d, "relu.pt")
    torch.jit.script(Relu()).save(src)
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(os.path.join(d, "sdpa.pt"), "w") as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            if item.filename.endswith(".py") and b"torch.relu(x)" in data:
                data = data.replace(b"torch.relu(x)", b"torch.scaled_dot_product_attention(x, x, x)")
            if item.filename.endswith(".debug_pkl"):
                continue
            zout.writestr(item, data)
    os.remove(src)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(N, IN, generator=g)
    y = torch.randn(N, OUT, generator=g)
    with open(os.path.join(d, "data.bin"), "wb") as f:
        f.write(x.numpy().tobytes())
        f.write(y.numpy().tobytes())


def load_data(d):
    raw = open(os.path.join(d, "data.bin"), "rb").read()
    t = torch.frombuffer(bytearray(raw), dtype=torch.float32)
    return t[: N * IN].view(N, IN), t[N * IN:].view(N, OUT)


def ddp_rank(rank, a):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(a.port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=a.world)
    x, y = load_data(a.dir)
    model = torch.jit.load(os.path.join(a.dir, "mlp.pt"))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    losses = []
    for s in range(a.steps):
        for m in range(a.gas):
            row = ((s * a.gas + m) * a.world + rank) * a.micro
            xb, yb = x[row:row + a.micro], y[row:row + a.micro]
            if m < a.gas - 1:
                with ddp.no_sync():
                    loss = torch.nn.functional.mse_loss(ddp(xb), yb)
                    (loss / a.gas).backward()
            else:
                loss = torch.nn.functional.mse_loss(ddp(xb), yb)
                (loss / a.gas).backward()
            losses.append(loss.item())
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()
        opt.zero_grad(set_to_none=False)
    all_losses = [None] * a.world
    dist.all_gather_object(all_losses, losses)
    if rank == 0:
        out = os.path.join(a.dir, "ref_w%d_g%d.bin" % (a.world, a.gas))
        with open(out + ".tmp", "wb") as f:
            for i in range(len(losses)):
                f.write(struct.pack("<%dd" % a.world, *[all_losses[r][i] for r in range(a.world)]))
            for _, p in model.named_parameters():
                f.write(p.detach().contiguous().numpy().tobytes())
        os.replace(out + ".tmp", out)
    dist.destroy_process_group()


def make_bench(hidden, blocks):
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(hidden, hidden), torch.nn.Tanh())
                                 for _ in range(blocks)])


def bench_rank(rank, a):
    import time
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(a.port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=a.world)
    model = torch.jit.load(os.path.join(a.dir, "bench.pt"))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(a.micro, a.hidden, generator=g)
    y = torch.randn(a.micro, a.hidden, generator=g)
    times = []
    for s in range(a.steps + 5):
        dist.barrier()
        t0 = time.perf_counter()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        times.append(time.perf_counter() - t0)
    t = torch.tensor([sorted(times[5:])[len(times[5:]) // 2]])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if rank == 0:
        print("ddp_step_ms %.4f" % (t.item() * 1e3), flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=["models", "ddp", "bench"])
    ap.add_argument("dir")
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--gas", type=int, default=1)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--clip", type=float, default=0.5)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--port", type=int, default=0, help="gloo's rendezvous port (default: a free one)")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--blocks", type=int, default=12)
    a = ap.parse_args()
    if a.port == 0:  # a port nothing listens on now, so that concurrent tests do not meet
        import socket
        with socket.socket() as sk:
            sk.bind(("127.0.0.1", 0))
            a.port = sk.getsockname()[1]
    if a.cmd == "models":
        models(a.dir)
    elif a.cmd == "bench":
        torch.jit.script(make_bench(a.hidden, a.blocks)).save(os.path.join(a.dir, "bench.pt"))
        if a.steps > 0:
            mp.spawn(bench_rank, args=(a,), nprocs=a.world, join=True)
    else:
        if (a.steps * a.gas * a.world) * a.micro > N:
            sys.exit("not enough data rows")
        mp.spawn(ddp_rank, args=(a,), nprocs=a.world, join=True)


if __name__ == "__main__":
    main()
