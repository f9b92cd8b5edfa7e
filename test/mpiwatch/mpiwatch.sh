#!/bin/sh
# The MPI profiling-interface layer (libdsm_mpiwatch.so, LD_PRELOAD): a
# program blocked in its own MPI call because a peer stalls ends with the
# watchdog's message naming the call, its communicator and ranks, how long,
# and the step; exit status 75; no process left. At 1, 2 and 4 ranks, for
# MPI_Recv, MPI_Allreduce, MPI_Barrier (on a named communicator) and
# MPI_Wait. Then with a second profiling tool loaded after the layer: both
# see the calls. No timing is asserted; a hang is caught by an outer
# timeout (a job the layer did not end fails).
#   DSM_MPIWATCH_CASES: "NP:MODE:VICTIM ..." to run other cases.
set -u
fail() { echo "FAIL: $*"; exit 1; }
top=${top_builddir:-.}
bin=$top/test/mpiwatch/stall
lib=$top/.libs/libdsm_mpiwatch.so
tool=$top/test/mpiwatch/.libs/libpmpi_count.so
[ -x "$bin" ] || { echo "SKIP: $bin not built"; exit 77; }
[ -f "$lib" ] || { echo "SKIP: $lib not built (static-only build?)"; exit 77; }
launcher=${MPIEXEC:-mpiexec}
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1
# Under the sanitizer build the preloaded layer comes before the program's
# ASan runtime in the list of libraries, which ASan refuses by default.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0:verify_asan_link_order=0"
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
unset DSM_NCCL_TIMEOUT DSM_WATCH_MPI
export LD_LIBRARY_PATH="$top/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
t=2
out=$(mktemp) || fail "mktemp"
trap 'rm -f "$out"' EXIT

# run NP MODE VICTIM PRELOAD: the job's exit status; its output in $out.
run() {
    DSM_COMM_TIMEOUT=$t timeout -k 5 120 $launcher -n "$1" env LD_PRELOAD="$4" "$bin" "$2" "$3" >"$out" 2>&1
}

cases=${DSM_MPIWATCH_CASES:-"1:recv:0 2:allreduce:1 4:barrier:3 4:wait:1"}
for c in $cases; do
    np=${c%%:*}; rest=${c#*:}; mode=${rest%%:*}; victim=${rest#*:}
    what="$np ranks, $mode, rank $victim stalled"
    rc=0
    run "$np" "$mode" "$victim" "$lib" || rc=$?
    [ "$rc" != 124 ] && [ "$rc" != 137 ] || fail "$what: the job hung (the layer did not end it): $(cat "$out")"
    [ "$rc" = 75 ] || fail "$what: exit status $rc, expected 75 (the watchdog's): $(cat "$out")"
    case $mode in
        allreduce) call=MPI_Allreduce; over="over MPI_COMM_WORLD ($np ranks; this rank is group rank" ;;
        barrier) call=MPI_Barrier; over="over stall_comm ($np ranks; this rank is group rank" ;;
        recv) call=MPI_Recv; over="source rank $victim: MPI_Recv over MPI_COMM_WORLD ($np ranks" ;;
        wait) call=MPI_Wait; over="MPI_Wait, at step" ;;
    esac
    grep -q "dsm watchdog: rank [0-9]* (host .*, pid [0-9]*) has waited [0-9]* s (DSM_COMM_TIMEOUT=$t) in the program's own MPI call (outside libdsm)" "$out" ||
        fail "$what: no watchdog message naming the program's call: $(cat "$out")"
    grep -q "$call" "$out" || fail "$what: the message does not name $call: $(cat "$out")"
    grep -qF "$over" "$out" || fail "$what: the message lacks '$over': $(cat "$out")"
    grep -q "at step [0-9]*, micro-step [0-9]*" "$out" || fail "$what: the message does not name the step: $(cat "$out")"
    if [ "$np" -gt 1 ] && [ "$mode" != wait ]; then
        grep -q "The other ranks of the group: .*rank $victim (group rank $victim, host " "$out" ||
            fail "$what: the message does not name the other ranks: $(cat "$out")"
    fi
    grep -q "Ending the job with MPI_Abort, exit status 75" "$out" || fail "$what: no word of the end: $(cat "$out")"
    left=$(pgrep -f "^[^ ]*stall $mode $victim\$" | tr "\n" " ")
    [ -z "$left" ] || { kill -9 $left 2>/dev/null; fail "$what: processes left: $left"; }
    echo "ok: $what: $(grep -o "has waited [0-9]* s" "$out" | head -n 1), $call named"
done

# A second tool loaded after the layer sees the calls too, and the layer
# still ends the job.
if [ -f "$tool" ] && [ -z "${DSM_MPIWATCH_CASES:-}" ]; then
    rc=0
    run 2 allreduce 1 "$lib $tool" || rc=$?
    [ "$rc" = 75 ] || fail "with a second tool: exit status $rc, expected 75: $(cat "$out")"
    grep -q "pmpi_count: saw MPI_Allreduce" "$out" || fail "the second tool did not see MPI_Allreduce: $(cat "$out")"
    grep -q "in the program's own MPI call (outside libdsm).*MPI_Allreduce" "$out" ||
        fail "with a second tool: no watchdog message naming MPI_Allreduce: $(cat "$out")"
    echo "ok: with a second profiling tool loaded after the layer: both see MPI_Allreduce"
fi
echo "PASS"
