#!/bin/sh
# ZeRO++ accuracy end to end: examples/c/train_mlp trained N steps with ZeRO-3
# fp16 (train_mlp_fp16_zero3.json) and with the same configuration plus hpZ,
# qwZ and qgZ (train_mlp_zeropp.json), on 4 ranks as 2 simulated nodes of 2
# (so that qgZ's exchange between nodes runs) and as 3 + 1: the final loss
# with quantization must be within 1% of the loss without it.
set -u
bin=${DSM_TRAIN_MLP:-$top_builddir/examples/c/train_mlp}
launcher=${MPIEXEC:-mpiexec}
steps=${DSM_ZEROPP_STEPS:-60}
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
fail() { echo "FAIL: $*"; exit 1; }
final() { echo "$1" | sed -n 's/^final loss \([0-9.e+-]*\) .*/\1/p'; }
for nodes in 2:block a,a,a,b; do
    plain=$(DSM_SIM_NODES=$nodes timeout 300 $launcher -n 4 "$bin" "$top_srcdir/examples/c/train_mlp_fp16_zero3.json" \
            --steps "$steps" 2>&1) || fail "plain ZeRO-3 on nodes $nodes: $plain"
    hpz=2
    # 3 + 1: hpZ groups of 2 would span the nodes; qwZ and qgZ alone.
    cfg=$top_srcdir/examples/c/train_mlp_zeropp.json
    if [ "$nodes" = a,a,a,b ]; then
        cfg=$(mktemp) || fail mktemp
        sed 's/"zero_hpz_partition_size": 2/"zero_hpz_partition_size": 1/' \
            "$top_srcdir/examples/c/train_mlp_zeropp.json" >"$cfg"
        hpz=1
    fi
    quant=$(DSM_SIM_NODES=$nodes timeout 300 $launcher -n 4 "$bin" "$cfg" --steps "$steps" --describe 2>&1) ||
        fail "ZeRO++ on nodes $nodes: $quant"
    [ "$hpz" = 1 ] && rm -f "$cfg"
    echo "$quant" | grep -q "ZeRO++ quantized communication: weights int8" || fail "no quantization reported: $quant"
    p=$(final "$plain")
    q=$(final "$quant")
    [ -n "$p" ] && [ -n "$q" ] || fail "no final loss: $plain $quant"
    awk -v p="$p" -v q="$q" 'BEGIN { d = (q - p) / p; if (d < 0) d = -d; exit !(d <= 0.01) }' ||
        fail "nodes $nodes: final loss $q with hpZ $hpz + qwZ + qgZ, $p without: more than 1% apart"
    echo "nodes $nodes, $steps steps: final loss $p plain ZeRO-3, $q with hpZ $hpz + qwZ + qgZ"
done
exit 0
