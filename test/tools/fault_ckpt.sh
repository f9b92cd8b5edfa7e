#!/bin/sh
# Checkpoint faults end with an error on every rank, never a hang, and leave
# the previous checkpoint and `latest` loadable, with no temporary left after
# the next save:
#   - a full disk, caught by the free-space check and by the writes themselves
#     (a small tmpfs in a private mount namespace), at 2 and 4 ranks;
#   - a write that fails on one rank only (DSM_CKPT_FAULT=write:R);
#   - a directory that only some ranks see (each rank mounts its own tmpfs:
#     node-local scratch), for a save and for a load;
#   - a different directory on each rank;
#   - a read-only directory; a malformed DSM_CKPT_FAULT;
#   - leftovers of killed saves removed by the next save.
# Needs root and unshare(1) for the mount namespaces: skips (77) otherwise.
set -u
fail() { echo "FAIL: $*"; exit 1; }
bin=${top_builddir:-.}/test/tools/make_checkpoint
[ -x "$bin" ] || { echo "SKIP: $bin not built"; exit 77; }
[ "$(id -u)" = 0 ] || { echo "SKIP: needs root (private mount namespaces)"; exit 77; }
command -v unshare >/dev/null 2>&1 || { echo "SKIP: no unshare"; exit 77; }
if [ -z "${DSM_FAULT_NS:-}" ]; then
    unshare -m true 2>/dev/null || { echo "SKIP: unshare -m is not permitted here"; exit 77; }
    DSM_FAULT_NS=1 exec unshare -m sh "$0" "$@"
fi
# From here on in a private mount namespace.
launcher=${MPIEXEC:-mpiexec}
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
unset DSM_CKPT_FAULT DSM_CKPT_SPACE_CHECK
hang=${DSM_FAULT_TIMEOUT:-120}
root=$(mktemp -d) || fail "mktemp"
trap 'umount -l "$root"/* 2>/dev/null; rm -rf "$root"' EXIT
out=$root/out

# run NP ARGS...: the job, which must end (no hang) within $hang seconds.
run() {
    np=$1
    shift
    timeout -k 10 "$hang" $launcher -n "$np" "$bin" "$@" >"$out" 2>&1
    rc=$?
    [ $rc -ne 124 ] && [ $rc -ne 137 ] || fail "hang (killed after ${hang}s): $bin $*: $(cat "$out")"
    return $rc
}
# every_rank NP TEXT: the job failed and every rank printed an error with TEXT.
every_rank() {
    r=0
    while [ $r -lt "$1" ]; do
        grep "make_checkpoint: rank $r: " "$out" | grep -q -- "$2" ||
            fail "rank $r did not report '$2': $(cat "$out")"
        r=$((r + 1))
    done
}
# intact DIR TAG STEP NP ROWS: `latest` names TAG, it resumes at STEP, and
# no temporary is left.
intact() {
    [ "$(cat "$1/latest")" = "$2" ] || fail "latest is '$(cat "$1/latest")', expected $2"
    run "$4" "$1" --resume --steps 0 --rows "$5" || fail "resume from $1: $(cat "$out")"
    grep -q "resumed step $3 at step $3" "$out" || fail "resume from $1: $(cat "$out")"
    left=$(ls -A "$1" | grep '\.tmp$\|\.reserve$\|^\.dsm-dircheck') && fail "leftovers in $1: $left"
    return 0
}

rows=50000 # fc.weight [50000, 3]: about 1.8 MB a checkpoint with Adam's moments
for np in 2 4; do
    # A full disk, seen by the free-space check: room for two checkpoints.
    d=$root/full$np
    mkdir -p "$d" && mount -t tmpfs -o size=4m tmpfs "$d" || fail "mount tmpfs"
    run $np "$d" --rows $rows --steps 6 --save-every 1 && fail "$np ranks: a save on a full disk succeeded"
    every_rank $np "no room for the checkpoint in '$d'"
    tag=$(cat "$d/latest")
    intact "$d" "$tag" "${tag#global_step}" $np $rows
    echo "$np ranks: full disk (free-space check): every rank failed, $tag intact"

    # The same disk without the check: the writes themselves fail (ENOSPC).
    DSM_CKPT_SPACE_CHECK=0 run $np "$d" --resume --rows $rows --steps 4 --save-every 1 &&
        fail "$np ranks: a save on a full disk succeeded"
    every_rank $np "No space left\|writing\|flushing\|creating"
    intact "$d" "$tag" "${tag#global_step}" $np $rows
    echo "$np ranks: full disk (writes fail): every rank failed, $tag intact"
    umount "$d"

    # One rank's write fails in the middle of the data.
    d=$root/write$np
    run $np "$d" --rows 10 --steps 2 --save-every 2 || fail "first job: $(cat "$out")"
    DSM_CKPT_FAULT=write:$((np - 1)) run $np "$d" --resume --rows 10 --steps 2 --save-every 2 &&
        fail "$np ranks: an injected write fault succeeded"
    every_rank $np "injected fault at checkpoint point 'write'"
    intact "$d" global_step2 2 $np 10
    echo "$np ranks: a write failing on rank $((np - 1)): every rank failed, global_step2 intact"

    # A directory each rank has of its own (node-local scratch): rank 0
    # creates it, the others cannot see it.
    d=$root/local$np
    mkdir -p "$d"
    timeout -k 10 "$hang" $launcher -n $np unshare -m sh -c "mount -t tmpfs tmpfs '$d' && exec '$bin' '$d' --rows 10 --steps 2 --save-every 1" >"$out" 2>&1
    rc=$?
    [ $rc -ne 124 ] && [ $rc -ne 137 ] || fail "$np ranks: a node-local directory hangs the save"
    [ $rc -ne 0 ] || fail "$np ranks: a save into a node-local directory succeeded"
    every_rank $np "is not the one rank 0"
    echo "$np ranks: a directory only rank 0 sees: every rank failed (save)"

    # A checkpoint that only rank 0 sees: the other ranks find an empty
    # directory in its place.
    d=$root/hidden$np
    run $np "$d" --rows 10 --steps 2 --save-every 2 || fail "first job: $(cat "$out")"
    timeout -k 10 "$hang" $launcher -n $np sh -c "[ \"\$OMPI_COMM_WORLD_RANK\" = 0 ] || { unshare -m sh -c \"mount -t tmpfs tmpfs '$d' && touch '$d/global_step2.h5' && echo global_step2 > '$d/latest' && exec '$bin' '$d' --resume --steps 0 --rows 10\"; exit \$?; }; exec '$bin' '$d' --resume --steps 0 --rows 10" >"$out" 2>&1
    rc=$?
    [ $rc -ne 124 ] && [ $rc -ne 137 ] || fail "$np ranks: a checkpoint only rank 0 sees hangs the load"
    [ $rc -ne 0 ] || fail "$np ranks: a load of a checkpoint only rank 0 sees succeeded"
    every_rank $np "rank 0 (host .*) reads another file"
    echo "$np ranks: a checkpoint only rank 0 sees: every rank failed (load)"

    # Each rank its own directory.
    d=$root/perrank$np
    run $np "$d" --rank-dir --rows 10 --steps 1 --save-every 1 && fail "$np ranks: per-rank directories saved"
    every_rank $np "is not the one rank 0"
    echo "$np ranks: a directory per rank: every rank failed"
done

# A read-only directory.
d=$root/ro
mkdir -p "$d"
run 2 "$d" --rows 10 --steps 2 --save-every 2 || fail "first job: $(cat "$out")"
mount --bind "$d" "$d" && mount -o remount,bind,ro "$d" || fail "read-only bind mount"
run 2 "$d" --resume --rows 10 --steps 2 --save-every 2 && fail "a save into a read-only directory succeeded"
every_rank 2 "cannot create a file in the checkpoint directory '$d'.*Read-only file system"
# ... still loads.
run 2 "$d" --resume --steps 0 --rows 10 || fail "load from a read-only directory: $(cat "$out")"
umount "$d"
echo "a read-only directory: every rank failed with the reason; the checkpoint still loads"

# A malformed fault specification.
for spec in data:x nowhere:0 kill: "data:1:2"; do
    DSM_CKPT_FAULT=$spec run 2 "$d" --resume --rows 10 --steps 2 --save-every 2 && fail "DSM_CKPT_FAULT=$spec accepted"
    every_rank 2 "DSM_CKPT_FAULT=$spec is malformed"
done
echo "malformed DSM_CKPT_FAULT values: every rank failed naming them"

# Leftovers of killed saves: gone after the next save, whatever their tag.
: >"$d/.global_step9.h5.tmp"
: >"$d/.latest.tmp"
run 2 "$d" --resume --rows 10 --steps 2 --save-every 2 || fail "save after leftovers: $(cat "$out")"
intact "$d" global_step4 4 1 10
echo "leftover temporaries removed by the next save"
echo "PASS"
exit 0
