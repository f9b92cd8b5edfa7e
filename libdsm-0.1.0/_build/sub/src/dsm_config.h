/* src/dsm_config.h.  Generated from dsm_config.h.in by configure.  */
/* src/dsm_config.h.in.  Generated from configure.ac by autoheader.  */

/* 1 when libdsm is built with cuda */
#define DSM_HAVE_CUDA 1

/* 1 when the CUDA kernels are built */
#define DSM_HAVE_CUDA_KERNELS 1

/* 1 when the Fortran module is built */
#define DSM_HAVE_FORTRAN 1

/* 1 when libdsm is built with hdf5 */
#define DSM_HAVE_HDF5 1

/* 1 when libdsm is built with hwloc */
#define DSM_HAVE_HWLOC 1

/* 1 when libdsm is built with nccl */
#define DSM_HAVE_NCCL 1

/* 1 when the NCCL backend is built */
#define DSM_HAVE_NCCL_BACKEND 1

/* Define to 1 if you have the <dlfcn.h> header file. */
#define HAVE_DLFCN_H 1

/* Define to 1 if you have the <inttypes.h> header file. */
#define HAVE_INTTYPES_H 1

/* Define to 1 if you have the <stdint.h> header file. */
#define HAVE_STDINT_H 1

/* Define to 1 if you have the <stdio.h> header file. */
#define HAVE_STDIO_H 1

/* Define to 1 if you have the <stdlib.h> header file. */
#define HAVE_STDLIB_H 1

/* Define to 1 if you have the <strings.h> header file. */
#define HAVE_STRINGS_H 1

/* Define to 1 if you have the <string.h> header file. */
#define HAVE_STRING_H 1

/* Define to 1 if you have the <sys/stat.h> header file. */
#define HAVE_SYS_STAT_H 1

/* Define to 1 if you have the <sys/types.h> header file. */
#define HAVE_SYS_TYPES_H 1

/* Define to 1 if you have the <unistd.h> header file. */
#define HAVE_UNISTD_H 1

/* Define to the sub-directory where libtool stores uninstalled libraries. */
#define LT_OBJDIR ".libs/"

/* Name of package */
#define PACKAGE "libdsm"

/* Define to the address where bug reports for this package should be sent. */
#define PACKAGE_BUGREPORT ""

/* Define to the full name of this package. */
#define PACKAGE_NAME "libdsm"

/* Define to the full name and version of this package. */
#define PACKAGE_STRING "libdsm 0.1.0"

/* Define to the one symbol short name of this package. */
#define PACKAGE_TARNAME "libdsm"

/* Define to the home page for this package. */
#define PACKAGE_URL ""

/* Define to the version of this package. */
#define PACKAGE_VERSION "0.1.0"

/* The size of `void *', as computed by sizeof. */
#define SIZEOF_VOID_P 8

/* Define to 1 if all of the C90 standard headers exist (not just the ones
   required in a freestanding environment). This macro is provided for
   backward compatibility; new code need not use it. */
#define STDC_HEADERS 1

/* Version number of package */
#define VERSION "0.1.0"
