#!/bin/sh
# The main example end to end: examples/c/train_mlp trains its MLP with each
# shipped configuration (ZeRO-2 fp32, ZeRO-3 fp16, ZeRO-1 bf16) at 1, 2 and 4
# ranks; the program itself fails unless the loss falls. Also a bad
# configuration must fail cleanly on every rank.
set -u
bin=$top_builddir/examples/c/train_mlp
launcher=${MPIEXEC:-mpiexec}
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
fail() { echo "FAIL: $*"; exit 1; }
for cfg in train_mlp.json train_mlp_fp16_zero3.json train_mlp_bf16_zero1.json; do
    for n in 1 2 4; do
        out=$(timeout 300 $launcher -n $n "$bin" "$top_srcdir/examples/c/$cfg" 2>&1) ||
            fail "$cfg at $n ranks: $out"
        echo "$out" | grep -q "final loss" || fail "$cfg at $n ranks printed no final loss: $out"
        echo "$cfg at $n ranks: $(echo "$out" | grep 'final loss')"
    done
done
out=$(timeout 300 $launcher -n 2 "$bin" "$top_srcdir/examples/c/missing.json" 2>&1) &&
    fail "a missing configuration must fail"
echo "$out" | grep -q "missing.json" || fail "the error does not name the file: $out"
exit 0
