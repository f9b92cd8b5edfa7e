#!/bin/sh
# Print a field of the VERSION file: dsm_get_version.sh VERSION --full|--major|--minor|--patch|--so
file=$1
field=$2
val() { sed -n "s/^$1=//p" "$file"; }
case $field in
  --full)  printf '%s.%s.%s' "$(val major)" "$(val minor)" "$(val patch)" ;;
  --major) printf '%s' "$(val major)" ;;
  --minor) printf '%s' "$(val minor)" ;;
  --patch) printf '%s' "$(val patch)" ;;
  --so)    printf '%s' "$(val libdsm_so_version)" ;;
  *) echo "usage: $0 VERSION --full|--major|--minor|--patch|--so" >&2; exit 1 ;;
esac
