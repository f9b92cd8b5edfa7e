! Module dsm from a program that uses mpi_f08 only: dsm_mesh_flatten with and
! without comm (type(MPI_Comm) or none, with and without ierr), the handles
! the free routines make null, and dsm_free making its pointer null.
program test_fortran_bindings
  use, intrinsic :: iso_c_binding, only: c_associated, c_ptr, c_null_ptr, c_int8_t, c_int64_t, c_float, c_loc
  use mpi_f08
  use dsm
  implicit none
  integer :: rank, nprocs, failures, st, n, total
  type(MPI_Comm) :: comm
  type(dsm_mesh_t) :: mesh
  type(dsm_engine_t) :: engine
  type(dsm_param_desc_t), dimension(1) :: params
  real(c_float), dimension(4), target :: w
  type(c_ptr) :: cp
  integer(c_int64_t) :: nbytes
  character(len=256) :: dir
  logical :: have_hdf5

  failures = 0
  call MPI_Init()
  call MPI_Comm_rank(MPI_COMM_WORLD, rank)
  call MPI_Comm_size(MPI_COMM_WORLD, nprocs)

  ! ---------------------------------------------------------- dsm_mesh_flatten
  call dsm_mesh_create_dp_sp(MPI_COMM_WORLD, -1, 1, mesh)
  call dsm_mesh_flatten(mesh, ['data_parallel    ', 'sequence_parallel'], 'f08_all', comm, st)
  call MPI_Allreduce(1, total, 1, MPI_INTEGER, MPI_SUM, comm)
  call check(st == DSM_SUCCESS .and. total == nprocs, 'dsm_mesh_flatten with type(MPI_Comm) and ierr')
  call dsm_mesh_flatten(mesh, ['data_parallel'], 'f08_dp', ierr=st)
  call dsm_mesh_size(mesh, 'f08_dp', n)
  call check(st == DSM_SUCCESS .and. n == nprocs, 'dsm_mesh_flatten without comm, ierr by keyword (mpi_f08 program)')
  call dsm_mesh_flatten(mesh, ['data_parallel'], 'f08_dp_again')
  call dsm_mesh_size(mesh, 'f08_dp_again', n)
  call check(n == nprocs, 'dsm_mesh_flatten without comm and ierr (mpi_f08 program)')
  call dsm_mesh_flatten(mesh, ['no_such_dim'], 'f08_bad', ierr=st)
  call check_error(st, DSM_ERR_NOT_FOUND, 'no_such_dim', &
       'dsm_mesh_flatten without comm reports an unknown dimension through ierr')
  call dsm_mesh_flatten(mesh, ['no_such_dim'], 'f08_bad', comm, st)
  call check_error(st, DSM_ERR_NOT_FOUND, 'no_such_dim', &
       'dsm_mesh_flatten with type(MPI_Comm) reports an unknown dimension through ierr')

  ! ---------------------------------------------------------- dsm_free, handles
  call dsm_library_feature('hdf5', have_hdf5)
  w = [1.0_c_float, 2.0_c_float, 3.0_c_float, 4.0_c_float]
  params(1) = dsm_param_desc_t(name='w', shape=shape(w), init_values=c_loc(w))
  call dsm_engine_init(mesh, '{"train_micro_batch_size_per_gpu": 1, "optimizer": ' // &
       '{"type": "SGD", "params": {"lr": 0.5}}}', params, engine, st)
  call check(st == DSM_SUCCESS .and. c_associated(engine%ptr), 'dsm_engine_init')
  if (have_hdf5 .and. st == DSM_SUCCESS) then
     call temporary_directory(dir)
     call dsm_engine_save_checkpoint(engine, dir, 'b', [1_c_int8_t, 2_c_int8_t, 3_c_int8_t], st)
     call check(st == DSM_SUCCESS, 'dsm_engine_save_checkpoint with a client state')
     cp = c_null_ptr
     call dsm_engine_load_checkpoint(engine, dir, 'b', 0, cp, nbytes, st)
     call check(st == DSM_SUCCESS .and. c_associated(cp) .and. nbytes == 3, &
          'dsm_engine_load_checkpoint gives the C copy of the client state')
     call dsm_free(cp, st)
     call check(st == DSM_SUCCESS .and. .not. c_associated(cp), 'dsm_free makes the pointer null')
     call dsm_free(cp)
     call check(.not. c_associated(cp), 'dsm_free of the null pointer does nothing')
     call MPI_Barrier(MPI_COMM_WORLD)
     if (rank == 0) call execute_command_line('rm -rf ''' // trim(dir) // '''')
  end if
  call dsm_engine_free(engine, st)
  call check(st == DSM_SUCCESS .and. .not. c_associated(engine%ptr), 'dsm_engine_free makes the handle null')
  call dsm_mesh_free(mesh, st)
  call check(st == DSM_SUCCESS .and. .not. c_associated(mesh%ptr), 'dsm_mesh_free makes the handle null')

  call MPI_Finalize()
  if (failures > 0) error stop 1

contains

  include 'checks.inc'

  ! A new directory name under TMPDIR (else /tmp), the same on every rank.
  subroutine temporary_directory(dir)
    character(len=*), intent(out) :: dir
    character(len=256) :: base
    integer :: length, status
    integer(kind=8) :: clock

    dir = ''
    if (rank == 0) then
       call get_environment_variable('TMPDIR', base, length, status)
       if (status /= 0 .or. length == 0) base = '/tmp'
       call system_clock(clock)
       write(dir, '(2a,i0,a,i0)') trim(base), '/dsm-fortran-bindings-', nprocs, '-', clock
    end if
    call MPI_Bcast(dir, len(dir), MPI_CHARACTER, 0, MPI_COMM_WORLD)
  end subroutine temporary_directory

end program test_fortran_bindings
