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
! character(len=:), allocatable here; dsm_free, void in C, is a subroutine
! whose optional ierr is always DSM_SUCCESS (every subroutine takes one).
!
! Conventions:
!   - Integers (shapes, ranks, sizes, MPI handles) are default INTEGER,
!     except those that are int64_t or size_t in C and count elements,
!     bytes, tokens, samples or steps, which are integer(c_int64_t): the
!     batch values, world and data-parallel sizes and step counts of the
!     dsm_config routines, parameter element counts, the tensor sizes and
!     counts of sequence parallelism, tokens, sample indices, epochs and
!     micro-batch numbers, byte counts. Parameter shapes stay default INTEGER.
!   - Communicators go in and come out as the integer handles of `use mpi`;
!     every routine that takes or returns a communicator also accepts
!     type(MPI_Comm) from `use mpi_f08` (a generic interface with two
!     specifics).
!   - Dimension indices (the dim argument of dsm_mesh_dim_size,
!     dsm_mesh_dim_rank, dsm_mesh_get_dim_name, dsm_mesh_get_dim_index) are
!     0-based as in C: 0 is the outermost dimension.
!   - Names are character strings; trailing blanks are ignored. A group name
!     of '' (empty or all blanks) means the whole mesh (C NULL). Likewise ''
!     is C NULL for the group of dsm_sp_create ("sequence_parallel") and the
!     tag of the checkpoint routines ("global_step<N>" when saving, the one
!     DIR/latest names when loading).
!   - Collective routines follow the C rules: every rank of the communicator
!     calls them, and every rank gets the same status.
!   - Handles (type(dsm_mesh_t), type(dsm_config_t), type(dsm_engine_t),
!     type(dsm_sp_t), type(dsm_sampler_t)) start out null; the dsm_*_free
!     routines make them null again. c_associated(mesh%ptr) tells whether a
!     handle is live. The mesh from dsm_engine_get_mesh belongs to the
!     engine: do not free it.
!   - Indices are 0-based as in C, like dimension indices: parameter indices
!     (params(i) of dsm_engine_init has index i - 1; dsm_engine_param_index
!     gives it by name), head indices, sample indices, epochs and
!     micro-batch numbers. A Fortran dataset data(:, 1:n) holds sample k in
!     data(:, k + 1).
!   - A configuration (dsm_config_load, dsm_config_load_for_mesh,
!     dsm_config_resolve) is the path of a JSON file or inline JSON text
!     starting with '{'; trailing blanks are ignored.
!   - Shapes and memory order. C tensors are row-major (last index fastest),
!     Fortran arrays column-major (first index fastest), so the same memory
!     has reversed shapes in the two languages. The bindings give every
!     shape in Fortran order and reverse it for C: a parameter declared with
!     shape = [n, m] is the Fortran array w(n, m), stored by the engine as
!     the C tensor [m][n] (which is how checkpoints and C, Python or h5py
!     tools show it; HDF5's own Fortran API shows it as (n, m) again). A
!     parameter is a flat buffer of numel elements to the engine: element
!     w(i, j) is flat element (i - 1) + (j - 1) * n, so Fortran arrays map
!     onto it with no transposition (init_values, the init_fn ranges, the
!     pointers of dsm_engine_param_acquire and dsm_engine_grad_acquire).
!     The same holds for the tensors of sequence parallelism, whose C
!     layouts [b, s, H, d] (DSM_SP_BATCH_FIRST) and [s, b, H, d]
!     (DSM_SP_SEQ_FIRST) are the Fortran arrays x(d, H, s, b) and
!     x(d, H, b, s), and for the [batch, seq] token arrays of
!     dsm_sp_shard_batch, which are tokens(seq, batch) here: one sequence
!     per column.
!   - Pointers. Memory that libdsm owns (parameters, gradient buffers,
!     dsm_sp_alloc memory) is handed out as type(c_ptr), and where the dtype
!     allows as a Fortran pointer made with c_f_pointer: real(c_float),
!     pointer, dimension(:) (numel elements) or dimension(:,:) (a shape the
!     caller gives, whose product must be numel). The real(c_float) forms
!     need the dtype DSM_FLOAT32; 16-bit dtypes use the type(c_ptr) form and
!     dsm_convert. Pointers are valid until the matching release (or free).
!     The real(c_float) array forms of the sequence-parallel transforms take
!     the arrays as memory: a count is the array's size in bytes over the
!     size of t%dtype (size(x) for DSM_FLOAT32).
!     Arrays handed to libdsm as type(c_ptr) come from c_loc of a
!     contiguous array with the TARGET attribute, or from libdsm.
!   - Byte blobs (the client state of checkpoints) are integer(c_int8_t)
!     arrays or character strings (every character counts, trailing blanks
!     included); a blob libdsm returns is allocated by the bindings and the
!     C copy freed with dsm_free inside them.
!   - Options structures of C (the sampler options) are optional keyword
!     arguments here, with the C defaults; logical where C uses an int as a
!     flag. Output structures (dsm_step_info_t), tensor descriptions
!     (dsm_sp_tensor_t) and the engine's options (dsm_engine_options_t) are
!     bind(C) derived types with the fields of C in the same order; the
!     default initialization of dsm_step_info_t is DSM_STEP_INFO_INITIALIZER
!     and that of dsm_engine_options_t DSM_ENGINE_OPTIONS_INITIALIZER (their
!     size fields included), that of dsm_sp_tensor_t leaves only the sizes to
!     set.
!   - CUDA streams (dsm_engine_set_stream, dsm_engine_get_stream: C's
!     dsm/cuda.h) are the cudaStream_t pointer as type(c_ptr); a CUDA
!     Fortran integer(cuda_stream_kind) stream converts with
!     transfer(stream, c_null_ptr), and back with transfer(ptr, stream).
!   - Errors the bindings find themselves (a real(c_float) pointer asked
!     for on an engine whose dtype is not DSM_FLOAT32, a shape whose product
!     is not numel, positions or labels shaped unlike the tokens, a negative
!     element count for dsm_convert) give DSM_ERR_INVALID_ARGUMENT, with no
!     C call or after locally releasing what the call had just acquired.
!     dsm_get_last_error() does not describe them (C offers no way to set
!     it): they are printed when ierr is absent. A binding never skips a
!     collective C call because of an argument that may differ between
!     ranks, so no rank is left waiting: such arguments (the counts of the
!     sequence-parallel transforms, the shape of a rank-2 parameter pointer)
!     go to C, which fails every rank, or are checked after the call.
!
! The module holds no state of its own and is thread safe in the same way as
! the C library.
module dsm
  use, intrinsic :: iso_c_binding, only: c_int, c_long_long, c_int64_t, c_int8_t, c_char, c_size_t, &
       c_float, c_double, c_ptr, c_funptr, c_null_ptr, c_null_funptr, c_null_char, c_loc, c_funloc, &
       c_f_pointer, c_associated, c_sizeof
  use, intrinsic :: iso_fortran_env, only: error_unit
  use mpi, only: MPI_COMM_WORLD, MPI_Abort, MPI_Initialized, MPI_Finalized
  use mpi_f08, only: MPI_Comm
  implicit none
  private

  ! The named constants of dsm.h (generated), and the public statement of
  ! the generated wrappers.
  include 'dsm_const.inc'

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

  !> A training engine (C dsm_engine_t). Null until created.
  type, bind(C), public :: dsm_engine_t
     type(c_ptr) :: ptr = c_null_ptr
  end type dsm_engine_t

  !> A sequence-parallel context (C dsm_sp_t). Null until created.
  type, bind(C), public :: dsm_sp_t
     type(c_ptr) :: ptr = c_null_ptr
  end type dsm_sp_t

  !> A data-parallel sampler (C dsm_sampler_t). Null until created.
  type, bind(C), public :: dsm_sampler_t
     type(c_ptr) :: ptr = c_null_ptr
  end type dsm_sampler_t

  !> The C signature of dsm_param_init_fn, for the init_fn component of
  !> type(dsm_param_desc_t): fill values(1:count) with the elements
  !> [offset, offset + count) of parameter index (0-based; the flat element
  !> offset of a Fortran array w is (i - 1) + (j - 1) * size(w, 1) + ... ,
  !> see the conventions) as fp32 and return 0, or nonzero to fail
  !> dsm_engine_init. name is the parameter's name as a C string. Write it as
  !> a bind(C) function with exactly these dummy arguments; it must give the
  !> same values for the same range on every rank.
  abstract interface
     function dsm_param_init_fn(user_data, index, name, offset, count, values) bind(C) result(status)
       import :: c_ptr, c_int, c_int64_t, c_float
       type(c_ptr), value :: user_data
       integer(c_int), value :: index
       type(c_ptr), value :: name
       integer(c_int64_t), value :: offset, count
       real(c_float), dimension(count), intent(out) :: values
       integer(c_int) :: status
     end function dsm_param_init_fn
  end interface

  !> One parameter of the model, for dsm_engine_init (C dsm_param_desc_t).
  !> name:            unique, 1..255 characters without blanks ("fc1.weight";
  !>                  trailing blanks are ignored). Checkpoints use it.
  !>                  Unallocated: the C NULL name (an error).
  !> shape:           the shape of the Fortran array that holds it, in
  !>                  Fortran order (reversed for C, see the conventions);
  !>                  0..DSM_PARAM_MAX_DIMS extents, each >= 1. Unallocated or
  !>                  size 0: a scalar.
  !> dtype:           the dtype of init_values: DSM_FLOAT32 (default),
  !>                  DSM_FLOAT64, DSM_FLOAT16 or DSM_BFLOAT16.
  !> trainable:       .false.: frozen (no gradient, no optimizer state, held
  !>                  whole on every rank). Default .true.
  !> no_weight_decay: .true.: excluded from weight decay. Default .false.
  !> init_values:     c_loc of the whole parameter (a contiguous array of
  !>                  dtype with the TARGET attribute), read on the engine's
  !>                  first rank (rank 0 of its mesh) during dsm_engine_init
  !>                  and broadcast; other ranks may leave it null. Null
  !>                  there and no init_fn: zeros.
  !> init_fn:         a procedure(dsm_param_init_fn), used when init_values
  !>                  is null on the first rank; init_user_data is passed to it.
  !> A structure constructor with keywords is the easy way to fill it:
  !>   params(1) = dsm_param_desc_t(name='fc1.weight', shape=shape(w1), init_values=c_loc(w1))
  type, public :: dsm_param_desc_t
     character(len=:), allocatable :: name
     integer, dimension(:), allocatable :: shape
     integer :: dtype = DSM_FLOAT32
     logical :: trainable = .true.
     logical :: no_weight_decay = .false.
     type(c_ptr) :: init_values = c_null_ptr
     procedure(dsm_param_init_fn), pointer, nopass :: init_fn => null()
     type(c_ptr) :: init_user_data = c_null_ptr
  end type dsm_param_desc_t

  ! The C dsm_param_desc_t, field for field (built inside dsm_engine_init).
  type, bind(C) :: c_param_desc
     type(c_ptr) :: name
     integer(c_int) :: ndims
     type(c_ptr) :: shape
     integer(c_int) :: dtype
     integer(c_int) :: trainable
     integer(c_int) :: no_weight_decay
     type(c_ptr) :: init_values
     type(c_funptr) :: init_fn
     type(c_ptr) :: init_user_data
  end type c_param_desc

  ! The fields of dsm_step_info_t without initialization, for its size.
  type, bind(C) :: step_info_fields
     integer(c_size_t) :: size
     integer(c_int) :: boundary, skipped
     integer(c_int64_t) :: global_steps, micro_steps, skipped_steps, global_samples
     real(c_double) :: lr, loss_scale, grad_norm
  end type step_info_fields

  type(step_info_fields), parameter :: step_info_proto = &
       step_info_fields(0_c_size_t, 0_c_int, 0_c_int, 0_c_int64_t, 0_c_int64_t, 0_c_int64_t, &
       0_c_int64_t, 0.0_c_double, 0.0_c_double, 0.0_c_double)

  !> sizeof(dsm_step_info_t) in C: the value the size field starts with.
  integer(c_size_t), parameter, public :: DSM_STEP_INFO_SIZE = c_sizeof(step_info_proto)

  !> What dsm_step did, and the engine's counters (C dsm_step_info_t, field
  !> for field). The default initialization is DSM_STEP_INFO_INITIALIZER:
  !> size = DSM_STEP_INFO_SIZE, which libdsm checks (leave it alone), the
  !> counters 0, loss_scale 1 and grad_norm -1.
  !>   boundary:       1 when this micro-step ended an accumulation window
  !>   skipped:        1 when gradients overflowed and the update was skipped
  !>   global_steps:   accumulation boundaries so far, skipped ones included
  !>   micro_steps:    dsm_step calls so far
  !>   skipped_steps:  boundaries skipped for overflow
  !>   global_samples: train_batch_size per boundary
  !>   lr:             learning rate of the next optimizer step
  !>   loss_scale:     loss scale for the next micro-step (1 without fp16)
  !>   grad_norm:      global gradient norm of the last boundary, before
  !>                   clipping (-1 before the first)
  type, bind(C), public :: dsm_step_info_t
     integer(c_size_t) :: size = DSM_STEP_INFO_SIZE
     integer(c_int) :: boundary = 0
     integer(c_int) :: skipped = 0
     integer(c_int64_t) :: global_steps = 0
     integer(c_int64_t) :: micro_steps = 0
     integer(c_int64_t) :: skipped_steps = 0
     integer(c_int64_t) :: global_samples = 0
     real(c_double) :: lr = 0.0_c_double
     real(c_double) :: loss_scale = 1.0_c_double
     real(c_double) :: grad_norm = -1.0_c_double
  end type dsm_step_info_t

  ! The fields of dsm_engine_options_t without initialization, for its size.
  type, bind(C) :: engine_options_fields
     integer(c_size_t) :: size
     integer(c_int) :: device, backend, cuda_device
  end type engine_options_fields

  type(engine_options_fields), parameter :: engine_options_proto = &
       engine_options_fields(0_c_size_t, 0_c_int, 0_c_int, 0_c_int)

  !> sizeof(dsm_engine_options_t) in C: the value the size field starts with.
  integer(c_size_t), parameter, public :: DSM_ENGINE_OPTIONS_SIZE = c_sizeof(engine_options_proto)

  !> Options of dsm_engine_init_with_options (C dsm_engine_options_t, field
  !> for field). The default initialization is DSM_ENGINE_OPTIONS_INITIALIZER:
  !> size = DSM_ENGINE_OPTIONS_SIZE, which libdsm checks (leave it alone),
  !> and the defaults below.
  !>   device:      DSM_DEVICE_DEFAULT (DSM_ENGINE_DEVICE, else device-resident
  !>                CUDA where every rank has a GPU of its own and NCCL is built, see
  !>                dsm.h), DSM_DEVICE_HOST, DSM_DEVICE_CUDA or
  !>                DSM_DEVICE_SIMULATED. A program computing on the host
  !>                asks for DSM_DEVICE_HOST.
  !>   backend:     DSM_BACKEND_DEFAULT (DSM_COMM_BACKEND, else auto),
  !>                DSM_BACKEND_AUTO, _MPI, _SHM or _NCCL
  !>   cuda_device: a CUDA device ordinal, or -1 (default): DSM_CUDA_DEVICE,
  !>                the mesh placement's GPU, the node-local rank
  !> e.g. opts = dsm_engine_options_t(device=DSM_DEVICE_HOST)
  type, bind(C), public :: dsm_engine_options_t
     integer(c_size_t) :: size = DSM_ENGINE_OPTIONS_SIZE
     integer(c_int) :: device = DSM_DEVICE_DEFAULT
     integer(c_int) :: backend = DSM_BACKEND_DEFAULT
     integer(c_int) :: cuda_device = -1
  end type dsm_engine_options_t

  !> The global shape of an attention tensor (C dsm_sp_tensor_t, field for
  !> field): the whole sequence and every head, as the single-rank
  !> computation sees it.
  !>   batch (b), seq (s: the whole sequence, a multiple of the group size),
  !>   heads (H), head_dim (d): each >= 1
  !>   layout: DSM_SP_BATCH_FIRST (default) or DSM_SP_SEQ_FIRST
  !>   dtype:  the element type (default DSM_FLOAT32)
  !>   flags:  0 (default) or DSM_SP_REPLICATE
  !> e.g. t = dsm_sp_tensor_t(batch=2, seq=1024, heads=16, head_dim=64)
  type, bind(C), public :: dsm_sp_tensor_t
     integer(c_int64_t) :: batch = 0
     integer(c_int64_t) :: seq = 0
     integer(c_int64_t) :: heads = 0
     integer(c_int64_t) :: head_dim = 0
     integer(c_int) :: layout = DSM_SP_BATCH_FIRST
     integer(c_int) :: dtype = DSM_FLOAT32
     integer(c_int) :: flags = 0
  end type dsm_sp_tensor_t

  ! The C dsm_sampler_options_t, field for field (seed is a uint64_t).
  type, bind(C) :: c_sampler_options
     integer(c_size_t) :: size
     integer(c_int) :: shuffle
     integer(c_int64_t) :: seed
     integer(c_int) :: drop_last
  end type c_sampler_options

  ! ------------------------------------------------------------ public routines
  public :: dsm_status_string, dsm_get_last_error
  public :: dsm_dtype_name
  public :: dsm_mesh_create, dsm_mesh_create_with_options, dsm_mesh_create_dp_sp
  public :: dsm_mesh_get_shape, dsm_mesh_get_coords
  public :: dsm_mesh_comm, dsm_mesh_group_ranks
  public :: dsm_mesh_slice, dsm_mesh_flatten
  public :: dsm_config_load
  public :: dsm_param_init_fn
  public :: dsm_free, dsm_convert
  public :: dsm_engine_init, dsm_engine_init_comm, dsm_engine_init_with_options
  public :: dsm_engine_param_read_f32, dsm_engine_grad_add_f32
  public :: dsm_engine_param_acquire
  public :: dsm_engine_grad_acquire, dsm_step
  public :: dsm_engine_save_checkpoint, dsm_engine_load_checkpoint
  public :: dsm_sp_seq_to_head, dsm_sp_head_to_seq, dsm_sp_seq_to_head_n, dsm_sp_head_to_seq_n
  public :: dsm_sp_shard_batch
  public :: dsm_sampler_create, dsm_sampler_create_for_engine
  public :: dsm_sampler_batch

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

  !> Convert elements between DSM_FLOAT32, DSM_FLOAT64, DSM_FLOAT16 and
  !> DSM_BFLOAT16 (round to nearest even; Inf and NaN kept). Not collective.
  !>   call dsm_convert(src, src_dtype, dst, dst_dtype, n [, ierr])
  !>        src, dst: type(c_ptr); n: integer(c_int64_t) elements
  !>   call dsm_convert(src, dst, dst_dtype [, ierr])
  !>        src: real(c_float) array of any rank (size(src) elements) into
  !>        dst: type(c_ptr) of dst_dtype
  !>   call dsm_convert(src, src_dtype, dst [, ierr])
  !>        src: type(c_ptr) of src_dtype into dst: real(c_float) array of
  !>        any rank (size(dst) elements)
  interface dsm_convert
     module procedure convert_ptr, convert_from_f32, convert_to_f32
  end interface dsm_convert

  !> dsm_engine_init with a mesh built over comm from the configuration:
  !> call dsm_engine_init_comm(comm, config, params, engine [, ierr]).
  !> comm: integer (use mpi) or type(MPI_Comm) (use mpi_f08). Collective.
  interface dsm_engine_init_comm
     module procedure engine_init_comm_i, engine_init_comm_f08
  end interface dsm_engine_init_comm

  !> Get the values of parameter index (0-based) until
  !> dsm_engine_param_release; collective over the data-parallel group
  !> when ZeRO-3 gathers it (see dsm.h).
  !>   call dsm_engine_param_acquire(engine, index, values [, ierr])
  !>        values: type(c_ptr) to numel elements of the compute dtype, or
  !>        real(c_float), pointer, dimension(:) (numel elements; the
  !>        engine's dtype must be DSM_FLOAT32)
  !>   call dsm_engine_param_acquire(engine, index, values, shape [, ierr])
  !>        values: real(c_float), pointer, dimension(:,:) of the given
  !>        Fortran shape (product(shape) must be numel)
  !> The values are read-only. values is null on error. With ZeRO-Offload
  !> (offload_optimizer device "cpu") they are device memory: take the
  !> type(c_ptr) form and give it to device code (CUDA Fortran, OpenACC
  !> deviceptr); the same holds for dsm_engine_grad_acquire.
  interface dsm_engine_param_acquire
     module procedure param_acquire_ptr, param_acquire_r1, param_acquire_r2
  end interface dsm_engine_param_acquire

  !> Get the buffer to add parameter index's gradient into (multiplied by
  !> the loss scale), until dsm_engine_grad_release. Not collective. The
  !> forms of dsm_engine_param_acquire: type(c_ptr), or real(c_float)
  !> pointers dimension(:) or dimension(:,:) with a shape. grad is null on
  !> error.
  interface dsm_engine_grad_acquire
     module procedure grad_acquire_ptr, grad_acquire_r1, grad_acquire_r2
  end interface dsm_engine_grad_acquire

  !> Save a checkpoint DIR/TAG.h5 and DIR/latest. Collective, at an
  !> accumulation boundary with every buffer released.
  !>   call dsm_engine_save_checkpoint(engine, dir, tag [, client_state] [, ierr])
  !>        client_state: integer(c_int8_t), dimension(:): bytes stored
  !>        with the checkpoint (rank 0's), absent for none
  !>   call dsm_engine_save_checkpoint(engine, dir, tag, client_state [, ierr])
  !>        client_state: character(len=*), every character stored
  !> tag: '' for "global_step<N>".
  interface dsm_engine_save_checkpoint
     module procedure save_ckpt_bytes, save_ckpt_text
  end interface dsm_engine_save_checkpoint

  !> Load a checkpoint. Collective, at an accumulation boundary with every
  !> buffer released; on error the engine is unchanged.
  !>   call dsm_engine_load_checkpoint(engine, dir, tag, flags [, client_state] [, ierr])
  !>        client_state: integer(c_int8_t), dimension(:), allocatable:
  !>        the stored bytes (size 0 when none)
  !>   call dsm_engine_load_checkpoint(engine, dir, tag, flags, client_state [, ierr])
  !>        client_state: character(len=:), allocatable
  !>   call dsm_engine_load_checkpoint(engine, dir, tag, flags, client_state, size [, ierr])
  !>        client_state: type(c_ptr) to the C copy (null when none), to
  !>        free with dsm_free; size: integer(c_int64_t) bytes
  !> tag: '' for the one DIR/latest names. flags: 0 or DSM_CKPT_LOAD_*.
  interface dsm_engine_load_checkpoint
     module procedure load_ckpt_bytes, load_ckpt_text, load_ckpt_ptr
  end interface dsm_engine_load_checkpoint

  !> Sequence-to-head all-to-all (collective over the group): this rank's
  !> tokens of every head become every token of this rank's heads.
  !>   call dsm_sp_seq_to_head(sp, t, in, in_count, out, out_count [, ierr])
  !>        in, out: type(c_ptr); counts: integer(c_int64_t) elements of t%dtype
  !>   call dsm_sp_seq_to_head(sp, t, in, out [, ierr])
  !>        in, out: contiguous real(c_float) arrays of any rank, e.g.
  !>        in(d, H, s/P, b) and out(d, count, s, b) for DSM_SP_BATCH_FIRST;
  !>        the counts are their sizes in elements of t%dtype (size(x) for
  !>        DSM_FLOAT32)
  interface dsm_sp_seq_to_head
     module procedure sp_seq_to_head_ptr, sp_seq_to_head_f32
  end interface dsm_sp_seq_to_head

  !> Head-to-sequence all-to-all, the inverse of dsm_sp_seq_to_head, with
  !> the same forms (in is now head-sharded, out sequence-sharded).
  interface dsm_sp_head_to_seq
     module procedure sp_head_to_seq_ptr, sp_head_to_seq_f32
  end interface dsm_sp_head_to_seq

  ! ------------------------------------------------------------ the C side
  interface
     function c_strlen(s) bind(C, name='strlen') result(n)
       import :: c_ptr, c_size_t
       type(c_ptr), value :: s
       integer(c_size_t) :: n
     end function c_strlen
  end interface

  ! The C functions and the shim (generated).
  include 'dsm_iface.inc'

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

  ! Report a status: into ierr when present, else stop the program on failure
  ! with the status and dsm_get_last_error() on standard error.
  subroutine finish(status, where, ierr)
    integer(c_int), intent(in) :: status
    character(len=*), intent(in) :: where
    integer, intent(out), optional :: ierr

    if (present(ierr)) then
       ierr = int(status)
       return
    end if
    if (status == DSM_SUCCESS) return
    call stop_program(int(status), where, dsm_get_last_error())
  end subroutine finish

  ! A failure found by the bindings themselves (no C call made it): into
  ! ierr when present, else the program stops, printing why.
  subroutine fail_local(status, where, why, ierr)
    integer, intent(in) :: status
    character(len=*), intent(in) :: where, why
    integer, intent(out), optional :: ierr

    if (present(ierr)) then
       ierr = status
       return
    end if
    call stop_program(status, where, where // ': ' // why)
  end subroutine fail_local

  ! Print "where failed (status)" and detail on standard error and stop: with
  ! MPI_Abort(MPI_COMM_WORLD, status) while MPI is initialized and not
  ! finalized, else (a routine that needs no MPI, called before MPI_Init or
  ! after MPI_Finalize) with error stop status.
  subroutine stop_program(status, where, detail)
    integer, intent(in) :: status
    character(len=*), intent(in) :: where, detail
    logical :: initialized, finalized
    integer :: mpierr

    write(error_unit, '(5a)') 'libdsm: ', where, ' failed (', dsm_status_string(status), ')'
    write(error_unit, '(2a)') 'libdsm: ', detail
    flush(error_unit)
    call MPI_Initialized(initialized, mpierr)
    call MPI_Finalized(finalized, mpierr)
    if (initialized .and. .not. finalized) call MPI_Abort(MPI_COMM_WORLD, status, mpierr)
    error stop status
  end subroutine stop_program

  ! ============================================================ the generated wrappers

  include 'dsm_wrap.inc'

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

  !> The name of dtype ("float32", ...); "invalid" for unknown values.
  function dsm_dtype_name(dtype) result(s)
    integer, intent(in) :: dtype
    character(len=:), allocatable :: s

    s = c_to_f_string(c_dsm_dtype_name(int(dtype, c_int)))
  end function dsm_dtype_name

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

  ! ============================================================ mesh queries (not collective)

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

  ! ============================================================ helpers of the new routines

  ! s as a C string in buf, and p its address; p is null when s is blank
  ! (the C NULL of an optional name or tag).
  subroutine c_string_or_null(s, buf, p)
    character(len=*), intent(in) :: s
    character(kind=c_char), dimension(:), allocatable, target, intent(out) :: buf
    type(c_ptr), intent(out) :: p

    call f_to_c_string(s, buf)
    if (len_trim(s) == 0) then
       p = c_null_ptr
    else
       p = c_loc(buf(1))
    end if
  end subroutine c_string_or_null

  ! The C descriptors of params: names and shapes (reversed into C order)
  ! packed into names and shapes, which must stay alive, as cdesc, while C
  ! reads cdesc. Each array has at least one element.
  subroutine build_params(params, cdesc, names, shapes)
    type(dsm_param_desc_t), dimension(:), intent(in) :: params
    type(c_param_desc), dimension(:), allocatable, target, intent(out) :: cdesc
    character(kind=c_char), dimension(:), allocatable, target, intent(out) :: names
    integer(c_int64_t), dimension(:), allocatable, target, intent(out) :: shapes
    integer :: i, j, k, m, n, nd, nchars, ndims

    nchars = 0
    ndims = 0
    do i = 1, size(params)
       if (allocated(params(i)%name)) nchars = nchars + len_trim(params(i)%name) + 1
       if (allocated(params(i)%shape)) ndims = ndims + size(params(i)%shape)
    end do
    allocate(cdesc(max(size(params), 1)), names(max(nchars, 1)), shapes(max(ndims, 1)))
    names = c_null_char
    shapes = 0
    j = 1
    k = 1
    do i = 1, size(params)
       cdesc(i)%name = c_null_ptr
       if (allocated(params(i)%name)) then
          n = len_trim(params(i)%name)
          do m = 1, n
             names(j + m - 1) = params(i)%name(m:m)
          end do
          names(j + n) = c_null_char
          cdesc(i)%name = c_loc(names(j))
          j = j + n + 1
       end if
       nd = 0
       if (allocated(params(i)%shape)) nd = size(params(i)%shape)
       cdesc(i)%ndims = int(nd, c_int)
       cdesc(i)%shape = c_null_ptr
       if (nd > 0) then
          ! Fortran order (first extent fastest) is C's reversed.
          do m = 1, nd
             shapes(k + m - 1) = int(params(i)%shape(nd + 1 - m), c_int64_t)
          end do
          cdesc(i)%shape = c_loc(shapes(k))
          k = k + nd
       end if
       cdesc(i)%dtype = int(params(i)%dtype, c_int)
       cdesc(i)%trainable = merge(1_c_int, 0_c_int, params(i)%trainable)
       cdesc(i)%no_weight_decay = merge(1_c_int, 0_c_int, params(i)%no_weight_decay)
       cdesc(i)%init_values = params(i)%init_values
       cdesc(i)%init_fn = c_null_funptr
       if (associated(params(i)%init_fn)) cdesc(i)%init_fn = c_funloc(params(i)%init_fn)
       cdesc(i)%init_user_data = params(i)%init_user_data
    end do
    if (size(params) == 0) then
       cdesc(1)%name = c_null_ptr
       cdesc(1)%ndims = 0
       cdesc(1)%shape = c_null_ptr
       cdesc(1)%dtype = 0
       cdesc(1)%trainable = 0
       cdesc(1)%no_weight_decay = 0
       cdesc(1)%init_values = c_null_ptr
       cdesc(1)%init_fn = c_null_funptr
       cdesc(1)%init_user_data = c_null_ptr
    end if
  end subroutine build_params

  ! Elements of dtype that nbytes bytes hold; for an unknown dtype the
  ! fallback, so that C reports the dtype.
  function elements_of(nbytes, dtype, fallback) result(n)
    integer(c_int64_t), intent(in) :: nbytes
    integer, intent(in) :: dtype
    integer(c_int64_t), intent(in) :: fallback
    integer(c_int64_t) :: n
    integer(c_size_t) :: es

    es = 0
    if (c_dsm_dtype_size(int(dtype, c_int), es) == DSM_SUCCESS .and. es > 0) then
       n = nbytes / int(es, c_int64_t)
    else
       n = fallback
    end if
  end function elements_of

  ! ============================================================ memory and conversion

  !> Free memory that libdsm allocated for the caller (the client_state of
  !> the type(c_ptr) form of dsm_engine_load_checkpoint) and make ptr null.
  !> A null pointer is allowed and does nothing (c_null_ptr itself may be
  !> passed). Not collective.
  subroutine dsm_free(ptr, ierr)
    ! No intent: a variable is set to null, the constant c_null_ptr is
    ! allowed and never written.
    type(c_ptr) :: ptr
    integer, intent(out), optional :: ierr

    if (c_associated(ptr)) then
       call c_dsm_free(ptr)
       ptr = c_null_ptr
    end if
    if (present(ierr)) ierr = DSM_SUCCESS
  end subroutine dsm_free

  subroutine convert_ptr(src, src_dtype, dst, dst_dtype, n, ierr)
    type(c_ptr), intent(in) :: src
    integer, intent(in) :: src_dtype
    type(c_ptr), intent(in) :: dst
    integer, intent(in) :: dst_dtype
    integer(c_int64_t), intent(in) :: n
    integer, intent(out), optional :: ierr
    integer(c_int) :: st

    if (n < 0) then
       call fail_local(DSM_ERR_INVALID_ARGUMENT, 'dsm_convert', 'n is negative', ierr)
       return
    end if
    st = c_dsm_convert(src, int(src_dtype, c_int), dst, int(dst_dtype, c_int), int(n, c_size_t))
    call finish(st, 'dsm_convert', ierr)
  end subroutine convert_ptr

  subroutine convert_from_f32(src, dst, dst_dtype, ierr)
    real(c_float), dimension(..), intent(in), target, contiguous :: src
    type(c_ptr), intent(in) :: dst
    integer, intent(in) :: dst_dtype
    integer, intent(out), optional :: ierr
    type(c_ptr) :: p
    integer(c_int) :: st

    p = c_null_ptr
    if (size(src) > 0) p = c_loc(src)
    st = c_dsm_convert(p, int(DSM_FLOAT32, c_int), dst, int(dst_dtype, c_int), int(size(src), c_size_t))
    call finish(st, 'dsm_convert', ierr)
  end subroutine convert_from_f32

  subroutine convert_to_f32(src, src_dtype, dst, ierr)
    type(c_ptr), intent(in) :: src
    integer, intent(in) :: src_dtype
    real(c_float), dimension(..), intent(inout), target, contiguous :: dst
    integer, intent(out), optional :: ierr
    type(c_ptr) :: p
    integer(c_int) :: st

    p = c_null_ptr
    if (size(dst) > 0) p = c_loc(dst)
    st = c_dsm_convert(src, int(src_dtype, c_int), p, int(DSM_FLOAT32, c_int), int(size(dst), c_size_t))
    call finish(st, 'dsm_convert', ierr)
  end subroutine convert_to_f32

  ! ============================================================ engine

  !> Create an engine for a model on the ranks of mesh (a null mesh: one
  !> over MPI_COMM_WORLD as dsm_engine_init_comm makes). Collective over the
  !> mesh; every rank gets the same status. config: path of a DeepSpeed JSON
  !> file or inline JSON text starting with '{' (its "optimizer" section is
  !> required). params: the parameters (type(dsm_param_desc_t)), the same
  !> names, shapes and flags on every rank; their C descriptors live for the
  !> duration of the call. The engine keeps its own reference to the mesh.
  !> engine is null on error; free it with dsm_engine_free.
  subroutine dsm_engine_init(mesh, config, params, engine, ierr)
    type(dsm_mesh_t), intent(in) :: mesh
    character(len=*), intent(in) :: config
    type(dsm_param_desc_t), dimension(:), intent(in) :: params
    type(dsm_engine_t), intent(out) :: engine
    integer, intent(out), optional :: ierr
    type(c_param_desc), dimension(:), allocatable, target :: cdesc
    character(kind=c_char), dimension(:), allocatable, target :: names
    integer(c_int64_t), dimension(:), allocatable, target :: shapes
    integer(c_int) :: st

    call build_params(params, cdesc, names, shapes)
    st = c_dsm_engine_init(mesh%ptr, trim(config) // c_null_char, c_loc(cdesc(1)), &
         int(size(params), c_int), engine%ptr)
    call finish(st, 'dsm_engine_init', ierr)
  end subroutine dsm_engine_init

  !> dsm_engine_init with explicit options (type(dsm_engine_options_t)):
  !> where the model state lives, the collectives' backend, the CUDA device.
  !> Collective over the mesh (a null mesh: MPI_COMM_WORLD); every rank gets
  !> the same status. An invalid field on any rank is
  !> DSM_ERR_INVALID_ARGUMENT on every rank; a device or backend that
  !> differs between ranks is DSM_ERR_MISMATCH; DSM_DEVICE_CUDA without a
  !> CUDA device is DSM_ERR_NOT_SUPPORTED. A program whose forward and
  !> backward run on the host passes dsm_engine_options_t(device=DSM_DEVICE_HOST).
  !>   call dsm_engine_init_with_options(mesh, config, params, options, engine [, ierr])
  subroutine dsm_engine_init_with_options(mesh, config, params, options, engine, ierr)
    type(dsm_mesh_t), intent(in) :: mesh
    character(len=*), intent(in) :: config
    type(dsm_param_desc_t), dimension(:), intent(in) :: params
    type(dsm_engine_options_t), intent(in) :: options
    type(dsm_engine_t), intent(out) :: engine
    integer, intent(out), optional :: ierr
    type(c_param_desc), dimension(:), allocatable, target :: cdesc
    character(kind=c_char), dimension(:), allocatable, target :: names
    integer(c_int64_t), dimension(:), allocatable, target :: shapes
    integer(c_int) :: st

    call build_params(params, cdesc, names, shapes)
    st = c_dsm_engine_init_with_options(mesh%ptr, trim(config) // c_null_char, c_loc(cdesc(1)), &
         int(size(params), c_int), options, engine%ptr)
    call finish(st, 'dsm_engine_init_with_options', ierr)
  end subroutine dsm_engine_init_with_options

  subroutine engine_init_comm_i(comm, config, params, engine, ierr)
    integer, intent(in) :: comm
    character(len=*), intent(in) :: config
    type(dsm_param_desc_t), dimension(:), intent(in) :: params
    type(dsm_engine_t), intent(out) :: engine
    integer, intent(out), optional :: ierr
    type(c_param_desc), dimension(:), allocatable, target :: cdesc
    character(kind=c_char), dimension(:), allocatable, target :: names
    integer(c_int64_t), dimension(:), allocatable, target :: shapes
    integer(c_int) :: st

    call build_params(params, cdesc, names, shapes)
    st = c_dsm_f_engine_init_comm(comm, trim(config) // c_null_char, c_loc(cdesc(1)), &
         int(size(params), c_int), engine%ptr)
    call finish(st, 'dsm_engine_init_comm', ierr)
  end subroutine engine_init_comm_i

  subroutine engine_init_comm_f08(comm, config, params, engine, ierr)
    type(MPI_Comm), intent(in) :: comm
    character(len=*), intent(in) :: config
    type(dsm_param_desc_t), dimension(:), intent(in) :: params
    type(dsm_engine_t), intent(out) :: engine
    integer, intent(out), optional :: ierr

    call engine_init_comm_i(comm%MPI_VAL, config, params, engine, ierr)
  end subroutine engine_init_comm_f08

  !> Parameter index's values as real(c_float) into values (size(values)
  !> must be its numel), whatever the compute dtype and wherever the engine
  !> keeps them: acquire, convert, release. Collective where the acquire is.
  subroutine dsm_engine_param_read_f32(engine, index, values, ierr)
    type(dsm_engine_t), intent(in) :: engine
    integer, intent(in) :: index
    real(c_float), dimension(:), contiguous, intent(out) :: values
    integer, intent(out), optional :: ierr
    integer(c_int) :: st

    st = c_dsm_engine_param_read_f32(engine%ptr, int(index, c_int), values, int(size(values), c_int64_t))
    call finish(st, 'dsm_engine_param_read_f32', ierr)
  end subroutine dsm_engine_param_read_f32

  !> Add the real(c_float) gradient grad (size(grad) must be the parameter's
  !> numel) into parameter index's gradient buffer, whatever the compute
  !> dtype: acquire, add, release. Scale it by the loss scale first.
  !> Collective where the release is.
  subroutine dsm_engine_grad_add_f32(engine, index, grad, ierr)
    type(dsm_engine_t), intent(in) :: engine
    integer, intent(in) :: index
    real(c_float), dimension(:), contiguous, intent(in) :: grad
    integer, intent(out), optional :: ierr
    integer(c_int) :: st

    st = c_dsm_engine_grad_add_f32(engine%ptr, int(index, c_int), grad, int(size(grad), c_int64_t))
    call finish(st, 'dsm_engine_grad_add_f32', ierr)
  end subroutine dsm_engine_grad_add_f32

  ! Whether the engine's dtype is known and not DSM_FLOAT32 (then the
  ! real(c_float) forms refuse it, with the message in why).
  logical function not_float32(engine, why)
    type(dsm_engine_t), intent(in) :: engine
    character(len=:), allocatable, intent(out) :: why
    integer(c_int) :: d

    d = -1
    not_float32 = .false.
    why = ''
    if (c_dsm_engine_get_dtype(engine%ptr, d) /= DSM_SUCCESS) return
    if (d == DSM_FLOAT32) return
    not_float32 = .true.
    why = 'the engine''s dtype is ' // dsm_dtype_name(int(d)) // &
         ', a real(c_float) pointer needs float32: use the type(c_ptr) form and dsm_convert'
  end function not_float32

  subroutine param_acquire_ptr(engine, index, values, ierr)
    type(dsm_engine_t), intent(in) :: engine
    integer, intent(in) :: index
    type(c_ptr), intent(out) :: values
    integer, intent(out), optional :: ierr
    integer(c_int) :: st

    values = c_null_ptr
    st = c_dsm_engine_param_acquire(engine%ptr, int(index, c_int), values)
    call finish(st, 'dsm_engine_param_acquire', ierr)
  end subroutine param_acquire_ptr

  subroutine param_acquire_r1(engine, index, values, ierr)
    type(dsm_engine_t), intent(in) :: engine
    integer, intent(in) :: index
    real(c_float), dimension(:), pointer, intent(out) :: values
    integer, intent(out), optional :: ierr
    character(len=:), allocatable :: why
    type(c_ptr) :: p
    integer(c_int64_t) :: n
    integer(c_int) :: st

    nullify(values)
    ! The dtype is the same on every rank: all refuse together, before the
    ! (possibly collective) acquire.
    if (not_float32(engine, why)) then
       call fail_local(DSM_ERR_INVALID_ARGUMENT, 'dsm_engine_param_acquire', why, ierr)
       return
    end if
    p = c_null_ptr
    st = c_dsm_engine_param_acquire(engine%ptr, int(index, c_int), p)
    if (st == DSM_SUCCESS) then
       n = 0
       st = c_dsm_engine_param_numel(engine%ptr, int(index, c_int), n)
       if (st == DSM_SUCCESS) call c_f_pointer(p, values, [n])
    end if
    call finish(st, 'dsm_engine_param_acquire', ierr)
  end subroutine param_acquire_r1

  subroutine param_acquire_r2(engine, index, values, shape, ierr)
    type(dsm_engine_t), intent(in) :: engine
    integer, intent(in) :: index
    real(c_float), dimension(:,:), pointer, intent(out) :: values
    integer, dimension(:), intent(in) :: shape
    integer, intent(out), optional :: ierr
    character(len=:), allocatable :: why
    character(len=64) :: detail
    type(c_ptr) :: p
    integer(c_int64_t) :: n
    integer(c_int) :: st

    nullify(values)
    if (not_float32(engine, why)) then
       call fail_local(DSM_ERR_INVALID_ARGUMENT, 'dsm_engine_param_acquire', why, ierr)
       return
    end if
    ! Acquire first (collective under ZeRO-3 whatever the shape argument
    ! says on this rank), then check the shape and release locally.
    p = c_null_ptr
    st = c_dsm_engine_param_acquire(engine%ptr, int(index, c_int), p)
    if (st == DSM_SUCCESS) then
       n = 0
       st = c_dsm_engine_param_numel(engine%ptr, int(index, c_int), n)
       if (st == DSM_SUCCESS) then
          if (size(shape) /= 2) then
             st = c_dsm_engine_param_release(engine%ptr, int(index, c_int))
             call fail_local(DSM_ERR_INVALID_ARGUMENT, 'dsm_engine_param_acquire', &
                  'shape must have 2 elements for a rank-2 pointer', ierr)
             return
          end if
          if (product(int(shape, c_int64_t)) /= n .or. any(shape < 0)) then
             st = c_dsm_engine_param_release(engine%ptr, int(index, c_int))
             write(detail, '(a,i0,a,i0,a,i0)') 'shape ', shape(1), ' x ', shape(2), ' is not numel ', n
             call fail_local(DSM_ERR_INVALID_ARGUMENT, 'dsm_engine_param_acquire', trim(detail), ierr)
             return
          end if
          call c_f_pointer(p, values, shape)
       end if
    end if
    call finish(st, 'dsm_engine_param_acquire', ierr)
  end subroutine param_acquire_r2

  subroutine grad_acquire_ptr(engine, index, grad, ierr)
    type(dsm_engine_t), intent(in) :: engine
    integer, intent(in) :: index
    type(c_ptr), intent(out) :: grad
    integer, intent(out), optional :: ierr
    integer(c_int) :: st

    grad = c_null_ptr
    st = c_dsm_engine_grad_acquire(engine%ptr, int(index, c_int), grad)
    call finish(st, 'dsm_engine_grad_acquire', ierr)
  end subroutine grad_acquire_ptr

  subroutine grad_acquire_r1(engine, index, grad, ierr)
    type(dsm_engine_t), intent(in) :: engine
    integer, intent(in) :: index
    real(c_float), dimension(:), pointer, intent(out) :: grad
    integer, intent(out), optional :: ierr
    character(len=:), allocatable :: why
    type(c_ptr) :: p
    integer(c_int64_t) :: n
    integer(c_int) :: st

    nullify(grad)
    ! grad_acquire is local: refuse before it, so that nothing is acquired.
    if (not_float32(engine, why)) then
       call fail_local(DSM_ERR_INVALID_ARGUMENT, 'dsm_engine_grad_acquire', why, ierr)
       return
    end if
    p = c_null_ptr
    st = c_dsm_engine_grad_acquire(engine%ptr, int(index, c_int), p)
    if (st == DSM_SUCCESS) then
       n = 0
       st = c_dsm_engine_param_numel(engine%ptr, int(index, c_int), n)
       if (st == DSM_SUCCESS) call c_f_pointer(p, grad, [n])
    end if
    call finish(st, 'dsm_engine_grad_acquire', ierr)
  end subroutine grad_acquire_r1

  subroutine grad_acquire_r2(engine, index, grad, shape, ierr)
    type(dsm_engine_t), intent(in) :: engine
    integer, intent(in) :: index
    real(c_float), dimension(:,:), pointer, intent(out) :: grad
    integer, dimension(:), intent(in) :: shape
    integer, intent(out), optional :: ierr
    character(len=:), allocatable :: why
    character(len=64) :: detail
    type(c_ptr) :: p
    integer(c_int64_t) :: n
    integer(c_int) :: st

    nullify(grad)
    if (not_float32(engine, why)) then
       call fail_local(DSM_ERR_INVALID_ARGUMENT, 'dsm_engine_grad_acquire', why, ierr)
       return
    end if
    if (size(shape) /= 2) then
       call fail_local(DSM_ERR_INVALID_ARGUMENT, 'dsm_engine_grad_acquire', &
            'shape must have 2 elements for a rank-2 pointer', ierr)
       return
    end if
    ! With a good index, check the shape before acquiring; with a bad one,
    ! the acquire below reports it.
    n = 0
    if (c_dsm_engine_param_numel(engine%ptr, int(index, c_int), n) == DSM_SUCCESS) then
       if (product(int(shape, c_int64_t)) /= n .or. any(shape < 0)) then
          write(detail, '(a,i0,a,i0,a,i0)') 'shape ', shape(1), ' x ', shape(2), ' is not numel ', n
          call fail_local(DSM_ERR_INVALID_ARGUMENT, 'dsm_engine_grad_acquire', trim(detail), ierr)
          return
       end if
    end if
    p = c_null_ptr
    st = c_dsm_engine_grad_acquire(engine%ptr, int(index, c_int), p)
    if (st == DSM_SUCCESS) call c_f_pointer(p, grad, shape)
    call finish(st, 'dsm_engine_grad_acquire', ierr)
  end subroutine grad_acquire_r2

  !> One micro-step: the optimizer step at the gradient-accumulation
  !> boundary. Collective over the engine's ranks; every buffer must be
  !> released. call dsm_step(engine [, info] [, ierr]): info, a
  !> type(dsm_step_info_t) whose size field is DSM_STEP_INFO_SIZE (its
  !> default initialization), receives what happened.
  subroutine dsm_step(engine, info, ierr)
    type(dsm_engine_t), intent(in) :: engine
    type(dsm_step_info_t), intent(inout), optional, target :: info
    integer, intent(out), optional :: ierr
    integer(c_int) :: st

    if (present(info)) then
       st = c_dsm_step(engine%ptr, c_loc(info))
    else
       st = c_dsm_step(engine%ptr, c_null_ptr)
    end if
    call finish(st, 'dsm_step', ierr)
  end subroutine dsm_step

  subroutine save_ckpt_bytes(engine, dir, tag, client_state, ierr)
    type(dsm_engine_t), intent(in) :: engine
    character(len=*), intent(in) :: dir, tag
    integer(c_int8_t), dimension(:), intent(in), optional, target, contiguous :: client_state
    integer, intent(out), optional :: ierr
    character(kind=c_char), dimension(:), allocatable, target :: tagbuf
    type(c_ptr) :: tagp, blob
    integer(c_size_t) :: n
    integer(c_int) :: st

    call c_string_or_null(tag, tagbuf, tagp)
    blob = c_null_ptr
    n = 0
    if (present(client_state)) then
       n = int(size(client_state), c_size_t)
       if (n > 0) blob = c_loc(client_state)
    end if
    st = c_dsm_engine_save_checkpoint(engine%ptr, trim(dir) // c_null_char, tagp, blob, n)
    call finish(st, 'dsm_engine_save_checkpoint', ierr)
  end subroutine save_ckpt_bytes

  subroutine save_ckpt_text(engine, dir, tag, client_state, ierr)
    type(dsm_engine_t), intent(in) :: engine
    character(len=*), intent(in) :: dir, tag
    character(len=*), intent(in) :: client_state
    integer, intent(out), optional :: ierr
    integer(c_int8_t), dimension(:), allocatable :: bytes
    integer :: i

    allocate(bytes(len(client_state)))
    do i = 1, len(client_state)
       bytes(i) = int(transfer(client_state(i:i), 0_c_int8_t), c_int8_t)
    end do
    call save_ckpt_bytes(engine, dir, tag, bytes, ierr)
  end subroutine save_ckpt_text

  ! The C load; with want, the client state in blob (to free with dsm_free)
  ! and its size in n.
  subroutine load_ckpt_common(engine, dir, tag, flags, want, blob, n, st)
    type(dsm_engine_t), intent(in) :: engine
    character(len=*), intent(in) :: dir, tag
    integer, intent(in) :: flags
    logical, intent(in) :: want
    type(c_ptr), intent(out), target :: blob
    integer(c_size_t), intent(out), target :: n
    integer(c_int), intent(out) :: st
    character(kind=c_char), dimension(:), allocatable, target :: tagbuf
    type(c_ptr) :: tagp

    call c_string_or_null(tag, tagbuf, tagp)
    blob = c_null_ptr
    n = 0
    if (want) then
       st = c_dsm_engine_load_checkpoint(engine%ptr, trim(dir) // c_null_char, tagp, &
            int(flags, c_int), c_loc(blob), c_loc(n))
    else
       st = c_dsm_engine_load_checkpoint(engine%ptr, trim(dir) // c_null_char, tagp, &
            int(flags, c_int), c_null_ptr, c_null_ptr)
    end if
    if (st /= DSM_SUCCESS .or. .not. c_associated(blob)) n = 0
  end subroutine load_ckpt_common

  subroutine load_ckpt_bytes(engine, dir, tag, flags, client_state, ierr)
    type(dsm_engine_t), intent(in) :: engine
    character(len=*), intent(in) :: dir, tag
    integer, intent(in) :: flags
    integer(c_int8_t), dimension(:), allocatable, intent(out), optional :: client_state
    integer, intent(out), optional :: ierr
    integer(c_int8_t), dimension(:), pointer :: bytes
    type(c_ptr) :: blob
    integer(c_size_t) :: n
    integer(c_int) :: st

    call load_ckpt_common(engine, dir, tag, flags, present(client_state), blob, n, st)
    if (present(client_state)) then
       allocate(client_state(n))
       if (n > 0) then
          call c_f_pointer(blob, bytes, [n])
          client_state = bytes
       end if
    end if
    call c_dsm_free(blob)
    call finish(st, 'dsm_engine_load_checkpoint', ierr)
  end subroutine load_ckpt_bytes

  subroutine load_ckpt_text(engine, dir, tag, flags, client_state, ierr)
    type(dsm_engine_t), intent(in) :: engine
    character(len=*), intent(in) :: dir, tag
    integer, intent(in) :: flags
    character(len=:), allocatable, intent(out) :: client_state
    integer, intent(out), optional :: ierr
    character(kind=c_char), dimension(:), pointer :: chars
    type(c_ptr) :: blob
    integer(c_size_t) :: n
    integer(c_int) :: st
    integer :: i

    call load_ckpt_common(engine, dir, tag, flags, .true., blob, n, st)
    allocate(character(len=n) :: client_state)
    if (n > 0) then
       call c_f_pointer(blob, chars, [n])
       do i = 1, int(n)
          client_state(i:i) = chars(i)
       end do
    end if
    call c_dsm_free(blob)
    call finish(st, 'dsm_engine_load_checkpoint', ierr)
  end subroutine load_ckpt_text

  subroutine load_ckpt_ptr(engine, dir, tag, flags, client_state, size, ierr)
    type(dsm_engine_t), intent(in) :: engine
    character(len=*), intent(in) :: dir, tag
    integer, intent(in) :: flags
    type(c_ptr), intent(out) :: client_state
    integer(c_int64_t), intent(out) :: size
    integer, intent(out), optional :: ierr
    integer(c_size_t) :: n
    integer(c_int) :: st

    call load_ckpt_common(engine, dir, tag, flags, .true., client_state, n, st)
    size = int(n, c_int64_t)
    call finish(st, 'dsm_engine_load_checkpoint', ierr)
  end subroutine load_ckpt_ptr

  ! ============================================================ sequence parallelism

  ! One transform of type(c_ptr) buffers: to_head selects the direction.
  subroutine sp_transform_ptr(to_head, sp, t, in, in_count, out, out_count, ierr)
    logical, intent(in) :: to_head
    type(dsm_sp_t), intent(in) :: sp
    type(dsm_sp_tensor_t), intent(in) :: t
    type(c_ptr), intent(in) :: in
    integer(c_int64_t), intent(in) :: in_count
    type(c_ptr), intent(in) :: out
    integer(c_int64_t), intent(in) :: out_count
    integer, intent(out), optional :: ierr
    integer(c_int) :: st

    ! Negative counts become huge size_t values, which C reports as wrong
    ! counts on every rank (the call is collective: no rank may skip it).
    if (to_head) then
       st = c_dsm_sp_seq_to_head(sp%ptr, t, in, int(in_count, c_size_t), out, int(out_count, c_size_t))
       call finish(st, 'dsm_sp_seq_to_head', ierr)
    else
       st = c_dsm_sp_head_to_seq(sp%ptr, t, in, int(in_count, c_size_t), out, int(out_count, c_size_t))
       call finish(st, 'dsm_sp_head_to_seq', ierr)
    end if
  end subroutine sp_transform_ptr

  ! One transform of real(c_float) arrays, taken as memory: their sizes in
  ! bytes give the counts in elements of t%dtype.
  subroutine sp_transform_f32(to_head, sp, t, in, out, ierr)
    logical, intent(in) :: to_head
    type(dsm_sp_t), intent(in) :: sp
    type(dsm_sp_tensor_t), intent(in) :: t
    real(c_float), dimension(..), intent(in), target, contiguous :: in
    real(c_float), dimension(..), intent(inout), target, contiguous :: out
    integer, intent(out), optional :: ierr
    integer(c_int64_t), parameter :: fbytes = storage_size(0.0_c_float) / 8
    integer(c_int64_t) :: nin, nout
    type(c_ptr) :: pin, pout

    pin = c_null_ptr
    pout = c_null_ptr
    if (size(in) > 0) pin = c_loc(in)
    if (size(out) > 0) pout = c_loc(out)
    nin = elements_of(size(in, kind=c_int64_t) * fbytes, int(t%dtype), size(in, kind=c_int64_t))
    nout = elements_of(size(out, kind=c_int64_t) * fbytes, int(t%dtype), size(out, kind=c_int64_t))
    call sp_transform_ptr(to_head, sp, t, pin, nin, pout, nout, ierr)
  end subroutine sp_transform_f32

  subroutine sp_seq_to_head_ptr(sp, t, in, in_count, out, out_count, ierr)
    type(dsm_sp_t), intent(in) :: sp
    type(dsm_sp_tensor_t), intent(in) :: t
    type(c_ptr), intent(in) :: in
    integer(c_int64_t), intent(in) :: in_count
    type(c_ptr), intent(in) :: out
    integer(c_int64_t), intent(in) :: out_count
    integer, intent(out), optional :: ierr

    call sp_transform_ptr(.true., sp, t, in, in_count, out, out_count, ierr)
  end subroutine sp_seq_to_head_ptr

  subroutine sp_seq_to_head_f32(sp, t, in, out, ierr)
    type(dsm_sp_t), intent(in) :: sp
    type(dsm_sp_tensor_t), intent(in) :: t
    real(c_float), dimension(..), intent(in), target, contiguous :: in
    real(c_float), dimension(..), intent(inout), target, contiguous :: out
    integer, intent(out), optional :: ierr

    call sp_transform_f32(.true., sp, t, in, out, ierr)
  end subroutine sp_seq_to_head_f32

  subroutine sp_head_to_seq_ptr(sp, t, in, in_count, out, out_count, ierr)
    type(dsm_sp_t), intent(in) :: sp
    type(dsm_sp_tensor_t), intent(in) :: t
    type(c_ptr), intent(in) :: in
    integer(c_int64_t), intent(in) :: in_count
    type(c_ptr), intent(in) :: out
    integer(c_int64_t), intent(in) :: out_count
    integer, intent(out), optional :: ierr

    call sp_transform_ptr(.false., sp, t, in, in_count, out, out_count, ierr)
  end subroutine sp_head_to_seq_ptr

  subroutine sp_head_to_seq_f32(sp, t, in, out, ierr)
    type(dsm_sp_t), intent(in) :: sp
    type(dsm_sp_tensor_t), intent(in) :: t
    real(c_float), dimension(..), intent(in), target, contiguous :: in
    real(c_float), dimension(..), intent(inout), target, contiguous :: out
    integer, intent(out), optional :: ierr

    call sp_transform_f32(.false., sp, t, in, out, ierr)
  end subroutine sp_head_to_seq_f32

  ! The n-tensor transforms: size(t) tensors; the other arrays must have at
  ! least as many elements (missing ones go to C as null buffers of 0
  ! elements, which it reports naming the tensor, on every rank).
  subroutine sp_transform_n(to_head, sp, t, in, in_count, out, out_count, ierr)
    logical, intent(in) :: to_head
    type(dsm_sp_t), intent(in) :: sp
    type(dsm_sp_tensor_t), dimension(:), intent(in) :: t
    type(c_ptr), dimension(:), intent(in) :: in, out
    integer(c_int64_t), dimension(:), intent(in) :: in_count, out_count
    integer, intent(out), optional :: ierr
    type(dsm_sp_tensor_t), dimension(:), allocatable :: ct
    type(c_ptr), dimension(:), allocatable :: cin, cout
    integer(c_size_t), dimension(:), allocatable :: nin, nout
    integer(c_int) :: st
    integer :: n, i

    n = size(t)
    allocate(ct(max(n, 1)), cin(max(n, 1)), cout(max(n, 1)), nin(max(n, 1)), nout(max(n, 1)))
    cin = c_null_ptr
    cout = c_null_ptr
    nin = 0
    nout = 0
    do i = 1, n
       ct(i) = t(i)
       if (i <= size(in)) cin(i) = in(i)
       if (i <= size(out)) cout(i) = out(i)
       if (i <= size(in_count)) nin(i) = int(in_count(i), c_size_t)
       if (i <= size(out_count)) nout(i) = int(out_count(i), c_size_t)
    end do
    if (to_head) then
       st = c_dsm_sp_seq_to_head_n(sp%ptr, int(n, c_int), ct, cin, nin, cout, nout)
       call finish(st, 'dsm_sp_seq_to_head_n', ierr)
    else
       st = c_dsm_sp_head_to_seq_n(sp%ptr, int(n, c_int), ct, cin, nin, cout, nout)
       call finish(st, 'dsm_sp_head_to_seq_n', ierr)
    end if
  end subroutine sp_transform_n

  !> dsm_sp_seq_to_head of size(t) tensors in one all-to-all (q, k and v):
  !> call dsm_sp_seq_to_head_n(sp, t, in, in_count, out, out_count [, ierr])
  !>   t:        type(dsm_sp_tensor_t), dimension(:)
  !>   in, out:  type(c_ptr), dimension(:) (c_loc of each tensor's array)
  !>   counts:   integer(c_int64_t), dimension(:), in elements of each dtype
  !> Collective over the group.
  subroutine dsm_sp_seq_to_head_n(sp, t, in, in_count, out, out_count, ierr)
    type(dsm_sp_t), intent(in) :: sp
    type(dsm_sp_tensor_t), dimension(:), intent(in) :: t
    type(c_ptr), dimension(:), intent(in) :: in
    integer(c_int64_t), dimension(:), intent(in) :: in_count
    type(c_ptr), dimension(:), intent(in) :: out
    integer(c_int64_t), dimension(:), intent(in) :: out_count
    integer, intent(out), optional :: ierr

    call sp_transform_n(.true., sp, t, in, in_count, out, out_count, ierr)
  end subroutine dsm_sp_seq_to_head_n

  !> dsm_sp_head_to_seq of size(t) tensors in one all-to-all; arguments as
  !> dsm_sp_seq_to_head_n. Collective over the group.
  subroutine dsm_sp_head_to_seq_n(sp, t, in, in_count, out, out_count, ierr)
    type(dsm_sp_t), intent(in) :: sp
    type(dsm_sp_tensor_t), dimension(:), intent(in) :: t
    type(c_ptr), dimension(:), intent(in) :: in
    integer(c_int64_t), dimension(:), intent(in) :: in_count
    type(c_ptr), dimension(:), intent(in) :: out
    integer(c_int64_t), dimension(:), intent(in) :: out_count
    integer, intent(out), optional :: ierr

    call sp_transform_n(.false., sp, t, in, in_count, out, out_count, ierr)
  end subroutine dsm_sp_head_to_seq_n

  ! c_loc of a 2-D int64 array, null when it is empty.
  function loc_or_null(x) result(p)
    integer(c_int64_t), dimension(:,:), intent(in), target, contiguous :: x
    type(c_ptr) :: p

    p = c_null_ptr
    if (size(x) > 0) p = c_loc(x)
  end function loc_or_null

  !> This rank's chunk of a batch of sequences for causal language
  !> modelling. Not collective; needs no context.
  !> call dsm_sp_shard_batch(size, rank, tokens, pad_token, out_tokens,
  !>      out_positions, out_labels [, chunk] [, valid] [, positions]
  !>      [, labels] [, ierr])
  !>   size, rank:   the group's size and this rank's rank (0-based)
  !>   tokens:       integer(c_int64_t), dimension(seq, batch): one sequence
  !>                 per column (the C [batch, seq])
  !>   pad_token:    integer(c_int64_t), the token of padding positions
  !>   out_tokens, out_positions, out_labels: integer(c_int64_t),
  !>                 dimension(:,:), allocatable: allocated here as
  !>                 (chunk, batch), chunk = ceiling(seq / size)
  !>   chunk:        integer(c_int64_t), optional
  !>   valid:        integer(c_int64_t), optional: labels of the chunk that
  !>                 are not DSM_IGNORE_INDEX, for dsm_sp_loss
  !>   positions, labels: optional, shaped as tokens (absent: positions
  !>                 0..seq-1 and labels = tokens). Labels are shifted:
  !>                 out_labels(k, b) labels the token that follows.
  !> positions or labels shaped unlike tokens give DSM_ERR_INVALID_ARGUMENT.
  subroutine dsm_sp_shard_batch(size, rank, tokens, pad_token, out_tokens, out_positions, &
       out_labels, chunk, valid, positions, labels, ierr)
    integer, intent(in) :: size, rank
    integer(c_int64_t), dimension(:,:), intent(in), target, contiguous :: tokens
    integer(c_int64_t), intent(in) :: pad_token
    integer(c_int64_t), dimension(:,:), allocatable, target, intent(out) :: out_tokens, out_positions, &
         out_labels
    integer(c_int64_t), intent(out), optional :: chunk, valid
    integer(c_int64_t), dimension(:,:), intent(in), optional, target, contiguous :: positions, labels
    integer, intent(out), optional :: ierr
    integer(c_int64_t) :: batch, seq, len, c, v
    type(c_ptr) :: ppos, plab
    integer(c_int) :: st

    if (present(chunk)) chunk = 0
    if (present(valid)) valid = 0
    seq = int(ubound(tokens, 1) - lbound(tokens, 1) + 1, c_int64_t)
    batch = int(ubound(tokens, 2) - lbound(tokens, 2) + 1, c_int64_t)
    ! The chunk length as C computes it; 0 when size is bad (C reports it).
    len = 0
    if (size >= 1 .and. seq >= 1) len = (seq + size - 1) / size
    allocate(out_tokens(len, max(batch, 0_c_int64_t)), out_positions(len, max(batch, 0_c_int64_t)), &
         out_labels(len, max(batch, 0_c_int64_t)))
    out_tokens = 0
    out_positions = 0
    out_labels = 0
    ppos = c_null_ptr
    plab = c_null_ptr
    if (present(positions)) then
       if (any(shape(positions) /= shape(tokens))) then
          call fail_local(DSM_ERR_INVALID_ARGUMENT, 'dsm_sp_shard_batch', &
               'positions is not shaped as tokens (seq, batch)', ierr)
          return
       end if
       ppos = loc_or_null(positions)
    end if
    if (present(labels)) then
       if (any(shape(labels) /= shape(tokens))) then
          call fail_local(DSM_ERR_INVALID_ARGUMENT, 'dsm_sp_shard_batch', &
               'labels is not shaped as tokens (seq, batch)', ierr)
          return
       end if
       plab = loc_or_null(labels)
    end if
    c = 0
    v = 0
    st = c_dsm_sp_shard_batch(int(size, c_int), int(rank, c_int), batch, seq, loc_or_null(tokens), &
         ppos, plab, pad_token, int(len * max(batch, 0_c_int64_t), c_size_t), loc_or_null(out_tokens), &
         loc_or_null(out_positions), loc_or_null(out_labels), c, v)
    if (present(chunk)) chunk = c
    if (present(valid)) valid = v
    call finish(st, 'dsm_sp_shard_batch', ierr)
  end subroutine dsm_sp_shard_batch

  ! ============================================================ sampler

  ! The C options from the optional arguments (the C defaults for absent ones).
  function sampler_options(shuffle, seed, drop_last) result(o)
    logical, intent(in), optional :: shuffle, drop_last
    integer(c_int64_t), intent(in), optional :: seed
    type(c_sampler_options) :: o

    o%size = c_sizeof(o)
    o%shuffle = 1
    o%seed = 0
    o%drop_last = 0
    if (present(shuffle)) o%shuffle = merge(1_c_int, 0_c_int, shuffle)
    if (present(seed)) o%seed = seed
    if (present(drop_last)) o%drop_last = merge(1_c_int, 0_c_int, drop_last)
  end function sampler_options

  !> A sampler over num_samples samples for rank (0-based) of replicas
  !> data-parallel replicas, in micro-batches of micro_batch. Not collective.
  !> call dsm_sampler_create(num_samples, replicas, rank, micro_batch,
  !>      sampler [, shuffle] [, seed] [, drop_last] [, ierr])
  !>   num_samples, micro_batch: integer(c_int64_t)
  !>   shuffle:   logical, default .true.: a new permutation each epoch
  !>   seed:      integer(c_int64_t), default 0 (the bits of C's uint64_t)
  !>   drop_last: logical, default .false.: pad as PyTorch's
  !>              DistributedSampler; .true.: drop the tail
  !> Free it with dsm_sampler_free.
  subroutine dsm_sampler_create(num_samples, replicas, rank, micro_batch, sampler, shuffle, seed, &
       drop_last, ierr)
    integer(c_int64_t), intent(in) :: num_samples
    integer, intent(in) :: replicas, rank
    integer(c_int64_t), intent(in) :: micro_batch
    type(dsm_sampler_t), intent(out) :: sampler
    logical, intent(in), optional :: shuffle
    integer(c_int64_t), intent(in), optional :: seed
    logical, intent(in), optional :: drop_last
    integer, intent(out), optional :: ierr
    integer(c_int) :: st

    st = c_dsm_sampler_create(num_samples, int(replicas, c_int), int(rank, c_int), micro_batch, &
         sampler_options(shuffle, seed, drop_last), sampler%ptr)
    call finish(st, 'dsm_sampler_create', ierr)
  end subroutine dsm_sampler_create

  !> dsm_sampler_create with the engine's data-parallel size and rank and its
  !> train_micro_batch_size_per_gpu. Not collective.
  !> call dsm_sampler_create_for_engine(engine, num_samples, sampler
  !>      [, shuffle] [, seed] [, drop_last] [, ierr])
  subroutine dsm_sampler_create_for_engine(engine, num_samples, sampler, shuffle, seed, drop_last, ierr)
    type(dsm_engine_t), intent(in) :: engine
    integer(c_int64_t), intent(in) :: num_samples
    type(dsm_sampler_t), intent(out) :: sampler
    logical, intent(in), optional :: shuffle
    integer(c_int64_t), intent(in), optional :: seed
    logical, intent(in), optional :: drop_last
    integer, intent(out), optional :: ierr
    integer(c_int) :: st

    st = c_dsm_sampler_create_for_engine(engine%ptr, num_samples, sampler_options(shuffle, seed, drop_last), &
         sampler%ptr)
    call finish(st, 'dsm_sampler_create_for_engine', ierr)
  end subroutine dsm_sampler_create_for_engine

  !> The sample indices (0-based) of micro-batch batch (0-based) of epoch
  !> epoch (0-based) on this rank, in indices(1:count); size(indices) is the
  !> room (micro_batch is always enough); the elements after count are left
  !> alone. epoch, batch, count: integer(c_int64_t). Not collective.
  subroutine dsm_sampler_batch(sampler, epoch, batch, indices, count, ierr)
    type(dsm_sampler_t), intent(in) :: sampler
    integer(c_int64_t), intent(in) :: epoch, batch
    integer(c_int64_t), dimension(:), intent(inout), target, contiguous :: indices
    integer(c_int64_t), intent(out) :: count
    integer, intent(out), optional :: ierr
    integer(c_int64_t), dimension(1), target :: none
    integer(c_int) :: st

    count = 0
    if (size(indices) > 0) then
       st = c_dsm_sampler_batch(sampler%ptr, epoch, batch, c_loc(indices), int(size(indices), c_size_t), count)
    else
       ! No room: C reports len 0 against the micro-batch's count.
       none = 0
       st = c_dsm_sampler_batch(sampler%ptr, epoch, batch, c_loc(none), 0_c_size_t, count)
    end if
    call finish(st, 'dsm_sampler_batch', ierr)
  end subroutine dsm_sampler_batch

end module dsm
