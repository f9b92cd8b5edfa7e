dnl DSM_CHECK_LIBTORCH
dnl
dnl LibTorch for the optional bridge libdsm_torch (torch/), with the three
dnl states of --with-libtorch[=DIR]:
dnl   not given  -> probe the compiler's default paths (Debian's libtorch-dev:
dnl                 /usr/include/torch, libtorch.so in the multiarch directory);
dnl                 quietly disabled when not found
dnl   yes or DIR -> required: configure fails when it is not usable. DIR is a
dnl                 LibTorch prefix (DIR/include, DIR/lib), such as a PyTorch
dnl                 installation's `python -c "import torch, os;
dnl                 print(os.path.dirname(torch.__file__))"`, or the directory
dnl                 torch.utils.cmake_prefix_path names (DIR/../..).
dnl   no         -> skipped
dnl The C++ standard (C++17 for 1.x, C++20 for 2.x) and the libstdc++ ABI
dnl (_GLIBCXX_USE_CXX11_ABI, from the installation's TorchConfig.cmake) are
dnl LibTorch's, not libdsm's: they go into TORCH_CXXFLAGS, used only for the
dnl bridge. A LibTorch with libtorch_cuda is the CUDA build. libdsm itself
dnl never links LibTorch.
dnl
dnl Sets dsm_have_libtorch (0/1), dsm_torch_version ("1.13.0"), dsm_torch_device
dnl ("CPU" or "CUDA"); substitutes TORCH_CPPFLAGS, TORCH_CXXFLAGS,
dnl TORCH_LDFLAGS, TORCH_LIBS; DSM_HAVE_LIBTORCH is always defined to 0 or 1
dnl (dsm_config.h and an automake conditional).
AC_DEFUN([DSM_CHECK_LIBTORCH], [
  AC_ARG_WITH([libtorch],
    [AS_HELP_STRING([--with-libtorch@<:@=DIR@:>@],
      [build the PyTorch bridge libdsm_torch with LibTorch (default: probe; DIR: a LibTorch or PyTorch installation prefix; no: skip)])],
    [], [with_libtorch=probe])
  dsm_have_libtorch=0
  dsm_torch_version=
  dsm_torch_device=
  TORCH_CPPFLAGS=; TORCH_CXXFLAGS=; TORCH_LDFLAGS=; TORCH_LIBS=
  AS_IF([test "x$with_libtorch" != xno], [
    dsm_torch_inc=; dsm_torch_lib=; dsm_torch_cmake=
    AS_CASE(["$with_libtorch"],
      [yes|probe], [
        for dsm_d in /usr/include /usr/local/include; do
          AS_IF([test -f "$dsm_d/torch/csrc/api/include/torch/version.h"], [dsm_torch_inc=$dsm_d; break])
        done
        for dsm_d in /usr/lib/x86_64-linux-gnu/cmake/Torch /usr/lib/aarch64-linux-gnu/cmake/Torch \
                     /usr/lib/cmake/Torch /usr/local/lib/cmake/Torch /usr/share/cmake/Torch; do
          AS_IF([test -f "$dsm_d/TorchConfig.cmake"], [dsm_torch_cmake=$dsm_d/TorchConfig.cmake; break])
        done],
      [
        dsm_d=$with_libtorch
        dnl torch.utils.cmake_prefix_path is PREFIX/share/cmake
        AS_IF([test ! -d "$dsm_d/include" && test -d "$dsm_d/../../include"], [dsm_d=`cd "$dsm_d/../.." && pwd`])
        dsm_torch_inc=$dsm_d/include
        AS_IF([test -d "$dsm_d/lib64"], [dsm_torch_lib=$dsm_d/lib64], [dsm_torch_lib=$dsm_d/lib])
        AS_IF([test -f "$dsm_d/share/cmake/Torch/TorchConfig.cmake"],
              [dsm_torch_cmake=$dsm_d/share/cmake/Torch/TorchConfig.cmake])
      ])
    AC_MSG_CHECKING([for the LibTorch headers])
    AS_IF([test -n "$dsm_torch_inc" && test -f "$dsm_torch_inc/torch/csrc/api/include/torch/version.h"], [
      dsm_torch_version=`sed -n 's/^#define TORCH_VERSION_MAJOR *//p;s/^#define TORCH_VERSION_MINOR *//p;s/^#define TORCH_VERSION_PATCH *//p' \
        "$dsm_torch_inc/torch/csrc/api/include/torch/version.h" | tr '\n' '.' | sed 's/\.$//'`
      AC_MSG_RESULT([$dsm_torch_inc (LibTorch $dsm_torch_version)])
    ], [AC_MSG_RESULT([no])])
    AS_IF([test -n "$dsm_torch_version"], [
      AS_IF([test "$dsm_torch_inc" != /usr/include], [TORCH_CPPFLAGS="-I$dsm_torch_inc"])
      TORCH_CPPFLAGS="$TORCH_CPPFLAGS -I$dsm_torch_inc/torch/csrc/api/include"
      dsm_torch_major=`echo "$dsm_torch_version" | cut -d. -f1`
      AS_IF([test "$dsm_torch_major" -ge 2], [TORCH_CXXFLAGS="-std=c++20"], [TORCH_CXXFLAGS="-std=c++17"])
      dnl The libstdc++ ABI LibTorch was built with (its CMake config says it).
      dsm_torch_abi=1
      AS_IF([test -n "$dsm_torch_cmake"], [
        dsm_abi=`sed -n 's/.*_GLIBCXX_USE_CXX11_ABI=\([[01]]\).*/\1/p' "$dsm_torch_cmake" | head -n1`
        AS_IF([test -n "$dsm_abi"], [dsm_torch_abi=$dsm_abi])
      ])
      TORCH_CXXFLAGS="$TORCH_CXXFLAGS -D_GLIBCXX_USE_CXX11_ABI=$dsm_torch_abi"
      AS_IF([test -n "$dsm_torch_lib"], [TORCH_LDFLAGS="-L$dsm_torch_lib -Wl,-rpath,$dsm_torch_lib"])
      TORCH_LIBS="-ltorch -ltorch_cpu -lc10"
      dsm_torch_device=CPU
      AS_IF([test -n "$dsm_torch_lib" && test -f "$dsm_torch_lib/libtorch_cuda.so"], [
        dsm_torch_device=CUDA
        TORCH_LIBS="-Wl,--no-as-needed -ltorch_cuda -lc10_cuda -Wl,--as-needed $TORCH_LIBS"
      ])
      AC_LANG_PUSH([C++])
      dsm_save_CXXFLAGS=$CXXFLAGS; dsm_save_CPPFLAGS=$CPPFLAGS; dsm_save_LDFLAGS=$LDFLAGS; dsm_save_LIBS=$LIBS
      CXXFLAGS="$CXXFLAGS $TORCH_CXXFLAGS"; CPPFLAGS="$TORCH_CPPFLAGS $CPPFLAGS"
      LDFLAGS="$TORCH_LDFLAGS $LDFLAGS"; LIBS="$TORCH_LIBS $LIBS"
      AC_MSG_CHECKING([whether a LibTorch $dsm_torch_version program links ($TORCH_CXXFLAGS)])
      dnl c10::Device(std::string) fails to link when the libstdc++ ABI differs.
      AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <torch/version.h>
#include <c10/core/Device.h>
#include <string>]], [[c10::Device d(std::string("cpu")); return d.is_cpu() ? 0 : 1;]])],
        [dsm_have_libtorch=1; AC_MSG_RESULT([yes])], [AC_MSG_RESULT([no])])
      CXXFLAGS=$dsm_save_CXXFLAGS; CPPFLAGS=$dsm_save_CPPFLAGS; LDFLAGS=$dsm_save_LDFLAGS; LIBS=$dsm_save_LIBS
      AC_LANG_POP([C++])
    ])
    AS_IF([test "$dsm_have_libtorch" != 1], [
      TORCH_CPPFLAGS=; TORCH_CXXFLAGS=; TORCH_LDFLAGS=; TORCH_LIBS=
      AS_IF([test "x$with_libtorch" != xprobe],
        [AC_MSG_ERROR([--with-libtorch=$with_libtorch was given but LibTorch is not usable (need torch/csrc/api/include/torch/version.h and libtorch, libtorch_cpu, libc10 that link; Debian: libtorch-dev); see config.log])])
    ])
  ])
  AC_DEFINE_UNQUOTED([DSM_HAVE_LIBTORCH], [$dsm_have_libtorch], [1 when the PyTorch bridge libdsm_torch is built])
  AM_CONDITIONAL([DSM_HAVE_LIBTORCH], [test "$dsm_have_libtorch" = 1])
  AC_SUBST([DSM_HAVE_LIBTORCH], [$dsm_have_libtorch])
  AC_SUBST([DSM_TORCH_VERSION], [$dsm_torch_version])
  AC_SUBST([TORCH_CPPFLAGS])
  AC_SUBST([TORCH_CXXFLAGS])
  AC_SUBST([TORCH_LDFLAGS])
  AC_SUBST([TORCH_LIBS])
])
