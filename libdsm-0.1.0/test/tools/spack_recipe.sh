#!/bin/sh
# contrib/spack/package.py produces configure arguments that this configure
# accepts, for every combination of its variants (contrib/spack/test_package.py).
command -v python3 > /dev/null || { echo "SKIP: no python3"; exit 77; }
help=$(mktemp) || exit 1
trap 'rm -f "$help"' EXIT
"$top_srcdir/configure" --help > "$help" || { echo "FAIL: configure --help"; exit 1; }
python3 "$top_srcdir/contrib/spack/test_package.py" "$top_srcdir/contrib/spack/package.py" "$help"
