#!/usr/bin/env bash
# slurm-local.sh: a real, self-contained Slurm cluster on loopback, for tests and local runs.
#
# Usage:
#   scripts/slurm-local.sh start    install packages if missing, start everything, wait until ready
#   scripts/slurm-local.sh status   print `export SLURM_CONF=...` (first line) and the cluster state
#   scripts/slurm-local.sh stop     cancel jobs, stop exactly the daemons started here (by recorded PID)
#
#   eval "$(scripts/slurm-local.sh status)"   # readies a shell for sbatch / squeue / sacct / submitit
#
# What `start` brings up (Debian 12 packages: slurm-wlm 22.05, munge, slurmdbd, mariadb-server; they
# are installed with apt-get when missing, which needs root):
#   - a private munged (own key and socket, run as the munge user),
#   - a private MariaDB (own datadir, 127.0.0.1 only) and slurmdbd, so that `sacct` works: without
#     accounting a cancelled submitit job hangs its submitter forever,
#   - slurmctld and two slurmd on 127.0.0.1, named after two names that resolve on this machine: the
#     host name and another name /etc/hosts gives to 127.x (not `localhost`: Slurm renames a node of
#     that name to the host name). Each node declares CPUs=16 (config_overrides) and 8 fake GPUs
#     (character devices made with mknod) so that real presets' requests such as
#     `--gpus-per-node=8 --ntasks-per-node=8 --cpus-per-task=2 --exclusive` are accepted,
#   - partitions `gpu` (default) and `htc` over both nodes, a scheduler that starts jobs within ~1 s and
#     a short credential lifetime so that requeued jobs restart within seconds.
# Nothing is written outside $SLURM_LOCAL_DIR, except: apt-get (with a temporary policy-rc.d so that
# the distribution's own services stay stopped), and, only when fewer than two node names resolve, one
# line marked "# slurm-local" appended to /etc/hosts (removed again by `stop`).
# Requires root (slurmd must run as root). `start` is idempotent: if the cluster is up it says so and
# exits 0; a half-running cluster is stopped and started afresh. Accounting data and the controller's
# state persist in $SLURM_LOCAL_DIR across stop/start, so job IDs keep increasing (sacct stays truthful).
#
# Exit codes: 0 success; 1 failure (the relevant log tail is printed on stderr); 2 usage or
# prerequisites (not root, no apt-get). `status` always prints the export line first, even when the
# cluster is down, and then exits 3 if it is not (fully) up; every other line it prints is a `#`
# comment, so eval is always safe. start and stop serialize on a lock file in $SLURM_LOCAL_DIR.
#
# Environment (all optional):
#   SLURM_LOCAL_DIR        all state, configs, logs and pid files  [/tmp/slurm-local]
#   SLURM_LOCAL_PORT_BASE  slurmctld port; slurmd use +1 and +2, slurmdbd +13, MariaDB +14  [6817]
#   SLURM_LOCAL_CPUS       CPUs declared per node  [16]
#   SLURM_LOCAL_GPUS       fake GPUs per node  [8]
#   SLURM_LOCAL_MEM_MB     RealMemory declared per node (memory is not a consumable here)  [512000]
#   SLURM_LOCAL_NODES      two node names to use instead of the detected ones, e.g. "node-a node-b"
#   SLURM_LOCAL_TIMEOUT    seconds to wait for each readiness step  [60]
set -euo pipefail

DIR=${SLURM_LOCAL_DIR:-/tmp/slurm-local}
PORT_BASE=${SLURM_LOCAL_PORT_BASE:-6817}
CPUS=${SLURM_LOCAL_CPUS:-16}
GPUS=${SLURM_LOCAL_GPUS:-8}
MEM_MB=${SLURM_LOCAL_MEM_MB:-512000}
TIMEOUT=${SLURM_LOCAL_TIMEOUT:-60}
for v in PORT_BASE CPUS GPUS MEM_MB TIMEOUT; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "slurm-local: SLURM_LOCAL_$v must be a positive integer, got '${!v}'" >&2; exit 2; }
done
CLUSTER=local

CTLD_PORT=$PORT_BASE
SLURMD_PORT1=$((PORT_BASE + 1))
SLURMD_PORT2=$((PORT_BASE + 2))
DBD_PORT=$((PORT_BASE + 13))
DB_PORT=$((PORT_BASE + 14))

ETC=$DIR/etc
RUN=$DIR/run
LOG=$DIR/log
STATE=$DIR/state
MUNGE=$DIR/munge
DB=$DIR/mariadb
CONF=$ETC/slurm.conf
MUNGE_SOCK=$MUNGE/munge.socket
DB_SOCK=$DB/mysqld.sock
NODES_FILE=$ETC/nodes            # the two node names chosen at start
HOSTS_MARK="# slurm-local"

PACKAGES=(slurm-wlm munge slurmdbd mariadb-server)
BINARIES=(slurmctld slurmd slurmdbd sbatch sacct sacctmgr munged mungekey mariadbd mariadb-install-db mariadb)

export SLURM_CONF=$CONF

say() { echo "slurm-local: $*"; }
err() { echo "slurm-local: $*" >&2; }

# ---------------------------------------------------------------------------------------------------
# Daemons: name, pid file, expected /proc/<pid>/comm. Stop order is the reverse of start order.
daemon_names() { echo munged mariadbd slurmdbd slurmctld "slurmd-$(node 1)" "slurmd-$(node 2)"; }

pidfile_of() {
  case $1 in
    munged) echo "$MUNGE/munged.pid" ;;
    mariadbd) echo "$DB/mariadbd.pid" ;;
    slurmdbd) echo "$RUN/slurmdbd.pid" ;;
    slurmctld) echo "$RUN/slurmctld.pid" ;;
    slurmd-*) echo "$RUN/$1.pid" ;;
  esac
}

comm_of() { case $1 in slurmd-*) echo slurmd ;; *) echo "$1" ;; esac; }

logfile_of() {
  case $1 in
    munged) echo "$MUNGE/munged.log" ;;
    mariadbd) echo "$DB/mariadbd.log" ;;
    *) echo "$LOG/$1.log" ;;
  esac
}

# PID of a daemon if its pid file names a live process of the expected program, else nothing.
live_pid() {
  local f pid
  f=$(pidfile_of "$1")
  [[ -s $f ]] || return 1
  pid=$(tr -dc '0-9' <"$f")
  [[ -n $pid && -r /proc/$pid/comm ]] || return 1
  [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$(comm_of "$1")" ]] || return 1
  echo "$pid"
}

node() { sed -n "${1}p" "$NODES_FILE" 2>/dev/null; }

# ---------------------------------------------------------------------------------------------------
resolves() { getent ahostsv4 "$1" >/dev/null 2>&1; }

# Pick two distinct names that resolve (IPv4) here. Slurm replaces a node named "localhost" with the host
# name, so candidates are the short and full host names, then the other names that /etc/hosts gives
# to 127.x. Only if fewer than two exist is a marked loopback line appended to /etc/hosts.
choose_nodes() {
  local names=() cands=() n short add=()
  if [[ -n ${SLURM_LOCAL_NODES:-} ]]; then
    read -r -a names <<<"$SLURM_LOCAL_NODES"
    [[ ${#names[@]} -eq 2 && ${names[0]} != "${names[1]}" ]] ||
      { err "SLURM_LOCAL_NODES must hold two distinct names, got '$SLURM_LOCAL_NODES'"; exit 2; }
    for n in "${names[@]}"; do
      [[ $n != localhost ]] || { err "SLURM_LOCAL_NODES: Slurm renames a node called 'localhost'; pick another name"; exit 2; }
      resolves "$n" || { err "SLURM_LOCAL_NODES: '$n' does not resolve"; exit 2; }
    done
  else
    short=$(hostname -s 2>/dev/null || hostname)
    cands=("$short" "$(hostname -f 2>/dev/null || true)")
    # shellcheck disable=SC2207
    cands+=($(awk '$1 ~ /^127\./ { for (i = 2; i <= NF && $i !~ /^#/; i++) print $i }' /etc/hosts 2>/dev/null))
    for n in "${cands[@]}"; do
      [[ -n $n && $n != localhost* && ${#names[@]} -lt 2 ]] || continue
      [[ " ${names[*]} " == *" $n "* ]] && continue
      resolves "$n" && names+=("$n")
    done
    # The node name becomes MASTER_ADDR for torch, so it has to resolve: add what is missing.
    if [[ ${#names[@]} -lt 2 && $short != localhost* && " ${names[*]} " != *" $short "* ]]; then
      add+=("$short"); names=("$short" "${names[@]}")
    fi
    while [[ ${#names[@]} -lt 2 ]]; do
      n=slurm-local-$((${#names[@]} + 1)); add+=("$n"); names+=("$n")
    done
    if [[ ${#add[@]} -gt 0 ]]; then
      if ! echo "127.0.0.1 ${add[*]} $HOSTS_MARK" >>/etc/hosts 2>/dev/null; then
        err "need two resolvable node names; add '127.0.0.1 ${add[*]}' to /etc/hosts or set SLURM_LOCAL_NODES"
        exit 1
      fi
      say "added '127.0.0.1 ${add[*]} $HOSTS_MARK' to /etc/hosts (removed again by stop)"
    fi
  fi
  printf '%s\n' "${names[@]}" >"$NODES_FILE"
}

install_packages() {
  local missing=() b
  for b in "${BINARIES[@]}"; do command -v "$b" >/dev/null 2>&1 || PATH=$PATH:/usr/sbin:/sbin command -v "$b" >/dev/null 2>&1 || missing+=("$b"); done
  [[ ${#missing[@]} -eq 0 ]] && return 0
  if [[ $EUID -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    err "missing: ${missing[*]}; install them as root: apt-get install -y ${PACKAGES[*]}"
    exit 2
  fi
  say "installing ${PACKAGES[*]} (missing: ${missing[*]})"
  local t0=$SECONDS added_policy=0
  # Keep apt from starting the distribution's own services (munge, mariadb, slurm) on this machine.
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && added_policy=1
  fi
  local rc=0
  { DEBIAN_FRONTEND=noninteractive apt-get update -q &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${PACKAGES[@]}"; } >"$DIR/apt.log" 2>&1 || rc=$?
  [[ $added_policy -eq 1 ]] && rm -f /usr/sbin/policy-rc.d
  if [[ $rc -ne 0 ]]; then err "apt-get failed ($rc):"; tail -n 30 "$DIR/apt.log" >&2; exit 1; fi
  say "installed in $((SECONDS - t0)) s"
}

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

write_configs() {
  local n1 n2 n
  n1=$(node 1) n2=$(node 2)
  mkdir -p "$ETC" "$RUN" "$LOG" "$STATE/ctld" "$STATE/d/$n1" "$STATE/d/$n2"

  # Fake GPUs: character devices (regular files would leave CUDA_VISIBLE_DEVICES empty).
  for n in "$n1" "$n2"; do
    mkdir -p "$DIR/dev/$n"
    for ((i = 0; i < GPUS; i++)); do
      [[ -c $DIR/dev/$n/nvidia$i ]] && continue
      rm -f "$DIR/dev/$n/nvidia$i"
      mknod "$DIR/dev/$n/nvidia$i" c 195 "$i" || { err "mknod failed: cannot create fake GPU devices"; exit 1; }
    done
  done

  local node_line="CPUs=$CPUS RealMemory=$MEM_MB Gres=gpu:$GPUS State=UNKNOWN"
  cat >"$CONF" <<EOF
# Generated by scripts/slurm-local.sh; rewritten on every start.
ClusterName=$CLUSTER
SlurmctldHost=localhost
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# socket: our private munged; cred_expire=5: requeued jobs restart in seconds, not minutes.
AuthInfo=socket=$MUNGE_SOCK,cred_expire=5
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d/%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_interval=1,bf_interval=1
SlurmdParameters=config_overrides
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
KillWait=2
GresTypes=gpu
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$DBD_PORT
# For connections to slurmdbd the munge socket comes from here, not from AuthInfo.
AccountingStoragePass=socket=$MUNGE_SOCK
# Two slurmd on one machine: distinct names (they default NodeHostname, which must be unique since
# Debian's Slurm is built without multiple-slurmd), one address, one port each.
NodeName=$n1 NodeAddr=127.0.0.1 Port=$SLURMD_PORT1 $node_line
NodeName=$n2 NodeAddr=127.0.0.1 Port=$SLURMD_PORT2 $node_line
PartitionName=gpu Nodes=$n1,$n2 Default=YES MaxTime=INFINITE State=UP
PartitionName=htc Nodes=$n1,$n2 MaxTime=INFINITE State=UP
EOF

  cat >"$ETC/gres.conf" <<EOF
AutoDetect=off
NodeName=$n1 Name=gpu File=$DIR/dev/$n1/nvidia[0-$((GPUS - 1))]
NodeName=$n2 Name=gpu File=$DIR/dev/$n2/nvidia[0-$((GPUS - 1))]
EOF

  (umask 077 && cat >"$ETC/slurmdbd.conf" <<EOF
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCK
DbdHost=localhost
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$RUN/slurmdbd.pid
LogFile=$LOG/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
EOF
  )
  chmod 600 "$ETC/slurmdbd.conf"
}

# wait_for [-d daemon]... <seconds> <description> <command...>: retry every 0.2 s; give up at once
# if one of the named daemons has died.
wait_for() {
  local watch=() d
  while [[ $1 == -d ]]; do watch+=("$2"); shift 2; done
  local limit=$1 what=$2 t0=$SECONDS
  shift 2
  local out
  until out=$("$@" 2>&1); do
    if ((SECONDS - t0 >= limit)); then
      err "timed out after ${limit} s waiting for $what${out:+; last output of '$*':}"
      [[ -n $out ]] && tail -n 5 <<<"$out" | sed 's/^/    /' >&2
      return 1
    fi
    for d in "${watch[@]}"; do
      # no pid file yet: still starting (mariadbd writes its own after its storage engine is up, over a second
      # on a busy machine; a daemon that dies before then is reported when the wait times out)
      [[ -s $(pidfile_of "$d") ]] || continue
      live_pid "$d" >/dev/null || { sleep 0.5; live_pid "$d" >/dev/null; } ||
        { err "$d exited while waiting for $what"; return 1; }
    done
    sleep 0.2
  done
}

fail_with_logs() {
  err "start failed: $1"
  shift
  local f
  for f in "$@"; do
    [[ -f $f ]] || continue
    echo "----- tail of $f -----" >&2
    tail -n 25 "$f" >&2
  done
  if [[ ${STARTING:-0} -eq 1 ]]; then
    err "stopping what this start brought up (logs stay in $DIR)"
    STARTING=0
    cmd_stop >&2
  fi
  exit 1
}

nodes_ready() {
  local states n
  states=$(sinfo -h -N -o '%N %t' 2>/dev/null | sort -u) || return 1
  for n in "$(node 1)" "$(node 2)"; do
    grep -Eq "^$n (idle|mix|alloc)\$" <<<"$states" || return 1
  done
}

cluster_registered() { sacctmgr -n -P show cluster format=cluster 2>/dev/null | grep -qx "$CLUSTER"; }

all_up() {
  local d
  [[ -s $NODES_FILE && -f $CONF ]] || return 1
  for d in $(daemon_names); do live_pid "$d" >/dev/null || return 1; done
  scontrol ping 2>/dev/null | grep -q UP
}

any_up() {
  local d
  [[ -s $NODES_FILE ]] || return 1
  for d in $(daemon_names); do live_pid "$d" >/dev/null && return 0; done
  return 1
}

# Daemons never keep the caller's stdio (a caller that captures our output would wait forever).
# spawn: start a daemon that forks by itself; returns the exit status of its parent process.
# Both close fd 9 (the lock, see lock()) so that daemons do not hold it.
spawn() { (cd / && exec setsid "$@" </dev/null >>"$LOG/daemons.out" 2>&1 9>&-); }
# detach: start a program that stays in the foreground, in the background.
detach() { (cd / && exec setsid "$@" </dev/null >>"$LOG/daemons.out" 2>&1 9>&- &); }

# A file system both nodes share, as a cluster's Lustre or NFS is: a tmpfs mounted before the nodes start, so each
# node's private mount namespace (below) holds the same one. Tests put a run's storage.root there.
SHARED=$DIR/shared
mount_shared() {
  mkdir -p "$SHARED"
  mountpoint -q "$SHARED" || mount -t tmpfs -o size=4g,mode=1777 tmpfs "$SHARED" 2>/dev/null ||
    say "could not mount a tmpfs at $SHARED: tests that need a shared mount will skip"
}

# Each node gets its own /dev/shm, as separate machines have: node-local shared memory named alike on
# two nodes (streaming's dataset registry, for one) would otherwise collide between the two slurmd.
spawn_node() {
  if unshare -m --propagation private true 2>/dev/null; then
    spawn unshare -m --propagation private sh -c \
      'mount -t tmpfs -o mode=1777 tmpfs /dev/shm && exec "$@"' sh slurmd -f "$CONF" -N "$1"
  else
    spawn slurmd -f "$CONF" -N "$1"
  fi
}

start_munged() {
  mkdir -p "$MUNGE"
  chown munge:munge "$MUNGE" && chmod 755 "$MUNGE"   # munged wants its socket dir reachable by all
  if [[ ! -s $MUNGE/munge.key ]]; then
    runuser -u munge -- mungekey --create --keyfile="$MUNGE/munge.key" >/dev/null 2>&1 ||
      fail_with_logs "could not create a munge key"
  fi
  spawn runuser -u munge -- munged --socket="$MUNGE_SOCK" --key-file="$MUNGE/munge.key" \
    --pid-file="$MUNGE/munged.pid" --log-file="$MUNGE/munged.log" --seed-file="$MUNGE/munged.seed" ||
    fail_with_logs "munged did not start" "$MUNGE/munged.log" "$LOG/daemons.out"
  wait_for "$TIMEOUT" munged live_pid munged || fail_with_logs "munged did not start" "$MUNGE/munged.log" "$LOG/daemons.out"
}

db_sql() { mariadb --no-defaults -S "$DB_SOCK" -uroot -e "$1"; }

start_mariadb() {
  mkdir -p "$DB"
  chown mysql:mysql "$DB"
  if [[ ! -d $DB/data/mysql ]]; then
    mariadb-install-db --no-defaults --user=mysql --datadir="$DB/data" --auth-root-authentication-method=socket \
      --skip-test-db >"$LOG/mariadb-install.log" 2>&1 || fail_with_logs "mariadb-install-db failed" "$LOG/mariadb-install.log"
  fi
  rm -f "$DB/mariadbd.pid"  # one left by a killed run would name a dead process while this one starts
  detach mariadbd --no-defaults --user=mysql --datadir="$DB/data" --socket="$DB_SOCK" \
    --pid-file="$DB/mariadbd.pid" --log-error="$DB/mariadbd.log" --bind-address=127.0.0.1 --port="$DB_PORT" \
    --innodb-buffer-pool-size=256M --innodb-lock-wait-timeout=900 --max-allowed-packet=64M
  wait_for -d mariadbd "$TIMEOUT" MariaDB mariadb-admin --no-defaults -S "$DB_SOCK" -uroot ping ||
    fail_with_logs "MariaDB did not start" "$DB/mariadbd.log" "$LOG/daemons.out"
  db_sql "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurm';
          CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';
          GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
          GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';" 2>>"$LOG/daemons.out" ||
    fail_with_logs "could not create the slurm database user" "$LOG/daemons.out"
}

cmd_start() {
  mkdir -p "$DIR" "$ETC" "$RUN" "$LOG"
  chmod 755 "$DIR"
  install_packages

  if all_up; then
    wait_for "$TIMEOUT" "both nodes to be up" nodes_ready || fail_with_logs "nodes not ready" "$LOG/slurmctld.log"
    say "already running (SLURM_CONF=$CONF)"
    return 0
  fi
  if any_up; then
    say "partially running: stopping the leftovers first"
    cmd_stop
  fi

  local t0 p
  t0=$(date +%s.%N)
  choose_nodes
  for p in "$CTLD_PORT" "$SLURMD_PORT1" "$SLURMD_PORT2" "$DBD_PORT" "$DB_PORT"; do
    port_busy "$p" && { err "port $p on 127.0.0.1 is already in use (another Slurm or MySQL?); set SLURM_LOCAL_PORT_BASE"; exit 1; }
  done
  write_configs
  : >"$LOG/daemons.out"
  STARTING=1

  start_munged
  start_mariadb

  spawn slurmdbd || fail_with_logs "slurmdbd did not start" "$LOG/slurmdbd.log" "$LOG/daemons.out"
  wait_for -d slurmdbd "$TIMEOUT" "slurmdbd (sacctmgr)" sacctmgr -n show cluster ||
    fail_with_logs "slurmdbd did not answer" "$LOG/slurmdbd.log" "$LOG/daemons.out"

  spawn slurmctld -f "$CONF" || fail_with_logs "slurmctld did not start" "$LOG/slurmctld.log" "$LOG/daemons.out"
  wait_for -d slurmctld "$TIMEOUT" slurmctld scontrol ping ||
    fail_with_logs "slurmctld did not answer" "$LOG/slurmctld.log" "$LOG/daemons.out"
  mount_shared
  for n in "$(node 1)" "$(node 2)"; do
    mkdir -p "$STATE/d/$n"
    spawn_node "$n" || fail_with_logs "slurmd $n did not start" "$LOG/slurmd-$n.log" "$LOG/daemons.out"
  done
  wait_for -d slurmctld -d "slurmd-$(node 1)" -d "slurmd-$(node 2)" "$TIMEOUT" "both nodes to be idle" nodes_ready ||
    fail_with_logs "nodes did not come up: $(sinfo -h -N -o '%N=%t' 2>/dev/null | tr '\n' ' ')" \
      "$LOG/slurmd-$(node 1).log" "$LOG/slurmd-$(node 2).log" "$LOG/slurmctld.log"
  wait_for "$TIMEOUT" "cluster '$CLUSTER' in accounting" cluster_registered ||
    fail_with_logs "the cluster did not register with slurmdbd" "$LOG/slurmdbd.log" "$LOG/slurmctld.log"
  all_up || fail_with_logs "a daemon died during start" "$LOG/daemons.out" "$LOG/slurmctld.log"

  say "up in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s: nodes $(node 1), $(node 2); partitions gpu (default), htc"
  say "use it with: eval \"\$($0 status)\""
}

alive() { [[ -d /proc/$1 && $(cat "/proc/$1/comm" 2>/dev/null) == "$2" ]]; }

# SIGTERM daemons by their recorded PIDs, wait up to 15 s for them to exit, SIGKILL as a last resort.
stop_daemons() {
  local d pid i names=() pids=() left
  for d in "$@"; do
    pid=$(live_pid "$d") || continue
    kill -TERM "$pid" 2>/dev/null || true
    names+=("$d") pids+=("$pid")
  done
  for ((i = 0; i < 75; i++)); do
    left=0
    for d in "${!pids[@]}"; do alive "${pids[$d]}" "$(comm_of "${names[$d]}")" && left=1; done
    [[ $left -eq 0 ]] && break
    sleep 0.2
  done
  for d in "${!pids[@]}"; do
    if alive "${pids[$d]}" "$(comm_of "${names[$d]}")"; then
      err "${names[$d]} (pid ${pids[$d]}) ignored SIGTERM for 15 s; sending SIGKILL"
      kill -KILL "${pids[$d]}" 2>/dev/null || true
    fi
    say "stopped ${names[$d]} (pid ${pids[$d]})"
  done
}

cmd_stop() {
  if ! any_up; then
    say "not running"
  else
    # End the jobs first, so that no job step outlives its slurmd.
    if live_pid slurmctld >/dev/null && scontrol ping 2>/dev/null | grep -q UP; then
      local jobs
      jobs=$(squeue -h -o %A 2>/dev/null | tr '\n' ' ') || true
      if [[ -n ${jobs// /} ]]; then
        say "cancelling jobs: $jobs"
        # shellcheck disable=SC2086
        scancel $jobs 2>/dev/null || true
        wait_for 30 "jobs to end" bash -c '[[ -z $(squeue -h -o %A 2>/dev/null) ]]' || true
      fi
    fi
    # Reverse start order; munged last, since the Slurm daemons authenticate through it while shutting down.
    stop_daemons "slurmd-$(node 1)" "slurmd-$(node 2)"
    stop_daemons slurmctld
    stop_daemons slurmdbd
    stop_daemons mariadbd munged
  fi
  if mountpoint -q "$SHARED" 2>/dev/null; then umount -l "$SHARED" || true; fi
  if grep -q "$HOSTS_MARK\$" /etc/hosts 2>/dev/null; then
    # Rewrite in place (not a rename): /etc/hosts is often a bind mount.
    local kept
    kept=$(grep -v "$HOSTS_MARK\$" /etc/hosts)
    printf '%s\n' "$kept" >/etc/hosts && say "removed the '$HOSTS_MARK' line from /etc/hosts"
  fi
}

cmd_status() {
  printf 'export SLURM_CONF=%q\n' "$CONF"
  local d pid up=0
  if [[ -s $NODES_FILE ]]; then
    for d in $(daemon_names); do
      if pid=$(live_pid "$d"); then echo "# $d: running (pid $pid)"; else echo "# $d: not running"; fi
    done
  fi
  if all_up; then
    up=1
    sinfo -N -o '%N %P %t %c %G' 2>&1 | sed 's/^/# /'
  fi
  if [[ $up -eq 1 ]]; then echo "# slurm-local: up ($DIR)"; return 0; fi
  echo "# slurm-local: not running ($DIR); start it with: $0 start"
  return 3
}

# start and stop take a lock, so that concurrent callers (parallel test sessions) take turns.
lock() {
  mkdir -p "$DIR"
  exec 9>>"$DIR/start-stop.lock"
  flock -w 900 9 || { err "could not lock $DIR/start-stop.lock within 900 s"; exit 1; }
}

# All of the above are definitions; bash reads a script as it runs, so keep the work in one function
# called on the last line (an edit of this file during a run cannot derail it).
main() {
  case ${1:-} in
    start | stop)
      [[ $EUID -eq 0 ]] || { err "$1 must run as root (slurmd runs jobs as root here); try: sudo $0 $1"; exit 2; }
      lock
      "cmd_$1"
      ;;
    status) cmd_status ;;
    *) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
  esac
}

main "$@"; exit
