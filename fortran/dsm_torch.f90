!> Fortran module of the PyTorch bridge libdsm_torch (C header dsm/torch.h):
!> train a TorchScript model on libdsm's engine from Fortran arrays.
!>
!>   use dsm          ! the mesh, the engine, dsm_step_info_t, dtypes
!>   use dsm_torch    ! the model, dsm_torch_tensor(array), the calls
!>
!> Conventions are module dsm's: handles are bind(C) types wrapping a c_ptr,
!> strings go in as Fortran strings, every procedure takes an optional
!> trailing ierr: present, it receives the status; absent, a failure prints
!> the status and dsm_last_error() on standard error and stops the program
!> with MPI_Abort(MPI_COMM_WORLD, status) while MPI is initialized (else
!> error stop status), as module dsm does.
!> Arrays are column-major: dsm_torch_tensor(x) describes x with its Fortran
!> shape and column_major = 1, so the model sees the dimensions reversed
!> over the same memory: x(features, batch) is the tensor [batch, features].
!> Link with -ldsm_torchf -ldsm_torch -ldsmf -ldsm (pkg-config dsm-torch).
module dsm_torch
  use, intrinsic :: iso_c_binding
  use, intrinsic :: iso_fortran_env, only: error_unit
  use mpi, only: MPI_COMM_WORLD, MPI_Abort, MPI_Initialized, MPI_Finalized, MPI_Comm_rank
  use dsm, only: dsm_mesh_t, dsm_engine_t, dsm_step_info_t, dsm_last_error, dsm_status_string, DSM_SUCCESS, &
       DSM_FLOAT32, DSM_FLOAT64, DSM_INT32, DSM_INT64
  implicit none
  private

  !> The constants of dsm/torch.h.
  integer, parameter, public :: DSM_TORCH_MAX_DIMS = 8
  integer, parameter, public :: DSM_TORCH_MEMORY_HOST = 0, DSM_TORCH_MEMORY_CUDA = 1
  integer, parameter, public :: DSM_TORCH_LOSS_CONFIG = 0, DSM_TORCH_LOSS_MSE = 1, &
       DSM_TORCH_LOSS_CROSS_ENTROPY = 2, DSM_TORCH_LOSS_MODEL = 3
  integer, parameter, public :: DSM_TORCH_ZERO3_AUTO = 0, DSM_TORCH_ZERO3_WHOLE = 1, DSM_TORCH_ZERO3_BLOCKS = 2

  !> A model on an engine (C dsm_torch_model_t): null until created.
  type, bind(C), public :: dsm_torch_model_t
     type(c_ptr) :: ptr = c_null_ptr
  end type dsm_torch_model_t

  !> One array of the caller (C dsm_torch_tensor_t, field for field); build
  !> it with dsm_torch_tensor(array).
  type, bind(C), public :: dsm_torch_tensor_t
     type(c_ptr) :: data = c_null_ptr
     integer(c_int) :: dtype = 0
     integer(c_int) :: ndim = 0
     integer(c_int64_t) :: shape(DSM_TORCH_MAX_DIMS) = 0
     integer(c_int) :: memory = DSM_TORCH_MEMORY_HOST
     integer(c_int) :: column_major = 1
  end type dsm_torch_tensor_t

  ! The fields of dsm_torch_options_t without initialization, for its size.
  type, bind(C) :: options_fields
     integer(c_size_t) :: size
     integer(c_int) :: loss, zero3_mode
     type(c_ptr) :: engine_options
  end type options_fields
  type(options_fields), parameter :: options_proto = options_fields(0_c_size_t, 0_c_int, 0_c_int, c_null_ptr)
  !> sizeof(dsm_torch_options_t) in C: the value the size field starts with.
  integer(c_size_t), parameter, public :: DSM_TORCH_OPTIONS_SIZE = c_sizeof(options_proto)

  !> The options of dsm_torch_model_create (C dsm_torch_options_t); the
  !> default initialization is DSM_TORCH_OPTIONS_INITIALIZER.
  type, bind(C), public :: dsm_torch_options_t
     integer(c_size_t) :: size = DSM_TORCH_OPTIONS_SIZE
     integer(c_int) :: loss = DSM_TORCH_LOSS_CONFIG
     integer(c_int) :: zero3_mode = DSM_TORCH_ZERO3_AUTO
     type(c_ptr) :: engine_options = c_null_ptr
  end type dsm_torch_options_t

  !> A dsm_torch_tensor_t over a real32, real64, int32 or int64 array of any
  !> rank (1..8), contiguous, with the target attribute where it is declared.
  interface dsm_torch_tensor
     module procedure tensor_f32, tensor_f64, tensor_i32, tensor_i64
  end interface dsm_torch_tensor

  public :: dsm_torch_tensor, dsm_torch_model_create, dsm_torch_model_free, dsm_torch_model_borrow_engine
  public :: dsm_torch_train_step, dsm_torch_inference, dsm_torch_save_checkpoint, dsm_torch_load_checkpoint
  public :: dsm_torch_export_safetensors, dsm_torch_export_torchscript
  public :: dsm_torch_model_describe, dsm_torch_version

  interface
     function c_model_create(mesh, model_path, config, options, model) &
          bind(C, name='dsm_torch_model_create') result(st)
       import :: c_ptr, c_char, c_int
       type(c_ptr), value :: mesh
       character(kind=c_char), dimension(*), intent(in) :: model_path, config
       type(c_ptr), value :: options
       type(c_ptr), intent(out) :: model
       integer(c_int) :: st
     end function c_model_create
     function c_model_free(model) bind(C, name='dsm_torch_model_free') result(st)
       import :: c_ptr, c_int
       type(c_ptr), intent(inout) :: model
       integer(c_int) :: st
     end function c_model_free
     function c_model_borrow_engine(model, engine) bind(C, name='dsm_torch_model_borrow_engine') result(st)
       import :: c_ptr, c_int
       type(c_ptr), value :: model
       type(c_ptr), intent(out) :: engine
       integer(c_int) :: st
     end function c_model_borrow_engine
     function c_train_step(model, inputs, ninputs, labels, loss, info) &
          bind(C, name='dsm_torch_train_step') result(st)
       import :: c_ptr, c_int, c_double, dsm_torch_tensor_t
       type(c_ptr), value :: model
       type(dsm_torch_tensor_t), dimension(*), intent(in) :: inputs
       integer(c_int), value :: ninputs
       type(c_ptr), value :: labels
       real(c_double), intent(out) :: loss
       type(c_ptr), value :: info
       integer(c_int) :: st
     end function c_train_step
     function c_inference(model, inputs, ninputs, output) bind(C, name='dsm_torch_inference') result(st)
       import :: c_ptr, c_int, dsm_torch_tensor_t
       type(c_ptr), value :: model
       type(dsm_torch_tensor_t), dimension(*), intent(in) :: inputs
       integer(c_int), value :: ninputs
       type(dsm_torch_tensor_t), intent(inout) :: output
       integer(c_int) :: st
     end function c_inference
     function c_save_checkpoint(model, dir, tag) bind(C, name='dsm_torch_save_checkpoint') result(st)
       import :: c_ptr, c_char, c_int
       type(c_ptr), value :: model
       character(kind=c_char), dimension(*), intent(in) :: dir
       type(c_ptr), value :: tag
       integer(c_int) :: st
     end function c_save_checkpoint
     function c_load_checkpoint(model, dir, tag, flags) bind(C, name='dsm_torch_load_checkpoint') result(st)
       import :: c_ptr, c_char, c_int
       type(c_ptr), value :: model
       character(kind=c_char), dimension(*), intent(in) :: dir
       type(c_ptr), value :: tag
       integer(c_int), value :: flags
       integer(c_int) :: st
     end function c_load_checkpoint
     function c_export_safetensors(model, path) bind(C, name='dsm_torch_export_safetensors') result(st)
       import :: c_ptr, c_char, c_int
       type(c_ptr), value :: model
       character(kind=c_char), dimension(*), intent(in) :: path
       integer(c_int) :: st
     end function c_export_safetensors
     function c_export_torchscript(model, path) bind(C, name='dsm_torch_export_torchscript') result(st)
       import :: c_ptr, c_char, c_int
       type(c_ptr), value :: model
       character(kind=c_char), dimension(*), intent(in) :: path
       integer(c_int) :: st
     end function c_export_torchscript
     function c_model_describe(model, format, text) bind(C, name='dsm_torch_model_describe') result(st)
       import :: c_ptr, c_int
       type(c_ptr), value :: model
       integer(c_int), value :: format
       type(c_ptr), intent(out) :: text
       integer(c_int) :: st
     end function c_model_describe
     function c_version(libtorch_version, cuda) bind(C, name='dsm_torch_version') result(st)
       import :: c_ptr, c_int
       type(c_ptr), intent(out) :: libtorch_version
       integer(c_int), intent(out) :: cuda
       integer(c_int) :: st
     end function c_version
     subroutine c_free(p) bind(C, name='dsm_free')
       import :: c_ptr
       type(c_ptr), value :: p
     end subroutine c_free
     function c_strlen(s) bind(C, name='strlen') result(n)
       import :: c_ptr, c_size_t
       type(c_ptr), value :: s
       integer(c_size_t) :: n
     end function c_strlen
  end interface

contains

  ! Report a status as module dsm does: into ierr when present, else a
  ! failure prints "where failed (status)" and dsm_last_error() on standard
  ! error and stops the program: MPI_Abort(MPI_COMM_WORLD, status) while MPI
  ! is initialized and not finalized, else error stop status.
  subroutine finish(status, where, ierr)
    integer(c_int), intent(in) :: status
    character(len=*), intent(in) :: where
    integer, intent(out), optional :: ierr
    logical :: initialized, finalized
    integer :: mpierr, rank

    if (present(ierr)) then
       ierr = int(status)
       return
    end if
    if (status == DSM_SUCCESS) return
    call MPI_Initialized(initialized, mpierr)
    call MPI_Finalized(finalized, mpierr)
    rank = -1
    if (initialized .and. .not. finalized) call MPI_Comm_rank(MPI_COMM_WORLD, rank, mpierr)
    if (rank >= 0) then
       write (error_unit, '(a,i0,5a)') 'libdsm: rank ', rank, ': ', where, ' failed (', &
            dsm_status_string(int(status)), ')'
       write (error_unit, '(a,i0,2a)') 'libdsm: rank ', rank, ': ', dsm_last_error()
    else
       write (error_unit, '(5a)') 'libdsm: ', where, ' failed (', dsm_status_string(int(status)), ')'
       write (error_unit, '(2a)') 'libdsm: ', dsm_last_error()
    end if
    flush (error_unit)
    if (initialized .and. .not. finalized) call MPI_Abort(MPI_COMM_WORLD, int(status), mpierr)
    error stop int(status)
  end subroutine finish

  ! A C string (NUL-terminated; NULL: '') as a Fortran string of its length.
  function c_string(p) result(s)
    type(c_ptr), intent(in) :: p
    character(len=:), allocatable :: s
    character(kind=c_char), dimension(:), pointer :: chars
    integer :: i, n

    if (.not. c_associated(p)) then
       s = ''
       return
    end if
    n = int(c_strlen(p))
    call c_f_pointer(p, chars, [n])
    allocate (character(len=n) :: s)
    do i = 1, n
       s(i:i) = chars(i)
    end do
  end function c_string

  function tensor_f32(a) result(t)
    real(c_float), dimension(..), intent(in), target, contiguous :: a
    type(dsm_torch_tensor_t) :: t
    t = describe(c_loc(a), DSM_FLOAT32, shape(a, kind=c_int64_t))
  end function tensor_f32

  function tensor_f64(a) result(t)
    real(c_double), dimension(..), intent(in), target, contiguous :: a
    type(dsm_torch_tensor_t) :: t
    t = describe(c_loc(a), DSM_FLOAT64, shape(a, kind=c_int64_t))
  end function tensor_f64

  function tensor_i32(a) result(t)
    integer(c_int32_t), dimension(..), intent(in), target, contiguous :: a
    type(dsm_torch_tensor_t) :: t
    t = describe(c_loc(a), DSM_INT32, shape(a, kind=c_int64_t))
  end function tensor_i32

  function tensor_i64(a) result(t)
    integer(c_int64_t), dimension(..), intent(in), target, contiguous :: a
    type(dsm_torch_tensor_t) :: t
    t = describe(c_loc(a), DSM_INT64, shape(a, kind=c_int64_t))
  end function tensor_i64

  function describe(p, dtype, extents) result(t)
    type(c_ptr), intent(in) :: p
    integer, intent(in) :: dtype
    integer(c_int64_t), dimension(:), intent(in) :: extents
    type(dsm_torch_tensor_t) :: t
    integer :: n

    n = min(size(extents), DSM_TORCH_MAX_DIMS)
    t%data = p
    t%dtype = int(dtype, c_int)
    t%ndim = int(size(extents), c_int)   ! more than 8 dimensions: the C call names it
    t%shape = 0
    t%shape(1:n) = extents(1:n)
    t%memory = DSM_TORCH_MEMORY_HOST
    t%column_major = 1
  end function describe

  !> Load a TorchScript model and create its engine (dsm_torch_model_create(3)).
  !> Collective over the mesh.
  subroutine dsm_torch_model_create(mesh, model_path, config, model, options, ierr)
    type(dsm_mesh_t), intent(in) :: mesh
    character(len=*), intent(in) :: model_path, config
    type(dsm_torch_model_t), intent(out) :: model
    type(dsm_torch_options_t), intent(in), optional, target :: options
    integer, intent(out), optional :: ierr
    type(c_ptr) :: opts

    opts = c_null_ptr
    if (present(options)) opts = c_loc(options)
    call finish(c_model_create(mesh%ptr, trim(model_path)//c_null_char, trim(config)//c_null_char, opts, &
         model%ptr), 'dsm_torch_model_create', ierr)
  end subroutine dsm_torch_model_create

  !> Free a model and its engine (dsm_torch_model_free(3)). Collective.
  subroutine dsm_torch_model_free(model, ierr)
    type(dsm_torch_model_t), intent(inout) :: model
    integer, intent(out), optional :: ierr
    call finish(c_model_free(model%ptr), 'dsm_torch_model_free', ierr)
  end subroutine dsm_torch_model_free

  !> The model's engine, owned by the model (dsm_torch_model_borrow_engine(3)).
  subroutine dsm_torch_model_borrow_engine(model, engine, ierr)
    type(dsm_torch_model_t), intent(in) :: model
    type(dsm_engine_t), intent(out) :: engine
    integer, intent(out), optional :: ierr
    call finish(c_model_borrow_engine(model%ptr, engine%ptr), 'dsm_torch_model_borrow_engine', ierr)
  end subroutine dsm_torch_model_borrow_engine

  !> One training micro-step (dsm_torch_train_step(3)): inputs(:) from
  !> dsm_torch_tensor, labels (absent only with DSM_TORCH_LOSS_MODEL),
  !> this rank's loss, and what dsm_step did. Collective.
  subroutine dsm_torch_train_step(model, inputs, labels, loss, info, ierr)
    type(dsm_torch_model_t), intent(in) :: model
    type(dsm_torch_tensor_t), dimension(:), intent(in) :: inputs
    type(dsm_torch_tensor_t), intent(in), optional, target :: labels
    real(c_double), intent(out), optional :: loss
    type(dsm_step_info_t), intent(inout), optional, target :: info
    integer, intent(out), optional :: ierr
    type(c_ptr) :: lab, inf
    real(c_double) :: l

    lab = c_null_ptr
    inf = c_null_ptr
    if (present(labels)) lab = c_loc(labels)
    if (present(info)) inf = c_loc(info)
    l = 0
    call finish(c_train_step(model%ptr, inputs, int(size(inputs), c_int), lab, l, inf), 'dsm_torch_train_step', ierr)
    if (present(loss)) loss = l
  end subroutine dsm_torch_train_step

  !> The model's output on inputs(:), without gradients, into output
  !> (dsm_torch_inference(3)). Collective under ZeRO-3.
  subroutine dsm_torch_inference(model, inputs, output, ierr)
    type(dsm_torch_model_t), intent(in) :: model
    type(dsm_torch_tensor_t), dimension(:), intent(in) :: inputs
    type(dsm_torch_tensor_t), intent(inout) :: output
    integer, intent(out), optional :: ierr
    call finish(c_inference(model%ptr, inputs, int(size(inputs), c_int), output), 'dsm_torch_inference', ierr)
  end subroutine dsm_torch_inference

  !> Save a checkpoint through the engine (dsm_torch_save_checkpoint(3));
  !> tag '' or absent: "global_step<N>". Collective.
  subroutine dsm_torch_save_checkpoint(model, dir, tag, ierr)
    type(dsm_torch_model_t), intent(in) :: model
    character(len=*), intent(in) :: dir
    character(len=*), intent(in), optional :: tag
    integer, intent(out), optional :: ierr
    character(kind=c_char, len=:), allocatable, target :: t

    if (present(tag)) then
       if (len_trim(tag) > 0) then
          t = trim(tag)//c_null_char
          call finish(c_save_checkpoint(model%ptr, trim(dir)//c_null_char, c_loc(t)), 'dsm_torch_save_checkpoint', ierr)
          return
       end if
    end if
    call finish(c_save_checkpoint(model%ptr, trim(dir)//c_null_char, c_null_ptr), 'dsm_torch_save_checkpoint', ierr)
  end subroutine dsm_torch_save_checkpoint

  !> Load a checkpoint (dsm_torch_load_checkpoint(3)); tag '' or absent:
  !> the one dir/latest names; flags: DSM_CKPT_LOAD_* of module dsm. Collective.
  subroutine dsm_torch_load_checkpoint(model, dir, tag, flags, ierr)
    type(dsm_torch_model_t), intent(in) :: model
    character(len=*), intent(in) :: dir
    character(len=*), intent(in), optional :: tag
    integer, intent(in), optional :: flags
    integer, intent(out), optional :: ierr
    character(kind=c_char, len=:), allocatable, target :: t
    integer(c_int) :: f
    type(c_ptr) :: tp

    f = 0
    if (present(flags)) f = int(flags, c_int)
    tp = c_null_ptr
    if (present(tag)) then
       if (len_trim(tag) > 0) then
          t = trim(tag)//c_null_char
          tp = c_loc(t)
       end if
    end if
    call finish(c_load_checkpoint(model%ptr, trim(dir)//c_null_char, tp, f), 'dsm_torch_load_checkpoint', ierr)
  end subroutine dsm_torch_load_checkpoint

  !> The trained parameters and buffers as safetensors (dsm_torch_export_safetensors(3)). Collective.
  subroutine dsm_torch_export_safetensors(model, path, ierr)
    type(dsm_torch_model_t), intent(in) :: model
    character(len=*), intent(in) :: path
    integer, intent(out), optional :: ierr
    call finish(c_export_safetensors(model%ptr, trim(path)//c_null_char), 'dsm_torch_export_safetensors', ierr)
  end subroutine dsm_torch_export_safetensors

  !> The model with its trained parameters as a TorchScript file (dsm_torch_export_torchscript(3)). Collective.
  subroutine dsm_torch_export_torchscript(model, path, ierr)
    type(dsm_torch_model_t), intent(in) :: model
    character(len=*), intent(in) :: path
    integer, intent(out), optional :: ierr
    call finish(c_export_torchscript(model%ptr, trim(path)//c_null_char), 'dsm_torch_export_torchscript', ierr)
  end subroutine dsm_torch_export_torchscript

  !> The model as text (dsm_torch_model_describe(3)): format DSM_FORMAT_TEXT
  !> or DSM_FORMAT_JSON of module dsm; the ZeRO-3 mode and why, the
  !> parameters, the step timers. Not collective.
  subroutine dsm_torch_model_describe(model, format, text, ierr)
    type(dsm_torch_model_t), intent(in) :: model
    integer, intent(in) :: format
    character(len=:), allocatable, intent(out) :: text
    integer, intent(out), optional :: ierr
    type(c_ptr) :: p
    integer(c_int) :: st

    p = c_null_ptr
    st = c_model_describe(model%ptr, int(format, c_int), p)
    text = c_string(p)
    call c_free(p)
    call finish(st, 'dsm_torch_model_describe', ierr)
  end subroutine dsm_torch_model_describe

  !> The LibTorch version the bridge was built against ("1.13.0") and whether
  !> it is a CUDA build (dsm_torch_version(3)). Not collective.
  subroutine dsm_torch_version(libtorch_version, cuda, ierr)
    character(len=:), allocatable, intent(out) :: libtorch_version
    logical, intent(out) :: cuda
    integer, intent(out), optional :: ierr
    type(c_ptr) :: p
    integer(c_int) :: c, st

    p = c_null_ptr
    c = 0
    st = c_version(p, c)
    libtorch_version = c_string(p)
    cuda = c /= 0
    call finish(st, 'dsm_torch_version', ierr)
  end subroutine dsm_torch_version

end module dsm_torch
