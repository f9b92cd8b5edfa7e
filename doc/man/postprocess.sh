#!/bin/sh
# Turn the man pages that doxygen wrote from include/dsm.h and the interop
# headers beside it (include/dsm/*.h: dsm/cuda.h) into the committed pages
# of doc/man/man3 and write doc/man/man3.am. Run after doxygen, from doc/:
#     cd doc && doxygen Doxyfile && ./man/postprocess.sh
# (the `man` target of Makefile.am does exactly this).
#
# Kept: one real page per group of the headers (@defgroup), the page of dsm.h
# itself (dsm.h.3, with the header's introduction as its DESCRIPTION), the
# page of each documented struct, and for every public dsm_/DSM_ name a page
# NAME.3: for a function, a short page of its own (its synopsis and
# documentation, cut from the group page, which it names under SEE ALSO);
# for any other name, a `.so man3/GROUP.3` link. Dropped: directory pages and the
# links doxygen makes for struct fields. Dates and build paths are removed so
# that regenerating the pages changes them only when dsm.h changes.
set -eu

me=postprocess.sh
cd "$(dirname "$0")/.."              # doc/

gen=doxygen.tmp/man/man3
tmp=doxygen.tmp
dest=man/man3
am=man/man3.am
header=../include/dsm.h
# dsm.h, the parts it includes in its order, then the interop headers.
parts=$(sed -n 's|^#include "\(dsm/[a-z_]*\.h\)"$|../include/\1|p' "$header" | tr '\n' ' ')
headers="$header $parts"
for h in ../include/dsm/*.h; do
    case " $parts " in *" $h "*) continue ;; esac
    [ -f "$h" ] && headers="$headers $h"
done

die() {
    echo "$me: $*" >&2
    exit 1
}

[ -d "$gen" ] || die "$gen is missing: run 'doxygen Doxyfile' in doc/ first"
[ -f "$header" ] || die "$header is missing"

version=$(sh ../config/dsm_get_version.sh ../VERSION --full) || die "cannot read ../VERSION"
top_logical=$(cd .. && pwd)
top_physical=$(cd .. && pwd -P)

# The groups of the headers, in header order (dsm.h first).
# shellcheck disable=SC2086
groups=$(sed -n 's/.*@defgroup[ 	]\{1,\}\([A-Za-z0-9_]\{1,\}\).*/\1/p' $headers)
[ -n "$groups" ] || die "no @defgroup in $headers"

# The functions the headers declare: the identifier before '(' on each
# line that starts with DSM_API.
# shellcheck disable=SC2086
functions=$(sed -n 's/^DSM_API[^(]*[^A-Za-z0-9_]\([A-Za-z_][A-Za-z0-9_]*\)[ 	]*(.*/\1/p' $headers)
[ -n "$functions" ] || die "no DSM_API declarations found in $headers"

is_group() {
    for g in $groups; do
        [ "$g" = "$1" ] && return 0
    done
    return 1
}

# SEE ALSO of a real page: the other group pages, dsm.h(3) and dsm-info(1).
see_also() {
    self=$1
    echo '.SH "SEE ALSO"'
    [ "$self" = dsm.h ] || printf '.BR dsm.h (3),\n'
    for g in $groups; do
        [ "$g" = "$self" ] || printf '.BR %s (3),\n' "$g"
    done
    printf '.BR dsm-info (1)\n'
}

# The introduction of dsm.h (its first comment) as a roff DESCRIPTION.
header_description() {
    echo '.SH DESCRIPTION'
    awk '
        NR == 1 && $0 !~ /^\/\*/ { exit }
        /^ *\*\// { exit }
        {
            line = $0
            sub(/^\/\* ?/, "", line)
            sub(/^ *\* ?/, "", line)
            if (line == "") { if (text) para = 1; next }
            gsub(/\\/, "\\e", line)
            if (line ~ /^[.'\'']/) line = "\\&" line
            if (para) { print ".PP"; para = 0 }
            print line
            text = 1
        }' "$header"
}

# Rewrite one real page: stable .TH line, a NAME description where doxygen
# left none, no section without text (e.g. an empty "Detailed Description"),
# no doxygen "Author" section, no build paths, no trailing blanks. For dsm.h
# the header's introduction becomes the DESCRIPTION, after the SYNOPSIS.
# SEE ALSO ends every page.
rewrite_page() {
    src=$1
    name=$2
    out=$3
    case $name in
        dsm.h) desc='the libdsm C API: every declaration of the header and its parts' ;;
        dsm_mesh_options) desc='options of dsm_mesh_create_with_options()' ;;
        dsm_engine_options) desc='options of dsm_engine_init_with_options()' ;;
        *) desc='part of the libdsm C API' ;;
    esac
    descfile=
    if [ "$name" = dsm.h ]; then
        descfile=$tmp/description.roff
        header_description >"$descfile"
    fi
    awk -v name="$name" -v version="$version" -v desc="$desc" -v descfile="$descfile" \
        -v top1="$top_logical/" -v top2="$top_physical/" '
        function strip(s,   i) {
            while ((i = index(s, top1)) > 0) s = substr(s, 1, i - 1) substr(s, i + length(top1))
            while ((i = index(s, top2)) > 0) s = substr(s, 1, i - 1) substr(s, i + length(top2))
            sub(/[ \t]+$/, "", s)
            return s
        }
        # A buffered section is printed only if it holds text, not just
        # paragraph macros and subsection headings.
        function flush(   i, text) {
            text = 0
            for (i = 1; i <= nb; ++i)
                if (buf[i] != "" && buf[i] != ".PP" && buf[i] !~ /^\.SS /) text = 1
            if (text) for (i = 0; i <= nb; ++i) print buf[i]
            nb = -1
        }
        function description(   line) {
            if (descfile == "" || described) return
            while ((getline line < descfile) > 0) print line
            close(descfile)
            described = 1
        }
        BEGIN { nb = -1 }
        /^\.SH "Author"/ { author = 1 }
        author { next }
        /^\.TH / {
            printf(".TH \"%s\" 3 \"Version %s\" \"libdsm\" \\\" -*- nroff -*-\n", name, version)
            next
        }
        in_name {
            in_name = 0
            line = strip($0)
            if (index(line, "\\-") == 0) line = line " \\- " desc
            print line
            next
        }
        /^\.SH / {
            if (nb >= 0) flush()
            if ($0 ~ /^\.SH NAME/) { in_name = 1; print; next }
            if ($0 ~ /^\.SH SYNOPSIS/) { print; next }
            description()
            nb = 0
            buf[0] = $0
            next
        }
        nb >= 0 { buf[++nb] = strip($0); next }
        { print strip($0) }
        END {
            if (nb >= 0) flush()
            description()
        }' "$src" >"$out"
    see_also "$name" >>"$out"
}

# dsm.h only includes its parts (dsm/base.h, dsm/mesh.h, ...): its page lists
# their declarations, section by section (Data Structures, Macros, ...), in
# include order, as the synopsis of one header would. The parts' own file
# pages are not kept (what links to them links to dsm.h.3).
part_pages=
for p in $parts; do
    part_pages="$part_pages $gen/${p##*/}.3"
done
merge_parts() {
    awk -v parts="$part_pages" '
        function collect(file,   line, sec, insyn) {
            insyn = 0; sec = ""
            while ((getline line < file) > 0) {
                if (line ~ /^\.SH SYNOPSIS/) { insyn = 1; continue }
                if (insyn && line ~ /^\.SH /) break
                if (!insyn) continue
                if (line ~ /^\.SS /) {
                    sec = line
                    if (!(sec in seen)) { seen[sec] = 1; extra[++nx] = sec }
                    continue
                }
                if (sec == "" || line == "" || line == ".in +1c" || line == ".in -1c") continue
                body[sec] = body[sec] line "\n"
            }
            close(file)
        }
        function emit_one(sec) {
            if (!(sec in body)) return
            print sec; print ""; print ".in +1c"; printf "%s", body[sec]; print ".in -1c"
            done_[sec] = 1
        }
        function emit(   i, n, order) {
            n = split("Data Structures|Macros|Typedefs|Enumerations|Functions", order, "|")
            for (i = 1; i <= n; ++i) emit_one(".SS \"" order[i] "\"")
            for (i = 1; i <= nx; ++i) if (!(extra[i] in done_)) emit_one(extra[i])
        }
        BEGIN { np = split(parts, p, " "); for (i = 1; i <= np; ++i) collect(p[i]) }
        /^\.SH / && insyn { emit(); insyn = 0 }
        /^\.SH SYNOPSIS/ { insyn = 1 }
        { print }
        END { if (insyn) emit() }' "$1" >"$2"
}

# ---------------------------------------------------------------- select and rewrite
stage=$tmp/stage
rm -rf "$stage"
mkdir -p "$stage"

for f in "$gen"/*.3; do
    [ -f "$f" ] || continue
    base=${f##*/}
    name=${base%.3}
    case $name in
        dsm.h | dsm_* | DSM_*) ;;
        *) continue ;;                  # directory pages, struct field links
    esac
    first=$(sed -n '1p' "$f")
    case $first in
        .so\ *)
            if is_group "$name"; then
                die "$base: doxygen wrote a link over the group page ($first)"
            fi
            # A link to a part's file page goes to dsm.h's page.
            for p in $parts; do
                [ "$first" = ".so man3/${p##*/}.3" ] && first='.so man3/dsm.h.3'
            done
            printf '%s\n' "$first" >"$stage/$base"
            ;;
        *)
            if [ "$name" = dsm.h ]; then
                merge_parts "$f" "$tmp/dsm.h.merged.3"
                rewrite_page "$tmp/dsm.h.merged.3" "$name" "$stage/$base"
            else
                rewrite_page "$f" "$name" "$stage/$base"
                # A struct's page names the header programs include.
                for p in $parts; do
                    h=${p##*/}
                    sed 's|^\\fC#include <'"${h%.h}"'\\&\.h>\\fP$|\\fC#include <dsm\\\&.h>\\fP|' \
                        "$stage/$base" >"$stage/$base.tmp" && mv "$stage/$base.tmp" "$stage/$base"
                done
            fi
            ;;
    esac
done

# Every group has a real page; every link points at a kept page.
for g in $groups; do
    [ -f "$stage/$g.3" ] || die "no page for group $g"
    case $(sed -n '1p' "$stage/$g.3") in
        .so\ *) die "the page of group $g is a link" ;;
    esac
done
for f in "$stage"/*.3; do
    first=$(sed -n '1p' "$f")
    case $first in
        .so\ man3/*)
            target=${first#.so man3/}
            [ -f "$stage/$target" ] || die "${f##*/} links to $target, which is not kept"
            ;;
        .so\ *) die "${f##*/}: unexpected link '$first'" ;;
    esac
done

# One short page per function instead of a link to its group's page: its
# synopsis and documentation, cut from the group's "Function Documentation",
# and the group page under SEE ALSO for the types and related calls.
for fn in $functions; do
    f=$stage/$fn.3
    [ -f "$f" ] || continue
    first=$(sed -n '1p' "$f")
    case $first in
        .so\ man3/*) ;;
        *) continue ;;
    esac
    group=${first#.so man3/}
    group=${group%.3}
    include='#include <dsm.h>'
    [ "$group" = dsm_cuda ] && include='#include <dsm/cuda.h>'
    awk -v fn="$fn" -v group="$group" -v include="$include" '
        NR == 1 { th = $0; sub(/^\.TH "[^"]*"/, ".TH \"" fn "\"", th) }
        /^\.SH "Function Documentation"/ { infn = 1; next }
        infn && /^\.SH / { infn = 0; keep = 0 }
        infn && /^\.SS / { keep = index($0, " " fn " (") > 0; if (keep) { ss = $0; found = 1 }; next }
        infn && keep { body = body $0 "\n"; if (brief == "" && $0 !~ /^\./ && $0 != "") brief = $0 }
        END {
            if (!found) exit 1
            sub(/^\.SS "/, "", ss); sub(/"$/, "", ss)
            i = index(brief, "\\&."); if (i > 0) brief = substr(brief, 1, i - 1)
            print th
            print ".ad l"
            print ".nh"
            print ".SH NAME"
            print fn " \\- " brief
            print ".SH SYNOPSIS"
            print ".nf"
            print "\\fB" include "\\fP"
            print ""
            print ss ";"
            print ".fi"
            print ".SH DESCRIPTION"
            printf "%s", body
            print ".SH \"SEE ALSO\""
            print ".BR " group " (3)"
        }' "$stage/$group.3" >"$f.new" || die "no documentation of $fn in $group.3"
    mv "$f.new" "$f"
done

# Every function of the headers has a page.
missing=
for fn in $functions; do
    [ -f "$stage/$fn.3" ] || missing="$missing $fn"
done
[ -z "$missing" ] || die "functions of the headers without a page:$missing"

# No build path is left, and no two names differ only in case (they would
# collide on case-insensitive file systems).
if grep -l -F -e "$top_logical/" -e "$top_physical/" "$stage"/*.3 >/dev/null 2>&1; then
    die "build paths left in: $(grep -l -F -e "$top_logical/" -e "$top_physical/" "$stage"/*.3 | tr '\n' ' ')"
fi
clash=$(cd "$stage" && printf '%s\n' *.3 | tr '[:upper:]' '[:lower:]' | LC_ALL=C sort | uniq -d)
[ -z "$clash" ] || die "page names that differ only in case: $clash"

# ---------------------------------------------------------------- install
mkdir -p "$dest"
rm -f "$dest"/*.3
cp "$stage"/*.3 "$dest"/

pages=$(cd "$dest" && printf '%s\n' *.3 | LC_ALL=C sort)
{
    echo '## Generated by doc/man/postprocess.sh (make man): do not edit.'
    printf 'DSM_MAN3 ='
    for p in $pages; do
        printf ' \\\n\tdoc/man/man3/%s' "$p"
    done
    printf '\n'
} >"$am"

rm -rf "$tmp"
echo "$me: $(echo "$pages" | wc -l | tr -d ' ') pages in doc/$dest, list in doc/$am"
