#!/bin/sh
# The distribution against the source tree: every file git tracks is in the
# distribution directory (or the tarball), apart from the repository's own
# files (.ci/, .gitignore and the like, listed below). A file missing here is
# one that a build or a test of the tarball would miss (a test's input, a
# script, a header): this finds it by name, without building and testing the
# tarball to find it by a failure.
#
#   test/tools/dist_files.sh SRCDIR DISTDIR_OR_TARBALL
#
# Exit: 0 all there; 1 files missing (listed); 77 SRCDIR is not a git
# checkout (a tarball's own tree: nothing to compare against).
set -eu
src=${1:?usage: dist_files.sh SRCDIR DISTDIR_OR_TARBALL}
dist=${2:?usage: dist_files.sh SRCDIR DISTDIR_OR_TARBALL}

if ! command -v git >/dev/null 2>&1 || ! git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
  echo "dist_files: $src is not a git checkout: nothing to compare the distribution with"
  exit 77
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Tracked files that do not belong in the distribution: the repository's
# own (CI, git and editor settings). Everything else tracked ships.
git -C "$src" ls-files | grep -v -E '^(\.ci/|\.gitignore$|\.gitattributes$|\.github/|\.clang-format$|\.editorconfig$)' \
  | sort >"$tmp/tracked"

if [ -d "$dist" ]; then
  (cd "$dist" && find . -type f -o -type l) | sed 's|^\./||' | sort >"$tmp/shipped"
elif [ -f "$dist" ]; then
  # The tarball's members, less its top directory (libdsm-VERSION/).
  tar -tf "$dist" | sed -e 's|^[^/]*/||' -e '/\/$/d' -e '/^$/d' | sort >"$tmp/shipped"
else
  echo "dist_files: no distribution directory or tarball at '$dist'" >&2
  exit 1
fi

comm -23 "$tmp/tracked" "$tmp/shipped" >"$tmp/missing"
if [ -s "$tmp/missing" ]; then
  n=$(wc -l <"$tmp/missing")
  echo "dist_files: $n tracked file(s) missing from $dist (add them to EXTRA_DIST or a _SOURCES list in Makefile.am):" >&2
  sed 's/^/  /' "$tmp/missing" >&2
  exit 1
fi
echo "dist_files: all $(wc -l <"$tmp/tracked") tracked files are in $dist"
