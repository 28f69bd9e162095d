#!/usr/bin/env bash
# cad pingpong against colocated over a slow link, with the tolerance chosen by the ping-pong
# timeline (`--tolerance auto`, docs/scheduler.md "Choosing the tolerance"): for each rate, a
# 2-host lab (scripts/netlab.sh, one rank per host), `distca profile --hardware-out` in it (the
# link the planner prices), then `distca bench train --tolerance auto --hardware PROFILE` and,
# beside it, the same at a fixed tolerance. Prints pingpong's paired speedup over colocated and
# its exposed share per run; OUT keeps every JSON and log. `--kv-once "on off"` runs each
# tolerance with each K/V-once setting (bench train --kv-once), in turn, `--repeats N` times
# (an A/B on a noisy machine: the pairs' ratios are printed per repeat). `--per-host 2` puts two
# ranks on each host (shared memory between them) and gives the cad modes `--ranks-per-host 2`
# (placement, K/V relays, the timeline per host); `--cap C` holds every rank to C cores
# (scripts/rank-cap.sh, inside a private mount namespace with the cgroup v1 cpu hierarchy
# mounted, since `ip netns exec` hides the cgroups); `--hardware FILE` plans with FILE instead
# of a profile measured in the lab.
#
# Usage: scripts/slowlink-bench.sh [--out DIR] [--rates "0.25gbit 1gbit"] [--tolerances "auto 0.05"]
#                                  [--kv-once "on off auto"] [--repeats N]
#                                  [--prefix P] [--train-args "ARGS"] [--distca PATH]
#                                  [--per-host K] [--cap C] [--hardware FILE]
# Always takes its lab down, also on failure or INT/TERM.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
out=slowlink-bench
rates="0.25gbit 1gbit"
tolerances="auto"
kv_once="on"
repeats=1
prefix=distca-slow
train_args="--tokens-per-rank 8192 --rounds 2 --steps 3"
distca=$here/../build/release/apps/distca
per_host=1
cap=""
hardware=""
bad() { echo "slowlink-bench: error: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=${2:?}; shift 2 ;;
    --rates) rates=${2:?}; shift 2 ;;
    --tolerances) tolerances=${2:?}; shift 2 ;;
    --kv-once) kv_once=${2:?}; shift 2 ;;
    --repeats) repeats=${2:?}; shift 2 ;;
    --prefix) prefix=${2:?}; shift 2 ;;
    --train-args) train_args=${2?}; shift 2 ;;
    --distca) distca=${2:?}; shift 2 ;;
    --per-host) per_host=${2:?}; shift 2 ;;
    --cap) cap=${2:?}; shift 2 ;;
    --hardware) hardware=${2:?}; shift 2 ;;
    *) bad "unknown argument $1" ;;
  esac
done
for t in $tolerances; do [[ $t =~ ^(auto|0(\.[0-9]+)?|1)$ ]] || bad "--tolerances: $t is not auto or a number from 0 to 1"; done
for k in $kv_once; do [[ $k =~ ^(on|off|auto)$ ]] || bad "--kv-once: $k is not on, off or auto"; done
[[ $repeats =~ ^[1-9][0-9]?$ ]] || bad "--repeats: $repeats is not a count from 1 to 99"
[[ $per_host =~ ^[1-8]$ ]] || bad "--per-host: $per_host is not a count from 1 to 8"
[ -z "$cap" ] || [[ $cap =~ ^(0\.[0-9]+|1)$ ]] || bad "--cap: $cap is not a share of a core in (0, 1]"
[ -z "$hardware" ] || [ -r "$hardware" ] || bad "--hardware: cannot read $hardware"
[ -x "$distca" ] || bad "no distca at $distca (cmake --build --preset release --target distca)"
LAB=$here/netlab.sh
mkdir -p "$out"
up=0
cleanup() { [ "$up" -eq 1 ] && "$LAB" down --prefix "$prefix" >/dev/null 2>&1; up=0; }
trap cleanup EXIT
trap 'exit 130' INT TERM
# shellcheck disable=SC1091
[ -f "$here/blas-env.sh" ] && . "$here/blas-env.sh"
export OMP_NUM_THREADS=1

for r in $rates; do
  "$LAB" up --prefix "$prefix" --hosts 2 --rate "$r"
  up=1
  # With --cap: a private mount namespace per rank, the v1 cpu hierarchy mounted where
  # rank-cap.sh looks (ip netns exec mounts a sysfs without cgroups), then rank-cap.sh.
  capped=()
  mpirun_args=""
  if [ -n "$cap" ]; then
    mpirun_args="--oversubscribe"  # idle ranks yield, as the capped scripts run them (docs/netlab.md)
    capped=(unshare -m --propagation private sh -c 'mount -t tmpfs none /sys/fs/cgroup && mkdir /sys/fs/cgroup/cpu &&
      mount -t cgroup -o cpu cgroup /sys/fs/cgroup/cpu && exec "$0" "$@"' "$here/rank-cap.sh" --cpus "$cap" --weight 10000 --)
  fi
  run() { "$LAB" run --prefix "$prefix" --per-host "$per_host" --btl tcp,vader,self --mpirun-args "$mpirun_args" -- \
            "${capped[@]}" "$distca" "$@"; }
  hosts=()
  [ "$per_host" -eq 1 ] || hosts=(--ranks-per-host "$per_host")
  hw=${hardware:-$out/profile-$r.json}
  [ -s "$hw" ] || run profile --hardware-out "$hw" --max-len 8192 --min-seconds 0.05 >"$out/profile-$r.log" 2>&1
  for i in $(seq 1 "$repeats"); do
    for t in $tolerances; do
      for k in $kv_once; do
        n=train-$r-t$t-kv$k-$i
        # shellcheck disable=SC2086
        [ -s "$out/$n.json" ] || run bench train --backend mpi $train_args --tolerance "$t" --kv-once "$k" "${hosts[@]}" \
          --hardware "$hw" --json "$out/$n.json" >"$out/$n.log" 2>&1 || echo "slowlink-bench: $n failed (see $out/$n.log)" >&2
      done
    done
  done
  cleanup
done

python3 "$here/slowlink_report.py" "$out" "$repeats" $rates -- $tolerances -- $kv_once
