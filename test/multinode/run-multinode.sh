#!/bin/bash
# The MPI tests across simulated nodes (`make check-multinode`), with the
# multinode harness (README.txt in MULTINODE_DIR): every node its own host
# name, network, /dev/shm and PID namespace; ranks on different nodes talk
# over TCP. Layouts (nodes x ranks per node; block order unless "rr"):
#   2x2      every MPI test program (C, C++ and Fortran)
#   2x2-rr   2 nodes x 2, round robin (rank r on node r % 2)
#   4x1      4 nodes x 1
#   3+1      2 nodes, uneven: ranks 0-2 on node0, rank 3 on node1
#   1+2+1    3 nodes, uneven
# The last four run the tests whose behaviour depends on where the ranks
# are (NODE_TESTS below); the two longest of them, test_comm and test_engine
# (about a minute each per layout) only in HEAVY_LAYOUTS: 2x2-rr (nodes not
# contiguous in rank order) and 1+2+1, which has both the nodes of one rank
# of 4x1 and the uneven nodes of 3+1 (MN_TESTS naming them runs them in
# every layout); test_engine runs only its tests whose collectives cross
# the nodes (ENGINE_NODE_CASES). Then ckpt_node_local: a checkpoint into a
# node-local TMPDIR at 2 nodes x 1 fails on every rank with the reason; and
# link_down: at 2x2, node1's link set down during training (ip link set mn0
# down in its namespace) ends the job within DSM_COMM_TIMEOUT + 10 s with the
# watchdog's message and exit status 75, and the job resumes at the step
# `latest` names on both nodes, then on node0 alone (the node that dropped
# left out); cut_off: at 2x1 with the kernel's default TCP settings, node1's
# link set down during training: both ranks end with the watchdog's message
# (rank 1 by itself, blocked in the program's own MPI_Allreduce: the MPI
# profiling layer) and the launcher (scripts/launcher/dsm-run.sh) returns
# within DSM_COMM_TIMEOUT + 30 s.
#
# Environment (make passes the first four):
#   top_builddir, top_srcdir  the build and source trees
#   MULTINODE_DIR             the harness (default: top_srcdir/../shared/multinode)
#   MN_MPI_TESTS              the test programs, relative to top_builddir
#   MN_TIMEOUT                seconds per run before it is killed and fails (default 300)
#   MN_LAYOUTS                the layouts to run (default: all five)
#   MN_TESTS                  run only these test names (e.g. "test_comm test_sp ckpt_node_local")
# Logs: top_builddir/test/multinode/logs/LAYOUT/TEST.log; a summary in
# automake's form in test/multinode/test-suite.log. Exit status: 0 when every run
# passed, 1 when one failed, 77 (skipped) without root or without the harness.
set -uo pipefail

build=$(cd "${top_builddir:-.}" && pwd)
src=$(cd "${top_srcdir:-$(dirname "$0")/../..}" && pwd)
mn=${MULTINODE_DIR:-$src/../shared/multinode}
out=$build/test/multinode/logs
summary=$build/test/multinode/test-suite.log

NODE_TESTS="test_comm test_mesh test_mesh_placement test_mesh_roles test_engine test_checkpoint test_sp test_engine_errors test_engine_hpz test_engine_quant"
LAYOUTS=${MN_LAYOUTS:-"2x2 2x2-rr 4x1 3+1 1+2+1"}
HEAVY_TESTS="test_comm test_engine"
HEAVY_LAYOUTS="2x2 2x2-rr 1+2+1"
# test_engine across nodes (DSM_TEST_ONLY): its tests whose collectives cross
# the nodes (every ZeRO stage, the mesh, init, overlap's progress thread);
# its optimizer, precision, offload and device tests do the same work on any
# layout and run in `make check` (MN_TESTS naming test_engine runs them all).
ENGINE_NODE_CASES="test_stages test_allreduce_semantics test_counters test_init_paths test_dp_sp_mesh test_describe test_overlap_bits test_overlap_reacquire"

skip() {
    echo "check-multinode: SKIPPED: $*"
    mkdir -p "${summary%/*}"
    printf '# TOTAL: 0\n# PASS: 0\n# SKIP: 1\n# FAIL: 0\n# ERROR: 0\n\nskipped: %s\n' "$*" >"$summary"
    exit 77
}
[ "$(id -u)" = 0 ] || skip "the simulated nodes need root (network namespaces); run it as root"
[ -x "$mn/run.sh" ] && [ -x "$mn/up.sh" ] && [ -x "$mn/down.sh" ] ||
    skip "no multinode harness in $mn (set MULTINODE_DIR to its directory)"
[ -n "${MN_MPI_TESTS:-}" ] || skip "no MPI test programs (configured without CMocka?)"

# layout -> "NODES RANKS_PER_NODE MAP"
layout_args() {
    case $1 in
    2x2) echo "2 2 slot" ;;
    2x2-rr) echo "2 2 node" ;;
    4x1) echo "4 1 slot" ;;
    3+1) echo "2 3,1 slot" ;;
    1+2+1) echo "3 1,2,1 slot" ;;
    *) echo "check-multinode: unknown layout '$1' (known: 2x2 2x2-rr 4x1 3+1 1+2+1)" >&2; exit 99 ;;
    esac
}
wanted() { # a test the caller asked for (all when MN_TESTS is unset)
    [ -z "${MN_TESTS:-}" ] && return 0
    case " $MN_TESTS " in *" $1 "*) return 0 ;; esac
    return 1
}

nodes=1
for l in $LAYOUTS; do
    layout_args "$l" >/dev/null # (exits on an unknown layout)
    read -r n _ _ <<<"$(layout_args "$l")"
    [ "$n" -gt "$nodes" ] && nodes=$n
done

# As `make check` runs the MPI tests (test/mpirun-wrapper.sh): one OpenMP
# thread per rank, no leak checks under the sanitizers (Open MPI leaks).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} MN_TIMEOUT=${MN_TIMEOUT:-300}
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
export top_builddir=$build top_srcdir=$src

trap '"$mn/down.sh" >/dev/null 2>&1 || true' EXIT
trap 'exit 130' INT TERM
"$mn/up.sh" "$nodes" || { echo "check-multinode: FAIL: $mn/up.sh $nodes failed"; exit 1; }

# The tests' wall-clock deadlines (test_deadlines() in test/mpi/mpi_test.h)
# are asserted here, not in `make check`.
export DSM_TEST_DEADLINES=1
rm -rf "$out" "$summary" # (the logs only: in a build in the source tree, test/multinode holds this script)
mkdir -p "$out"
cd "$build" || exit 1
start=$(date +%s)
passed=0 failed=0 failures=''
for l in $LAYOUTS; do
    read -r n rpn map <<<"$(layout_args "$l")"
    mkdir -p "$out/$l"
    for prog in $MN_MPI_TESTS; do
        name=${prog##*/}
        wanted "$name" || continue
        if [ "$l" != 2x2 ]; then
            case " $NODE_TESTS " in *" $name "*) ;; *) continue ;; esac
        fi
        case " $HEAVY_TESTS " in
            *" $name "*) case " $HEAVY_LAYOUTS " in *" $l "*) ;; *) [ -n "${MN_TESTS:-}" ] || continue ;; esac ;;
        esac
        log=$out/$l/$name.log
        t0=$(date +%s)
        only=
        [ "$name" = test_engine ] && [ -z "${MN_TESTS:-}" ] && only=$ENGINE_NODE_CASES
        DSM_TEST_ONLY=$only MN_MAP=$map "$mn/run.sh" "$n" "$rpn" "$build/$prog" >"$log" 2>&1
        rc=$?
        took=$(($(date +%s) - t0))
        if [ "$rc" = 0 ]; then
            passed=$((passed + 1))
            echo "PASS: $l $name (${took} s)"
        else
            failed=$((failed + 1))
            why="exit $rc"
            [ "$rc" = 124 ] && why="killed after MN_TIMEOUT=${MN_TIMEOUT} s (hang?)"
            echo "FAIL: $l $name ($why; log: $log)"
            failures+="$l $name $log"$'\n'
        fi
    done
done
# A checkpoint into a directory that only some ranks see (a node-local
# TMPDIR, as on clusters): every rank must fail at once with the reason, not
# hang (the reliability issue's fix, proven across real nodes).
if wanted ckpt_node_local && [ -x "$build/tools/dsm-ckpt" ]; then # (built with HDF5)
    log=$out/ckpt_node_local.log
    t0=$(date +%s)
    TMPDIR=/run/mnode/tmp MN_MAP=slot "$mn/run.sh" 2 1 "$build/tools/dsm-bench" checkpoint --params 100000 \
        >"$log" 2>&1
    rc=$?
    took=$(($(date +%s) - t0))
    if [ "$rc" != 0 ] && [ "$rc" != 124 ] && grep -q "every rank must name one shared directory" "$log"; then
        passed=$((passed + 1))
        echo "PASS: 2x1 ckpt_node_local (refused in ${took} s)"
    else
        failed=$((failed + 1))
        echo "FAIL: 2x1 ckpt_node_local (exit $rc after ${took} s, expected the shared-directory error; log: $log)"
        failures+="2x1 ckpt_node_local $log"$'\n'
    fi
fi
# A node that drops off the network during training: the watchdog ends the
# job (never a silent hang), and the restart loses nothing before `latest`.
if wanted link_down && [ -x "$build/test/tools/make_checkpoint" ]; then # (built with HDF5 and CMocka)
    log=$out/link_down.log
    ckdir=$out/link_down-ckpt
    limit=5
    rm -rf "$ckdir" && mkdir -p "$ckdir"
    DSM_COMM_TIMEOUT=$limit MN_MAP=slot MN_TIMEOUT=120 "$mn/run.sh" 2 2 "$build/test/tools/make_checkpoint" "$ckdir" \
        --rows 2000 --steps 1000000 --save-every 10 >"$log" 2>&1 &
    job=$!
    tries=0
    while [ ! -s "$ckdir/latest" ] && [ $tries -lt 600 ] && kill -0 $job 2>/dev/null; do
        sleep 0.2
        tries=$((tries + 1))
    done
    sleep 1
    # mpiexec, once the watchdog's MPI_Abort reached it, waits for the lost
    # node's daemon as long as TCP retransmits to it (net.ipv4.tcp_retries2:
    # 15, some 15 minutes, by default); a cluster that wants a lost node
    # noticed soon lowers it, as here (per node namespace: nothing outside
    # the simulated nodes changes).
    for i in 0 1; do ip netns exec "${MN_NS_PREFIX:-mn-}node$i" sysctl -qw net.ipv4.tcp_retries2=2; done
    t0=$(date +%s)
    ip netns exec "${MN_NS_PREFIX:-mn-}node1" ip link set mn0 down
    rc=0
    wait $job || rc=$?
    took=$(($(date +%s) - t0))
    ip netns exec "${MN_NS_PREFIX:-mn-}node1" ip link set mn0 up
    why=""
    [ "$rc" = 75 ] || why="exit $rc, expected 75 (the watchdog's)"
    [ "$took" -le $((limit + 10)) ] || why="${why:+$why; }ended ${took} s after the link went down (bound $((limit + 10)) s)"
    grep -q "dsm watchdog: rank .* has waited [0-9]* s (DSM_COMM_TIMEOUT=$limit)" "$log" || why="${why:+$why; }no watchdog message"
    if [ -z "$why" ]; then
        tag=$(cat "$ckdir/latest")
        step=${tag#global_step}
        for layout in "2 2" "1 2"; do
            read -r rn rr <<<"$layout"
            MN_MAP=slot "$mn/run.sh" "$rn" "$rr" "$build/test/tools/make_checkpoint" "$ckdir" --resume --rows 2000 \
                --steps 0 >>"$log" 2>&1 || { why="the resume on $rn node(s) x $rr failed"; break; }
            tail -n 5 "$log" | grep -q "resumed step $step at step $step\$" ||
                { why="the resume on $rn node(s) x $rr did not start at step $step ($tag)"; break; }
        done
    fi
    if [ -z "$why" ]; then
        passed=$((passed + 1))
        echo "PASS: 2x2 link_down (ended in ${took} s with status 75; resumed at step $step on 2x2 and 1x2)"
    else
        failed=$((failed + 1))
        echo "FAIL: 2x2 link_down ($why; log: $log)"
        failures+="2x2 link_down $log"$'\n'
    fi
fi
# cut_off: 2 nodes x 1 rank, examples/c/train_mlp through
# scripts/launcher/dsm-run.sh with DSM_WATCH_MPI=1 (the MPI profiling layer
# preloaded), the kernel's default TCP settings (tcp_retries2 as the nodes
# start), node1's link set down during training. Rank 1, cut off, blocked in
# the program's own MPI_Allreduce (the loss average) or in libdsm, ends by
# itself within DSM_COMM_TIMEOUT + 10 s with the watchdog's message; rank 0
# too, with its message; the launcher returns within DSM_COMM_TIMEOUT + 30 s
# with exit status 75. Each rank's stderr goes to a file of its own (rank
# 1's could not reach mpiexec).
if wanted cut_off && [ -x "$build/examples/c/train_mlp" ]; then
    log=$out/cut_off.log
    dir=$out/cut_off
    limit=10
    rm -rf "$dir" && mkdir -p "$dir"
    for i in 0 1; do ip netns exec "${MN_NS_PREFIX:-mn-}node$i" sysctl -qw net.ipv4.tcp_retries2=15; done
    # each rank's stderr to a file of its own too (rank 1's cannot reach mpiexec)
    printf '#!/bin/bash\nexec "$@" 2> >(tee -a "%s/rank$OMPI_COMM_WORLD_RANK.err" >&2)\n' "$dir" >"$dir/rank_err.sh"
    chmod +x "$dir/rank_err.sh"
    LD_LIBRARY_PATH="$build/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    DSM_WATCH_MPI=1 DSM_MPIWATCH_LIB="$build/.libs/libdsm_mpiwatch.so" DSM_COMM_TIMEOUT=$limit MN_MAP=slot \
        MN_TIMEOUT=150 "$src/scripts/launcher/dsm-run.sh" "$mn/run.sh" 2 1 -- "$dir/rank_err.sh" \
        "$build/examples/c/train_mlp" "$src/examples/c/train_mlp.json" --steps 100000000 >"$log" 2>&1 &
    job=$!
    tries=0 # training: the loss printed a few times
    while [ "$(grep -c "step=" "$log" 2>/dev/null)" -lt 2 ] && [ $tries -lt 600 ] && kill -0 $job 2>/dev/null; do
        sleep 0.2
        tries=$((tries + 1))
    done
    # rank 1's process, as the host sees it
    r1=""
    for p in $(pgrep -f "train_mlp $src/examples/c/train_mlp.json"); do
        tr '\0' '\n' </proc/"$p"/environ 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1" && r1=$p
    done
    t0=$(date +%s)
    ip netns exec "${MN_NS_PREFIX:-mn-}node1" ip link set mn0 down
    r1_took=-1
    while :; do
        now=$(($(date +%s) - t0))
        if [ "$r1_took" -lt 0 ] && { [ -z "$r1" ] || ! kill -0 "$r1" 2>/dev/null; }; then r1_took=$now; fi
        kill -0 $job 2>/dev/null || break
        [ "$now" -lt 160 ] || break
        sleep 0.5
    done
    rc=0
    if kill -0 $job 2>/dev/null; then kill $job; rc=124; fi
    wait $job || rc=$?
    took=$(($(date +%s) - t0))
    [ "$r1_took" -ge 0 ] || r1_took=$took
    ip netns exec "${MN_NS_PREFIX:-mn-}node1" ip link set mn0 up
    why=""
    [ -n "$r1" ] || why="rank 1's process not found"
    [ "$rc" = 75 ] || why="${why:+$why; }exit $rc, expected 75"
    [ "$r1_took" -le $((limit + 10)) ] || why="${why:+$why; }rank 1 ended ${r1_took} s after the cut (bound $((limit + 10)) s)"
    [ "$took" -le $((limit + 30)) ] || why="${why:+$why; }the launcher returned ${took} s after the cut (bound $((limit + 30)) s)"
    for r in 0 1; do
        grep -q "dsm watchdog: rank $r (host node$r, pid [0-9]*) has waited [0-9]* s (DSM_COMM_TIMEOUT=$limit)" "$dir/rank$r.err" 2>/dev/null ||
            why="${why:+$why; }no watchdog message from rank $r in $dir/rank$r.err"
    done
    if [ -z "$why" ]; then
        passed=$((passed + 1))
        echo "PASS: 2x1 cut_off (rank 1 ended ${r1_took} s, the launcher ${took} s after the cut; DSM_COMM_TIMEOUT=$limit, tcp_retries2 15)"
        sed -n '1,3p' "$dir/rank1.err" | sed 's/^/  rank 1: /'
    else
        failed=$((failed + 1))
        echo "FAIL: 2x1 cut_off ($why; log: $log)"
        failures+="2x1 cut_off $log"$'\n'
    fi
fi
took=$(($(date +%s) - start))

{
    printf '# TOTAL: %d\n# PASS: %d\n# SKIP: 0\n# FAIL: %d\n# ERROR: 0\n\n' $((passed + failed)) "$passed" "$failed"
    printf 'layouts: %s; %d s\n' "$LAYOUTS" "$took"
    while read -r l name log; do
        [ -n "$l" ] || continue
        printf '\n=== FAIL: %s %s (the last 40 lines of %s)\n' "$l" "$name" "$log"
        tail -n 40 "$log"
    done <<<"$failures"
} >"$summary"
[ "$failed" = 0 ] || sed -n '/^=== FAIL/,$p' "$summary"
echo "check-multinode: $passed passed, $failed failed in $took s (layouts: $LAYOUTS; logs in $out)"
[ "$failed" = 0 ]
