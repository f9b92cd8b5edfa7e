! The Fortran bindings (module dsm) at any rank count: status strings and
! version, a 2-D mesh and its row-major layout, the communicators of its
! dimensions, flatten, slice, a collective error reported through ierr, the
! mpi_f08 specifics, free.
!
! Every check is made on every rank and agreed with MPI_Allreduce, so all
! ranks run the same sequence; rank 0 prints "PASS: what" or "FAIL: what",
! and a failing rank prints its own detail. The program exits 0 when every
! check passed and with a nonzero status (error stop) otherwise.
! Run on one node (mpiexec -n 1, 2, 4, 8): there, mesh position = rank.
program test_fortran_mesh
  use, intrinsic :: iso_c_binding, only: c_associated
  use mpi
  use mpi_f08, only: MPI_Comm
  use dsm
  implicit none

  integer :: ierr, rank, nprocs, failures
  integer :: major, minor, patch, st
  integer :: dp, sp, ndims, n, r, d, pos, stride, c, total, i
  integer :: shape(2), coords(2), got(DSM_MESH_MAX_DIMS), members(64)
  character(len=20) :: names(2), one(1)
  character(len=:), allocatable :: s, text
  logical :: enabled, ok
  type(dsm_mesh_t) :: mesh, slice, bad, mesh3, slice3
  type(MPI_Comm) :: world08, comm08

  failures = 0
  call MPI_Init(ierr)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  call MPI_Comm_size(MPI_COMM_WORLD, nprocs, ierr)

  ! ---------------------------------------------------------- status and version
  call dsm_library_version(major, minor, patch)
  call check(major >= 0 .and. minor >= 0 .and. patch >= 0, 'dsm_library_version gives a version')
  call dsm_library_version(major, minor, patch, st)
  call check(st == DSM_SUCCESS, 'dsm_library_version with ierr returns DSM_SUCCESS')
  call check(dsm_status_string(DSM_SUCCESS) == 'success', 'dsm_status_string(DSM_SUCCESS) is "success"')
  call check(dsm_status_string(DSM_ERR_INVALID_ARGUMENT) == 'invalid argument', &
       'dsm_status_string(DSM_ERR_INVALID_ARGUMENT) is "invalid argument"')
  call check(dsm_status_string(DSM_ERR_INTERNAL) == 'internal error' .and. DSM_ERR_INTERNAL == 14, &
       'DSM_ERR_INTERNAL is 14, "internal error"')
  call check(dsm_status_string(1000) == 'unknown status', 'an unknown status is "unknown status"')
  call dsm_library_feature('fortran', enabled, st)
  call check(st == DSM_SUCCESS .and. enabled, 'dsm_library_feature("fortran") is on')
  call dsm_library_feature('no_such_feature', enabled, st)
  call check(st == DSM_ERR_NOT_FOUND, 'dsm_library_feature of an unknown name gives DSM_ERR_NOT_FOUND')
  call dsm_dtype_size(DSM_BFLOAT16, n)
  call check(n == 2 .and. dsm_dtype_name(DSM_BFLOAT16) == 'bfloat16', 'bfloat16 is 2 bytes')
  call dsm_info_describe(DSM_FORMAT_JSON, text)
  call check(len(text) > 0 .and. text(1:1) == '{', 'dsm_info_describe(DSM_FORMAT_JSON) is a JSON document')

  ! ---------------------------------------------------------- a 2-D mesh
  ! size/2 x 2 when the size is even, else size x 1; names padded with blanks.
  if (mod(nprocs, 2) == 0) then
     dp = nprocs / 2
     sp = 2
  else
     dp = nprocs
     sp = 1
  end if
  shape = [dp, sp]
  names(1) = 'dp'
  names(2) = 'sp'
  call check(.not. c_associated(mesh%ptr), 'a new handle is null')
  call dsm_mesh_create(MPI_COMM_WORLD, shape, names, mesh, st)
  call check(st == DSM_SUCCESS .and. c_associated(mesh%ptr), 'dsm_mesh_create of a 2-D mesh')

  call dsm_mesh_ndims(mesh, ndims)
  call check(ndims == 2, 'dsm_mesh_ndims is 2')
  got = -7
  call dsm_mesh_shape(mesh, got)
  call check(all(got(1:2) == shape) .and. all(got(3:) == -7), 'dsm_mesh_shape is [dp, sp]')
  call dsm_mesh_coords(mesh, coords)
  ! Row-major, the last dimension fastest: rank = coords(1)*sp + coords(2).
  call check(coords(1) == rank / sp .and. coords(2) == mod(rank, sp), 'coordinates are row-major')

  ok = .true.
  stride = 1
  pos = 0
  do d = 1, 0, -1  ! 0-based dimension index, innermost first
     call dsm_mesh_dim_size(mesh, d, n)
     call dsm_mesh_dim_rank(mesh, d, r)
     if (n /= shape(d + 1) .or. r /= coords(d + 1)) ok = .false.
     call dsm_mesh_dim_name(mesh, d, s)
     if (s /= trim(names(d + 1))) ok = .false.
     call dsm_mesh_dim_index(mesh, names(d + 1), c)
     if (c /= d) ok = .false.
     call dsm_mesh_size(mesh, names(d + 1), n)
     call dsm_mesh_rank(mesh, names(d + 1), r)
     if (n /= shape(d + 1) .or. r /= coords(d + 1)) ok = .false.
     call dsm_mesh_group_ranks(mesh, names(d + 1), members)
     do i = 1, shape(d + 1)
        if (members(i) /= rank + (i - 1 - coords(d + 1)) * stride) ok = .false.
     end do
     pos = pos + coords(d + 1) * stride
     stride = stride * shape(d + 1)
  end do
  call check(ok, 'dim sizes, ranks, names and group members along each dimension')

  call dsm_mesh_size(mesh, '', n)
  call dsm_mesh_rank(mesh, '   ', r)
  call check(n == nprocs .and. r == pos .and. pos == rank, 'group '''' is the whole mesh, position = rank')

  ! The communicator of each dimension: the sum of 1 over it is its size,
  ! and its rank is the coordinate.
  ok = .true.
  do d = 0, 1
     call dsm_mesh_comm(mesh, names(d + 1), c)
     call MPI_Allreduce(1, total, 1, MPI_INTEGER, MPI_SUM, c, ierr)
     call MPI_Comm_rank(c, r, ierr)
     if (ierr /= MPI_SUCCESS .or. total /= shape(d + 1) .or. r /= coords(d + 1)) ok = .false.
  end do
  call check(ok, 'MPI_Allreduce over the communicator of each dimension gives its size')
  call dsm_mesh_comm(mesh, '', c)
  call MPI_Comm_rank(c, r, ierr)
  call MPI_Comm_size(c, n, ierr)
  call check(r == rank .and. n == nprocs, 'the mesh communicator is ordered by position')

  ! ---------------------------------------------------------- flatten
  call dsm_mesh_flatten(mesh, names, 'everything', c, st)
  total = 0
  if (st == DSM_SUCCESS) call MPI_Allreduce(1, total, 1, MPI_INTEGER, MPI_SUM, c, ierr)
  call dsm_mesh_size(mesh, 'everything', n)
  call dsm_mesh_rank(mesh, 'everything', r)
  call check(st == DSM_SUCCESS .and. total == nprocs .and. n == nprocs .and. r == rank, &
       'dsm_mesh_flatten of both dimensions spans the mesh')
  one(1) = 'sp'
  call dsm_mesh_flatten(mesh, one, 'sp_again')  ! no comm, no ierr
  call dsm_mesh_size(mesh, 'sp_again', n)
  call check(n == sp, 'dsm_mesh_flatten without comm and ierr')
  one(1) = 'nope'
  call dsm_mesh_flatten(mesh, one, 'bad_group', c, st)
  call check(st == DSM_ERR_NOT_FOUND .and. index(dsm_last_error(), 'nope') > 0, &
       'dsm_mesh_flatten of an unknown dimension gives DSM_ERR_NOT_FOUND on every rank')

  ! ---------------------------------------------------------- slice
  one(1) = 'sp'
  call dsm_mesh_slice(mesh, one, slice, st)
  call check(st == DSM_SUCCESS .and. c_associated(slice%ptr), 'dsm_mesh_slice of "sp"')
  call dsm_mesh_slice(mesh, names, bad)
  call dsm_mesh_comm(bad, '', c, st)
  call MPI_Comm_size(c, n, ierr)
  call check(st == DSM_SUCCESS .and. n == nprocs, 'a slice of every dimension has the mesh communicator')
  call dsm_mesh_free(bad)
  call dsm_mesh_create(MPI_COMM_WORLD, [dp, sp, 1], ['x', 'y', 'z'], mesh3)
  call dsm_mesh_slice(mesh3, ['x', 'z'], bad)
  call dsm_mesh_comm(bad, '', c, st)
  call check(st == DSM_ERR_NOT_SUPPORTED .and. index(dsm_last_error(), 'dsm_mesh_flatten') > 0, &
       'a 2-D slice of a 3-D mesh has no communicator of its own')
  call dsm_mesh_slice(mesh3, ['z', 'x'], slice3, st)
  call check(st == DSM_ERR_INVALID_ARGUMENT .and. .not. c_associated(slice3%ptr), &
       'dsm_mesh_slice of names out of mesh order gives DSM_ERR_INVALID_ARGUMENT')
  call dsm_mesh_free(bad)
  call dsm_mesh_free(mesh3)

  ! ---------------------------------------------------------- mpi_f08 specifics
  world08%MPI_VAL = MPI_COMM_WORLD
  call dsm_mesh_create_dp_sp(world08, -1, sp, bad, st)
  call dsm_mesh_dim_name(bad, 0, s)
  call check(st == DSM_SUCCESS .and. s == 'data_parallel', 'dsm_mesh_create_dp_sp with type(MPI_Comm)')
  call dsm_mesh_comm(bad, 'sequence_parallel', comm08)
  call dsm_mesh_comm(bad, 'sequence_parallel', c)
  call check(comm08%MPI_VAL == c, 'dsm_mesh_comm gives the same communicator as type(MPI_Comm)')
  call dsm_mesh_flatten(bad, ['data_parallel    ', 'sequence_parallel'], 'all', comm08)
  call MPI_Allreduce(1, total, 1, MPI_INTEGER, MPI_SUM, comm08%MPI_VAL, ierr)
  call check(total == nprocs, 'dsm_mesh_flatten with type(MPI_Comm)')
  call dsm_mesh_describe(bad, DSM_FORMAT_TEXT, text)
  call check(index(text, 'data_parallel') > 0, 'dsm_mesh_describe names the dimensions')
  call dsm_mesh_free(bad)
  call dsm_mesh_create_with_options(world08, shape, names, DSM_PLACEMENT_NONE, DSM_BIND_NONE, bad)
  call dsm_mesh_rank(bad, '', r)
  call check(r == rank, 'dsm_mesh_create_with_options, placement none: position = rank')
  call dsm_mesh_free(bad)

  ! ---------------------------------------------------------- an error, with ierr
  ! The product of the shape is not the communicator size: every rank fails.
  call dsm_mesh_create(MPI_COMM_WORLD, [nprocs + 1, 1], names, bad, st)
  call check(st == DSM_ERR_INVALID_ARGUMENT, 'a wrong shape product gives DSM_ERR_INVALID_ARGUMENT on every rank')
  s = dsm_last_error()
  call check(index(s, 'communicator size') > 0, 'dsm_last_error() names the communicator size')
  if (index(s, 'communicator size') == 0) write(*, '(a,i0,2a)') 'rank ', rank, ': last error: ', s
  call check(.not. c_associated(bad%ptr), 'the failed mesh handle is null')
  call dsm_mesh_create(MPI_COMM_WORLD, shape, one, bad, st)
  call check(st == DSM_ERR_INVALID_ARGUMENT .and. .not. c_associated(bad%ptr), &
       'size(names) /= size(shape) gives DSM_ERR_INVALID_ARGUMENT')
  call dsm_mesh_dim_size(mesh, 2, n, st)
  call check(st == DSM_ERR_INVALID_ARGUMENT, 'dim 2 of a 2-D mesh is out of range (0-based)')

  ! ---------------------------------------------------------- free
  call dsm_mesh_free(mesh, st)
  call check(st == DSM_SUCCESS .and. .not. c_associated(mesh%ptr), 'dsm_mesh_free makes the handle null')
  call dsm_mesh_free(mesh, st)
  call check(st == DSM_SUCCESS, 'dsm_mesh_free of a null handle does nothing')
  ! The slice outlives its mesh.
  call dsm_mesh_size(slice, '', n)
  call dsm_mesh_rank(slice, '', r)
  call dsm_mesh_comm(slice, '', c)
  call MPI_Allreduce(1, total, 1, MPI_INTEGER, MPI_SUM, c, ierr)
  call check(n == sp .and. r == mod(rank, sp) .and. total == sp, 'a 1-D slice outlives its mesh')
  call dsm_mesh_free(slice)
  call check(.not. c_associated(slice%ptr), 'dsm_mesh_free of the slice')

  call MPI_Finalize(ierr)
  if (failures > 0) then
     if (rank == 0) write(*, '(a,i0,a)') 'FAIL: ', failures, ' check(s) failed'
     error stop 1
  end if
  if (rank == 0) write(*, '(a)') 'PASS: all checks'

contains

  include 'checks.inc'

end program test_fortran_mesh
