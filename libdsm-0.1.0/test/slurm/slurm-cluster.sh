#!/usr/bin/env bash
# A one-node Slurm cluster on this host, for testing the batch scripts in
# examples/slurm/ for real (CI runs it in a Debian container as root).
#
#   test/slurm/slurm-cluster.sh [start]   install if needed, configure, start
#   test/slurm/slurm-cluster.sh stop      cancel its jobs, stop the daemons
#                                         this script started
#   test/slurm/slurm-cluster.sh status    exit 0 when the cluster is up
#   test/slurm/slurm-cluster.sh env       print the `export SLURM_CONF=...` line
#
# `start` installs Debian's slurm-wlm, munge and libpmix-dev when they are
# missing (one `apt-get update` first), creates a munge key when there is
# none, starts munged, writes slurm.conf and cgroup.conf under the state
# directory, starts slurmctld and slurmd and waits until `sinfo` shows the
# node idle. It is idempotent: daemons that already answer are left alone.
# Systemd is not assumed (containers seldom run it): the daemons are started
# directly and found again through their pid files.
#
# Nothing outside the state directory is configured: the clients (sinfo,
# sbatch, srun, ...) find this cluster through SLURM_CONF, which `env` prints:
#
#   eval "$(test/slurm/slurm-cluster.sh env)"
#
# Environment (defaults in brackets):
#   DSM_SLURM_DIR        state, spool, logs and configuration [/var/tmp/dsm-slurm]
#   DSM_SLURM_MIN_CPUS   CPUs the node is declared with at least [4]
#   DSM_SLURM_CTLD_PORT  slurmctld's port [6817]
#   DSM_SLURMD_PORT      slurmd's port [6818]
#   DSM_SLURM_TIMEOUT    seconds to wait for the node to become idle [60]
#
# Exit status: 0 on success, 77 when Slurm cannot be installed or started at
# all here (the reason on stderr), 1 on any other error.
set -euo pipefail

dir=${DSM_SLURM_DIR:-/var/tmp/dsm-slurm}
min_cpus=${DSM_SLURM_MIN_CPUS:-4}
ctld_port=${DSM_SLURM_CTLD_PORT:-6817}
slurmd_port=${DSM_SLURMD_PORT:-6818}
timeout=${DSM_SLURM_TIMEOUT:-60}
conf=$dir/etc/slurm.conf
munge_socket=/run/munge/munge.socket.2

log() { echo "slurm-cluster: $*" >&2; }
skip() {
  log "SKIP: $*"
  exit 77
}
die() {
  log "error: $*"
  exit 1
}

# The pid in FILE when that process is alive.
live_pid() {
  local pid
  [ -r "$1" ] || return 1
  pid=$(cat "$1" 2>/dev/null) || return 1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

print_logs() {
  local f
  for f in "$dir"/log/slurmctld.log "$dir"/log/slurmd.log /var/log/munge/munged.log; do
    [ -r "$f" ] || continue
    echo "----- last lines of $f" >&2
    tail -n 30 "$f" >&2
  done
}

# Is the Debian package $1 installed?
installed() { dpkg-query -W -f='${Status}' "$1" 2> /dev/null | grep -q 'ok installed'; }

install_packages() {
  local missing=() slurm=1
  if ! command -v slurmctld > /dev/null || ! command -v slurmd > /dev/null || ! command -v sbatch > /dev/null; then
    slurm=0
    missing+=(slurm-wlm)
  fi
  command -v munged > /dev/null || missing+=(munge)
  # Debian's Slurm PMIx plugin (mpi_pmix_v4.so in slurm-wlm-basic-plugins)
  # dlopen()s the unversioned libpmix.so of the PMIx Open MPI is built with,
  # and only libpmix-dev ships that name. Without it `srun --mpi=pmix` fails
  # with "Couldn't load specified plugin name for mpi/pmix".
  if command -v dpkg-query > /dev/null && { [ "$slurm" -eq 0 ] || installed slurm-wlm-basic-plugins; } &&
    ! installed libpmix-dev; then
    missing+=(libpmix-dev)
  fi
  [ "${#missing[@]}" -gt 0 ] || return 0
  if [ "$slurm" -eq 1 ] && [ "${missing[*]}" = libpmix-dev ]; then
    # Slurm is there: go on without PMIx if libpmix-dev cannot be had.
    if [ "$(id -u)" -ne 0 ] || ! command -v apt-get > /dev/null; then
      log "warning: libpmix-dev is missing: srun --mpi=pmix will not work"
      return 0
    fi
  fi
  command -v apt-get > /dev/null || skip "no apt-get to install ${missing[*]}"
  [ "$(id -u)" -eq 0 ] || skip "installing ${missing[*]} needs root"
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  local aptlog=${TMPDIR:-/tmp}/slurm-cluster-apt.log
  # One update first: the package lists of a fresh container are empty.
  apt-get update -q > "$aptlog" 2>&1 || {
    tail -n 20 "$aptlog" >&2
    skip "apt-get update failed"
  }
  apt-get install -y -q --no-install-recommends "${missing[@]}" >> "$aptlog" 2>&1 || {
    tail -n 20 "$aptlog" >&2
    skip "apt-get install ${missing[*]} failed"
  }
}

start_munge() {
  if [ -S "$munge_socket" ] && munge -n < /dev/null 2> /dev/null | unmunge > /dev/null 2>&1; then
    return 0
  fi
  if [ ! -s /etc/munge/munge.key ]; then
    log "creating /etc/munge/munge.key"
    mkdir -p /etc/munge
    if command -v mungekey > /dev/null; then
      mungekey --create --keyfile=/etc/munge/munge.key
    else
      dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 2> /dev/null
    fi
    chown munge:munge /etc/munge/munge.key
    chmod 0400 /etc/munge/munge.key
  fi
  # munged refuses to run as root; the munge user owns its directories.
  mkdir -p /run/munge /var/lib/munge /var/log/munge
  chown munge:munge /run/munge /var/lib/munge /var/log/munge
  chmod 0755 /run/munge
  log "starting munged"
  runuser -u munge -- munged || die "munged did not start"
  mkdir -p "$dir"
  touch "$dir/munged.started"
  local i
  for i in $(seq 1 50); do
    munge -n < /dev/null 2> /dev/null | unmunge > /dev/null 2>&1 && return 0
    sleep 0.2
  done
  print_logs
  die "munged does not answer on $munge_socket"
}

# Does this Slurm have a PMIx plugin that loads? (`srun --mpi=list` needs a
# configuration, so look at the files.)
have_pmix() {
  local plugin
  if command -v dpkg-query > /dev/null && installed slurm-wlm-basic-plugins; then
    plugin=$(dpkg -L slurm-wlm-basic-plugins | grep '/mpi_pmix\.so$' | head -n1)
    [ -n "$plugin" ] && installed libpmix-dev
  else
    for plugin in /usr/lib64/slurm /usr/lib/slurm /usr/local/lib/slurm /usr/local/lib64/slurm; do
      [ -e "$plugin/mpi_pmix.so" ] && return 0
    done
    return 1
  fi
}

write_config() {
  local host cpus hw_cpus mem hw mpi
  host=$(hostname -s)
  hw=$(slurmd -C | head -n1)
  cpus=$(sed -n 's/.* CPUs=\([0-9]*\).*/\1/p' <<< "$hw")
  mem=$(sed -n 's/.* RealMemory=\([0-9]*\).*/\1/p' <<< "$hw")
  if [ -z "$cpus" ] || [ -z "$mem" ]; then
    die "cannot read CPUs and RealMemory from 'slurmd -C': $hw"
  fi
  hw_cpus=$cpus
  [ "$cpus" -ge "$min_cpus" ] || cpus=$min_cpus
  if have_pmix; then mpi=pmix; else mpi=pmi2; fi
  mkdir -p "$dir"/etc "$dir"/state "$dir"/spool "$dir"/log
  cat > "$conf.new" << EOF
# A one-node cluster for testing, written by test/slurm/slurm-cluster.sh.
ClusterName=dsm
# One host: it is controller and compute node. The address is the loopback,
# so that no name service is needed.
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
# Run as root: the container has no other user to run the jobs, and root
# can start the daemons without systemd.
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# A requeued job may start again only after the job credential lifetime
# (cred_expire, 120 s by default); 10 s keeps the requeue test short.
AuthInfo=cred_expire=10
# No mail on this host.
MailProg=/bin/true
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups: a container rarely lets slurmd create its own. Processes are
# tracked through their parent ids, tasks are not bound to cores.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
# No slurmdbd (sacct does not work); completed jobs go to a text file and
# stay visible to 'scontrol show job' for MinJobAge seconds.
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$dir/log/jobcomp.log
MinJobAge=3600
# CPUs are the consumable resource (memory is not tracked).
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# srun's default MPI plugin: PMIx when Slurm's plugin can load (Open MPI is
# built with PMIx), PMI-2 otherwise (for MPICH and Intel MPI; Debian's Open
# MPI has no PMI-2 client).
MpiDefault=$mpi
# A node that went down comes back by itself once slurmd registers again.
ReturnToService=2
SchedulerType=sched/backfill
# Look at pending jobs every few seconds rather than every 30 to 60: a
# requeued job starts again as soon as it may.
SchedulerParameters=sched_interval=5,bf_interval=5
# Quick turnaround: a job's processes get SIGKILL 10 s after SIGTERM.
KillWait=10
InactiveLimit=0
SlurmdTimeout=120
# The node is declared with at least $min_cpus CPUs (this host has $hw_cpus), so that
# a 4-task job fits on a small runner; its tasks then share the cores. A
# partition's OverSubscribe only lets *jobs* share CPUs, and
# sbatch --overcommit would have to be in every job, so declaring the CPUs
# is the one setting that lets the unchanged job scripts run.
# config_overrides makes slurmd accept a declaration larger than the
# hardware it detects.
SlurmdParameters=config_overrides
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
  mv "$conf.new" "$conf"
  # Read only by the cgroup plugins, which this configuration does not use;
  # written so that nothing falls back to a system-wide file.
  cat > "$dir/etc/cgroup.conf" << EOF
# Written by test/slurm/slurm-cluster.sh; unused (no cgroup plugins).
CgroupPlugin=autodetect
CgroupAutomount=no
ConstrainCores=no
ConstrainRAMSpace=no
ConstrainDevices=no
EOF
}

wait_idle() {
  local i state=""
  for i in $(seq 1 "$timeout"); do
    state=$(sinfo -h -N -o '%t' 2> /dev/null | head -n1) || state=""
    case $state in
      idle* | mix* | alloc*) return 0 ;;
      drain* | down*)
        # A node that registered with a bad configuration: say why.
        if [ "$i" -gt 5 ]; then
          scontrol show node >&2 || true
          print_logs
          die "the node is $state"
        fi
        ;;
    esac
    sleep 1
  done
  sinfo >&2 || true
  scontrol show node >&2 || true
  print_logs
  die "the node is not idle after ${timeout}s (state '${state}')"
}

start() {
  install_packages
  command -v slurmctld > /dev/null || skip "slurmctld is not installed"
  export SLURM_CONF=$conf
  start_munge
  local ctld slurmd
  ctld=$(live_pid "$dir/slurmctld.pid") || ctld=""
  slurmd=$(live_pid "$dir/slurmd.pid") || slurmd=""
  if [ -z "$ctld" ] || [ -z "$slurmd" ] || [ ! -e "$conf" ]; then
    # Write the configuration only while nothing runs on it.
    [ -n "$ctld" ] || [ -n "$slurmd" ] || write_config
  fi
  if [ -z "$ctld" ]; then
    log "starting slurmctld (configuration $conf)"
    # -c: a clean start, without the jobs of an earlier run of this cluster.
    slurmctld -c -f "$conf" || {
      print_logs
      skip "slurmctld does not start"
    }
  fi
  local i
  for i in $(seq 1 "$timeout"); do
    scontrol ping 2> /dev/null | grep -q 'is UP' && break
    [ "$i" -lt "$timeout" ] || {
      print_logs
      skip "slurmctld does not answer"
    }
    sleep 1
  done
  if [ -z "$slurmd" ]; then
    log "starting slurmd"
    slurmd -f "$conf" || {
      print_logs
      skip "slurmd does not start"
    }
  fi
  wait_idle
  log "up: $(sinfo -h -N -o '%N %t cpus=%c mem=%m')"
  echo "export SLURM_CONF=$conf"
}

stop() {
  export SLURM_CONF=$conf
  local name pid i jobs
  # The jobs first: their processes would outlive slurmd.
  if live_pid "$dir/slurmctld.pid" > /dev/null; then
    jobs=$(squeue -h -o %A 2> /dev/null | tr '\n' ' ') || jobs=""
    if [ -n "${jobs// /}" ]; then
      log "cancelling jobs $jobs"
      # shellcheck disable=SC2086 # a list of job ids
      scancel $jobs 2> /dev/null || true
      for i in $(seq 1 30); do
        [ -z "$(squeue -h -o %A 2> /dev/null)" ] && break
        sleep 1
      done
    fi
  fi
  for name in slurmd slurmctld; do
    pid=$(live_pid "$dir/$name.pid") || continue
    log "stopping $name ($pid)"
    kill "$pid" 2> /dev/null || true
    for i in $(seq 1 50); do
      kill -0 "$pid" 2> /dev/null || break
      sleep 0.2
    done
    if kill -0 "$pid" 2> /dev/null; then kill -9 "$pid" 2> /dev/null || true; fi
  done
  # munged only when this script started it (the munge user runs it then;
  # its pid file is the default one).
  if [ -e "$dir/munged.started" ] && pid=$(live_pid /run/munge/munged.pid); then
    log "stopping munged ($pid)"
    kill "$pid" 2> /dev/null || true
  fi
  rm -f "$dir/munged.started"
}

# Exit 0 when this cluster's daemons run and the controller answers.
status() {
  export SLURM_CONF=$conf
  live_pid "$dir/slurmctld.pid" > /dev/null && live_pid "$dir/slurmd.pid" > /dev/null &&
    scontrol ping 2> /dev/null | grep -q 'is UP'
}

case ${1:-start} in
  start) start ;;
  stop) stop ;;
  status) status ;;
  env) echo "export SLURM_CONF=$conf" ;;
  *)
    echo "usage: $0 [start|stop|status|env]" >&2
    exit 1
    ;;
esac
