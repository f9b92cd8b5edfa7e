#!/bin/sh
# ZeRO-3's memory with the PyTorch bridge, read from dsm_engine_memory():
# a 12-block nn.Sequential (Linear(256, 256)+Tanh each) on 4 ranks. The
# per-rank model-state memory (partitions + peak gathered parameters + peak
# gradient buffers) at ZeRO-3 is at most 0.35x ZeRO-0's, and block by block
# the peak gathered parameters are one block (no prefetch, no reuse), where
# the whole path gathers all 12. reduce_bucket_size is one block, so that
# the gradients of a block are reduced before the next block's backward.
set -u
# shellcheck source=test/torch/torch_common.sh
. "$top_srcdir/test/torch/torch_common.sh"
"$py" "$ref_py" bench "$tmp" --hidden 256 --blocks 12 --steps 0 || fail "torch_reference.py bench"
bin=$top_builddir/test/torch/bench_torch
block=$(( (256 * 256 + 256) * 4 ))
measure() { # stage [options]: "partitions gathered_peak grad_peak"
    s=$1
    shift
    out=$("$run" 4 "$bin" --model "$tmp/bench.pt" --width 256 --micro 8 --steps 3 --stage "$s" --memory \
        --bucket $((256 * 256 + 256)) "$@" 2>&1) ||
        { echo "bench_torch at ZeRO-$s $*: $out" >&2; return 1; }
    line=$(echo "$out" | sed -n 's/^memory partitions \([0-9]*\) gathered_peak \([0-9]*\) grad_peak \([0-9]*\).*/\1 \2 \3/p')
    [ -n "$line" ] || { echo "no memory line from bench_torch at ZeRO-$s $*: $out" >&2; return 1; }
    echo "$line"
}
r=$(measure 0) || fail "ZeRO-0"
set -- $r; p0=$1 g0=$2 r0=$3
r=$(measure 3) || fail "ZeRO-3"
set -- $r; p3=$1 g3=$2 r3=$3
r=$(measure 3 --whole) || fail "ZeRO-3 whole"
set -- $r; pw=$1 gw=$2 rw=$3
m0=$((p0 + g0 + r0)) m3=$((p3 + g3 + r3)) mw=$((pw + gw + rw))
echo "one block: $block bytes"
echo "ZeRO-0:              partitions $p0, gathered peak $g0, gradient buffers peak $r0: model state $m0"
echo "ZeRO-3 block by block: partitions $p3, gathered peak $g3, gradient buffers peak $r3: model state $m3"
echo "ZeRO-3 whole:        partitions $pw, gathered peak $gw, gradient buffers peak $rw: model state $mw"
awk -v a="$m3" -v b="$m0" 'BEGIN { r = a / b; printf "ZeRO-3 / ZeRO-0 model state: %.3f (at most 0.35)\n", r; exit !(r <= 0.35) }' ||
    fail "ZeRO-3's model state is more than 0.35x ZeRO-0's"
[ "$g3" -ge "$block" ] && [ "$g3" -le $((block + block / 10)) ] ||
    fail "block by block, the peak gathered parameters are $g3 bytes, not one block ($block)"
[ "$gw" -ge $((11 * block)) ] || fail "the whole path's peak gathered parameters are $gw bytes, less than the model"
echo "ok: ZeRO-3 block by block holds one block gathered at a time"
