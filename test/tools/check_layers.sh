#!/bin/sh
# Every #include "DIR/..." in src/ against the layer order of src/LAYERS: a
# folder may include its own headers and those of folders on earlier lines,
# never those of a folder on its own line or a later one. Prints each
# violation (file:line: what it includes) and fails on any, or on a folder of
# src/ that src/LAYERS does not place.
# Also: the engine makes every collective through comm (comm::Backend, so the
# backend's choice, its byte accounting and the watchdog see it): an MPI call
# in src/engine other than the local ones listed below fails.
srcdir=${top_srcdir:-.}
top=$(cd "$srcdir" && pwd)
layers="$top/src/LAYERS"
[ -r "$layers" ] || { echo "check_layers: cannot read $layers" >&2; exit 1; }

awk -v top="$top" '
FNR == NR {
    if ($0 ~ /^[ \t]*(#|$)/) next
    ++line
    for (i = 1; i <= NF; i++) rank[$i] = line
    next
}
{
    file = FILENAME; sub("^" top "/src/", "", file)
    dir = file; sub("/.*", "", dir)
    if (!(dir in rank)) {
        if (!(dir in unplaced)) { printf "src/%s: folder %s is not in src/LAYERS\n", file, dir; unplaced[dir] = 1; bad++ }
        next
    }
    if (match($0, /^[ \t]*#[ \t]*include[ \t]*"[a-z_0-9]+\//)) {
        inc = $0; sub(/^[ \t]*#[ \t]*include[ \t]*"/, "", inc); to = inc; sub("/.*", "", to); sub("\".*", "", inc)
        if (to == dir || !(to in rank)) next
        if (rank[to] >= rank[dir]) {
            printf "src/%s:%d: %s (layer %d) includes %s (layer %d%s)\n", file, FNR, dir, rank[dir], inc, rank[to],
                   rank[to] == rank[dir] ? ", the same line" : ", above it"
            bad++
        }
    }
}
END {
    if (bad) { printf "check_layers: %d violation(s) of src/LAYERS\n", bad; exit 1 }
    print "check_layers: every include in src/ follows src/LAYERS"
}' "$layers" $(find "$top/src" -mindepth 2 -type f \( -name '*.cc' -o -name '*.hpp' -o -name '*.cu' -o -name '*.h' \) | sort)
status=$?

# MPI calls of src/engine that are not the local ones (time, rank and size,
# thread level): a collective made around comm.
raw=$(grep -n 'MPI_[A-Z][A-Za-z_]*[ 	]*(' "$top"/src/engine/*.cc "$top"/src/engine/*.hpp |
      grep -v 'MPI_Wtime[ 	]*(\|MPI_Comm_rank[ 	]*(\|MPI_Comm_size[ 	]*(\|MPI_Query_thread[ 	]*(')
if [ -n "$raw" ]; then
    echo "$raw" | sed "s|^$top/||"
    echo "check_layers: src/engine calls MPI directly (make the collective through comm::Backend, comm/scalars.hpp)"
    exit 1
fi
echo "check_layers: src/engine makes no MPI collective of its own"
exit $status
