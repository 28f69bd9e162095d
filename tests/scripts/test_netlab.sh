#!/usr/bin/env bash
# scripts/netlab.sh (docs/netlab.md), in a lab of its own (a unique --prefix). Exit 77 (CTest's
# SKIP_RETURN_CODE) where the lab cannot be made here: no network namespaces or no tbf.
# "Nothing left" is: no namespace, root namespace link or qdisc, state directory, Open MPI
# session directory of a lab host, or process with the lab's mark.
#   test_netlab.sh setup SOURCE_DIR
#     bad usage makes nothing; nothing is left after a failure and a TERM in the middle of `up`
#     (a stand-in tc first on PATH); an up lab adds nothing to the root namespace, its status
#     shows the links, `measure` (one direction, and both at once) stays under the link's
#     rate and arrives in large packets (tbf did not cut them), a second `up` is refused and
#     leaves it; nothing is left after `down`.
#   test_netlab.sh run SOURCE_DIR
#     no process is left in the lab after `run` of a program that does not exist, a rank
#     failing while the other runs, a rank leaving a process in a session of its own, and a
#     TERM to `run` while its ranks run; nothing is left after `down`, nor after `run --up`
#     with a failing program.
#   test_netlab.sh bench SOURCE_DIR DISTCA
#     scripts/netlab-bench.sh --smoke at one rate: a plan over --budget refused before any
#     work; the estimate printed first; results.{json,md} with every mode, the simulator beside
#     them, the link's measured throughput under its limit, the auto run against the fixed
#     tolerance; a second call runs nothing; a TERM in the middle of a run leaves nothing,
#     temporary files included. scripts/netlab-sweep.sh --estimate-only: the pieces'
#     estimates, their sum within an hour, nothing made; an unknown piece refused.
#   test_netlab.sh train SOURCE_DIR DISTCA MPIEXEC
#     a 2-host `distca train --backend mpi --mode cad` in the lab (over TCP, through the
#     rate-limited links, which carry its bytes) has the per-step losses, bit for bit, of the
#     same run over shared memory on one host.
set -uo pipefail
mode=${1:?usage: test_netlab.sh setup|run|bench|train SOURCE_DIR [DISTCA [MPIEXEC]]}
SRC=$(cd "${2:?usage: test_netlab.sh MODE SOURCE_DIR}" && pwd)
LAB=$SRC/scripts/netlab.sh
P=nlt$$$mode
T=$(mktemp -d "/tmp/netlab-test.XXXXXX")
FAILS=0
fail() { echo "FAIL: $*"; FAILS=$((FAILS + 1)); }
note() { echo "[${SECONDS}s] $*"; }
cleanup() { "$LAB" down --prefix "$P" >/dev/null 2>&1; rm -rf "$T"; }
trap cleanup EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1

root_links() { ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1 | sort; }
root_qdiscs() { tc qdisc show | sort; }
# Processes that carry the lab's mark (run exports DISTCA_NETLAB=PREFIX to mpirun and so to
# every orted and rank), wherever they run.
marked_processes() {
  grep -lzx "DISTCA_NETLAB=$P" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3
}
lab_processes() {
  local ns
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^$P-"); do ip netns pids "$ns"; done
}
# CONTEXT: nothing of the lab is left.
check_gone() {
  local left
  left=$(ip netns list | awk '{print $1}' | grep -E "^$P-" | tr '\n' ' ')
  [ -z "$left" ] || fail "$1: namespaces left: $left"
  left=$(comm -13 "$T/links.before" <(root_links) | tr '\n' ' ')
  [ -z "$left" ] || fail "$1: root namespace links left: $left"
  [ "$(root_qdiscs)" = "$(cat "$T/qdiscs.before")" ] || fail "$1: root namespace qdiscs changed"
  [ ! -e "/tmp/$P.netlab" ] || fail "$1: state directory /tmp/$P.netlab left"
  left=$(marked_processes | tr '\n' ' ')
  [ -z "$left" ] || fail "$1: processes left: $left"
  left=$(find /tmp -maxdepth 1 -name "ompi.$P-*" | tr '\n' ' ')
  [ -z "$left" ] || fail "$1: Open MPI session directories left: $left"
}
# up, mapping "not permitted here" to a skip of the whole test.
up_or_skip() {
  "$LAB" up --prefix "$P" "$@" 2>"$T/up.err"
  local rc=$?
  if [ "$rc" -eq 77 ]; then
    cat "$T/up.err"
    exit 77
  fi
  [ "$rc" -eq 0 ] || { cat "$T/up.err"; fail "up exited $rc"; exit 1; }
}
# Waits up to 30 s for at least N processes in the lab's namespaces.
wait_for_processes() {
  local _
  for _ in $(seq 300); do
    [ "$(lab_processes | wc -l)" -ge "$1" ] && return 0
    sleep 0.1
  done
  return 1
}

root_links >"$T/links.before"
root_qdiscs >"$T/qdiscs.before"

if [ "$mode" = train ]; then
  DISTCA=${3:?usage: test_netlab.sh train SOURCE_DIR DISTCA MPIEXEC}
  MPIEXEC=${4:?usage: test_netlab.sh train SOURCE_DIR DISTCA MPIEXEC}
  up_or_skip --hosts 2 --rate 1gbit
  cat >"$T/cfg.toml" <<'EOF'
tokens_per_rank = 128
dist = "uniform:16:384"
max_doc_len = 0
steps = 12
warmup = 3
[model_overrides]
n_layers = 2
hidden = 64
n_heads = 4
n_kv_heads = 2
head_dim = 16
ffn = 128
vocab = 64
EOF
  lab_bytes() { ip -n "$P-h0" -s -j link show lab0 | sed 's/.*"tx":{"bytes":\([0-9]*\).*/\1/'; }
  before=$(lab_bytes)
  args=(train --config "$T/cfg.toml" --backend mpi --mode cad)
  timeout 120 "$LAB" run --prefix "$P" -- "$DISTCA" "${args[@]}" --metrics "$T/lab.jsonl" >"$T/lab.log" 2>&1 ||
    { cat "$T/lab.log"; fail "the run in the lab failed"; }
  sent=$(($(lab_bytes) - before))
  timeout 120 "$MPIEXEC" --oversubscribe --allow-run-as-root -np 2 --mca btl vader,self \
    "$DISTCA" "${args[@]}" --metrics "$T/shm.jsonl" >"$T/shm.log" 2>&1 ||
    { cat "$T/shm.log"; fail "the shared-memory run failed"; }
  # cad's exchanges and the gradient all-reduce of 12 steps: several MB; mpirun's own traffic
  # is a few KB.
  [ "$sent" -gt 1000000 ] || fail "host 0's lab link sent only $sent bytes: the ranks did not talk through the lab"
  losses() { grep -o '"loss":[^,}]*' "$1" | cut -d: -f2; }
  [ "$(losses "$T/lab.jsonl" | wc -l)" -eq 12 ] || fail "the lab run wrote $(losses "$T/lab.jsonl" | wc -l) losses, not 12"
  # JSON prints doubles round-trip exact, so equal text is equal bits.
  diff <(losses "$T/shm.jsonl") <(losses "$T/lab.jsonl") || fail "losses differ between shared memory and the lab"
  "$LAB" down --prefix "$P" 2>/dev/null
  check_gone "train"
  echo "lab run: host 0 sent $sent bytes over its link; $FAILS failures"
  [ "$FAILS" -eq 0 ]
  exit
fi

if [ "$mode" = bench ]; then
  BENCH=$SRC/scripts/netlab-bench.sh
  args=(--smoke --rates 1gbit --per-host 1 --tolerances 0.05 --auto-rates 1gbit --out "$T/sweep" --prefix "$P"
        --distca "${3:?usage: test_netlab.sh bench SOURCE_DIR DISTCA}")
  note "sweep plan"
  # netlab-sweep.sh --estimate-only: each piece's netlab-bench calls' estimates and their sum,
  # and nothing made; an unknown piece refused with exit 2.
  SWEEP=$SRC/scripts/netlab-sweep.sh
  timeout 120 "$SWEEP" --out "$T/plan" --distca "$3" --estimate-only all >"$T/plan.log" 2>&1 ||
    fail "the sweep plan's estimate failed: $(cat "$T/plan.log")"
  python3 - "$T/plan.log" <<'PY' || fail "the sweep plan's estimate is not its pieces' sum: $(cat "$T/plan.log")"
import re, sys
text = open(sys.argv[1]).read()
parts = [int(s) for s in re.findall(r"^netlab-sweep: (?:auto|rates|hosts2): \d+ of \d+ runs to do, estimated (\d+) s$", text, re.M)]
[total] = [int(s) for s in re.findall(r"^netlab-sweep: total estimated (\d+) s \(\d+ min\) for: auto rates hosts2$", text, re.M)]
assert len(parts) == 4 and total == sum(parts) and total <= 3600, (parts, total)
PY
  [ ! -e "$T/plan" ] || fail "the sweep plan's estimate made $T/plan"
  timeout 30 "$SWEEP" --estimate-only bogus >/dev/null 2>&1
  [ $? -eq 2 ] || fail "an unknown piece was not refused with exit 2"
  note "budget"
  # A plan estimated above --budget is refused before any work: exit 2, one line, no output.
  timeout 60 "$BENCH" "${args[@]}" --budget 1 >"$T/bench.log" 2>&1
  rc=$?
  [ "$rc" -eq 2 ] || fail "--budget 1 exited $rc, not 2: $(cat "$T/bench.log")"
  grep -q '^netlab-bench: error: --budget 1: the estimate is [0-9]* s' "$T/bench.log" ||
    fail "--budget 1 did not say why: $(cat "$T/bench.log")"
  [ ! -e "$T/sweep" ] || fail "--budget 1 left $T/sweep"
  note "sweep"
  timeout 300 "$BENCH" "${args[@]}" >"$T/bench.log" 2>&1
  rc=$?
  if [ "$rc" -eq 77 ]; then grep 'netlab:' "$T/bench.log"; exit 77; fi
  [ "$rc" -eq 0 ] || { cat "$T/bench.log"; fail "the sweep exited $rc"; }
  python3 - "$T/sweep/results.json" <<'PY' || fail "results.json does not hold the sweep's runs"
import json, sys
runs = {r["name"]: r for r in json.load(open(sys.argv[1]))["runs"]}
doc = json.load(open(sys.argv[1]))
assert set(runs) == {"profile-1gbit-2x1", "train-1gbit-2x1-t0.05", "step-1gbit-2x1-t0.05",
                     "train-1gbit-2x1-tauto"}, runs.keys()
train, step = runs["train-1gbit-2x1-t0.05"], runs["step-1gbit-2x1-t0.05"]
assert all(r["run_seconds"] is not None for r in runs.values()), runs
auto = runs["train-1gbit-2x1-tauto"]
assert set(auto["step_s"]) == set(train["step_s"]), auto
# --tolerance auto against the one fixed tolerance, which is then the best.
[a] = doc["auto"]
assert a["best_fixed_tolerance"] == 0.05 and abs(a["auto_over_best"] - auto["step_s"]["cad pingpong"]
                                                  / train["step_s"]["cad pingpong"]) < 1e-12, a
assert doc["config"]["estimate_s"] > 0, doc["config"]
assert set(train["step_s"]) == {"colocated", "cad single-stream", "cad pingpong", "cad signal"}, train
assert set(train["sim_step_s"]) == set(train["step_s"]), train  # bench train ran with the lab's profile
assert {"colocated pingpong", "cad pingpong", "cad single-stream", "cad signal"} <= set(step["step_s"]), step
assert 0 < train["link_mbit"] <= 1000, train["link_mbit"]  # TCP payload through a 1gbit tbf
PY
  # One table: the fixed tolerance's row (train and step) and the auto row.
  [ "$(grep -c '^| 1gbit | [0-9-]* | 2x1 | ' "$T/sweep/results.md")" -eq 2 ] || fail "results.md does not have the 2 rows"
  # The simulator against both train runs, every mode; the link both ways beside the profile's.
  [ "$(grep -c '^| 1gbit | 2x1 | ' "$T/sweep/results.md")" -eq 8 ] || fail "results.md's simulator table lacks rows"
  grep -q '^Links, Mbit/s .*: 1gbit 2x1: [0-9]*, [0-9]*, [0-9]*, [0-9]*$' "$T/sweep/results.md" ||
    fail "results.md does not give the link's rates: $(grep '^Links' "$T/sweep/results.md")"
  grep -q '^netlab-bench: 4 of 4 runs to do, estimated [0-9]* s' "$T/bench.log" ||
    fail "the sweep did not print its estimate first: $(head -n 3 "$T/bench.log")"
  check_gone "sweep"
  note "resume"
  timeout 60 "$BENCH" "${args[@]}" >"$T/bench.log" 2>&1 || fail "the resumed sweep failed"
  grep -q 'running\|netlab: up' "$T/bench.log" && fail "the resumed sweep ran again: $(cat "$T/bench.log")"
  note "TERM"
  rm "$T/sweep/runs/train-1gbit-2x1-t0.05.json"
  "$BENCH" "${args[@]}" >"$T/bench.log" 2>&1 &
  bench_pid=$!
  wait_for_processes 3 || fail "the train run did not start within 30 s: $(cat "$T/bench.log")"
  kill -TERM "$bench_pid"
  wait "$bench_pid"
  rc=$?
  [ "$rc" -eq 143 ] || fail "the sweep sent TERM exited $rc, not 143"
  check_gone "the sweep sent TERM"
  [ -z "$(find "$T/sweep" -name '*.tmp*')" ] || fail "temporary files left: $(find "$T/sweep" -name '*.tmp*')"
  echo "$FAILS failures"
  [ "$FAILS" -eq 0 ]
  exit
fi

[ "$mode" = setup ] || [ "$mode" = run ] || { echo "unknown mode $mode"; exit 2; }

if [ "$mode" = setup ]; then
  note "bad usage"
  # Bad usage: exit 2 and nothing made.
  "$LAB" up --prefix "$P" --rate fast 2>/dev/null
  [ $? -eq 2 ] || fail "--rate fast was not refused with exit 2"
  "$LAB" up --prefix "bad/prefix" 2>/dev/null
  [ $? -eq 2 ] || fail "a prefix with / was not refused with exit 2"
  check_gone "bad usage"

  note "up with a failing tc"
  # A stand-in tc first on PATH: its 4th call (host 1's lab0 qdisc, the last, made by `up`
  # itself, not in a command substitution, so its parent is `up`) fails, or sends TERM to `up`
  # (FAKE_TC_TERM).
  mkdir -p "$T/bin"
  cat >"$T/bin/tc" <<EOF
#!/bin/sh
n=\$(cat "$T/tc-calls" 2>/dev/null || echo 0); n=\$((n + 1)); echo \$n >"$T/tc-calls"
if [ "\$1" = -n ] && [ \$n -eq 4 ]; then
  [ -n "\${FAKE_TC_TERM:-}" ] && { kill -TERM \$PPID; exit 0; }
  exit 1
fi
exec $(command -v tc) "\$@"
EOF
chmod +x "$T/bin/tc"
rm -f "$T/tc-calls"
PATH=$T/bin:$PATH "$LAB" up --prefix "$P" --hosts 2 2>"$T/up.err"
rc=$?
if [ "$rc" -eq 77 ]; then cat "$T/up.err"; exit 77; fi
[ "$rc" -eq 1 ] || fail "up with a failing tc exited $rc, not 1: $(cat "$T/up.err")"
[ "$(cat "$T/tc-calls")" -eq 4 ] || fail "the failing tc was called $(cat "$T/tc-calls") times, not 4"
check_gone "up with a failing tc"
rm -f "$T/tc-calls"
PATH=$T/bin:$PATH FAKE_TC_TERM=1 "$LAB" up --prefix "$P" --hosts 2 2>"$T/up.err"
rc=$?
[ "$rc" -eq 143 ] || fail "up sent TERM exited $rc, not 143: $(cat "$T/up.err")"
check_gone "up sent TERM"

note "up"
# A lab that is up has nothing in the root namespace.
up_or_skip --hosts 2 --rate 500mbit
[ -z "$(comm -13 "$T/links.before" <(root_links))" ] || fail "up added links to the root namespace"
[ "$(root_qdiscs)" = "$(cat "$T/qdiscs.before")" ] || fail "up changed the root namespace's qdiscs"
"$LAB" status --prefix "$P" >"$T/status" || fail "status of an up lab exited non-zero"
[ "$(grep -c 'tbf.*rate 500Mbit' "$T/status")" -eq 2 ] || fail "status does not show 2 links at 500Mbit: $(cat "$T/status")"
# The link limit holds: TCP payload from host 0 to host 1 stays under the 500 Mbit/s of the
# frames (an unlimited veth pair carries several Gbit/s).
rx_stat() { ip netns exec "$P-h1" cat "/sys/class/net/lab0/statistics/rx_$1"; }
rx0_bytes=$(rx_stat bytes) rx0_packets=$(rx_stat packets)
mbit=$(timeout 60 "$LAB" measure --prefix "$P" --megabytes 16 | sed -n 's/^measured_mbit_per_s=//p')
echo "measured at 500mbit: ${mbit:-nothing} Mbit/s"
awk -v m="${mbit:-0}" 'BEGIN { exit !(m > 0 && m <= 500) }' || fail "measured ${mbit:-nothing} Mbit/s through a 500mbit link"
# tbf passes veth's large (GSO) packets whole: host 1 receives them as they were sent, tens of
# KiB each (a bucket smaller than one cuts each into MTU-sized packets: ~1.5 KiB on average,
# ten times the CPU per byte; docs/netlab.md).
rx_bytes=$(($(rx_stat bytes) - rx0_bytes)) rx_packets=$(($(rx_stat packets) - rx0_packets))
echo "host 1 received $rx_bytes bytes in $rx_packets packets"
[ "$rx_packets" -gt 0 ] && [ $((rx_bytes / rx_packets)) -ge 16384 ] ||
  fail "host 1 received $rx_bytes bytes in $rx_packets packets: tbf cut the large packets"
# Both directions at once: each one's payload under the limit, and each one measured.
timeout 60 "$LAB" measure --prefix "$P" --megabytes 16 --both >"$T/both" || fail "measure --both failed"
for d in h0_h1 h1_h0; do
  m=$(sed -n "s/^measured_mbit_per_s_${d}=//p" "$T/both")
  awk -v m="${m:-0}" 'BEGIN { exit !(m > 0 && m <= 500) }' || fail "measure --both: ${d} ${m:-nothing} Mbit/s: $(cat "$T/both")"
done
"$LAB" up --prefix "$P" 2>/dev/null && fail "a second up of the same lab succeeded"
[ -e "/run/netns/$P-h0" ] || fail "a refused second up removed the lab"
note "down"
"$LAB" down --prefix "$P" 2>/dev/null || fail "down exited non-zero"
check_gone "down"
"$LAB" status --prefix "$P" >/dev/null
[ $? -eq 3 ] || fail "status of a lab that is down did not exit 3"
fi

if [ "$mode" = run ]; then
up_or_skip --hosts 2 --rate 500mbit
note "run: missing program"
# A program that does not exist.
timeout 60 "$LAB" run --prefix "$P" -- /nonexistent/program >"$T/run.log" 2>&1 && fail "run of a missing program succeeded"
[ -z "$(lab_processes)" ] || fail "processes left in the lab after a missing program: $(lab_processes | tr '\n' ' ')"
[ -z "$(marked_processes)" ] || fail "processes left after a missing program"

note "run: failing rank"
# Rank 1 fails while rank 0 sleeps: mpirun ends the job, run stops what is left.
# shellcheck disable=SC2016
timeout 60 "$LAB" run --prefix "$P" -- sh -c '[ "$OMPI_COMM_WORLD_RANK" = 1 ] && exit 3; exec sleep 300' \
  >"$T/run.log" 2>&1 && fail "run with a failing rank succeeded"
[ $? -eq 124 ] && fail "run with a failing rank did not end within 60 s"
[ -z "$(lab_processes)" ] || fail "processes left in the lab after a failing rank: $(lab_processes | tr '\n' ' ')"
[ -z "$(marked_processes)" ] || fail "processes left after a failing rank"

note "run: a rank leaves a process of its own session"
# shellcheck disable=SC2016
timeout 60 "$LAB" run --prefix "$P" -- sh -c 'setsid sleep 300 </dev/null >/dev/null 2>&1 & exit 0' \
  >"$T/run.log" 2>&1 || fail "run of a program that leaves a process behind failed: $(cat "$T/run.log")"
[ -z "$(lab_processes)" ] || fail "processes left in the lab after a detached process: $(lab_processes | tr '\n' ' ')"
[ -z "$(marked_processes)" ] || fail "processes left after a detached process"

note "run: TERM"
# TERM to run while both ranks sleep (mpirun in the bridge namespace, an orted and a rank in
# each host's: at least 5 processes).
"$LAB" run --prefix "$P" -- sleep 300 >"$T/run.log" 2>&1 &
run_pid=$!
wait_for_processes 5 || fail "the ranks did not start within 30 s: $(cat "$T/run.log")"
kill -TERM "$run_pid"
timeout 30 tail --pid="$run_pid" -f /dev/null || fail "run did not end within 30 s of TERM"
wait "$run_pid"
rc=$?
[ "$rc" -eq 143 ] || fail "run sent TERM exited $rc, not 143"
[ -z "$(lab_processes)" ] || fail "processes left in the lab after TERM to run: $(lab_processes | tr '\n' ' ')"
[ -z "$(marked_processes)" ] || fail "processes left after TERM to run"
[ -e "/run/netns/$P-h1" ] || fail "run without --up removed the lab"

"$LAB" down --prefix "$P" 2>/dev/null || fail "down exited non-zero"
check_gone "down after runs"

note "run --up"
# run --up: the lab exists for the run only, also when the program fails.
timeout 60 "$LAB" run --up --prefix "$P" --hosts 2 --rate 250mbit -- /nonexistent/program >"$T/run.log" 2>&1 &&
  fail "run --up of a missing program succeeded"
check_gone "run --up with a missing program"
fi

echo "$FAILS failures"
[ "$FAILS" -eq 0 ]
