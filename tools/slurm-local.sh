#!/usr/bin/env bash
# A throw-away single-host Slurm cluster for testing tprun's sbatch scripts on
# one Debian 12 machine (run as root; no systemd needed).
#
#   tools/slurm-local.sh up      install packages if missing, start munged,
#                                slurmctld and slurmd, wait until the node is
#                                idle; the LAST stdout line is the export line:
#                                  eval "$(tools/slurm-local.sh up)"
#   tools/slurm-local.sh down    cancel all jobs, stop the daemons (by PID,
#                                SIGKILL after a timeout), kill stray slurmstepd
#   tools/slurm-local.sh status  daemons + sinfo (stdout); exit 0 if up, else 1
#   tools/slurm-local.sh env     prints `export SLURM_CONF=...` when up
#   tools/slurm-local.sh --help  this text
#
# Everything lives in ${TPRUN_SLURM_DIR:-/tmp/tprun-slurm}: slurm.conf, the
# munge key/socket, pid files, logs (log/), controller state and slurmd spool.
# `up` and `down` are idempotent. The node is the short host name with
# NodeAddr 127.0.0.1 and CPUs=${TPRUN_SLURM_CPUS:-8} (overcommitted on purpose
# so that several ranks fit on a small machine); partition `debug`; MPI through
# PMIx by default (MpiDefault=pmix); finished jobs stay visible 300 s;
# requeued jobs restart after ~10 s (cred_expire=10). Ports
# ${TPRUN_SLURM_PORT:-6817} (slurmctld) and the next one (slurmd).
# Messages go to stderr; stdout carries only the export line. In jobs: srun
# needs no --mpi flag; mpirun (as root) needs OMPI_ALLOW_RUN_AS_ROOT=1 and
# OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; more tasks than CPUs pend forever.
set -euo pipefail

dir=${TPRUN_SLURM_DIR:-/tmp/tprun-slurm}
cpus=${TPRUN_SLURM_CPUS:-8}
port=${TPRUN_SLURM_PORT:-6817}
host=$(hostname -s)
conf=$dir/slurm.conf
sock=$dir/munge/munge.socket.2
daemons=(munged slurmctld slurmd)
export SLURM_CONF=$conf

say() { echo "slurm-local: $*" >&2; }

env_of() { tr '\0' '\n' 2>/dev/null <"/proc/$1/environ"; }
is_zombie() { [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" = Z ]; }
alive() { kill -0 "$1" 2>/dev/null && ! is_zombie "$1"; } # init reaps slowly here

# PID of a daemon we started, if it still runs (the pid file must name a live
# process with the right command, so a reused PID is not mistaken for it).
pid_of() {
  local p
  p=$(cat "$dir/$1.pid" 2>/dev/null) || return 1
  [[ $p =~ ^[0-9]+$ ]] && [ "$(cat /proc/"$p"/comm 2>/dev/null)" = "$1" ] && ! is_zombie "$p" && echo "$p"
}

ensure_packages() {
  local pkgs=(slurm-wlm munge openmpi-bin libopenmpi-dev libpmix-dev) missing=() p
  for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  [ "$(id -u)" -eq 0 ] || { say "need root to install: ${missing[*]}"; exit 1; }
  say "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # Keep the packages' init scripts from starting system-wide daemons.
  local policy=/usr/sbin/policy-rc.d added=0
  if [ ! -e $policy ]; then printf '#!/bin/sh\nexit 101\n' >$policy && chmod 755 $policy && added=1; fi
  local install=(apt-get install -y -qq --no-install-recommends "${missing[@]}") rc=0
  if ! compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null || ! "${install[@]}" >"$dir.apt.log" 2>&1; then
    { apt-get update -qq && "${install[@]}"; } >"$dir.apt.log" 2>&1 || rc=$?
  fi
  [ $added -eq 1 ] && rm -f $policy
  if [ $rc -ne 0 ]; then say "apt-get failed (rc $rc):"; tail -n 20 "$dir.apt.log" >&2; exit 1; fi
  rm -f "$dir.apt.log"
}

write_config() {
  local mem
  mem=$(awk '/MemTotal/ {printf "%d", $2 / 1024 / 2}' /proc/meminfo)
  cat >"$conf" <<EOF
# Written by tools/slurm-local.sh; rewritten on every fresh 'up'.
ClusterName=tprun
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$sock,cred_expire=10
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=pmix
SwitchType=switch/none
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,bf_interval=1,sched_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
ReturnToService=2
KillWait=5
MinJobAge=300
JobRequeue=1
InactiveLimit=0
MailProg=/bin/true
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
}

# Fail with the daemon's log tail; the EXIT trap stops what `up` started.
fail() {
  say "$1 failed to start${3:+ ($3)}; last lines of $2:"
  tail -n 25 "$2" >&2 2>/dev/null || say "(no log)"
  exit 1
}

node_state() { timeout 10 sinfo -h -n "$host" -o %t 2>/dev/null | head -n 1; }

wait_idle() {
  local t0=$SECONDS s=""
  while [ $((SECONDS - t0)) -lt "${1:-30}" ]; do
    s=$(node_state) || true
    case $s in idle | mix | alloc | comp*) return 0 ;; drain* | down*) break ;; esac
    sleep 0.5
  done
  say "node $host is '${s:-unknown}', not idle:"
  timeout 10 scontrol show node "$host" 2>&1 | grep -E 'State=|Reason=' >&2 || true
  fail slurmd "$dir/log/slurmd.log" "node not idle"
}

print_env() { echo "export SLURM_CONF=$conf"; }

up() {
  mkdir -p "$(dirname "$dir")"
  ensure_packages
  local running=0 d
  for d in "${daemons[@]}"; do pid_of "$d" >/dev/null && running=$((running + 1)); done
  if [ $running -eq ${#daemons[@]} ]; then
    say "already running ($dir)"
    wait_idle 30
    print_env
    return 0
  fi
  [ $running -gt 0 ] && { say "partly running; restarting"; down; }
  local t0=$SECONDS
  trap 'rc=$?; [ $rc -ne 0 ] && { say "stopping what was started"; stop_daemons; }; exit $rc' EXIT
  mkdir -p "$dir" "$dir/munge" "$dir/log" "$dir/state" "$dir/spool"
  chmod 0755 "$dir" "$dir/munge" "$dir/log"
  write_config
  for d in "${daemons[@]}"; do : >"$dir/log/$d.log"; done

  # munged with its own key, socket, pid, log and seed files.
  local key=$dir/munge/munge.key
  if [ ! -s "$key" ]; then
    if command -v mungekey >/dev/null; then mungekey --create --keyfile="$key" --force
    else dd if=/dev/urandom of="$key" bs=1024 count=1 status=none; fi
  fi
  chmod 0400 "$key"
  munged --socket="$sock" --key-file="$key" --pid-file="$dir/munged.pid" \
    --log-file="$dir/log/munged.log" --seed-file="$dir/munge/munged.seed" 2>>"$dir/log/munged.log" ||
    fail munged "$dir/log/munged.log"
  munge -n -S "$sock" | unmunge -S "$sock" >/dev/null 2>&1 || fail munged "$dir/log/munged.log" "credential test"

  # slurmctld (fresh state: -c), then slurmd; both daemonize and write pid files.
  slurmctld -c -f "$conf" 2>>"$dir/log/slurmctld.log" || fail slurmctld "$dir/log/slurmctld.log"
  local i
  for i in $(seq 40); do
    pid_of slurmctld >/dev/null || [ "$i" -lt 3 ] || fail slurmctld "$dir/log/slurmctld.log" "exited"
    timeout 2 scontrol ping 2>/dev/null | grep -q UP && break
    [ "$i" -eq 40 ] && fail slurmctld "$dir/log/slurmctld.log" "no answer to ping"
    sleep 0.5
  done
  slurmd -c -N "$host" -f "$conf" 2>>"$dir/log/slurmd.log" || fail slurmd "$dir/log/slurmd.log"
  wait_idle 30
  for d in "${daemons[@]}"; do pid_of "$d" >/dev/null || fail "$d" "$dir/log/$d.log" "exited"; done
  trap - EXIT
  say "up in $((SECONDS - t0)) s: node $host, $cpus CPUs, partition debug ($dir)"
  print_env
}

# Stops one process by PID: SIGTERM, then SIGKILL after $2 seconds.
stop_pid() {
  local p=$1 wait=$2 i
  kill "$p" 2>/dev/null || return 0
  for i in $(seq $((wait * 10))); do alive "$p" || break; sleep 0.1; done
  if alive "$p"; then
    say "pid $p did not exit in ${wait} s; SIGKILL"
    kill -9 "$p" 2>/dev/null || true
    while alive "$p"; do sleep 0.1; done
  fi
  stopped+=("$p")
}

# slurmstepd processes of this cluster (they inherit our SLURM_CONF from
# slurmd), or any left behind once no slurmd runs on this machine at all.
stray_stepds() {
  local p orphans=0
  pgrep -x slurmd >/dev/null || orphans=1
  for p in $(pgrep -x slurmstepd); do
    { env_of "$p" | grep -qxF "SLURM_CONF=$conf" || [ $orphans -eq 1 ]; } && echo "$p"
  done
}

stop_daemons() {
  local p d i left stopped=()
  for d in slurmd slurmctld; do p=$(pid_of $d) && stop_pid "$p" 10; done
  for p in $(stray_stepds); do stop_pid "$p" 3; done
  # Job tasks orphaned by a killed slurmstepd: kill their process groups.
  for p in $(pgrep -P 1 || true); do
    if env_of "$p" | grep -qxF "SLURM_CONF=$conf" && env_of "$p" | grep -q '^SLURM_JOB_ID='; then
      say "killing orphaned job process $p ($(cat "/proc/$p/comm" 2>/dev/null))"
      kill -9 -- "-$p" 2>/dev/null || kill -9 "$p" 2>/dev/null || true
    fi
  done
  p=$(pid_of munged) && stop_pid "$p" 10
  for d in "${daemons[@]}"; do rm -f "$dir/$d.pid"; done
  # init reaps exited daemons only every second or so: wait (up to 3 s) so
  # that `ps` right after `down` shows no <defunct> entries.
  for i in $(seq 30); do
    left=0
    for p in "${stopped[@]}"; do [ -e "/proc/$p" ] && left=1; done
    [ $left -eq 0 ] && break
    sleep 0.1
  done
}

down() {
  if pid_of slurmctld >/dev/null; then
    local jobs i
    jobs=$(timeout 10 squeue -h -o %A 2>/dev/null || true)
    if [ -n "$jobs" ]; then
      say "cancelling jobs: ${jobs//$'\n'/ }"
      # shellcheck disable=SC2086
      timeout 10 scancel --full $jobs 2>/dev/null || true
      for i in $(seq 30); do
        [ -z "$(timeout 5 squeue -h -t R,CG,S -o %A 2>/dev/null)" ] && [ -z "$(stray_stepds)" ] && break
        pid_of slurmd >/dev/null || break
        sleep 0.5
      done
    fi
  fi
  stop_daemons
  say "down ($dir)"
}

status() {
  local d p ok=0
  for d in "${daemons[@]}"; do
    if p=$(pid_of "$d"); then echo "$d running (pid $p)"; else echo "$d not running"; ok=1; fi
  done
  if pid_of slurmctld >/dev/null; then timeout 10 sinfo || ok=1; fi
  return $ok
}

case ${1:-} in
up) up ;;
down) down ;;
status) status ;;
-h | --help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0" ;;
env) if status >/dev/null 2>&1; then print_env; else say "not up; run: $0 up"; exit 1; fi ;;
*) echo "usage: $0 up|down|status|env|--help" >&2; exit 2 ;;
esac
