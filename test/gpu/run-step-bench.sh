#!/bin/bash
# The device step's figures for doc/performance.md (section "GPU"), on one
# CUDA device, in a few minutes: first the device tests that hold the step's
# bits (the multi-tensor kernels against the per-tensor ones, the engine's
# paths against each other), then dsm-bench zero --model on the GPT-2 124M
# (gpt2) and 1.5B (gpt2-xl) lists at stages 0-3, fp32 and bf16, each with the
# device bound (a streaming kernel moving the bytes the step must move, on
# the same GPU) and PyTorch's clip_grad_norm_ + AdamW(fused=True) measured in
# the same run; then, where ncu is installed, the kernels one step launches
# (124M, stage 1, bf16). Without a device it says so and exits 77.
#
# Environment: top_builddir (default .), STEP_BENCH_LOG (default
# test/gpu/step-bench.log), STEP_BENCH_STEPS (default 20), STEP_BENCH_MODELS
# (default "gpt2 gpt2-xl"), STEP_BENCH_TESTS=0 to leave out the tests,
# DSM_BENCH_PYTHON (a python3 with torch; default python3).
set -u
B=${top_builddir:-.}
LOG=${STEP_BENCH_LOG:-$B/test/gpu/step-bench.log}
STEPS=${STEP_BENCH_STEPS:-20}
MODELS=${STEP_BENCH_MODELS:-gpt2 gpt2-xl}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} DSM_BENCH_PYTHON=${DSM_BENCH_PYTHON:-python3}
WRAP="$B/test/mpirun-wrapper.sh"

if ! command -v nvidia-smi > /dev/null 2>&1 || ! nvidia-smi -L > /dev/null 2>&1; then
  echo "run-step-bench: no CUDA device here (nvidia-smi finds none): skipped"
  exit 77
fi
mkdir -p "$(dirname "$LOG")"
: > "$LOG"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | sed 's/^/GPU: /' | tee -a "$LOG"
failed=0
step() { # NAME COMMAND...: run, log, say PASS or FAIL
  local name=$1; shift
  echo "===== $name: $*" >> "$LOG"
  if "$@" >> "$LOG" 2>&1; then echo "$name: PASS"; else echo "$name: FAIL (see $LOG)"; failed=$((failed + 1)); fi
}
if [ "${STEP_BENCH_TESTS:-1}" != 0 ]; then
  step test_cuda_kernels timeout 300 "$B/test/unit/test_cuda_kernels"
  step "test_engine np1" env DSM_TEST_TIMEOUT=300 "$WRAP" 1 "$B/test/mpi/test_engine"
  step "test_cuda np1" env DSM_TEST_TIMEOUT=300 "$WRAP" 1 "$B/test/mpi/test_cuda"
fi

for model in $MODELS; do
  for dtype in fp32 bf16; do
    echo "### dsm-bench zero --model $model --device cuda --stage all --dtype $dtype --steps $STEPS" | tee -a "$LOG"
    if timeout 600 "$WRAP" 1 "$B/tools/dsm-bench" zero --model "$model" --device cuda --stage all --dtype "$dtype" \
        --steps "$STEPS" 2>&1 | tee -a "$LOG"; then :; else failed=$((failed + 1)); fi
  done
done

if command -v ncu > /dev/null 2>&1; then
  echo "### ncu: the kernels of dsm-bench zero --model gpt2 --stage 1 --dtype bf16 --steps 1 --no-torch" >> "$LOG"
  timeout 300 ncu --metrics gpu__time_duration.sum --print-summary per-kernel --launch-count 3000 \
    "$B/tools/dsm-bench" zero --model gpt2 --device cuda --stage 1 --dtype bf16 --steps 1 --no-torch >> "$LOG" 2>&1 ||
    echo "ncu failed (see $LOG)"
fi
echo "run-step-bench: $failed failed; the whole output is in $LOG"
[ $failed = 0 ]
