! A Fortran program built against the installed module dsm by
! test/install/check-install.sh (with pkg-config and with CMake): a mesh of
! the world, its size and shape, and the version the library reports.
program hello_dsm
  use mpi_f08
  use dsm
  implicit none
  type(dsm_mesh_t) :: mesh
  integer :: ierr, world, rank, n, major, minor, patch
  integer :: shape(2)

  call MPI_Init(ierr)
  call MPI_Comm_size(MPI_COMM_WORLD, world, ierr)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  call dsm_mesh_create_dp_sp(MPI_COMM_WORLD, world, 1, mesh)
  call dsm_mesh_size(mesh, '', n)
  call dsm_mesh_shape(mesh, shape)
  call dsm_library_version(major, minor, patch)
  if (n /= world .or. shape(1) /= world .or. shape(2) /= 1) then
     print '(a,i0,a,2i4)', 'hello_dsm: mesh size ', n, ' shape ', shape
     call MPI_Abort(MPI_COMM_WORLD, 1, ierr)
  end if
  if (rank == 0) print '(a,i0,a,i0,a,i0,a,i0,a)', 'hello_dsm: libdsm ', major, '.', minor, '.', patch, &
       ', mesh of ', n, ' ranks'
  call dsm_mesh_free(mesh)
  call MPI_Finalize(ierr)
end program hello_dsm
