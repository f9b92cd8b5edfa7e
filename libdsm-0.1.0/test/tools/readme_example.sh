#!/bin/sh
# The C example of README.md compiles against this build (warnings are
# errors) and runs on 2 ranks: the text users copy first must work.
set -u
fail() { echo "FAIL: $*"; exit 1; }
dir=$(mktemp -d) || fail "mktemp"
trap 'rm -rf "$dir"' EXIT
# The first ```c block of the README.
sed -n '/^```c$/,/^```$/p' "$top_srcdir/README.md" | sed '1d;$d' > "$dir/app.c"
[ -s "$dir/app.c" ] || fail "README.md has no \`\`\`c block"
grep -q "dsm_engine_init" "$dir/app.c" || fail "the README example does not use dsm_engine_init"
$top_builddir/libtool --mode=link --quiet $CC -std=c11 -Wall -Wextra -Werror $CFLAGS \
    -I"$top_srcdir/include" -I"$top_builddir/include" "$dir/app.c" \
    $LDFLAGS "$top_builddir/libdsm.la" -o "$dir/app" || fail "the README example does not compile"
export OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
out=$(timeout 300 ${MPIEXEC:-mpiexec} -n 2 "$dir/app" 2>&1) || fail "the README example failed: $out"
echo "$out"
[ "$(echo "$out" | grep -c '^step 10, lr 0.001, grad norm')" = 2 ] ||
    fail "expected 'step 10, lr 0.001, grad norm ...' from both ranks"
exit 0
