! The Fortran bindings of sequence parallelism and the sampler (module dsm)
! at any rank count: dsm_sp_create over a mesh group, the head split of
! dsm_sp_head_range and the counts; dsm_sp_seq_to_head checked element by
! element against the global tensor computed here (Fortran arrays x(d, H, s,
! b) and x(d, H, b, s) for the two layouts, uneven and missing heads) and
! dsm_sp_head_to_seq back, bit for bit; bfloat16 through type(c_ptr); the
! n-tensor transforms with a replicated head; memory from dsm_sp_alloc;
! dsm_sp_shard_batch and dsm_sp_loss against an independent computation;
! the sampler's micro-batches against DistributedSampler's rule (plain,
! drop_last, shuffled: a permutation per epoch, the same for the same seed),
! dsm_sampler_locate and dsm_sampler_create_for_engine; bad arguments with
! the status and message on every rank.
!
! Every check is made on every rank and agreed with MPI_Allreduce, so all
! ranks run the same sequence; rank 0 prints "PASS: what" or "FAIL: what",
! and a failing rank prints its own detail. The program exits 0 when every
! check passed and with a nonzero status (error stop) otherwise.
! Run on one node (mpiexec -n 1, 2, 4, 8).
program test_fortran_sp
  use, intrinsic :: iso_c_binding
  use mpi
  use dsm
  implicit none

  integer :: ierr, rank, nprocs, failures, st, p, r
  type(dsm_mesh_t) :: mesh, mesh2
  type(dsm_sp_t) :: sp, sp2

  failures = 0
  call MPI_Init(ierr)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  call MPI_Comm_size(MPI_COMM_WORLD, nprocs, ierr)

  ! ---------------------------------------------------------- contexts
  call dsm_mesh_create_dp_sp(MPI_COMM_WORLD, 1, -1, mesh)
  call check(.not. c_associated(sp%ptr), 'a new sequence-parallel handle is null')
  call dsm_sp_create(mesh, '', sp, st)
  call check(st == DSM_SUCCESS .and. c_associated(sp%ptr), 'dsm_sp_create of group '''' (sequence_parallel)')
  call dsm_sp_size(sp, p)
  call dsm_sp_rank(sp, r)
  call check(p == nprocs .and. r == rank, 'the group spans every rank, rank = world rank')
  call dsm_sp_create(mesh, 'nope', sp2, st)
  call check_error(st, DSM_ERR_NOT_FOUND, 'nope', 'dsm_sp_create of an unknown group gives DSM_ERR_NOT_FOUND')
  call check(.not. c_associated(sp2%ptr), 'the failed context handle is null')
  call dsm_sp_size(sp2, p, st)
  call check(st == DSM_ERR_NULL_POINTER, 'a null context gives DSM_ERR_NULL_POINTER')
  if (mod(nprocs, 2) == 0) then
     call dsm_mesh_create_dp_sp(MPI_COMM_WORLD, -1, 2, mesh2)
     call dsm_sp_create(mesh2, 'sequence_parallel', sp2, st)
     call dsm_sp_size(sp2, p)
     call dsm_sp_rank(sp2, r)
     call check(st == DSM_SUCCESS .and. p == 2 .and. r == mod(rank, 2), &
          'dsm_sp_create over the sp dimension of a (size/2) x 2 mesh')
     call dsm_sp_free(sp2)
     call dsm_mesh_free(mesh2)
  end if

  call test_head_range()
  call test_round_trips()
  call test_bfloat16()
  call test_n_tensors()
  call test_alloc()
  call test_transform_errors()
  call test_shard_batch()
  call test_loss()
  call test_sampler()

  call dsm_sp_free(sp, st)
  call check(st == DSM_SUCCESS .and. .not. c_associated(sp%ptr), 'dsm_sp_free makes the handle null')
  call dsm_sp_free(sp, st)
  call check(st == DSM_SUCCESS, 'dsm_sp_free of a null handle does nothing')
  call dsm_mesh_free(mesh)

  call MPI_Finalize(ierr)
  if (failures > 0) then
     if (rank == 0) write(*, '(a,i0,a)') 'FAIL: ', failures, ' check(s) failed'
     error stop 1
  end if
  if (rank == 0) write(*, '(a)') 'PASS: all checks'

contains

  include 'checks.inc'

  ! A distinct, exactly representable value for element (bi, ti, h, e) of a
  ! global tensor (0-based batch, token, head, head-dim indices).
  pure real(c_float) function value(bi, ti, h, e)
    integer(c_int64_t), intent(in) :: bi, ti, h, e

    value = real(bi * 100000 + ti * 1000 + h * 10 + e + 1, c_float)
  end function value

  ! ---------------------------------------------------------- head split
  subroutine test_head_range()
    integer(c_int64_t) :: first, count, want_first(0:3), want_count(0:3), ns, nh, cnt
    type(dsm_sp_tensor_t) :: t
    logical :: ok
    integer :: j

    want_first = [0, 2, 4, 6]
    want_count = [2, 2, 2, 1]
    ok = .true.
    do j = 0, 3
       call dsm_sp_head_range(7_c_int64_t, 0, 4, j, first, count)
       if (first /= want_first(j) .or. count /= want_count(j)) ok = .false.
    end do
    call check(ok, '7 heads over 4 ranks: 2, 2, 2, 1 from heads 0, 2, 4, 6')
    call dsm_sp_head_range(3_c_int64_t, 0, 4, 3, first, count)
    call check(count == 0, '3 heads over 4 ranks: rank 3 has none')
    ok = .true.
    do j = 0, 7
       call dsm_sp_head_range(2_c_int64_t, DSM_SP_REPLICATE, 8, j, first, count)
       if (first /= j / 4 .or. count /= 1) ok = .false.
    end do
    call check(ok, '2 replicated heads over 8 ranks: head r/4 each')
    call dsm_sp_head_range(3_c_int64_t, DSM_SP_REPLICATE, 4, 0, first, count, st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'replicating 3 heads over 4', &
         'replicating 3 heads over 4 ranks gives DSM_ERR_INVALID_ARGUMENT')
    call dsm_sp_head_range(0_c_int64_t, 0, 4, 0, first, count, st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'heads is 0', '0 heads gives DSM_ERR_INVALID_ARGUMENT')
    call dsm_sp_head_range(4_c_int64_t, 0, 4, 4, first, count, st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'rank 4 is outside [0, 4)', &
         'rank 4 of 4 gives DSM_ERR_INVALID_ARGUMENT')

    t = dsm_sp_tensor_t(batch=2, seq=3 * nprocs, heads=7, head_dim=5)
    call dsm_sp_counts(sp, t, ns, nh)
    call dsm_sp_head_range(7_c_int64_t, 0, nprocs, rank, first, cnt)
    call check(ns == 2 * 3 * 7 * 5 .and. nh == 2 * 3 * nprocs * cnt * 5, &
         'dsm_sp_counts: b*s/P*H*d and b*s*count*d')
    t%head_dim = 0
    call dsm_sp_counts(sp, t, ns, nh, st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'head_dim is 0', 'dsm_sp_counts of head_dim 0 gives DSM_ERR_INVALID_ARGUMENT')
  end subroutine test_head_range

  ! This rank's sequence-sharded piece of the global tensor t, as the
  ! Fortran array of its layout, flattened.
  subroutine seq_sharded(t, x)
    type(dsm_sp_tensor_t), intent(in) :: t
    real(c_float), dimension(:), allocatable, intent(out) :: x
    integer(c_int64_t) :: bi, ti, h, e, sl, k

    sl = t%seq / nprocs
    allocate(x(t%batch * sl * t%heads * t%head_dim))
    do bi = 0, t%batch - 1
       do ti = 0, sl - 1
          do h = 0, t%heads - 1
             do e = 0, t%head_dim - 1
                ! Fortran x(e, h, ti, bi) (batch first) or x(e, h, bi, ti) (sequence first).
                if (t%layout == DSM_SP_BATCH_FIRST) then
                   k = 1 + e + t%head_dim * (h + t%heads * (ti + sl * bi))
                else
                   k = 1 + e + t%head_dim * (h + t%heads * (bi + t%batch * ti))
                end if
                x(k) = value(bi, rank * sl + ti, h, e)
             end do
          end do
       end do
    end do
  end subroutine seq_sharded

  ! Whether y is this rank's head-sharded form of t: every token, heads
  ! [first, first + count); a mismatch is printed.
  logical function is_head_sharded(t, y, first, count) result(ok)
    type(dsm_sp_tensor_t), intent(in) :: t
    real(c_float), dimension(:), intent(in) :: y
    integer(c_int64_t), intent(in) :: first, count
    integer(c_int64_t) :: bi, ti, h, e, k

    ok = size(y, kind=c_int64_t) == t%batch * t%seq * count * t%head_dim
    if (.not. ok) return
    do bi = 0, t%batch - 1
       do ti = 0, t%seq - 1
          do h = 0, count - 1
             do e = 0, t%head_dim - 1
                if (t%layout == DSM_SP_BATCH_FIRST) then
                   k = 1 + e + t%head_dim * (h + count * (ti + t%seq * bi))
                else
                   k = 1 + e + t%head_dim * (h + count * (bi + t%batch * ti))
                end if
                if (y(k) /= value(bi, ti, first + h, e)) then
                   write(*, '(a,i0,a,4(i0,1x),a,f12.1,a,f12.1)') 'rank ', rank, ': [b s h e] ', bi, ti, &
                        first + h, e, 'has ', y(k), ', want ', value(bi, ti, first + h, e)
                   ok = .false.
                   return
                end if
             end do
          end do
       end do
    end do
  end function is_head_sharded

  ! ---------------------------------------------------------- round trips (real arrays)
  subroutine test_round_trips()
    integer(c_int64_t), dimension(4) :: heads
    type(dsm_sp_tensor_t) :: t
    real(c_float), dimension(:), allocatable :: x, mid, back
    real(c_float), dimension(:,:,:,:), allocatable :: x4, mid4
    integer(c_int64_t) :: first, cnt, ns, nh
    integer :: l, k
    logical :: fwd_ok, back_ok
    character(len=80) :: what

    heads = [2_c_int64_t * nprocs, 7_c_int64_t, 1_c_int64_t, int(nprocs + 1, c_int64_t)]
    do l = DSM_SP_BATCH_FIRST, DSM_SP_SEQ_FIRST
       do k = 1, 4
          t = dsm_sp_tensor_t(batch=2, seq=3 * nprocs, heads=heads(k), head_dim=5, layout=l)
          call dsm_sp_counts(sp, t, ns, nh)
          call dsm_sp_head_range(t%heads, 0, nprocs, rank, first, cnt)
          call seq_sharded(t, x)
          allocate(mid(nh), back(ns))
          mid = -1
          back = -1
          call dsm_sp_seq_to_head(sp, t, x, mid, st)
          fwd_ok = st == DSM_SUCCESS .and. is_head_sharded(t, mid, first, cnt)
          call dsm_sp_head_to_seq(sp, t, mid, back, st)
          back_ok = st == DSM_SUCCESS .and. all(transfer(back, 0_c_int32_t, size(back)) == &
               transfer(x, 0_c_int32_t, size(x)))
          write(what, '(a,i0,a,i0,a)') 'layout ', l, ', ', heads(k), ' heads'
          call check(fwd_ok, 'dsm_sp_seq_to_head (real arrays), ' // trim(what) // ': every element in place')
          call check(back_ok, 'dsm_sp_head_to_seq (real arrays), ' // trim(what) // ': bit-exact round trip')
          deallocate(x, mid, back)
       end do
    end do

    ! Rank-4 arrays in the Fortran shape of the layout: x(d, H, s/P, b).
    t = dsm_sp_tensor_t(batch=2, seq=2 * nprocs, heads=2 * nprocs, head_dim=3)
    call dsm_sp_head_range(t%heads, 0, nprocs, rank, first, cnt)
    call seq_sharded(t, x)
    x4 = reshape(x, [3, 2 * nprocs, 2, 2])
    allocate(mid4(3, cnt, 2 * nprocs, 2))
    call dsm_sp_seq_to_head(sp, t, x4, mid4, st)
    call check(st == DSM_SUCCESS .and. is_head_sharded(t, reshape(mid4, [size(mid4)]), first, cnt), &
         'rank-4 arrays x(d, H, s/P, b) -> y(d, count, s, b)')
    ! y(e, h, ti, bi) holds element e - 1 of head first + h - 1 of token
    ! ti - 1 of sequence bi - 1 (Fortran indices are 1-based).
    call check(mid4(2, 1, 2 * nprocs, 2) == value(1_c_int64_t, 2_c_int64_t * nprocs - 1, first, 1_c_int64_t), &
         'y(2, 1, s, 2) is element 1 of head first of the last token of sequence 1')
    x4 = 0
    call dsm_sp_head_to_seq(sp, t, mid4, x4, st)
    call check(st == DSM_SUCCESS .and. all(reshape(x4, [size(x4)]) == x), 'rank-4 arrays back')
  end subroutine test_round_trips

  ! ---------------------------------------------------------- bfloat16 through type(c_ptr)
  subroutine test_bfloat16()
    type(dsm_sp_tensor_t) :: t
    real(c_float), dimension(:), allocatable :: xf
    integer(c_int16_t), dimension(:), allocatable, target :: x, mid, back
    integer(c_int64_t) :: first, cnt, ns, nh, k
    logical :: ok

    t = dsm_sp_tensor_t(batch=2, seq=3 * nprocs, heads=7, head_dim=5, dtype=DSM_BFLOAT16)
    call dsm_sp_counts(sp, t, ns, nh)
    call dsm_sp_head_range(t%heads, 0, nprocs, rank, first, cnt)
    ! The bit patterns: the low 16 bits of the fp32 values (all distinct here).
    t%dtype = DSM_FLOAT32
    call seq_sharded(t, xf)
    t%dtype = DSM_BFLOAT16
    allocate(x(ns), mid(max(nh, 1_c_int64_t)), back(ns))
    do k = 1, ns
       x(k) = int(iand(int(xf(k), c_int64_t), 32767_c_int64_t), c_int16_t)
    end do
    back = -1
    call dsm_sp_seq_to_head(sp, t, c_loc(x), ns, c_loc(mid), nh, st)
    ok = st == DSM_SUCCESS
    call dsm_sp_head_to_seq(sp, t, c_loc(mid), nh, c_loc(back), ns, st)
    call check(ok .and. st == DSM_SUCCESS .and. all(back == x), 'bfloat16 (type(c_ptr) form): bit-exact round trip')
    call dsm_sp_seq_to_head(sp, t, c_loc(x), ns + 1, c_loc(mid), nh, st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'in_count is', 'a wrong in_count gives DSM_ERR_INVALID_ARGUMENT')
  end subroutine test_bfloat16

  ! ---------------------------------------------------------- several tensors in one call
  subroutine test_n_tensors()
    type(dsm_sp_tensor_t), dimension(3) :: t
    real(c_float), dimension(:), allocatable, target :: q, k, v, qm, km, vm, qb, kb, vb, ref
    type(c_ptr), dimension(3) :: pin, pmid, pback
    integer(c_int64_t), dimension(3) :: ns, nh
    integer(c_int64_t) :: first, cnt
    integer :: i
    logical :: ok

    t(1) = dsm_sp_tensor_t(batch=1, seq=2 * nprocs, heads=2 * nprocs, head_dim=4)
    t(2) = dsm_sp_tensor_t(batch=1, seq=2 * nprocs, heads=nprocs + 1, head_dim=4)
    ! One key/value head replicated on every rank: the way back sums the P copies.
    t(3) = dsm_sp_tensor_t(batch=1, seq=2 * nprocs, heads=1, head_dim=4, flags=DSM_SP_REPLICATE)
    do i = 1, 3
       call dsm_sp_counts(sp, t(i), ns(i), nh(i))
    end do
    call seq_sharded(t(1), q)
    call seq_sharded(t(2), k)
    call seq_sharded(t(3), v)
    allocate(qm(nh(1)), km(nh(2)), vm(nh(3)), qb(ns(1)), kb(ns(2)), vb(ns(3)))
    pin = [loc_of(q), loc_of(k), loc_of(v)]
    pmid = [loc_of(qm), loc_of(km), loc_of(vm)]
    pback = [loc_of(qb), loc_of(kb), loc_of(vb)]
    call dsm_sp_seq_to_head_n(sp, t, pin, ns, pmid, nh, st)
    ok = st == DSM_SUCCESS
    ! Each against the single-tensor transform.
    allocate(ref(nh(2)))
    call dsm_sp_seq_to_head(sp, t(2), k, ref)
    ok = ok .and. all(ref == km)
    call dsm_sp_head_range(t(1)%heads, 0, nprocs, rank, first, cnt)
    ok = ok .and. is_head_sharded(t(1), qm, first, cnt)
    call dsm_sp_head_range(1_c_int64_t, DSM_SP_REPLICATE, nprocs, rank, first, cnt)
    ok = ok .and. first == 0 .and. cnt == 1 .and. is_head_sharded(t(3), vm, first, cnt)
    call check(ok, 'dsm_sp_seq_to_head_n of q, k (uneven heads) and a replicated v')
    call dsm_sp_head_to_seq_n(sp, t, pmid, nh, pback, ns, st)
    call check(st == DSM_SUCCESS .and. all(qb == q) .and. all(kb == k), 'dsm_sp_head_to_seq_n: q and k come back')
    call check(all(vb == real(nprocs, c_float) * v), 'dsm_sp_head_to_seq_n: the replicated v comes back times P')
    call dsm_sp_seq_to_head_n(sp, t, pin(1:2), ns, pmid, nh, st)
    call check_error(st, DSM_ERR_NULL_POINTER, 'tensor 2: in is NULL', &
         'a missing input of the n-tensor form is reported naming the tensor')
  end subroutine test_n_tensors

  ! c_loc of a real array, null when it is empty.
  function loc_of(x) result(p)
    real(c_float), dimension(:), intent(in), target :: x
    type(c_ptr) :: p

    p = c_null_ptr
    if (size(x) > 0) p = c_loc(x(1))
  end function loc_of

  ! ---------------------------------------------------------- dsm_sp_alloc
  subroutine test_alloc()
    type(dsm_sp_tensor_t) :: t
    real(c_float), dimension(:), allocatable :: x, ref
    real(c_float), dimension(:), pointer :: in, mid
    type(c_ptr) :: pin, pmid, z, copy, wrong
    integer(c_int64_t) :: ns, nh
    integer(c_int64_t), target :: local

    t = dsm_sp_tensor_t(batch=2, seq=3 * nprocs, heads=7, head_dim=5, layout=DSM_SP_SEQ_FIRST)
    call dsm_sp_counts(sp, t, ns, nh)
    call seq_sharded(t, x)
    call dsm_sp_alloc(sp, 4 * ns, pin, st)
    call check(st == DSM_SUCCESS .and. c_associated(pin), 'dsm_sp_alloc of the input')
    call dsm_sp_alloc(sp, 4 * nh, pmid)  ! sizes differ across ranks: 7 heads
    call c_f_pointer(pin, in, [ns])
    call check(all(in == 0), 'dsm_sp_alloc memory is zeroed')
    in = x
    allocate(ref(nh))
    if (nh > 0) then
       call c_f_pointer(pmid, mid, [nh])
       call dsm_sp_seq_to_head(sp, t, in, mid, st)
       call dsm_sp_seq_to_head(sp, t, x, ref)
       call check(st == DSM_SUCCESS .and. all(mid == ref), 'a transform from dsm_sp_alloc memory gives the same values')
    else
       call dsm_sp_seq_to_head(sp, t, pin, ns, pmid, nh, st)
       call dsm_sp_seq_to_head(sp, t, x, ref)
       call check(st == DSM_SUCCESS, 'a transform from dsm_sp_alloc memory gives the same values')
    end if
    call dsm_sp_free_memory(sp, pmid)
    call check(.not. c_associated(pmid), 'dsm_sp_free_memory sets the pointer to c_null_ptr')
    copy = pin
    call dsm_sp_free_memory(sp, pin, st)
    call check(st == DSM_SUCCESS .and. .not. c_associated(pin), 'dsm_sp_free_memory')
    ! What users do: a cleanup that frees everything again frees c_null_ptr,
    ! which does nothing.
    call dsm_sp_free_memory(sp, pin, st)
    call check(st == DSM_SUCCESS .and. .not. c_associated(pin), 'freeing it again through the same variable does nothing')
    ! A copy kept elsewhere is not nulled: freeing it is an error on every rank.
    call dsm_sp_free_memory(sp, copy, st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'was not returned by dsm_sp_alloc', &
         'freeing a copy of a freed pointer gives DSM_ERR_INVALID_ARGUMENT on every rank')
    call dsm_sp_alloc(sp, 0_c_int64_t, z, st)
    call check(st == DSM_SUCCESS .and. c_associated(z), 'dsm_sp_alloc of 0 bytes gives a pointer')
    wrong = c_null_ptr
    call dsm_sp_free_memory(sp, wrong, st)
    call check(st == DSM_SUCCESS, 'dsm_sp_free_memory of c_null_ptr does nothing')
    call dsm_sp_alloc(sp, 64_c_int64_t, pin)
    wrong = pin
    if (rank == nprocs - 1) wrong = c_loc(local)
    call dsm_sp_free_memory(sp, wrong, st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'was not returned by dsm_sp_alloc', &
         'a pointer not from dsm_sp_alloc on the last rank fails every rank')
    call check(c_associated(pin), 'a failed free leaves the pointer')
    call dsm_sp_free_memory(sp, pin)
    call dsm_sp_free_memory(sp, z)
  end subroutine test_alloc

  ! ---------------------------------------------------------- transform errors
  subroutine test_transform_errors()
    type(dsm_sp_tensor_t) :: t
    real(c_float), dimension(:), allocatable :: x, y
    integer(c_int64_t) :: ns, nh

    t = dsm_sp_tensor_t(batch=1, seq=2 * nprocs, heads=nprocs, head_dim=2)
    call dsm_sp_counts(sp, t, ns, nh)
    allocate(x(ns), y(nh))
    x = 1
    if (rank == nprocs - 1) then
       deallocate(x)
       allocate(x(ns - 1))
       x = 1
    end if
    call dsm_sp_seq_to_head(sp, t, x, y, st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'in_count is', &
         'an input one element short on the last rank fails every rank')
    if (nprocs > 1) then
       deallocate(x)
       allocate(x(ns))
       t%seq = 2 * nprocs + 1
       call dsm_sp_seq_to_head(sp, t, x, y, st)
       call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'sequence length', &
            'a sequence that is not a multiple of P gives DSM_ERR_INVALID_ARGUMENT')
    end if
    t = dsm_sp_tensor_t(batch=1, seq=2 * nprocs, heads=nprocs, head_dim=2, layout=7)
    call dsm_sp_seq_to_head(sp, t, x, y, st)
    call check(st == DSM_ERR_INVALID_ARGUMENT, 'layout 7 gives DSM_ERR_INVALID_ARGUMENT')
    call dsm_sp_seq_to_head(sp2, t, x, y, st)
    call check(st == DSM_ERR_NULL_POINTER, 'a transform on a null context gives DSM_ERR_NULL_POINTER')
  end subroutine test_transform_errors

  ! ---------------------------------------------------------- shard_batch
  subroutine test_shard_batch()
    integer(c_int64_t), parameter :: S = 7, B = 2, PAD = -1
    integer(c_int64_t), dimension(S, B) :: tokens, positions, labels
    integer(c_int64_t), dimension(:,:), allocatable :: ot, op, ol
    integer(c_int64_t) :: chunk, valid, t0, k, bi, total, want_valid, want_label, want_chunk
    integer(c_int64_t), dimension(2, 3) :: wrong
    integer :: j
    logical :: ok, ok2

    do bi = 1, B
       do t0 = 1, S
          tokens(t0, bi) = 1000 * bi + t0
          positions(t0, bi) = 100 * bi + 3 * t0
          labels(t0, bi) = -t0 - 10 * bi
       end do
    end do
    ok = .true.
    ok2 = .true.
    total = 0
    ! Every rank computes every rank's chunk (not collective): they cover the
    ! sequences, and each is what the rule says.
    want_chunk = (S + nprocs - 1) / nprocs
    do j = 0, nprocs - 1
       call dsm_sp_shard_batch(nprocs, j, tokens, PAD, ot, op, ol, chunk, valid, ierr=st)
       if (st /= DSM_SUCCESS .or. chunk /= want_chunk .or. any(shape(ot) /= [want_chunk, B])) then
          ok = .false.
       else
          want_valid = 0
          do bi = 1, B
             do k = 1, chunk
                t0 = j * chunk + k - 1  ! 0-based position in the sequence
                if (t0 < S) then
                   want_label = DSM_IGNORE_INDEX
                   if (t0 + 1 < S) want_label = tokens(t0 + 2, bi)
                   if (ot(k, bi) /= tokens(t0 + 1, bi) .or. op(k, bi) /= t0 .or. ol(k, bi) /= want_label) &
                        ok = .false.
                else
                   if (ot(k, bi) /= PAD .or. op(k, bi) /= t0 .or. ol(k, bi) /= DSM_IGNORE_INDEX) ok = .false.
                end if
                if (t0 + 1 < S) want_valid = want_valid + 1
             end do
          end do
          if (valid /= want_valid) ok = .false.
          total = total + valid
       end if
       ! With positions and labels.
       call dsm_sp_shard_batch(nprocs, j, tokens, PAD, ot, op, ol, positions=positions, labels=labels, ierr=st)
       if (st /= DSM_SUCCESS .or. any(shape(ot) /= [want_chunk, B])) then
          ok2 = .false.
          cycle
       end if
       do bi = 1, B
          do k = 1, want_chunk
             t0 = j * want_chunk + k - 1
             if (t0 < S) then
                want_label = DSM_IGNORE_INDEX
                if (t0 + 1 < S) want_label = labels(t0 + 2, bi)
                if (ot(k, bi) /= tokens(t0 + 1, bi) .or. op(k, bi) /= positions(t0 + 1, bi) .or. &
                     ol(k, bi) /= want_label) ok2 = .false.
             else
                ! Padding positions continue the row's last position.
                if (op(k, bi) /= positions(S, bi) + t0 - (S - 1) .or. ol(k, bi) /= DSM_IGNORE_INDEX) ok2 = .false.
             end if
          end do
       end do
    end do
    call check(ok, 'dsm_sp_shard_batch: tokens(seq, batch) cut into chunk x batch, shifted labels, padding')
    call check(total == B * (S - 1), 'the chunks'' valid labels add up to batch * (seq - 1)')
    call check(ok2, 'dsm_sp_shard_batch with positions and labels')
    call dsm_sp_shard_batch(0, 0, tokens, PAD, ot, op, ol, ierr=st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'size is 0', 'size 0 gives DSM_ERR_INVALID_ARGUMENT')
    call dsm_sp_shard_batch(nprocs, nprocs, tokens, PAD, ot, op, ol, ierr=st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'outside [0,', 'rank = size gives DSM_ERR_INVALID_ARGUMENT')
    wrong = 0
    call dsm_sp_shard_batch(nprocs, rank, tokens, PAD, ot, op, ol, positions=wrong, ierr=st)
    call check(st == DSM_ERR_INVALID_ARGUMENT, 'positions shaped unlike tokens give DSM_ERR_INVALID_ARGUMENT')
  end subroutine test_shard_batch

  ! ---------------------------------------------------------- loss
  subroutine test_loss()
    real(c_double) :: mean, scale

    call dsm_sp_loss(sp, real(rank + 1, c_double), 2_c_int64_t * (rank + 1), mean, scale, st)
    call check(st == DSM_SUCCESS .and. abs(mean - 0.5d0) < 1d-15 .and. &
         abs(scale - 1d0 / (nprocs * (nprocs + 1))) < 1d-15, &
         'dsm_sp_loss: the token-weighted mean and 1 / all tokens')
    call dsm_sp_loss(sp, 0d0, 0_c_int64_t, mean, scale, st)
    call check(st == DSM_SUCCESS .and. mean == 0 .and. scale == 0, 'dsm_sp_loss without tokens gives 0 and 0')
    call dsm_sp_loss(sp, 1d0, merge(-1_c_int64_t, 1_c_int64_t, rank == nprocs - 1), mean, scale, st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'tokens is -1', &
         'negative tokens on the last rank fail every rank')
  end subroutine test_loss

  ! ---------------------------------------------------------- sampler
  subroutine test_sampler()
    integer(c_int64_t), parameter :: N = 23, MB = 3
    type(dsm_sampler_t) :: s, s2
    type(dsm_engine_t) :: engine
    type(dsm_param_desc_t), dimension(1) :: params
    integer(c_int64_t), dimension(MB) :: idx, idx2
    integer(c_int64_t), dimension(0) :: none
    integer(c_int64_t), dimension(:), allocatable :: perm0, perm1
    integer(c_int64_t) :: nb, per_rank, b, i, count, count2, epoch, batch, ms
    logical :: ok

    ! Plain: rank r takes positions r, r + R, ... of 0..N-1 padded from its start.
    call dsm_sampler_create(N, nprocs, rank, MB, s, shuffle=.false., ierr=st)
    call check(st == DSM_SUCCESS .and. c_associated(s%ptr), 'dsm_sampler_create without shuffle')
    call dsm_sampler_num_batches(s, nb)
    per_rank = (N + nprocs - 1) / nprocs
    call check(nb == (per_rank + MB - 1) / MB, 'num_batches = ceil(ceil(N / R) / micro_batch)')
    ok = .true.
    do b = 0, nb - 1
       idx = -7
       call dsm_sampler_batch(s, 0_c_int64_t, b, idx, count)
       if (count /= min(MB, per_rank - b * MB)) ok = .false.
       do i = 0, count - 1
          if (idx(i + 1) /= mod(rank + (b * MB + i) * nprocs, N)) ok = .false.
       end do
       if (any(idx(count + 1:) /= -7)) ok = .false.
    end do
    call check(ok, 'unshuffled micro-batches follow DistributedSampler (0-based indices, padding from the start)')
    ms = 2 * nb + 1
    call dsm_sampler_locate(s, ms, epoch, batch)
    call check(epoch == ms / nb .and. batch == mod(ms, nb), 'dsm_sampler_locate')
    call dsm_sampler_batch(s, 0_c_int64_t, nb, idx, count, st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'batch is', 'batch = num_batches gives DSM_ERR_INVALID_ARGUMENT')
    call dsm_sampler_batch(s, -1_c_int64_t, 0_c_int64_t, idx, count, st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'epoch is -1', 'epoch -1 gives DSM_ERR_INVALID_ARGUMENT')
    call dsm_sampler_batch(s, 0_c_int64_t, 0_c_int64_t, none, count, st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'len is 0', 'no room for the indices gives DSM_ERR_INVALID_ARGUMENT')
    call dsm_sampler_locate(s, -1_c_int64_t, epoch, batch, st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'micro_steps is -1', &
         'dsm_sampler_locate of -1 gives DSM_ERR_INVALID_ARGUMENT')
    ! A position after micro-batch 0 of epoch 1, resumed at the same size: the epoch's batch 1 comes next.
    if (nb > 1) then
       call dsm_sampler_position(s, 1_c_int64_t, 0_c_int64_t, ms, st)
       call check(st == DSM_SUCCESS .and. ms == N + MB * nprocs, 'dsm_sampler_position after micro-batch 0')
       call dsm_sampler_resume(s, ms, epoch, st)
       call check(st == DSM_SUCCESS .and. epoch == 1, 'dsm_sampler_resume continues in epoch 1')
       call dsm_sampler_epoch_batches(s, 1_c_int64_t, batch, st)
       call check(st == DSM_SUCCESS .and. batch == nb - 1, 'dsm_sampler_epoch_batches: one micro-batch fewer')
       idx = -7
       call dsm_sampler_batch(s, 1_c_int64_t, 0_c_int64_t, idx, count)
       call check(idx(1) == mod(rank + MB * nprocs, N), 'the resumed epoch starts after the consumed samples')
    end if
    call dsm_sampler_position(s, 0_c_int64_t, nb, ms, st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'batch is', 'dsm_sampler_position past the epoch fails')
    call dsm_sampler_resume(s, -1_c_int64_t, epoch, st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'samples is -1', 'dsm_sampler_resume of -1 fails')
    call dsm_sampler_free(s, st)
    call check(st == DSM_SUCCESS .and. .not. c_associated(s%ptr), 'dsm_sampler_free makes the handle null')

    ! drop_last, micro-batches of 1: floor(N / R) samples, no wrap.
    call dsm_sampler_create(N, nprocs, rank, 1_c_int64_t, s, shuffle=.false., drop_last=.true.)
    call dsm_sampler_num_batches(s, nb)
    ok = nb == N / nprocs
    do b = 0, nb - 1
       call dsm_sampler_batch(s, 3_c_int64_t, b, idx, count)
       if (count /= 1 .or. idx(1) /= rank + b * nprocs) ok = .false.
    end do
    call check(ok, 'drop_last drops the tail')
    call dsm_sampler_free(s)

    ! Shuffled: each epoch's indices over all ranks are a permutation of
    ! 0..N-1 (24 samples: no padding at 1, 2, 4, 8 ranks), the same for the
    ! same seed, another for another epoch or seed.
    call shuffled_epoch(42_c_int64_t, 0_c_int64_t, perm0)
    call shuffled_epoch(42_c_int64_t, 1_c_int64_t, perm1)
    call check(is_permutation(perm0) .and. is_permutation(perm1), 'shuffled epochs are permutations')
    call check(any(perm0 /= [(i, i = 0, 23)]), 'the shuffle moves samples')
    call check(any(perm0 /= perm1), 'epochs 0 and 1 are shuffled differently')
    call shuffled_epoch(42_c_int64_t, 0_c_int64_t, perm1)
    call check(all(perm0 == perm1), 'the same seed and epoch give the same permutation')
    call shuffled_epoch(-3_c_int64_t, 0_c_int64_t, perm1)
    call check(is_permutation(perm1) .and. any(perm0 /= perm1), 'another seed (the bits of 2**64 - 3) another one')

    ! Bad arguments (not collective: every rank passes them).
    call dsm_sampler_create(0_c_int64_t, nprocs, rank, MB, s, ierr=st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'num_samples is 0', 'num_samples 0 gives DSM_ERR_INVALID_ARGUMENT')
    call check(.not. c_associated(s%ptr), 'the failed sampler handle is null')
    call dsm_sampler_create(N, nprocs, nprocs, MB, s, ierr=st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'rank is', 'rank = replicas gives DSM_ERR_INVALID_ARGUMENT')
    call dsm_sampler_create(N, nprocs, rank, 50_c_int64_t, s, drop_last=.true., ierr=st)
    call check_error(st, DSM_ERR_INVALID_ARGUMENT, 'no micro-batch', &
         'drop_last with fewer samples than a micro-batch gives DSM_ERR_INVALID_ARGUMENT')
    call dsm_sampler_num_batches(s, nb, st)
    call check(st == DSM_ERR_NULL_POINTER, 'a null sampler gives DSM_ERR_NULL_POINTER')
    call dsm_sampler_free(s, st)
    call check(st == DSM_SUCCESS, 'dsm_sampler_free of a null handle does nothing')

    ! For an engine: its data-parallel size and rank, its micro-batch.
    params(1) = dsm_param_desc_t(name='w', shape=[3])
    call dsm_engine_init_comm(MPI_COMM_WORLD, '{"train_micro_batch_size_per_gpu": 3, ' // &
         '"optimizer": {"type": "SGD", "params": {"lr": 0.1}}}', params, engine)
    call dsm_sampler_create_for_engine(engine, N, s, seed=7_c_int64_t, ierr=st)
    call dsm_sampler_create(N, nprocs, rank, MB, s2, seed=7_c_int64_t)
    call dsm_sampler_num_batches(s, nb)
    call dsm_sampler_num_batches(s2, i)
    ok = st == DSM_SUCCESS .and. nb == i
    do b = 0, nb - 1
       call dsm_sampler_batch(s, 1_c_int64_t, b, idx, count)
       call dsm_sampler_batch(s2, 1_c_int64_t, b, idx2, count2)
       if (count /= count2 .or. any(idx(1:count) /= idx2(1:count2))) ok = .false.
    end do
    call check(ok, 'dsm_sampler_create_for_engine = dsm_sampler_create(N, dp size, dp rank, micro batch)')
    call dsm_sampler_free(s)
    call dsm_sampler_free(s2)
    call dsm_engine_free(engine)
    call dsm_sampler_create_for_engine(engine, N, s, ierr=st)
    call check(st == DSM_ERR_NULL_POINTER, 'dsm_sampler_create_for_engine of a null engine gives DSM_ERR_NULL_POINTER')
  end subroutine test_sampler

  ! The shuffled list of one epoch of 24 samples over every rank, in
  ! DistributedSampler's order: position r + j * R is rank r's sample j.
  subroutine shuffled_epoch(seed, epoch, perm)
    integer(c_int64_t), intent(in) :: seed, epoch
    integer(c_int64_t), dimension(:), allocatable, intent(out) :: perm
    integer(c_int64_t), parameter :: N = 24
    type(dsm_sampler_t) :: s
    integer(c_int64_t), dimension(:), allocatable :: mine, everything
    integer(c_int64_t), dimension(2) :: idx
    integer(c_int64_t) :: nb, b, count, k
    integer :: j, per_rank

    per_rank = int(N) / nprocs
    call dsm_sampler_create(N, nprocs, rank, 2_c_int64_t, s, seed=seed)
    call dsm_sampler_num_batches(s, nb)
    allocate(mine(per_rank), everything(N), perm(N))
    k = 0
    do b = 0, nb - 1
       call dsm_sampler_batch(s, epoch, b, idx, count)
       mine(k + 1:k + count) = idx(1:count)
       k = k + count
    end do
    call dsm_sampler_free(s)
    call MPI_Allgather(mine, per_rank, MPI_INTEGER8, everything, per_rank, MPI_INTEGER8, MPI_COMM_WORLD, ierr)
    ! everything holds rank 0's samples, then rank 1's, ...
    do j = 0, nprocs - 1
       do k = 0, per_rank - 1
          perm(1 + j + k * nprocs) = everything(1 + j * per_rank + k)
       end do
    end do
  end subroutine shuffled_epoch

  logical function is_permutation(x)
    integer(c_int64_t), dimension(:), intent(in) :: x
    logical, dimension(0:size(x) - 1) :: seen
    integer :: j

    seen = .false.
    is_permutation = .true.
    do j = 1, size(x)
       if (x(j) < 0 .or. x(j) >= size(x)) then
          is_permutation = .false.
          return
       end if
       seen(x(j)) = .true.
    end do
    is_permutation = all(seen)
  end function is_permutation

end program test_fortran_sp
