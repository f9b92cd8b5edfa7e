#!/bin/sh
# Random kills during training with a checkpoint at every step: each round a
# job of 2 or 4 ranks trains and saves until one of its ranks, or all of
# them, get SIGKILL at a random moment; then a job on another rank count
# resumes from `latest`. Every resume must start at exactly the step `latest`
# names (the checkpoint's client state says the step it was saved at), and
# no temporary may be left after the next save.
#   DSM_KILL_ROUNDS (default 6; 80 for the long run), DSM_KILL_SEED.
set -u
fail() { echo "FAIL: $*"; exit 1; }
bin=${top_builddir:-.}/test/tools/make_checkpoint
[ -x "$bin" ] || { echo "SKIP: $bin not built"; exit 77; }
launcher=${MPIEXEC:-mpiexec}
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
unset DSM_CKPT_FAULT
rounds=${DSM_KILL_ROUNDS:-6}
seed=${DSM_KILL_SEED:-$$}
echo "kill loop: $rounds rounds, seed $seed"
dir=$(mktemp -d) || fail "mktemp"
trap 'rm -rf "$dir"' EXIT
out=$dir.out
rows=20000

# rand N: R = a number in 0..N-1 from the seeded sequence.
rand() {
    seed=$(( (seed * 1103515245 + 12345) % 2147483648 ))
    R=$(( seed / 65536 % $1 ))
}

timeout -k 10 300 $launcher -n 2 "$bin" "$dir" --rows $rows --steps 2 --save-every 1 >"$out" 2>&1 ||
    fail "first job: $(cat "$out")"
r=1
while [ "$r" -le "$rounds" ]; do
    rand 2
    np=$(( 2 + 2 * R ))
    before=$(cat "$dir/latest")
    timeout -k 10 300 $launcher -n $np "$bin" "$dir" --resume --rows $rows --steps 100000 --save-every 1 >"$out" 2>&1 &
    job=$!
    # Kill only once the job has saved (its ranks are past MPI_Init and the
    # load: a rank killed while MPI starts can leave Open MPI's launcher
    # waiting for ever, which is not what this loop tests).
    tries=0
    while [ "$(cat "$dir/latest")" = "$before" ] && [ $tries -lt 1200 ] && kill -0 $job 2>/dev/null; do
        sleep 0.1 2>/dev/null || sleep 1
        tries=$((tries + 1))
    done
    # Let it train and save for 0.5 to 3.4 s more, then kill one rank or all.
    rand 3
    sleep "$R.$(( seed % 10 ))" 2>/dev/null || sleep 1
    sleep 0.5 2>/dev/null
    # The ranks (not the launcher or a wrapper script), once they run: on a
    # loaded machine they may still be starting.
    pids=
    tries=0
    while [ -z "$pids" ] && [ $tries -lt 1200 ] && kill -0 $job 2>/dev/null; do
        pids=$(pgrep -f "^[^ ]*make_checkpoint $dir --resume" | tr "\n" " ")
        [ -n "$pids" ] || sleep 0.1 2>/dev/null || sleep 1
        tries=$((tries + 1))
    done
    [ -n "$pids" ] || { wait $job; fail "round $r: the job ended before the kill: $(cat "$out")"; }
    rand 3
    if [ "$R" = 0 ]; then
        what="all $np ranks"
        kill -9 $pids 2>/dev/null
    else
        set -- $pids
        rand $#
        i=$(( R + 1 ))
        eval victim=\${$i}
        what="one of $np ranks (pid $victim)"
        kill -9 "$victim" 2>/dev/null
    fi
    wait $job
    tag=$(cat "$dir/latest") || fail "round $r: no latest"
    step=${tag#global_step}
    rand 4
    other=$(( 1 + R ))
    timeout -k 10 300 $launcher -n $other "$bin" "$dir" --resume --rows $rows --steps 0 >"$out" 2>&1 ||
        fail "round $r: resume on $other ranks after killing $what: $(cat "$out")"
    grep -q "resumed step $step at step $step\$" "$out" ||
        fail "round $r: latest is $tag but: $(cat "$out")"
    echo "round $r: killed $what; resumed on $other ranks at step $step, as latest says"
    r=$((r + 1))
done
# One clean save clears what the kills left.
timeout -k 10 300 $launcher -n 2 "$bin" "$dir" --resume --rows $rows --steps 1 --save-every 1 >"$out" 2>&1 ||
    fail "last job: $(cat "$out")"
left=$(ls -A "$dir" | grep '\.tmp$\|\.reserve$\|^\.dsm-dircheck') && fail "leftovers after a clean save: $left"
echo "PASS: $rounds kills, every resume at the step latest names"
exit 0
