dnl DSM_CHECK_FORTRAN: --enable-fortran (default: on when an MPI Fortran compiler works).
dnl AC_PROG_FC([mpifort mpif90]) must run first (configure.ac), FC from the environment winning.
AC_DEFUN([DSM_CHECK_FORTRAN], [
  AC_ARG_ENABLE([fortran],
    [AS_HELP_STRING([--enable-fortran], [build the Fortran module (default: when mpifort works)])],
    [], [enable_fortran=probe])
  dsm_have_fortran=0
  AS_IF([test "x$enable_fortran" != xno && test -n "$FC"], [
    AC_LANG_PUSH([Fortran])
    AC_MSG_CHECKING([whether $FC builds MPI Fortran programs (mpi, mpi_f08, iso_c_binding)])
    AC_LINK_IFELSE([AC_LANG_PROGRAM([], [[      use mpi
      use mpi_f08, only: MPI_Comm
      use iso_c_binding
      integer :: ierr
      type(c_ptr) :: p
      p = c_null_ptr
      call MPI_Init(ierr)]])],
      [dsm_have_fortran=1; AC_MSG_RESULT([yes])], [AC_MSG_RESULT([no])])
    AC_LANG_POP([Fortran])
  ])
  AS_IF([test "$dsm_have_fortran" = 0 && test "x$enable_fortran" = xyes],
    [AC_MSG_ERROR([--enable-fortran: no working MPI Fortran compiler (set FC=mpifort)])])
  dnl dsm.mod can be read only by the compiler (and version) that wrote it:
  dnl dsmf.pc records which (pkg-config --variable=fc_version dsmf).
  DSM_FC_VERSION=
  AS_IF([test "$dsm_have_fortran" = 1],
    [DSM_FC_VERSION=`$FC --version 2>/dev/null | sed -n '/./{p;q;}'`])
  AC_SUBST([DSM_FC_VERSION])
  AC_DEFINE_UNQUOTED([DSM_HAVE_FORTRAN], [$dsm_have_fortran], [1 when the Fortran module is built])
  AM_CONDITIONAL([DSM_HAVE_FORTRAN], [test "$dsm_have_fortran" = 1])
  dnl fortran/gen_fortran.py regenerates the committed parts of module dsm
  dnl from dsm.h; without python3 the committed files are used as they are.
  AC_PATH_PROG([PYTHON3], [python3])
  AM_CONDITIONAL([DSM_HAVE_PYTHON3], [test -n "$PYTHON3"])
])
