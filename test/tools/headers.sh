#!/bin/sh
# The public headers: dsm.h is the umbrella of the parts under include/dsm/
# (base, mesh, config, engine, sp, data), each of which compiles on its own,
# as does dsm/torch.h (the PyTorch bridge's C API, outside dsm.h),
# in C99 and in C++, without a warning (-Wall -Wextra -Wpedantic -Werror);
# dsm.h includes every part (the interop header dsm/cuda.h, which needs the
# CUDA runtime headers, stays outside it and is compiled where they are
# found); and every DSM_API function is declared in exactly one header.
# Exit 0: pass, 1: fail.
set -u
srcdir=${top_srcdir:-.}
builddir=${top_builddir:-.}
cc=${CC:-mpicc}
cxx=${CXX:-mpicxx}
tmp=${TMPDIR:-/tmp}/headers-test.$$
mkdir -p "$tmp" && trap 'rm -rf "$tmp"' EXIT
fail=0
inc="-I$srcdir/include -I$builddir/include"

parts=$(sed -n 's|^#include "dsm/\([a-z_]*\)\.h"$|\1|p' "$srcdir/include/dsm.h")
[ -n "$parts" ] || { echo "FAIL: include/dsm.h includes no part"; exit 1; }
for h in "$srcdir"/include/dsm/*.h; do
    name=$(basename "$h" .h)
    # The CUDA interop header, and the header of the PyTorch bridge (a
    # library beside libdsm), stay outside dsm.h.
    case $name in cuda|torch) continue ;; esac
    echo "$parts" | grep -qx "$name" || { echo "FAIL: include/dsm.h does not include dsm/$name.h"; fail=1; }
done

compile() { # header, extra flags
    printf '#include <%s>\nint main(void) { return 0; }\n' "$1" > "$tmp/one.c"
    cp "$tmp/one.c" "$tmp/one.cc"
    # shellcheck disable=SC2086
    if ! $cc -std=c99 -Wall -Wextra -Wpedantic -Werror $inc $2 -c "$tmp/one.c" -o "$tmp/one.o" 2>"$tmp/err"; then
        echo "FAIL: <$1> does not compile on its own in C99:"; cat "$tmp/err"; fail=1
    fi
    # shellcheck disable=SC2086
    if ! $cxx -Wall -Wextra -Wpedantic -Werror $inc $2 -c "$tmp/one.cc" -o "$tmp/one.o" 2>"$tmp/err"; then
        echo "FAIL: <$1> does not compile on its own in C++:"; cat "$tmp/err"; fail=1
    fi
}
compile dsm.h ""
for p in $parts; do
    compile "dsm/$p.h" ""
done
cuda_inc=
for d in "${CUDA_HOME:-}" /usr/local/cuda; do
    [ -n "$d" ] && [ -f "$d/include/cuda_runtime_api.h" ] && { cuda_inc="-isystem $d/include"; break; }
done
if [ -n "$cuda_inc" ]; then compile dsm/cuda.h "$cuda_inc"; else echo "dsm/cuda.h: no CUDA runtime headers here, not compiled"; fi
compile dsm/torch.h ""

# Each DSM_API function in exactly one header.
sed -n 's/^DSM_API[^(]*[^A-Za-z0-9_]\([A-Za-z_][A-Za-z0-9_]*\)[ 	]*(.*/\1/p' \
    "$srcdir/include/dsm.h" "$srcdir"/include/dsm/*.h | sort | uniq -d > "$tmp/twice"
if [ -s "$tmp/twice" ]; then echo "FAIL: declared in more than one header:"; cat "$tmp/twice"; fail=1; fi
n=$(sed -n 's/^DSM_API[^(]*[^A-Za-z0-9_]\([A-Za-z_][A-Za-z0-9_]*\)[ 	]*(.*/\1/p' "$srcdir"/include/dsm/*.h | wc -l)
[ "$n" -gt 50 ] || { echo "FAIL: only $n DSM_API declarations under include/dsm/"; fail=1; }

[ $fail -eq 0 ] && echo "PASS: dsm.h and its $(echo $parts | wc -w) parts compile on their own"
exit $fail
