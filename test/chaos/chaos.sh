#!/bin/bash
# The chaos run (`make check-chaos`, in the multinode stage): CHAOS_ROUNDS
# rounds [20] of training test/tools/make_checkpoint (AdamW, ZeRO-1, a
# checkpoint every CHAOS_SAVE_EVERY steps [5]) across 2 simulated nodes x 2
# ranks, each round with one fault at a random time:
#   sigkill    SIGKILL of a random rank
#   sigstop    SIGSTOP of a random rank (the others' watchdog ends the job)
#   link_down  node1's link set down (the kernel's default tcp_retries2; the
#              job through scripts/launcher/dsm-run.sh with DSM_WATCH_MPI=1)
#   disk_full  the checkpoint file system (a small tmpfs) filled, so that the
#              next save fails
#   corrupt    the newest checkpoint overwritten in its middle, then a rank
#              killed (the restart falls back to the one before)
# (the first five rounds take the five kinds in a random order, the others
# draw one). After each, the job restarts from `latest` as dsm-job.sh would
# (with DSM_CKPT_LOAD_FALLBACK): after link_down first on node0 alone, the
# surviving node (a resume check), then on both nodes again. At the end the
# job trains on to a final step and its weights must equal, bit for bit
# (dsm-ckpt diff, no tolerance), those of an uninterrupted run to the same
# step at the same rank count. Every round must end (no hang: the outer
# MN_TIMEOUT), every restart must resume at the step `latest` names (or the
# one before it after corrupt), and lose at most CHAOS_SAVE_EVERY steps (two
# intervals after corrupt). Prints per fault kind: rounds, the seconds from
# the fault to the job's end (mean and max), the steps lost (max), data lost.
#
# Environment: top_builddir, top_srcdir, MULTINODE_DIR (as run-multinode.sh);
# CHAOS_ROUNDS, CHAOS_SAVE_EVERY, CHAOS_SEED (the random seed; printed),
# CHAOS_TIMEOUT (DSM_COMM_TIMEOUT [3]). Exit: 0 pass, 1 fail, 77 skipped
# (no root or no harness). Logs: top_builddir/test/chaos/logs.
set -uo pipefail

build=$(cd "${top_builddir:-.}" && pwd)
src=$(cd "${top_srcdir:-$(dirname "$0")/../..}" && pwd)
mn=${MULTINODE_DIR:-$src/../shared/multinode}
rounds=${CHAOS_ROUNDS:-20}
every=${CHAOS_SAVE_EVERY:-5}
limit=${CHAOS_TIMEOUT:-3}
seed=${CHAOS_SEED:-$(( $(date +%s) % 32768 ))}
RANDOM=$seed
prog=$build/test/tools/make_checkpoint
ckpt_tool=$build/tools/dsm-ckpt
rows=500
logs=$build/test/chaos/logs
ns=${MN_NS_PREFIX:-mn-}

[ "$(id -u)" = 0 ] || { echo "chaos: SKIPPED: the simulated nodes need root"; exit 77; }
[ -x "$mn/run.sh" ] || { echo "chaos: SKIPPED: no multinode harness in $mn"; exit 77; }
[ -x "$prog" ] && [ -x "$ckpt_tool" ] || { echo "chaos: SKIPPED: $prog or $ckpt_tool not built (HDF5?)"; exit 77; }

rm -rf "$logs" && mkdir -p "$logs" || exit 1
ckpt=$logs/ckpt
ref=$logs/reference
mkdir -p "$ckpt" "$ref"
# The checkpoints on a small file system of their own, to fill (mounted
# before the nodes' commands start, so that every node sees it).
mount -t tmpfs -o size=48m,mode=0755 dsm-chaos "$ckpt" || { echo "chaos: FAIL: cannot mount a tmpfs on $ckpt"; exit 1; }
cleanup() {
    ip netns exec "${ns}node1" ip link set mn0 up 2>/dev/null
    "$mn/down.sh" >/dev/null 2>&1
    umount "$ckpt" 2>/dev/null
}
trap cleanup EXIT
trap 'exit 130' INT TERM
"$mn/up.sh" 2 >/dev/null || { echo "chaos: FAIL: $mn/up.sh 2 failed"; exit 1; }
# The kernel's default: a cluster has not lowered it.
for i in 0 1; do ip netns exec "${ns}node$i" sysctl -qw net.ipv4.tcp_retries2=15; done

export OMP_NUM_THREADS=1 ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
export DSM_COMM_TIMEOUT=$limit DSM_WATCH_MPI=1 DSM_MPIWATCH_LIB=$build/.libs/libdsm_mpiwatch.so
export DSM_LAUNCHER_GRACE=5 MN_TIMEOUT=120 MN_MAP=slot
export LD_LIBRARY_PATH="$build/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
unset DSM_CKPT_FAULT

# job NODES RPN LOG ARGS...: the job through the launcher script (background: $job).
job() {
    local n=$1 r=$2 log=$3
    shift 3
    "$src/scripts/launcher/dsm-run.sh" "$mn/run.sh" "$n" "$r" -- "$prog" "$@" >"$log" 2>&1 &
    job=$!
}
last_step() { grep -o '^step [0-9]*' "$1" 2>/dev/null | tail -n 1 | cut -d' ' -f2; }
resumed_step() { sed -n 's/^resumed .* at step \([0-9]*\)$/\1/p' "$1" | tail -n 1; }
latest_step() { local t; t=$(cat "$ckpt/latest" 2>/dev/null) && echo "${t#global_step}"; }
rank_pids() { # the job's rank processes, as the host sees them
    pgrep -f "^[^ ]*make_checkpoint $ckpt " | tr '\n' ' '
}
prune() { # keep the newest 3 checkpoints (and latest's)
    local keep
    keep=$(cat "$ckpt/latest" 2>/dev/null)
    ls -t "$ckpt"/global_step*.h5 2>/dev/null | tail -n +4 | while read -r f; do
        [ "$(basename "$f" .h5)" = "$keep" ] || rm -f "$f"
    done
}
fail() { echo "chaos: FAIL: $*"; echo "seed $seed; logs in $logs"; exit 1; }

kinds=(sigkill sigstop link_down disk_full corrupt)
order=()
for k in "${kinds[@]}"; do order+=("$k"); done
for ((i = ${#order[@]} - 1; i > 0; i--)); do j=$((RANDOM % (i + 1))); t=${order[i]}; order[i]=${order[j]}; order[j]=$t; done
declare -A n_rounds sum_took max_took max_lost
for k in "${kinds[@]}"; do n_rounds[$k]=0; sum_took[$k]=0; max_took[$k]=0; max_lost[$k]=0; done

echo "chaos: $rounds rounds, seed $seed, DSM_COMM_TIMEOUT=$limit, a checkpoint every $every steps, 2 nodes x 2 ranks"
start_all=$(date +%s)
prev_kind=none
fault_step=0
for ((round = 1; round <= rounds; round++)); do
    if [ "$round" -le ${#order[@]} ]; then kind=${order[round - 1]}; else kind=${kinds[RANDOM % ${#kinds[@]}]}; fi
    log=$logs/round$round.log
    args=("$ckpt" --rows "$rows" --until 100000000 --save-every "$every" --print-steps)
    [ -e "$ckpt/latest" ] && args+=(--resume --fallback)
    before=$(latest_step)
    job 2 2 "$log" "${args[@]}"
    # The previous round's restart: where it resumed.
    tries=0
    while [ -z "$(last_step "$log")" ] && [ $tries -lt 600 ] && kill -0 $job 2>/dev/null; do sleep 0.1; tries=$((tries + 1)); done
    [ -n "$(last_step "$log")" ] || { wait $job; fail "round $round: the job did not train: $(tail -n 20 "$log")"; }
    if [ -n "$before" ]; then
        r=$(resumed_step "$log")
        [ -n "$r" ] || fail "round $round: no resume line: $(head -n 20 "$log")"
        lost=$((fault_step - r))
        bound=$every
        [ "$prev_kind" = corrupt ] && bound=$((2 * every))
        [ "$lost" -ge 0 ] && [ "$lost" -le "$bound" ] ||
            fail "round $round: resumed at step $r after the $prev_kind fault at step $fault_step (lost $lost, bound $bound)"
        [ "$lost" -gt "${max_lost[$prev_kind]}" ] && max_lost[$prev_kind]=$lost
    fi
    # The fault at a random time: 0 to 2.5 s into training, once a checkpoint
    # exists (the first round's job starts fresh: a fault before its first
    # save leaves nothing to restart from, which is not what this run tests),
    # and after a new checkpoint for corrupt.
    sleep "$((RANDOM % 6 / 2)).$((RANDOM % 2 * 5))"
    tries=0
    while [ ! -e "$ckpt/latest" ] && [ $tries -lt 300 ] && kill -0 $job 2>/dev/null; do sleep 0.1; tries=$((tries + 1)); done
    [ -e "$ckpt/latest" ] || { kill $job 2>/dev/null; wait $job; fail "round $round: no checkpoint within 30 s of the start: $(tail -n 20 "$log")"; }
    if [ "$kind" = corrupt ]; then
        base=$(latest_step)
        tries=0
        while [ "$(latest_step)" = "$base" ] && [ $tries -lt 100 ]; do sleep 0.1; tries=$((tries + 1)); done
    fi
    pids=$(rank_pids)
    set -- $pids
    [ $# = 4 ] || { kill $job 2>/dev/null; wait $job; fail "round $round: found $# ranks ($pids), expected 4: $(tail -n 20 "$log")"; }
    victim_i=$((RANDOM % 4 + 1))
    victim=${!victim_i}
    t0=$(date +%s.%N)
    fault_step=$(last_step "$log")
    case $kind in
    sigkill) kill -KILL "$victim" ;;
    sigstop) kill -STOP "$victim" ;;
    link_down) ip netns exec "${ns}node1" ip link set mn0 down ;;
    disk_full)
        avail=$(df --output=avail -k "$ckpt" | tail -n 1)
        fallocate -l $(((avail - 4) * 1024)) "$ckpt/.filler" 2>/dev/null ||
            dd if=/dev/zero of="$ckpt/.filler" bs=1k count=$((avail - 4)) 2>/dev/null ;;
    corrupt)
        f=$ckpt/$(cat "$ckpt/latest").h5
        size=$(stat -c %s "$f")
        # in place (the same inode: what a reader of latest will open), a block from the middle on
        dd if=/dev/urandom of="$f" bs=1 seek=$((size / 2)) count=4096 conv=notrunc 2>/dev/null
        kill -KILL "$victim" ;;
    esac
    rc=0
    wait $job || rc=$?
    t1=$(date +%s.%N)
    took=$(echo "$t1 - $t0" | bc)
    # What the fault left: the link up, the space back, no process.
    ip netns exec "${ns}node1" ip link set mn0 up
    rm -f "$ckpt/.filler"
    left=$(rank_pids)
    [ -z "$left" ] || { kill -9 $left 2>/dev/null; fail "round $round ($kind): processes left: $left"; }
    [ "$rc" != 0 ] || fail "round $round ($kind): the job ended with status 0 after the fault: $(tail -n 20 "$log")"
    [ "$rc" != 124 ] || fail "round $round ($kind): the job hung (MN_TIMEOUT)"
    [ -e "$ckpt/latest" ] || fail "round $round ($kind): no latest"
    # The fault's step: the last step printed (the job may have gone on a little).
    last=$(last_step "$log")
    [ -n "$last" ] && fault_step=$last
    printf 'round %2d %-9s at step %5d: the job ended %5.1f s later (status %d); latest: step %s\n' \
        "$round" "$kind" "$fault_step" "$took" "$rc" "$(latest_step)"
    n_rounds[$kind]=$((n_rounds[$kind] + 1))
    sum_took[$kind]=$(echo "${sum_took[$kind]} + $took" | bc)
    [ "$(echo "$took > ${max_took[$kind]}" | bc)" = 1 ] && max_took[$kind]=$took
    if [ "$kind" = link_down ]; then
        # The restart on the surviving node: node0 alone resumes at latest's step (or before it).
        rlog=$logs/round$round-node0.log
        MN_TIMEOUT=120 "$mn/run.sh" 1 2 "$prog" "$ckpt" --rows "$rows" --resume --fallback --steps 0 >"$rlog" 2>&1 ||
            fail "round $round: the resume on node0 alone failed: $(tail -n 20 "$rlog")"
        r=$(resumed_step "$rlog")
        [ -n "$r" ] && [ $((fault_step - r)) -le "$every" ] ||
            fail "round $round: node0 alone resumed at step '$r' after the fault at step $fault_step"
        echo "         node0 alone resumed at step $r"
    fi
    prev_kind=$kind
    prune
done

# On to the final step (a multiple of the interval past the last fault), then
# the uninterrupted run to the same step, which saves only there (saves must
# not change the training either); the weights must be the same bits.
final=$(((fault_step / every + 2) * every))
flog=$logs/final.log
MN_TIMEOUT=300 "$mn/run.sh" 2 2 "$prog" "$ckpt" --rows "$rows" --resume --fallback --until "$final" \
    --save-every "$every" >"$flog" 2>&1 || fail "the final run failed: $(tail -n 20 "$flog")"
r=$(resumed_step "$flog")
lost=$((fault_step - r))
bound=$every
[ "$prev_kind" = corrupt ] && bound=$((2 * every))
[ "$lost" -ge 0 ] && [ "$lost" -le "$bound" ] || fail "the final run resumed at step $r after the fault at step $fault_step"
[ "$lost" -gt "${max_lost[$prev_kind]}" ] && max_lost[$prev_kind]=$lost
grep -q "final step $final" "$flog" || fail "the final run did not reach step $final: $(tail -n 5 "$flog")"
rlog=$logs/reference.log
MN_TIMEOUT=600 "$mn/run.sh" 2 2 "$prog" "$ref" --rows "$rows" --until "$final" --save-every "$final" >"$rlog" 2>&1 ||
    fail "the uninterrupted run failed: $(tail -n 20 "$rlog")"
# Every tensor (weights, master weights, optimizer moments) the same bits,
# and every attribute (the counters, the loss scaler's state, the schedule)
# the same values.
"$ckpt_tool" diff "$ckpt/global_step$final.h5" "$ref/global_step$final.h5" --all >"$logs/diff.txt" 2>&1
grep -q "^different: 0 of [0-9]* common tensors differ, 0 only in A, 0 only in B" "$logs/diff.txt" ||
    grep -q "^equal" "$logs/diff.txt" ||
    fail "the weights after the faults differ from the uninterrupted run's at step $final: $(head -n 20 "$logs/diff.txt")"
attrs=$(grep "^attribute " "$logs/diff.txt")
[ -z "$attrs" ] || fail "attributes after the faults differ from the uninterrupted run's at step $final: $attrs"
took_all=$(($(date +%s) - start_all))

echo
echo "chaos: $rounds rounds in ${took_all} s (seed $seed); step $final reached; the weights and attributes equal the uninterrupted run's bit for bit"
printf '| fault | rounds | fault to end of job, mean (s) | max (s) | steps lost, max | data lost |\n'
printf '|---|---|---|---|---|---|\n'
for k in "${kinds[@]}"; do
    n=${n_rounds[$k]}
    [ "$n" -gt 0 ] || { printf '| %s | 0 | | | | |\n' "$k"; continue; }
    printf '| %s | %d | %.1f | %.1f | %d | none |\n' "$k" "$n" "$(echo "${sum_took[$k]} / $n" | bc -l)" "${max_took[$k]}" "${max_lost[$k]}"
done
echo "PASS"
