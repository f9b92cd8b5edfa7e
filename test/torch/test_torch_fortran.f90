! The PyTorch bridge from Fortran (module dsm_torch): trains the TorchScript
! model of test/torch/torch_reference.py on its data, read as Fortran
! arrays x(8, N) and y(4, N) (column-major: the same bytes as the C arrays
! [N, 8] and [N, 4], so the model sees [batch, 8] through
! dsm_torch_tensor), and compares every rank's loss of every step with
! PyTorch's DistributedDataParallel training (ref_wW_g1.bin) within 1e-5
! relative. Then a checkpoint, inference into a Fortran array, bad input
! with ierr, the model's description and the LibTorch version.
!   test_torch_fortran MODEL DATA REF STEPS CKPT_DIR
program test_torch_fortran
  use, intrinsic :: iso_c_binding
  use mpi
  use dsm
  use dsm_torch
  implicit none
  integer, parameter :: NIN = 8, NOUT = 4, NROWS = 4096, MB = 4
  real(c_float), allocatable :: x(:, :), y(:, :)
  real(c_float), target :: xb(NIN, MB), yb(NOUT, MB), pred(NOUT, MB), bad(NIN - 1, MB)
  real(c_double), allocatable :: ref(:)
  character(len=4096) :: model_path, data_path, ref_path, arg, config, ckpt_dir
  type(dsm_mesh_t) :: mesh
  type(dsm_torch_model_t) :: model
  type(dsm_torch_tensor_t) :: out
  type(dsm_torch_options_t) :: opts
  type(dsm_step_info_t) :: info
  real(c_double) :: loss, rel, worst
  integer :: rank, world, ierr, steps, s, row, u, failures, any_failed
  character(len=:), allocatable :: text, version
  logical :: cuda

  call MPI_Init(ierr)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  call MPI_Comm_size(MPI_COMM_WORLD, world, ierr)
  call get_command_argument(1, model_path)
  call get_command_argument(2, data_path)
  call get_command_argument(3, ref_path)
  call get_command_argument(4, arg)
  read (arg, *) steps
  call get_command_argument(5, ckpt_dir)
  allocate (x(NIN, NROWS), y(NOUT, NROWS), ref(steps * world))
  open (newunit=u, file=trim(data_path), access='stream', form='unformatted', status='old')
  read (u) x, y
  close (u)
  open (newunit=u, file=trim(ref_path), access='stream', form='unformatted', status='old')
  read (u) ref
  close (u)

  write (config, '(a, i0, a)') '{"train_batch_size": ', MB * world, ', "train_micro_batch_size_per_gpu": 4,' // &
       ' "gradient_clipping": 0.5, "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "betas": [0.9, 0.999],' // &
       ' "eps": 1e-8, "weight_decay": 0.01}}, "zero_optimization": {"stage": 2}, "torch": {"loss": "mse"}}'
  call dsm_mesh_create(MPI_COMM_WORLD, [world], ['data_parallel'], mesh)
  call dsm_torch_model_create(mesh, model_path, config, model)
  call dsm_mesh_free(mesh)

  failures = 0
  worst = 0
  do s = 0, steps - 1
     row = (s * world + rank) * MB
     xb = x(:, row + 1:row + MB)
     yb = y(:, row + 1:row + MB)
     call dsm_torch_train_step(model, [dsm_torch_tensor(xb)], dsm_torch_tensor(yb), loss, info)
     rel = abs(loss - ref(s * world + rank + 1)) / abs(ref(s * world + rank + 1))
     worst = max(worst, rel)
     if (.not. (rel <= 1d-5)) then
        print '(a, i0, a, i0, a, es16.9, a, es16.9)', 'rank ', rank, ': step ', s, ': loss ', loss, &
             ', PyTorch DDP ', ref(s * world + rank + 1)
        failures = failures + 1
     end if
  end do
  if (info%global_steps /= steps) failures = failures + 1

  ! Inference into a Fortran array pred(4, MB): the output [MB, 4].
  out = dsm_torch_tensor(pred)
  call dsm_torch_inference(model, [dsm_torch_tensor(xb)], out)
  if (any(pred /= pred)) failures = failures + 1
  ! Bad input: every rank gets the error in ierr, and the model stays usable.
  call dsm_torch_train_step(model, [dsm_torch_tensor(bad)], dsm_torch_tensor(yb), loss, ierr=ierr)
  if (ierr /= DSM_ERR_INVALID_ARGUMENT .or. index(dsm_last_error(), '[4, 7]') == 0) then
     print '(a, i0, 2a)', 'bad input: ierr ', ierr, ': ', dsm_last_error()
     failures = failures + 1
  end if
  call dsm_torch_save_checkpoint(model, ckpt_dir, ierr=ierr)
  if (ierr /= DSM_SUCCESS) failures = failures + 1
  ! The description (JSON: the step count) and the LibTorch version, as C gives them.
  call dsm_torch_model_describe(model, DSM_FORMAT_JSON, text)
  if (index(text, '"steps"') == 0 .or. index(text, '"libtorch"') == 0) then
     print '(2a)', 'dsm_torch_model_describe: ', text(1:min(len(text), 200))
     failures = failures + 1
  end if
  call dsm_torch_model_describe(model, 99, text, ierr)
  if (ierr /= DSM_ERR_INVALID_ARGUMENT .or. index(dsm_last_error(), '99') == 0) then
     print '(a, i0, 2a)', 'dsm_torch_model_describe(format 99): ierr ', ierr, ': ', dsm_last_error()
     failures = failures + 1
  end if
  call dsm_torch_version(version, cuda)
  if (len(version) < 4 .or. scan(version, '.') == 0) then
     print '(3a)', 'dsm_torch_version: "', version, '"'
     failures = failures + 1
  end if
  call dsm_torch_model_free(model)
  opts%loss = DSM_TORCH_LOSS_CROSS_ENTROPY
  call dsm_mesh_create(MPI_COMM_WORLD, [world], ['data_parallel'], mesh)
  call dsm_torch_model_create(mesh, trim(model_path) // '.missing', config, model, opts, ierr)
  if (ierr /= DSM_ERR_IO .or. index(dsm_last_error(), '.missing') == 0) failures = failures + 1
  call dsm_mesh_free(mesh)

  call MPI_Allreduce(failures, any_failed, 1, MPI_INTEGER, MPI_MAX, MPI_COMM_WORLD, ierr)
  if (rank == 0) print '(a, i0, a, i0, a, es10.3)', 'Fortran: ', world, ' ranks, ', steps, &
       ' steps: worst loss difference from PyTorch DDP ', worst
  call MPI_Finalize(ierr)
  if (any_failed /= 0) error stop 1
end program test_torch_fortran
