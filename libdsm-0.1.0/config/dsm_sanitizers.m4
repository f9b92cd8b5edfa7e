dnl DSM_ENABLE_SANITIZERS: --enable-sanitizers builds everything with AddressSanitizer
dnl and UndefinedBehaviorSanitizer (-fno-sanitize-recover: any report fails the test).
AC_DEFUN([DSM_ENABLE_SANITIZERS], [
  AC_ARG_ENABLE([sanitizers],
    [AS_HELP_STRING([--enable-sanitizers], [build with address and undefined-behaviour sanitizers])],
    [], [enable_sanitizers=no])
  SANITIZER_FLAGS=
  AS_IF([test "x$enable_sanitizers" = xyes], [
    SANITIZER_FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
    dsm_save_CFLAGS=$CFLAGS; CFLAGS="$CFLAGS $SANITIZER_FLAGS"
    dsm_save_LDFLAGS=$LDFLAGS; LDFLAGS="$LDFLAGS $SANITIZER_FLAGS"
    AC_MSG_CHECKING([whether the compilers accept $SANITIZER_FLAGS])
    AC_LINK_IFELSE([AC_LANG_PROGRAM([], [])], [AC_MSG_RESULT([yes])],
      [AC_MSG_RESULT([no]); AC_MSG_ERROR([--enable-sanitizers: the compilers do not support $SANITIZER_FLAGS])])
    CFLAGS=$dsm_save_CFLAGS; LDFLAGS=$dsm_save_LDFLAGS
  ])
  AM_CONDITIONAL([DSM_SANITIZERS], [test "x$enable_sanitizers" = xyes])
  AC_SUBST([SANITIZER_FLAGS])
])
