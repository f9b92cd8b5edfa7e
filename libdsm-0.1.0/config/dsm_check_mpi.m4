dnl DSM_CHECK_MPI: choose the MPI compiler wrappers before the compilers are set up.
dnl   --with-mpi not given -> probe for mpicc/mpicxx on PATH (CC/CXX from the
dnl                           environment win); fall back to the plain compilers
dnl   --with-mpi=yes       -> the wrappers must be on PATH
dnl   --with-mpi=DIR       -> DIR/bin/mpicc and DIR/bin/mpicxx
dnl   --with-mpi=no        -> no wrappers: the plain compilers, with MPI found through
dnl                           CPPFLAGS/LDFLAGS/LIBS given by the user
dnl In every case MPI itself is required: libdsm is an MPI library.
AC_DEFUN([DSM_CHECK_MPI_WRAPPERS], [
  AC_ARG_WITH([mpi],
    [AS_HELP_STRING([--with-mpi@<:@=DIR@:>@],
      [build with the MPI compiler wrappers (default: probe on PATH; DIR: MPI prefix; no: plain compilers, MPI through CPPFLAGS/LIBS)])],
    [], [with_mpi=probe])
  dsm_mpi_wrappers=no
  AS_CASE(["$with_mpi"],
    [no], [],
    [yes|probe], [
      AS_IF([test -z "$CC"], [AC_CHECK_PROGS([dsm_mpicc], [mpicc])])
      AS_IF([test -z "$CXX"], [AC_CHECK_PROGS([dsm_mpicxx], [mpicxx mpic++ mpiCC])])
      AS_IF([test -n "$dsm_mpicc" && test -n "$dsm_mpicxx"],
            [CC=$dsm_mpicc; CXX=$dsm_mpicxx; dsm_mpi_wrappers=yes],
            [test "$with_mpi" = yes && test -z "$CC$CXX"],
            [AC_MSG_ERROR([--with-mpi=yes: mpicc and mpicxx not found on PATH])])
    ],
    [
      AS_IF([test -x "$with_mpi/bin/mpicc" && test -x "$with_mpi/bin/mpicxx"],
            [CC="$with_mpi/bin/mpicc"; CXX="$with_mpi/bin/mpicxx"; dsm_mpi_wrappers=yes],
            [AC_MSG_ERROR([--with-mpi=$with_mpi: $with_mpi/bin/mpicc or $with_mpi/bin/mpicxx missing])])
    ])
])

dnl DSM_CHECK_MPI_WORKS: after the compilers are set up, prove MPI links from C.
AC_DEFUN([DSM_CHECK_MPI_WORKS], [
  AC_LANG_PUSH([C])
  AC_MSG_CHECKING([whether MPI programs link])
  AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <mpi.h>]],
      [[int p; MPI_Init_thread(0, 0, MPI_THREAD_MULTIPLE, &p); MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, 0); MPI_Finalize();]])],
    [AC_MSG_RESULT([yes])],
    [AC_MSG_RESULT([no])
     AC_MSG_ERROR([libdsm needs an MPI-3 library: use --with-mpi=DIR, or CC=mpicc CXX=mpicxx])])
  AC_LANG_POP([C])
])

dnl DSM_CHECK_MPIEXEC: the launcher the tests use (--with-mpiexec=CMD).
AC_DEFUN([DSM_CHECK_MPIEXEC], [
  AC_ARG_WITH([mpiexec],
    [AS_HELP_STRING([--with-mpiexec=CMD],
      [launcher for the MPI tests, e.g. "srun --mpi=pmix" (default: mpiexec next to mpicc, else on PATH)])],
    [MPIEXEC=$withval], [MPIEXEC=])
  AS_IF([test "x$MPIEXEC" = xno], [AC_MSG_ERROR([--without-mpiexec: the MPI tests need a launcher])])
  AS_IF([test -z "$MPIEXEC" || test "x$MPIEXEC" = xyes], [
    dsm_mpi_bindir=`AS_DIRNAME(["$(command -v "$CC" 2>/dev/null || echo "$CC")"])`
    AC_PATH_PROGS([MPIEXEC], [mpiexec mpirun srun], [], [$dsm_mpi_bindir$PATH_SEPARATOR$PATH])
  ])
  AS_IF([test -z "$MPIEXEC"], [MPIEXEC="mpiexec"; AC_MSG_WARN([no MPI launcher found; the MPI tests will fail])])
  AC_SUBST([MPIEXEC])
])
