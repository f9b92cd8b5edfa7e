#!/bin/sh
# train_transformer (examples/torch): the LibTorch C++ frontend transformer
# on 2 ranks with the shipped configuration (ZeRO-3, bf16): the bridge runs
# it block by block with bf16 compute, and the byte-level loss falls at least
# 2x in 40 steps (the program exits 2 otherwise). Then the check itself: the
# same run with a learning rate of 0 must fail it.
# shellcheck disable=SC2154 # top_builddir, top_srcdir: set by the test harness
set -u
run=$top_builddir/test/mpirun-wrapper.sh
bin=$top_builddir/examples/torch/train_transformer
cfg=$top_srcdir/examples/torch/train_transformer.json
export OMP_NUM_THREADS=1 DSM_TEST_TIMEOUT=${DSM_TEST_TIMEOUT:-300}
fail() { echo "FAIL: $*"; exit 1; }

out=$("$run" 2 "$bin" "$cfg" 2>&1) || fail "train_transformer: $out"
echo "$out"
echo "$out" | grep -q '^ZeRO-3 mode: blocks' || fail "the transformer did not run block by block"
echo "$out" | grep -q ', bfloat16 compute$' || fail "the transformer did not compute in bf16"

frozen=$(sed 's/"lr": 0.003/"lr": 0.0/' "$cfg")
out=$("$run" 2 "$bin" "$frozen" --steps 4 2>&1)
rc=$?
[ $rc -eq 2 ] || fail "with a learning rate of 0 the loss check did not fail (exit $rc): $out"
echo "ok: the loss falls 2x or more; with a learning rate of 0 the check fails"
