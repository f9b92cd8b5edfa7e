! The engine's options in the Fortran bindings (module dsm) at any rank
! count: the default initialization of type(dsm_engine_options_t) is
! DSM_ENGINE_OPTIONS_INITIALIZER; DSM_DEVICE_HOST gives a host engine that
! dsm_engine_device reports and that steps; DSM_DEVICE_DEFAULT gives an
! engine on a real device (host, or CUDA where every rank has one), on a null
! mesh and on a mesh; a bad device, backend, cuda_device or size is
! DSM_ERR_INVALID_ARGUMENT on every rank naming the field and value, also
! when one rank alone passes it; a stream on a host engine is
! DSM_ERR_NOT_SUPPORTED and its stream is null; on the simulated device the
! real(c_float) pointer forms are refused with a message naming the
! type(c_ptr) form, which works. dsm_engine_init_comm_with_options
! gives a host engine over a communicator; on it (ZeRO-3, nothing persistent)
! the element ranges of a parameter and its gradient: a range's values, a
! bad range on the last rank failing every rank (the acquire is collective),
! a release of a range that is not acquired.
!
! Every check is made on every rank and agreed with MPI_Allreduce; rank 0
! prints "PASS: what" or "FAIL: what", and a failing rank prints its own
! detail. The program exits 0 when every check passed and with a nonzero
! status (error stop) otherwise. Run on one node (mpiexec -n 1, 2, 4, 8).
program test_fortran_engine_options
  use, intrinsic :: iso_c_binding
  use mpi
  use dsm
  implicit none

  integer :: ierr, rank, nprocs, failures, st, device
  type(dsm_param_desc_t), dimension(2) :: params
  type(dsm_engine_options_t) :: opts
  type(dsm_engine_t) :: engine
  type(dsm_mesh_t) :: mesh
  type(dsm_step_info_t) :: info
  type(c_ptr) :: stream, ptr
  real(c_float), dimension(:), pointer :: p1
  real(c_float), dimension(:,:), pointer :: p2
  real(c_float), dimension(4, 3), target :: w0
  real(c_float), dimension(:), pointer :: slice
  type(c_ptr) :: p
  integer(c_int64_t) :: off
  character(len=*), parameter :: CFG = '{"train_micro_batch_size_per_gpu": 1, "zero_optimization": ' // &
       '{"stage": 2, "reduce_bucket_size": 8}, "optimizer": {"type": "SGD", "params": {"lr": 0.5}}}'
  character(len=*), parameter :: CFG3 = '{"train_micro_batch_size_per_gpu": 1, "zero_optimization": ' // &
       '{"stage": 3, "reduce_bucket_size": 4, "stage3_param_persistence_threshold": 0}, ' // &
       '"optimizer": {"type": "SGD", "params": {"lr": 0.5}}}'

  failures = 0
  call MPI_Init(ierr)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  call MPI_Comm_size(MPI_COMM_WORLD, nprocs, ierr)
  w0 = 1.0
  params(1) = dsm_param_desc_t(name='w', shape=shape(w0), init_values=c_loc(w0))
  params(2) = dsm_param_desc_t(name='b', shape=[3])

  ! ---------------------------------------------------------- defaults
  call check(opts%size == DSM_ENGINE_OPTIONS_SIZE .and. DSM_ENGINE_OPTIONS_SIZE == c_sizeof(opts) .and. &
       opts%device == DSM_DEVICE_DEFAULT .and. opts%backend == DSM_BACKEND_DEFAULT .and. &
       opts%cuda_device == -1, 'default initialization is DSM_ENGINE_OPTIONS_INITIALIZER')

  ! ---------------------------------------------------------- host
  ! A null mesh is an error; the configuration's mesh over the world (type(MPI_Comm) form) is explicit.
  call dsm_engine_init_with_options(mesh, CFG, params, dsm_engine_options_t(device=DSM_DEVICE_HOST), engine, st)
  call check(st == DSM_ERR_NULL_POINTER .and. .not. c_associated(engine%ptr), 'a null mesh: DSM_ERR_NULL_POINTER')
  call dsm_mesh_create_for_config(MPI_COMM_WORLD, CFG, mesh, st)
  call check(st == DSM_SUCCESS, 'dsm_mesh_create_for_config')
  call dsm_engine_init_with_options(mesh, CFG, params, dsm_engine_options_t(device=DSM_DEVICE_HOST), engine, st)
  call dsm_mesh_free(mesh)
  call check(st == DSM_SUCCESS .and. c_associated(engine%ptr), 'DSM_DEVICE_HOST: engine created')
  device = -1
  call dsm_engine_device(engine, device, st)
  call check(st == DSM_SUCCESS .and. device == DSM_DEVICE_HOST, 'DSM_DEVICE_HOST: dsm_engine_device')
  call one_step(engine, 'DSM_DEVICE_HOST')

  ! A stream needs a device-resident engine.
  stream = transfer(int(4660, c_intptr_t), stream)
  call dsm_engine_set_stream(engine, stream, st)
  call check_error(st, DSM_ERR_NOT_SUPPORTED, 'host', 'dsm_engine_set_stream on a host engine')
  call dsm_engine_stream(engine, stream, st)
  call check(st == DSM_SUCCESS .and. .not. c_associated(stream), 'dsm_engine_stream on a host engine: null')
  call dsm_engine_free(engine, st)
  call check(st == DSM_SUCCESS .and. .not. c_associated(engine%ptr), 'DSM_DEVICE_HOST: dsm_engine_free')

  ! ---------------------------------------------------------- simulated device
  ! A device-resident engine hands out device memory: the real(c_float)
  ! pointer forms refuse it on every rank, with ierr as without it through
  ! dsm_last_error(), naming the type(c_ptr) form, which works.
  call dsm_mesh_create_for_config(MPI_COMM_WORLD, CFG, mesh)
  call dsm_engine_init_with_options(mesh, CFG, params, dsm_engine_options_t(device=DSM_DEVICE_SIMULATED), engine, st)
  call dsm_mesh_free(mesh)
  call check(st == DSM_SUCCESS .and. c_associated(engine%ptr), 'DSM_DEVICE_SIMULATED: engine created')
  call dsm_engine_param_acquire(engine, 0, p1, st)
  call check_error(st, DSM_ERR_INVALID_ARGUMENT, &
       'dsm_engine_param_acquire: the engine is device-resident (simulated device)', &
       'DSM_DEVICE_SIMULATED: the rank-1 real(c_float) parameter form is refused')
  call check(.not. associated(p1) .and. index(dsm_last_error(), 'use the type(c_ptr) form') > 0, &
       'DSM_DEVICE_SIMULATED: the message names the type(c_ptr) form')
  call dsm_engine_param_acquire(engine, 0, p2, shape(w0), st)
  call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'dsm_engine_param_acquire: the engine is device-resident', &
       'DSM_DEVICE_SIMULATED: the rank-2 real(c_float) parameter form is refused')
  call dsm_engine_grad_acquire(engine, 0, p1, st)
  call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'dsm_engine_grad_acquire: the engine is device-resident', &
       'DSM_DEVICE_SIMULATED: the rank-1 real(c_float) gradient form is refused')
  call dsm_engine_grad_acquire(engine, 0, p2, shape(w0), st)
  call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'dsm_engine_grad_acquire: the engine is device-resident', &
       'DSM_DEVICE_SIMULATED: the rank-2 real(c_float) gradient form is refused')
  ptr = c_null_ptr
  call dsm_engine_param_acquire(engine, 0, ptr, st)
  call check(st == DSM_SUCCESS .and. c_associated(ptr), 'DSM_DEVICE_SIMULATED: the type(c_ptr) form works')
  call dsm_engine_param_release(engine, 0, st)
  call check(st == DSM_SUCCESS, 'DSM_DEVICE_SIMULATED: nothing else was left acquired')
  call one_step(engine, 'DSM_DEVICE_SIMULATED')
  call dsm_engine_free(engine, st)
  call check(st == DSM_SUCCESS, 'DSM_DEVICE_SIMULATED: dsm_engine_free')
  ! ---------------------------------------------------------- over a communicator, ranges
  call dsm_engine_init_comm_with_options(MPI_COMM_WORLD, CFG3, params, dsm_engine_options_t(device=DSM_DEVICE_HOST), &
       engine, st)
  call check(st == DSM_SUCCESS .and. c_associated(engine%ptr), 'dsm_engine_init_comm_with_options: engine created')
  device = -1
  call dsm_engine_device(engine, device, st)
  call check(st == DSM_SUCCESS .and. device == DSM_DEVICE_HOST, 'dsm_engine_init_comm_with_options: a host engine')
  call dsm_engine_param_acquire_range(engine, 0, 4_c_int64_t, 4_c_int64_t, p, st)
  call check(st == DSM_SUCCESS .and. c_associated(p), 'dsm_engine_param_acquire_range')
  if (st == DSM_SUCCESS) then
     call c_f_pointer(p, slice, [4])
     call check(all(slice == 1.0), 'dsm_engine_param_acquire_range: the values of the range')
  end if
  call dsm_engine_param_release_range(engine, 0, 4_c_int64_t, 4_c_int64_t, st)
  call check(st == DSM_SUCCESS, 'dsm_engine_param_release_range')
  call dsm_engine_param_release_range(engine, 0, 4_c_int64_t, 4_c_int64_t, st)
  call check_error(st, DSM_ERR_STATE, 'is not acquired', 'dsm_engine_param_release_range twice')
  off = 0
  if (rank == nprocs - 1) off = 10
  call dsm_engine_param_acquire_range(engine, 0, off, 4_c_int64_t, p, st)
  call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'is not inside parameter', &
       'a bad range on the last rank: DSM_ERR_INVALID_ARGUMENT on every rank')
  call dsm_engine_grad_acquire_range(engine, 0, 8_c_int64_t, 4_c_int64_t, p, st)
  call check(st == DSM_SUCCESS .and. c_associated(p), 'dsm_engine_grad_acquire_range')
  call dsm_engine_grad_release_range(engine, 0, 8_c_int64_t, 4_c_int64_t, st)
  call check(st == DSM_SUCCESS, 'dsm_engine_grad_release_range')
  call dsm_step(engine, info, st)
  call check(st == DSM_SUCCESS, 'dsm_step after ranges')
  call dsm_engine_free(engine, st)

  ! ---------------------------------------------------------- default, on a mesh
  call dsm_mesh_create(MPI_COMM_WORLD, [nprocs], ['data_parallel'], mesh)
  call dsm_engine_init_with_options(mesh, CFG, params, opts, engine, st)
  call dsm_mesh_free(mesh)
  call check(st == DSM_SUCCESS .and. c_associated(engine%ptr), 'DSM_DEVICE_DEFAULT on a mesh: engine created')
  device = -1
  call dsm_engine_device(engine, device, st)
  call check(st == DSM_SUCCESS .and. (device == DSM_DEVICE_HOST .or. device == DSM_DEVICE_CUDA), &
       'DSM_DEVICE_DEFAULT: a host or CUDA engine')
  call one_step(engine, 'DSM_DEVICE_DEFAULT')
  call dsm_engine_free(engine, st)

  ! ---------------------------------------------------------- bad fields
  call expect_bad(dsm_engine_options_t(device=99), -1, 'options->device is 99', 'device 99')
  call expect_bad(dsm_engine_options_t(device=99), nprocs - 1, 'options->device is 99', 'device 99 on the last rank')
  call expect_bad(dsm_engine_options_t(backend=99), -1, 'options->backend is 99', 'backend 99')
  call expect_bad(dsm_engine_options_t(cuda_device=-2), -1, 'options->cuda_device is -2', 'cuda_device -2')
  call expect_bad(dsm_engine_options_t(size=0_c_size_t), -1, 'options->size is 0', 'size 0')

  ! engine is null again after dsm_engine_free.
  call dsm_engine_device(engine, device, st)
  call check(st == DSM_ERR_NULL_POINTER, 'dsm_engine_device on a null engine: DSM_ERR_NULL_POINTER')

  call MPI_Finalize(ierr)
  if (failures > 0) then
     if (rank == 0) write(*, '(a,i0,a)') 'FAIL: ', failures, ' check(s) failed'
     error stop 1
  end if
  if (rank == 0) write(*, '(a)') 'PASS: all checks'

contains

  include 'checks.inc'

  ! One micro-step (a zero gradient on w): the engine works.
  subroutine one_step(e, what)
    type(dsm_engine_t), intent(in) :: e
    character(len=*), intent(in) :: what
    type(c_ptr) :: g
    integer :: s1, s2, s3

    g = c_null_ptr
    call dsm_engine_grad_acquire(e, 0, g, s1)
    call dsm_engine_grad_release(e, 0, s2)
    call dsm_step(e, info, s3)
    call check(s1 == DSM_SUCCESS .and. s2 == DSM_SUCCESS .and. s3 == DSM_SUCCESS .and. &
         info%micro_steps == 1, what // ': one step')
  end subroutine one_step

  ! Options bad on bad_rank (-1: every rank), the defaults elsewhere: every
  ! rank fails with DSM_ERR_INVALID_ARGUMENT and text, the engine null.
  subroutine expect_bad(bad, bad_rank, text, what)
    type(dsm_engine_options_t), intent(in) :: bad
    integer, intent(in) :: bad_rank
    character(len=*), intent(in) :: text, what
    type(dsm_engine_options_t) :: o
    type(dsm_engine_t) :: e
    type(dsm_mesh_t) :: world_mesh
    integer :: s

    o = dsm_engine_options_t(device=DSM_DEVICE_HOST)
    if (bad_rank < 0 .or. bad_rank == rank) o = bad
    call dsm_mesh_create_for_config(MPI_COMM_WORLD, CFG, world_mesh)
    call dsm_engine_init_with_options(world_mesh, CFG, params, o, e, s)
    call dsm_mesh_free(world_mesh)
    call check_error(s, DSM_ERR_INVALID_ARGUMENT, text, what // ': DSM_ERR_INVALID_ARGUMENT on every rank')
    call check(.not. c_associated(e%ptr), what // ': no engine')
  end subroutine expect_bad

end program test_fortran_engine_options
