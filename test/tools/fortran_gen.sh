#!/bin/sh
# The generated parts of module dsm (fortran/dsm_const.inc, dsm_iface.inc,
# dsm_wrap.inc) are what fortran/gen_fortran.py writes from the current
# include/dsm.h, include/dsm/*.h and fortran/dsm_fshim.c: regenerate them into
# a temporary directory and compare. Run by `make check` with top_srcdir set.
# Exit 0: current, 1: stale or the generator failed, 77: skip (no python3).
set -u
srcdir=${top_srcdir:-.}
PYTHON3=${PYTHON3:-python3}
if ! command -v "$PYTHON3" >/dev/null 2>&1; then
    echo "SKIP: $PYTHON3 not found"
    exit 77
fi
tmp=${TMPDIR:-/tmp}/fortran-gen-test.$$
mkdir -p "$tmp" || exit 1
trap 'rm -rf "$tmp"' EXIT
if ! "$PYTHON3" "$srcdir/fortran/gen_fortran.py" --srcdir "$srcdir" --outdir "$tmp"; then
    echo "FAIL: fortran/gen_fortran.py failed"
    exit 1
fi
status=0
for f in dsm_const.inc dsm_iface.inc dsm_wrap.inc; do
    if ! diff -u "$srcdir/fortran/$f" "$tmp/$f" >"$tmp/$f.diff"; then
        echo "FAIL: fortran/$f is not what fortran/gen_fortran.py writes now" \
            "(run: python3 fortran/gen_fortran.py, or make, and commit it):"
        head -40 "$tmp/$f.diff"
        status=1
    fi
done
[ "$status" -eq 0 ] && echo "PASS: fortran/dsm_const.inc, dsm_iface.inc and dsm_wrap.inc are current"
exit "$status"
