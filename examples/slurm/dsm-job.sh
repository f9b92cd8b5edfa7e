#!/usr/bin/env bash
# dsm-job.sh PROGRAM [ARGS...]: the body of a libdsm training job under
# Slurm, shared by train_mlp.sbatch and train_mlp_fortran.sbatch (they
# `exec` it, so that it is the batch shell Slurm signals).
#
# It launches
#
#   srun --mpi=pmix PROGRAM DSM_CONFIG --steps DSM_STEPS \
#        --checkpoint DSM_CKPT_DIR --save-every DSM_SAVE_EVERY [ARGS...]
#
# on every task of the job, and makes the job requeue-friendly:
#
#  * The program resumes by itself: when DSM_CKPT_DIR/latest exists it
#    loads that checkpoint (on any number of ranks) and trains on from its
#    step. So any later job on the same directory, requeued or submitted
#    anew, continues where the last checkpoint left off.
#  * The job script asks Slurm for SIGUSR1 shortly before the time limit
#    (#SBATCH --signal=B:USR1@120). On it this script stops the training
#    step (DSM_STOP_SIGNAL to every task, with scancel --signal), waits for
#    it to end and puts the job back in the queue with `scontrol requeue`.
#    The requeued job runs this script again, which resumes from the last
#    checkpoint.
#  * DSM_STOP_SIGNAL is exported to the tasks: libdsm's engines catch that
#    signal (the DSM_STOP_SIGNAL parameter), dsm_engine_stop_requested()
#    reports it on every rank at the next step boundary, and the examples
#    then save a checkpoint of that step and exit with status 3. Nothing
#    trained is lost.
#
#  * A step that a stalled task or a dropped node would hang ends instead:
#    libdsm's watchdog (DSM_COMM_TIMEOUT seconds in one wait) prints which
#    wait and which ranks, and ends the step with MPI_Abort and exit status
#    75. This script then requeues the job as after the time-limit signal
#    (Slurm may place it on other nodes, or on fewer with a smaller
#    --nodes range), and the requeued job resumes from the last checkpoint.
#
# The checkpoints are written every DSM_SAVE_EVERY steps and committed
# atomically (a temporary file renamed, then `latest` replaced), so a step
# killed in the middle of a save (a program that does not stop within
# DSM_STOP_TIMEOUT) leaves the previous checkpoint intact: at most
# DSM_SAVE_EVERY steps of work are lost then.
#
# Environment (defaults in brackets):
#   DSM_CONFIG        the DeepSpeed JSON configuration (required)
#   DSM_STEPS         optimizer steps to train up to, in all runs [200]
#   DSM_CKPT_DIR      checkpoint directory
#                     [$SLURM_SUBMIT_DIR/checkpoints/$SLURM_JOB_NAME]
#   DSM_SAVE_EVERY    steps between checkpoints [50]
#   DSM_SRUN_MPI      srun's --mpi plugin [pmix]
#   DSM_SRUN_ARGS     more srun options, split at blanks [none]
#   DSM_LAUNCHER      a launcher in place of srun and the two above, split
#                     at blanks, e.g. "mpirun" where srun has no PMIx [none]
#   DSM_STOP_SIGNAL   the signal that stops the step before a requeue, caught
#                     by libdsm in every task [USR1]
#   DSM_STOP_TIMEOUT  seconds the step gets to stop before SIGKILL [60];
#                     keep it well under the --signal lead time
#   DSM_MAX_REQUEUES  the job stops requeueing itself after this many
#                     restarts, so a job that cannot progress stops [10]
#   DSM_WATCH_MPI     1: the program's own MPI calls under the watchdog and
#                     the launcher ended soon after it fired (dsm-run.sh) [0]
#   DSM_LAUNCHER_GRACE  with DSM_WATCH_MPI=1, seconds the launcher gets to
#                     return after the watchdog's message [15]
#
# Exit status: the program's (0 trained, 2 the loss did not fall, 1 error,
# 3 stopped on DSM_STOP_SIGNAL), 75 when the watchdog ended the step and the
# job may not requeue again, or 0 after a requeue.
set -euo pipefail

if [ "$#" -lt 1 ]; then
  echo "usage: dsm-job.sh PROGRAM [ARGS...] (in a Slurm batch job)" >&2
  exit 1
fi
if [ -z "${SLURM_JOB_ID:-}" ]; then
  echo "dsm-job.sh: not in a Slurm job; submit the job script with sbatch" >&2
  exit 1
fi

# Set first: Slurm may send the signal at any time, and a bash without a
# handler would die of it.
interrupted=0
# shellcheck disable=SC2317 # called by the trap
on_signal() { interrupted=1; }
trap on_signal USR1

program=$1
shift
config=${DSM_CONFIG:?DSM_CONFIG names the configuration}
steps=${DSM_STEPS:-200}
ckpt_dir=${DSM_CKPT_DIR:-${SLURM_SUBMIT_DIR:-$PWD}/checkpoints/${SLURM_JOB_NAME:-dsm}}
save_every=${DSM_SAVE_EVERY:-50}
mpi=${DSM_SRUN_MPI:-pmix}
stop_signal=${DSM_STOP_SIGNAL:-USR1}
# The tasks' engines catch it (libdsm's DSM_STOP_SIGNAL parameter).
export DSM_STOP_SIGNAL=$stop_signal
stop_timeout=${DSM_STOP_TIMEOUT:-60}
max_requeues=${DSM_MAX_REQUEUES:-10}
restarts=${SLURM_RESTART_COUNT:-0}
if [ -n "${DSM_LAUNCHER:-}" ]; then
  read -r -a launcher <<< "$DSM_LAUNCHER"
else
  read -r -a srun_args <<< "${DSM_SRUN_ARGS:-}"
  launcher=(srun --mpi="$mpi" "${srun_args[@]}")
fi

say() { echo "dsm-job: $(date '+%F %T'): $*"; }

# The size of the job is the size of the mesh: srun starts one rank per
# task (SLURM_NTASKS in all, over SLURM_JOB_NUM_NODES nodes), the program
# builds its device mesh over MPI_COMM_WORLD, and the configuration's batch
# arithmetic (train_batch_size = micro batch x accumulation x data parallel)
# follows from that world size.
say "job ${SLURM_JOB_ID} (restart ${restarts}): ${SLURM_NTASKS:-?} tasks on ${SLURM_JOB_NUM_NODES:-?} node(s) [${SLURM_JOB_NODELIST:-?}]"
mkdir -p "$ckpt_dir"
if [ -e "$ckpt_dir/latest" ]; then
  say "resuming from $ckpt_dir/latest ($(cat "$ckpt_dir/latest"))"
else
  say "no checkpoint in $ckpt_dir yet: training from step 0"
fi

cmd=("${launcher[@]}" "$program" "$config"
  --steps "$steps" --checkpoint "$ckpt_dir" --save-every "$save_every" "$@")
# DSM_WATCH_MPI=1: the program's own blocking MPI calls under libdsm's
# watchdog too (the MPI profiling layer libdsm_mpiwatch.so preloaded in every
# task), and the launcher ended DSM_LAUNCHER_GRACE seconds after the
# watchdog's message if it has not returned (a lost node): through
# dsm-run.sh (scripts/launcher/dsm-run.sh), beside this script or on PATH.
case ${DSM_WATCH_MPI:-0} in
  1|yes|on|true)
    runner=$(dirname "$0")/dsm-run.sh
    [ -x "$runner" ] || runner=$(command -v dsm-run.sh || true)
    if [ -z "$runner" ]; then
      echo "dsm-job.sh: DSM_WATCH_MPI=1 needs dsm-run.sh (scripts/launcher/dsm-run.sh) beside this script or on PATH" >&2
      exit 1
    fi
    cmd=("$runner" "${launcher[@]}" -- "$program" "$config"
      --steps "$steps" --checkpoint "$ckpt_dir" --save-every "$save_every" "$@") ;;
esac
say "${cmd[*]}"

# In the background, so that the shell runs its signal handler at once
# rather than when the step ends.
"${cmd[@]}" &
step=$!

forwarded=0
rc=0
while :; do
  if [ "$interrupted" -eq 1 ]; then
    interrupted=0
    # The signal came: stop the step if it still runs.
    if [ "$forwarded" -eq 0 ] && kill -0 "$step" 2> /dev/null; then
      forwarded=1
      say "SIGUSR1 (the time limit is near): stopping the step with SIG${stop_signal}"
      # scancel --signal reaches every task of the job's steps and not this
      # shell. (srun itself, given SIGTERM, would kill the step outright.)
      scancel --signal="$stop_signal" "$SLURM_JOB_ID" || kill -s "$stop_signal" "$step" 2> /dev/null || true
      waited=0
      while kill -0 "$step" 2> /dev/null && [ "$waited" -lt "$stop_timeout" ]; do
        sleep 1
        waited=$((waited + 1))
      done
      if kill -0 "$step" 2> /dev/null; then
        say "the step did not stop in ${stop_timeout}s: SIGKILL"
        kill -s KILL "$step" 2> /dev/null || true
      fi
    fi
  fi
  rc=0
  wait "$step" || rc=$?
  # `wait` returns early when the signal comes; then go round again.
  if [ "$interrupted" -eq 0 ]; then break; fi
done

# libdsm's watchdog ended the step: a stalled task or a lost node
# (DSM_COMM_TIMEOUT, the status documented in doc/environment.md).
watchdog_status=75
if [ "$forwarded" -eq 0 ] && [ "$rc" -eq "$watchdog_status" ]; then
  say "the step ended with status $rc: libdsm's watchdog found a rank that stopped answering (see the message above); last checkpoint: $(cat "$ckpt_dir/latest" 2> /dev/null || echo none)"
  if [ "$restarts" -ge "$max_requeues" ]; then
    say "restarted ${restarts} times already (DSM_MAX_REQUEUES=${max_requeues}): not requeueing"
    exit "$rc"
  fi
  say "requeueing job ${SLURM_JOB_ID}"
  scontrol requeue "$SLURM_JOB_ID"
  exit 0
fi

if [ "$forwarded" -eq 0 ]; then
  # No signal, or it came after the step had ended: the job is done.
  say "the step ended with status $rc"
  exit "$rc"
fi

say "the step stopped (status $rc); last checkpoint: $(cat "$ckpt_dir/latest" 2> /dev/null || echo none)"
if [ "$restarts" -ge "$max_requeues" ]; then
  say "restarted ${restarts} times already (DSM_MAX_REQUEUES=${max_requeues}): not requeueing"
  exit 1
fi
# The job goes back to the queue, keeps its id, and runs this script anew
# (SLURM_RESTART_COUNT one higher); Slurm ends this run right after.
say "requeueing job ${SLURM_JOB_ID}"
scontrol requeue "$SLURM_JOB_ID"
exit 0
