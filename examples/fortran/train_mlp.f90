! train_mlp: train a multi-layer perceptron with the libdsm engine, in Fortran.
!
!   mpiexec -n 4 ./train_mlp [CONFIG.json] [--steps N] [--describe]
!                            [--checkpoint DIR [--save-every K]]
!
! The Fortran twin of examples/c/train_mlp.c, with the same command line and
! the same model: 16 -> 64 (tanh) -> 64 (tanh) -> 4, its forward and backward
! pass written out here, learning the outputs of a fixed random "teacher"
! network (16 -> 32 (tanh) -> 4) plus a little noise, on inputs drawn afresh
! for every sample. The mesh is data parallel over every rank of the job
! (dsm_mesh_create_dp_sp with the world size: under Slurm, --ntasks), and the
! ZeRO stage, the precision, the optimizer and the learning-rate schedule all
! come from the DeepSpeed configuration (default examples/c/train_mlp.json,
! or inline JSON text starting with '{'); the program is the same for all.
!
! N is the number of optimizer steps (default 200). Rank 0 prints the loss of
! the global batch every few steps and at the end "final loss X (initial Y)":
! Y is the loss of the first global batch (before any update), X the mean
! over the last 10 steps. --describe then prints the engine's description.
!
! With --checkpoint DIR it saves a checkpoint every K steps (default 50) and
! at the end (DIR/global_step<N>.h5, DIR/latest), and when DIR/latest exists
! it first resumes from it, on any number of ranks, going on with the same
! samples it would have seen without the interruption. The initial loss
! travels in the checkpoint's client state, as text.
!
! Memory order: a layer's weight is the Fortran array w(in, out), declared to
! the engine with shape [in, out]; the engine and the checkpoint see the C
! tensor [out][in], the layout of PyTorch's nn.Linear.
!
! With DSM_STOP_SIGNAL set (e.g. DSM_STOP_SIGNAL=USR1), that signal, sent to
! any rank, stops the training at the next step boundary: with --checkpoint
! the program saves a checkpoint of that step first, then exits with status 3.
!
! Exit status: 0 when the loss fell by at least a factor of 5, 2 when it did
! not, 3 when it stopped on the signal, 1 on an error (every rank reports it:
! libdsm fails collective calls on every rank together).
module mlp_model
  use, intrinsic :: iso_c_binding, only: c_float, c_int, c_int64_t, c_ptr, c_f_pointer
  use, intrinsic :: iso_fortran_env, only: int64, real64
  implicit none
  private
  public :: nlayers, d_in, d_out, max_width, widths, make_teacher, make_batch, init_weight
  public :: linear_forward, linear_backward

  integer, parameter :: nlayers = 3, d_in = 16, d_out = 4, max_width = 64, t_hidden = 32
  ! widths(l) -> widths(l + 1) is layer l ("fc1" is layer 1).
  integer, parameter :: widths(nlayers + 1) = [d_in, 64, 64, d_out]
  real(real64), parameter :: noise = 0.05_real64, two_pi = 6.283185307179586_real64
  ! Independent streams of the one hash-based generator.
  integer(int64), parameter :: seed_init = 1000, seed_teacher = 2000, seed_input = 3000, &
       seed_noise = 4000

  ! The teacher's weights, made once (make_teacher).
  real(c_float) :: teacher_a(d_in, t_hidden), teacher_b(t_hidden, d_out)

contains

  ! A counter-based generator: uniform in (0, 1), depending only on
  ! (stream, i), so every rank computes the same number for the same element
  ! without sharing state. Rounds of multiply-add modulo the prime 2^31 - 1
  ! and xor-shifts; every product stays below 2^62, so no integer overflows.
  pure function uniform(stream, i) result(u)
    integer(int64), intent(in) :: stream, i
    real(real64) :: u
    integer(int64), parameter :: m = 2147483647_int64
    integer(int64) :: h

    h = mod(i, m)
    h = mod(h * 48271_int64 + mod(stream, m) + 1_int64, m)
    h = ieor(h, mod(ishft(i, -31), m))
    h = mod(h * 69621_int64 + 12345_int64, m)
    h = ieor(h, ishft(h, -13))
    h = mod(h * 48271_int64 + mod(stream * 7919_int64, m), m)
    h = ieor(h, ishft(h, -11))
    h = mod(h * 16807_int64 + 1_int64, m)
    u = (real(h, real64) + 0.5_real64) / real(m, real64)
  end function uniform

  ! Standard normal (Box-Muller on two uniforms).
  pure function gauss(stream, i) result(g)
    integer(int64), intent(in) :: stream, i
    real(real64) :: g

    g = sqrt(-2.0_real64 * log(uniform(stream, 2 * i))) * cos(two_pi * uniform(stream, 2 * i + 1))
  end function gauss

  subroutine make_teacher()
    integer :: i, j

    ! Unit-variance pre-activations, so that the hidden units use tanh's
    ! curved range without saturating.
    do j = 1, t_hidden
       do i = 1, d_in
          teacher_a(i, j) = real(gauss(seed_teacher, int((j - 1) * d_in + i - 1, int64)) &
               / sqrt(real(d_in, real64)), c_float)
       end do
    end do
    do j = 1, d_out
       do i = 1, t_hidden
          teacher_b(i, j) = real(1.2_real64 * gauss(seed_teacher + 1, int((j - 1) * t_hidden + i - 1, int64)) &
               / sqrt(real(t_hidden, real64)), c_float)
       end do
    end do
  end subroutine make_teacher

  ! Samples [first, first + n) of the endless synthetic data set, one per
  ! column: x(:, s) ~ N(0, 1), t(:, s) = teacher(x(:, s)) + noise. A sample
  ! depends only on its global index, so the ranks need not exchange data.
  subroutine make_batch(first, x, t)
    integer(int64), intent(in) :: first
    real(c_float), intent(out) :: x(:, :), t(:, :)
    real(c_float) :: h(t_hidden)
    integer(int64) :: g
    integer :: s, i

    do s = 1, size(x, 2)
       g = first + s - 1
       do i = 1, d_in
          x(i, s) = real(gauss(seed_input, g * d_in + i - 1), c_float)
       end do
       h = tanh(matmul(x(:, s), teacher_a))
       t(:, s) = matmul(h, teacher_b)
       do i = 1, d_out
          t(i, s) = t(i, s) + real(noise * gauss(seed_noise, g * d_out + i - 1), c_float)
       end do
    end do
  end subroutine make_batch

  ! The init_fn of the weights (a dsm_param_init_fn): PyTorch's default for
  ! nn.Linear, uniform in [-1/sqrt(fan_in), 1/sqrt(fan_in)], from a hash of
  ! the flat element index, so that under ZeRO-3 each rank fills only the
  ! elements it stores. user_data points to the layer's fan_in.
  function init_weight(user_data, index, name, offset, count, values) bind(C) result(status)
    type(c_ptr), value :: user_data
    integer(c_int), value :: index
    type(c_ptr), value :: name
    integer(c_int64_t), value :: offset, count
    real(c_float), dimension(count), intent(out) :: values
    integer(c_int) :: status
    integer(c_int), pointer :: fan_in
    real(real64) :: bound
    integer(c_int64_t) :: k

    call c_f_pointer(user_data, fan_in)
    bound = 1.0_real64 / sqrt(real(fan_in, real64))
    do k = 1, count
       values(k) = real(bound * (2.0_real64 * uniform(seed_init + index, offset + k - 1) - 1.0_real64), &
            c_float)
    end do
    status = 0
  end function init_weight

  ! y(:, s) = b + w^T x(:, s), with w(in, out).
  subroutine linear_forward(x, w, b, y)
    real(c_float), intent(in) :: x(:, :), w(:, :), b(:)
    real(c_float), intent(out) :: y(:, :)
    integer :: s

    y = matmul(transpose(w), x)
    do s = 1, size(y, 2)
       y(:, s) = y(:, s) + b
    end do
  end subroutine linear_forward

  ! The gradients of the layer's parameters, gw = x dy^T and gb = row sums
  ! of dy, and when wanted the gradient of its input, dx = w dy.
  subroutine linear_backward(x, w, dy, gw, gb, dx)
    real(c_float), intent(in) :: x(:, :), w(:, :), dy(:, :)
    real(c_float), intent(out) :: gw(:, :), gb(:)
    real(c_float), intent(out), optional :: dx(:, :)

    gw = matmul(x, transpose(dy))
    gb = sum(dy, dim=2)
    if (present(dx)) dx = matmul(w, dy)
  end subroutine linear_backward

end module mlp_model

program train_mlp
  use, intrinsic :: iso_c_binding, only: c_float, c_int, c_int64_t, c_ptr, c_loc, c_funloc
  use, intrinsic :: iso_fortran_env, only: int64, real64, error_unit, output_unit
  use mpi_f08
  use dsm
  use mlp_model
  implicit none

  character(len=*), parameter :: default_config = 'examples/c/train_mlp.json'
  real(real64), parameter :: required_factor = 5.0_real64
  integer, parameter :: final_window = 10

  type(dsm_mesh_t) :: mesh
  type(dsm_engine_t) :: engine
  type(dsm_step_info_t) :: info
  logical :: stop_now
  type(dsm_param_desc_t) :: params(2 * nlayers)
  integer, target :: fan_in(nlayers)
  character(len=:), allocatable :: config, ckpt_dir, text, client
  character(len=4096) :: arg
  integer :: ierr, st, rank, world, provided, dp_rank, dp_size, dtype, nargs, a, l, exit_code
  integer(int64) :: steps, save_every, step, first, m, print_every, last, s
  integer(c_int64_t) :: train_batch, micro_batch, accumulation, data_parallel
  logical :: describe, bad_usage, resumed, ok, all_ok
  real(real64) :: window, loss, scale, initial_loss, final_loss
  real(real64), allocatable :: history(:)
  ! Scratch space, sized by the micro-batch: act(l) is the input of layer l
  ! (act(1) = the inputs x), act(nlayers + 1) the output.
  type :: activation
     real(c_float), allocatable :: v(:, :)
  end type activation
  type(activation) :: act(nlayers + 1)
  real(c_float), allocatable :: t(:, :), dz(:, :), dx(:, :), w(:, :), b(:), gw(:, :), gb(:)

  call MPI_Init_thread(MPI_THREAD_FUNNELED, provided, ierr)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  call MPI_Comm_size(MPI_COMM_WORLD, world, ierr)
  exit_code = 1

  ! ------------------------------------------------------- command line
  config = default_config
  steps = 200
  save_every = 50
  describe = .false.
  bad_usage = .false.
  nargs = command_argument_count()
  a = 1
  do while (a <= nargs)
     call get_command_argument(a, arg)
     select case (trim(arg))
     case ('--steps')
        call int_argument(a + 1, steps)
        a = a + 1
     case ('--save-every')
        call int_argument(a + 1, save_every)
        a = a + 1
     case ('--checkpoint')
        if (a + 1 > nargs) then
           bad_usage = .true.
        else
           call get_command_argument(a + 1, arg)
           ckpt_dir = trim(arg)
        end if
        a = a + 1
     case ('--describe')
        describe = .true.
     case default
        if (arg(1:1) == '-') then
           bad_usage = .true.
        else
           config = trim(arg)
        end if
     end select
     a = a + 1
  end do
  if (bad_usage) then ! the same arguments on every rank: all stop here
     if (rank == 0) write (error_unit, '(a)') 'usage: train_mlp [CONFIG.json] [--steps N] [--describe] ' // &
          '[--checkpoint DIR [--save-every K]]'
     call MPI_Finalize(ierr)
     stop 1
  end if

  main: block
    ! ----------------------------------------------------- the model
    ! Names as a PyTorch state_dict would have them; the biases start at zero
    ! and are excluded from weight decay, as usual.
    call make_teacher()
    do l = 1, nlayers
       fan_in(l) = widths(l)
       params(2 * l - 1) = dsm_param_desc_t(name='fc' // itoa(l) // '.weight', &
            shape=[widths(l), widths(l + 1)], init_user_data=c_loc(fan_in(l)))
       params(2 * l - 1)%init_fn => init_weight
       params(2 * l) = dsm_param_desc_t(name='fc' // itoa(l) // '.bias', shape=[widths(l + 1)], &
            no_weight_decay=.true.)
    end do

    ! The mesh is the job: every rank data parallel. The engine partitions
    ! the model over the mesh's "data_parallel" dimension. The forward and
    ! backward passes run on the CPU, so the engine keeps the model in host
    ! memory, GPUs or not (the default is device-resident where every rank
    ! has a GPU).
    call dsm_mesh_create_dp_sp(MPI_COMM_WORLD, world, 1, mesh, st)
    if (failed(st)) exit main
    call dsm_engine_init_with_options(mesh, config, params, dsm_engine_options_t(device=DSM_DEVICE_HOST), &
         engine, st)
    if (failed(st)) exit main
    call dsm_engine_dtype(engine, dtype, st)
    if (failed(st)) exit main
    ! This rank's share of each global batch: its data-parallel rank, which
    ! node-aware placement may make differ from its MPI rank.
    call dsm_mesh_rank(mesh, 'data_parallel', dp_rank, st)
    if (failed(st)) exit main
    call dsm_mesh_size(mesh, 'data_parallel', dp_size, st)
    if (failed(st)) exit main

    ! The batch sizes after DeepSpeed's arithmetic: this rank's micro-batch
    ! and the micro-steps per optimizer step.
    call dsm_engine_batch(engine, train_batch, micro_batch, accumulation, data_parallel, st)
    if (failed(st)) exit main

    allocate (act(1)%v(d_in, micro_batch), t(d_out, micro_batch), dz(max_width, micro_batch), &
         dx(max_width, micro_batch), w(max_width, max_width), b(max_width), gw(max_width, max_width), &
         gb(max_width), history(steps), stat=st)
    ok = st == 0
    do l = 2, nlayers + 1
       if (ok) then
          allocate (act(l)%v(widths(l), micro_batch), stat=st)
          ok = st == 0
       end if
    end do
    ! Agreed, so that no rank goes on alone.
    call MPI_Allreduce(ok, all_ok, 1, MPI_LOGICAL, MPI_LAND, MPI_COMM_WORLD, ierr)
    if (.not. all_ok) then
       if (.not. ok) write (error_unit, '(a,i0,a)') 'rank ', rank, ': out of memory'
       exit main
    end if

    if (rank == 0) write (output_unit, '(9a,i0,a,i0,a)') 'train_mlp (Fortran): ', config, ', ', &
         itoa(world), ' ranks (data parallel ', itoa(dp_size), '), ', dsm_dtype_name(dtype), &
         ' compute; global batch ', train_batch, '; ', steps, ' steps'

    ! ----------------------------------------------------- resume
    first = 0
    initial_loss = -1.0_real64
    if (allocated(ckpt_dir)) then
       ! DIR/latest when there is one; resumed is .false. on the first run.
       call dsm_engine_resume(engine, ckpt_dir, 0, resumed, client, st)
       if (failed(st)) exit main
       if (len(client) > 0) read (client, *) initial_loss
       call dsm_engine_step_info(engine, info, st)
       if (failed(st)) exit main
       first = info%global_steps
       if (rank == 0 .and. resumed) write (output_unit, '(3a,i0)') 'resumed from ', ckpt_dir // '/latest', &
            ' at step ', first
    end if

    ! ----------------------------------------------------- training
    print_every = max(1_int64, steps / 10)
    do step = first, steps - 1
       window = 0.0_real64 ! this rank's loss over the accumulation window
       do m = 0, accumulation - 1
          ! Global batch `step` holds samples [step * TB, (step + 1) * TB);
          ! micro-step m of data-parallel rank r takes its m-th slice r.
          call make_batch(step * train_batch + (m * dp_size + dp_rank) * micro_batch, act(1)%v, t)
          call forward(loss, st)
          if (failed(st)) exit main
          ! The scale may change at each boundary (fp16 dynamic scaling).
          call dsm_engine_loss_scale(engine, scale, st)
          if (failed(st)) exit main
          call backward(scale, st)
          if (failed(st)) exit main
          ! Every micro-step; the optimizer runs at the boundary.
          call dsm_step(engine, info, st)
          if (failed(st)) exit main
          window = window + loss
       end do
       if (info%boundary == 0) then
          if (rank == 0) write (error_unit, '(a,i0,a)') 'train_mlp: step ', step, ' did not end at a boundary'
          exit main
       end if
       ! The loss of the global batch: the mean over micro-steps and ranks.
       call dsm_engine_mean_loss(engine, window / real(accumulation, real64), 1.0_real64, history(step + 1), st)
       if (failed(st)) exit main
       if (initial_loss < 0) initial_loss = history(step + 1)
       if (rank == 0 .and. (mod(step, print_every) == 0 .or. step == steps - 1)) &
            write (output_unit, '(a,i5,a,f10.6,a,es10.3,a,g0,a,f8.4,a,i0)') 'step ', info%global_steps, &
            '  loss ', history(step + 1), '  lr ', info%lr, '  loss_scale ', info%loss_scale, &
            '  grad_norm ', info%grad_norm, '  skipped ', info%skipped_steps
       ! The stop signal: the same answer on every rank, at a boundary.
       call dsm_engine_stop_requested(engine, stop_now, st)
       if (failed(st)) exit main
       if (allocated(ckpt_dir)) then
          if (mod(step + 1, save_every) == 0 .or. step == steps - 1 .or. stop_now) then
             write (arg, '(es24.16)') initial_loss
             call dsm_engine_save_checkpoint(engine, ckpt_dir, '', trim(adjustl(arg)), st)
             if (failed(st)) exit main
             if (rank == 0) write (output_unit, '(a,i0,2a)') 'saved a checkpoint of step ', &
                  info%global_steps, ' in ', ckpt_dir
          end if
       end if
       if (stop_now .and. step < steps - 1) then
          if (rank == 0) write (output_unit, '(a,i0)') 'train_mlp: stopped on the stop signal after step ', &
               info%global_steps
          exit_code = 3
          exit main
       end if
    end do
    if (first >= steps) then ! resumed at or past the last step: nothing to train
       if (rank == 0) write (output_unit, '(a,i0,a)') 'train_mlp: the checkpoint is at step ', first, &
            ' already; nothing to do'
       exit_code = 0
       exit main
    end if

    ! The mean over the last steps this run trained (up to final_window).
    last = min(steps - first, int(final_window, int64))
    final_loss = 0.0_real64
    do s = steps - last + 1, steps
       final_loss = final_loss + history(s)
    end do
    final_loss = final_loss / real(last, real64)
    if (rank == 0) write (output_unit, '(a,f8.6,a,f8.6,a)') 'final loss ', final_loss, ' (initial ', &
         initial_loss, ')'

    if (describe) then
       call dsm_engine_describe(engine, DSM_FORMAT_TEXT, text, st)
       if (failed(st)) exit main
       if (rank == 0) write (output_unit, '(a)', advance='no') text
    end if

    ! Every rank has the same losses (allreduced), so every rank decides alike.
    if (final_loss * required_factor <= initial_loss) then
       exit_code = 0
    else
       exit_code = 2
       if (rank == 0) write (output_unit, '(a,f0.1)') 'train_mlp: the loss fell by less than a factor of ', &
            required_factor
    end if
  end block main

  ! dsm_engine_free is collective; it is also the one call an engine accepts
  ! after a failed collective call.
  call dsm_engine_free(engine, st)
  if (st /= DSM_SUCCESS) then
     write (error_unit, '(a,i0,2a)') 'rank ', rank, ': dsm_engine_free failed: ', dsm_last_error()
     exit_code = 1
  end if
  call dsm_mesh_free(mesh, st)
  flush (output_unit)
  call MPI_Finalize(ierr)
  if (exit_code /= 0) stop exit_code

contains

  ! Whether a call failed; if so every rank prints the status and the
  ! message (which names the function).
  logical function failed(status)
    integer, intent(in) :: status

    failed = status /= DSM_SUCCESS
    if (failed) write (error_unit, '(a,i0,4a)') 'rank ', rank, ': ', dsm_status_string(status), ': ', &
         dsm_last_error()
  end function failed

  function itoa(i) result(str)
    integer, intent(in) :: i
    character(len=:), allocatable :: str
    character(len=16) :: buf

    write (buf, '(i0)') i
    str = trim(buf)
  end function itoa

  subroutine int_argument(pos, value)
    integer, intent(in) :: pos
    integer(int64), intent(out) :: value
    character(len=64) :: text
    integer :: ios

    value = 0
    if (pos > command_argument_count()) then
       bad_usage = .true.
       return
    end if
    call get_command_argument(pos, text)
    read (text, *, iostat=ios) value
    if (ios /= 0 .or. value < 1) bad_usage = .true.
  end subroutine int_argument

  ! Parameter index (0-based, the position in params) of layer l's weight
  ! and bias.
  integer function weight_index(layer)
    integer, intent(in) :: layer
    weight_index = 2 * layer - 2
  end function weight_index

  integer function bias_index(layer)
    integer, intent(in) :: layer
    bias_index = 2 * layer - 1
  end function bias_index

  ! The model's math is fp32 whatever the engine computes in:
  ! dsm_engine_param_read_f32 copies a parameter out as fp32 (acquire, a
  ! gather under ZeRO-3, convert, release: the gathered copy is freed at
  ! once) and dsm_engine_grad_add_f32 adds an fp32 gradient into its buffer
  ! (a 16-bit one read, added to in fp32 and written back, rounding once;
  ! under ZeRO-2/3 the release may reduce a full bucket). A weight is a
  ! rank-2 array of the shape it was declared with, checked by the binding.

  ! Forward over the micro-batch in act(1)%v, t: the mean squared error in
  ! loss. Parameters are acquired in layer order, the same on every rank.
  subroutine forward(loss, status)
    real(real64), intent(out) :: loss
    integer, intent(out) :: status
    integer :: l, in, out

    loss = 0.0_real64
    do l = 1, nlayers
       in = widths(l)
       out = widths(l + 1)
       call dsm_engine_param_read_f32(engine, weight_index(l), w(1:in, 1:out), status)
       if (status /= DSM_SUCCESS) return
       call dsm_engine_param_read_f32(engine, bias_index(l), b(1:out), status)
       if (status /= DSM_SUCCESS) return
       call linear_forward(act(l)%v, w(1:in, 1:out), b(1:out), act(l + 1)%v)
       if (l < nlayers) act(l + 1)%v = tanh(act(l + 1)%v)
    end do
    loss = sum(real(act(nlayers + 1)%v - t, real64)**2) / real(size(t), real64)
  end subroutine forward

  ! Backward: the gradient of (mean loss over the micro-batch) x loss_scale,
  ! layer by layer in reverse order. Each layer above the first re-fetches
  ! its weight for the input gradient (under ZeRO-3 a second gather, as
  ! DeepSpeed does in backward). The order of calls is the same on every rank.
  subroutine backward(loss_scale, status)
    real(real64), intent(in) :: loss_scale
    integer, intent(out) :: status
    integer :: l, in, out, n

    n = size(t, 2)
    ! d(mean of (y - t)^2)/dy, times the loss scale: in fp16 small gradients
    ! would otherwise flush to zero. The engine divides it out again, with
    ! the accumulation steps: no division by them here.
    dz(1:d_out, 1:n) = real(2.0_real64 * loss_scale / real(size(t), real64), c_float) &
         * (act(nlayers + 1)%v - t)
    do l = nlayers, 1, -1
       in = widths(l)
       out = widths(l + 1)
       if (l > 1) then
          call dsm_engine_param_read_f32(engine, weight_index(l), w(1:in, 1:out), status)
          if (status /= DSM_SUCCESS) return
          call linear_backward(act(l)%v, w(1:in, 1:out), dz(1:out, 1:n), gw(1:in, 1:out), gb(1:out), &
               dx(1:in, 1:n))
       else
          call linear_backward(act(l)%v, w(1:in, 1:out), dz(1:out, 1:n), gw(1:in, 1:out), gb(1:out))
       end if
       call dsm_engine_grad_add_f32(engine, weight_index(l), gw(1:in, 1:out), status)
       if (status /= DSM_SUCCESS) return
       call dsm_engine_grad_add_f32(engine, bias_index(l), gb(1:out), status)
       if (status /= DSM_SUCCESS) return
       ! Through tanh: d tanh(z)/dz = 1 - tanh(z)^2.
       if (l > 1) dz(1:in, 1:n) = dx(1:in, 1:n) * (1.0_c_float - act(l)%v**2)
    end do
  end subroutine backward

end program train_mlp
