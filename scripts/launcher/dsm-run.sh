#!/usr/bin/env bash
# dsm-run.sh LAUNCHER [LAUNCHER ARGS...] -- PROGRAM [ARGS...]
#
# Runs a libdsm job through its launcher (mpiexec, mpirun, srun) so that the
# job ends when a node is cut off, with the kernel's default TCP settings:
#
#  * DSM_WATCH_MPI=1: every rank runs with the MPI profiling-interface layer
#    preloaded (LD_PRELOAD=libdsm_mpiwatch.so, given to the program only,
#    not to the launcher), so that the program's own blocking MPI calls are
#    under libdsm's watchdog too: a rank blocked in its own MPI_Allreduce
#    because its node was cut off ends by itself after DSM_COMM_TIMEOUT
#    seconds with the watchdog's message (exit status 75).
#    DSM_MPIWATCH_LIB names the library when the loader does not find
#    libdsm_mpiwatch.so by itself (an absolute path).
#
#  * The launcher's grace: once a rank has printed the watchdog's message
#    ("dsm watchdog: "), the launcher gets DSM_LAUNCHER_GRACE seconds
#    [15] to return. Open MPI's mpiexec, after the abort, waits for the
#    daemon of the lost node as long as TCP retransmits to it
#    (net.ipv4.tcp_retries2 = 15: some 15 minutes by default), and srun
#    waits for the step's tasks on the lost node until Slurm declares the
#    node down (SlurmdTimeout); this script then ends the launcher
#    (SIGTERM, SIGKILL 5 s later) and exits 75 as the watchdog does. So the
#    job ends within DSM_COMM_TIMEOUT + about 1 (the watchdog's poll) +
#    DSM_LAUNCHER_GRACE + 5 seconds of the last message that got through.
#
# The launcher's output goes to this script's standard output (both streams,
# in order). Exit status: the launcher's, or 75 when this script ended it.
set -uo pipefail

usage() { echo "usage: dsm-run.sh LAUNCHER [ARGS...] -- PROGRAM [ARGS...]" >&2; exit 2; }
launcher=()
while [ "$#" -gt 0 ] && [ "$1" != -- ]; do launcher+=("$1"); shift; done
[ "$#" -gt 1 ] && [ "${#launcher[@]}" -gt 0 ] || usage
shift
grace=${DSM_LAUNCHER_GRACE:-15}
case $grace in ''|*[!0-9]*) echo "dsm-run.sh: DSM_LAUNCHER_GRACE is '$grace', expected a number of seconds" >&2; exit 2 ;; esac

program=("$@")
case ${DSM_WATCH_MPI:-0} in
  1|yes|on|true)
    lib=${DSM_MPIWATCH_LIB:-libdsm_mpiwatch.so}
    program=(env "LD_PRELOAD=$lib${LD_PRELOAD:+ $LD_PRELOAD}" "${program[@]}") ;;
  0|no|off|false|'') ;;
  *) echo "dsm-run.sh: DSM_WATCH_MPI is '$DSM_WATCH_MPI', expected 1 or 0" >&2; exit 2 ;;
esac

flag=$(mktemp "${TMPDIR:-/tmp}/dsm-run.XXXXXX") || exit 1
rm -f "$flag"
trap 'rm -f "$flag"' EXIT

# The launcher in the background; its output through a reader that marks
# the first watchdog message (a file that appears).
"${launcher[@]}" "${program[@]}" > >(
  while IFS= read -r line || [ -n "$line" ]; do
    printf '%s\n' "$line"
    case $line in *"dsm watchdog: "*) [ -e "$flag" ] || : >"$flag" ;; esac
  done
) 2>&1 &
job=$!
trap 'kill -TERM "$job" 2>/dev/null' TERM INT

ended_by_us=0
while kill -0 "$job" 2>/dev/null; do
  if [ -e "$flag" ]; then
    since=$(( $(date +%s) - $(stat -c %Y "$flag") ))
    if [ "$since" -ge "$grace" ]; then
      echo "dsm-run: the launcher has not ended ${since} s after the watchdog's message (DSM_LAUNCHER_GRACE=$grace): ending it" >&2
      kill -TERM "$job" 2>/dev/null
      for _ in 1 2 3 4 5; do kill -0 "$job" 2>/dev/null || break; sleep 1; done
      kill -KILL "$job" 2>/dev/null
      ended_by_us=1
      break
    fi
  fi
  sleep 1
done
rc=0
wait "$job" || rc=$?
if [ "$ended_by_us" = 1 ]; then exit 75; fi
exit "$rc"
