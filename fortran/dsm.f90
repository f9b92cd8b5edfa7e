! libdsm Fortran bindings: module dsm.
!
! The Fortran face of include/dsm.h. Every C function dsm_X(...) that returns
! a status is a subroutine dsm_X(..., ierr) here, with the outputs last as in
! C and an optional trailing ierr:
!   - ierr present: it receives the status (DSM_SUCCESS = 0 on success); use
!     dsm_status_string(ierr) and dsm_get_last_error() for the details.
!   - ierr absent: a failure prints the status and dsm_get_last_error() to
!     standard error and calls MPI_Abort(MPI_COMM_WORLD, status).
! The functions that return a string in C (dsm_status_string,
! dsm_get_last_error, dsm_dtype_name) are functions returning
! character(len=:), allocatable here.
!
! Conventions:
!   - Integers (shapes, ranks, sizes, MPI handles) are default INTEGER,
!     except those that are int64_t in C (the batch values, world and
!     data-parallel sizes and step counts of the dsm_config routines), which
!     are integer(c_int64_t).
!   - Communicators go in and come out as the integer handles of `use mpi`;
!     every routine that takes or returns a communicator also accepts
!     type(MPI_Comm) from `use mpi_f08` (a generic interface with two
!     specifics).
!   - Dimension indices (the dim argument of dsm_mesh_dim_size,
!     dsm_mesh_dim_rank, dsm_mesh_get_dim_name, dsm_mesh_get_dim_index) are
!     0-based as in C: 0 is the outermost dimension.
!   - Names are character strings; trailing blanks are ignored. A group name
!     of '' (empty or all blanks) means the whole mesh (C NULL).
!   - Collective routines follow the C rules: every rank of the communicator
!     calls them, and every rank gets the same status.
!   - Handles (type(dsm_mesh_t), type(dsm_config_t)) start out null;
!     dsm_mesh_free and dsm_config_free make them null again.
!     c_associated(mesh%ptr) tells whether a handle is live.
!   - A configuration (dsm_config_load, dsm_config_load_for_mesh,
!     dsm_config_resolve) is the path of a JSON file or inline JSON text
!     starting with '{'; trailing blanks are ignored.
!
! The module holds no state of its own and is thread safe in the same way as
! the C library.
module dsm
  use, intrinsic :: iso_c_binding, only: c_int, c_long_long, c_int64_t, c_char, c_size_t, c_ptr, &
       c_null_ptr, c_null_char, c_loc, c_f_pointer, c_associated
  use, intrinsic :: iso_fortran_env, only: error_unit
  use mpi, only: MPI_COMM_WORLD, MPI_Abort
  use mpi_f08, only: MPI_Comm
  implicit none
  private

  ! ------------------------------------------------------------ status codes
  ! Same names and values as dsm_status_t (pinned).
  integer, parameter, public :: DSM_SUCCESS = 0
  integer, parameter, public :: DSM_ERR_INVALID_ARGUMENT = 1
  integer, parameter, public :: DSM_ERR_NULL_POINTER = 2
  integer, parameter, public :: DSM_ERR_NOT_FOUND = 3
  integer, parameter, public :: DSM_ERR_MISMATCH = 4
  integer, parameter, public :: DSM_ERR_OUT_OF_MEMORY = 5
  integer, parameter, public :: DSM_ERR_MPI = 6
  integer, parameter, public :: DSM_ERR_NOT_SUPPORTED = 7
  integer, parameter, public :: DSM_ERR_IO = 8
  integer, parameter, public :: DSM_ERR_CONFIG = 9
  integer, parameter, public :: DSM_ERR_HDF5 = 10
  integer, parameter, public :: DSM_ERR_CUDA = 11
  integer, parameter, public :: DSM_ERR_NCCL = 12
  integer, parameter, public :: DSM_ERR_HWLOC = 13
  integer, parameter, public :: DSM_ERR_INTERNAL = 14
  integer, parameter, public :: DSM_ERR_NUMERIC = 15
  integer, parameter, public :: DSM_ERR_STATE = 16

  ! ------------------------------------------------------------ dsm_dtype_t
  integer, parameter, public :: DSM_FLOAT32 = 0
  integer, parameter, public :: DSM_FLOAT16 = 1
  integer, parameter, public :: DSM_BFLOAT16 = 2
  integer, parameter, public :: DSM_FLOAT64 = 3
  integer, parameter, public :: DSM_INT8 = 4
  integer, parameter, public :: DSM_UINT8 = 5
  integer, parameter, public :: DSM_INT32 = 6
  integer, parameter, public :: DSM_INT64 = 7

  ! ------------------------------------------------------------ dsm_format_t
  integer, parameter, public :: DSM_FORMAT_TEXT = 0
  integer, parameter, public :: DSM_FORMAT_JSON = 1

  ! ------------------------------------------------------------ mesh
  integer, parameter, public :: DSM_MESH_MAX_DIMS = 8
  integer, parameter, public :: DSM_NAME_MAX = 63

  ! dsm_placement_t
  integer, parameter, public :: DSM_PLACEMENT_DEFAULT = 0
  integer, parameter, public :: DSM_PLACEMENT_NODE = 1
  integer, parameter, public :: DSM_PLACEMENT_NONE = 2

  ! dsm_bind_t
  integer, parameter, public :: DSM_BIND_DEFAULT = 0
  integer, parameter, public :: DSM_BIND_NONE = 1
  integer, parameter, public :: DSM_BIND_SPREAD = 2
  integer, parameter, public :: DSM_BIND_GPU = 3

  ! ------------------------------------------------------------ config
  ! Flag of dsm_config_load, dsm_config_load_for_mesh and dsm_config_resolve:
  ! keys libdsm does not know are an error, not a warning.
  integer, parameter, public :: DSM_CONFIG_STRICT = 1

  ! The C integer type of MPI_Fint: the kind of a default INTEGER (an MPI
  ! handle of `use mpi`), named through iso_c_binding.
  integer, parameter :: c_fint = merge(c_int, c_long_long, bit_size(0) == bit_size(0_c_int))

  !> A mesh or a slice of one (C dsm_mesh_t). Null until created.
  type, bind(C), public :: dsm_mesh_t
     type(c_ptr) :: ptr = c_null_ptr
  end type dsm_mesh_t

  !> A resolved DeepSpeed configuration (C dsm_config_t). Null until loaded.
  type, bind(C), public :: dsm_config_t
     type(c_ptr) :: ptr = c_null_ptr
  end type dsm_config_t

  ! ------------------------------------------------------------ public routines
  public :: dsm_status_string, dsm_get_last_error, dsm_get_version, dsm_get_feature
  public :: dsm_dtype_size, dsm_dtype_name, dsm_info_describe
  public :: dsm_mesh_create, dsm_mesh_create_with_options, dsm_mesh_create_dp_sp
  public :: dsm_mesh_free, dsm_mesh_get_ndims, dsm_mesh_get_shape, dsm_mesh_get_coords
  public :: dsm_mesh_get_dim_name, dsm_mesh_get_dim_index, dsm_mesh_dim_size, dsm_mesh_dim_rank
  public :: dsm_mesh_size, dsm_mesh_rank, dsm_mesh_comm, dsm_mesh_group_ranks
  public :: dsm_mesh_slice, dsm_mesh_flatten, dsm_mesh_describe
  public :: dsm_config_load, dsm_config_load_for_mesh, dsm_config_resolve, dsm_config_free
  public :: dsm_config_get_batch, dsm_config_describe, dsm_config_describe_lr

  !> Build a named mesh over the ranks of comm (collective over comm).
  !> call dsm_mesh_create(comm, shape, names, mesh [, ierr])
  !>   comm:  integer (use mpi) or type(MPI_Comm) (use mpi_f08)
  !>   shape: integer(:), outermost first; positive, or -1 once to infer
  !>   names: character(len=*)(:), one per dimension (size(names) must equal
  !>          size(shape); when it does not, every rank gets
  !>          DSM_ERR_INVALID_ARGUMENT)
  interface dsm_mesh_create
     module procedure mesh_create_i, mesh_create_f08
  end interface dsm_mesh_create

  !> dsm_mesh_create with explicit placement (DSM_PLACEMENT_*) and binding
  !> (DSM_BIND_*): call dsm_mesh_create_with_options(comm, shape, names,
  !> placement, binding, mesh [, ierr]). Collective over comm.
  interface dsm_mesh_create_with_options
     module procedure mesh_create_with_options_i, mesh_create_with_options_f08
  end interface dsm_mesh_create_with_options

  !> The 2-D mesh "data_parallel" x "sequence_parallel":
  !> call dsm_mesh_create_dp_sp(comm, dp, sp, mesh [, ierr]). Collective.
  interface dsm_mesh_create_dp_sp
     module procedure mesh_create_dp_sp_i, mesh_create_dp_sp_f08
  end interface dsm_mesh_create_dp_sp

  !> The communicator of a group ('' for the whole mesh):
  !> call dsm_mesh_comm(mesh, group, comm [, ierr]). It belongs to the mesh:
  !> do not free it. Not collective.
  interface dsm_mesh_comm
     module procedure mesh_comm_i, mesh_comm_f08
  end interface dsm_mesh_comm

  !> Flatten dimensions into one named group with its own communicator:
  !> call dsm_mesh_flatten(mesh, names, flat_name [, comm] [, ierr]).
  !> Collective over the mesh communicator. The optional comm (integer or
  !> type(MPI_Comm)) receives the group's communicator, owned by the mesh.
  interface dsm_mesh_flatten
     module procedure mesh_flatten_i, mesh_flatten_f08
  end interface dsm_mesh_flatten

  !> Read and resolve a configuration on every rank of comm (collective over
  !> comm; every rank gets the same status):
  !> call dsm_config_load(comm, config, flags, cfg [, ierr])
  !>   comm:   integer (use mpi) or type(MPI_Comm) (use mpi_f08)
  !>   config: path of a JSON file, or inline JSON text starting with '{'
  !>   flags:  0 or DSM_CONFIG_STRICT
  !> cfg is null on error. Free it with dsm_config_free.
  interface dsm_config_load
     module procedure config_load_i, config_load_f08
  end interface dsm_config_load

  ! ------------------------------------------------------------ the C side
  interface
     function c_strlen(s) bind(C, name='strlen') result(n)
       import :: c_ptr, c_size_t
       type(c_ptr), value :: s
       integer(c_size_t) :: n
     end function c_strlen

     function c_dsm_status_string(status) bind(C, name='dsm_status_string') result(s)
       import :: c_int, c_ptr
       integer(c_int), value :: status
       type(c_ptr) :: s
     end function c_dsm_status_string

     function c_dsm_get_last_error() bind(C, name='dsm_get_last_error') result(s)
       import :: c_ptr
       type(c_ptr) :: s
     end function c_dsm_get_last_error

     function c_dsm_get_version(major, minor, patch) bind(C, name='dsm_get_version') result(st)
       import :: c_int
       integer(c_int), intent(out) :: major, minor, patch
       integer(c_int) :: st
     end function c_dsm_get_version

     function c_dsm_get_feature(feature, enabled) bind(C, name='dsm_get_feature') result(st)
       import :: c_int, c_char
       character(kind=c_char), dimension(*), intent(in) :: feature
       integer(c_int), intent(out) :: enabled
       integer(c_int) :: st
     end function c_dsm_get_feature

     function c_dsm_dtype_size(dtype, size) bind(C, name='dsm_dtype_size') result(st)
       import :: c_int, c_size_t
       integer(c_int), value :: dtype
       integer(c_size_t), intent(out) :: size
       integer(c_int) :: st
     end function c_dsm_dtype_size

     function c_dsm_dtype_name(dtype) bind(C, name='dsm_dtype_name') result(s)
       import :: c_int, c_ptr
       integer(c_int), value :: dtype
       type(c_ptr) :: s
     end function c_dsm_dtype_name

     function c_dsm_info_describe(format, text) bind(C, name='dsm_info_describe') result(st)
       import :: c_int, c_ptr
       integer(c_int), value :: format
       type(c_ptr), intent(out) :: text
       integer(c_int) :: st
     end function c_dsm_info_describe

     subroutine c_dsm_free(p) bind(C, name='dsm_free')
       import :: c_ptr
       type(c_ptr), value :: p
     end subroutine c_dsm_free

     ! Shim (fortran/dsm_fshim.c): communicators cross as MPI_Fint.
     function c_dsm_f_mesh_create(comm, ndims, shape, names, placement, binding, mesh) &
          bind(C, name='dsm_f_mesh_create') result(st)
       import :: c_int, c_ptr, c_fint
       integer(c_fint), intent(in) :: comm
       integer(c_int), value :: ndims
       integer(c_int), dimension(*), intent(in) :: shape
       type(c_ptr), dimension(*), intent(in) :: names
       integer(c_int), value :: placement, binding
       type(c_ptr), intent(out) :: mesh
       integer(c_int) :: st
     end function c_dsm_f_mesh_create

     function c_dsm_f_mesh_create_dp_sp(comm, dp, sp, mesh) &
          bind(C, name='dsm_f_mesh_create_dp_sp') result(st)
       import :: c_int, c_ptr, c_fint
       integer(c_fint), intent(in) :: comm
       integer(c_int), value :: dp, sp
       type(c_ptr), intent(out) :: mesh
       integer(c_int) :: st
     end function c_dsm_f_mesh_create_dp_sp

     function c_dsm_f_mesh_comm(mesh, group, comm) bind(C, name='dsm_f_mesh_comm') result(st)
       import :: c_int, c_ptr, c_fint
       type(c_ptr), value :: mesh
       type(c_ptr), value :: group
       integer(c_fint), intent(out) :: comm
       integer(c_int) :: st
     end function c_dsm_f_mesh_comm

     function c_dsm_f_mesh_flatten(mesh, nnames, names, flat_name, comm) &
          bind(C, name='dsm_f_mesh_flatten') result(st)
       import :: c_int, c_char, c_ptr, c_fint
       type(c_ptr), value :: mesh
       integer(c_int), value :: nnames
       type(c_ptr), dimension(*), intent(in) :: names
       character(kind=c_char), dimension(*), intent(in) :: flat_name
       integer(c_fint), intent(out) :: comm
       integer(c_int) :: st
     end function c_dsm_f_mesh_flatten

     ! The handle calls, bound directly.
     function c_dsm_mesh_free(mesh) bind(C, name='dsm_mesh_free') result(st)
       import :: c_int, c_ptr
       type(c_ptr), intent(inout) :: mesh
       integer(c_int) :: st
     end function c_dsm_mesh_free

     function c_dsm_mesh_get_ndims(mesh, ndims) bind(C, name='dsm_mesh_get_ndims') result(st)
       import :: c_int, c_ptr
       type(c_ptr), value :: mesh
       integer(c_int), intent(out) :: ndims
       integer(c_int) :: st
     end function c_dsm_mesh_get_ndims

     function c_dsm_mesh_get_shape(mesh, len, shape) bind(C, name='dsm_mesh_get_shape') result(st)
       import :: c_int, c_ptr
       type(c_ptr), value :: mesh
       integer(c_int), value :: len
       integer(c_int), dimension(*), intent(out) :: shape
       integer(c_int) :: st
     end function c_dsm_mesh_get_shape

     function c_dsm_mesh_get_coords(mesh, len, coords) bind(C, name='dsm_mesh_get_coords') result(st)
       import :: c_int, c_ptr
       type(c_ptr), value :: mesh
       integer(c_int), value :: len
       integer(c_int), dimension(*), intent(out) :: coords
       integer(c_int) :: st
     end function c_dsm_mesh_get_coords

     function c_dsm_mesh_get_dim_name(mesh, dim, name) bind(C, name='dsm_mesh_get_dim_name') result(st)
       import :: c_int, c_ptr
       type(c_ptr), value :: mesh
       integer(c_int), value :: dim
       type(c_ptr), intent(out) :: name
       integer(c_int) :: st
     end function c_dsm_mesh_get_dim_name

     function c_dsm_mesh_get_dim_index(mesh, name, dim) bind(C, name='dsm_mesh_get_dim_index') result(st)
       import :: c_int, c_char, c_ptr
       type(c_ptr), value :: mesh
       character(kind=c_char), dimension(*), intent(in) :: name
       integer(c_int), intent(out) :: dim
       integer(c_int) :: st
     end function c_dsm_mesh_get_dim_index

     function c_dsm_mesh_dim_size(mesh, dim, size) bind(C, name='dsm_mesh_dim_size') result(st)
       import :: c_int, c_ptr
       type(c_ptr), value :: mesh
       integer(c_int), value :: dim
       integer(c_int), intent(out) :: size
       integer(c_int) :: st
     end function c_dsm_mesh_dim_size

     function c_dsm_mesh_dim_rank(mesh, dim, rank) bind(C, name='dsm_mesh_dim_rank') result(st)
       import :: c_int, c_ptr
       type(c_ptr), value :: mesh
       integer(c_int), value :: dim
       integer(c_int), intent(out) :: rank
       integer(c_int) :: st
     end function c_dsm_mesh_dim_rank

     function c_dsm_mesh_size(mesh, group, size) bind(C, name='dsm_mesh_size') result(st)
       import :: c_int, c_ptr
       type(c_ptr), value :: mesh
       type(c_ptr), value :: group
       integer(c_int), intent(out) :: size
       integer(c_int) :: st
     end function c_dsm_mesh_size

     function c_dsm_mesh_rank(mesh, group, rank) bind(C, name='dsm_mesh_rank') result(st)
       import :: c_int, c_ptr
       type(c_ptr), value :: mesh
       type(c_ptr), value :: group
       integer(c_int), intent(out) :: rank
       integer(c_int) :: st
     end function c_dsm_mesh_rank

     function c_dsm_mesh_group_ranks(mesh, group, len, ranks) bind(C, name='dsm_mesh_group_ranks') result(st)
       import :: c_int, c_ptr
       type(c_ptr), value :: mesh
       type(c_ptr), value :: group
       integer(c_int), value :: len
       integer(c_int), dimension(*), intent(out) :: ranks
       integer(c_int) :: st
     end function c_dsm_mesh_group_ranks

     function c_dsm_mesh_slice(mesh, nnames, names, slice) bind(C, name='dsm_mesh_slice') result(st)
       import :: c_int, c_ptr
       type(c_ptr), value :: mesh
       integer(c_int), value :: nnames
       type(c_ptr), dimension(*), intent(in) :: names
       type(c_ptr), intent(out) :: slice
       integer(c_int) :: st
     end function c_dsm_mesh_slice

     function c_dsm_mesh_describe(mesh, format, text) bind(C, name='dsm_mesh_describe') result(st)
       import :: c_int, c_ptr
       type(c_ptr), value :: mesh
       integer(c_int), value :: format
       type(c_ptr), intent(out) :: text
       integer(c_int) :: st
     end function c_dsm_mesh_describe

     ! Configuration. The C flags are unsigned int: passed as c_int, which
     ! has the same size, and only ever holds small non-negative values.
     function c_dsm_f_config_load(comm, config, flags, cfg) &
          bind(C, name='dsm_f_config_load') result(st)
       import :: c_int, c_char, c_ptr, c_fint
       integer(c_fint), intent(in) :: comm
       character(kind=c_char), dimension(*), intent(in) :: config
       integer(c_int), value :: flags
       type(c_ptr), intent(out) :: cfg
       integer(c_int) :: st
     end function c_dsm_f_config_load

     function c_dsm_config_load_for_mesh(mesh, config, flags, cfg) &
          bind(C, name='dsm_config_load_for_mesh') result(st)
       import :: c_int, c_char, c_ptr
       type(c_ptr), value :: mesh
       character(kind=c_char), dimension(*), intent(in) :: config
       integer(c_int), value :: flags
       type(c_ptr), intent(out) :: cfg
       integer(c_int) :: st
     end function c_dsm_config_load_for_mesh

     function c_dsm_config_resolve(config, world_size, data_parallel_size, flags, cfg) &
          bind(C, name='dsm_config_resolve') result(st)
       import :: c_int, c_int64_t, c_char, c_ptr
       character(kind=c_char), dimension(*), intent(in) :: config
       integer(c_int64_t), value :: world_size, data_parallel_size
       integer(c_int), value :: flags
       type(c_ptr), intent(out) :: cfg
       integer(c_int) :: st
     end function c_dsm_config_resolve

     function c_dsm_config_free(cfg) bind(C, name='dsm_config_free') result(st)
       import :: c_int, c_ptr
       type(c_ptr), intent(inout) :: cfg
       integer(c_int) :: st
     end function c_dsm_config_free

     function c_dsm_config_get_batch(cfg, train_batch_size, micro_batch_size, &
          gradient_accumulation_steps, data_parallel_size) &
          bind(C, name='dsm_config_get_batch') result(st)
       import :: c_int, c_int64_t, c_ptr
       type(c_ptr), value :: cfg
       integer(c_int64_t), intent(out) :: train_batch_size, micro_batch_size
       integer(c_int64_t), intent(out) :: gradient_accumulation_steps, data_parallel_size
       integer(c_int) :: st
     end function c_dsm_config_get_batch

     function c_dsm_config_describe(cfg, format, text) bind(C, name='dsm_config_describe') result(st)
       import :: c_int, c_ptr
       type(c_ptr), value :: cfg
       integer(c_int), value :: format
       type(c_ptr), intent(out) :: text
       integer(c_int) :: st
     end function c_dsm_config_describe

     function c_dsm_config_describe_lr(cfg, steps, format, text) &
          bind(C, name='dsm_config_describe_lr') result(st)
       import :: c_int, c_int64_t, c_ptr
       type(c_ptr), value :: cfg
       integer(c_int64_t), value :: steps
       integer(c_int), value :: format
       type(c_ptr), intent(out) :: text
       integer(c_int) :: st
     end function c_dsm_config_describe_lr
  end interface

contains

  ! ============================================================ helpers

  ! Copy a NUL-terminated C string into a Fortran string of its exact length,
  ! character by character ('' for a NULL pointer).
  function c_to_f_string(p) result(s)
    type(c_ptr), intent(in) :: p
    character(len=:), allocatable :: s
    character(kind=c_char), dimension(:), pointer :: chars
    integer :: n, i

    if (.not. c_associated(p)) then
       s = ''
       return
    end if
    n = int(c_strlen(p))
    allocate(character(len=n) :: s)
    if (n == 0) return
    call c_f_pointer(p, chars, [n])
    do i = 1, n
       s(i:i) = chars(i)
    end do
  end function c_to_f_string

  ! trim(s)//c_null_char as an array of C characters, so that c_loc can take
  ! the address of its first element.
  subroutine f_to_c_string(s, buf)
    character(len=*), intent(in) :: s
    character(kind=c_char), dimension(:), allocatable, intent(out) :: buf
    character(len=:), allocatable :: t
    integer :: i

    t = trim(s) // c_null_char
    allocate(buf(len(t)))
    do i = 1, len(t)
       buf(i) = t(i:i)
    end do
  end subroutine f_to_c_string

  ! The names, each trim(name)//c_null_char, packed into buf; start(i) is the
  ! index in buf where names(i) begins. The caller takes c_loc(buf(start(i)))
  ! while buf is alive.
  subroutine pack_names(names, buf, start)
    character(len=*), dimension(:), intent(in) :: names
    character(kind=c_char), dimension(:), allocatable, intent(out) :: buf
    integer, dimension(:), allocatable, intent(out) :: start
    integer :: i, j, k, n, total

    allocate(start(size(names)))
    total = 0
    do i = 1, size(names)
       total = total + len_trim(names(i)) + 1
    end do
    allocate(buf(max(total, 1)))
    j = 1
    do i = 1, size(names)
       start(i) = j
       n = len_trim(names(i))
       do k = 1, n
          buf(j + k - 1) = names(i)(k:k)
       end do
       buf(j + n) = c_null_char
       j = j + n + 1
    end do
  end subroutine pack_names

  ! Report a status: into ierr when present, else abort on failure.
  subroutine finish(status, where, ierr)
    integer(c_int), intent(in) :: status
    character(len=*), intent(in) :: where
    integer, intent(out), optional :: ierr
    integer :: mpierr

    if (present(ierr)) then
       ierr = int(status)
       return
    end if
    if (status == DSM_SUCCESS) return
    write(error_unit, '(5a)') 'libdsm: ', where, ' failed (', dsm_status_string(int(status)), ')'
    write(error_unit, '(2a)') 'libdsm: ', dsm_get_last_error()
    flush(error_unit)
    call MPI_Abort(MPI_COMM_WORLD, int(status), mpierr)
  end subroutine finish

  ! ============================================================ status, version, info

  !> A short constant description of a status ("invalid argument"); unknown
  !> values give "unknown status". Not collective.
  function dsm_status_string(status) result(s)
    integer, intent(in) :: status
    character(len=:), allocatable :: s

    s = c_to_f_string(c_dsm_status_string(int(status, c_int)))
  end function dsm_status_string

  !> The detailed message of the last failed libdsm call in this thread; ''
  !> when none has failed. Not collective.
  function dsm_get_last_error() result(s)
    character(len=:), allocatable :: s

    s = c_to_f_string(c_dsm_get_last_error())
  end function dsm_get_last_error

  !> The version of the library that is running. Not collective.
  subroutine dsm_get_version(major, minor, patch, ierr)
    integer, intent(out) :: major, minor, patch
    integer, intent(out), optional :: ierr
    integer(c_int) :: cmajor, cminor, cpatch, st

    st = c_dsm_get_version(cmajor, cminor, cpatch)
    major = int(cmajor)
    minor = int(cminor)
    patch = int(cpatch)
    call finish(st, 'dsm_get_version', ierr)
  end subroutine dsm_get_version

  !> Whether a build feature ("mpi", "hwloc", "hdf5", "cuda", "nccl",
  !> "fortran") is compiled in. DSM_ERR_NOT_FOUND for an unknown name.
  subroutine dsm_get_feature(feature, enabled, ierr)
    character(len=*), intent(in) :: feature
    logical, intent(out) :: enabled
    integer, intent(out), optional :: ierr
    integer(c_int) :: cenabled, st

    cenabled = 0
    st = c_dsm_get_feature(trim(feature) // c_null_char, cenabled)
    enabled = cenabled /= 0
    call finish(st, 'dsm_get_feature', ierr)
  end subroutine dsm_get_feature

  !> The size in bytes of one element of dtype (DSM_FLOAT32, ...).
  subroutine dsm_dtype_size(dtype, size, ierr)
    integer, intent(in) :: dtype
    integer, intent(out) :: size
    integer, intent(out), optional :: ierr
    integer(c_size_t) :: csize
    integer(c_int) :: st

    csize = 0
    st = c_dsm_dtype_size(int(dtype, c_int), csize)
    size = int(csize)
    call finish(st, 'dsm_dtype_size', ierr)
  end subroutine dsm_dtype_size

  !> The name of dtype ("float32", ...); "invalid" for unknown values.
  function dsm_dtype_name(dtype) result(s)
    integer, intent(in) :: dtype
    character(len=:), allocatable :: s

    s = c_to_f_string(c_dsm_dtype_name(int(dtype, c_int)))
  end function dsm_dtype_name

  !> Describe this build (what dsm-info prints), as DSM_FORMAT_TEXT or
  !> DSM_FORMAT_JSON. Not collective.
  subroutine dsm_info_describe(format, text, ierr)
    integer, intent(in) :: format
    character(len=:), allocatable, intent(out) :: text
    integer, intent(out), optional :: ierr
    type(c_ptr) :: p
    integer(c_int) :: st

    p = c_null_ptr
    st = c_dsm_info_describe(int(format, c_int), p)
    text = c_to_f_string(p)
    call c_dsm_free(p)
    call finish(st, 'dsm_info_describe', ierr)
  end subroutine dsm_info_describe

  ! ============================================================ mesh creation

  ! The common body of the create specifics; comm is the integer handle.
  subroutine mesh_create_common(comm, shape, names, placement, binding, mesh, where, ierr)
    integer, intent(in) :: comm
    integer, dimension(:), intent(in) :: shape
    character(len=*), dimension(:), intent(in) :: names
    integer, intent(in) :: placement, binding
    type(dsm_mesh_t), intent(out) :: mesh
    character(len=*), intent(in) :: where
    integer, intent(out), optional :: ierr
    integer(c_int), dimension(:), allocatable :: cshape
    character(kind=c_char), dimension(:), allocatable, target :: buf
    integer, dimension(:), allocatable :: start
    type(c_ptr), dimension(:), allocatable :: ptrs
    integer(c_int) :: ndims, st
    integer :: i

    allocate(cshape(max(size(shape), 1)))
    cshape = 0
    cshape(1:size(shape)) = int(shape, c_int)
    ndims = int(size(shape), c_int)
    ! A names list of the wrong length becomes ndims 0, which the library
    ! rejects on every rank together (DSM_ERR_INVALID_ARGUMENT) instead of
    ! leaving the ranks with a good list waiting for the others.
    if (size(names) /= size(shape)) ndims = 0
    call pack_names(names, buf, start)
    allocate(ptrs(max(size(names), 1)))
    ptrs = c_null_ptr
    do i = 1, size(names)
       ptrs(i) = c_loc(buf(start(i)))
    end do
    st = c_dsm_f_mesh_create(comm, ndims, cshape, ptrs, int(placement, c_int), &
         int(binding, c_int), mesh%ptr)
    call finish(st, where, ierr)
  end subroutine mesh_create_common

  subroutine mesh_create_i(comm, shape, names, mesh, ierr)
    integer, intent(in) :: comm
    integer, dimension(:), intent(in) :: shape
    character(len=*), dimension(:), intent(in) :: names
    type(dsm_mesh_t), intent(out) :: mesh
    integer, intent(out), optional :: ierr

    call mesh_create_common(comm, shape, names, DSM_PLACEMENT_DEFAULT, DSM_BIND_DEFAULT, mesh, &
         'dsm_mesh_create', ierr)
  end subroutine mesh_create_i

  subroutine mesh_create_f08(comm, shape, names, mesh, ierr)
    type(MPI_Comm), intent(in) :: comm
    integer, dimension(:), intent(in) :: shape
    character(len=*), dimension(:), intent(in) :: names
    type(dsm_mesh_t), intent(out) :: mesh
    integer, intent(out), optional :: ierr

    call mesh_create_common(comm%MPI_VAL, shape, names, DSM_PLACEMENT_DEFAULT, DSM_BIND_DEFAULT, &
         mesh, 'dsm_mesh_create', ierr)
  end subroutine mesh_create_f08

  subroutine mesh_create_with_options_i(comm, shape, names, placement, binding, mesh, ierr)
    integer, intent(in) :: comm
    integer, dimension(:), intent(in) :: shape
    character(len=*), dimension(:), intent(in) :: names
    integer, intent(in) :: placement, binding
    type(dsm_mesh_t), intent(out) :: mesh
    integer, intent(out), optional :: ierr

    call mesh_create_common(comm, shape, names, placement, binding, mesh, &
         'dsm_mesh_create_with_options', ierr)
  end subroutine mesh_create_with_options_i

  subroutine mesh_create_with_options_f08(comm, shape, names, placement, binding, mesh, ierr)
    type(MPI_Comm), intent(in) :: comm
    integer, dimension(:), intent(in) :: shape
    character(len=*), dimension(:), intent(in) :: names
    integer, intent(in) :: placement, binding
    type(dsm_mesh_t), intent(out) :: mesh
    integer, intent(out), optional :: ierr

    call mesh_create_common(comm%MPI_VAL, shape, names, placement, binding, mesh, &
         'dsm_mesh_create_with_options', ierr)
  end subroutine mesh_create_with_options_f08

  subroutine mesh_create_dp_sp_i(comm, dp, sp, mesh, ierr)
    integer, intent(in) :: comm
    integer, intent(in) :: dp, sp
    type(dsm_mesh_t), intent(out) :: mesh
    integer, intent(out), optional :: ierr
    integer(c_int) :: st

    st = c_dsm_f_mesh_create_dp_sp(comm, int(dp, c_int), int(sp, c_int), mesh%ptr)
    call finish(st, 'dsm_mesh_create_dp_sp', ierr)
  end subroutine mesh_create_dp_sp_i

  subroutine mesh_create_dp_sp_f08(comm, dp, sp, mesh, ierr)
    type(MPI_Comm), intent(in) :: comm
    integer, intent(in) :: dp, sp
    type(dsm_mesh_t), intent(out) :: mesh
    integer, intent(out), optional :: ierr

    call mesh_create_dp_sp_i(comm%MPI_VAL, dp, sp, mesh, ierr)
  end subroutine mesh_create_dp_sp_f08

  !> Free a mesh or a slice and make the handle null. Collective over the
  !> mesh communicator; a null handle is allowed and does nothing.
  subroutine dsm_mesh_free(mesh, ierr)
    type(dsm_mesh_t), intent(inout) :: mesh
    integer, intent(out), optional :: ierr
    integer(c_int) :: st

    st = c_dsm_mesh_free(mesh%ptr)
    call finish(st, 'dsm_mesh_free', ierr)
  end subroutine dsm_mesh_free

  ! ============================================================ mesh queries (not collective)

  !> Number of dimensions of the mesh (or slice).
  subroutine dsm_mesh_get_ndims(mesh, ndims, ierr)
    type(dsm_mesh_t), intent(in) :: mesh
    integer, intent(out) :: ndims
    integer, intent(out), optional :: ierr
    integer(c_int) :: cn, st

    cn = 0
    st = c_dsm_mesh_get_ndims(mesh%ptr, cn)
    ndims = int(cn)
    call finish(st, 'dsm_mesh_get_ndims', ierr)
  end subroutine dsm_mesh_get_ndims

  !> Size of each dimension, outermost first, in shape(1:ndims). size(shape)
  !> must be at least ndims (DSM_ERR_INVALID_ARGUMENT otherwise); the
  !> elements after ndims are left alone.
  subroutine dsm_mesh_get_shape(mesh, shape, ierr)
    type(dsm_mesh_t), intent(in) :: mesh
    integer, dimension(:), intent(inout) :: shape
    integer, intent(out), optional :: ierr
    integer(c_int), dimension(DSM_MESH_MAX_DIMS) :: cshape
    integer(c_int) :: st, cn
    integer :: n

    cshape = 0
    st = c_dsm_mesh_get_shape(mesh%ptr, int(min(size(shape), DSM_MESH_MAX_DIMS), c_int), cshape)
    if (st == DSM_SUCCESS) then
       st = c_dsm_mesh_get_ndims(mesh%ptr, cn)
       n = int(cn)
       shape(1:n) = int(cshape(1:n))
    end if
    call finish(st, 'dsm_mesh_get_shape', ierr)
  end subroutine dsm_mesh_get_shape

  !> This rank's 0-based coordinate along each dimension, in coords(1:ndims).
  !> size(coords) as in dsm_mesh_get_shape.
  subroutine dsm_mesh_get_coords(mesh, coords, ierr)
    type(dsm_mesh_t), intent(in) :: mesh
    integer, dimension(:), intent(inout) :: coords
    integer, intent(out), optional :: ierr
    integer(c_int), dimension(DSM_MESH_MAX_DIMS) :: ccoords
    integer(c_int) :: st, cn
    integer :: n

    ccoords = 0
    st = c_dsm_mesh_get_coords(mesh%ptr, int(min(size(coords), DSM_MESH_MAX_DIMS), c_int), ccoords)
    if (st == DSM_SUCCESS) then
       st = c_dsm_mesh_get_ndims(mesh%ptr, cn)
       n = int(cn)
       coords(1:n) = int(ccoords(1:n))
    end if
    call finish(st, 'dsm_mesh_get_coords', ierr)
  end subroutine dsm_mesh_get_coords

  !> The name of dimension dim (0-based, as in C: 0 = outermost).
  subroutine dsm_mesh_get_dim_name(mesh, dim, name, ierr)
    type(dsm_mesh_t), intent(in) :: mesh
    integer, intent(in) :: dim
    character(len=:), allocatable, intent(out) :: name
    integer, intent(out), optional :: ierr
    type(c_ptr) :: p
    integer(c_int) :: st

    p = c_null_ptr
    st = c_dsm_mesh_get_dim_name(mesh%ptr, int(dim, c_int), p)
    name = c_to_f_string(p)
    call finish(st, 'dsm_mesh_get_dim_name', ierr)
  end subroutine dsm_mesh_get_dim_name

  !> The 0-based index of the dimension called name (DSM_ERR_NOT_FOUND if none).
  subroutine dsm_mesh_get_dim_index(mesh, name, dim, ierr)
    type(dsm_mesh_t), intent(in) :: mesh
    character(len=*), intent(in) :: name
    integer, intent(out) :: dim
    integer, intent(out), optional :: ierr
    integer(c_int) :: cdim, st

    cdim = -1
    st = c_dsm_mesh_get_dim_index(mesh%ptr, trim(name) // c_null_char, cdim)
    dim = int(cdim)
    call finish(st, 'dsm_mesh_get_dim_index', ierr)
  end subroutine dsm_mesh_get_dim_index

  !> Size of the group along dimension dim (0-based, as in C) = its shape.
  subroutine dsm_mesh_dim_size(mesh, dim, size, ierr)
    type(dsm_mesh_t), intent(in) :: mesh
    integer, intent(in) :: dim
    integer, intent(out) :: size
    integer, intent(out), optional :: ierr
    integer(c_int) :: csize, st

    csize = 0
    st = c_dsm_mesh_dim_size(mesh%ptr, int(dim, c_int), csize)
    size = int(csize)
    call finish(st, 'dsm_mesh_dim_size', ierr)
  end subroutine dsm_mesh_dim_size

  !> This rank's rank along dimension dim (0-based, as in C) = its 0-based
  !> coordinate.
  subroutine dsm_mesh_dim_rank(mesh, dim, rank, ierr)
    type(dsm_mesh_t), intent(in) :: mesh
    integer, intent(in) :: dim
    integer, intent(out) :: rank
    integer, intent(out), optional :: ierr
    integer(c_int) :: crank, st

    crank = -1
    st = c_dsm_mesh_dim_rank(mesh%ptr, int(dim, c_int), crank)
    rank = int(crank)
    call finish(st, 'dsm_mesh_dim_rank', ierr)
  end subroutine dsm_mesh_dim_rank

  !> Size of a named group (a dimension or a flattened group), or of the
  !> whole mesh for group ''.
  subroutine dsm_mesh_size(mesh, group, size, ierr)
    type(dsm_mesh_t), intent(in) :: mesh
    character(len=*), intent(in) :: group
    integer, intent(out) :: size
    integer, intent(out), optional :: ierr
    character(kind=c_char), dimension(:), allocatable, target :: buf
    integer(c_int) :: csize, st

    csize = 0
    if (len_trim(group) == 0) then
       st = c_dsm_mesh_size(mesh%ptr, c_null_ptr, csize)
    else
       call f_to_c_string(group, buf)
       st = c_dsm_mesh_size(mesh%ptr, c_loc(buf(1)), csize)
    end if
    size = int(csize)
    call finish(st, 'dsm_mesh_size', ierr)
  end subroutine dsm_mesh_size

  !> This rank's rank in a named group; for group '' its linear (row-major)
  !> position in the mesh or slice.
  subroutine dsm_mesh_rank(mesh, group, rank, ierr)
    type(dsm_mesh_t), intent(in) :: mesh
    character(len=*), intent(in) :: group
    integer, intent(out) :: rank
    integer, intent(out), optional :: ierr
    character(kind=c_char), dimension(:), allocatable, target :: buf
    integer(c_int) :: crank, st

    crank = -1
    if (len_trim(group) == 0) then
       st = c_dsm_mesh_rank(mesh%ptr, c_null_ptr, crank)
    else
       call f_to_c_string(group, buf)
       st = c_dsm_mesh_rank(mesh%ptr, c_loc(buf(1)), crank)
    end if
    rank = int(crank)
    call finish(st, 'dsm_mesh_rank', ierr)
  end subroutine dsm_mesh_rank

  subroutine mesh_comm_i(mesh, group, comm, ierr)
    type(dsm_mesh_t), intent(in) :: mesh
    character(len=*), intent(in) :: group
    integer, intent(out) :: comm
    integer, intent(out), optional :: ierr
    character(kind=c_char), dimension(:), allocatable, target :: buf
    integer(c_int) :: st

    if (len_trim(group) == 0) then
       st = c_dsm_f_mesh_comm(mesh%ptr, c_null_ptr, comm)
    else
       call f_to_c_string(group, buf)
       st = c_dsm_f_mesh_comm(mesh%ptr, c_loc(buf(1)), comm)
    end if
    call finish(st, 'dsm_mesh_comm', ierr)
  end subroutine mesh_comm_i

  subroutine mesh_comm_f08(mesh, group, comm, ierr)
    type(dsm_mesh_t), intent(in) :: mesh
    character(len=*), intent(in) :: group
    type(MPI_Comm), intent(out) :: comm
    integer, intent(out), optional :: ierr

    call mesh_comm_i(mesh, group, comm%MPI_VAL, ierr)
  end subroutine mesh_comm_f08

  !> The parent ranks of the members of this rank's group, in group-rank
  !> order, in ranks(1:group size); group '' for the whole mesh. size(ranks)
  !> must be at least the group size (DSM_ERR_INVALID_ARGUMENT otherwise).
  subroutine dsm_mesh_group_ranks(mesh, group, ranks, ierr)
    type(dsm_mesh_t), intent(in) :: mesh
    character(len=*), intent(in) :: group
    integer, dimension(:), intent(inout) :: ranks
    integer, intent(out), optional :: ierr
    character(kind=c_char), dimension(:), allocatable, target :: buf
    integer(c_int), dimension(:), allocatable :: cranks
    type(c_ptr) :: g
    integer(c_int) :: st, csize

    g = c_null_ptr
    if (len_trim(group) > 0) then
       call f_to_c_string(group, buf)
       g = c_loc(buf(1))
    end if
    allocate(cranks(max(size(ranks), 1)))
    cranks = -1
    st = c_dsm_mesh_group_ranks(mesh%ptr, g, int(size(ranks), c_int), cranks)
    if (st == DSM_SUCCESS) then
       st = c_dsm_mesh_size(mesh%ptr, g, csize)
       ranks(1:csize) = int(cranks(1:csize))
    end if
    call finish(st, 'dsm_mesh_group_ranks', ierr)
  end subroutine dsm_mesh_group_ranks

  !> A sub-mesh of the dimensions names(:) (in mesh order), sharing the
  !> parent's communicators. Not collective. Free it with dsm_mesh_free.
  subroutine dsm_mesh_slice(mesh, names, slice, ierr)
    type(dsm_mesh_t), intent(in) :: mesh
    character(len=*), dimension(:), intent(in) :: names
    type(dsm_mesh_t), intent(out) :: slice
    integer, intent(out), optional :: ierr
    character(kind=c_char), dimension(:), allocatable, target :: buf
    integer, dimension(:), allocatable :: start
    type(c_ptr), dimension(:), allocatable :: ptrs
    integer(c_int) :: st
    integer :: i

    call pack_names(names, buf, start)
    allocate(ptrs(max(size(names), 1)))
    ptrs = c_null_ptr
    do i = 1, size(names)
       ptrs(i) = c_loc(buf(start(i)))
    end do
    st = c_dsm_mesh_slice(mesh%ptr, int(size(names), c_int), ptrs, slice%ptr)
    call finish(st, 'dsm_mesh_slice', ierr)
  end subroutine dsm_mesh_slice

  ! The common body of the flatten specifics; comm is the integer handle.
  subroutine mesh_flatten_common(mesh, names, flat_name, comm, ierr)
    type(dsm_mesh_t), intent(in) :: mesh
    character(len=*), dimension(:), intent(in) :: names
    character(len=*), intent(in) :: flat_name
    integer, intent(out) :: comm
    integer, intent(out), optional :: ierr
    character(kind=c_char), dimension(:), allocatable, target :: buf
    integer, dimension(:), allocatable :: start
    type(c_ptr), dimension(:), allocatable :: ptrs
    integer(c_int) :: st
    integer :: i

    call pack_names(names, buf, start)
    allocate(ptrs(max(size(names), 1)))
    ptrs = c_null_ptr
    do i = 1, size(names)
       ptrs(i) = c_loc(buf(start(i)))
    end do
    st = c_dsm_f_mesh_flatten(mesh%ptr, int(size(names), c_int), ptrs, &
         trim(flat_name) // c_null_char, comm)
    call finish(st, 'dsm_mesh_flatten', ierr)
  end subroutine mesh_flatten_common

  subroutine mesh_flatten_i(mesh, names, flat_name, comm, ierr)
    type(dsm_mesh_t), intent(in) :: mesh
    character(len=*), dimension(:), intent(in) :: names
    character(len=*), intent(in) :: flat_name
    integer, intent(out), optional :: comm
    integer, intent(out), optional :: ierr
    integer :: c

    call mesh_flatten_common(mesh, names, flat_name, c, ierr)
    if (present(comm)) comm = c
  end subroutine mesh_flatten_i

  subroutine mesh_flatten_f08(mesh, names, flat_name, comm, ierr)
    type(dsm_mesh_t), intent(in) :: mesh
    character(len=*), dimension(:), intent(in) :: names
    character(len=*), intent(in) :: flat_name
    type(MPI_Comm), intent(out) :: comm
    integer, intent(out), optional :: ierr

    call mesh_flatten_common(mesh, names, flat_name, comm%MPI_VAL, ierr)
  end subroutine mesh_flatten_f08

  !> Describe the placement of every rank (DSM_FORMAT_TEXT or
  !> DSM_FORMAT_JSON). Collective over the mesh communicator; the same text
  !> on every rank.
  subroutine dsm_mesh_describe(mesh, format, text, ierr)
    type(dsm_mesh_t), intent(in) :: mesh
    integer, intent(in) :: format
    character(len=:), allocatable, intent(out) :: text
    integer, intent(out), optional :: ierr
    type(c_ptr) :: p
    integer(c_int) :: st

    p = c_null_ptr
    st = c_dsm_mesh_describe(mesh%ptr, int(format, c_int), p)
    text = c_to_f_string(p)
    call c_dsm_free(p)
    call finish(st, 'dsm_mesh_describe', ierr)
  end subroutine dsm_mesh_describe

  ! ============================================================ configuration

  subroutine config_load_i(comm, config, flags, cfg, ierr)
    integer, intent(in) :: comm
    character(len=*), intent(in) :: config
    integer, intent(in) :: flags
    type(dsm_config_t), intent(out) :: cfg
    integer, intent(out), optional :: ierr
    integer(c_int) :: st

    st = c_dsm_f_config_load(comm, trim(config) // c_null_char, int(flags, c_int), cfg%ptr)
    call finish(st, 'dsm_config_load', ierr)
  end subroutine config_load_i

  subroutine config_load_f08(comm, config, flags, cfg, ierr)
    type(MPI_Comm), intent(in) :: comm
    character(len=*), intent(in) :: config
    integer, intent(in) :: flags
    type(dsm_config_t), intent(out) :: cfg
    integer, intent(out), optional :: ierr

    call config_load_i(comm%MPI_VAL, config, flags, cfg, ierr)
  end subroutine config_load_f08

  !> dsm_config_load over the ranks of a mesh, with the data-parallel size
  !> taken from its "data_parallel" dimension when it has one. Collective
  !> over the mesh (all ranks of the communicator it was created from, also
  !> for a slice). cfg is null on error.
  subroutine dsm_config_load_for_mesh(mesh, config, flags, cfg, ierr)
    type(dsm_mesh_t), intent(in) :: mesh
    character(len=*), intent(in) :: config
    integer, intent(in) :: flags
    type(dsm_config_t), intent(out) :: cfg
    integer, intent(out), optional :: ierr
    integer(c_int) :: st

    st = c_dsm_config_load_for_mesh(mesh%ptr, trim(config) // c_null_char, int(flags, c_int), &
         cfg%ptr)
    call finish(st, 'dsm_config_load_for_mesh', ierr)
  end subroutine dsm_config_load_for_mesh

  !> Resolve a configuration for a job of world_size ranks without running
  !> it; data_parallel_size is the mesh's data_parallel size, or 0 when there
  !> is no mesh. Not collective; needs no MPI initialization. cfg is null on
  !> error.
  subroutine dsm_config_resolve(config, world_size, data_parallel_size, flags, cfg, ierr)
    character(len=*), intent(in) :: config
    integer(c_int64_t), intent(in) :: world_size, data_parallel_size
    integer, intent(in) :: flags
    type(dsm_config_t), intent(out) :: cfg
    integer, intent(out), optional :: ierr
    integer(c_int) :: st

    st = c_dsm_config_resolve(trim(config) // c_null_char, world_size, data_parallel_size, &
         int(flags, c_int), cfg%ptr)
    call finish(st, 'dsm_config_resolve', ierr)
  end subroutine dsm_config_resolve

  !> Free a configuration and make the handle null. Not collective; a null
  !> handle is allowed and does nothing.
  subroutine dsm_config_free(cfg, ierr)
    type(dsm_config_t), intent(inout) :: cfg
    integer, intent(out), optional :: ierr
    integer(c_int) :: st

    st = c_dsm_config_free(cfg%ptr)
    call finish(st, 'dsm_config_free', ierr)
  end subroutine dsm_config_free

  !> The batch values after DeepSpeed's derivation, and the data-parallel
  !> size W: call dsm_config_get_batch(cfg [, train_batch_size]
  !> [, micro_batch_size] [, gradient_accumulation_steps]
  !> [, data_parallel_size] [, ierr]), all integer(c_int64_t) and each
  !> optional. Not collective.
  subroutine dsm_config_get_batch(cfg, train_batch_size, micro_batch_size, &
       gradient_accumulation_steps, data_parallel_size, ierr)
    type(dsm_config_t), intent(in) :: cfg
    integer(c_int64_t), intent(out), optional :: train_batch_size, micro_batch_size
    integer(c_int64_t), intent(out), optional :: gradient_accumulation_steps, data_parallel_size
    integer, intent(out), optional :: ierr
    integer(c_int64_t) :: tbs, mbs, gas, dps
    integer(c_int) :: st

    tbs = 0
    mbs = 0
    gas = 0
    dps = 0
    st = c_dsm_config_get_batch(cfg%ptr, tbs, mbs, gas, dps)
    if (present(train_batch_size)) train_batch_size = tbs
    if (present(micro_batch_size)) micro_batch_size = mbs
    if (present(gradient_accumulation_steps)) gradient_accumulation_steps = gas
    if (present(data_parallel_size)) data_parallel_size = dps
    call finish(st, 'dsm_config_get_batch', ierr)
  end subroutine dsm_config_get_batch

  !> The resolved configuration: every key with its effective value, the
  !> derived batch values and the unknown keys, as DSM_FORMAT_TEXT (one
  !> "key.path = value" line per key) or DSM_FORMAT_JSON. Not collective.
  subroutine dsm_config_describe(cfg, format, text, ierr)
    type(dsm_config_t), intent(in) :: cfg
    integer, intent(in) :: format
    character(len=:), allocatable, intent(out) :: text
    integer, intent(out), optional :: ierr
    type(c_ptr) :: p
    integer(c_int) :: st

    p = c_null_ptr
    st = c_dsm_config_describe(cfg%ptr, int(format, c_int), p)
    text = c_to_f_string(p)
    call c_dsm_free(p)
    call finish(st, 'dsm_config_describe', ierr)
  end subroutine dsm_config_describe

  !> The learning rate (and momentum where the schedule cycles it) before
  !> the first optimizer step and after each of steps (0..10000000)
  !> optimizer steps, as DSM_FORMAT_TEXT or DSM_FORMAT_JSON. Not collective.
  subroutine dsm_config_describe_lr(cfg, steps, format, text, ierr)
    type(dsm_config_t), intent(in) :: cfg
    integer(c_int64_t), intent(in) :: steps
    integer, intent(in) :: format
    character(len=:), allocatable, intent(out) :: text
    integer, intent(out), optional :: ierr
    type(c_ptr) :: p
    integer(c_int) :: st

    p = c_null_ptr
    st = c_dsm_config_describe_lr(cfg%ptr, steps, int(format, c_int), p)
    text = c_to_f_string(p)
    call c_dsm_free(p)
    call finish(st, 'dsm_config_describe_lr', ierr)
  end subroutine dsm_config_describe_lr

end module dsm
