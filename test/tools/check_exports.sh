#!/bin/sh
# The exported symbols of libdsm.so against the headers and the man pages:
#   (a) every exported symbol starts with dsm_ (the version node DSM_0 and
#       other absolute symbols, type A, are not symbols of the library);
#   (b) every exported dsm_ function has a page doc/man/man3/NAME.3;
#   (c) every function that include/dsm.h, the parts it includes
#       (include/dsm/base.h, mesh.h, ...) or an interop header beside them
#       (include/dsm/cuda.h) declares is exported;
#   (d) and has a Fortran binding, a public procedure of the same name in
#       module dsm (the interop headers' too: their foreign types cross as
#       type(c_ptr)).
#   (e) where the PyTorch bridge is built, libdsm_torch.so exports the
#       functions of include/dsm/torch.h, each with its page, and nothing
#       but them and the C++ API of namespace dsm::torch.
# Run by `make check` as `$(SHELL) test/tools/check_exports.sh` with
# top_builddir and top_srcdir set. Exit 0: pass, 1: fail, 77: skip (no nm or
# no shared library).
set -u

top_builddir=${top_builddir:-.}
top_srcdir=${top_srcdir:-.}
lib=$top_builddir/.libs/libdsm.so
header=$top_srcdir/include/dsm.h
# dsm/torch.h is the PyTorch bridge's (libdsm_torch.so, (e) below), not libdsm's.
headers="$header $(ls "$top_srcdir"/include/dsm/*.h 2>/dev/null | grep -v '/torch\.h$')"
mandir=$top_srcdir/doc/man/man3
NM=${NM:-nm}

if ! command -v "$NM" >/dev/null 2>&1; then
    echo "SKIP: $NM not found"
    exit 77
fi
if [ ! -f "$lib" ]; then
    echo "SKIP: $lib not found (static-only build?)"
    exit 77
fi
if [ ! -f "$header" ]; then
    echo "FAIL: $header not found"
    exit 1
fi

tmp=${TMPDIR:-/tmp}/check_exports.$$
mkdir -p "$tmp" || exit 1
trap 'rm -rf "$tmp"' EXIT
status=0

# "ADDRESS TYPE NAME[@VERSION]" (or "TYPE NAME" for undefined-address lines):
# keep TYPE and NAME without its version suffix.
if ! "$NM" -D --defined-only "$lib" >"$tmp/nm.out" 2>"$tmp/nm.err"; then
    echo "FAIL: $NM -D --defined-only $lib failed:"
    cat "$tmp/nm.err"
    exit 1
fi
awk 'NF >= 2 { type = $(NF - 1); name = $NF; sub(/@.*/, "", name); print type, name }' \
    "$tmp/nm.out" | LC_ALL=C sort -u -k2 >"$tmp/symbols"

# Function symbols: text (T, t), weak (W, w) and indirect (i) symbols.
awk '$1 ~ /^[TtWwi]$/ { print $2 }' "$tmp/symbols" | LC_ALL=C sort -u >"$tmp/functions"

# (a) Nothing but dsm_ is exported; absolute symbols (the version node DSM_0) are skipped.
awk '$1 != "A" && $2 !~ /^dsm_/ { print "  " $2 " (type " $1 ")" }' "$tmp/symbols" >"$tmp/foreign"
if [ -s "$tmp/foreign" ]; then
    echo "FAIL: $lib exports symbols outside the dsm_ name space:"
    cat "$tmp/foreign"
    status=1
fi

# (b) Every exported dsm_ function has a man page.
nopage=
for f in $(grep '^dsm_' "$tmp/functions"); do
    [ -f "$mandir/$f.3" ] || nopage="$nopage $f"
done
if [ -n "$nopage" ]; then
    echo "FAIL: exported functions without a page in $mandir (run 'make man'):"
    for f in $nopage; do echo "  $f"; done
    status=1
fi

# (c) Every function declared in the headers (a line starting with DSM_API;
# the name is the identifier before the first parenthesis) is exported.
# shellcheck disable=SC2086
sed -n 's/^DSM_API[^(]*[^A-Za-z0-9_]\([A-Za-z_][A-Za-z0-9_]*\)[ 	]*(.*/\1/p' $headers |
    LC_ALL=C sort -u >"$tmp/declared"
if [ ! -s "$tmp/declared" ]; then
    echo "FAIL: no DSM_API function declarations found in $headers"
    status=1
fi
unexported=$(LC_ALL=C comm -23 "$tmp/declared" "$tmp/functions")
if [ -n "$unexported" ]; then
    echo "FAIL: functions declared in dsm.h or include/dsm/ but not exported by $lib:"
    for f in $unexported; do echo "  $f"; done
    status=1
fi

# (d) Every function declared in the headers has a Fortran binding: a public
# procedure (or generic) of the same name in module dsm, that is a name in a
# `public ::` statement of fortran/dsm.f90 (the hand-written wrappers) or of
# fortran/dsm_const.inc (the wrappers fortran/gen_fortran.py generates).
fmod=$top_srcdir/fortran/dsm.f90
fgen=$top_srcdir/fortran/dsm_const.inc
awk '{ line = $0; sub(/!.*/, "", line)
       if (pending != "") { sub(/^[ \t]*&?/, "", line); line = pending line; pending = "" }
       if (line ~ /&[ \t]*$/) { sub(/&[ \t]*$/, "", line); pending = line; next }
       if (tolower(line) ~ /^[ \t]*public[ \t]*::/) {
           sub(/^[^:]*::/, "", line); n = split(line, w, ",")
           for (i = 1; i <= n; i++) { gsub(/[ \t]/, "", w[i]); print tolower(w[i]) } } }' \
    "$fmod" "$fgen" 2>/dev/null | LC_ALL=C sort -u >"$tmp/fortran_public"
unbound=$(LC_ALL=C comm -23 "$tmp/declared" "$tmp/fortran_public")
if [ -n "$unbound" ]; then
    echo "FAIL: functions declared in dsm.h or include/dsm/ without a public Fortran procedure in $fmod or $fgen:"
    for f in $unbound; do echo "  $f"; done
    status=1
fi

# (e) The PyTorch bridge.
tlib=$top_builddir/.libs/libdsm_torch.so
if [ -f "$tlib" ]; then
    "$NM" -D --defined-only "$tlib" | awk 'NF >= 2 { t = $(NF - 1); n = $NF; sub(/@.*/, "", n); if (t != "A") print n }' |
        LC_ALL=C sort -u >"$tmp/tsyms"
    foreign=$(grep -v -e '^dsm_torch_' -e '^_ZN3dsm5torch' "$tmp/tsyms")
    if [ -n "$foreign" ]; then
        echo "FAIL: $tlib exports symbols outside dsm_torch_ and dsm::torch:"
        echo "$foreign" | sed 's/^/  /'
        status=1
    fi
    for f in $(sed -n 's/^DSM_API[^(]*[^A-Za-z0-9_]\([A-Za-z_][A-Za-z0-9_]*\)[ 	]*(.*/\1/p' "$top_srcdir/include/dsm/torch.h"); do
        grep -qx "$f" "$tmp/tsyms" || { echo "FAIL: $f (dsm/torch.h) is not exported by $tlib"; status=1; }
        [ -f "$mandir/$f.3" ] || { echo "FAIL: $f (dsm/torch.h) has no page in $mandir (run 'make man')"; status=1; }
    done
fi

if [ "$status" -eq 0 ]; then
    echo "PASS: $(wc -l <"$tmp/declared" | tr -d ' ') functions declared, exported, documented" \
        "and bound in Fortran; no other symbols exported"
fi
exit "$status"
