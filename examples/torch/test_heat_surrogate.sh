#!/bin/sh
# heat_surrogate (examples/torch): the Fortran simulation that trains its
# surrogate online, on 2 ranks with the shipped configuration (ZeRO-3).
#  1. 300 steps straight: the loss falls tenfold and the surrogate is within
#     the program's bounds (one-step error 0.3, 20-step rollout error 0.2 of
#     the solver's change; the program exits 2 otherwise).
#  2. The same run interrupted: 200 steps with checkpoints, then a restart
#     to 300. The restart resumes at step 200 and continues exactly: every
#     loss from step 201 on, the final weights (safetensors) and the final
#     errors are bit for bit those of the straight run.
#  3. The trained model exported as TorchScript loads in PyTorch and gives
#     an error within the same bound on the pair the program wrote.
# shellcheck disable=SC2154 # top_builddir, top_srcdir: set by the test harness
set -u
run=$top_builddir/test/mpirun-wrapper.sh
bin=$top_builddir/examples/torch/heat_surrogate
src=$top_srcdir/examples/torch
export OMP_NUM_THREADS=1 DSM_TEST_TIMEOUT=${DSM_TEST_TIMEOUT:-300}
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d) || fail "mktemp"
trap 'rm -rf "$tmp"' EXIT
"$src/torch_python.sh" "$src/make_models.py" "$tmp" || fail "make_models.py"
hs() { "$run" 2 "$bin" "$src/heat_surrogate.json" "$tmp/heat_surrogate.pt" "$@" 2>&1; }

out=$(hs --steps 300 --checkpoint "$tmp/a" --log "$tmp/a.log" --export "$tmp/a.safetensors" \
      --torchscript "$tmp/a.pt" --pair "$tmp/pair.bin") || fail "the straight run: $out"
echo "$out" | grep -E '^(step|loss|surrogate|  ZeRO-3)'
echo "$out" | grep -q '  ZeRO-3 mode blocks' || fail "the surrogate did not run block by block: $out"
[ "$(wc -l < "$tmp/a.log")" -eq 300 ] || fail "the straight run logged $(wc -l < "$tmp/a.log") steps, not 300"

out2=$(hs --steps 200 --checkpoint "$tmp/b") || fail "the run to step 200: $out2"
out3=$(hs --steps 300 --checkpoint "$tmp/b" --log "$tmp/b.log" --export "$tmp/b.safetensors") ||
    fail "the restart: $out3"
echo "$out3" | grep -q "resumed from $tmp/b/latest at step 200" || fail "the restart did not resume at step 200: $out3"
[ "$(head -n 1 "$tmp/b.log" | cut -d' ' -f1)" = 201 ] || fail "the restart's first step is not 201"
tail -n 100 "$tmp/a.log" | cmp -s - "$tmp/b.log" ||
    fail "the restart's losses differ from the straight run's: $(tail -n 100 "$tmp/a.log" | diff - "$tmp/b.log" | head -n 4)"
cmp -s "$tmp/a.safetensors" "$tmp/b.safetensors" || fail "the restart's final weights differ from the straight run's"
e1=$(echo "$out" | grep '^surrogate:')
e3=$(echo "$out3" | grep '^surrogate:')
[ -n "$e1" ] && [ "$e1" = "$e3" ] || fail "the restart's surrogate differs: '$e1' vs '$e3'"
echo "ok: the restart resumed at step 200 and continued bit for bit (losses 201-300, weights, $e3)"

py=$("$src/torch_python.sh" "$src/make_models.py" check "$tmp/a.pt" "$tmp/pair.bin") || fail "make_models.py check: $py"
echo "$py"
err=${py##* }
awk -v e="$err" 'BEGIN { exit !(e < 0.3) }' || fail "PyTorch's error of the exported surrogate is $err, above 0.3"
echo "ok: the exported TorchScript surrogate loads in PyTorch, error $err"
