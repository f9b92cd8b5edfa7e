#!/bin/sh
# The main example end to end: examples/c/train_mlp (or the program
# $DSM_TRAIN_MLP names: train_mlp_fortran.sh runs its Fortran twin) trains its MLP with each
# shipped configuration (ZeRO-2 fp32, ZeRO-3 fp16, ZeRO-1 bf16) at 1, 2 and 4
# ranks; the program itself fails unless the loss falls. Also a bad
# configuration must fail cleanly on every rank.
set -u
bin=${DSM_TRAIN_MLP:-$top_builddir/examples/c/train_mlp}
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
# Checkpoints: 40 steps on 4 ranks saving every 20, then resumed on 2 ranks
# up to step 60. Where configure found no parallel HDF5 (DSM_HAVE_HDF5=0,
# set by the test harness from configure's result), the run must fail
# cleanly on every rank saying that libdsm was built without it.
case ${DSM_HAVE_HDF5:-} in
    0 | 1) ;;
    *) fail "DSM_HAVE_HDF5 is '${DSM_HAVE_HDF5:-}' (expected 0 or 1: configure's result, set by make check)" ;;
esac
ckdir=$(mktemp -d) || fail "mktemp"
trap 'rm -rf "$ckdir"' EXIT
cfg=$top_srcdir/examples/c/train_mlp.json
out=$(timeout 300 $launcher -n 4 "$bin" "$cfg" --steps 40 --checkpoint "$ckdir" --save-every 20 2>&1)
rc=$?
if [ "$DSM_HAVE_HDF5" = 0 ]; then
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$rc" -lt 128 ] ||
        fail "checkpoints without parallel HDF5: exit status $rc, expected a clean failure: $out"
    echo "$out" | grep -q "checkpoints need parallel HDF5: this libdsm was built without it" ||
        fail "checkpoints without parallel HDF5: the error does not say so: $out"
    echo "checkpoints: refused cleanly (libdsm built without parallel HDF5)"
else
    [ "$rc" = 0 ] || fail "training with checkpoints (exit status $rc): $out"
    for f in global_step20.h5 global_step40.h5; do [ -f "$ckdir/$f" ] || fail "no $f after 40 steps"; done
    [ "$(cat "$ckdir/latest")" = global_step40 ] || fail "latest is $(cat "$ckdir/latest")"
    echo "$out" | grep -q "^saved a checkpoint of step 20 in $ckdir\$" || fail "the save of step 20 is not announced: $out"
    # The resume at DSM_DEBUG=INFO: rank 0 alone logs the load's and each
    # save's start, and the end with the size, the time and the rate.
    out=$(DSM_DEBUG=INFO DSM_DEBUG_SUBSYS=ENGINE timeout 300 $launcher -n 2 "$bin" "$cfg" \
          --steps 60 --checkpoint "$ckdir" --save-every 20 2>&1) ||
        fail "resuming on 2 ranks: $out"
    echo "$out" | grep -q "resumed from .* at step 40" || fail "no resume: $out"
    [ "$(echo "$out" | grep -c "checkpoint load '.*/global_step40.h5': .* tensors, .* MB of values, starting")" = 1 ] ||
        fail "no single start line of the load: $out"
    [ "$(echo "$out" | grep -Ec "loaded checkpoint '.*/global_step40.h5': [0-9.]+ MB in [0-9.]+ s \([0-9.]+ GB/s\)")" = 1 ] ||
        fail "no single end line of the load: $out"
    [ "$(echo "$out" | grep -Ec "saved checkpoint '.*/global_step60.h5': [0-9.]+ MB in [0-9.]+ s \([0-9.]+ GB/s\)")" = 1 ] ||
        fail "no single end line of the save: $out"
    echo "$out" | grep -q "final loss" || fail "no final loss after the resume: $out"
    [ "$(cat "$ckdir/latest")" = global_step60 ] || fail "latest after the resume is $(cat "$ckdir/latest")"
    echo "checkpoints: 40 steps on 4 ranks, resumed on 2 to step 60: $(echo "$out" | grep 'final loss')"
fi
out=$(timeout 300 $launcher -n 2 "$bin" "$top_srcdir/examples/c/missing.json" 2>&1) &&
    fail "a missing configuration must fail"
echo "$out" | grep -q "missing.json" || fail "the error does not name the file: $out"
exit 0
