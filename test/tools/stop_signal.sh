#!/bin/sh
# The stop signal end to end: train_mlp under the MPI launcher with
# DSM_STOP_SIGNAL=USR1 gets SIGUSR1 (its ranks, not the launcher) while it
# trains; it must save a checkpoint of the step it stopped at, say so, and
# exit with status 3; a job on another number of ranks resumes from that
# very step.
set -u
fail() { echo "FAIL: $*"; [ -f "$dir/out" ] && tail -20 "$dir/out"; exit 1; }
bin=$top_builddir/examples/c/train_mlp
cfg=$top_srcdir/examples/c/train_mlp.json
launcher=${MPIEXEC:-mpiexec}
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
dir=$(mktemp -d) || fail "mktemp"
trap 'pkill -KILL -f "train_mlp.*$dir" 2> /dev/null; rm -rf "$dir"' EXIT

DSM_STOP_SIGNAL=USR1 timeout -k 10 300 $launcher -n 2 "$bin" "$cfg" --steps 1000000 --checkpoint "$dir/ckpt" \
    --save-every 1000000 > "$dir/out" 2>&1 &
job=$!
# Once it trains (the first loss line is printed at step 1).
n=0
until grep -q "^step " "$dir/out"; do
    kill -0 $job 2> /dev/null || fail "the job ended before training"
    n=$((n + 1)); [ $n -lt 600 ] || fail "no training step within 60 s"
    sleep 0.1
done
# The ranks only (their command is train_mlp or libtool's lt-train_mlp), not timeout or the launcher.
signalled=0
for p in $(pgrep -f "train_mlp.*$dir"); do
    case $(cat /proc/$p/comm 2> /dev/null) in
        *train_mlp*) kill -USR1 "$p" && signalled=$((signalled + 1)) ;;
    esac
done
[ $signalled -gt 0 ] || fail "no rank to signal"
wait $job
rc=$?
[ $rc -eq 3 ] || fail "the signalled job exited $rc, expected 3"
step=$(sed -n 's/^train_mlp: stopped on the stop signal after step \([0-9]*\) (checkpoint saved)$/\1/p' "$dir/out")
[ -n "$step" ] || fail "no 'stopped on the stop signal' line"
grep -q "^saved a checkpoint of step $step in $dir/ckpt\$" "$dir/out" || fail "no checkpoint of step $step"
[ "$(cat "$dir/ckpt/latest")" = "global_step$step" ] || fail "latest is $(cat "$dir/ckpt/latest"), not step $step"
echo "stopped at step $step with a checkpoint"

timeout -k 10 300 $launcher -n 3 "$bin" "$cfg" --steps $((step + 3)) --checkpoint "$dir/ckpt" > "$dir/out" 2>&1
rc=$?
[ $rc -eq 0 ] || [ $rc -eq 2 ] || fail "the resumed job exited $rc"
grep -q "^resumed from $dir/ckpt/latest at step $step\$" "$dir/out" || fail "the job did not resume at step $step"
echo "PASS: stopped on SIGUSR1 at step $step, saved, and resumed there on 3 ranks"
exit 0
