dnl DSM_CHECK_BLAS
dnl
dnl A CBLAS for the GPT example's host matrix products (examples/gpt), with
dnl the three states of --with-blas[=DIR]: not given = probe (pkg-config
dnl openblas, then blis, then the generic blas module, then -lopenblas in the
dnl default paths), yes/DIR = fail when none links, no = skip. Sets
dnl dsm_have_blas, BLAS_CPPFLAGS/LDFLAGS/LIBS and DSM_HAVE_BLAS (0 or 1, in
dnl dsm_config.h and as an automake conditional), and OPENMP_CFLAGS for C (the
dnl example's own loops). The library itself never links a BLAS.
AC_DEFUN([DSM_CHECK_BLAS], [
  DSM_CHECK_PACKAGE([blas], [blas], [cblas.h], [cblas_sgemm], [-lopenblas], [openblas blis blas], [])
  AC_LANG_PUSH([C])
  AC_OPENMP
  AC_LANG_POP([C])
])
