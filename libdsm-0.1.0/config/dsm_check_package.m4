dnl DSM_CHECK_PACKAGE(NAME, OPTION, HEADER, FUNCTION, LIBS, PKGCONFIG, DEFAULT_DIR, [PROLOGUE])
dnl
dnl One optional dependency with the three states of --with-OPTION:
dnl   not given  -> probe: pkg-config module PKGCONFIG, then DEFAULT_DIR, then the
dnl                 compiler's default paths; quietly disabled when not found
dnl   yes or DIR -> required: configure fails when it is not usable (DIR/include,
dnl                 DIR/lib64 and DIR/lib are searched first)
dnl   no         -> skipped
dnl On success sets dsm_have_NAME=1 and substitutes NAME_CPPFLAGS, NAME_LDFLAGS,
dnl NAME_LIBS (NAME upper case); DSM_HAVE_NAME is always defined to 0 or 1 in
dnl dsm_config.h and as an automake conditional.
AC_DEFUN([DSM_CHECK_PACKAGE], [
  m4_pushdef([UP], m4_toupper([$1]))
  AC_ARG_WITH([$2],
    [AS_HELP_STRING([--with-$2@<:@=DIR@:>@],
      [use $1 (default: probe; DIR: its install prefix; no: skip)])],
    [], [with_]m4_translit([$2], [-], [_])[=probe])
  dsm_want=$[with_]m4_translit([$2], [-], [_])
  dsm_have_$1=0
  UP[]_CPPFLAGS=
  UP[]_LDFLAGS=
  UP[]_LIBS=
  AS_IF([test "x$dsm_want" != xno], [
    dsm_found=no
    dsm_candidates=
    AS_CASE(["$dsm_want"],
      [yes|probe], [
        m4_ifval([$6], [
          AS_IF([test -n "$PKG_CONFIG"], [
            for dsm_pc in $6; do
              AS_IF([$PKG_CONFIG --exists "$dsm_pc" 2>/dev/null], [
                dsm_candidates="pkg:$dsm_pc"
                break
              ])
            done
          ])
        ])
        m4_ifval([$7], [dsm_candidates="$dsm_candidates dir:$7"])
        dsm_candidates="$dsm_candidates default"
      ],
      [dsm_candidates="dir:$dsm_want"])
    for dsm_c in $dsm_candidates; do
      dsm_cpp=; dsm_ld=; dsm_libs=
      AS_CASE(["$dsm_c"],
        [pkg:*], [dsm_pc=${dsm_c#pkg:}
                  dsm_cpp=`$PKG_CONFIG --cflags-only-I "$dsm_pc"`
                  dsm_ld=`$PKG_CONFIG --libs-only-L "$dsm_pc"`
                  dsm_libs=`$PKG_CONFIG --libs-only-l "$dsm_pc"`],
        [dir:*], [dsm_d=${dsm_c#dir:}
                  AS_IF([test -d "$dsm_d/include"], [dsm_cpp="-I$dsm_d/include"])
                  AS_IF([test -d "$dsm_d/lib64"], [dsm_ld="-L$dsm_d/lib64 -Wl,-rpath,$dsm_d/lib64"],
                        [test -d "$dsm_d/lib"], [dsm_ld="-L$dsm_d/lib -Wl,-rpath,$dsm_d/lib"])
                  dsm_libs="$5"],
        [dsm_libs="$5"])
      dsm_save_CPPFLAGS=$CPPFLAGS; dsm_save_LDFLAGS=$LDFLAGS; dsm_save_LIBS=$LIBS
      CPPFLAGS="$dsm_cpp $CPPFLAGS"; LDFLAGS="$dsm_ld $LDFLAGS"; LIBS="$dsm_libs $LIBS"
      AC_MSG_CHECKING([for $1 ($dsm_c)])
      AC_LINK_IFELSE([AC_LANG_PROGRAM([$8
#include <$3>], [[(void)$4;]])], [dsm_found=yes], [dsm_found=no])
      AC_MSG_RESULT([$dsm_found])
      CPPFLAGS=$dsm_save_CPPFLAGS; LDFLAGS=$dsm_save_LDFLAGS; LIBS=$dsm_save_LIBS
      AS_IF([test "$dsm_found" = yes], [
        UP[]_CPPFLAGS=$dsm_cpp; UP[]_LDFLAGS=$dsm_ld; UP[]_LIBS=$dsm_libs
        dsm_have_$1=1
        break
      ])
    done
    AS_IF([test "$dsm_found" != yes && test "x$dsm_want" != xprobe],
      [AC_MSG_ERROR([--with-$2=$dsm_want was given but $1 is not usable (need <$3> and $4); see config.log])])
  ])
  AC_DEFINE_UNQUOTED([DSM_HAVE_]UP, [$dsm_have_$1], [1 when libdsm is built with $1])
  AM_CONDITIONAL([DSM_HAVE_]UP, [test "$dsm_have_$1" = 1])
  AC_SUBST(UP[_CPPFLAGS])
  AC_SUBST(UP[_LDFLAGS])
  AC_SUBST(UP[_LIBS])
  m4_popdef([UP])
])
