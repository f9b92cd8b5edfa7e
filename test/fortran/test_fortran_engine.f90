! The Fortran bindings of the training engine (module dsm) at any rank count:
! dsm_convert and dsm_free; an engine over MPI_COMM_WORLD at ZeRO stages 0-3
! (built four ways: the configuration's mesh, integer communicator, type(MPI_Comm), a mesh)
! with a matrix parameter initialized from a Fortran array, a vector from a
! Fortran init_fn, a float64 scalar and a frozen vector; the parameters read
! back through every pointer form (a rank-2 pointer sees the Fortran array
! itself); one SGD step whose result, gradient norm and counters are checked
! against the mean of the ranks' gradients computed here; gradient
! accumulation; bf16 and fp16 engines; describe and the engine's mesh; bad
! arguments with the status and message on every rank; and, when the
! library has HDF5, a checkpoint save and load round trip (byte and text
! client state, the default tag, another ZeRO stage) in a temporary
! directory.
!
! Every check is made on every rank and agreed with MPI_Allreduce, so all
! ranks run the same sequence; rank 0 prints "PASS: what" or "FAIL: what",
! and a failing rank prints its own detail. The program exits 0 when every
! check passed and with a nonzero status (error stop) otherwise.
! Run on one node (mpiexec -n 1, 2, 4, 8).
program test_fortran_engine
  use, intrinsic :: iso_c_binding
  use mpi
  use mpi_f08, only: MPI_Comm
  use dsm
  implicit none

  ! The init_fn callbacks, after the program.
  procedure(dsm_param_init_fn) :: vector_init, failing_init

  integer, parameter :: NW1 = 4, NW2 = 3, NB = 4, NF = 5
  integer, parameter :: IW = 0, IB = 1, IS = 2, IFR = 3
  real(c_double), parameter :: LR = 0.125d0
  integer :: ierr, rank, nprocs, failures, st, stage, n, idx, dtype, i
  integer(c_int64_t) :: numel
  real(c_float), dimension(NW1, NW2), target :: w0, gw, expect_w
  real(c_float), dimension(NB) :: gb, expect_b, b0
  real(c_float), dimension(NF), target :: f0
  real(c_double), target :: s0
  real(c_float) :: gs, expect_s
  real(c_double) :: mean_factor, norm, scale
  type(dsm_param_desc_t), dimension(4) :: params
  type(dsm_param_desc_t), dimension(:), allocatable :: bad
  type(dsm_engine_t) :: engine, other
  type(dsm_mesh_t) :: mesh, emesh
  type(dsm_step_info_t) :: info
  type(MPI_Comm) :: world08
  real(c_float), dimension(:), pointer :: p1
  real(c_float), dimension(:,:), pointer :: p2
  integer, dimension(:), allocatable :: dims
  type(c_ptr) :: cp
  character(len=:), allocatable :: text, cfg
  character(len=32) :: what
  logical :: ok, have_hdf5
  ! failing_init's user data: this rank and the rank it fails on.
  integer(c_int), dimension(2), target :: fail_at

  failures = 0
  call MPI_Init(ierr)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  call MPI_Comm_size(MPI_COMM_WORLD, nprocs, ierr)
  fail_at = [int(rank, c_int), -1_c_int]
  world08%MPI_VAL = MPI_COMM_WORLD

  call test_convert()

  ! ---------------------------------------------------------- the model
  ! w(4, 3) from a Fortran array, b from init_fn (index 1: 1 + 0.5 k), a
  ! float64 scalar, a frozen vector. Dyadic values: every sum, mean and SGD
  ! update below is exact in fp32.
  do i = 1, NW2
     do n = 1, NW1
        w0(n, i) = real(n + 10 * i, c_float) / 8
        gw(n, i) = real(n - 2 * i, c_float) / 16
     end do
  end do
  b0 = [(1.0 + 0.5 * real(i - 1), i = 1, NB)]
  gb = [(real(i, c_float) / 4, i = 1, NB)]
  s0 = 2.0d0
  gs = 0.5
  f0 = [(-real(i, c_float), i = 1, NF)]
  call describe_model(params)
  ! Each rank adds (rank + 1) * g; the engine averages over the data-parallel
  ! ranks: the mean factor is (nprocs + 1) / 2.
  mean_factor = real(nprocs + 1, c_double) / 2
  expect_w = real(w0 - LR * mean_factor * gw, c_float)
  expect_b = real(b0 - LR * mean_factor * gb, c_float)
  expect_s = real(s0 - LR * mean_factor * gs, c_float)
  norm = mean_factor * sqrt(sum(real(gw, c_double)**2) + sum(real(gb, c_double)**2) + real(gs, c_double)**2)

  ! ---------------------------------------------------------- ZeRO stages 0-3
  do stage = 0, 3
     write(what, '(a,i0)') 'stage ', stage
     cfg = sgd_config(stage, 1, '')
     select case (stage)
     case (0)
        ! A null mesh is an error on every rank; the configuration's mesh over the world is explicit.
        call dsm_engine_init(mesh, cfg, params, engine, st)
        call check(st == DSM_ERR_NULL_POINTER .and. .not. c_associated(engine%ptr), &
             'dsm_engine_init with a null mesh: DSM_ERR_NULL_POINTER')
        call dsm_mesh_create_for_config(MPI_COMM_WORLD, cfg, mesh, st)
        call check(st == DSM_SUCCESS, 'dsm_mesh_create_for_config over MPI_COMM_WORLD')
        call dsm_engine_init(mesh, cfg, params, engine, st)
        call dsm_mesh_free(mesh)  ! the engine keeps its own reference
     case (1)
        call dsm_engine_init_comm(MPI_COMM_WORLD, cfg, params, engine, st)
     case (2)
        call dsm_engine_init_comm(world08, cfg, params, engine, st)
     case default
        call dsm_mesh_create(MPI_COMM_WORLD, [nprocs], ['data_parallel'], mesh)
        call dsm_engine_init(mesh, cfg, params, engine, st)
        call dsm_mesh_free(mesh)  ! the engine keeps its own reference
     end select
     call check(st == DSM_SUCCESS .and. c_associated(engine%ptr), trim(what) // ': engine created')
     if (st /= DSM_SUCCESS) cycle

     call dsm_engine_num_params(engine, n)
     call dsm_engine_param_index(engine, 'frozen', idx)
     call check(n == 4 .and. idx == IFR, trim(what) // ': 4 parameters, "frozen" has index 3')
     ok = .true.
     call dsm_engine_param_numel(engine, IW, numel)
     if (numel /= NW1 * NW2) ok = .false.
     call dsm_engine_param_numel(engine, IS, numel)
     if (numel /= 1) ok = .false.
     call dsm_engine_dtype(engine, dtype)
     if (dtype /= DSM_FLOAT32) ok = .false.
     call dsm_engine_loss_scale(engine, scale)
     if (scale /= 1.0d0) ok = .false.
     call check(ok, trim(what) // ': numel, dtype float32, loss scale 1')

     call check_values(engine, w0, b0, real(s0, c_float), trim(what) // ': initial values')

     ! Backward: gradients in reverse order, each rank (rank + 1) * g.
     call dsm_engine_grad_acquire(engine, IS, p1)
     p1(1) = p1(1) + real(rank + 1, c_float) * gs
     call dsm_engine_grad_release(engine, IS)
     call dsm_engine_grad_acquire(engine, IB, p1)
     call check(size(p1) == NB, trim(what) // ': grad_acquire gives numel elements')
     p1 = p1 + real(rank + 1, c_float) * gb
     call dsm_engine_grad_release(engine, IB)
     call dsm_engine_grad_acquire(engine, IW, p2, [NW1, NW2])
     p2 = p2 + real(rank + 1, c_float) * gw
     call dsm_engine_grad_release(engine, IW)
     info = dsm_step_info_t()
     call dsm_step(engine, info, st)
     call check(st == DSM_SUCCESS, trim(what) // ': dsm_step')
     call check(info%size == DSM_STEP_INFO_SIZE .and. info%boundary == 1 .and. info%skipped == 0 .and. &
          info%global_steps == 1 .and. info%micro_steps == 1 .and. info%skipped_steps == 0 .and. &
          info%global_samples == nprocs, trim(what) // ': step info counters')
     call check(info%lr == LR .and. info%loss_scale == 1.0d0 .and. abs(info%grad_norm - norm) <= 1d-6 * norm, &
          trim(what) // ': step info lr, loss scale and gradient norm')
     if (abs(info%grad_norm - norm) > 1d-6 * norm) write(*, '(a,i0,a,2es24.16)') 'rank ', rank, &
          ': grad_norm, expected: ', info%grad_norm, norm
     call check_values(engine, expect_w, expect_b, expect_s, trim(what) // ': values after one SGD step')
     info = dsm_step_info_t()
     call dsm_engine_step_info(engine, info)
     call check(info%micro_steps == 1 .and. info%global_steps == 1 .and. info%boundary == 1 .and. &
          abs(info%grad_norm - norm) <= 1d-6 * norm, trim(what) // ': dsm_engine_step_info')

     call dsm_engine_describe(engine, DSM_FORMAT_JSON, text)
     write(what, '(a,i0)') '"zero_stage":', stage
     call check(index(text, trim(what)) > 0, 'describe (JSON) gives ' // trim(what))
     call dsm_engine_describe(engine, DSM_FORMAT_TEXT, text)
     write(what, '(a,i0)') 'ZeRO stage ', stage
     call check(index(text, trim(what)) > 0, 'describe (text) says ' // trim(what))
     call dsm_engine_borrow_mesh(engine, emesh)
     call dsm_mesh_size(emesh, 'data_parallel', n)
     call check(n == nprocs, trim(what) // ': the engine''s mesh is all data parallel')

     call dsm_engine_free(engine, st)
     call check(st == DSM_SUCCESS .and. .not. c_associated(engine%ptr), trim(what) // ': dsm_engine_free')
  end do

  ! The tests below build their engines on the whole job, one data_parallel dimension.
  call dsm_mesh_create(MPI_COMM_WORLD, [nprocs], ['data_parallel'], mesh)

  call test_accumulation()
  call test_precisions()
  call test_f32_helpers()
  call dsm_library_feature('hdf5', have_hdf5)
  call test_loop_helpers()
  call test_errors()
  call test_state_errors()
  call dsm_library_feature('hdf5', have_hdf5)
  call test_checkpoint()
  call dsm_mesh_free(mesh)

  call MPI_Finalize(ierr)
  if (failures > 0) then
     if (rank == 0) write(*, '(a,i0,a)') 'FAIL: ', failures, ' check(s) failed'
     error stop 1
  end if
  if (rank == 0) write(*, '(a)') 'PASS: all checks'

contains

  include 'checks.inc'

  ! The model's four parameters.
  subroutine describe_model(p)
    type(dsm_param_desc_t), dimension(4), intent(out) :: p

    p(1) = dsm_param_desc_t(name='fc.weight', shape=shape(w0), init_values=c_loc(w0))
    p(2) = dsm_param_desc_t(name='fc.bias', shape=[NB], no_weight_decay=.true., init_fn=vector_init)
    p(3) = dsm_param_desc_t(name='scale', dtype=DSM_FLOAT64, init_values=c_loc(s0))
    p(4) = dsm_param_desc_t(name='frozen', shape=[NF], trainable=.false., init_values=c_loc(f0))
  end subroutine describe_model

  ! An SGD configuration (lr 0.125, no clipping) at a ZeRO stage, with
  ! gas accumulation steps and more keys in extra ("" or starting with ',').
  function sgd_config(stage, gas, extra) result(c)
    integer, intent(in) :: stage, gas
    character(len=*), intent(in) :: extra
    character(len=:), allocatable :: c
    character(len=16) :: s, g

    write(s, '(i0)') stage
    write(g, '(i0)') gas
    c = '{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": ' // trim(g) // &
         ', "steps_per_print": 1000000, "gradient_clipping": 0, "zero_optimization": {"stage": ' // &
         trim(s) // ', "reduce_bucket_size": 8, "stage3_param_persistence_threshold": 0}, ' // &
         '"optimizer": {"type": "SGD", "params": {"lr": 0.125}}' // extra // '}'
  end function sgd_config

  ! Every parameter read back through a different pointer form: w as a
  ! rank-2 pointer (the Fortran array itself), b as a rank-1 pointer, the
  ! scalar as type(c_ptr) with dsm_convert, frozen as a rank-1 pointer.
  subroutine check_values(e, w, b, s, what)
    type(dsm_engine_t), intent(in) :: e
    real(c_float), dimension(NW1, NW2), intent(in) :: w
    real(c_float), dimension(NB), intent(in) :: b
    real(c_float), intent(in) :: s
    character(len=*), intent(in) :: what
    real(c_float), dimension(:,:), pointer :: q2
    real(c_float), dimension(:), pointer :: q1
    real(c_float), dimension(1) :: sv
    type(c_ptr) :: q
    integer :: dt
    logical :: good

    good = .true.
    call dsm_engine_param_acquire(e, IW, q2, [NW1, NW2])
    if (any(shape(q2) /= [NW1, NW2])) then
       good = .false.
    else if (any(abs(q2 - w) > 1e-6)) then
       good = .false.
       write(*, '(a,i0,a,12f9.4)') 'rank ', rank, ': w = ', q2
    end if
    call dsm_engine_param_release(e, IW)
    call dsm_engine_param_acquire(e, IB, q1)
    if (size(q1) /= NB) then
       good = .false.
    else if (any(abs(q1 - b) > 1e-6)) then
       good = .false.
       write(*, '(a,i0,a,4f9.4)') 'rank ', rank, ': b = ', q1
    end if
    call dsm_engine_param_release(e, IB)
    call dsm_engine_param_acquire(e, IS, q)
    call dsm_engine_dtype(e, dt)
    call dsm_convert(q, dt, sv)
    if (abs(sv(1) - s) > 1e-6) good = .false.
    call dsm_engine_param_release(e, IS)
    call dsm_engine_param_acquire(e, IFR, q1)
    if (any(q1 /= f0)) good = .false.
    call dsm_engine_param_release(e, IFR)
    call check(good, what)
  end subroutine check_values

  ! Add (rank + 1) * g to every trainable gradient, in backward order.
  subroutine backward(e)
    type(dsm_engine_t), intent(in) :: e
    real(c_float), dimension(:), pointer :: q1
    real(c_float), dimension(:,:), pointer :: q2

    call dsm_engine_grad_acquire(e, IS, q1)
    q1(1) = q1(1) + real(rank + 1, c_float) * gs
    call dsm_engine_grad_release(e, IS)
    call dsm_engine_grad_acquire(e, IB, q1)
    q1 = q1 + real(rank + 1, c_float) * gb
    call dsm_engine_grad_release(e, IB)
    call dsm_engine_grad_acquire(e, IW, q2, shape(gw))
    q2 = q2 + real(rank + 1, c_float) * gw
    call dsm_engine_grad_release(e, IW)
  end subroutine backward

  ! ---------------------------------------------------------- dsm_convert, dsm_free
  subroutine test_convert()
    real(c_float), dimension(2, 3) :: x, y
    integer(c_int16_t), dimension(6), target :: half
    real(c_double), dimension(6), target :: dbl
    real(c_float), dimension(6), target :: flat

    x = reshape([1.5, -2.0, 0.15625, 96.0, -0.0, 3.0], [2, 3])
    call dsm_convert(x, c_loc(half), DSM_BFLOAT16, st)
    ! bfloat16 is the upper half of binary32: 1.5 = 0x3FC0 (16320), -2 =
    ! 0xC000 (-16384 as int16).
    call check(st == DSM_SUCCESS .and. half(1) == 16320_c_int16_t .and. half(2) == -16384_c_int16_t, &
         'dsm_convert float32 -> bfloat16 bits')
    y = 0
    call dsm_convert(c_loc(half), DSM_BFLOAT16, y, st)
    call check(st == DSM_SUCCESS .and. all(y == x), 'dsm_convert bfloat16 -> float32 round trip')
    call dsm_convert(x, c_loc(half), DSM_FLOAT16, st)
    ! binary16 1.5 = 0x3E00 (15872).
    call check(st == DSM_SUCCESS .and. half(1) == 15872_c_int16_t, 'dsm_convert float32 -> float16 bits')
    dbl = [1d0, 1d0 + 2d0**(-30), -4.5d0, 0d0, 1d300, 0.1d0]
    call dsm_convert(c_loc(dbl), DSM_FLOAT64, c_loc(flat), DSM_FLOAT32, 6_c_int64_t, st)
    call check(st == DSM_SUCCESS .and. flat(1) == 1.0 .and. flat(2) == 1.0 .and. flat(3) == -4.5 .and. &
         flat(5) > huge(1.0_c_float) .and. flat(6) == real(0.1d0, c_float), &
         'dsm_convert float64 -> float32 (type(c_ptr) form): rounding, overflow to Inf')
    call dsm_convert(c_loc(dbl), DSM_INT32, c_loc(flat), DSM_FLOAT32, 6_c_int64_t, st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, '6', 'dsm_convert from DSM_INT32 gives DSM_ERR_INVALID_ARGUMENT')
    call dsm_convert(c_null_ptr, DSM_FLOAT32, c_null_ptr, DSM_FLOAT16, 0_c_int64_t, st)
    call check(st == DSM_SUCCESS, 'dsm_convert of 0 elements needs no buffers')
    call dsm_convert(c_null_ptr, DSM_FLOAT32, c_loc(flat), DSM_FLOAT16, 1_c_int64_t, st)
    call check(st == DSM_ERR_NULL_POINTER, 'dsm_convert of a null source gives DSM_ERR_NULL_POINTER')
    call dsm_convert(c_loc(dbl), DSM_FLOAT64, c_loc(flat), DSM_FLOAT32, -1_c_int64_t, st)
    call check(st == DSM_ERR_INVALID_ARGUMENT, 'dsm_convert of -1 elements gives DSM_ERR_INVALID_ARGUMENT')
    call dsm_free(c_null_ptr)
    st = -1
    call dsm_free(c_null_ptr, st)
    call check(st == DSM_SUCCESS, 'dsm_free of a null pointer does nothing and sets ierr to DSM_SUCCESS')
  end subroutine test_convert

  ! ---------------------------------------------------------- gradient accumulation
  ! Two micro-steps per window at ZeRO-2, the same gradient in each: the
  ! window's mean is that gradient, so the result is one step's.
  subroutine test_accumulation()
    call dsm_engine_init(mesh, sgd_config(2, 2, ''), params, engine)
    call backward(engine)
    info = dsm_step_info_t()
    call dsm_step(engine, info)
    call check(info%boundary == 0 .and. info%micro_steps == 1 .and. info%global_steps == 0, &
         'gradient accumulation: the first micro-step is not a boundary')
    call check_values(engine, w0, b0, real(s0, c_float), 'gradient accumulation: no update mid-window')
    call backward(engine)
    call dsm_step(engine)  ! without info
    info = dsm_step_info_t()
    call dsm_engine_step_info(engine, info)
    call check(info%boundary == 1 .and. info%micro_steps == 2 .and. info%global_steps == 1 .and. &
         info%global_samples == 2 * nprocs, 'gradient accumulation: the second micro-step is the boundary')
    call check_values(engine, expect_w, expect_b, expect_s, 'gradient accumulation: the mean of the window')
    call dsm_engine_free(engine)
  end subroutine test_accumulation

  ! ---------------------------------------------------------- bf16 and fp16
  subroutine test_precisions()
    integer(c_int16_t), dimension(NW1 * NW2), target :: bits
    real(c_float), dimension(NW1, NW2), target :: wf
    real(c_float), dimension(:), pointer :: q1
    type(c_ptr) :: g
    integer :: dt

    call dsm_engine_init(mesh, sgd_config(1, 1, ', "bf16": {"enabled": true}'), params, engine, st)
    call dsm_engine_dtype(engine, dt)
    call check(st == DSM_SUCCESS .and. dt == DSM_BFLOAT16, 'bf16.enabled: the dtype is DSM_BFLOAT16')
    call dsm_engine_param_acquire(engine, IW, q1, st)
    call check(st == DSM_ERR_INVALID_ARGUMENT .and. .not. associated(q1), &
         'a real(c_float) pointer to a bfloat16 parameter gives DSM_ERR_INVALID_ARGUMENT')
    call dsm_engine_param_acquire(engine, IW, cp, st)
    call check(st == DSM_SUCCESS, 'the refused real pointer acquired nothing: the type(c_ptr) form works')
    wf = 0
    call dsm_convert(cp, DSM_BFLOAT16, wf)
    call check(all(wf == w0), 'bfloat16 parameter values through dsm_convert are the Fortran array')
    call dsm_engine_param_release(engine, IW)
    call dsm_engine_grad_acquire(engine, IW, q1, st)
    call check(st == DSM_ERR_INVALID_ARGUMENT .and. .not. associated(q1), &
         'a real(c_float) pointer to a bfloat16 gradient gives DSM_ERR_INVALID_ARGUMENT')
    call dsm_engine_grad_acquire(engine, IW, g, st)
    call check(st == DSM_SUCCESS, 'the refused real gradient pointer acquired nothing')
    wf = real(rank + 1, c_float) * gw
    call dsm_convert(wf, g, DSM_BFLOAT16)
    call dsm_engine_grad_release(engine, IW)
    call dsm_step(engine, ierr=st)
    call dsm_engine_param_acquire(engine, IW, cp)
    call dsm_convert(cp, DSM_BFLOAT16, c_loc(bits), DSM_BFLOAT16, int(NW1 * NW2, c_int64_t))
    call dsm_convert(c_loc(bits), DSM_BFLOAT16, wf)
    call dsm_engine_param_release(engine, IW)
    call check(st == DSM_SUCCESS .and. all(abs(wf - expect_w) <= 0.02 * abs(expect_w)), &
         'a bfloat16 step moves w to the fp32 result within bfloat16 rounding')
    call dsm_engine_free(engine)

    call dsm_engine_init(mesh, sgd_config(0, 1, ', "fp16": {"enabled": true, "initial_scale_power": 8}'), &
         params, engine, st)
    call dsm_engine_dtype(engine, dt)
    call dsm_engine_loss_scale(engine, scale)
    info = dsm_step_info_t()
    call dsm_engine_step_info(engine, info)
    call check(st == DSM_SUCCESS .and. dt == DSM_FLOAT16 .and. scale == 256d0 .and. info%loss_scale == 256d0 &
         .and. info%grad_norm == -1d0 .and. info%global_steps == 0, &
         'fp16 with initial_scale_power 8: dtype DSM_FLOAT16, loss scale 256, no step yet')
    call dsm_engine_free(engine)
  end subroutine test_precisions

  ! ---------------------------------------------------------- fp32 helpers
  ! dsm_engine_param_read_f32 and dsm_engine_grad_add_f32 on a bf16 engine
  ! (no pointer form takes it), and dsm_engine_batch.
  subroutine test_f32_helpers()
    real(c_float), dimension(NW1 * NW2) :: wv
    real(c_float), dimension(NB) :: bv
    integer(c_int64_t) :: tb, mb, gas, dp
    logical :: stop
    integer(c_int) :: rc
    integer, parameter :: SIGUSR1 = 10, SIGKILL = 9
    interface
       function c_raise(sig) bind(C, name='raise') result(rc)
         import :: c_int
         integer(c_int), value :: sig
         integer(c_int) :: rc
       end function c_raise
    end interface

    call dsm_engine_init(mesh, sgd_config(1, 2, ', "bf16": {"enabled": true}'), params, engine, st)
    call check(st == DSM_SUCCESS, 'f32 helpers: a bf16 engine')
    if (st /= DSM_SUCCESS) return
    call dsm_engine_batch(engine, tb, mb, gas, dp, st)
    call check(st == DSM_SUCCESS .and. gas == 2 .and. dp == nprocs .and. tb == mb * gas * dp, &
         'dsm_engine_batch gives the derived batch values')
    call dsm_engine_param_read_f32(engine, IW, wv, st)
    call check(st == DSM_SUCCESS .and. all(wv == reshape(w0, [NW1 * NW2])), &
         'dsm_engine_param_read_f32 reads a bf16 parameter as real(c_float)')
    call dsm_engine_param_read_f32(engine, IW, bv, st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'count 4 is not the 12 elements', &
         'dsm_engine_param_read_f32 with the wrong size fails naming both')
    bv = real(rank + 1, c_float) * gb
    call dsm_engine_grad_add_f32(engine, IB, bv, st)
    call check(st == DSM_SUCCESS, 'dsm_engine_grad_add_f32 adds into a bf16 gradient')
    call dsm_engine_grad_add_f32(engine, IFR, bv, st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'is frozen', 'dsm_engine_grad_add_f32 on a frozen parameter fails')
    ! The metrics calls (no monitor enabled: recorded, nothing written).
    call dsm_engine_log_loss(engine, 0.5d0, st)
    call check(st == DSM_SUCCESS, 'dsm_engine_log_loss')
    call dsm_engine_log_scalar(engine, 'Eval/accuracy', 0.75d0, st)
    call check(st == DSM_SUCCESS, 'dsm_engine_log_scalar')
    call dsm_engine_log_scalar(engine, 'a,b', 1d0, st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, "name 'a,b' has", 'dsm_engine_log_scalar refuses a comma')
    call dsm_engine_set_flops(engine, 1d9, 1d12, st)
    call check(st == DSM_SUCCESS, 'dsm_engine_set_flops')
    call dsm_engine_set_flops(engine, -1d0, 0d0, st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'flops_per_sample -1', 'dsm_engine_set_flops refuses -1')
    ! The stop signal: SIGUSR1 on the last rank; every rank stops at the boundary (2 micro-steps).
    call dsm_engine_set_stop_signal(engine, SIGKILL, st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'SIGKILL cannot be caught', 'dsm_engine_set_stop_signal refuses SIGKILL')
    call dsm_engine_set_stop_signal(engine, SIGUSR1, st)
    call check(st == DSM_SUCCESS, 'dsm_engine_set_stop_signal(SIGUSR1)')
    if (rank == nprocs - 1) rc = c_raise(int(SIGUSR1, c_int))
    call dsm_step(engine, ierr=st)
    call check(st == DSM_SUCCESS, 'f32 helpers: dsm_step')
    call dsm_engine_stop_requested(engine, stop, st)
    call check(st == DSM_SUCCESS .and. .not. stop, 'no stop before the accumulation boundary')
    call dsm_step(engine, ierr=st)
    call dsm_engine_stop_requested(engine, stop, st)
    call check(st == DSM_SUCCESS .and. stop, 'dsm_engine_stop_requested on every rank at the boundary')
    call dsm_engine_free(engine)
  end subroutine test_f32_helpers

  ! ---------------------------------------------------------- the loop's helpers
  ! The rank-2 forms of dsm_engine_param_read_f32 and dsm_engine_grad_add_f32
  ! (shape checked as the pointer form checks it), the pointer form's message
  ! on a bf16 engine naming them, dsm_engine_mean_loss,
  ! dsm_engine_init_with_config and dsm_engine_resume.
  subroutine test_loop_helpers()
    real(c_float), dimension(NW1, NW2) :: w2
    real(c_float), dimension(NW2, NW1) :: wt
    real(c_float), dimension(:,:), pointer :: q2
    real(c_double) :: mean
    type(dsm_config_t) :: c
    character(len=512) :: dir
    character(len=:), allocatable :: note
    logical :: resumed

    call dsm_engine_init(mesh, sgd_config(1, 1, ', "bf16": {"enabled": true}'), params, engine, st)
    call check(st == DSM_SUCCESS, 'loop helpers: a bf16 engine')
    if (st /= DSM_SUCCESS) return
    call dsm_engine_param_read_f32(engine, IW, w2, st)
    call check(st == DSM_SUCCESS .and. all(w2 == w0), &
         'dsm_engine_param_read_f32 into a rank-2 array of the declared shape')
    call dsm_engine_param_read_f32(engine, IW, wt, st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'is not the shape 4 x 3', &
         'dsm_engine_param_read_f32 into the transposed shape fails naming both shapes')
    call dsm_engine_grad_add_f32(engine, IW, real(rank + 1, c_float) * gw, st)
    call check(st == DSM_SUCCESS, 'dsm_engine_grad_add_f32 of a rank-2 array of the declared shape')
    call dsm_engine_grad_add_f32(engine, IW, wt, st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'is not the shape 4 x 3', &
         'dsm_engine_grad_add_f32 of the transposed shape fails naming both shapes')
    call dsm_engine_grad_add_f32(engine, 99, w2, st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, '99', 'dsm_engine_grad_add_f32 (rank 2) with a bad index')
    call dsm_engine_param_acquire(engine, IW, q2, [NW1, NW2], st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'dsm_engine_param_read_f32', &
         'a real(c_float) pointer on a bf16 engine points to dsm_engine_param_read_f32')
    call dsm_step(engine, ierr=st)
    call check(st == DSM_SUCCESS, 'loop helpers: dsm_step after the rank-2 gradient')
    call dsm_engine_param_read_f32(engine, IW, w2, st)
    call check(st == DSM_SUCCESS .and. maxval(abs(w2 - expect_w)) < 0.05, &
         'the rank-2 gradient updated the weight (bf16)')

    ! The mean loss over the ranks.
    call dsm_engine_mean_loss(engine, real(rank, c_double), 1d0, mean, st)
    call check(st == DSM_SUCCESS .and. abs(mean - real(nprocs - 1, c_double) / 2) < 1d-12, &
         'dsm_engine_mean_loss: the mean of the ranks'' losses')
    call dsm_engine_mean_loss(engine, 1d0, merge(-1d0, 1d0, rank == nprocs - 1), mean, st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'weight is -1', &
         'dsm_engine_mean_loss with a negative weight on the last rank fails on every rank')
    call dsm_engine_free(engine)

    ! A configuration read once, handed to the engine.
    call dsm_config_load(MPI_COMM_WORLD, sgd_config(0, 1, ''), 0, c, st)
    call check(st == DSM_SUCCESS, 'dsm_config_load for dsm_engine_init_with_config')
    call dsm_engine_init_with_config(mesh, c, params, engine, ierr=st)
    call check(st == DSM_SUCCESS .and. c_associated(engine%ptr), 'dsm_engine_init_with_config')
    call dsm_config_free(c)
    call dsm_engine_init_with_config(mesh, c, params, other, ierr=st)
    call check_error(st, DSM_ERR_NULL_POINTER, 'config is NULL', &
         'dsm_engine_init_with_config with a null configuration')

    ! Resume: nothing to resume, then the checkpoint saved.
    call temporary_directory(dir)
    call dsm_engine_resume(engine, dir, 0, resumed, note, st)
    call check(st == DSM_SUCCESS .and. .not. resumed .and. len(note) == 0, &
         'dsm_engine_resume of a directory that does not exist: nothing to resume')
    call dsm_engine_resume(engine, '', 0, resumed, ierr=st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'empty', 'dsm_engine_resume with an empty directory')
    if (have_hdf5) then
       call backward(engine)
       call dsm_step(engine)
       call dsm_engine_save_checkpoint(engine, dir, '', 'resume me', st)
       call dsm_engine_free(engine)
       call dsm_engine_init(mesh, sgd_config(0, 1, ''), params, engine)
       call dsm_engine_resume(engine, dir, 0, resumed, note, st)
       call dsm_engine_step_info(engine, info)
       call check(st == DSM_SUCCESS .and. resumed .and. note == 'resume me' .and. info%global_steps == 1, &
            'dsm_engine_resume loads DIR/latest with its client state')
       if (rank == 0) call execute_command_line('rm -rf ' // trim(dir))
    end if
    call dsm_engine_free(engine)
  end subroutine test_loop_helpers

  ! ---------------------------------------------------------- bad arguments
  subroutine test_errors()
    integer :: last

    last = nprocs - 1
    call dsm_engine_init(mesh, '{"train_batch_size": 8, "zero_optimization": {"stage": 4}}', params, engine, st)
    call check_error(st, DSM_ERR_CONFIG, 'zero_optimization.stage', 'a bad config gives DSM_ERR_CONFIG')
    call check(.not. c_associated(engine%ptr), 'the failed engine handle is null')
    call dsm_engine_init(mesh, '{"train_micro_batch_size_per_gpu": 1}', params, engine, st)
    call check_error(st, DSM_ERR_CONFIG, 'optimizer', 'a config without an optimizer gives DSM_ERR_CONFIG')
    call dsm_engine_init(mesh, '/nonexistent/ds_config.json', params, engine, st)
    call check_error(st, DSM_ERR_IO, 'nonexistent', 'a missing config file gives DSM_ERR_IO')

    bad = params
    bad(1)%dtype = DSM_INT32
    call dsm_engine_init(mesh, sgd_config(0, 1, ''), bad, engine, st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'dtype 6', 'a DSM_INT32 parameter gives DSM_ERR_INVALID_ARGUMENT')
    bad = params
    if (rank == last) bad(2)%name = 'my bias'
    call dsm_engine_init(mesh, sgd_config(0, 1, ''), bad, engine, st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'my bias', &
         'a name with a blank on the last rank only fails every rank')
    bad = params
    deallocate(bad(3)%name)
    call dsm_engine_init(mesh, sgd_config(0, 1, ''), bad, engine, st)
    call check_error(st, DSM_ERR_NULL_POINTER, 'params[2].name is NULL', &
         'an unallocated name is the C NULL name: DSM_ERR_NULL_POINTER')
    bad = params
    bad(4)%name = 'fc.weight  '
    call dsm_engine_init(mesh, sgd_config(0, 1, ''), bad, engine, st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'used twice', &
         'a name used twice (trailing blanks ignored) gives DSM_ERR_INVALID_ARGUMENT')
    bad = params
    bad(1)%shape = [1, 1, 1, 1, 1, 1, 1, 1, 12]
    call dsm_engine_init(mesh, sgd_config(0, 1, ''), bad, engine, st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'ndims is 9', 'a shape of 9 extents gives DSM_ERR_INVALID_ARGUMENT')
    bad = params
    bad(2)%shape = [0]
    call dsm_engine_init(mesh, sgd_config(0, 1, ''), bad, engine, st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'shape[0] is 0', 'an extent of 0 gives DSM_ERR_INVALID_ARGUMENT')
    if (nprocs > 1) then
       bad = params
       ! Reversed for C: the last rank's [4, 4] is C's [4][4], the others' [3][4].
       if (rank == last) bad(1)%shape = [4, 4]
       call dsm_engine_init(mesh, sgd_config(0, 1, ''), bad, engine, st)
       call check_error(st, DSM_ERR_MISMATCH, 'fc.weight[3,4]', &
            'a shape that differs on the last rank gives DSM_ERR_MISMATCH in C order')
    end if
    deallocate(bad)
    allocate(bad(0))
    call dsm_engine_init(mesh, sgd_config(0, 1, ''), bad, engine, st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'nparams is 0', 'no parameters gives DSM_ERR_INVALID_ARGUMENT')
    deallocate(bad)
    bad = params
    do i = 1, 4
       bad(i)%init_values = c_null_ptr
       if (bad(i)%trainable) bad(i)%init_fn => failing_init
       bad(i)%init_user_data = c_loc(fail_at)
    end do
    fail_at(2) = int(last, c_int)
    call dsm_engine_init(mesh, sgd_config(0, 1, ''), bad, engine, st)
    fail_at(2) = -1
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'init_fn returned an error', &
         'an init_fn failing on the last rank fails every rank')
    call dsm_engine_init_comm(MPI_COMM_NULL, sgd_config(0, 1, ''), params, engine, st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'MPI_COMM_NULL', &
         'dsm_engine_init_comm of MPI_COMM_NULL gives DSM_ERR_INVALID_ARGUMENT')

    ! A null handle.
    call dsm_engine_num_params(engine, n, st)
    call check_error(st, DSM_ERR_NULL_POINTER, 'engine is NULL', 'a null engine gives DSM_ERR_NULL_POINTER')
    call dsm_step(engine, ierr=st)
    call check(st == DSM_ERR_NULL_POINTER, 'dsm_step of a null engine gives DSM_ERR_NULL_POINTER')
    call dsm_engine_free(engine, st)
    call check(st == DSM_SUCCESS, 'dsm_engine_free of a null handle does nothing')
    call dsm_engine_param_acquire(engine, 0, p1, st)
    call check(st == DSM_ERR_NULL_POINTER .and. .not. associated(p1), &
         'a real pointer from a null engine gives DSM_ERR_NULL_POINTER')
  end subroutine test_errors

  ! Misuse of a live engine (ZeRO-2: release may reduce).
  subroutine test_state_errors()
    call dsm_engine_init(mesh, sgd_config(2, 1, ''), params, engine)
    call dsm_engine_param_index(engine, 'nope', idx, st)
    call check_error(st, DSM_ERR_NOT_FOUND, 'nope', 'an unknown parameter name gives DSM_ERR_NOT_FOUND')
    call check(idx == -1, 'the index of an unknown name is -1')
    call dsm_engine_param_acquire(engine, 4, p1, st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, &
         'dsm_engine_param_acquire: parameter index 4 is out of range 0..3 (indices are 0-based)', &
         'parameter index 4 of 4 is out of range, named once, 0-based')
    ! The declared shapes, in Fortran order.
    call dsm_engine_param_shape(engine, IW, dims, st)
    call check(st == DSM_SUCCESS .and. size(dims) == 2, 'dsm_engine_param_shape of the matrix: 2 dimensions')
    if (size(dims) == 2) call check(all(dims == [NW1, NW2]), 'dsm_engine_param_shape: the Fortran shape [4, 3]')
    call dsm_engine_param_shape(engine, IB, dims, st)
    call check(st == DSM_SUCCESS .and. size(dims) == 1, 'dsm_engine_param_shape of the vector: 1 dimension')
    if (size(dims) == 1) call check(dims(1) == NB, 'dsm_engine_param_shape of the vector: [4]')
    call dsm_engine_param_shape(engine, IS, dims, st)
    call check(st == DSM_SUCCESS .and. size(dims) == 0, 'dsm_engine_param_shape of the scalar: no dimensions')
    call dsm_engine_param_shape(engine, 4, dims, st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'indices are 0-based', 'dsm_engine_param_shape of index 4')
    call check(size(dims) == 0, 'dsm_engine_param_shape of a bad index: no dimensions')
    ! The transposed view of the 4 x 3 matrix has the right product but is refused.
    call dsm_engine_param_acquire(engine, IW, p2, [NW2, NW1], st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, &
         'dsm_engine_param_acquire: shape 3 x 4 is not the shape 4 x 3 parameter 0 was declared with', &
         'a transposed rank-2 shape gives DSM_ERR_INVALID_ARGUMENT with dsm_last_error() set')
    call check(.not. associated(p2), 'the transposed view is not given')
    call dsm_engine_grad_acquire(engine, IW, p2, [NW2, NW1], st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, &
         'dsm_engine_grad_acquire: shape 3 x 4 is not the shape 4 x 3 parameter 0 was declared with', &
         'a transposed rank-2 gradient shape gives DSM_ERR_INVALID_ARGUMENT')
    call dsm_engine_param_numel(engine, -1, numel, st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'index -1', 'parameter index -1 is out of range')
    call dsm_engine_param_acquire(engine, IW, p2, [5, 3], st)
    call check(st == DSM_ERR_INVALID_ARGUMENT .and. .not. associated(p2), &
         'a rank-2 shape whose product is not numel gives DSM_ERR_INVALID_ARGUMENT')
    ! An error the binding finds, caught with ierr, reads as the library's.
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'dsm_engine_param_acquire: shape 5 x 3 is not numel 12', &
         'with ierr, the binding''s own error is in dsm_last_error()')
    call dsm_engine_param_acquire(engine, IW, p2, [12], st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'shape must have 2 elements', &
         'a rank-2 pointer with a 1-element shape gives DSM_ERR_INVALID_ARGUMENT')
    call dsm_engine_param_acquire(engine, IW, p2, [NW1, NW2], st)
    call check(st == DSM_SUCCESS .and. all(shape(p2) == [NW1, NW2]), &
         'the refused acquires released the parameter: it can be acquired with its shape')
    call dsm_engine_param_acquire(engine, IW, p1, st)
    call check_error(st, DSM_ERR_STATE, 'already acquired', 'acquiring a parameter twice gives DSM_ERR_STATE')
    call dsm_engine_param_release(engine, IW)
    call dsm_engine_param_release(engine, IW, st)
    call check_error(st, DSM_ERR_STATE, 'not acquired', 'releasing it twice gives DSM_ERR_STATE')
    call dsm_engine_grad_acquire(engine, IFR, cp, st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, '''frozen'' is frozen', &
         'the gradient of a frozen parameter gives DSM_ERR_INVALID_ARGUMENT')
    call dsm_engine_grad_acquire(engine, IW, p2, [4, 4], st)
    call check(st == DSM_ERR_INVALID_ARGUMENT .and. .not. associated(p2), &
         'a gradient shape whose product is not numel gives DSM_ERR_INVALID_ARGUMENT')
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'dsm_engine_grad_acquire: shape 4 x 4 is not numel 12', &
         'the gradient shape error is in dsm_last_error()')
    call dsm_engine_grad_release(engine, IW, st)
    call check_error(st, DSM_ERR_STATE, 'not acquired', 'the refused gradient was not acquired')
    info = dsm_step_info_t()
    info%size = 8
    call dsm_engine_step_info(engine, info, st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'info->size is 8', &
         'a step info whose size is 8 gives DSM_ERR_INVALID_ARGUMENT')
    ! A gradient still acquired on the last rank at dsm_step: every rank fails.
    if (rank == nprocs - 1) call dsm_engine_grad_acquire(engine, IB, p1)
    call dsm_step(engine, ierr=st)
    call check_error(st, DSM_ERR_STATE, 'still acquired', &
         'dsm_step with a gradient acquired on the last rank fails every rank')
    call dsm_engine_grad_acquire(engine, IW, cp, st)
    call check_error(st, DSM_ERR_STATE, 'can only be freed', 'after a failed collective call only free is accepted')
    call dsm_engine_free(engine, st)
    call check(st == DSM_SUCCESS .and. .not. c_associated(engine%ptr), 'the failed engine can be freed')
  end subroutine test_state_errors

  ! ---------------------------------------------------------- checkpoints
  subroutine test_checkpoint()
    character(len=512) :: dir
    integer(c_int8_t), dimension(5) :: blob
    integer(c_int8_t), dimension(:), allocatable :: got
    integer(c_int8_t), dimension(:), pointer :: raw
    character(len=:), allocatable :: note
    integer(c_int64_t) :: nbytes
    logical :: exists

    blob = [1_c_int8_t, 2_c_int8_t, 3_c_int8_t, -4_c_int8_t, 127_c_int8_t]
    call dsm_engine_init(mesh, sgd_config(1, 1, ''), params, engine)
    if (.not. have_hdf5) then
       call dsm_engine_save_checkpoint(engine, '/tmp', 'x', blob, st)
       call check(st == DSM_ERR_NOT_SUPPORTED, 'without HDF5 a save gives DSM_ERR_NOT_SUPPORTED')
       if (rank == 0) write(*, '(a)') 'SKIP: checkpoint round trip (libdsm is built without HDF5)'
       call dsm_engine_free(engine)
       return
    end if
    call temporary_directory(dir)
    call backward(engine)
    call dsm_step(engine)
    call dsm_engine_save_checkpoint(engine, dir, 'ft-1', blob, st)
    call check(st == DSM_SUCCESS, 'dsm_engine_save_checkpoint with a byte client state')
    inquire(file=trim(dir) // '/ft-1.h5', exist=exists)
    call check(exists, 'the checkpoint is DIR/TAG.h5')
    ! A second step moves the parameters on; the load brings them back.
    call backward(engine)
    call dsm_step(engine)
    call dsm_engine_load_checkpoint(engine, dir, 'ft-1', 0, got, st)
    call check(st == DSM_SUCCESS .and. allocated(got), 'dsm_engine_load_checkpoint with a byte client state')
    if (allocated(got)) call check(size(got) == 5 .and. all(got == blob), 'the client bytes come back')
    call check_values(engine, expect_w, expect_b, expect_s, 'the load restores the values saved after one step')
    info = dsm_step_info_t()
    call dsm_engine_step_info(engine, info)
    call check(info%global_steps == 1 .and. info%micro_steps == 1, 'the load restores the counters')

    ! The default tag and a text client state, trailing blank included.
    call dsm_engine_save_checkpoint(engine, dir, '', 'epoch=3 ', st)
    inquire(file=trim(dir) // '/global_step1.h5', exist=exists)
    call check(st == DSM_SUCCESS .and. exists, 'tag '''' saves DIR/global_step<N>.h5')
    call dsm_engine_load_checkpoint(engine, dir, '', 0, note, st)
    call check(st == DSM_SUCCESS .and. note == 'epoch=3 ' .and. len(note) == 8, &
         'tag '''' loads DIR/latest with its text client state')
    call dsm_engine_load_checkpoint(engine, dir, 'ft-1', DSM_CKPT_LOAD_NO_OPTIMIZER, ierr=st)
    call check(st == DSM_SUCCESS, 'a load without a client state argument')
    call dsm_engine_load_checkpoint(engine, dir, 'no-such-tag', 0, got, st)
    call check_error(st, DSM_ERR_IO, 'no-such-tag', 'a missing tag gives DSM_ERR_IO on every rank')
    call check(allocated(got), 'the byte client state of a failed load is allocated')
    if (allocated(got)) call check(size(got) == 0, 'the byte client state of a failed load is empty')
    call dsm_engine_save_checkpoint(engine, dir, '.hidden', ierr=st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, '.hidden', 'a tag starting with ''.'' gives DSM_ERR_INVALID_ARGUMENT')
    call dsm_engine_load_checkpoint(engine, dir, 'ft-1', 64, ierr=st)
    call check(st == DSM_ERR_INVALID_ARGUMENT, 'unknown load flags give DSM_ERR_INVALID_ARGUMENT')
    ! Waiting with no save running; the report of the last load; a fallback
    ! from a missing tag to the newest checkpoint that verifies.
    call dsm_engine_checkpoint_wait(engine, st)
    call check(st == DSM_SUCCESS, 'dsm_engine_checkpoint_wait with no save running')
    call dsm_engine_load_checkpoint(engine, dir, 'gone', ior(DSM_CKPT_LOAD_FALLBACK, DSM_CKPT_LOAD_NON_STRICT), &
         ierr=st)
    call check(st == DSM_SUCCESS, 'DSM_CKPT_LOAD_FALLBACK loads another checkpoint for a missing tag')
    call dsm_engine_load_report(engine, DSM_FORMAT_JSON, text, st)
    call check(st == DSM_SUCCESS .and. index(text, '"tag": "gone"') > 0 .and. index(text, '"skipped"') > 0, &
         'dsm_engine_load_report names the skipped tag')
    call dsm_engine_load_report(engine, 9, text, st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'format 9', 'an unknown report format')

    ! Into another ZeRO stage with zero-initialized parameters: the C copy
    ! of the client state (type(c_ptr) form), freed with dsm_free.
    bad = params
    do i = 1, 4
       bad(i)%init_values = c_null_ptr
       bad(i)%init_fn => null()
    end do
    call dsm_engine_init(mesh, sgd_config(3, 1, ''), bad, other)
    call dsm_engine_load_checkpoint(other, dir, 'ft-1', DSM_CKPT_LOAD_MODULE_ONLY, cp, nbytes, st)
    call check(st == DSM_SUCCESS .and. c_associated(cp) .and. nbytes == 5, &
         'a ZeRO-3 engine loads the ZeRO-1 checkpoint; type(c_ptr) client state')
    if (c_associated(cp)) then
       call c_f_pointer(cp, raw, [nbytes])
       call check(all(raw == blob), 'the C copy of the client state holds the bytes')
       call dsm_free(cp)
    end if
    call check_values(other, expect_w, expect_b, expect_s, 'the zero-initialized ZeRO-3 engine has the saved values')
    call dsm_engine_free(other)
    ! The weights alone, by file: another zero-initialized engine.
    call dsm_engine_init(mesh, sgd_config(2, 1, ''), bad, other)
    call dsm_engine_load_weights(other, trim(dir) // '/ft-1.h5', 0, st)
    call check(st == DSM_SUCCESS, 'dsm_engine_load_weights of a checkpoint file')
    call check_values(other, expect_w, expect_b, expect_s, 'dsm_engine_load_weights gives the saved values')
    call dsm_engine_load_weights(other, trim(dir) // '/none.safetensors', 0, st)
    call check_error(st, DSM_ERR_IO, 'none.safetensors', 'dsm_engine_load_weights of a missing file')
    call dsm_engine_load_weights(other, dir, 0, st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'is a directory', 'dsm_engine_load_weights of a directory')
    call dsm_engine_free(other)
    call dsm_engine_free(engine)
    deallocate(bad)

    call MPI_Barrier(MPI_COMM_WORLD, ierr)
    if (rank == 0) call execute_command_line('rm -rf ''' // trim(dir) // '''')
  end subroutine test_checkpoint

  ! A new directory name under $TMPDIR (or /tmp), the same on every rank.
  subroutine temporary_directory(dir)
    character(len=*), intent(out) :: dir
    character(len=256) :: base
    integer :: values(8), length, status
    integer(kind=8) :: clock

    dir = ''
    if (rank == 0) then
       call get_environment_variable('TMPDIR', base, length, status)
       if (status /= 0 .or. length == 0) base = '/tmp'
       call date_and_time(values=values)
       call system_clock(clock)
       write(dir, '(2a,i0,a,i0,a,i0)') trim(base), '/dsm-fortran-ckpt-', values(1) * 10000 + values(2) * 100 + &
            values(3), '-', clock, '-', int(MPI_Wtime() * 1d6, kind=8)
    end if
    call MPI_Bcast(dir, len(dir), MPI_CHARACTER, 0, MPI_COMM_WORLD, ierr)
  end subroutine temporary_directory

end program test_fortran_engine

! Element k (0-based) of parameter index: 0.5 * k + index, the same on
! every rank whatever range it is asked for.
function vector_init(user_data, index, name, offset, count, values) bind(C) result(status)
  use, intrinsic :: iso_c_binding, only: c_ptr, c_int, c_int64_t, c_float
  implicit none
  type(c_ptr), value :: user_data
  integer(c_int), value :: index
  type(c_ptr), value :: name
  integer(c_int64_t), value :: offset, count
  real(c_float), dimension(count), intent(out) :: values
  integer(c_int) :: status
  integer(c_int64_t) :: k

  do k = 1, count
     values(k) = 0.5 * real(offset + k - 1, c_float) + real(index, c_float)
  end do
  status = 0
end function vector_init

! vector_init, failing (nonzero) where user_data, two C ints, holds this
! rank and the rank to fail on.
function failing_init(user_data, index, name, offset, count, values) bind(C) result(status)
  use, intrinsic :: iso_c_binding, only: c_ptr, c_int, c_int64_t, c_float, c_f_pointer
  implicit none
  type(c_ptr), value :: user_data
  integer(c_int), value :: index
  type(c_ptr), value :: name
  integer(c_int64_t), value :: offset, count
  real(c_float), dimension(count), intent(out) :: values
  integer(c_int) :: status
  integer(c_int), dimension(:), pointer :: at
  integer(c_int64_t) :: k

  do k = 1, count
     values(k) = 0.5 * real(offset + k - 1, c_float) + real(index, c_float)
  end do
  call c_f_pointer(user_data, at, [2])
  status = 0
  if (at(1) == at(2)) status = -1
end function failing_init
