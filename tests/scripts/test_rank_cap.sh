#!/usr/bin/env bash
# scripts/rank-cap.sh (docs/netlab.md, "Emulating devices with CPU caps"). Exit 77 (CTest's
# SKIP_RETURN_CODE) where no CPU cgroup is writable here; bad flags are checked first, anywhere.
#   test_rank_cap.sh SOURCE_DIR
# Checks: bad flags refused with one line and exit 2, nothing made; a spinning program capped at
# C cores uses at most C (CPU time / wall, within 10%) and is throttled by its cgroup, and at
# least half of what an uncapped spinner gets beside it (skipped, said so, when the machine
# gives an uncapped one under 1.5 C); a capped spinner beside an idle capped rank still gets at
# most its share; the program's exit status and death by signal come back; stdin and INT reach
# the program; DISTCA_WAIT reaches it as set, sleep when unset; a TERM to the wrapper stops the program; a program ignoring TERM is killed at
# the deadline; --timeout; a process the program left behind is stopped; a KILL of the wrapper
# takes the program with it and --cleanup then removes the stale cgroup. After each: no
# cgroup of this test's job id and no process carrying its mark.
set -uo pipefail
SRC=$(cd "${1:?usage: test_rank_cap.sh SOURCE_DIR}" && pwd)
CAP=$SRC/scripts/rank-cap.sh
PY=$(command -v /usr/bin/python3 || command -v python3)
export OMPI_MCA_ess_base_jobid=rcaptest$$  # names this test's cgroups distca-cap.rcaptest<pid>.*
unset PMIX_NAMESPACE OMPI_COMM_WORLD_RANK PMIX_RANK
M=(env DISTCA_RANK_CAP_TEST=$$)            # the mark of the programs this test runs
T=$(mktemp -d /tmp/rank-cap-test.XXXXXX)
FAILS=0
fail() { echo "FAIL: $*"; FAILS=$((FAILS + 1)); }
note() { echo "[${SECONDS}s] $*"; }
trap 'rm -rf "$T"' EXIT

groups_left() {
  find /sys/fs/cgroup -maxdepth 7 -type d -name "distca-cap.$OMPI_MCA_ess_base_jobid.*" 2>/dev/null
}
marked() { grep -lzx "DISTCA_RANK_CAP_TEST=$$" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3; }
# CONTEXT: no cgroup of this job and no marked process.
check_gone() {
  local left
  left=$(groups_left | tr '\n' ' ')
  [ -z "$left" ] || fail "$1: cgroups left: $left"
  left=$(marked | while read -r p; do ps -o pid=,args= -p "$p"; done)
  [ -z "$left" ] || fail "$1: processes left: $left"
}

# 1. Bad flags: exit 2, one line, nothing made (before any cgroup check).
for args in "" "--cpus 0 -- true" "--cpus abc -- true" "--cpus 0.5" "--cpus 0.5 --period-us 99 -- true" \
  "--cpus 0.1 --period-us 5000 -- true" "--cpus 0.5 --timeout x -- true" "--cpus 0.5 --weight 0 -- true" "--cleanup --cpus 1" "--cpus 0.5 --what -- true"; do
  # shellcheck disable=SC2086
  "$CAP" $args > "$T/out" 2> "$T/err"
  rc=$?
  [ $rc = 2 ] || fail "'$args': exit $rc, expected 2"
  [ "$(wc -l < "$T/err")" = 1 ] && grep -q '^rank-cap: error: ' "$T/err" || fail "'$args': not one error line: $(cat "$T/err")"
done
check_gone "bad flags"

# Skip where no CPU cgroup can be made here.
"$CAP" --cpus 0.5 -- "${M[@]}" true 2> "$T/err"
rc=$?
if [ $rc = 2 ]; then
  echo "SKIP: $(cat "$T/err")"
  exit 77
fi
[ $rc = 0 ] || fail "true under the cap: exit $rc"
# Every core here is a valid cap under mpirun's OMP_NUM_THREADS=1 (which nproc alone follows).
OMP_NUM_THREADS=1 "$CAP" --cpus "$(env -u OMP_NUM_THREADS nproc)" -- true || fail "--cpus of every core refused under OMP_NUM_THREADS=1"

# 2. Shares. The spinner prints its CPU time / wall over $2 s and its cgroup's nr_throttled.
cat > "$T/spin.py" << 'EOF'
import sys, time
wall = float(sys.argv[1])
t0, c0 = time.monotonic(), time.process_time()
while time.monotonic() - t0 < wall:
    pass
share = (time.process_time() - c0) / (time.monotonic() - t0)
throttled = -1
for line in open("/proc/self/cgroup"):
    hid, ctrl, path = line.rstrip("\n").split(":", 2)
    if "distca-cap." not in path:
        continue
    for mline in open("/proc/self/mounts"):
        f = mline.split()
        if (ctrl == "" and f[2] == "cgroup2") or ("cpu" in f[3].split(",") and f[2] == "cgroup"):
            try:
                stat = dict(l.split() for l in open(f[1] + path + "/cpu.stat"))
                throttled = int(stat["nr_throttled"])
            except OSError:
                continue
print("%.3f %d" % (share, throttled))
EOF
share_ok() {  # LABEL SHARE CAP: at most CAP (10% and 0.02 over allowed)
  awk -v s="$2" -v c="$3" 'BEGIN { exit !(s <= c * 1.1 + 0.02) }' || fail "$1: share $2 above the cap $3"
}
cap=0.3
"$PY" "$T/spin.py" 1.5 > "$T/free" &
free_pid=$!
read -r share throttled < <("$CAP" --cpus $cap -- "${M[@]}" "$PY" "$T/spin.py" 1.5)
wait $free_pid
read -r free _ < "$T/free"
note "capped at $cap: share $share, throttled $throttled times; an uncapped spinner beside it: $free"
share_ok "spinner" "$share" $cap
[ "${throttled:--1}" -gt 0 ] || fail "spinner: its cgroup shows no throttling ($throttled)"
if awk -v f="$free" -v c=$cap 'BEGIN { exit !(f >= 1.5 * c) }'; then
  awk -v s="$share" -v f="$free" -v c=$cap 'BEGIN { m = f < c ? f : c; exit !(s >= 0.5 * m) }' ||
    fail "spinner: share $share, under half of min(cap $cap, uncapped $free)"
else
  note "not checked: the lower bound (an uncapped spinner got $free, under 1.5 x $cap: the machine is loaded)"
fi
# An idle capped rank beside it gives it nothing.
"$CAP" --cpus 0.5 -- "${M[@]}" sleep 2 &
idle=$!
read -r share _ < <("$CAP" --cpus 0.5 -- "${M[@]}" "$PY" "$T/spin.py" 1)
wait $idle
note "capped at 0.5 beside an idle capped rank: share $share"
share_ok "spinner beside an idle rank" "$share" 0.5
check_gone "shares"

# 3. Exit status, signals, stdin.
"$CAP" --cpus 0.5 -- "${M[@]}" sh -c 'exit 7'
rc=$?
[ $rc = 7 ] || fail "exit 7 came back as $rc"
"$CAP" --cpus 0.5 -- "${M[@]}" sh -c 'kill -TERM $$'
rc=$?
[ $rc = 143 ] || fail "death by TERM came back as $rc, expected 143"
out=$(echo through | "$CAP" --cpus 0.5 -- "${M[@]}" cat)
[ "$out" = through ] || fail "stdin did not reach the program (got '$out')"
# DISTCA_WAIT: sleep for the program when unset or empty, passed on when set.
out=$(env -u DISTCA_WAIT "$CAP" --cpus 0.5 -- "${M[@]}" sh -c 'echo "$DISTCA_WAIT"')
[ "$out" = sleep ] || fail "DISTCA_WAIT unset: the program got '$out', expected sleep"
out=$(DISTCA_WAIT= "$CAP" --cpus 0.5 -- "${M[@]}" sh -c 'echo "$DISTCA_WAIT"')
[ "$out" = sleep ] || fail "DISTCA_WAIT empty: the program got '$out', expected sleep"
out=$(DISTCA_WAIT=spin "$CAP" --cpus 0.5 -- "${M[@]}" sh -c 'echo "$DISTCA_WAIT"')
[ "$out" = spin ] || fail "DISTCA_WAIT=spin: the program got '$out'"
"$CAP" --cpus 0.5 -- "${M[@]}" /no/such/program 2> /dev/null
rc=$?
[ $rc = 127 ] || [ $rc = 126 ] || fail "a missing program: exit $rc, expected 126 or 127"
check_gone "exit status"

# Waits (bounded) until a marked program runs.
started() { for _ in $(seq 100); do [ -n "$(marked)" ] && return; sleep 0.1; done; fail "$1: the program never started"; }

# 4. Signals to the wrapper: INT and TERM reach the program; an ignored TERM ends in KILL.
for sig in INT TERM; do
  # (INT back to its default: an asynchronous command of a script starts with it ignored)
  (trap - INT; exec "$CAP" --cpus 0.5 -- "${M[@]}" sleep 120) &
  w=$!
  started $sig
  kill -s $sig $w
  start=$SECONDS
  wait $w
  rc=$?
  [ $((SECONDS - start)) -le 30 ] || fail "$sig: the wrapper took $((SECONDS - start)) s to stop"
  [ $rc -gt 128 ] || fail "$sig: exit $rc, expected a death by signal"
  check_gone "$sig to the wrapper"
done
RANK_CAP_KILL_AFTER_S=1 "$CAP" --cpus 0.5 -- "${M[@]}" sh -c 'trap "" TERM; sleep 120; true' &
w=$!
started "ignored TERM"
kill -TERM $w
start=$SECONDS
wait $w
rc=$?
[ $((SECONDS - start)) -le 30 ] || fail "a program ignoring TERM: the wrapper took $((SECONDS - start)) s"
check_gone "a program ignoring TERM"
start=$SECONDS
"$CAP" --cpus 0.5 --timeout 1 -- "${M[@]}" sleep 120
rc=$?
[ $rc = 124 ] || fail "--timeout: exit $rc, expected 124"
[ $((SECONDS - start)) -le 30 ] || fail "--timeout 1 took $((SECONDS - start)) s"
check_gone "--timeout"

# 5. What the program leaves behind, and a KILL of the wrapper.
"$CAP" --cpus 0.5 -- "${M[@]}" sh -c 'sleep 120 & exit 0'
rc=$?
[ $rc = 0 ] || fail "a program leaving a process: exit $rc"
check_gone "a program leaving a process"
"$CAP" --cpus 0.5 -- "${M[@]}" sleep 120 2> /dev/null &
w=$!
started KILL
kill -KILL $w
wait $w 2> /dev/null
for _ in $(seq 50); do [ -z "$(marked)" ] && break; sleep 0.1; done
[ -n "$(groups_left)" ] || fail "KILL of the wrapper: expected its cgroup to be left for --cleanup"
"$CAP" --cleanup > "$T/cleanup"
rc=$?
[ $rc = 0 ] || fail "--cleanup: exit $rc: $(cat "$T/cleanup")"
check_gone "KILL of the wrapper, then --cleanup"

[ $FAILS = 0 ] && echo "PASS ($SECONDS s)" || echo "$FAILS failure(s)"
[ $FAILS = 0 ]
