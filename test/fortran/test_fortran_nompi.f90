! The routines that need no MPI, called without MPI: with ierr they report
! their status; without ierr a failure stops the program with the status and
! the detail on standard error (error stop, MPI_Abort being unusable) both
! before MPI_Init and after MPI_Finalize. Run by test/tools/fortran_nompi.sh
! as a plain program (no mpiexec): test_fortran_nompi ierr|before|during|after
! (during: with MPI initialized, the message names the rank and MPI_Abort ends it).
program test_fortran_nompi
  use, intrinsic :: iso_c_binding, only: c_int64_t
  use mpi_f08, only: MPI_Init, MPI_Finalize
  use dsm
  implicit none
  character(len=16) :: mode
  integer :: n, st, failures
  integer(c_int64_t) :: first, count
  type(dsm_config_t) :: cfg

  failures = 0
  call get_command_argument(1, mode)
  select case (trim(mode))
  case ('ierr')
     call dsm_dtype_size(DSM_FLOAT64, n, st)
     call expect(st == DSM_SUCCESS .and. n == 8, 'dsm_dtype_size before MPI_Init')
     call dsm_dtype_size(99, n, st)
     call expect(st == DSM_ERR_INVALID_ARGUMENT .and. index(dsm_last_error(), '99') > 0, &
          'a bad dtype before MPI_Init gives DSM_ERR_INVALID_ARGUMENT through ierr, naming it')
     call dsm_sp_head_range(8_c_int64_t, 0, 4, 1, first, count, st)
     call expect(st == DSM_SUCCESS .and. first == 2 .and. count == 2, 'dsm_sp_head_range before MPI_Init')
     call dsm_config_resolve('{"train_batch_size": 8}', 2_c_int64_t, 0_c_int64_t, 0, cfg, st)
     call expect(st == DSM_SUCCESS, 'dsm_config_resolve before MPI_Init')
     call dsm_config_free(cfg)
     call expect(.not. c_associated_cfg(cfg), 'dsm_config_free makes the handle null')
     if (failures > 0) error stop 1
     write(*, '(a)') 'PASS: the routines that need no MPI work before MPI_Init with ierr'
  case ('before')
     call dsm_dtype_size(99, n)
     write(*, '(a)') 'FAIL: dsm_dtype_size(99) without ierr returned'
  case ('during')
     ! MPI initialized: the message carries the rank, and MPI_Abort ends the program.
     call MPI_Init()
     call dsm_dtype_size(99, n)
     write(*, '(a)') 'FAIL: dsm_dtype_size(99) without ierr returned'
     call MPI_Finalize()
  case ('after')
     call MPI_Init()
     call MPI_Finalize()
     call dsm_sp_head_range(8_c_int64_t, 0, 0, 0, first, count)
     write(*, '(a)') 'FAIL: dsm_sp_head_range(size 0) without ierr returned'
  case default
     write(*, '(3a)') 'FAIL: unknown mode "', trim(mode), '" (ierr, before, during or after)'
     error stop 2
  end select

contains

  subroutine expect(cond, what)
    logical, intent(in) :: cond
    character(len=*), intent(in) :: what

    if (cond) then
       write(*, '(2a)') 'PASS: ', what
    else
       write(*, '(2a)') 'FAIL: ', what
       failures = failures + 1
    end if
  end subroutine expect

  logical function c_associated_cfg(c)
    use, intrinsic :: iso_c_binding, only: c_associated
    type(dsm_config_t), intent(in) :: c

    c_associated_cfg = c_associated(c%ptr)
  end function c_associated_cfg
end program test_fortran_nompi
