# DSM_CHECK_TORCH_OPS
# -------------------
# The TorchScript operators of torch/ops (libdsm_torch_ops), built with the
# LibTorch that DSM_CHECK_LIBTORCH found (call it first): no second probe,
# the same flags (TORCH_CPPFLAGS, TORCH_CXXFLAGS, TORCH_LDFLAGS, TORCH_LIBS)
# and the same answer (--with-libtorch=no turns both off). TORCH_PYTHON is
# the Python with PyTorch that scripts the tests' model (default: the first
# of /usr/bin/python3 and python3 that imports torch). Sets
# dsm_have_torch_ops to 0 or 1, the conditional DSM_HAVE_TORCH_OPS and
# dsm_torch_ops_version.
AC_DEFUN([DSM_CHECK_TORCH_OPS], [
AC_ARG_VAR([TORCH_PYTHON], [a Python with PyTorch, for the torch/ops tests])
dsm_have_torch_ops=$dsm_have_libtorch
dsm_torch_ops_version=
AS_IF([test "$dsm_have_torch_ops" = 1], [dsm_torch_ops_version=$dsm_torch_version])
AS_IF([test "$dsm_have_torch_ops" = 1 && test -z "$TORCH_PYTHON"], [
  for dsm_py in /usr/bin/python3 python3; do
    AS_IF([$dsm_py -c 'import torch' >/dev/null 2>&1], [TORCH_PYTHON=$dsm_py; break])
  done
])
AM_CONDITIONAL([DSM_HAVE_TORCH_OPS], [test "$dsm_have_torch_ops" = 1])
])
