# Version check of the libdsm CMake package: find_package(dsm X.Y) accepts
# this installation when its version is at least X.Y with the same major
# number, and, while the major number is 0, the same minor number too (the
# interface may change between 0.x releases). An exact request must match
# all three numbers.
set(PACKAGE_VERSION "0.1.0")
set(_dsm_major 0)
set(_dsm_minor 1)

set(PACKAGE_VERSION_COMPATIBLE FALSE)
set(PACKAGE_VERSION_EXACT FALSE)
if(NOT PACKAGE_VERSION VERSION_LESS PACKAGE_FIND_VERSION
   AND PACKAGE_FIND_VERSION_MAJOR EQUAL _dsm_major
   AND (NOT _dsm_major EQUAL 0 OR PACKAGE_FIND_VERSION_MINOR EQUAL _dsm_minor
        OR "${PACKAGE_FIND_VERSION_COUNT}" LESS 2))
  set(PACKAGE_VERSION_COMPATIBLE TRUE)
endif()
if(PACKAGE_FIND_VERSION VERSION_EQUAL PACKAGE_VERSION)
  set(PACKAGE_VERSION_EXACT TRUE)
endif()

# A library built for another pointer size is not usable.
if(NOT "${CMAKE_SIZEOF_VOID_P}" STREQUAL "" AND NOT "${CMAKE_SIZEOF_VOID_P}" STREQUAL "8")
  set(PACKAGE_VERSION "${PACKAGE_VERSION} (8-byte pointers)")
  set(PACKAGE_VERSION_UNSUITABLE TRUE)
endif()
unset(_dsm_major)
unset(_dsm_minor)
