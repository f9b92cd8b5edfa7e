#!/usr/bin/env bash
# test/slurm/run-slurm-example.sh BUILDDIR SRCDIR
#
# Runs the batch scripts of examples/slurm/ for real, on the one-node Slurm
# cluster of test/slurm/slurm-cluster.sh (started here when it is not up,
# and stopped again at the end), with the examples built in BUILDDIR:
#
#  1. train_mlp.sbatch, 100 steps on 4 tasks: the job completes, the loss
#     falls, the output names 4 ranks, a checkpoint is written;
#  2. the same script again, 150 steps: the job resumes from the
#     checkpoint at step 100 and completes;
#  3. the requeue path: a longer job gets SIGUSR1 (what --signal=B:USR1@120
#     sends before the time limit, here by scancel --batch) once it has
#     written a checkpoint; it must stop, requeue itself, resume from the
#     checkpoint and complete;
#  4. when BUILDDIR/examples/fortran/train_mlp exists, 1 and 2 for
#     train_mlp_fortran.sbatch (skipped with a message otherwise);
#  5. the watchdog: one task of a running job stopped with SIGSTOP must end
#     the step within DSM_COMM_TIMEOUT + 10 s with status 75; dsm-job.sh then
#     requeues the job, which resumes at exactly the step `latest` named and
#     completes; one task killed with SIGKILL still ends the step at once,
#     and a job on 2 tasks (fewer) resumes at exactly latest's step;
#  6. the chaos run under Slurm: one job of train_mlp.sbatch on 4 tasks
#     (--requeue, a checkpoint every 10 steps, DSM_COMM_TIMEOUT=3) gets
#     DSM_SLURM_CHAOS_ROUNDS faults [2], each on a random task at a random
#     time after a new checkpoint, SIGKILL and SIGSTOP in turn (the first
#     drawn by DSM_SLURM_CHAOS_SEED, printed): after SIGSTOP the watchdog
#     ends the step with status 75 and dsm-job.sh requeues the job; after
#     SIGKILL the job fails and is requeued with `scontrol requeue`, as an
#     operator or a node-failure policy would. Each restart must resume at
#     exactly the step `latest` named when the job ended; the job then
#     completes, and its final checkpoint must equal an uninterrupted job's
#     to the same step bit for bit, every attribute included (dsm-ckpt diff
#     --all), when BUILDDIR/tools/dsm-ckpt exists. Prints per fault kind the
#     rounds and the seconds from the fault to the restart's resume. The job
#     trains DSM_SLURM_CHAOS_STEPS steps [400 a round and 200 more].
#
# 1 to 5 run by default, 6 as well with DSM_SLURM_CHAOS=1 (about 90 s more);
# DSM_SLURM_ONLY=watchdog runs 5 alone, DSM_SLURM_ONLY=chaos 6 alone.
# Every wait has a time limit (DSM_SLURM_JOB_TIMEOUT seconds per job,
# default 180); on a failure the job's output, scontrol's view of the job
# and the daemons' logs are printed. DSM_SLURM_KEEP=1 keeps the cluster
# running and the work directory.
#
# Exit status: 0 pass, 77 skip (Slurm cannot be installed or started here),
# 1 fail.
set -euo pipefail

if [ "$#" -ne 2 ]; then
  echo "usage: $0 BUILDDIR SRCDIR" >&2
  exit 1
fi
builddir=$(cd "$1" && pwd)
srcdir=$(cd "$2" && pwd)
cluster=$srcdir/test/slurm/slurm-cluster.sh
job_timeout=${DSM_SLURM_JOB_TIMEOUT:-180}
t0=$SECONDS

say() { echo "run-slurm-example: [$((SECONDS - t0))s] $*"; }

c_example=$builddir/examples/c/train_mlp
f_example=$builddir/examples/fortran/train_mlp
if [ ! -x "$c_example" ]; then
  say "FAIL: $c_example is not built (make first)"
  exit 1
fi

# The cluster: start it unless it is up, and then stop it at the end.
started=0
if ! bash "$cluster" status 2> /dev/null; then
  rc=0
  bash "$cluster" start > /dev/null || rc=$?
  if [ "$rc" -eq 77 ]; then
    say "SKIP: no Slurm cluster can be set up here (see above)"
    exit 77
  elif [ "$rc" -ne 0 ]; then
    say "FAIL: test/slurm/slurm-cluster.sh start failed ($rc)"
    exit 1
  fi
  started=1
fi
eval "$(bash "$cluster" env)"
export SLURM_CONF
slurm_dir=$(dirname "$(dirname "$SLURM_CONF")")

# The jobs inherit this environment (sbatch passes it on). Open MPI refuses
# root without these two; the CI container runs everything as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# 4 ranks on a runner with fewer cores: ranks waiting for messages should
# yield the core rather than spin (under srun Open MPI cannot tell that the
# node is oversubscribed; spinning makes the run several times slower).
export OMPI_MCA_mpi_yield_when_idle=1
# The environment must not choose for the scripts under test.
unset DSM_CONFIG DSM_CKPT_DIR DSM_STEPS DSM_SAVE_EVERY DSM_JOB_SH DSM_SRUN_MPI \
  DSM_SRUN_ARGS DSM_STOP_SIGNAL DSM_STOP_TIMEOUT DSM_MAX_REQUEUES DSM_EXAMPLE DSM_COMM_TIMEOUT DSM_NCCL_TIMEOUT

work=$(mktemp -d "${TMPDIR:-/tmp}/dsm-slurm-test.XXXXXX")
status=1
cleanup() {
  local id
  # Nothing of ours may stay in the queue.
  for id in "${submitted[@]}"; do scancel "$id" 2> /dev/null || true; done
  if [ "${DSM_SLURM_KEEP:-0}" = 1 ]; then
    say "kept: $work (and the cluster)"
    return
  fi
  if [ "$status" -eq 0 ]; then rm -rf "$work"; else say "the jobs' files are in $work"; fi
  if [ "$started" -eq 1 ]; then bash "$cluster" stop > /dev/null 2>&1 || true; fi
}
submitted=()
trap cleanup EXIT

# The state of job $1 as "STATE RESTARTS EXITCODE".
job_state() {
  scontrol show job -o "$1" 2> /dev/null |
    sed -n 's/.*JobState=\([A-Z_]*\) .*Restarts=\([0-9]*\) .*ExitCode=\([0-9:]*\) .*/\1 \2 \3/p'
}

# Print what there is to know about job $1 with output file $2.
diagnose() {
  local id=$1 out=$2
  echo "===== squeue"
  squeue || true
  echo "===== scontrol show job $id"
  scontrol show job "$id" || true
  echo "===== sinfo"
  sinfo -N -l || true
  echo "===== job output $out"
  cat "$out" 2> /dev/null || echo "(none)"
  local f
  for f in "$slurm_dir"/log/slurmctld.log "$slurm_dir"/log/slurmd.log "$slurm_dir"/log/jobcomp.log; do
    echo "===== last lines of $f"
    tail -n 40 "$f" 2> /dev/null || true
  done
}

fail() { # fail JOBID OUTPUT MESSAGE
  say "FAIL: $3"
  diagnose "$1" "$2"
  exit 1
}

# wait_job JOBID OUTPUT [RESTARTS]: until the job has ended (after at least
# RESTARTS requeues), within the time limit. Sets $state.
wait_job() {
  local id=$1 out=$2 restarts=${3:-0} deadline=$((SECONDS + job_timeout))
  state=""
  while [ "$SECONDS" -lt "$deadline" ]; do
    state=$(job_state "$id")
    case $state in
      COMPLETED* | FAILED* | CANCELLED* | TIMEOUT* | NODE_FAIL* | OUT_OF_MEMORY* | BOOT_FAIL* | DEADLINE*)
        local n
        n=$(echo "$state" | cut -d' ' -f2)
        [ "$n" -ge "$restarts" ] && return 0
        ;;
    esac
    sleep 1
  done
  fail "$id" "$out" "job $id did not end within ${job_timeout}s (state: ${state:-unknown})"
}

# wait_for JOBID OUTPUT DESCRIPTION COMMAND...: until COMMAND succeeds.
wait_for() {
  local id=$1 out=$2 what=$3 deadline=$((SECONDS + job_timeout))
  shift 3
  until "$@"; do
    [ "$SECONDS" -lt "$deadline" ] || fail "$id" "$out" "timed out after ${job_timeout}s waiting for $what"
    sleep 0.5
  done
}

# submit DIR SCRIPT [VAR=VALUE...]: sbatch SCRIPT from DIR with the
# variables set; sets $id to the job id.
submit() {
  local dir=$1 script=$2
  shift 2
  id=$(cd "$dir" && env "$@" sbatch --parsable "$script") || {
    say "FAIL: sbatch $script was refused"
    diagnose "" ""
    exit 1
  }
  id=${id%%;*}
  submitted+=("$id")
}

# check_ok JOBID OUTPUT: the job completed with status 0 and the loss fell.
check_ok() {
  local id=$1 out=$2 final initial
  case $state in
    "COMPLETED "*" 0:0") ;;
    *) fail "$id" "$out" "job $id ended as '$state', not COMPLETED with exit code 0:0" ;;
  esac
  grep -q '4 ranks (data parallel 4)' "$out" || fail "$id" "$out" "the output does not name 4 ranks"
  read -r final initial < <(sed -n 's/^final loss \([0-9.e+-]*\) (initial \([0-9.e+-]*\)).*/\1 \2/p' "$out" | tail -n1) ||
    fail "$id" "$out" "no 'final loss' line"
  awk -v f="$final" -v i="$initial" 'BEGIN { exit !(f > 0 && f < i) }' ||
    fail "$id" "$out" "the loss did not fall: final $final, initial $initial"
  say "job $id: $state; final loss $final (initial $initial)"
}

# check_ckpt JOBID OUTPUT DIR STEP: DIR/latest names the checkpoint of STEP.
check_ckpt() {
  local id=$1 out=$2 dir=$3 step=$4 tag
  tag=$(cat "$dir/latest" 2> /dev/null) || fail "$id" "$out" "no checkpoint: $dir/latest is missing"
  [ "$tag" = "global_step$step" ] || fail "$id" "$out" "$dir/latest names '$tag', not global_step$step"
  [ -s "$dir/$tag.h5" ] || fail "$id" "$out" "$dir/$tag.h5 is missing"
  say "job $id: checkpoint $dir/$tag.h5"
}

# first_and_resume NAME SCRIPT PROGRAM: tests 1 and 2 for one job script.
first_and_resume() {
  local name=$1 script=$2 program=$3 dir out ckpt
  dir=$work/$name
  mkdir -p "$dir"
  # The checkpoint directory is the script's default, under the submit
  # directory and named after the job.
  ckpt=$dir/checkpoints/$(sed -n 's/^#SBATCH --job-name=//p' "$script")

  say "$name: first job, 100 steps"
  submit "$dir" "$script" DSM_EXAMPLE="$program" DSM_STEPS=100
  out=$dir/$(sed -n 's/^#SBATCH --output=//p' "$script" | sed "s/%j/$id/")
  wait_job "$id" "$out"
  check_ok "$id" "$out"
  grep -q 'resumed from' "$out" && fail "$id" "$out" "the first job resumed from a checkpoint"
  check_ckpt "$id" "$out" "$ckpt" 100

  say "$name: second job, up to step 150"
  submit "$dir" "$script" DSM_EXAMPLE="$program" DSM_STEPS=150
  out=$dir/$(sed -n 's/^#SBATCH --output=//p' "$script" | sed "s/%j/$id/")
  wait_job "$id" "$out"
  check_ok "$id" "$out"
  grep -q "^resumed from $ckpt/latest at step 100\$" "$out" ||
    fail "$id" "$out" "the second job did not resume from $ckpt/latest at step 100"
  say "job $id: $(grep '^resumed from' "$out")"
  check_ckpt "$id" "$out" "$ckpt" 150
}

has_checkpoint() { [ -s "$1/latest" ]; }
is_running() { [ "$(job_state "$1" | cut -d' ' -f1)" = RUNNING ]; }

requeue_test() {
  local script=$srcdir/examples/slurm/train_mlp.sbatch dir=$work/requeue out ckpt steps=600
  mkdir -p "$dir"
  ckpt=$dir/ckpt
  say "requeue: a job of $steps steps, signalled once it has a checkpoint"
  submit "$dir" "$script" DSM_EXAMPLE="$c_example" DSM_STEPS=$steps DSM_SAVE_EVERY=50 DSM_CKPT_DIR="$ckpt"
  out=$dir/dsm-train-mlp-$id.out
  wait_for "$id" "$out" "the job's first checkpoint" has_checkpoint "$ckpt"
  is_running "$id" || fail "$id" "$out" "job $id is not running any more: too fast to signal"
  # What --signal=B:USR1@120 sends shortly before the time limit.
  scancel --batch --signal=USR1 "$id"
  say "requeue: job $id signalled at $(cat "$ckpt/latest")"
  wait_job "$id" "$out" 1
  check_ok "$id" "$out"
  grep -q 'requeueing job' "$out" || fail "$id" "$out" "the job did not requeue itself"
  grep -q '(restart 1)' "$out" || fail "$id" "$out" "the requeued job did not run again"
  grep -Eq "^resumed from $ckpt/latest at step [1-9][0-9]*\$" "$out" ||
    fail "$id" "$out" "the requeued job did not resume from $ckpt/latest"
  say "job $id: $(grep -E 'SIGUSR1|requeueing|\(restart 1\)' "$out" | sed 's/^dsm-job: //' | tr '\n' ';')"
  say "job $id: $(grep '^resumed from' "$out")"
  check_ckpt "$id" "$out" "$ckpt" "$steps"
}

# The task of job $1 whose checkpoint directory is $2 (the last found), once it runs.
task_pid() {
  pgrep -f "^[^ ]*train_mlp .*--checkpoint $2 " | tail -n 1
}

watchdog_test() {
  local script=$srcdir/examples/slurm/train_mlp.sbatch dir=$work/watchdog out ckpt steps=600 limit=5 pid tag start took
  mkdir -p "$dir"
  ckpt=$dir/ckpt
  say "watchdog: a job of $steps steps with DSM_COMM_TIMEOUT=$limit, one task stopped once it has a checkpoint"
  submit "$dir" "$script" DSM_EXAMPLE="$c_example" DSM_STEPS=$steps DSM_SAVE_EVERY=20 DSM_CKPT_DIR="$ckpt" \
    DSM_COMM_TIMEOUT=$limit
  out=$dir/dsm-train-mlp-$id.out
  wait_for "$id" "$out" "the job's first checkpoint" has_checkpoint "$ckpt"
  pid=$(task_pid "$id" "$ckpt")
  [ -n "$pid" ] || fail "$id" "$out" "no task of job $id found running"
  start=$SECONDS
  kill -STOP "$pid"
  wait_for "$id" "$out" "the end of the stopped step" grep -q 'the step ended with status 75' "$out"
  took=$((SECONDS - start))
  tag=$(sed -n "s|.*libdsm's watchdog.*last checkpoint: \(global_step[0-9]*\)\$|\1|p" "$out" | head -n 1)
  [ "$took" -le $((limit + 10)) ] || fail "$id" "$out" "the step took ${took}s to end after SIGSTOP (bound $((limit + 10))s)"
  grep -q "dsm watchdog: rank .* has waited [0-9]* s (DSM_COMM_TIMEOUT=$limit)" "$out" ||
    fail "$id" "$out" "no watchdog message"
  say "watchdog: job $id: the step ended ${took}s after SIGSTOP with status 75 at $tag"
  wait_job "$id" "$out" 1
  check_ok "$id" "$out"
  grep -q "^resumed from $ckpt/latest at step ${tag#global_step}\$" "$out" ||
    fail "$id" "$out" "the requeued job did not resume at ${tag#global_step} ($tag)"
  say "watchdog: job $id: requeued, $(grep '^resumed from' "$out" | tail -n 1)"

  say "watchdog: a task killed with SIGKILL still ends the step at once"
  submit "$dir" "$script" DSM_EXAMPLE="$c_example" DSM_STEPS=100000 DSM_SAVE_EVERY=20 DSM_CKPT_DIR="$ckpt" \
    DSM_COMM_TIMEOUT=$limit DSM_MAX_REQUEUES=0
  out=$dir/dsm-train-mlp-$id.out
  local before
  before=$(cat "$ckpt/latest")
  wait_for "$id" "$out" "a new checkpoint" sh -c "[ \"\$(cat '$ckpt/latest')\" != '$before' ]"
  pid=$(task_pid "$id" "$ckpt")
  [ -n "$pid" ] || fail "$id" "$out" "no task of job $id found running"
  start=$SECONDS
  kill -KILL "$pid"
  wait_job "$id" "$out"
  took=$((SECONDS - start))
  [ "$took" -le 5 ] || fail "$id" "$out" "the step took ${took}s to end after SIGKILL"
  grep -q 'requeueing' "$out" && fail "$id" "$out" "a job killed outright requeued itself"
  tag=$(cat "$ckpt/latest")
  say "watchdog: job $id: ended ${took}s after SIGKILL ($state) at $tag"
  say "watchdog: a job on 2 tasks resumes at ${tag#global_step}"
  id=$(cd "$dir" && env DSM_EXAMPLE="$c_example" DSM_STEPS=$((${tag#global_step} + 20)) DSM_SAVE_EVERY=20 \
    DSM_CKPT_DIR="$ckpt" sbatch --parsable --ntasks=2 "$script") || fail "" "" "sbatch --ntasks=2 was refused"
  id=${id%%;*}
  submitted+=("$id")
  out=$dir/dsm-train-mlp-$id.out
  wait_job "$id" "$out"
  grep -q "^resumed from $ckpt/latest at step ${tag#global_step}\$" "$out" ||
    fail "$id" "$out" "the job on 2 tasks did not resume at ${tag#global_step} ($tag)"
  say "watchdog: job $id (2 tasks): $(grep '^resumed from' "$out")"
}

chaos_test() {
  local script=$srcdir/examples/slurm/train_mlp.sbatch dir=$work/chaos ckpt ref out
  local every=10 limit=3 rounds=${DSM_SLURM_CHAOS_ROUNDS:-2} seed=${DSM_SLURM_CHAOS_SEED:-$((RANDOM))}
  # Each round lets the job go on up to a new checkpoint and 0.9 s more
  # (up to about 250 steps of this job on an idle core): 400 steps a round
  # and 200 to spare keep the job running until the last fault.
  local steps=${DSM_SLURM_CHAOS_STEPS:-$((rounds * 400 + 200))}
  local round kind before pids victim tag resumed start took restarts=0 chaos_t0=$SECONDS ref_id
  local -A n_kind sum_kind max_kind
  RANDOM=$seed
  mkdir -p "$dir"
  ckpt=$dir/ckpt
  ref=$dir/ref
  local kinds=(sigkill sigstop) first=$((RANDOM % 2))
  say "chaos: $rounds faults on a job of $steps steps (4 tasks, a checkpoint every $every steps, DSM_COMM_TIMEOUT=$limit, seed $seed)"
  submit "$dir" "$script" DSM_EXAMPLE="$c_example" DSM_STEPS=$steps DSM_SAVE_EVERY=$every DSM_CKPT_DIR="$ckpt" \
    DSM_COMM_TIMEOUT=$limit
  out=$dir/dsm-train-mlp-$id.out
  for ((round = 1; round <= rounds; round++)); do
    kind=${kinds[(first + round) % 2]}
    before=$(cat "$ckpt/latest" 2> /dev/null || true)
    # A new checkpoint of this run, then the fault 0 to 0.9 s later.
    wait_for "$id" "$out" "a new checkpoint (round $round)" sh -c "[ -s '$ckpt/latest' ] && [ \"\$(cat '$ckpt/latest')\" != '$before' ]"
    sleep "0.$((RANDOM % 10))"
    read -r -a pids < <(pgrep -f "^[^ ]*train_mlp .*--checkpoint $ckpt " | tr '\n' ' ') || true
    [ "${#pids[@]}" -eq 4 ] || fail "$id" "$out" "round $round: found ${#pids[@]} tasks (${pids[*]}), expected 4: the job ended too soon (raise DSM_SLURM_CHAOS_STEPS)"
    victim=${pids[RANDOM % 4]}
    start=$SECONDS
    if [ "$kind" = sigkill ]; then
      kill -KILL "$victim"
      wait_job "$id" "$out" "$restarts"
      case $state in FAILED*) ;; *) fail "$id" "$out" "round $round: after SIGKILL the job ended as '$state', not FAILED" ;; esac
      tag=$(cat "$ckpt/latest")
      scontrol requeue "$id" || fail "$id" "$out" "round $round: scontrol requeue $id was refused"
    else
      kill -STOP "$victim"
      wait_for "$id" "$out" "the requeue after SIGSTOP (round $round)" \
        sh -c "[ \"\$(grep -c '^dsm-job: .*requeueing job' '$out')\" -ge $((restarts + 1 - ${n_kind[sigkill]:-0})) ]"
      tag=$(sed -n "s|.*libdsm's watchdog.*last checkpoint: \(global_step[0-9]*\)\$|\1|p" "$out" | tail -n 1)
    fi
    restarts=$((restarts + 1))
    # The restart resumes at exactly latest's step.
    wait_for "$id" "$out" "the restart's resume (round $round)" sh -c "[ \"\$(grep -c '^resumed from' '$out')\" -ge $round ]"
    resumed=$(grep '^resumed from' "$out" | sed -n "${round}p")
    [ "$resumed" = "resumed from $ckpt/latest at step ${tag#global_step}" ] ||
      fail "$id" "$out" "round $round ($kind): the restart did not resume at ${tag#global_step} ($tag): '$resumed'"
    took=$((SECONDS - start))
    n_kind[$kind]=$((${n_kind[$kind]:-0} + 1))
    sum_kind[$kind]=$((${sum_kind[$kind]:-0} + took))
    [ "$took" -gt "${max_kind[$kind]:-0}" ] && max_kind[$kind]=$took
    say "chaos: round $round: $kind of task $victim at $tag; resumed at step ${tag#global_step} ${took}s later (restart $restarts)"
  done
  wait_job "$id" "$out" "$restarts"
  check_ok "$id" "$out"
  check_ckpt "$id" "$out" "$ckpt" "$steps"
  for kind in "${kinds[@]}"; do
    [ "${n_kind[$kind]:-0}" -gt 0 ] &&
      say "chaos: $kind: ${n_kind[$kind]} rounds, fault to resume mean $((sum_kind[$kind] / n_kind[$kind])) s, max ${max_kind[$kind]} s"
  done
  local dsm_ckpt=$builddir/tools/dsm-ckpt
  if [ ! -x "$dsm_ckpt" ]; then
    say "chaos: PASS without the bit-for-bit comparison ($dsm_ckpt is not built: HDF5?) in $((SECONDS - chaos_t0)) s"
    return
  fi
  say "chaos: the uninterrupted job to step $steps"
  submit "$dir" "$script" DSM_EXAMPLE="$c_example" DSM_STEPS=$steps DSM_SAVE_EVERY=$steps DSM_CKPT_DIR="$ref"
  ref_id=$id
  wait_job "$ref_id" "$dir/dsm-train-mlp-$ref_id.out"
  check_ok "$ref_id" "$dir/dsm-train-mlp-$ref_id.out"
  "$dsm_ckpt" diff "$ckpt/global_step$steps.h5" "$ref/global_step$steps.h5" --all > "$dir/diff.txt" 2>&1 ||
    fail "$ref_id" "$dir/diff.txt" "the checkpoint after the faults differs from the uninterrupted job's: $(head -n 20 "$dir/diff.txt")"
  say "chaos: PASS: step $steps after $rounds faults equals the uninterrupted job's bit for bit ($(tail -n 1 "$dir/diff.txt")), $((SECONDS - chaos_t0)) s"
}

say "cluster: $(sinfo -h -N -o '%N %t cpus=%c') (SLURM_CONF=$SLURM_CONF)"
say "srun MPI plugins: $(srun --mpi=list 2>&1 | sed -n 's/^[[:space:]]\+//p' | tr '\n' ' ')"

if [ -z "${DSM_SLURM_ONLY:-}" ]; then
  first_and_resume c "$srcdir/examples/slurm/train_mlp.sbatch" "$c_example"
  requeue_test
  if [ -x "$f_example" ]; then
    first_and_resume fortran "$srcdir/examples/slurm/train_mlp_fortran.sbatch" "$f_example"
  else
    say "fortran: skipped, $f_example is not built"
  fi
fi
case ${DSM_SLURM_ONLY:-} in
  "")
    watchdog_test
    if [ "${DSM_SLURM_CHAOS:-0}" = 1 ]; then chaos_test; fi ;;
  watchdog) watchdog_test ;;
  chaos) chaos_test ;;
  *) say "FAIL: DSM_SLURM_ONLY='$DSM_SLURM_ONLY' is neither watchdog nor chaos"; exit 1 ;;
esac

say "PASS"
status=0
