#!/usr/bin/env bash
# Device emulation by CPU caps (docs/netlab.md, "Emulating devices with CPU caps"): runs one
# program (one MPI rank) inside a CPU cgroup of its own whose CFS quota holds it to a fixed
# share of a core, busy or idle, so N ranks capped at C cores behave like N devices of C cores
# each: a rank that waits does not hand its core time to the others.
#
#   rank-cap.sh --cpus C [--period-us P] [--timeout S] -- PROGRAM [ARGS...]
#   rank-cap.sh --cleanup          remove stale cgroups of this script (no process in them)
#
#   mpirun -np 4 scripts/rank-cap.sh --cpus 0.5 -- build/release/apps/distca bench train ...
#
# --cpus C       the share, in cores (0 < C <= the cores here); quota = C x period
# --period-us P  the CFS period in microseconds (1000 to 1000000; default the shortest from
#                2000 up whose quota C x P is the kernel's least, 1000 us: 2000 at C >= 0.5):
#                short, so a rank runs at most C x P before it is held back, and a message that
#                reaches a held-back rank waits at most (1 - C) x P
# --timeout S    TERM the program after S seconds (KILL 10 s later); default none
# --weight W     the cgroup's CPU weight, 1 to 10000 (cgroup v2 cpu.weight; v1 cpu.shares =
#                W x 1024 / 100); default the kernel's (100): under other load, a high weight
#                lets a rank take its share when it becomes runnable; the cap still bounds it
# RANK_CAP_KILL_AFTER_S (environment): the seconds between a TERM and the KILL (default 10)
# DISTCA_WAIT (environment): passed on as set; unset or empty, the program gets DISTCA_WAIT=sleep
#                (distca's MPI waits sleep between polls instead of spinning, so a waiting rank
#                leaves its quota unspent, as a waiting device does; docs/runtime.md, "Waits")
#
# The cgroup is named distca-cap.JOB.RANK.PID (JOB: Open MPI's job id or PMIx namespace, else
# "solo"; RANK: OMPI_COMM_WORLD_RANK or PMIX_RANK, else 0), under the cgroup v2 hierarchy where
# its cpu controller is available (cpu.max), else under this process's cgroup v1 cpu hierarchy
# (cpu.cfs_quota_us, cpu.cfs_period_us). The script moves itself in, runs PROGRAM as its child
# (which dies with it, through setpriv --pdeathsig, where setpriv exists), forwards HUP, INT,
# TERM, USR1 and USR2 to it, and when it exits moves itself out, stops anything the program
# left in the cgroup, removes the cgroup and exits with the program's status (128 + N when it
# died of signal N). A TERM that the program ignores is followed by a KILL 10 s later.
#
# Exit status: the program's; 2: bad flags, or no writable CPU cgroup here (one line says
# which; tests map it to SKIP), before anything is made. --cleanup: 0, or 1 when a cgroup of the
# prefix still holds processes (listed; left alone).
set -uo pipefail

readonly PREFIX=distca-cap
readonly KILL_AFTER_S=${RANK_CAP_KILL_AFTER_S:-10}  # tests shorten it

cpus=""
period=""
timeout_s=0
weight=""
cleanup_mode=0
group=""        # the cgroup directory this call made (what the EXIT trap removes)
home=""         # the cgroup directory to move back into
child=""
signalled=""    # the first signal forwarded
deadline=0      # SECONDS after which a signalled child gets KILL

bad() { echo "rank-cap: error: $*" >&2; exit 2; }
warn() { echo "rank-cap: warning: $*" >&2; }

# The cgroup v2 mount whose cpu controller is available, or nothing.
v2_root() {
  local m
  m=$(awk '$3 == "cgroup2" { print $2; exit }' /proc/mounts)
  [ -n "$m" ] && [ -r "$m/cgroup.controllers" ] && grep -qw cpu "$m/cgroup.controllers" && echo "$m"
}
# The cgroup v1 mount that carries the cpu controller, or nothing.
v1_root() {
  awk '$3 == "cgroup" && $4 ~ /(^|,)cpu(,|$)/ { print $2; exit }' /proc/mounts
}
# This process's cgroup path in the v1 hierarchy that has the cpu controller ("/" at the top).
v1_path() {
  awk -F: '$2 ~ /(^|,)cpu(,|$)/ { print $3; exit }' "/proc/$$/cgroup"
}
v2_path() {
  awk -F: '$1 == "0" { print $3; exit }' "/proc/$$/cgroup"
}

# Every cgroup directory of the prefix, under every mount that can hold one.
prefix_groups() {
  local m
  for m in "$(v2_root)" "$(v1_root)"; do
    [ -n "$m" ] && find "$m" -maxdepth 6 -type d -name "$PREFIX.*" 2>/dev/null
  done
}

cleanup_stale() {
  local d busy=0 pids
  while IFS= read -r d; do
    [ -n "$d" ] || continue
    pids=$(tr '\n' ' ' < "$d/cgroup.procs" 2>/dev/null)
    if [ -n "${pids// /}" ]; then
      echo "rank-cap: in use, left: $d (processes: $pids)"
      busy=1
    elif rmdir "$d" 2>/dev/null; then
      echo "rank-cap: removed $d"
    else
      echo "rank-cap: could not remove $d"
      busy=1
    fi
  done < <(prefix_groups | sort -u)
  return $busy
}

parse() {
  [ $# -gt 0 ] || bad "usage: rank-cap.sh --cpus C [--period-us P] [--timeout S] -- PROGRAM [ARGS...] | --cleanup"
  while [ $# -gt 0 ]; do
    case "$1" in
      --cpus) [ $# -ge 2 ] || bad "--cpus needs a value"; cpus=$2; shift 2 ;;
      --period-us) [ $# -ge 2 ] || bad "--period-us needs a value"; period=$2; shift 2 ;;
      --timeout) [ $# -ge 2 ] || bad "--timeout needs a value"; timeout_s=$2; shift 2 ;;
      --weight) [ $# -ge 2 ] || bad "--weight needs a value"; weight=$2; shift 2 ;;
      --cleanup) cleanup_mode=1; shift ;;
      -h | --help) sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
      --) shift; break ;;
      *) bad "unknown argument '$1' (the program goes after --)" ;;
    esac
  done
  if [ $cleanup_mode = 1 ]; then
    [ -z "$cpus" ] && [ $# = 0 ] || bad "--cleanup takes no other flag and no program"
    return
  fi
  [ $# -gt 0 ] || bad "no program given (rank-cap.sh --cpus C -- PROGRAM [ARGS...])"
  [[ $cpus =~ ^([0-9]+(\.[0-9]*)?|\.[0-9]+)$ ]] || bad "--cpus must be a positive number of cores (got '$cpus')"
  local cores
  cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # nproc follows OMP_NUM_THREADS otherwise
  awk -v c="$cpus" -v n="$cores" 'BEGIN { exit !(c > 0 && c <= n) }' || bad "--cpus must be above 0 and at most $cores, the cores here (got $cpus)"
  [ -n "$period" ] || period=$(awk -v c="$cpus" 'BEGIN { p = int(1000 / c + 0.999999); print (p < 2000 ? 2000 : p) }')
  [[ $period =~ ^[0-9]{4,7}$ ]] && [ "$period" -ge 1000 ] && [ "$period" -le 1000000 ] ||
    bad "--period-us must be an integer from 1000 to 1000000 (got '$period')"
  [[ $KILL_AFTER_S =~ ^[0-9]{1,4}$ ]] || bad "RANK_CAP_KILL_AFTER_S must be a whole number of seconds (got '$KILL_AFTER_S')"
  [ -z "$weight" ] || { [[ $weight =~ ^[0-9]{1,5}$ ]] && [ "$weight" -ge 1 ] && [ "$weight" -le 10000 ]; } ||
    bad "--weight must be an integer from 1 to 10000 (got '$weight')"
  [[ $timeout_s =~ ^[0-9]{1,7}$ ]] || bad "--timeout must be a whole number of seconds (got '$timeout_s')"
  quota=$(awk -v c="$cpus" -v p="$period" 'BEGIN { printf "%d", c * p + 0.5 }')
  [ "$quota" -ge 1000 ] || bad "--cpus $cpus x --period-us $period is a quota of $quota us, under the kernel's 1000 us: raise --period-us"
  argv=("$@")
}

# Makes the cgroup and sets its quota; exit 2 where that cannot be done here.
make_group() {
  local root job rank name
  job=${OMPI_MCA_ess_base_jobid:-${PMIX_NAMESPACE:-solo}}
  rank=${OMPI_COMM_WORLD_RANK:-${PMIX_RANK:-0}}
  name="$PREFIX.${job//[^A-Za-z0-9_-]/_}.${rank//[^0-9]/_}.$$"
  if root=$(v2_root) && [ -n "$root" ]; then
    home=$root$(v2_path)
    grep -qw cpu "$root/cgroup.subtree_control" 2>/dev/null || echo +cpu > "$root/cgroup.subtree_control" 2>/dev/null ||
      bad "cgroup v2 at $root: cannot enable its cpu controller for children (not root, or cpu bound elsewhere)"
    mkdir "$root/$name" 2>/dev/null || bad "cgroup v2 at $root is not writable here (mkdir $root/$name failed)"
    group=$root/$name
    echo "$quota $period" > "$group/cpu.max" 2>/dev/null || bad "cannot set $group/cpu.max"
    [ -z "$weight" ] || echo "$weight" > "$group/cpu.weight" 2>/dev/null || bad "cannot set $group/cpu.weight"
  else
    root=$(v1_root)
    [ -n "$root" ] || bad "no CPU cgroup here: neither a cgroup v2 cpu controller nor a cgroup v1 cpu mount"
    home=$root$(v1_path)
    home=${home%/}
    mkdir "$home/$name" 2>/dev/null || bad "cgroup v1 cpu hierarchy at $home is not writable here (mkdir failed)"
    group=$home/$name
    { echo "$period" > "$group/cpu.cfs_period_us" && echo "$quota" > "$group/cpu.cfs_quota_us"; } 2>/dev/null ||
      bad "cannot set the CFS quota in $group"
    [ -z "$weight" ] || echo $((weight * 1024 / 100)) > "$group/cpu.shares" 2>/dev/null || bad "cannot set $group/cpu.shares"
  fi
  echo $$ > "$group/cgroup.procs" 2>/dev/null || bad "cannot move into $group"
}

# EXIT: the child stopped (bounded), this script moved out, leftovers stopped, the cgroup gone.
finish() {
  local rc=$? pids i
  trap '' HUP INT TERM USR1 USR2
  if [ -n "$child" ] && kill -0 "$child" 2>/dev/null; then
    kill -TERM "$child" 2>/dev/null
    for ((i = 0; i < 10 * KILL_AFTER_S; i++)); do kill -0 "$child" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$child" 2>/dev/null
  fi
  [ -n "$group" ] || exit "$rc"
  echo $$ > "$home/cgroup.procs" 2>/dev/null || warn "could not move back to $home"
  for sig in TERM KILL; do  # what the program left behind in its cgroup
    pids=$(cat "$group/cgroup.procs" 2>/dev/null)
    [ -z "$pids" ] && break
    kill -"$sig" $pids 2>/dev/null
    for ((i = 0; i < 20; i++)); do [ -z "$(cat "$group/cgroup.procs" 2>/dev/null)" ] && break; sleep 0.1; done
  done
  for ((i = 0; i < 20; i++)); do rmdir "$group" 2>/dev/null && break; sleep 0.1; done
  [ ! -d "$group" ] || warn "could not remove $group (rank-cap.sh --cleanup removes it once empty)"
  exit "$rc"
}

forward() {
  [ -n "$signalled" ] || { signalled=$1; deadline=$((SECONDS + KILL_AFTER_S)); }
  [ -n "$child" ] && kill -s "$1" "$child" 2>/dev/null
}

main() {
  parse "$@"
  if [ $cleanup_mode = 1 ]; then
    cleanup_stale
    exit $?
  fi
  export DISTCA_WAIT=${DISTCA_WAIT:-sleep}
  trap finish EXIT
  for s in HUP INT TERM USR1 USR2; do trap "forward $s" "$s"; done
  make_group
  # A signal before the program starts: nothing to forward it to, so stop here.
  [ -z "$signalled" ] || exit $((128 + $(kill -l "$signalled")))
  local pre=() tie=()
  command -v setpriv > /dev/null && tie=(setpriv --pdeathsig KILL --)
  pre=("${tie[@]}")
  [ "$timeout_s" -gt 0 ] && pre+=(timeout -k "$KILL_AFTER_S" "$timeout_s" "${tie[@]}")
  # An asynchronous child starts with INT and QUIT ignored and stdin from /dev/null; give the
  # program the signals and this script's stdin.
  exec 3<&0
  ( trap - INT QUIT; exec "${pre[@]}" "${argv[@]}" ) <&3 3<&- &
  child=$!
  exec 3<&-
  [ -z "$signalled" ] || kill -s "$signalled" "$child" 2>/dev/null  # one that came as it started
  local rc r
  wait "$child"
  rc=$?
  # A forwarded signal ended the wait, not the child: poll until it exits (KILL at the deadline).
  while [ -n "$signalled" ] && [ "$rc" -gt 128 ]; do
    if ! kill -0 "$child" 2>/dev/null; then
      wait "$child"
      r=$?
      [ "$r" = 127 ] || rc=$r  # 127: the first wait already had its status
      break
    fi
    [ "$SECONDS" -lt "$deadline" ] || kill -KILL "$child" 2>/dev/null
    sleep 0.1
  done
  child=""
  exit "$rc"
}

main "$@"
