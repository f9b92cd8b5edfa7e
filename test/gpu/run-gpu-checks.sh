#!/bin/bash
# make check-gpu: the GPU tests and the GPU benchmarks of one build, run on a
# machine with a CUDA device (one is enough; ranks beyond the GPU count share
# it, which exercises the mpi backend on device memory and the clear refusal
# of NCCL). Without a device it says so and exits 77 (skipped).
#
# Environment: top_builddir (default .), MPIEXEC (default: the build's
# mpirun-wrapper.sh launcher), GPU_CHECK_LOG (default
# test/gpu/gpu-checks.log), GPU_CHECK_SANITIZER=0 to leave out
# compute-sanitizer's memcheck runs, GPU_CHECK_ONLY=zeropp for the ZeRO++
# quantization checks alone.
set -u
B=${top_builddir:-.}
LOG=${GPU_CHECK_LOG:-$B/test/gpu/gpu-checks.log}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} DSM_TEST_FAIL_WAIT=${DSM_TEST_FAIL_WAIT:-5}
WRAP="$B/test/mpirun-wrapper.sh"

if ! command -v nvidia-smi > /dev/null 2>&1 || ! nvidia-smi -L > /dev/null 2>&1; then
  echo "check-gpu: no CUDA device here (nvidia-smi finds none): skipped"
  exit 77
fi
mkdir -p "$(dirname "$LOG")"
: > "$LOG"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | sed 's/^/GPU: /' | tee -a "$LOG"

failed=0
# run NAME NP TIMEOUT PROGRAM [ARGS...]; NP 0 runs the program without MPI.
run() {
  local name=$1 np=$2 to=$3; shift 3
  local out rc
  out=$(mktemp)
  if [ "$np" = 0 ]; then timeout -k 5 "$to" "$@" > "$out" 2>&1; else
    DSM_TEST_TIMEOUT=$to "$WRAP" "$np" "$@" > "$out" 2>&1; fi
  rc=$?
  { echo "===== $name, $np ranks: exit $rc"; cat "$out"; } >> "$LOG"
  printf '%-34s %s  (skipped %s)\n' "$name np$np" "$([ $rc = 0 ] && echo PASS || echo FAIL)" \
    "$(grep -c '^\[  SKIPPED \]' "$out")"
  [ $rc = 0 ] || failed=$((failed + 1))
  rm -f "$out"
}

T=$B/test
bench() { echo "### dsm-bench $*" >> "$LOG"; "$WRAP" 1 "$B/tools/dsm-bench" "$@" >> "$LOG" 2>&1 || failed=$((failed + 1)); }
# ZeRO++ on the device: the CUDA quantization kernels against the host's, and
# a device-resident step with qwZ/qgZ within the host test's tolerance (at 2
# ranks on one GPU the mpi backend: qwZ runs, qgZ is refused clearly).
# GPU_CHECK_ONLY=zeropp runs these alone (a few minutes) and the kernels' benchmark.
zeropp_checks() {
  run test_quantize 0 300 "$T/unit/test_quantize"
  run test_quantize_device 0 300 "$T/unit/test_quantize_device"
  for np in 1 2; do run test_engine_quant_device $np 600 "$T/mpi/test_engine_quant_device"; done
}
if [ "${GPU_CHECK_ONLY:-}" = zeropp ]; then
  zeropp_checks
  bench quantize --device cuda
  echo "check-gpu (zeropp): $failed failed; the whole output is in $LOG"
  [ $failed = 0 ]
  exit
fi
run test_cuda_kernels 0 300 "$T/unit/test_cuda_kernels"
run test_space 0 300 "$T/unit/test_space"
zeropp_checks
for np in 1 2 4; do run test_cuda $np 300 "$T/mpi/test_cuda"; done
for np in 1 2 4; do run test_engine $np 600 "$T/mpi/test_engine"; done
for np in 1 2; do
  run test_engine_options $np 300 "$T/mpi/test_engine_options"
  run test_checkpoint $np 600 "$T/mpi/test_checkpoint"
  run test_engine_errors $np 300 "$T/mpi/test_engine_errors"
  run test_engine_nonfinite $np 300 "$T/mpi/test_engine_nonfinite"
  run test_comm $np 300 "$T/mpi/test_comm"
done
[ -x "$T/fortran/test_fortran_engine_options" ] &&
  run test_fortran_engine_options 1 300 "$T/fortran/test_fortran_engine_options"

if [ "${GPU_CHECK_SANITIZER:-1}" != 0 ] && command -v compute-sanitizer > /dev/null 2>&1; then
  run "memcheck test_cuda_kernels" 0 600 compute-sanitizer --tool memcheck --error-exitcode 1 \
    "$T/unit/test_cuda_kernels"
  run "memcheck test_quantize_device" 0 600 compute-sanitizer --tool memcheck --error-exitcode 1 \
    "$T/unit/test_quantize_device"
  run "memcheck test_engine" 1 900 compute-sanitizer --tool memcheck --report-api-errors no \
    --error-exitcode 1 "$T/mpi/test_engine"
fi

# The benchmarks: figures for doc/performance.md, in the log.
bench optimizer --device cuda
bench quantize --device cuda
bench zero --device cuda --stage all
bench zero --device host --stage all --no-torch
bench zero --device cuda --stage all --dtype bf16 --no-torch
echo "check-gpu: $failed failed; the whole output is in $LOG"
[ $failed = 0 ]
