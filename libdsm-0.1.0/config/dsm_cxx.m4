dnl DSM_CHECK_CXX17: make sure $CXX compiles C++17, adding -std=c++17 when needed.
AC_DEFUN([DSM_CHECK_CXX17], [
  AC_LANG_PUSH([C++])
  AC_MSG_CHECKING([whether $CXX compiles C++17])
  AC_COMPILE_IFELSE([DSM_CXX17_PROGRAM], [AC_MSG_RESULT([yes])], [
    dsm_save_CXX=$CXX; CXX="$CXX -std=c++17"
    AC_COMPILE_IFELSE([DSM_CXX17_PROGRAM], [AC_MSG_RESULT([with -std=c++17])],
      [AC_MSG_RESULT([no]); AC_MSG_ERROR([libdsm needs a C++17 compiler])])
  ])
  AC_LANG_POP([C++])
])
m4_define([DSM_CXX17_PROGRAM], [AC_LANG_PROGRAM([[#include <optional>
#include <string_view>
#if __cplusplus < 201703L
#error not C++17
#endif]], [[std::optional<std::string_view> v; if constexpr (true) { (void)v; }]])])
