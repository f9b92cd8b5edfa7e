! heat_surrogate: a simulation that trains a neural surrogate of itself while
! it runs, on libdsm, from Fortran.
!
!   mpiexec -n 4 ./heat_surrogate CONFIG.json MODEL.pt [--steps N]
!       [--checkpoint DIR [--save-every K]] [--log FILE] [--export FILE]
!       [--torchscript FILE] [--pair FILE] [--max-error E] [--max-rollout R]
!
! The solver. A field u(x, y) is advected and diffused on a periodic
! nx x ny grid by an explicit scheme (upwind advection, five-point
! diffusion): one step is
!     u'(i,j) = u + r (u(i+1,j) + u(i-1,j) + u(i,j+1) + u(i,j-1) - 4 u)
!               - cx (u(i,j) - u(i-1,j)) - cy (u(i,j) - u(i,j-1)).
! The grid is split over the ranks in strips of whole columns (the second
! Fortran index, y), each rank's strip with a halo of one column on either
! side that MPI_Sendrecv fills from its neighbours before every step. Every
! few steps a Gaussian bump of heat (or cold) is dropped at a pseudo-random
! place so that the field never settles.
!
! The surrogate. Every step each rank cuts `tiles` random tiles of its strip
! (T x T values with their one-cell border) and trains a CNN, written in
! PyTorch (make_models.py: an nn.Sequential of convolution blocks, saved as
! TorchScript), to predict the step's increment u' - u on them: a training
! pair per tile and step. The training is libdsm's: data parallel over the
! ranks with the ZeRO stage, optimizer, schedule and precision of the
! DeepSpeed configuration (heat_surrogate.json: ZeRO-3, which runs this
! sequence of blocks block by block), one dsm_torch_train_step per solver
! step. Each tile is normalized (minus its mean, over its standard
! deviation) and its increment scaled by the same deviation: the scheme is
! linear and conserves constants, so the normalized pair is the same map.
!
! Checkpoints. With --checkpoint DIR the program saves every K solver steps
! (default 100) and at the end: the field (DIR/field_step<N>.bin, the whole
! grid in one file written with MPI-IO, each rank its strip) and then the
! model and optimizer (dsm_torch_save_checkpoint, tag step<N>, which moves
! DIR/latest last). When DIR/latest exists the program resumes from it: the
! model, the optimizer, the schedule, the field, at the step it names. The
! training pairs depend only on the step and the rank, so a resumed run on
! the same number of ranks continues exactly as the run that was not
! interrupted (the bridge's checkpoints restore the training bit for bit).
!
! At the end. From the final field the program compares the surrogate with
! the solver: the relative error of one step's increment over the whole
! grid, and a rollout of M steps in which the surrogate alone advances the
! field (inference on each rank's strip, halos exchanged as for the
! solver), its error relative to the change the solver makes in those
! steps (keeping the field as it is, persistence, scores 1). It prints
! "surrogate: one-step error E, rollout error R (persistence 1)".
!
! --log FILE: rank 0 writes each step's loss (the mean over the ranks) to
! FILE, "step loss", with every digit. --export FILE: the trained weights
! as safetensors. --torchscript FILE: the trained model as TorchScript, for
! Python. --pair FILE: rank 0's strip at the last step and the solver's next
! step, for make_models.py check.
!
! Exit status: 0, or 2 when the one-step error is above --max-error (default
! 0.3) or the rollout error above --max-rollout (default 0.2), or when the
! mean loss of the last 20 steps is not below a tenth of the first 20 steps'
! (only checked in a run that trained both); 1 on an error, on every rank.
!
! The calls to libdsm_torch go through its Fortran module dsm_torch.

! ------------------------------------------------------------------ the solver
module heat_solver
  use, intrinsic :: iso_fortran_env, only: int64, real64
  use mpi_f08
  implicit none
  private
  public :: grid_t, grid_create, exchange_halo, solver_step, drop_bump, uniform
  public :: nx, ny, bump_every

  integer, parameter :: nx = 64, ny = 64   ! the global grid
  integer, parameter :: bump_every = 2     ! a bump every this many steps
  ! The scheme: diffusion number and the upwind Courant numbers (stable:
  ! 4 r + cx + cy <= 1).
  real(real64), parameter :: r = 0.05_real64, cx = 0.3_real64, cy = 0.2_real64
  real(real64), parameter :: two_pi = 6.283185307179586_real64

  ! This rank's strip: global columns j0 .. j0 + nyl - 1, stored as
  ! u(0:nx+1, 0:nyl+1) with a halo of one on every side.
  type grid_t
     type(MPI_Comm) :: comm
     integer :: rank, size, j0, nyl, below, above
  end type grid_t

contains

  subroutine grid_create(comm, g, ok)
    type(MPI_Comm), intent(in) :: comm
    type(grid_t), intent(out) :: g
    logical, intent(out) :: ok

    g%comm = comm
    call MPI_Comm_rank(comm, g%rank)
    call MPI_Comm_size(comm, g%size)
    ! Even strips; the remainder goes to the first ranks.
    g%nyl = ny / g%size
    g%j0 = g%rank * g%nyl + min(g%rank, mod(ny, g%size)) + 1
    if (g%rank < mod(ny, g%size)) g%nyl = g%nyl + 1
    g%below = modulo(g%rank - 1, g%size)
    g%above = modulo(g%rank + 1, g%size)
    ok = ny / g%size >= 8 ! room for a tile in every strip
  end subroutine grid_create

  ! The halo: the periodic border in x locally, the neighbours' edge
  ! columns in y (periodic: the first rank's neighbour below is the last).
  subroutine exchange_halo(g, u)
    type(grid_t), intent(in) :: g
    real(real64), intent(inout) :: u(0:, 0:)

    call MPI_Sendrecv(u(:, g%nyl), nx + 2, MPI_DOUBLE_PRECISION, g%above, 1, &
         u(:, 0), nx + 2, MPI_DOUBLE_PRECISION, g%below, 1, g%comm, MPI_STATUS_IGNORE)
    call MPI_Sendrecv(u(:, 1), nx + 2, MPI_DOUBLE_PRECISION, g%below, 2, &
         u(:, g%nyl + 1), nx + 2, MPI_DOUBLE_PRECISION, g%above, 2, g%comm, MPI_STATUS_IGNORE)
    u(0, :) = u(nx, :)
    u(nx + 1, :) = u(1, :)
  end subroutine exchange_halo

  ! One step of the scheme on the interior; u's halo must be current.
  subroutine solver_step(g, u, un)
    type(grid_t), intent(in) :: g
    real(real64), intent(in) :: u(0:, 0:)
    real(real64), intent(out) :: un(0:, 0:)
    integer :: i, j

    do j = 1, g%nyl
       do i = 1, nx
          un(i, j) = u(i, j) + r * (u(i + 1, j) + u(i - 1, j) + u(i, j + 1) + u(i, j - 1) - 4 * u(i, j)) &
               - cx * (u(i, j) - u(i - 1, j)) - cy * (u(i, j) - u(i, j - 1))
       end do
    end do
  end subroutine solver_step

  ! A Gaussian bump (amplitude in (-1, 1), width 1 to 3 cells) centred at a
  ! point that depends only on k: every rank adds its part.
  subroutine drop_bump(g, k, u)
    type(grid_t), intent(in) :: g
    integer(int64), intent(in) :: k
    real(real64), intent(inout) :: u(0:, 0:)
    real(real64) :: x0, y0, amp, width, dx, dy
    integer :: i, j

    x0 = nx * uniform(1_int64, 4 * k)
    y0 = ny * uniform(1_int64, 4 * k + 1)
    amp = 2 * uniform(1_int64, 4 * k + 2) - 1
    width = 1 + 2 * uniform(1_int64, 4 * k + 3)
    do j = 1, g%nyl
       dy = modulo(g%j0 + j - 1 - y0 + ny / 2, real(ny, real64)) - ny / 2
       do i = 1, nx
          dx = modulo(i - x0 + nx / 2, real(nx, real64)) - nx / 2
          u(i, j) = u(i, j) + amp * exp(-(dx * dx + dy * dy) / (2 * width * width))
       end do
    end do
  end subroutine drop_bump

  ! Uniform in (0, 1), a function of (stream, i) only: the Park-Miller
  ! generator (multiplier 48271 modulo 2^31 - 1) run a few rounds from a
  ! seed mixed from both, so that every rank can draw any number alone.
  pure function uniform(stream, i) result(x)
    integer(int64), intent(in) :: stream, i
    real(real64) :: x
    integer(int64), parameter :: m = 2147483647_int64
    integer(int64) :: h
    integer :: round

    h = mod(mod(i, m) * 1103515245_int64 + mod(stream, m) * 12345_int64 + 1_int64, m)
    h = ieor(h, ishft(i, -31))
    do round = 1, 4
       h = mod(h * 48271_int64, m)
       h = ieor(h, ishft(h, -11))
       if (h == 0) h = 1
    end do
    x = real(h, real64) / real(m, real64)
  end function uniform

end module heat_solver

! ------------------------------------------------------------------ the program
program heat_surrogate
  use, intrinsic :: iso_c_binding, only: c_int, c_int64_t, c_float, c_char, c_null_char
  use, intrinsic :: iso_fortran_env, only: int64, real64, error_unit, output_unit
  use mpi_f08
  use dsm, only: dsm_mesh_t, dsm_mesh_create_dp_sp, dsm_mesh_free, dsm_step_info_t, dsm_engine_t, &
       dsm_engine_step_info, dsm_config_t, dsm_config_load_for_mesh, dsm_config_batch, dsm_config_free, &
       dsm_last_error, DSM_FORMAT_TEXT
  use dsm_torch
  use heat_solver
  implicit none

  integer, parameter :: t = 8         ! a tile's interior is t x t
  integer, parameter :: rollout = 20  ! steps of the final comparison
  integer, parameter :: window = 20   ! steps averaged for the loss check

  type(grid_t) :: g
  type(dsm_mesh_t) :: mesh
  type(dsm_config_t) :: cfg
  type(dsm_step_info_t), target :: info
  type(dsm_engine_t) :: engine
  type(dsm_torch_model_t) :: model
  type(dsm_torch_tensor_t) :: xin(1), ylab, yout
  character(len=:), allocatable :: config, model_path, ckpt_dir, log_path, export_path, ts_path, pair_path
  character(len=:), allocatable :: described
  character(len=4096) :: arg, value
  character(len=64) :: tag
  integer :: a, nargs, st, provided, tiles, k, i0, j0, exit_code, logu
  integer(int64) :: steps, save_every, n, first
  integer(c_int64_t) :: train_batch, micro_batch, accumulation, data_parallel
  logical :: ok, resume, bad_usage
  real(real64) :: loss, total, max_error, max_rollout, one_step, rolled, first_loss, last_loss
  real(real64) :: mean, sd
  real(real64), allocatable :: u(:, :), un(:, :), losses(:)
  real(c_float), allocatable, target :: x(:, :, :, :), y(:, :, :, :), xs(:, :, :, :), ys(:, :, :, :)

  interface
     ! POSIX mkdir(2)
     function c_mkdir(path, mode) bind(C, name='mkdir') result(rc)
       import :: c_int, c_char
       character(kind=c_char), dimension(*), intent(in) :: path
       integer(c_int), value :: mode
       integer(c_int) :: rc
     end function c_mkdir
  end interface

  call MPI_Init_thread(MPI_THREAD_FUNNELED, provided)
  exit_code = 1

  ! ------------------------------------------------------- command line
  steps = 300
  save_every = 100
  max_error = 0.3_real64
  max_rollout = 0.2_real64
  bad_usage = .false.
  nargs = command_argument_count()
  a = 1
  do while (a <= nargs)
     call get_command_argument(a, arg)
     if (arg(1:2) == '--') then
        ! An option and its value.
        if (a == nargs) then
           bad_usage = .true.
           exit
        end if
        call get_command_argument(a + 1, value)
        select case (trim(arg))
        case ('--steps')
           read (value, *, iostat=st) steps
           bad_usage = bad_usage .or. st /= 0 .or. steps < 1
        case ('--save-every')
           read (value, *, iostat=st) save_every
           bad_usage = bad_usage .or. st /= 0 .or. save_every < 1
        case ('--max-error')
           read (value, *, iostat=st) max_error
           bad_usage = bad_usage .or. st /= 0
        case ('--max-rollout')
           read (value, *, iostat=st) max_rollout
           bad_usage = bad_usage .or. st /= 0
        case ('--checkpoint')
           ckpt_dir = trim(value)
        case ('--log')
           log_path = trim(value)
        case ('--export')
           export_path = trim(value)
        case ('--torchscript')
           ts_path = trim(value)
        case ('--pair')
           pair_path = trim(value)
        case default
           bad_usage = .true.
        end select
        a = a + 2
     else
        if (.not. allocated(config)) then
           config = trim(arg)
        else if (.not. allocated(model_path)) then
           model_path = trim(arg)
        else
           bad_usage = .true.
        end if
        a = a + 1
     end if
  end do
  if (bad_usage .or. .not. allocated(model_path)) then
     call MPI_Comm_rank(MPI_COMM_WORLD, k)
     if (k == 0) write (error_unit, '(a)') 'usage: heat_surrogate CONFIG.json MODEL.pt [--steps N] ' // &
          '[--checkpoint DIR [--save-every K]] [--log FILE] [--export FILE] [--torchscript FILE] ' // &
          '[--pair FILE] [--max-error E] [--max-rollout R]'
     call MPI_Finalize()
     stop 1
  end if

  main: block
    ! ----------------------------------------------------- the grid
    call grid_create(MPI_COMM_WORLD, g, ok)
    if (.not. ok) then
       if (g%rank == 0) write (error_unit, '(a,i0,a,i0,a)') 'heat_surrogate: ', g%size, &
            ' ranks leave strips narrower than a tile (', ny, ' columns, tiles of 8)'
       exit main
    end if
    allocate (u(0:nx + 1, 0:g%nyl + 1), un(0:nx + 1, 0:g%nyl + 1))
    u = 0

    ! ----------------------------------------------------- the model
    ! The mesh is the job, every rank data parallel; the model is the
    ! TorchScript file, its parameters now the engine's.
    call dsm_mesh_create_dp_sp(MPI_COMM_WORLD, g%size, 1, mesh, st)
    if (failed(st, 'dsm_mesh_create_dp_sp')) exit main
    call dsm_torch_model_create(mesh, model_path, config, model, ierr=st)
    if (failed(st, 'dsm_torch_model_create')) exit main
    call dsm_torch_model_borrow_engine(model, engine, st)
    if (failed(st, 'dsm_torch_model_borrow_engine')) exit main
    ! The micro-batch of the configuration is the tiles per rank and step.
    call dsm_config_load_for_mesh(mesh, config, 0, cfg, st)
    if (failed(st, 'dsm_config_load_for_mesh')) exit main
    call dsm_config_batch(cfg, train_batch, micro_batch, accumulation, data_parallel, st)
    if (failed(st, 'dsm_config_batch')) exit main
    call dsm_config_free(cfg)
    tiles = int(micro_batch)
    allocate (x(t + 2, t + 2, 1, tiles), y(t, t, 1, tiles), losses(steps))
    losses = -1
    xin(1) = dsm_torch_tensor(x)
    ylab = dsm_torch_tensor(y)
    if (g%rank == 0) then
       write (output_unit, '(a,i0,a,i0,a,i0,a,i0,a,i0,a)') 'heat_surrogate: ', nx, ' x ', ny, ' grid on ', &
            g%size, ' ranks, ', tiles, ' tiles of ', t, ' x ' // itoa(t) // ' per rank and step'
       ! The ZeRO-3 mode the bridge chose and why (printed when it can say).
       call dsm_torch_model_describe(model, DSM_FORMAT_TEXT, described, st)
       if (st == 0) write (output_unit, '(a)') described
    end if

    ! ----------------------------------------------------- start or resume
    first = 0
    resume = .false.
    if (allocated(ckpt_dir)) then
       if (g%rank == 0) inquire (file=ckpt_dir // '/latest', exist=resume)
       call MPI_Bcast(resume, 1, MPI_LOGICAL, 0, MPI_COMM_WORLD)
    end if
    if (resume) then
       call dsm_torch_load_checkpoint(model, ckpt_dir, ierr=st)
       if (failed(st, 'dsm_torch_load_checkpoint')) exit main
       ! One optimizer step per solver step and micro-step: the step the
       ! checkpoint holds is its optimizer steps times the accumulation.
       call dsm_engine_step_info(engine, info, st)
       if (failed(st, 'dsm_engine_step_info')) exit main
       first = info%global_steps * accumulation
       call read_field(ckpt_dir // '/field_step' // itoa(first) // '.bin', first, ok)
       if (.not. agreed(ok, 'the field of ' // ckpt_dir // '/field_step' // itoa(first) // '.bin')) exit main
       if (g%rank == 0) write (output_unit, '(3a,i0)') 'resumed from ', ckpt_dir // '/latest', ' at step ', first
    else
       do k = 1, 8
          call drop_bump(g, -int(k, int64), u)
       end do
    end if
    if (allocated(log_path) .and. g%rank == 0) &
         open (newunit=logu, file=log_path, status='replace', action='write')

    ! ----------------------------------------------------- simulate and train
    do n = first, steps - 1
       call exchange_halo(g, u)
       call solver_step(g, u, un)
       ! Training pairs: tiles of u (with their border) and the increment
       ! on their interior, each normalized by its own mean and deviation.
       do k = 1, tiles
          i0 = 1 + int((nx - t + 1) * uniform(2_int64 + g%rank, n * tiles + k))
          j0 = 1 + int((g%nyl - t + 1) * uniform(1000_int64 + g%rank, n * tiles + k))
          call normalization(u(i0 - 1:i0 + t, j0 - 1:j0 + t), mean, sd)
          x(:, :, 1, k) = real((u(i0 - 1:i0 + t, j0 - 1:j0 + t) - mean) / sd, c_float)
          y(:, :, 1, k) = real((un(i0:i0 + t - 1, j0:j0 + t - 1) - u(i0:i0 + t - 1, j0:j0 + t - 1)) / sd, c_float)
       end do
       call dsm_torch_train_step(model, xin, ylab, loss, info, st)
       if (failed(st, 'dsm_torch_train_step')) exit main
       call MPI_Allreduce(loss, total, 1, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD)
       losses(n + 1) = total / g%size
       if (g%rank == 0) then
          if (allocated(log_path)) write (logu, '(i0,1x,es24.16)') n + 1, losses(n + 1)
          if (mod(n + 1, max(1_int64, steps / 10)) == 0 .or. n == first) &
               write (output_unit, '(a,i5,a,es11.4,a,es10.3)') 'step ', n + 1, '  loss ', losses(n + 1), &
               '  lr ', info%lr
       end if
       ! The solver goes on; a bump every few steps.
       u(1:nx, 1:g%nyl) = un(1:nx, 1:g%nyl)
       if (mod(n + 1, int(bump_every, int64)) == 0) call drop_bump(g, n + 1, u)

       if (allocated(ckpt_dir) .and. info%boundary /= 0 .and. (mod(n + 1, save_every) == 0 .or. n == steps - 1)) then
          write (tag, '(a,i0)') 'step', n + 1
          ! The directory, for the field (the bridge would make it too).
          if (g%rank == 0) k = c_mkdir(ckpt_dir // c_null_char, int(o'755', c_int))
          call MPI_Barrier(MPI_COMM_WORLD)
          call write_field(ckpt_dir // '/field_' // trim(tag) // '.bin', n + 1, ok)
          if (.not. agreed(ok, 'writing ' // ckpt_dir // '/field_' // trim(tag) // '.bin')) exit main
          call dsm_torch_save_checkpoint(model, ckpt_dir, trim(tag), st)
          if (failed(st, 'dsm_torch_save_checkpoint')) exit main
          if (g%rank == 0) write (output_unit, '(a,i0,2a)') 'saved a checkpoint of step ', n + 1, ' in ', ckpt_dir
       end if
    end do
    if (allocated(log_path) .and. g%rank == 0) close (logu)

    ! ----------------------------------------------------- the surrogate against the solver
    call compare(one_step, rolled, ok)
    if (.not. ok) exit main
    if (g%rank == 0) write (output_unit, '(a,f8.5,a,f8.5,a)') 'surrogate: one-step error ', one_step, &
         ', rollout error ', rolled, ' (persistence 1)'
    if (allocated(export_path)) then
       call dsm_torch_export_safetensors(model, export_path, st)
       if (failed(st, 'dsm_torch_export_safetensors')) exit main
    end if
    if (allocated(ts_path)) then
       call dsm_torch_export_torchscript(model, ts_path, st)
       if (failed(st, 'dsm_torch_export_torchscript')) exit main
    end if

    exit_code = 0
    if (one_step > max_error .or. rolled > max_rollout) then
       if (g%rank == 0) write (output_unit, '(a,f6.3,a,f6.3,a)') 'heat_surrogate: FAIL: the surrogate is ' // &
            'not within the bounds (one-step ', max_error, ', rollout ', max_rollout, ')'
       exit_code = 2
    end if
    if (first == 0 .and. steps >= 2 * window) then
       first_loss = sum(losses(1:window)) / window
       last_loss = sum(losses(steps - window + 1:steps)) / window
       if (g%rank == 0) write (output_unit, '(a,es10.3,a,es10.3,a,f7.1,a)') 'loss ', first_loss, ' -> ', &
            last_loss, ' (', first_loss / last_loss, 'x lower)'
       if (.not. last_loss * 10 < first_loss) then
          if (g%rank == 0) write (output_unit, '(a)') 'heat_surrogate: FAIL: the loss did not fall tenfold'
          exit_code = 2
       end if
    end if
  end block main

  call dsm_torch_model_free(model, st)
  call dsm_mesh_free(mesh, st)
  call MPI_Finalize()
  if (exit_code /= 0) stop exit_code

contains

  function itoa(i) result(s)
    class(*), intent(in) :: i
    character(len=:), allocatable :: s
    character(len=24) :: buf

    select type (i)
    type is (integer)
       write (buf, '(i0)') i
    type is (integer(int64))
       write (buf, '(i0)') i
    class default
       buf = '?'
    end select
    s = trim(buf)
  end function itoa

  ! A failed libdsm call: every rank has the same status (collective calls
  ! agree), each prints it with the library's message.
  logical function failed(status, what)
    integer(c_int), intent(in) :: status
    character(len=*), intent(in) :: what

    failed = status /= 0
    if (failed) write (error_unit, '(a,i0,4a)') 'rank ', g%rank, ': ', what, ' failed: ', dsm_last_error()
  end function failed

  ! ok on every rank? Each rank that failed says what.
  logical function agreed(mine, what)
    logical, intent(in) :: mine
    character(len=*), intent(in) :: what

    call MPI_Allreduce(mine, agreed, 1, MPI_LOGICAL, MPI_LAND, MPI_COMM_WORLD)
    if (.not. mine) write (error_unit, '(a,i0,2a)') 'rank ', g%rank, ': failed: ', what
  end function agreed

  ! Mean and standard deviation (n - 1) of a tile, the deviation floored.
  subroutine normalization(a, mean, sd)
    real(real64), intent(in) :: a(:, :)
    real(real64), intent(out) :: mean, sd

    mean = sum(a) / size(a)
    sd = sqrt(sum((a - mean)**2) / (size(a) - 1)) + 1.0e-3_real64
  end subroutine normalization

  ! The surrogate's increment on this rank's strip: the model on the whole
  ! strip with its halo (a convolution takes any size), normalized as the
  ! tiles are. ua's halo must be current.
  subroutine surrogate_increment(ua, du, mean, sd, ok)
    real(real64), intent(in) :: ua(0:, 0:)
    real(real64), intent(out) :: du(:, :)
    real(real64), intent(out) :: mean, sd
    logical, intent(out) :: ok

    call normalization(ua, mean, sd)
    xs(:, :, 1, 1) = real((ua - mean) / sd, c_float)
    call dsm_torch_inference(model, [dsm_torch_tensor(xs)], yout, st)
    ok = .not. failed(st, 'dsm_torch_inference')
    du = real(ys(:, :, 1, 1), real64) * sd
  end subroutine surrogate_increment

  ! The one-step error and the rollout error from the current field.
  subroutine compare(one_step, rolled, ok)
    real(real64), intent(out) :: one_step, rolled
    logical, intent(out) :: ok
    real(real64), allocatable :: us(:, :), ua(:, :), u0(:, :), du(:, :)
    real(real64) :: sums(2), globals(2), mean, sd
    integer :: m, pu

    allocate (us(0:nx + 1, 0:g%nyl + 1), ua(0:nx + 1, 0:g%nyl + 1), u0(nx, g%nyl), du(nx, g%nyl), &
         xs(nx + 2, g%nyl + 2, 1, 1), ys(nx, g%nyl, 1, 1))
    yout = dsm_torch_tensor(ys)
    us = u
    ua = u
    u0 = u(1:nx, 1:g%nyl)
    do m = 1, rollout
       call exchange_halo(g, us)
       call exchange_halo(g, ua)
       call surrogate_increment(ua, du, mean, sd, ok)
       if (.not. ok) return
       call solver_step(g, us, un)
       if (m == 1) then
          sums(1) = sum((du - (un(1:nx, 1:g%nyl) - us(1:nx, 1:g%nyl)))**2)
          sums(2) = sum((un(1:nx, 1:g%nyl) - us(1:nx, 1:g%nyl))**2)
          call MPI_Allreduce(sums, globals, 2, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD)
          one_step = sqrt(globals(1) / globals(2))
          if (allocated(pair_path) .and. g%rank == 0) then
             ! Rank 0's strip, its normalization and the solver's next step.
             open (newunit=pu, file=pair_path, access='stream', form='unformatted', status='replace', &
                  action='write')
             write (pu) int(nx, c_int), int(g%nyl, c_int), mean, sd, real(us, c_float), &
                  real(un(1:nx, 1:g%nyl), c_float)
             close (pu)
          end if
       end if
       us(1:nx, 1:g%nyl) = un(1:nx, 1:g%nyl)
       ua(1:nx, 1:g%nyl) = ua(1:nx, 1:g%nyl) + du
    end do
    sums(1) = sum((ua(1:nx, 1:g%nyl) - us(1:nx, 1:g%nyl))**2)
    sums(2) = sum((us(1:nx, 1:g%nyl) - u0)**2)
    call MPI_Allreduce(sums, globals, 2, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD)
    rolled = sqrt(globals(1) / globals(2))
    ok = .true.
  end subroutine compare

  ! The field checkpoint: an 8-byte step, then the whole grid u(1:nx, 1:ny)
  ! in float64, Fortran order; each rank writes its strip (contiguous in
  ! that order) with collective MPI-IO.
  subroutine write_field(path, step, ok)
    character(len=*), intent(in) :: path
    integer(int64), intent(in) :: step
    logical, intent(out) :: ok
    type(MPI_File) :: fh
    integer(MPI_OFFSET_KIND) :: offset
    integer :: err
    real(real64), allocatable :: strip(:, :)

    strip = u(1:nx, 1:g%nyl)
    call MPI_File_open(MPI_COMM_WORLD, path, ior(MPI_MODE_WRONLY, MPI_MODE_CREATE), MPI_INFO_NULL, fh, err)
    ok = err == MPI_SUCCESS
    if (.not. ok) return
    call MPI_File_set_size(fh, 0_MPI_OFFSET_KIND, err)
    if (g%rank == 0) call MPI_File_write_at(fh, 0_MPI_OFFSET_KIND, step, 1, MPI_INTEGER8, MPI_STATUS_IGNORE, err)
    offset = 8_MPI_OFFSET_KIND + int(g%j0 - 1, MPI_OFFSET_KIND) * nx * 8
    call MPI_File_write_at_all(fh, offset, strip, nx * g%nyl, MPI_DOUBLE_PRECISION, MPI_STATUS_IGNORE, err)
    ok = err == MPI_SUCCESS
    call MPI_File_close(fh, err)
    ok = ok .and. err == MPI_SUCCESS
  end subroutine write_field

  subroutine read_field(path, step, ok)
    character(len=*), intent(in) :: path
    integer(int64), intent(in) :: step
    logical, intent(out) :: ok
    type(MPI_File) :: fh
    integer(MPI_OFFSET_KIND) :: offset
    integer(int64) :: saved
    integer :: err
    real(real64), allocatable :: strip(:, :)

    allocate (strip(nx, g%nyl))
    call MPI_File_open(MPI_COMM_WORLD, path, MPI_MODE_RDONLY, MPI_INFO_NULL, fh, err)
    ok = err == MPI_SUCCESS
    if (.not. ok) return
    call MPI_File_read_at_all(fh, 0_MPI_OFFSET_KIND, saved, 1, MPI_INTEGER8, MPI_STATUS_IGNORE, err)
    ok = err == MPI_SUCCESS .and. saved == step
    offset = 8_MPI_OFFSET_KIND + int(g%j0 - 1, MPI_OFFSET_KIND) * nx * 8
    call MPI_File_read_at_all(fh, offset, strip, nx * g%nyl, MPI_DOUBLE_PRECISION, MPI_STATUS_IGNORE, err)
    ok = ok .and. err == MPI_SUCCESS
    call MPI_File_close(fh, err)
    u(1:nx, 1:g%nyl) = strip
  end subroutine read_field

end program heat_surrogate
