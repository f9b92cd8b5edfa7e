#!/bin/sh
# test/fortran/test_fortran_nompi without mpiexec: the routines that need no
# MPI report through ierr before MPI_Init, and without ierr a failure before
# MPI_Init or after MPI_Finalize stops the program with a nonzero status and
# "libdsm: NAME failed (STATUS)" plus the detail on standard error, without
# reaching MPI_Abort. Exit 0: pass, 1: fail, 77: skip (no program).
set -u
prog=${top_builddir:-.}/test/fortran/test_fortran_nompi
if [ ! -x "$prog" ]; then
    echo "SKIP: $prog not built"
    exit 77
fi
tmp=${TMPDIR:-/tmp}/fortran-nompi-test.$$
mkdir -p "$tmp" || exit 1
trap 'rm -rf "$tmp"' EXIT
status=0
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi

"$prog" ierr >"$tmp/ierr.out" 2>&1
rc=$?
cat "$tmp/ierr.out"
if [ "$rc" -ne 0 ] || grep -q '^FAIL' "$tmp/ierr.out"; then
    echo "FAIL: $prog ierr exited with $rc"
    status=1
fi

# mode, routine, text of the detail
check_stop() {
    "$prog" "$1" >"$tmp/$1.out" 2>"$tmp/$1.err"
    rc=$?
    if [ "$rc" -eq 0 ]; then
        echo "FAIL: $1: a failure without ierr let the program exit 0"
        status=1
    elif ! grep -q "libdsm: $2 failed (invalid argument)" "$tmp/$1.err" ||
         ! grep -q "$3" "$tmp/$1.err"; then
        echo "FAIL: $1: standard error lacks the status of $2 or its detail ($3):"
        cat "$tmp/$1.err"
        status=1
    elif grep -Eqi 'MPI_ABORT|disallowed by the MPI standard|was invoked' "$tmp/$1.err" "$tmp/$1.out"; then
        echo "FAIL: $1: an MPI call (MPI_Abort) was made without MPI:"
        cat "$tmp/$1.err"
        status=1
    elif grep -q '^FAIL' "$tmp/$1.out"; then
        cat "$tmp/$1.out"
        status=1
    else
        echo "PASS: $1 MPI: $2 without ierr stops the program (exit $rc) with the message"
    fi
}
check_stop before dsm_dtype_size 99
# With MPI initialized the message carries the rank, as the library's own do.
"$prog" during >"$tmp/during.out" 2>"$tmp/during.err"
rc=$?
if [ "$rc" -eq 0 ]; then
    echo "FAIL: during: a failure without ierr let the program exit 0"
    status=1
elif ! grep -q "libdsm: rank 0: dsm_dtype_size failed (invalid argument)" "$tmp/during.err" ||
     ! grep -q "libdsm: rank 0: .*99" "$tmp/during.err"; then
    echo "FAIL: during: standard error lacks 'libdsm: rank 0: dsm_dtype_size failed' and its detail:"
    cat "$tmp/during.err"
    status=1
else
    echo "PASS: during MPI: the message names the rank (exit $rc)"
fi
check_stop after dsm_sp_head_range size
exit "$status"
