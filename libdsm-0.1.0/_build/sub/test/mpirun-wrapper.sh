#!/bin/sh
# Run an MPI program on N ranks, for the automake test harness and for
# `make run-example`:
#   mpirun-wrapper.sh path/to/test_program-npN.mpi   (the harness: N from the name)
#   mpirun-wrapper.sh N program [ARGS...]
# The launcher is /usr/bin/mpiexec (configure --with-mpiexec), or $MPIEXEC when set.
# More ranks than cores are allowed (oversubscription); a run that takes longer
# than DSM_TEST_TIMEOUT seconds (default 300) is killed and fails, so a hang
# never stalls the suite. mpiexec reduces the ranks' exit codes to one: any
# failing rank fails the test.
case $1 in
  *.mpi)
    stub=$1
    shift
    base=${stub%.mpi}
    np=${base##*-np}
    prog=${base%-np*}
    case $np in
      ''|*[!0-9]*) echo "mpirun-wrapper.sh: '$stub' does not name a rank count (expected NAME-npN.mpi)"; exit 99 ;;
    esac ;;
  *)
    np=$1
    prog=$2
    case $np in
      ''|*[!0-9]*) echo "mpirun-wrapper.sh: '$np' is not a rank count (usage: mpirun-wrapper.sh N PROGRAM [ARGS...])"; exit 99 ;;
    esac
    [ -n "$prog" ] || { echo "mpirun-wrapper.sh: no program (usage: mpirun-wrapper.sh N PROGRAM [ARGS...])"; exit 99; }
    shift 2 ;;
esac
launcher=${MPIEXEC:-/usr/bin/mpiexec}
timeout_s=${DSM_TEST_TIMEOUT:-300}

# Open MPI: allow oversubscription, and running as root inside containers/CI.
OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_rmaps_base_oversubscribe
if [ "$(id -u)" = 0 ]; then
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  export OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM
fi
# Oversubscribed ranks must yield the CPU instead of spinning, and OpenMP
# threads (the optimizer kernels) must not multiply the oversubscription.
OMPI_MCA_mpi_yield_when_idle=1
OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export OMPI_MCA_mpi_yield_when_idle OMP_NUM_THREADS

# Under --enable-sanitizers: Open MPI does not free its own allocations at
# exit, so leak checking is off for MPI runs (unit tests keep it).
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
export ASAN_OPTIONS

echo "running: $launcher -n $np $prog $* (timeout ${timeout_s}s)"
timeout --kill-after=10 "$timeout_s" $launcher -n "$np" "$prog" "$@"
rc=$?
case $rc in
  124|137) echo "FAIL: $prog on $np ranks did not finish in ${timeout_s}s (hang?)"; exit 1 ;;
esac
exit $rc
