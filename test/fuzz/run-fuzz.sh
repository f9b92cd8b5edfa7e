#!/bin/sh
# Build the configuration reader's libFuzzer target with clang and run it for
# a bounded time, seeded with the example configurations.
#   test/fuzz/run-fuzz.sh BUILDDIR [SECONDS]
# BUILDDIR is a configured build tree (for dsm_config.h and dsm_version.h).
# Exits 77 (skipped) when clang with -fsanitize=fuzzer is not available.
set -eu
build=$(cd "$1" && pwd)
seconds=${2:-60}
src=$(cd "$(dirname "$0")/../.." && pwd)
command -v clang++ >/dev/null 2>&1 || { echo "SKIP: clang++ not found"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf 'int main(){return 0;}\n' > "$work/probe.cc"
if ! clang++ -fsanitize=fuzzer -x c++ /dev/null -c -o "$work/probe.o" 2>/dev/null; then
  echo "SKIP: clang++ has no libFuzzer"; exit 77
fi
cxx="clang++ -std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all"
flags="-DOMPI_SKIP_MPICXX=1 -DMPICH_SKIP_MPICXX=1 -I$src/include -I$build/include -I$src/src -I$build/src"
mpiflags=$(mpicxx --showme:compile 2>/dev/null || echo)
mpilibs=$(mpicxx --showme:link 2>/dev/null || echo -lmpi)
# shellcheck disable=SC2086
$cxx $flags $mpiflags -o "$work/fuzz_config" "$src/test/fuzz/fuzz_config.cc" \
  "$src"/src/config/*.cc "$src"/src/core/*.cc "$src"/src/optim/lr_schedule.cc "$src"/src/optim/optimizer_type.cc \
  $mpilibs
mkdir -p "$work/corpus"
cp "$src"/test/data/config/*.json "$work/corpus/"
echo "fuzzing the configuration reader for ${seconds}s"
# Unknown-key warnings would flood the output.
rc=0
DSM_DEBUG=NONE ASAN_OPTIONS=detect_leaks=0 "$work/fuzz_config" -max_total_time="$seconds" \
  -max_len=4096 -timeout=10 -print_final_stats=1 -artifact_prefix="$work/" "$work/corpus" \
  > "$work/fuzz.log" 2>&1 || rc=$?
tail -n 8 "$work/fuzz.log"
if [ "$rc" -ne 0 ]; then
  # The crash report and the input that caused it.
  grep -A40 "==ERROR\|deadly signal\|uncaught" "$work/fuzz.log" | head -n 60
  for f in "$work"/crash-* "$work"/timeout-* "$work"/leak-*; do
    [ -f "$f" ] && { echo "input $f:"; od -c "$f" | head -n 20; }
  done
  echo "FAIL: the configuration reader crashed under fuzzing"
  exit 1
fi
echo "PASS: no crash in ${seconds}s of fuzzing"
