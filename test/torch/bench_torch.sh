#!/bin/sh
# `make bench-torch`: the PyTorch bridge's training step against PyTorch's
# DistributedDataParallel (gloo) on the same TorchScript model, the same
# ranks (2, CPU, one thread each) and the same batch, measured in one run:
# a 12-block nn.Sequential of Linear(W, W)+Tanh, batch 64, AdamW, mse, the
# median step over the ranks' slowest. ratio = DDP's step / the bridge's
# (above 1: the bridge is faster); libdsm's share = the part of the bridge's
# step spent in libdsm calls (acquire, release, dsm_step: the reduction and
# the optimizer). Then ZeRO-3's memory on 4 ranks (torch_memory.sh's figures
# at this width).
#   WIDTHS="256 512 1024" STEPS=30 bench_torch.sh
set -u
# shellcheck source=test/torch/torch_common.sh
. "$top_srcdir/test/torch/torch_common.sh"
bin=$top_builddir/test/torch/bench_torch
steps=${STEPS:-30}
printf '%-7s %-6s %14s %14s %8s %14s\n' width stage "DDP step ms" "bridge ms" ratio "libdsm share"
for w in ${WIDTHS:-256 512 1024}; do
    ddp=$("$py" "$ref_py" bench "$tmp" --hidden "$w" --blocks 12 --micro 64 --world 2 --steps "$steps" |
          sed -n 's/^ddp_step_ms //p') || fail "DDP benchmark"
    for s in 0 2; do
        out=$("$run" 2 "$bin" --model "$tmp/bench.pt" --width "$w" --micro 64 --steps "$steps" --stage "$s" 2>&1) ||
            fail "bench_torch: $out"
        set -- $(echo "$out" | sed -n 's/^dsm_step_ms \([0-9.]*\) libdsm_share \([0-9.]*\)/\1 \2/p')
        awk -v w="$w" -v s="$s" -v d="$ddp" -v b="$1" -v sh="$2" \
            'BEGIN { printf "%-7s %-6s %14.3f %14.3f %8.2f %13.1f%%\n", w, s, d, b, d / b, 100 * sh }'
    done
done
w=${MEMORY_WIDTH:-512}
"$py" "$ref_py" bench "$tmp" --hidden "$w" --blocks 12 --steps 0 || fail "torch_reference.py bench"
echo
echo "ZeRO memory per rank on 4 ranks, width $w (bytes; model state = partitions + gathered peak + gradient buffers peak):"
for c in "0" "3" "3 --whole"; do
    out=$("$run" 4 "$bin" --model "$tmp/bench.pt" --width "$w" --micro 8 --steps 3 --stage $c --memory 2>&1) ||
        fail "bench_torch: $out"
    echo "  ZeRO-$c: $(echo "$out" | grep '^memory')"
done
