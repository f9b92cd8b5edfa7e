#!/bin/sh
# doc/fortran.md documents module dsm: every name that fortran/dsm.f90 or the
# generated fortran/dsm_const.inc it includes makes public (in a `public ::`
# statement or a declaration with the public attribute) must appear, as a whole word, in a heading or a table row of the
# page, and every procedure heading (####) of the page must name public
# procedures. A binding added without documentation fails here, naming it.
# Where the Fortran module is built, the page's complete example (its first
# ```fortran block that is a program) is compiled against it, linked and run
# on 2 ranks.
set -u
srcdir=${top_srcdir:-.}
builddir=$(cd "${top_builddir:-.}" && pwd)
src=$srcdir/fortran/dsm.f90
gen=$srcdir/fortran/dsm_const.inc
doc=$srcdir/doc/fortran.md
fail=0
[ -r "$src" ] || { echo "FAIL: cannot read $src"; exit 1; }
[ -r "$gen" ] || { echo "FAIL: cannot read $gen"; exit 1; }
[ -r "$doc" ] || { echo "FAIL: cannot read $doc"; exit 1; }
tmp=${TMPDIR:-/tmp}/fortran-doc-test.$$
mkdir -p "$tmp" && trap 'rm -rf "$tmp"' EXIT

# The public names, one a line: comments dropped, continuation lines joined,
# each entity of a declaration cut at its initialization or array spec.
awk '
function strip(l,    i, c, q, out) {   # drop a comment outside quotes
    q = ""; out = ""
    for (i = 1; i <= length(l); i++) {
        c = substr(l, i, 1)
        if (q == "" && c == "!") break
        if (q == "" && (c == "\047" || c == "\"")) q = c
        else if (q != "" && c == q) q = ""
        out = out c
    }
    return out
}
function emit(list,    i, c, d, ent, n, k) {   # split at top-level commas
    d = 0; ent = ""; n = 0
    for (i = 1; i <= length(list) + 1; i++) {
        c = (i <= length(list)) ? substr(list, i, 1) : ","
        if (c == "(" || c == "[") d++
        else if (c == ")" || c == "]") d--
        if (c == "," && d == 0) {
            sub(/^[ \t]+/, "", ent)
            if (match(ent, /^[A-Za-z][A-Za-z0-9_]*/)) print substr(ent, 1, RLENGTH)
            ent = ""
        } else ent = ent c
    }
}
{
    line = strip($0)
    if (pending != "") { sub(/^[ \t]*&?/, "", line); line = pending line; pending = "" }
    if (line ~ /&[ \t]*$/) { sub(/&[ \t]*$/, "", line); pending = line; next }
    low = tolower(line)
    if (low ~ /^[ \t]*public([ \t]*::|[ \t]+[a-z])/) {
        sub(/^[ \t]*[Pp][Uu][Bb][Ll][Ii][Cc][ \t]*(::)?/, "", line)
        emit(line)
    } else if ((p = index(low, "::")) > 0 && substr(low, 1, p - 1) ~ /,[ \t]*public[ \t]*(,|$)/) {
        emit(substr(line, p + 2))
    }
}' "$src" "$gen" | sort -u > "$tmp/public"

count=$(wc -l < "$tmp/public")
if [ "$count" -lt 100 ]; then
    echo "FAIL: only $count public names found in $src: the extraction is broken"
    exit 1
fi

# The lines of the page that document: headings and table rows.
grep -E '^(#|\|)' "$doc" > "$tmp/documented"
missing=0
while read -r name; do
    if ! grep -qiw -- "$name" "$tmp/documented"; then
        echo "FAIL: $name (public in module dsm) has no heading or table row in doc/fortran.md"
        missing=$((missing + 1))
    fi
done < "$tmp/public"
[ "$missing" -eq 0 ] || fail=1

# Every name a procedure heading gives must be public (no stale entries).
grep -E '^####[ \t]' "$doc" | grep -oE '[A-Za-z_][A-Za-z0-9_]*' | grep -i '^dsm_' | sort -u > "$tmp/headings"
while read -r name; do
    if ! grep -qixF -- "$name" "$tmp/public"; then
        echo "FAIL: doc/fortran.md has a heading for $name, which module dsm does not make public"
        fail=1
    fi
done < "$tmp/headings"
echo "$count public names, all documented: $([ "$missing" -eq 0 ] && echo yes || echo "no, $missing missing")"

# The complete example, compiled against the module of this build.
if [ ! -f "$builddir/dsm.mod" ] || [ -z "${FC:-}" ]; then
    echo "SKIP part: no Fortran module in $builddir (or FC unset): the example is not compiled"
    exit $fail
fi
awk '/^```fortran/ { inb = 1; n = 0; buf = ""; next }
     inb && /^```/ { inb = 0; if (buf ~ /^[ \t]*program /) { printf "%s", buf; exit } ; next }
     inb { buf = buf $0 "\n" }' "$doc" > "$tmp/example.f90"
[ -s "$tmp/example.f90" ] || { echo "FAIL: no complete example (a \`\`\`fortran block starting with program)"; exit 1; }
libs=$builddir/.libs
if ! (cd "$tmp" && $FC -I"$builddir" example.f90 -L"$libs" -ldsmf -ldsm ${LDFLAGS:-} \
        -Wl,-rpath,"$libs" -o example) > "$tmp/build.log" 2>&1; then
    cat "$tmp/build.log"
    echo "FAIL: the example of doc/fortran.md does not compile against $builddir/dsm.mod"
    exit 1
fi
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
(cd "$tmp" && OMP_NUM_THREADS=1 timeout 120 ${MPIEXEC:-mpiexec} -n 2 ./example) > "$tmp/run.log" 2>&1
rc=$?
cat "$tmp/run.log"
[ $rc -eq 0 ] || { echo "FAIL: the example exited $rc"; exit 1; }
# The output the page shows.
expected=$(grep -oE 'steps [0-9]+, w =[0-9. ]+[0-9]' "$doc" | head -n 1)
[ -n "$expected" ] || { echo "FAIL: doc/fortran.md shows no output of the example"; exit 1; }
grep -qF -- "$expected" "$tmp/run.log" || { echo "FAIL: the example did not print \"$expected\""; exit 1; }
echo "the example compiles, runs on 2 ranks and prints what the page shows"
exit $fail
