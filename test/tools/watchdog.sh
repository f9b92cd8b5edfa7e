#!/bin/sh
# The watchdog (DSM_COMM_TIMEOUT): one rank of a training job stopped with
# SIGSTOP must not hang the others. For 2 and 4 ranks, the mpi and shm
# backends, overlap_comm off and on (a progress thread under
# MPI_THREAD_MULTIPLE), a job trains with a checkpoint every 10 steps until one
# of its ranks is stopped; then
#   - the whole job ends (under the outer timeout, the hang guard) with exit
#     status 75 (the watchdog's, through MPI_Abort) and the message naming
#     the wait; how soon (DSM_COMM_TIMEOUT + 10 s) is a deadline, asserted by
#     the multinode stage's link_down, not on a loaded machine here;
#     in a collective of the shm backend the message names the stopped rank
#     as the one that did not arrive (or says that every rank of the node
#     reached the synchronization), elsewhere that MPI cannot tell;
#   - no process of the job is left (the stopped one included);
#   - a job resumed from `latest` on the same number of ranks, and one on
#     fewer, starts at exactly the step `latest` names.
#   DSM_WATCHDOG_CASES: "NP:BACKEND:OVERLAP ..." to run other cases.
set -u
fail() { echo "FAIL: $*"; exit 1; }
bin=${top_builddir:-.}/test/tools/make_checkpoint
[ -x "$bin" ] || { echo "SKIP: $bin not built"; exit 77; }
launcher=${MPIEXEC:-mpiexec}
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
unset DSM_CKPT_FAULT DSM_NCCL_TIMEOUT
timeout_s=3
rows=2000
cases=${DSM_WATCHDOG_CASES:-"2:mpi:0 2:shm:0 2:mpi:1 2:shm:1 4:mpi:0 4:shm:0 4:mpi:1 4:shm:1"}
base=$(mktemp -d) || fail "mktemp"
trap 'rm -rf "$base"' EXIT
n=0
for c in $cases; do
    np=${c%%:*}
    rest=${c#*:}
    backend=${rest%%:*}
    overlap=${rest#*:}
    n=$((n + 1))
    dir=$base/c$n
    mkdir -p "$dir"
    out=$dir.out
    extra=
    what="$np ranks, $backend backend"
    if [ "$overlap" = 1 ]; then
        extra="--stage 2 --overlap"
        what="$what, overlap_comm"
    fi
    # shellcheck disable=SC2086
    DSM_COMM_TIMEOUT=$timeout_s DSM_COMM_BACKEND=$backend timeout -k 5 120 $launcher -n "$np" "$bin" "$dir" \
        --rows $rows --steps 1000000 --save-every 10 $extra >"$out" 2>&1 &
    job=$!
    # Stop a rank once the job has saved (its ranks are past MPI_Init and
    # train), and some steps after.
    tries=0
    while [ ! -e "$dir/latest" ] && [ $tries -lt 1200 ] && kill -0 $job 2>/dev/null; do
        sleep 0.1 2>/dev/null || sleep 1
        tries=$((tries + 1))
    done
    [ -e "$dir/latest" ] || { kill $job 2>/dev/null; wait $job; fail "$what: no checkpoint before the stop: $(cat "$out")"; }
    sleep 0.5 2>/dev/null || sleep 1
    pids=$(pgrep -f "^[^ ]*make_checkpoint $dir " | tr "\n" " ")
    [ -n "$pids" ] || { wait $job; fail "$what: the job ended before the stop: $(cat "$out")"; }
    set -- $pids
    [ $# = "$np" ] || { kill -9 $pids 2>/dev/null; wait $job; fail "$what: found $# ranks, expected $np: $pids"; }
    victim=$2
    vrank=$(tr '\0' '\n' < /proc/"$victim"/environ 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p;s/^PMI_RANK=//p' | head -n 1)
    start=$(date +%s) # (reported below, not asserted)
    kill -STOP "$victim"
    rc=0
    wait $job || rc=$?
    took=$(( $(date +%s) - start ))
    left=$(pgrep -f "^[^ ]*make_checkpoint $dir " | tr "\n" " ")
    if [ -n "$left" ]; then
        kill -9 $left 2>/dev/null
        fail "$what: processes left after the job ended: $left"
    fi
    [ "$rc" = 75 ] || fail "$what: exit status $rc, expected 75 (the watchdog's); output: $(cat "$out")"
    grep -q "dsm watchdog: rank [0-9]* (host .*) has waited [0-9]* s (DSM_COMM_TIMEOUT=$timeout_s) in " "$out" ||
        fail "$what: no watchdog message: $(cat "$out")"
    grep -q "looks the same as a stalled" "$out" || fail "$what: the message does not warn about the program's own code"
    grep -q "exit status 75" "$out" || fail "$what: the message does not name the exit status"
    if grep -q "dsm watchdog: .* in .*: shm " "$out"; then
        # Stopped in a collective of the shm backend (not in a save, say).
        if [ -n "$vrank" ]; then
            grep -q "ranks that did not arrive.*rank $vrank (group rank" "$out" ||
                grep -q "every rank of this node reached" "$out" ||
                fail "$what: the message does not name rank $vrank as missing: $(cat "$out")"
        fi
    else
        grep -q "cannot tell which ranks did not arrive" "$out" || grep -q "ranks that did not arrive" "$out" ||
            fail "$what: the message says nothing of the ranks that did not arrive: $(cat "$out")"
    fi
    msg=$(grep -m 1 "dsm watchdog:" "$out")
    # No hash or fingerprint: a bucket by its index and parameters.
    ! printf '%s\n' "$msg" | grep -q "[0-9]\{10\}" || fail "$what: the message prints a number of 10 digits or more: $msg"
    # Requeue: the same ranks, then fewer, each at exactly latest's step.
    tag=$(cat "$dir/latest") || fail "$what: no latest"
    step=${tag#global_step}
    for rnp in "$np" $((np / 2)); do
        timeout -k 5 120 $launcher -n "$rnp" "$bin" "$dir" --resume --rows $rows --steps 0 >"$out" 2>&1 ||
            fail "$what: resume on $rnp ranks: $(cat "$out")"
        grep -q "resumed step $step at step $step\$" "$out" || fail "$what: latest is $tag but on $rnp ranks: $(cat "$out")"
    done
    echo "$what: rank ${vrank:-?} stopped; the job ended in ${took} s with status 75; resumed at step $step on $np and $((np / 2)) ranks"
    echo "  $msg"
done
echo "PASS: every stopped job ended with status 75 and resumed where latest says"
exit 0
