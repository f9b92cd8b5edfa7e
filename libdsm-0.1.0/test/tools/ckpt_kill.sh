#!/bin/sh
# A rank killed with SIGKILL at any point of a checkpoint save leaves the
# previous checkpoint and `latest` loadable: the job of 2 ranks saving
# global_step6 is killed while writing, before the rename and before
# `latest` moves; each time a new job resumes from global_step4, on another
# number of ranks. Then a clean save moves `latest`.
set -u
fail() { echo "FAIL: $*"; exit 1; }
bin=$top_builddir/test/tools/make_checkpoint
launcher=${MPIEXEC:-mpiexec}
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
dir=$(mktemp -d) || fail "mktemp"
trap 'rm -rf "$dir"' EXIT

out=$(timeout 300 $launcher -n 2 "$bin" "$dir" --steps 4 --save-every 2 2>&1) || fail "first job: $out"
[ "$(cat "$dir/latest")" = global_step4 ] || fail "latest after the first job: $(cat "$dir/latest")"

for point in data:1 rename:0 latest:0; do
    out=$(DSM_CKPT_FAULT=kill:$point timeout 300 $launcher -n 2 "$bin" "$dir" --resume --steps 2 --save-every 2 2>&1) &&
        fail "the job killed at $point exited 0: $out"
    echo "killed at $point (the job failed, as it should)"
    [ "$(cat "$dir/latest")" = global_step4 ] || fail "killed at $point: latest is now $(cat "$dir/latest")"
    case $point in
        latest:0) [ -f "$dir/global_step6.h5" ] || fail "killed at $point: global_step6.h5 should exist (renamed)" ;;
        *) [ ! -f "$dir/global_step6.h5" ] || fail "killed at $point: global_step6.h5 exists" ;;
    esac
    out=$(timeout 300 $launcher -n 3 "$bin" "$dir" --resume --steps 0 2>&1) || fail "resume after $point: $out"
    echo "$out" | grep -q "resumed step 4 at step 4" || fail "resume after $point: $out"
    rm -f "$dir/global_step6.h5"
done

out=$(timeout 300 $launcher -n 4 "$bin" "$dir" --resume --steps 2 --save-every 2 2>&1) || fail "clean job: $out"
echo "$out" | grep -q "final step 6" || fail "clean job: $out"
[ "$(cat "$dir/latest")" = global_step6 ] || fail "latest after the clean job: $(cat "$dir/latest")"
out=$(timeout 300 $launcher -n 1 "$bin" "$dir" --resume --steps 0 2>&1) || fail "last resume: $out"
echo "$out" | grep -q "resumed step 6 at step 6" || fail "last resume: $out"
echo "PASS: the previous checkpoint survived every kill"
exit 0
