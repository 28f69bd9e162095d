#!/usr/bin/env bash
# The issue's network table in pieces that each fit one quiet window (docs/netlab.md, "The
# sweep in pieces"): every piece is one scripts/netlab-bench.sh call into the same OUT with the
# same workload flags, so the pieces' runs make one results.md, a finished run is never run
# again, and an interrupted piece resumes where it stopped.
#
#   netlab-sweep.sh [--out DIR] [--estimate-only] [--deadline S] [--prefix P] [--distca PATH] PIECE...
#
# Pieces (2 hosts, K ranks per host; train = bench train with the lab's profile, the
# simulator beside every row; step = bench step):
#   auto    2 x 1 at 0.25, 1 and 2.5 Gbit/s: train at tolerance 0, 0.05, 0.15 and auto
#           (auto against the best fixed band; the tolerance's trade; the simulator)
#   auto3   the same at 0.5, 2.5 and 10 Gbit/s (issue 27's three rates for `--tolerance auto`;
#           its 2.5 Gbit/s runs are auto's, when that piece ran into the same OUT)
#   rates   2 x 1: train at 0.05 at 0.5 and 10 Gbit/s and shm (0.25, 1, 2.5: auto's rows);
#           step at 0.05 at every rate (exposed communication and single-stream's penalty
#           against the rate; the crossover)
#   hosts2  2 x 2 at 0.25 and 1 Gbit/s and shm: train and step at 0.05
#   more2   2 x 2 at 0.5, 2.5 and 10 Gbit/s: train and step at 0.05 (not needed for the
#           table's questions: the 2 x 2 rows between those of hosts2)
#   all     auto rates hosts2
# --estimate-only prints each piece's estimate (runs not yet done in OUT) and the total, and
# runs nothing. --deadline S stops each piece at S seconds (the same command resumes).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=netlab-sweep
extra=()
estimate_only=0
pieces=()
bad() { echo "netlab-sweep: error: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=${2:?}; shift 2 ;;
    --estimate-only) estimate_only=1; shift ;;
    --deadline | --prefix | --distca) extra+=("$1" "${2:?}"); shift 2 ;;
    -h | --help) sed -n '2,/^set -e/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//' >&2; exit 2 ;;
    all) pieces+=(auto rates hosts2); shift ;;
    auto | auto3 | rates | hosts2 | more2) pieces+=("$1"); shift ;;
    *) bad "unknown argument $1 (pieces: auto auto3 rates hosts2 more2 all)" ;;
  esac
done
[ "${#pieces[@]}" -gt 0 ] || bad "name a piece: auto auto3 rates hosts2 more2 all"

# One workload for every piece: bench train's small shapes (2 rounds x 2 steps, the first of
# each discarded: one timed step per mode and round, paired round by round) and bench step at
# its default shapes with one timed step per configuration.
common=(--out "$out" --train-args "--tokens-per-rank 4096 --rounds 2 --steps 2" --step-args "--reps 1")
total=0
# bench ARGS...: one netlab-bench.sh call of the current piece (or its estimate).
bench() {
  if [ "$estimate_only" -eq 1 ]; then
    local line s
    line=$("$here/netlab-bench.sh" "${common[@]}" "$@" "${extra[@]}" --estimate-only 2>&1 | head -n 1)
    s=$(echo "$line" | sed -n 's/.*estimated \([0-9]*\) s.*/\1/p')
    [ -n "$s" ] || { echo "netlab-sweep: $line" >&2; return 2; }
    echo "netlab-sweep: $piece: ${line#netlab-bench: }" | sed "s/ (.*//"
    total=$((total + s))
    return 0
  fi
  "$here/netlab-bench.sh" "${common[@]}" "$@" "${extra[@]}"
}
# The runs of each piece; names (train-RATE-2xK-tT, ...) are shared, so a row two pieces
# would both run is in one of them only.
run_piece() {
  case $1 in
    auto) bench --per-host 1 --rates "0.25gbit 1gbit 2.5gbit" --tolerances "0 0.05 0.15" --benches train \
      --auto-rates "0.25gbit 1gbit 2.5gbit" ;;
    auto3) bench --per-host 1 --rates "0.5gbit 2.5gbit 10gbit" --tolerances "0 0.05 0.15" --benches train \
      --auto-rates "0.5gbit 2.5gbit 10gbit" ;;
    rates)
      bench --per-host 1 --rates "0.5gbit 10gbit shm" --tolerances 0.05 --benches train --auto-rates "" &&
        bench --per-host 1 --rates "0.25gbit 0.5gbit 1gbit 2.5gbit 10gbit shm" --tolerances 0.05 --benches step ;;
    hosts2) bench --per-host 2 --rates "0.25gbit 1gbit shm" --tolerances 0.05 --auto-rates "" ;;
    more2) bench --per-host 2 --rates "0.5gbit 2.5gbit 10gbit" --tolerances 0.05 --auto-rates "" ;;
  esac
}

rc=0
for piece in "${pieces[@]}"; do
  [ "$estimate_only" -eq 1 ] || echo "netlab-sweep: piece $piece" >&2
  run_piece "$piece" || { rc=$?; echo "netlab-sweep: piece $piece stopped (exit $rc); the same command resumes" >&2; break; }
done
if [ "$estimate_only" -eq 1 ] && [ "$rc" -eq 0 ]; then
  echo "netlab-sweep: total estimated $total s ($((total / 60)) min) for: ${pieces[*]}"
fi
exit "$rc"
