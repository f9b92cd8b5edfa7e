# CMake package of libdsm, installed as $libdir/cmake/dsm/dsmConfig.cmake.
#
#   find_package(dsm 0.1 REQUIRED)                 # C and C++
#   target_link_libraries(app PRIVATE dsm::dsm)
#
#   find_package(dsm REQUIRED COMPONENTS Fortran)  # also the Fortran module
#   target_link_libraries(fapp PRIVATE dsm::dsmf)
#
# dsm::dsm carries the include directory of dsm.h and MPI::MPI_C (dsm.h
# includes <mpi.h>); dsm::dsmf carries the directory of dsm.mod, dsm::dsm
# and MPI::MPI_Fortran. Use the MPI that libdsm was built with (shown in
# dsm_MPI_C_COMPILER): MPI libraries do not mix.
#
# Variables: dsm_VERSION, dsm_INCLUDE_DIR, dsm_LIBRARY, dsm_Fortran_FOUND,
# dsm_HAVE_HDF5, dsm_HAVE_CUDA, dsm_HAVE_NCCL, dsm_MPI_C_COMPILER.
cmake_policy(PUSH)
cmake_policy(VERSION 3.10)

set(dsm_VERSION "0.1.0")
set(dsm_INCLUDE_DIR "/work/main/libdsm-0.1.0/_inst/include")
set(dsm_LIBRARY_DIR "/work/main/libdsm-0.1.0/_inst/lib")
set(dsm_HAVE_HDF5 1)
set(dsm_HAVE_CUDA 1)
set(dsm_HAVE_NCCL 1)
set(dsm_MPI_C_COMPILER "mpicc")
set(_dsm_built_fortran 1)

include(CMakeFindDependencyMacro)

# The Fortran component: built into this installation, and Fortran enabled
# in the project that asks for it.
set(dsm_Fortran_FOUND FALSE)
if(_dsm_built_fortran AND CMAKE_Fortran_COMPILER_LOADED)
  set(dsm_Fortran_FOUND TRUE)
endif()
foreach(_dsm_component IN LISTS dsm_FIND_COMPONENTS)
  if(NOT _dsm_component STREQUAL "Fortran")
    set(dsm_FOUND FALSE)
    set(dsm_NOT_FOUND_MESSAGE "unknown component '${_dsm_component}' (libdsm has: Fortran)")
  elseif(NOT dsm_Fortran_FOUND AND dsm_FIND_REQUIRED_Fortran)
    set(dsm_FOUND FALSE)
    if(NOT _dsm_built_fortran)
      set(dsm_NOT_FOUND_MESSAGE "libdsm in ${dsm_LIBRARY_DIR} was built without the Fortran module (configure --enable-fortran)")
    else()
      set(dsm_NOT_FOUND_MESSAGE "component Fortran needs the Fortran language enabled in the project (project(... LANGUAGES C Fortran))")
    endif()
  endif()
endforeach()

if(NOT DEFINED dsm_FOUND OR dsm_FOUND)
  set(_dsm_mpi_components C)
  if(dsm_Fortran_FOUND)
    list(APPEND _dsm_mpi_components Fortran)
  endif()
  find_dependency(MPI COMPONENTS ${_dsm_mpi_components})

  find_library(dsm_LIBRARY NAMES dsm PATHS "${dsm_LIBRARY_DIR}" NO_DEFAULT_PATH)
  if(NOT dsm_LIBRARY)
    set(dsm_FOUND FALSE)
    set(dsm_NOT_FOUND_MESSAGE "no libdsm in ${dsm_LIBRARY_DIR}")
  elseif(NOT TARGET dsm::dsm)
    add_library(dsm::dsm UNKNOWN IMPORTED)
    set_target_properties(dsm::dsm PROPERTIES
      IMPORTED_LOCATION "${dsm_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${dsm_INCLUDE_DIR}"
      INTERFACE_LINK_LIBRARIES MPI::MPI_C)
  endif()

  if(dsm_Fortran_FOUND AND NOT TARGET dsm::dsmf)
    find_library(dsm_Fortran_LIBRARY NAMES dsmf PATHS "${dsm_LIBRARY_DIR}" NO_DEFAULT_PATH)
    if(dsm_Fortran_LIBRARY)
      add_library(dsm::dsmf UNKNOWN IMPORTED)
      set_target_properties(dsm::dsmf PROPERTIES
        IMPORTED_LOCATION "${dsm_Fortran_LIBRARY}"
        INTERFACE_INCLUDE_DIRECTORIES "${dsm_INCLUDE_DIR}"
        INTERFACE_LINK_LIBRARIES "dsm::dsm;MPI::MPI_Fortran")
    else()
      set(dsm_Fortran_FOUND FALSE)
      if(dsm_FIND_REQUIRED_Fortran)
        set(dsm_FOUND FALSE)
        set(dsm_NOT_FOUND_MESSAGE "no libdsmf in ${dsm_LIBRARY_DIR}")
      endif()
    endif()
  endif()
endif()

unset(_dsm_built_fortran)
unset(_dsm_component)
unset(_dsm_mpi_components)
cmake_policy(POP)
