#!/usr/bin/env python3
"""Write a TorchScript transformer block whose attention is sequence-parallel.

The block (pre-norm causal self-attention with grouped-query keys and values,
then an MLP) takes this rank's tokens, x of [batch, seq / P, dim]. Around the
attention, torch.ops.dsm.seq_to_head gives every rank the whole sequence of
its heads and torch.ops.dsm.head_to_seq gives the result back by tokens; the
rest of the block works on this rank's tokens only. Run with the operators'
library (libdsm_torch_ops.so) loaded, so that scripting resolves them; in
this process no group is set, so they are identities and the scripted block
is checked against itself in eager mode on the full sequence. --reference
also writes the same block without the operators, as a test's reference.

    ulysses_block.py --lib .libs/libdsm_torch_ops.so --out block.pt [--reference plain.pt]
"""
import argparse
import math

import torch


class UlyssesBlock(torch.nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int):
        super().__init__()
        assert dim % heads == 0 and heads % kv_heads == 0
        self.heads = heads
        self.kv_heads = kv_heads
        self.head_dim = dim // heads
        self.norm1 = torch.nn.LayerNorm(dim)
        self.q = torch.nn.Linear(dim, heads * self.head_dim)
        self.kv = torch.nn.Linear(dim, 2 * kv_heads * self.head_dim)
        self.proj = torch.nn.Linear(heads * self.head_dim, dim)
        self.norm2 = torch.nn.LayerNorm(dim)
        self.fc1 = torch.nn.Linear(dim, 4 * dim)
        self.fc2 = torch.nn.Linear(4 * dim, dim)

    def to_heads(self, t: torch.Tensor, replicate: bool) -> torch.Tensor:
        return torch.ops.dsm.seq_to_head(t, 1, 2, replicate)

    def to_tokens(self, t: torch.Tensor) -> torch.Tensor:
        return torch.ops.dsm.head_to_seq(t, self.heads, 1, 2, False)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape  # s: this rank's tokens
        q = self.q(x).view(b, s, self.heads, self.head_dim)
        k, v = self.kv(x).view(b, s, 2, self.kv_heads, self.head_dim).unbind(2)
        # [b, s/P, H, d] -> [b, s, H/P, d]; keys and values with fewer heads
        # than ranks are replicated (their gradients summed on the way back).
        q = self.to_heads(q, False)
        k = self.to_heads(k, True)
        v = self.to_heads(v, True)
        group = q.size(2) // k.size(2)  # query heads per key/value head on this rank
        if group > 1:
            k = k.repeat_interleave(group, dim=2)
            v = v.repeat_interleave(group, dim=2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [b, h, s, d]
        n = q.size(2)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        causal = torch.ones(n, n, dtype=torch.bool, device=x.device).triu(1)
        y = scores.masked_fill(causal, float("-inf")).softmax(-1) @ v
        y = y.transpose(1, 2).contiguous()  # [b, s, H/P, d]
        y = self.to_tokens(y)  # [b, s/P, H, d]
        return self.proj(y.reshape(b, s, self.heads * self.head_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm2(x))))


class UnsplitBlock(UlyssesBlock):
    """The same block without the operators: the reference, on the whole sequence."""

    def to_heads(self, t: torch.Tensor, replicate: bool) -> torch.Tensor:
        return t

    def to_tokens(self, t: torch.Tensor) -> torch.Tensor:
        return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", required=True, help="libdsm_torch_ops.so")
    ap.add_argument("--out", required=True, help="the TorchScript file to write")
    ap.add_argument("--reference", help="also write the block without the operators (same weights) here")
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float64")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.ops.load_library(args.lib)
    torch.manual_seed(args.seed)
    block = UlyssesBlock(args.dim, args.heads, args.kv_heads).to(getattr(torch, args.dtype))
    scripted = torch.jit.script(block)
    x = torch.randn(2, 8, args.dim, dtype=getattr(torch, args.dtype))
    if not torch.equal(scripted(x), block(x)):
        raise SystemExit("ulysses_block.py: the scripted block differs from the eager one")
    scripted.save(args.out)
    print(f"wrote {args.out}: dim {args.dim}, {args.heads} heads, {args.kv_heads} key/value heads, {args.dtype}")
    if args.reference:
        plain = UnsplitBlock(args.dim, args.heads, args.kv_heads).to(block.norm1.weight.dtype)
        plain.load_state_dict(block.state_dict())
        plain = torch.jit.script(plain)
        if "dsm::" in str(plain.inlined_graph) or not torch.equal(plain(x), scripted(x)):
            raise SystemExit("ulysses_block.py: the reference calls the operators or differs from the block")
        plain.save(args.reference)
        print(f"wrote {args.reference}: the same block without the operators")


if __name__ == "__main__":
    main()
