#!/usr/bin/env bash
# A network lab on one Linux machine (docs/netlab.md): H hosts, each a network namespace with
# one interface (lab0), joined through a bridge in a namespace of its own by veth pairs whose
# two ends are each limited to RATE by a tbf qdisc, so every host sends and receives at most
# RATE, as behind a NIC of that speed on a switch. Addresses (10.77.0.0/24) exist only inside
# the lab's namespaces; nothing is created in the root namespace.
#
#   netlab.sh up     [--prefix P] [--hosts H] [--rate R]   create the lab, write its hostfile
#   netlab.sh run    [--prefix P] [--per-host K] [--btl LIST] [--mpirun-args "ARGS"]
#                    [--up [--hosts H] [--rate R]] [--] PROGRAM [ARGS...]
#                    mpirun with K ranks on every host; --up brings a lab up first and down after
#   netlab.sh measure [--prefix P] [--megabytes N] [--both] TCP throughput host 0 -> host 1
#                                                            (--both: and host 1 -> 0 at once)
#   netlab.sh status [--prefix P]                            what the lab holds (exit 3: not up)
#   netlab.sh down   [--prefix P]                            remove the lab and its processes
#
# Exit status: 0 done; 2 bad usage; 77 network namespaces or tbf are not available here (one
# line says which; tests map it to SKIP); 1 any other failure; `run` passes on mpirun's status.
# Every failure path of `up`, `run` and `measure` (error, INT, TERM) removes what that call
# made; `run` also stops every process left in the lab's namespaces.
set -Eeuo pipefail

readonly SKIP_CODE=77
readonly NET=10.77.0           # host i is $NET.(i+1), the bridge $NET.254
readonly CIDR=$NET.0/24
SCRIPTS=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
readonly SCRIPTS

prefix=${DISTCA_NETLAB_PREFIX:-distca-lab}
hosts=2
rate=1gbit
per_host=1
btl=tcp,self
mpirun_args=""
megabytes=64
both=0
with_up=0
# What the traps clean up (globals: a trap may run after the function that set it returned).
failed_cmd=""
made=()
child_pid=""
measure_out=""

usage() {
  sed -n '2,/^set -E/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
  exit 2
}
# Whether $1 is an integer from $2 to $3.
in_range() { [[ $1 =~ ^[0-9]{1,6}$ ]] && [ "$1" -ge "$2" ] && [ "$1" -le "$3" ]; }
bad() { echo "netlab: error: $*" >&2; exit 2; }
say() { echo "netlab: $*" >&2; }

state_dir() { echo "/tmp/$prefix.netlab"; }
br_ns() { echo "$prefix-br"; }
host_ns() { echo "$prefix-h$1"; }

# The lab's namespaces that exist now (bridge and hosts), one a line.
lab_namespaces() {
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$prefix-(br|h[0-9]+)\$" || true
}

# Stops every process in the given namespaces: TERM, up to 5 s, then KILL.
stop_processes() {
  local ns pids i
  for i in $(seq 50); do
    pids=""
    for ns in "$@"; do
      pids+=" $(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')"
    done
    [ -z "${pids// /}" ] && return 0
    # shellcheck disable=SC2086
    if [ "$i" -lt 50 ]; then kill -TERM $pids 2>/dev/null || true; else kill -KILL $pids 2>/dev/null || true; fi
    sleep 0.1
  done
  # shellcheck disable=SC2086
  kill -KILL $pids 2>/dev/null || true
}

# Removes what Open MPI kept for the given namespaces' hosts: an orted stopped before it
# cleaned up leaves its session directory, named by the host's hostname (netlab-agent.sh).
remove_session_dirs() {
  local ns
  for ns in "$@"; do rm -rf "${TMPDIR:-/tmp}/ompi.$ns.$(id -u)"; done
}

# Removes the given namespaces (their veth ends and qdiscs go with them) and their processes.
remove_namespaces() {
  [ $# -eq 0 ] && return 0
  stop_processes "$@"
  remove_session_dirs "$@"
  local ns
  for ns in "$@"; do ip netns del "$ns" 2>/dev/null || true; done
}

parse_rate() {
  [[ $1 == unlimited || $1 =~ ^[0-9]+(\.[0-9]+)?(kbit|mbit|gbit)$ ]] ||
    bad "--rate $1: a rate like 250mbit, 0.5gbit or 10gbit, or unlimited"
}

# Bits per second of a tc rate (kbit, mbit, gbit are powers of 1000).
rate_bits() {
  awk -v r="$1" 'BEGIN { n = r + 0; u = substr(r, length(r) - 3)
    m = (u == "kbit") ? 1e3 : (u == "mbit") ? 1e6 : 1e9; printf "%.0f\n", n * m }'
}

# tbf on DEV in namespace NS at $rate. The bucket holds 1 ms of traffic, at least 128 KiB;
# 20 ms of queue before drops. The floor keeps veth's large (GSO) packets whole: tbf counts a
# 64 KiB GSO packet with every segment's headers (about 68 KiB) and cuts a packet longer than
# its bucket into MTU-sized ones, which cost the receiving host ten times the CPU per byte
# (measured: 0.5-0.9 s of softirq per 64 MiB at 0.25-0.5 Gbit/s with a 64 KiB bucket, 0.03-0.05
# s with 96 or 128 KiB; the rate carried the same), a cost no NIC with segmentation offload has.
limit_link() {
  local ns=$1 dev=$2 burst
  [ "$rate" = unlimited ] && return 0
  burst=$(( $(rate_bits "$rate") / 8000 ))
  [ "$burst" -lt 131072 ] && burst=131072
  tc -n "$ns" qdisc add dev "$dev" root tbf rate "$rate" burst "$burst" latency 20ms
}

cmd_up() {
  [ "$(lab_namespaces)" = "" ] || { say "lab $prefix is already up (netlab.sh down --prefix $prefix)"; exit 1; }
  if ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
    say "skipped: ip and tc (iproute2) are not installed"
    exit "$SKIP_CODE"
  fi
  local dir br ns i err
  dir=$(state_dir)
  br=$(br_ns)
  # shellcheck disable=SC2317  # called by the trap
  undo_up() {
    local rc=$?
    set +e  # a failing command here must not end the cleanup
    trap - EXIT INT TERM ERR
    if [ "$rc" -ne 0 ]; then
      [ -n "$failed_cmd" ] && say "up failed at: $failed_cmd"
      remove_namespaces "${made[@]}"
      rm -rf "$(state_dir)"
    fi
    exit "$rc"
  }
  trap undo_up EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  trap 'failed_cmd=$BASH_COMMAND' ERR
  if ! err=$(ip netns add "$br" 2>&1); then
    failed_cmd=""
    [[ $err == *"File exists"* ]] && { say "lab $prefix is already up (netlab.sh down --prefix $prefix)"; exit 1; }
    say "skipped: network namespaces are not permitted here (ip netns add: ${err//$'\n'/ })"
    exit "$SKIP_CODE"
  fi
  made+=("$br")
  rm -rf "$dir"
  mkdir -p "$dir"
  ip -n "$br" link set lo up
  ip -n "$br" link add br0 type bridge
  ip -n "$br" addr add "$NET.254/24" dev br0
  ip -n "$br" link set br0 up
  : >"$dir/hostfile.tmp"
  for ((i = 0; i < hosts; i++)); do
    ns=$(host_ns "$i")
    ip netns add "$ns"
    made+=("$ns")
    ip -n "$ns" link set lo up
    # Both ends are created from inside the namespaces: h$i in the bridge's, lab0 in the host's.
    ip -n "$br" link add "h$i" type veth peer name lab0 netns "$ns"
    ip -n "$br" link set "h$i" master br0 up
    ip -n "$ns" addr add "$NET.$((i + 1))/24" dev lab0
    ip -n "$ns" link set lab0 up
    if ! err=$(limit_link "$br" "h$i" 2>&1); then
      failed_cmd=""
      say "skipped: tc cannot add a tbf qdisc here (${err//$'\n'/ })"
      exit "$SKIP_CODE"
    fi
    limit_link "$ns" lab0
    echo "$ns slots=1" >>"$dir/hostfile.tmp"
  done
  printf 'prefix=%s\nhosts=%s\nrate=%s\n' "$prefix" "$hosts" "$rate" >"$dir/lab.env.tmp"
  mv "$dir/hostfile.tmp" "$dir/hostfile"
  mv "$dir/lab.env.tmp" "$dir/lab.env"
  say "up: $hosts hosts $(host_ns 0)..$(host_ns $((hosts - 1))) ($NET.1-$NET.$hosts) at $rate per host;" \
    "hostfile $dir/hostfile"
}

# Reads the lab's state (hosts, rate) or says it is not up.
load_lab() {
  local dir
  dir=$(state_dir)
  if [ ! -r "$dir/lab.env" ] || [ ! -e "/run/netns/$(br_ns)" ]; then
    say "lab $prefix is not up (netlab.sh up --prefix $prefix)"
    exit 1
  fi
  hosts=$(sed -n 's/^hosts=//p' "$dir/lab.env")
  rate=$(sed -n 's/^rate=//p' "$dir/lab.env")
}

cmd_run() {
  [ $# -gt 0 ] || bad "run: no program (netlab.sh run [options] -- PROGRAM [ARGS...])"
  local dir br hostfile rc=0
  if [ "$with_up" -eq 1 ] && [ "$(lab_namespaces)" != "" ]; then
    say "lab $prefix is already up: run without --up, or take it down first"
    exit 1
  fi
  # shellcheck disable=SC2317  # called by the trap
  end_run() {
    local rc=$?
    set +e  # a failing command here must not end the cleanup
    trap - EXIT INT TERM ERR
    [ -n "$child_pid" ] && kill -TERM "$child_pid" 2>/dev/null
    if [ "$with_up" -eq 1 ]; then
      "$BASH" "$SCRIPTS/netlab.sh" down --prefix "$prefix" 2>/dev/null || true
    else
      mapfile -t lab < <(lab_namespaces)
      [ "${#lab[@]}" -gt 0 ] && stop_processes "${lab[@]}" && remove_session_dirs "${lab[@]}"
    fi
    exit "$rc"
  }
  trap end_run EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  # From here the lab is this call's to remove (--up): a signal during `up` lands after it.
  [ "$with_up" -eq 1 ] && "$BASH" "$SCRIPTS/netlab.sh" up --prefix "$prefix" --hosts "$hosts" --rate "$rate"
  load_lab
  dir=$(state_dir)
  br=$(br_ns)
  hostfile=$dir/hostfile.$per_host
  sed "s/slots=1\$/slots=$per_host/" "$dir/hostfile" >"$hostfile"
  local root=()
  [ "$(id -u)" -eq 0 ] && root=(--allow-run-as-root)
  # mpirun runs in the bridge's namespace, so every rank is on a lab host behind its link.
  # --bind-to none: the hosts share the machine's cores, and each orted would bind its ranks
  # from core 0. No tree spawn: only mpirun launches orteds.
  # shellcheck disable=SC2086
  DISTCA_NETLAB=$prefix OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} \
    ip netns exec "$br" mpirun "${root[@]}" --hostfile "$hostfile" -np $((hosts * per_host)) \
    --map-by slot --bind-to none \
    --mca plm_rsh_agent "$SCRIPTS/netlab-agent.sh" --mca plm_rsh_no_tree_spawn 1 \
    --mca btl "$btl" --mca btl_tcp_if_include "$CIDR" --mca oob_tcp_if_include "$CIDR" \
    $mpirun_args "$@" &
  child_pid=$!
  wait "$child_pid" || rc=$?
  child_pid=""
  exit "$rc"
}

cmd_measure() {
  load_lab
  [ "$hosts" -ge 2 ] || bad "measure needs 2 hosts"
  measure_out=$(mktemp)
  # shellcheck disable=SC2317  # called by the trap
  end_measure() {
    local rc=$?
    set +e  # a failing command here must not end the cleanup
    trap - EXIT INT TERM ERR
    # shellcheck disable=SC2086  # the receivers' and senders' pids
    [ -n "$child_pid" ] && kill -TERM $child_pid 2>/dev/null
    # Interrupted or failed: the sender and the receiver go too.
    [ "$rc" -ne 0 ] && stop_processes "$(host_ns 0)" "$(host_ns 1)"
    rm -f "$measure_out" "$measure_out".*
    exit "$rc"
  }
  trap end_measure EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  # Host 1 receives until EOF and reports the bytes and the seconds from the first to the last;
  # with --both host 0 receives from host 1 at the same time (both directions of the links).
  local dirs=("0 1") d from to bytes seconds pids=()
  [ "$both" -eq 1 ] && dirs+=("1 0")
  for d in "${dirs[@]}"; do
    read -r from to <<<"$d"
    ip netns exec "$(host_ns "$to")" timeout 120 python3 -c '
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 5201)); s.listen(1)
c, _ = s.accept(); n = 0; t0 = None
while True:
    b = c.recv(1 << 20)
    if not b: break
    if t0 is None: t0 = time.perf_counter()
    n += len(b)
print(n, time.perf_counter() - t0)' "$NET.$((to + 1))" >"$measure_out.$from" &
    pids+=($!)
  done
  child_pid=${pids[*]}
  for d in "${dirs[@]}"; do
    read -r from to <<<"$d"
    ip netns exec "$(host_ns "$from")" timeout 120 python3 -c '
import socket, sys, time
for _ in range(100):
    try:
        s = socket.create_connection((sys.argv[1], 5201)); break
    except OSError: time.sleep(0.05)
else: sys.exit("netlab: measure: host %s did not listen" % sys.argv[3])
buf = bytes(1 << 20)
for _ in range(int(sys.argv[2])): s.sendall(buf)
s.close()' "$NET.$((to + 1))" "$megabytes" "$to" &
    pids+=($!)
  done
  for d in "${pids[@]}"; do wait "$d"; done  # each one's status (set -e: a failure ends here)
  child_pid=""
  for d in "${dirs[@]}"; do
    read -r from to <<<"$d"
    read -r bytes seconds <"$measure_out.$from"
    awk -v b="$bytes" -v s="$seconds" -v r="$rate" -v p="$prefix" -v f="$from" -v t="$to" -v w="$both" 'BEGIN {
      printf "netlab: measured %s-h%d -> h%d%s: %.1f MB in %.3f s = %.0f Mbit/s (limit %s)\n", p, f, t,
        w ? " (both directions at once)" : "", b / 1e6, s, b * 8 / s / 1e6, r
      printf "measured_mbit_per_s%s=%.1f\n", w ? "_h" f "_h" t : "", b * 8 / s / 1e6 }'
  done
}

cmd_status() {
  mapfile -t lab < <(lab_namespaces)
  if [ "${#lab[@]}" -eq 0 ]; then
    echo "netlab: lab $prefix is not up"
    exit 3
  fi
  local ns
  for ns in "${lab[@]}"; do
    if [[ $ns == *-br ]]; then
      echo "$ns: bridge $NET.254, ports $(ip -n "$ns" -o link show master br0 | awk -F': ' '{print $2}' | cut -d@ -f1 | tr '\n' ' ')"
    else
      echo "$ns: $(ip -n "$ns" -o -4 addr show dev lab0 | awk '{print $4}')" \
        "$(tc -n "$ns" qdisc show dev lab0 | head -1)"
    fi
    echo "  processes: $(ip netns pids "$ns" | wc -l)"
  done
  [ -r "$(state_dir)/hostfile" ] && echo "hostfile: $(state_dir)/hostfile"
  return 0
}

cmd_down() {
  mapfile -t lab < <(lab_namespaces)
  remove_namespaces "${lab[@]}"
  rm -rf "$(state_dir)"
  say "down: removed ${#lab[@]} namespaces of lab $prefix"
}

main() {
  [ $# -ge 1 ] || usage
  local cmd=$1
  shift
  case $cmd in up | run | measure | status | down) ;; -h | --help) usage ;; *) bad "unknown command $cmd" ;; esac
  while [ $# -gt 0 ]; do
    case $1 in
      --prefix) prefix=${2:?--prefix needs a value}; shift 2 ;;
      --hosts) hosts=${2:?--hosts needs a value}; shift 2 ;;
      --rate) rate=${2:?--rate needs a value}; shift 2 ;;
      --per-host) per_host=${2:?--per-host needs a value}; shift 2 ;;
      --btl) btl=${2:?--btl needs a value}; shift 2 ;;
      --mpirun-args) mpirun_args=${2?--mpirun-args needs a value}; shift 2 ;;
      --megabytes) megabytes=${2:?--megabytes needs a value}; shift 2 ;;
      --both) both=1; shift ;;
      --up) with_up=1; shift ;;
      --) shift; break ;;
      -h | --help) usage ;;
      -*) bad "unknown option $1" ;;
      *) break ;;  # run's program
    esac
  done
  [[ $prefix =~ ^[A-Za-z][A-Za-z0-9_-]{0,30}$ ]] || bad "--prefix $prefix: a letter, then up to 30 letters, digits, - or _"
  in_range "$hosts" 2 64 || bad "--hosts $hosts: 2 to 64"
  in_range "$per_host" 1 64 || bad "--per-host $per_host: 1 to 64"
  in_range "$megabytes" 1 100000 || bad "--megabytes $megabytes: 1 to 100000"
  [[ $btl =~ ^[a-z,]+$ ]] || bad "--btl $btl: a comma-separated list like tcp,self or tcp,vader,self"
  parse_rate "$rate"
  [ "$cmd" = run ] || [ $# -eq 0 ] || bad "$cmd takes no program"
  "cmd_$cmd" "$@"
}

main "$@"
