#!/bin/sh
# `make installcheck`: programs built against the installed libdsm, not the
# build tree, the way its users build them:
#   1. the README's C example, compiled with `pkg-config --cflags --libs dsm`;
#   2. the same example as a CMake project using find_package(dsm) and the
#      imported target dsm::dsm;
#   3. with the Fortran module: a Fortran program with `pkg-config dsmf` and
#      with CMake's dsm::dsmf;
# each run on 2 ranks. Also checks that the tools, their man pages and the
# man pages of the C API were installed. Run by the installcheck-local rule
# of Makefile.am, which passes the directories and tools in the environment.
set -u
fail() { echo "FAIL: $*"; exit 1; }
: "${prefix:?}" "${libdir:?}" "${includedir:?}" "${bindir:?}" "${mandir:?}" "${top_srcdir:?}" "${top_builddir:?}"
: "${CC:=mpicc}" "${FC:=}" "${CMAKE:=}" "${PKG_CONFIG:=pkg-config}" "${DSM_HAVE_FORTRAN:=0}"
# CFLAGS, FFLAGS, LDFLAGS: the flags every program here is built with besides
# what pkg-config or CMake give (the sanitizers' in a build with them, whose
# installed library needs their runtime in the program). CMake reads them
# from the environment too.
: "${CFLAGS:=}" "${FFLAGS:=}" "${LDFLAGS:=}"
export CFLAGS FFLAGS LDFLAGS
# Leaks are not checked in the MPI runs here (Open MPI's own would be reported).
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
# make passes the source and build directories relative to the build
# directory; the steps below run in other directories.
top_srcdir=$(cd "$top_srcdir" && pwd) || fail "no source directory $top_srcdir"
top_builddir=$(cd "$top_builddir" && pwd) || fail "no build directory $top_builddir"
dir=$(mktemp -d) || fail "mktemp"
trap 'rm -rf "$dir"' EXIT

# What the installation holds.
for f in "$includedir/dsm.h" "$includedir/dsm_version.h" "$libdir/pkgconfig/dsm.pc" \
         "$libdir/cmake/dsm/dsmConfig.cmake" "$libdir/cmake/dsm/dsmConfigVersion.cmake" \
         "$bindir/dsm-info" "$bindir/dsm-bench" "$mandir/man1/dsm-info.1" "$mandir/man1/dsm-bench.1" \
         "$mandir/man3/dsm_mesh_create.3" "$mandir/man3/dsm_engine_init.3" "$mandir/man3/dsm_step.3" \
         "$includedir/dsm/cuda.h" "$mandir/man3/dsm_engine_set_stream.3" \
         "$includedir/dsm/base.h" "$includedir/dsm/mesh.h" "$includedir/dsm/config.h" \
         "$includedir/dsm/engine.h" "$includedir/dsm/sp.h" "$includedir/dsm/data.h" \
         "${docdir:?}/README.md" "$docdir/doc/engine.md" "$docdir/doc/configuration.md" \
         "$docdir/doc/fortran.md"; do
  [ -e "$f" ] || fail "not installed: $f"
done
# A function's page is its own (not a link to the group page).
grep -q '^\.so ' "$mandir/man3/dsm_engine_init.3" && fail "dsm_engine_init(3) is a link, not its own page"
if [ "$DSM_HAVE_FORTRAN" = 1 ]; then
  for f in "$includedir/dsm.mod" "$libdir/pkgconfig/dsmf.pc"; do
    [ -e "$f" ] || fail "not installed: $f"
  done
  # Which compiler dsm.mod needs (doc/fortran.md).
  grep -q "^fc_version=." "$libdir/pkgconfig/dsmf.pc" || fail "dsmf.pc has no fc_version"
fi
"$bindir/dsm-info" --version > "$dir/version.txt" 2>&1 || fail "installed dsm-info --version: $(cat "$dir/version.txt")"

export OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
run2() { # run2 PROGRAM: 2 ranks, output in $out
  out=$(timeout 300 "$top_builddir/test/mpirun-wrapper.sh" 2 "$@" 2>&1)
}

# The README's C example (as test/tools/readme_example.sh extracts it).
sed -n '/^```c$/,/^```$/p' "$top_srcdir/README.md" | sed '1d;$d' > "$dir/readme_example.c"
[ -s "$dir/readme_example.c" ] || fail "README.md has no \`\`\`c block"
check_readme_output() { # $1: how it was built
  [ "$(echo "$out" | grep -c '^step 10, lr 0.001, grad norm')" = 2 ] ||
    fail "the README example built with $1 printed: $out"
}

# 1. pkg-config. The rpath stands for the user's LD_LIBRARY_PATH.
export PKG_CONFIG_PATH="$libdir/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
cflags=$($PKG_CONFIG --cflags dsm) || fail "pkg-config --cflags dsm"
libs=$($PKG_CONFIG --libs dsm) || fail "pkg-config --libs dsm"
[ "$($PKG_CONFIG --modversion dsm)" = "$(sed -n 's/^dsm-info (libdsm) //p' "$dir/version.txt")" ] ||
  fail "dsm.pc's version $($PKG_CONFIG --modversion dsm) is not dsm-info's: $(cat "$dir/version.txt")"
# shellcheck disable=SC2086
$CC -std=c11 -Wall -Wextra -Werror $CFLAGS $cflags "$dir/readme_example.c" $libs $LDFLAGS -Wl,-rpath,"$libdir" \
    -o "$dir/app_pc" || fail "the README example does not build with pkg-config ($cflags $libs)"
run2 "$dir/app_pc" || fail "the README example (pkg-config build) failed: $out"
check_readme_output pkg-config
echo "pkg-config: the README example builds and runs on 2 ranks"
# C++ including dsm.h: no warning (MPI's deprecated C++ bindings stay out).
cxx=${CXX:-mpicxx}
if command -v "${cxx%% *}" > /dev/null 2>&1; then
  printf '#include <dsm.h>\nint main() { return dsm_last_error() == nullptr; }\n' > "$dir/app.cc"
  # shellcheck disable=SC2086
  $cxx -std=c++17 -Wall -Wextra -Wpedantic -Werror $cflags -c "$dir/app.cc" -o "$dir/app_cxx.o" ||
    fail "a C++ file including dsm.h does not compile without warnings ($cxx $cflags)"
  echo "C++: dsm.h compiles with -Wall -Wextra -Wpedantic -Werror"
fi
# Each installed part of dsm.h compiles on its own.
for part in base mesh config engine sp data; do
  printf '#include <dsm/%s.h>\nint main(void) { return 0; }\n' "$part" > "$dir/part.c"
  # shellcheck disable=SC2086
  $CC -std=c99 -Wall -Wextra -Wpedantic -Werror $cflags -c "$dir/part.c" -o "$dir/part.o" ||
    fail "the installed <dsm/$part.h> does not compile on its own ($CC $cflags)"
done
echo "C: each installed part of dsm.h (dsm/base.h ... dsm/data.h) compiles on its own"

if [ "$DSM_HAVE_FORTRAN" = 1 ]; then
  fcflags=$($PKG_CONFIG --cflags dsmf) && flibs=$($PKG_CONFIG --libs dsmf) || fail "pkg-config dsmf"
  # shellcheck disable=SC2086
  (cd "$dir" && $FC $FFLAGS $fcflags "$top_srcdir/test/install/hello_dsm.f90" $flibs $LDFLAGS -Wl,-rpath,"$libdir" -o hello_pc) ||
    fail "the Fortran program does not build with pkg-config ($fcflags $flibs)"
  run2 "$dir/hello_pc" || fail "the Fortran program (pkg-config build) failed: $out"
  echo "$out" | grep -q '^hello_dsm: libdsm .*, mesh of 2 ranks$' || fail "the Fortran program printed: $out"
  echo "pkg-config: the Fortran program builds and runs on 2 ranks"
fi

# 2. CMake.
if [ -z "$CMAKE" ]; then
  echo "CMake: not checked (no cmake when configure ran)"
  exit 0
fi
cp "$top_srcdir/test/install/CMakeLists.txt" "$top_srcdir/test/install/hello_dsm.f90" "$dir/"
with_fortran=OFF
[ "$DSM_HAVE_FORTRAN" = 1 ] && with_fortran=ON
# CMake's FindMPI finds the MPI of the compiler wrappers libdsm was built with.
mpicc_path=$(command -v "${CC%% *}") || mpicc_path=${CC%% *}
"$CMAKE" -S "$dir" -B "$dir/build" -DCMAKE_PREFIX_PATH="$prefix" -DWITH_FORTRAN=$with_fortran \
    -DMPI_C_COMPILER="$mpicc_path" ${FC:+-DMPI_Fortran_COMPILER="$(command -v "${FC%% *}")"} \
    -DCMAKE_BUILD_RPATH="$libdir" > "$dir/cmake.log" 2>&1 || { cat "$dir/cmake.log"; fail "cmake configure"; }
"$CMAKE" --build "$dir/build" > "$dir/build.log" 2>&1 || { cat "$dir/build.log"; fail "cmake --build"; }
run2 "$dir/build/readme_example" || fail "the README example (CMake build) failed: $out"
check_readme_output CMake
echo "CMake: find_package(dsm) + dsm::dsm build the README example; it runs on 2 ranks"
if [ "$with_fortran" = ON ]; then
  run2 "$dir/build/hello_dsm" || fail "the Fortran program (CMake build) failed: $out"
  echo "$out" | grep -q '^hello_dsm: libdsm .*, mesh of 2 ranks$' || fail "the Fortran program printed: $out"
  echo "CMake: dsm::dsmf builds the Fortran program; it runs on 2 ranks"
fi

# A version the installation cannot satisfy must be refused.
mkdir "$dir/v" && cat > "$dir/v/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.13)
project(v LANGUAGES C)
find_package(dsm 99 QUIET)
if(dsm_FOUND)
  message(FATAL_ERROR "find_package(dsm 99) accepted version ${dsm_VERSION}")
endif()
find_package(dsm REQUIRED COMPONENTS NoSuchPart)
CM
if "$CMAKE" -S "$dir/v" -B "$dir/v/build" -DCMAKE_PREFIX_PATH="$prefix" -DMPI_C_COMPILER="$mpicc_path" \
     > "$dir/v.log" 2>&1; then
  cat "$dir/v.log"; fail "find_package(dsm COMPONENTS NoSuchPart) succeeded"
fi
grep -q "accepted version" "$dir/v.log" && { cat "$dir/v.log"; fail "find_package(dsm 99) accepted this version"; }
grep -q "unknown component 'NoSuchPart'" "$dir/v.log" || { cat "$dir/v.log"; fail "no message naming the unknown component"; }
echo "CMake: version 99 and an unknown component are refused"
exit 0
