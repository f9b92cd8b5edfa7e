! The Fortran bindings of the DeepSpeed configuration (module dsm) at any
! rank count: dsm_config_load of inline JSON over MPI_COMM_WORLD (integer and
! type(MPI_Comm)), the batch arithmetic, an invalid configuration reported
! through ierr on every rank, dsm_config_resolve without a job,
! dsm_config_describe, dsm_config_describe_lr, dsm_config_load_for_mesh over
! a dp x sp mesh, free.
!
! Every check is made on every rank and agreed with MPI_Allreduce, so all
! ranks run the same sequence; rank 0 prints "PASS: what" or "FAIL: what",
! and a failing rank prints its own detail. The program exits 0 when every
! check passed and with a nonzero status (error stop) otherwise.
! Run on one node (mpiexec -n 1, 2, 4, 8).
program test_fortran_config
  use, intrinsic :: iso_c_binding, only: c_associated, c_int64_t
  use mpi
  use mpi_f08, only: MPI_Comm
  use dsm
  implicit none

  character(len=*), parameter :: good = &
       '{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3}'
  character(len=*), parameter :: invalid = &
       '{"train_batch_size": 8, "zero_optimization": {"stage": 4}}'
  ! good, with an optimizer and a scheduler: it defines a learning rate.
  character(len=*), parameter :: with_lr = &
       '{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3, ' // &
       '"optimizer": {"type": "Adam", "params": {"lr": 0.001}}, ' // &
       '"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 5}}}'
  integer :: ierr, rank, nprocs, failures, st, dp, sp
  integer(c_int64_t) :: tbs, mbs, gas, dps, w
  character(len=:), allocatable :: s, text
  type(dsm_config_t) :: cfg, bad, cfg08, resolved, meshcfg, lrcfg
  type(dsm_mesh_t) :: mesh
  type(MPI_Comm) :: world08

  failures = 0
  call MPI_Init(ierr)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  call MPI_Comm_size(MPI_COMM_WORLD, nprocs, ierr)
  w = int(nprocs, c_int64_t)

  ! ---------------------------------------------------------- load, batch
  call check(.not. c_associated(cfg%ptr), 'a new configuration handle is null')
  call dsm_config_load(MPI_COMM_WORLD, good, 0, cfg, st)
  call check(st == DSM_SUCCESS .and. c_associated(cfg%ptr), 'dsm_config_load of inline JSON')
  tbs = -1
  mbs = -1
  gas = -1
  dps = -1
  call dsm_config_batch(cfg, tbs, mbs, gas, dps, st)
  call check(st == DSM_SUCCESS .and. tbs == 6 * w, 'train_batch_size = 2 * 3 * size')
  call check(mbs == 2 .and. gas == 3 .and. dps == w, &
       'micro batch 2, accumulation steps 3, data-parallel size = size')
  tbs = -1
  call dsm_config_batch(cfg, train_batch_size=tbs)
  call check(tbs == 6 * w, 'dsm_config_batch with one output and no ierr')
  gas = -1
  call dsm_config_batch(cfg, gradient_accumulation_steps=gas, ierr=st)
  call check(st == DSM_SUCCESS .and. gas == 3, 'dsm_config_batch with keyword outputs and ierr')

  world08%MPI_VAL = MPI_COMM_WORLD
  call dsm_config_load(world08, good, DSM_CONFIG_STRICT, cfg08, st)
  tbs = -1
  if (st == DSM_SUCCESS) call dsm_config_batch(cfg08, train_batch_size=tbs)
  call check(st == DSM_SUCCESS .and. tbs == 6 * w, 'dsm_config_load with type(MPI_Comm), strict')
  call dsm_config_free(cfg08)

  ! ---------------------------------------------------------- an invalid configuration
  call dsm_config_load(MPI_COMM_WORLD, invalid, 0, bad, st)
  call check(st == DSM_ERR_CONFIG, 'zero_optimization.stage 4 gives DSM_ERR_CONFIG on every rank')
  s = dsm_last_error()
  call check(index(s, 'zero_optimization.stage') > 0, 'dsm_last_error() names zero_optimization.stage')
  if (index(s, 'zero_optimization.stage') == 0) write(*, '(a,i0,2a)') 'rank ', rank, ': last error: ', s
  call check(.not. c_associated(bad%ptr), 'the failed configuration handle is null')
  call dsm_config_load(MPI_COMM_WORLD, good, 2, bad, st)
  call check(st == DSM_ERR_INVALID_ARGUMENT .and. .not. c_associated(bad%ptr), &
       'unknown flags give DSM_ERR_INVALID_ARGUMENT')

  ! ---------------------------------------------------------- resolve (not collective)
  call dsm_config_resolve(good, 8_c_int64_t, 4_c_int64_t, 0, resolved, st)
  tbs = -1
  dps = -1
  if (st == DSM_SUCCESS) call dsm_config_batch(resolved, tbs, data_parallel_size=dps)
  call check(st == DSM_SUCCESS .and. dps == 4 .and. tbs == 24, &
       'dsm_config_resolve, world 8, data_parallel 4: train_batch_size 24')
  call dsm_config_resolve(good, 0_c_int64_t, 0_c_int64_t, 0, bad, st)
  call check(st == DSM_ERR_INVALID_ARGUMENT .and. .not. c_associated(bad%ptr), &
       'dsm_config_resolve of world size 0 gives DSM_ERR_INVALID_ARGUMENT')
  call dsm_config_free(resolved, st)
  call check(st == DSM_SUCCESS .and. .not. c_associated(resolved%ptr), 'dsm_config_free of the resolved one')

  ! ---------------------------------------------------------- describe
  call dsm_config_describe(cfg, DSM_FORMAT_TEXT, text, st)
  call check(st == DSM_SUCCESS .and. index(text, 'train_batch_size') > 0, &
       'dsm_config_describe(DSM_FORMAT_TEXT) names train_batch_size')
  call dsm_config_describe(cfg, DSM_FORMAT_JSON, text)
  call check(len(text) > 0 .and. text(1:1) == '{' .and. index(text, 'train_batch_size') > 0, &
       'dsm_config_describe(DSM_FORMAT_JSON) is a JSON document')
  call dsm_config_describe(cfg, 7, text, st)
  call check(st == DSM_ERR_INVALID_ARGUMENT, 'dsm_config_describe of an unknown format')
  call dsm_config_load(MPI_COMM_WORLD, with_lr, 0, lrcfg, st)
  call check(st == DSM_SUCCESS, 'dsm_config_load of a configuration with an optimizer and a scheduler')
  call dsm_config_describe_lr(lrcfg, 10_c_int64_t, DSM_FORMAT_JSON, text, st)
  call check(st == DSM_SUCCESS .and. index(text, 'dsm-lr') > 0 .and. index(text, 'WarmupLR') > 0, &
       'dsm_config_describe_lr of 10 steps is the dsm-lr JSON document')
  if (index(text, 'dsm-lr') == 0) write(*, '(a,i0,2a)') 'rank ', rank, ': last error: ', dsm_last_error()
  call dsm_config_describe_lr(cfg, 10_c_int64_t, DSM_FORMAT_JSON, text, st)
  call check(st == DSM_ERR_CONFIG .and. index(dsm_last_error(), 'optimizer') > 0, &
       'dsm_config_describe_lr without an optimizer or a scheduler gives DSM_ERR_CONFIG')
  call dsm_config_describe_lr(lrcfg, -1_c_int64_t, DSM_FORMAT_JSON, text, st)
  call check(st == DSM_ERR_INVALID_ARGUMENT, 'dsm_config_describe_lr of -1 steps')

  ! ---------------------------------------------------------- load for a mesh
  ! size/2 x 2 when the size is even, else size x 1.
  if (mod(nprocs, 2) == 0) then
     dp = nprocs / 2
     sp = 2
  else
     dp = nprocs
     sp = 1
  end if
  call dsm_mesh_create_dp_sp(MPI_COMM_WORLD, dp, sp, mesh)
  call dsm_config_load_for_mesh(mesh, good, 0, meshcfg, st)
  tbs = -1
  dps = -1
  if (st == DSM_SUCCESS) call dsm_config_batch(meshcfg, tbs, data_parallel_size=dps)
  call check(st == DSM_SUCCESS .and. dps == dp .and. tbs == 6 * int(dp, c_int64_t), &
       'dsm_config_load_for_mesh: W is the data_parallel size of a dp x sp mesh')
  call dsm_config_load_for_mesh(mesh, invalid, 0, bad, st)
  call check(st == DSM_ERR_CONFIG .and. .not. c_associated(bad%ptr), &
       'dsm_config_load_for_mesh of an invalid configuration gives DSM_ERR_CONFIG')
  call dsm_config_free(meshcfg)
  call dsm_config_free(lrcfg)
  call dsm_mesh_free(mesh)

  ! ---------------------------------------------------------- free
  call dsm_config_free(cfg, st)
  call check(st == DSM_SUCCESS .and. .not. c_associated(cfg%ptr), 'dsm_config_free makes the handle null')
  call dsm_config_free(cfg, st)
  call check(st == DSM_SUCCESS, 'dsm_config_free of a null handle does nothing')
  call dsm_config_batch(cfg, tbs, ierr=st)
  call check(st == DSM_ERR_NULL_POINTER, 'dsm_config_batch of a null handle gives DSM_ERR_NULL_POINTER')

  call MPI_Finalize(ierr)
  if (failures > 0) then
     if (rank == 0) write(*, '(a,i0,a)') 'FAIL: ', failures, ' check(s) failed'
     error stop 1
  end if
  if (rank == 0) write(*, '(a)') 'PASS: all checks'

contains

  include 'checks.inc'

end program test_fortran_config
