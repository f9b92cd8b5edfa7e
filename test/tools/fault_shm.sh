#!/bin/sh
# Shared memory larger than /dev/shm (issue 14: no hang and no crash on any
# failure). Containers often give /dev/shm 64 MB; the shm backend keeps its
# windows there. In a private mount namespace (unshare -m, so root only)
# this mounts a 64 MB tmpfs on /dev/shm and runs test/tools/fault_shm at 2
# and 4 ranks (all on this host, so all in that namespace), each under a
# timeout, so a hang fails the test instead of stalling the suite:
# - a ZeRO-2 engine whose shared buffers (160 MB) do not fit: every rank
#   falls back to the mpi backend with a warning naming /dev/shm, and
#   training works (ZeRO-1 and ZeRO-3 too, at 4 ranks);
# - dsm_sp_alloc() too large on one rank only: every rank gets
#   DSM_ERR_OUT_OF_MEMORY (5) naming /dev/shm, the bytes needed and the
#   bytes available;
# - two allocations that each fit and together do not: the second fails on
#   every rank the same way (before the fix, a store to its pages was SIGBUS);
# - a small allocation and a transform in it still work.
# Skips (77) when not root, or when unshare or the mount is not possible.
set -u
# shellcheck disable=SC2154 # set by the test harness (AM_TESTS_ENVIRONMENT)
bin=$top_builddir/test/tools/fault_shm
launcher=${MPIEXEC:-mpiexec}
shm_mb=64

if [ "${DSM_FAULT_SHM_INSIDE:-}" != 1 ]; then
    [ "$(id -u)" = 0 ] || { echo "SKIP: needs root (unshare -m and mount)"; exit 77; }
    command -v unshare >/dev/null 2>&1 || { echo "SKIP: no unshare"; exit 77; }
    unshare -m true 2>/dev/null || { echo "SKIP: unshare -m is not permitted here"; exit 77; }
    DSM_FAULT_SHM_INSIDE=1 exec unshare -m --propagation private /bin/sh "$0" "$@"
fi

# Inside the private mount namespace from here on.
mount -t tmpfs -o size=${shm_mb}m tmpfs /dev/shm 2>/dev/null ||
    { echo "SKIP: cannot mount a tmpfs on /dev/shm"; exit 77; }
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
fail() { echo "FAIL: $*"; printf '%s\n' "$out"; exit 1; }

# run N ARGS...: the program on N ranks under a timeout; output in $out.
run() {
    n=$1
    shift
    # shellcheck disable=SC2086 # MPIEXEC may carry options
    out=$(timeout 240 $launcher -n "$n" "$bin" "$@" 2>&1)
    rc=$?
    [ $rc -ne 124 ] || fail "$n ranks, $*: timed out (hang)"
    [ $rc -eq 0 ] || fail "$n ranks, $*: exit status $rc"
}

# every N PATTERN WHAT: each of the N ranks printed a line matching PATTERN.
every() {
    r=0
    while [ $r -lt "$1" ]; do
        printf '%s\n' "$out" | grep -E "^rank $r: $2" >/dev/null || fail "rank $r: no line matching '$2' ($3)"
        r=$((r + 1))
    done
}

for n in 2 4; do
    # 40M fp32 parameters at ZeRO-2: 160 MB of shared buffers.
    run "$n" engine 40000000 2
    every "$n" "engine init 0 -" "engine init falls back to the mpi backend"
    every "$n" "trained 2 steps, norm ok" "training after the fallback"
    printf '%s\n' "$out" | grep "need 640000000\|need [0-9]* bytes in /dev/shm" | grep "mpi backend" >/dev/null ||
        fail "$n ranks: no warning naming /dev/shm, the bytes and the mpi backend"

    if [ "$n" = 4 ]; then
        # The other stages' shared buffers: ZeRO-1's flat gradients, ZeRO-3's partitions (4 x 40 MB).
        for stage in 1 3; do
            run "$n" engine 40000000 1 "$stage"
            every "$n" "engine init 0 -" "ZeRO-$stage falls back"
            every "$n" "trained 1 steps, norm ok" "ZeRO-$stage training after the fallback"
        done
    fi

    # 128 MiB on the last rank; then twice 40 MiB over the node.
    part=$((40 * 1024 * 1024 / n))
    run "$n" sp $((128 * 1024 * 1024)) "$part"
    every "$n" "sp_alloc 5 .*need [0-9]+ bytes in /dev/shm.*most any asks for is 134217728.* [0-9]+ bytes available" \
        "too large on one rank"
    every "$n" "sp_alloc part 0 -" "one part fits"
    every "$n" "sp_alloc second part 5 .*/dev/shm" "two parts do not fit"
    every "$n" "small ok" "a small allocation afterwards"
    echo "$n ranks: ok"
done
echo "PASS"
