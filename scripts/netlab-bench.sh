#!/usr/bin/env bash
# The measurement sweep of the network lab (docs/netlab.md, "The measurement sweep"): for each
# link rate (a lab of 2 hosts, scripts/netlab.sh) and shared memory (shm: one host), with K
# ranks per host, `distca profile --hardware-out` once, then `distca bench train` (colocated,
# cad single-stream, pingpong, signal; with the profile as its --hardware) and `distca bench
# step` at every tolerance, and at the --auto-rates `bench train --tolerance auto` beside them.
# Writes OUT/runs/NAME.{json,log,seconds} per run, OUT/runs/link-RATE.txt (the lab link's
# measured TCP throughput) and OUT/results.{md,json} (scripts/netlab_bench_report.py: one table).
# Prints its runtime estimate before it starts (and exits after it, making nothing, with
# --estimate-only).
#
#   netlab-bench.sh [--out DIR] [--rates "0.25gbit 0.5gbit 1gbit 2.5gbit 10gbit shm"]
#       [--per-host "1 2"] [--tolerances "0 0.05 0.15"] [--auto-rates "0.25gbit 1gbit 2.5gbit"]
#       [--benches "train step"] [--no-profile] [--smoke | --full-size] [--train-args ARGS]
#       [--step-args ARGS] [--profile-args ARGS] [--btl LIST] [--run-timeout S] [--deadline S]
#       [--budget S] [--gflops G] [--estimate-only] [--prefix P] [--distca PATH]
#
# The default train args are small (--tokens-per-rank 4096 --rounds 2 --steps 2), so the whole
# table fits a few hours; --full-size runs bench train's default workload instead. The
# profile's args default to the train args' shapes (--max-len their longest document, their
# --width). scripts/netlab-sweep.sh runs the table in pieces of under an hour. --budget S
# refuses (exit 2, before any work) a sweep whose estimate exceeds S seconds and bounds it by S
# (as --deadline); --gflops sets the estimate's compute rate per rank (default 75).
#
# Resumable: a run whose JSON exists is not run again (delete it to redo); a failed run leaves
# NAME.failed and NAME.log and is tried again next time. Bounded: every run is stopped after
# --run-timeout seconds (default 3600), and no run goes past --deadline seconds from the start
# (default none); what is left is listed as missing and runs on the next call. --smoke uses the
# smallest shapes, to check the sweep works (not to measure). Exit 77: namespaces not permitted.
set -Eeuo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LAB=$ROOT/scripts/netlab.sh

out=netlab-bench
rates="0.25gbit 0.5gbit 1gbit 2.5gbit 10gbit shm"
per_host="1 2"
tolerances="0 0.05 0.15"
benches="train step"
profile=1
train_args="--tokens-per-rank 4096 --rounds 2 --steps 2"
step_args=""
profile_args=""  # none given: from the train args (profile_args_for)
auto_rates="0.25gbit 1gbit 2.5gbit"
budget=0
gflops=75
estimate_only=0
btl=tcp,vader,self
run_timeout=3600
deadline=0
prefix="nb$$"  # one lab per sweep: two sweeps (or a sweep and a test) never share one
distca=$ROOT/build/release/apps/distca
link_mb=0  # the link measurement's megabytes; 0: about 2 s of traffic at the rate
lab_up=0
child=""

bad() { echo "netlab-bench: error: $*" >&2; exit 2; }
say() { echo "netlab-bench: $*" >&2; }

while [ $# -gt 0 ]; do
  case $1 in
    --out) out=${2:?}; shift 2 ;;
    --rates) rates=${2:?}; shift 2 ;;
    --per-host) per_host=${2:?}; shift 2 ;;
    --tolerances) tolerances=${2:?}; shift 2 ;;
    --auto-rates) auto_rates=${2?}; shift 2 ;;
    --full-size) train_args=""; shift ;;
    --budget) budget=${2:?}; shift 2 ;;
    --gflops) gflops=${2:?}; shift 2 ;;
    --estimate-only) estimate_only=1; shift ;;
    --benches) benches=${2:?}; shift 2 ;;
    --no-profile) profile=0; shift ;;
    --smoke)
      train_args="--tokens-per-rank 256 --width 64 --layers 1 --short-doc 32 --rounds 1 --steps 2"
      step_args="--long-doc 1024 --short-doc 64 --reps 1 --layers 1 --linear-width 64"
      profile_args="--width 64 --max-len 256 --min-len 128 --repeats 1 --min-seconds 0 --tokens 256 --gemm-repeats 1 --link-repeats 2"
      link_mb=16
      shift ;;
    --train-args) train_args=${2?}; shift 2 ;;
    --step-args) step_args=${2?}; shift 2 ;;
    --profile-args) profile_args=${2?}; shift 2 ;;
    --btl) btl=${2:?}; shift 2 ;;
    --run-timeout) run_timeout=${2:?}; shift 2 ;;
    --deadline) deadline=${2:?}; shift 2 ;;
    --prefix) prefix=${2:?}; shift 2 ;;
    --distca) distca=${2:?}; shift 2 ;;
    -h | --help) sed -n '2,/^set -E/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//' >&2; exit 2 ;;
    *) bad "unknown option $1" ;;
  esac
done
# The profile's shapes follow the train args': its attention table must reach the longest
# document (beyond its grid the table extrapolates at peak throughput, which under-prices a
# longer document) and its GEMMs the model's width.
profile_args_for() {
  local args tokens=8192 long=0 width="" i
  read -r -a args <<<"$1"
  for ((i = 0; i + 1 < ${#args[@]}; i++)); do
    case ${args[i]} in
      --tokens-per-rank) tokens=${args[i + 1]} ;;
      --long-doc) long=${args[i + 1]} ;;
      --width) width=${args[i + 1]} ;;
    esac
  done
  [[ $long =~ ^[0-9]+$ && $tokens =~ ^[0-9]+$ ]] && [ "$long" -gt "$tokens" ] && tokens=$long
  echo "--max-len $tokens --min-seconds 0.05${width:+ --width $width}"
}
[ -n "$profile_args" ] || profile_args=$(profile_args_for "$train_args")
for r in $rates; do
  [[ $r == shm || $r =~ ^[0-9]+(\.[0-9]+)?(kbit|mbit|gbit)$ ]] || bad "--rates: $r is not a rate like 250mbit or 2.5gbit, nor shm"
done
for r in $auto_rates; do  # rates not in --rates are not run
  [[ $r =~ ^[0-9]+(\.[0-9]+)?(kbit|mbit|gbit)$ ]] || bad "--auto-rates: $r is not a lab rate like 250mbit or 2.5gbit"
done
[[ $budget =~ ^[0-9]+$ ]] || bad "--budget $budget: a number of seconds (0: none)"
[[ $gflops =~ ^[0-9]+(\.[0-9]+)?$ ]] && [ "$gflops" != 0 ] || bad "--gflops $gflops: a positive number"
for k in $per_host; do [[ $k =~ ^[1-8]$ ]] || bad "--per-host: $k is not 1 to 8"; done
for t in $tolerances; do [[ $t =~ ^(0(\.[0-9]+)?|1)$ ]] || bad "--tolerances: $t is not a number from 0 to 1"; done
for b in $benches; do [[ $b == train || $b == step ]] || bad "--benches: $b is not train or step"; done
[[ $run_timeout =~ ^[1-9][0-9]*$ ]] || bad "--run-timeout $run_timeout: a positive number of seconds"
[[ $deadline =~ ^[0-9]+$ ]] || bad "--deadline $deadline: a number of seconds (0: none)"
[ -x "$distca" ] || bad "--distca $distca: not an executable (cmake --build --preset release --target distca)"
command -v python3 >/dev/null || bad "python3 is needed for the report"

runs=$out/runs
cfg_tmp=$(mktemp)  # the plan, moved to OUT/config.json once the estimate is within --budget
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
# shellcheck source=scripts/blas-env.sh
. "$ROOT/scripts/blas-env.sh"

# shellcheck disable=SC2317  # called by the trap
cleanup() {
  local rc=$?
  set +e  # a failing command here must not end the cleanup
  trap - EXIT INT TERM
  [ -n "$child" ] && kill -TERM "$child" 2>/dev/null && wait "$child" 2>/dev/null
  [ "$lab_up" -eq 1 ] && "$LAB" down --prefix "$prefix" 2>/dev/null
  rm -f "$runs"/*.tmp.json "$runs"/*.txt.tmp "$cfg_tmp"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Whether rate $1 gets a `--tolerance auto` train run (it needs the lab's profile).
with_auto() { [ "$profile" -eq 1 ] && [[ $benches == *train* ]] && [[ " $auto_rates " == *" $1 "* ]]; }

# Every run this call plans, by name (the report lists the ones without results).
planned=()
for r in $rates; do
  for k in $per_host; do
    [ "$profile" -eq 1 ] && [[ $benches == *train* ]] && planned+=("profile-$r-2x$k")
    for t in $tolerances; do
      for b in $benches; do planned+=("$b-$r-2x$k-t$t"); done
    done
    if with_auto "$r"; then planned+=("train-$r-2x$k-tauto"); fi
  done
done
python3 - "$cfg_tmp" "$btl" "$train_args" "$step_args" "$profile_args" "$distca" \
  "$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)" "${OPENBLAS_CORETYPE:-}" "$gflops" "${planned[@]}" <<'PY'
import json, os, sys, time
path, btl, train, step, prof, distca, commit, blas, gflops, *planned = sys.argv[1:]
doc = {"btl_lab": btl, "btl_host": "vader,self", "train_args": train, "step_args": step, "profile_args": prof,
       "distca": distca, "commit": commit, "openblas_coretype": blas, "cores": os.cpu_count(),
       "gflops_per_rank": float(gflops),
       "load_average_at_start": os.getloadavg(), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
       "bind": "none", "omp_threads": 1, "planned": planned}
with open(path + ".tmp", "w") as f:
    json.dump(doc, f, indent=1)
os.replace(path + ".tmp", path)
PY
estimate=$(python3 "$ROOT/scripts/netlab_bench_report.py" --estimate "$cfg_tmp" "$out")
echo "$estimate" | head -n 1 >&2
estimate_s=$(echo "$estimate" | sed -n 's/^estimate_s=//p')
[ "$estimate_only" -eq 1 ] && exit 0
if [ "$budget" -gt 0 ]; then
  [ "$estimate_s" -le "$budget" ] || bad "--budget $budget: the estimate is $estimate_s s (smaller --train-args, fewer --rates or --per-host)"
  { [ "$deadline" -eq 0 ] || [ "$deadline" -gt "$budget" ]; } && deadline=$budget
fi
mkdir -p "$runs"
mv "$cfg_tmp" "$out/config.json"

# run_one NAME OUTPUT-FLAG LAUNCHER... -- DISTCA-ARGS...: runs distca under the launcher, its
# output (--json, or profile's --hardware-out) into runs/NAME.json when it succeeds. Returns 1
# when the deadline has passed.
run_one() {
  local name=$1 flag=$2 launcher=() limit rc=0
  shift 2
  while [ "$1" != -- ]; do launcher+=("$1"); shift; done
  shift
  [ -e "$runs/$name.json" ] && { say "$name: done before, kept"; return 0; }
  limit=$run_timeout
  if [ "$deadline" -gt 0 ]; then
    [ "$SECONDS" -lt "$deadline" ] || { say "$name: past the deadline, not run"; return 1; }
    [ $((deadline - SECONDS)) -lt "$limit" ] && limit=$((deadline - SECONDS))
  fi
  rm -f "$runs/$name.failed" "$runs/$name.tmp.json"
  say "$name: running (at most ${limit} s)"
  local began=$SECONDS
  timeout "$limit" "${launcher[@]}" "$distca" "$@" "$flag" "$runs/$name.tmp.json" >"$runs/$name.log" 2>&1 &
  child=$!
  wait "$child" || rc=$?
  child=""
  echo $((SECONDS - began)) >"$runs/$name.seconds"
  if [ "$rc" -eq 0 ] && [ -s "$runs/$name.tmp.json" ]; then
    mv "$runs/$name.tmp.json" "$runs/$name.json"
  else
    rm -f "$runs/$name.tmp.json"
    if [ "$rc" -eq 124 ]; then
      echo "stopped after $limit s" >"$runs/$name.failed"
    else
      echo "exit $rc: $(tail -n 1 "$runs/$name.log")" >"$runs/$name.failed"
    fi
    say "$name: failed ($(cat "$runs/$name.failed")); log $runs/$name.log"
  fi
  return 0
}

# sweep_layout RATE K LAUNCHER...: the profile and the benchmarks of one rate and layout.
sweep_layout() {
  local r=$1 k=$2 hw=() t
  shift 2
  # The model shapes of the profile are bench train's (its defaults, or --smoke's).
  if [ "$profile" -eq 1 ] && [[ $benches == *train* ]]; then
    # shellcheck disable=SC2086
    run_one "profile-$r-2x$k" --hardware-out "$@" -- profile $profile_args || return 1
    [ -e "$runs/profile-$r-2x$k.json" ] && hw=(--hardware "$runs/profile-$r-2x$k.json")
  fi
  for t in $tolerances; do
    if [[ $benches == *train* ]]; then
      # shellcheck disable=SC2086
      run_one "train-$r-2x$k-t$t" --json "$@" -- bench train --backend mpi $train_args --tolerance "$t" "${hw[@]}" || return 1
    fi
    if [[ $benches == *step* ]]; then
      # shellcheck disable=SC2086
      run_one "step-$r-2x$k-t$t" --json "$@" -- bench step --backend mpi $step_args --tolerance "$t" || return 1
    fi
  done
  if with_auto "$r" && [ "${#hw[@]}" -gt 0 ]; then
    # shellcheck disable=SC2086
    run_one "train-$r-2x$k-tauto" --json "$@" -- bench train --backend mpi $train_args --tolerance auto "${hw[@]}" || return 1
  fi
}

remaining() {
  local n
  for n in "${planned[@]}"; do [ -e "$runs/$n.json" ] || return 0; done
  return 1
}

for r in $rates; do
  todo=0
  for n in "${planned[@]}"; do [[ $n == *-$r-* ]] && [ ! -e "$runs/$n.json" ] && todo=1; done
  [ "$todo" -eq 1 ] || continue
  if [ "$r" = shm ]; then
    for k in $per_host; do
      sweep_layout shm "$k" mpirun --oversubscribe --allow-run-as-root -np $((2 * k)) --bind-to none \
        --mca btl vader,self || break 2
    done
    continue
  fi
  rc=0
  "$LAB" up --prefix "$prefix" --hosts 2 --rate "$r" || rc=$?
  [ "$rc" -eq 0 ] || { say "the lab did not come up at $r (exit $rc)"; exit "$rc"; }
  lab_up=1
  if [ ! -e "$runs/link-$r.txt" ]; then
    # About 2 s of traffic at the rate, 8 to 512 MB.
    mb=$(awk -v r="$r" 'BEGIN { n = r + 0; u = substr(r, length(r) - 3)
      m = (u == "kbit") ? 1e-3 : (u == "mbit") ? 1 : 1e3; v = int(n * m / 4); print (v < 8) ? 8 : (v > 512) ? 512 : v }')
    [ "$link_mb" -gt 0 ] && mb=$link_mb
    # One way, then both ways at once (as the profile measures its link figures).
    if timeout 300 "$LAB" measure --prefix "$prefix" --megabytes "$mb" >"$runs/link-$r.txt.tmp" &&
      timeout 300 "$LAB" measure --prefix "$prefix" --megabytes "$mb" --both >>"$runs/link-$r.txt.tmp"; then
      mv "$runs/link-$r.txt.tmp" "$runs/link-$r.txt"
    else
      say "the link measurement at $r failed"
    fi
    rm -f "$runs/link-$r.txt.tmp"
  fi
  stop=0
  for k in $per_host; do
    sweep_layout "$r" "$k" "$LAB" run --prefix "$prefix" --per-host "$k" --btl "$btl" || { stop=1; break; }
  done
  "$LAB" down --prefix "$prefix" 2>/dev/null
  lab_up=0
  [ "$stop" -eq 0 ] || break
done

python3 "$ROOT/scripts/netlab_bench_report.py" "$out"
if remaining; then say "not every run has results: run the same command again to resume"; exit 1; fi
