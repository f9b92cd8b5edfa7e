# DSM_CHECK_TORCH_OPS
# -------------------
# LibTorch for the TorchScript operators of torch/ops (libdsm_torch_ops).
# Probes Debian's libtorch-dev (headers in /usr/include/torch, C++17) unless
# LibTorch was turned off (with_libtorch=no); TORCH_OPS_CPPFLAGS and
# TORCH_OPS_LIBS override the flags. TORCH_PYTHON is the Python with PyTorch
# that scripts the tests' model (default: the first of /usr/bin/python3 and
# python3 that imports torch). Sets dsm_have_torch_ops to 0 or 1, the
# conditional DSM_HAVE_TORCH_OPS and dsm_torch_ops_version.
AC_DEFUN([DSM_CHECK_TORCH_OPS], [
AC_ARG_VAR([TORCH_OPS_CPPFLAGS], [preprocessor flags for LibTorch (torch/ops)])
AC_ARG_VAR([TORCH_OPS_LIBS], [libraries for LibTorch (torch/ops)])
AC_ARG_VAR([TORCH_PYTHON], [a Python with PyTorch, for the torch/ops tests])
dsm_have_torch_ops=0
dsm_torch_ops_version=
AS_IF([test "x$with_libtorch" != xno], [
  AS_IF([test -z "$TORCH_OPS_CPPFLAGS"], [TORCH_OPS_CPPFLAGS="-I/usr/include/torch/csrc/api/include"])
  AS_IF([test -z "$TORCH_OPS_LIBS"], [TORCH_OPS_LIBS="-ltorch -ltorch_cpu -lc10"])
  AC_LANG_PUSH([C++])
  dsm_save_CPPFLAGS=$CPPFLAGS
  dsm_save_LIBS=$LIBS
  CPPFLAGS="$CPPFLAGS $TORCH_OPS_CPPFLAGS"
  LIBS="$TORCH_OPS_LIBS $LIBS"
  AC_MSG_CHECKING([for LibTorch (torch/ops)])
  AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <torch/types.h>
#include <torch/version.h>]],
                                  [[return torch::ones({2}).sum().item<float>() == 2.0f ? 0 : 1;]])],
    [dsm_have_torch_ops=1
     dsm_torch_ops_version=`echo TORCH_VERSION | $CXX -E -P $CPPFLAGS -include torch/version.h - 2>/dev/null | grep -v '^ *$' | tail -n 1 | tr -d ' "'`
     AC_MSG_RESULT([yes ($dsm_torch_ops_version)])],
    [AC_MSG_RESULT([no])])
  CPPFLAGS=$dsm_save_CPPFLAGS
  LIBS=$dsm_save_LIBS
  AC_LANG_POP([C++])
])
AS_IF([test "$dsm_have_torch_ops" = 1 && test -z "$TORCH_PYTHON"], [
  for dsm_py in /usr/bin/python3 python3; do
    AS_IF([$dsm_py -c 'import torch' >/dev/null 2>&1], [TORCH_PYTHON=$dsm_py; break])
  done
])
AM_CONDITIONAL([DSM_HAVE_TORCH_OPS], [test "$dsm_have_torch_ops" = 1])
])
