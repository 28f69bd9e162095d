#!/usr/bin/env bash
# cad pingpong against colocated over a slow link, with the tolerance chosen by the ping-pong
# timeline (`--tolerance auto`, docs/scheduler.md "Choosing the tolerance"): for each rate, a
# 2-host lab (scripts/netlab.sh, one rank per host), `distca profile --hardware-out` in it (the
# link the planner prices), then `distca bench train --tolerance auto --hardware PROFILE` and,
# beside it, the same at a fixed tolerance. Prints pingpong's paired speedup over colocated and
# its exposed share per run; OUT keeps every JSON and log.
#
# Usage: scripts/slowlink-bench.sh [--out DIR] [--rates "0.25gbit 1gbit"] [--tolerances "auto 0.05"]
#                                  [--prefix P] [--train-args "ARGS"] [--distca PATH]
# Always takes its lab down, also on failure or INT/TERM.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
out=slowlink-bench
rates="0.25gbit 1gbit"
tolerances="auto"
prefix=distca-slow
train_args="--tokens-per-rank 8192 --rounds 2 --steps 3"
distca=$here/../build/release/apps/distca
bad() { echo "slowlink-bench: error: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=${2:?}; shift 2 ;;
    --rates) rates=${2:?}; shift 2 ;;
    --tolerances) tolerances=${2:?}; shift 2 ;;
    --prefix) prefix=${2:?}; shift 2 ;;
    --train-args) train_args=${2?}; shift 2 ;;
    --distca) distca=${2:?}; shift 2 ;;
    *) bad "unknown argument $1" ;;
  esac
done
for t in $tolerances; do [[ $t =~ ^(auto|0(\.[0-9]+)?|1)$ ]] || bad "--tolerances: $t is not auto or a number from 0 to 1"; done
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
  run() { "$LAB" run --prefix "$prefix" --per-host 1 --btl tcp,vader,self -- "$distca" "$@"; }
  hw=$out/profile-$r.json
  [ -s "$hw" ] || run profile --hardware-out "$hw" --max-len 8192 --min-seconds 0.05 >"$out/profile-$r.log" 2>&1
  for t in $tolerances; do
    j=$out/train-$r-t$t.json
    # shellcheck disable=SC2086
    [ -s "$j" ] || run bench train --backend mpi $train_args --tolerance "$t" --hardware "$hw" --json "$j" \
      >"$out/train-$r-t$t.log" 2>&1
  done
  cleanup
done

python3 - "$out" $rates -- $tolerances <<'PY'
import json, sys
out, rest = sys.argv[1], sys.argv[2:]
rates, tols = rest[:rest.index("--")], rest[rest.index("--") + 1:]
print("| link | tolerance | colocated s | pingpong s | signal s | pingpong x colocated (paired) | exposed (paired) |")
print("|---|---|---|---|---|---|---|")
for r in rates:
    for t in tols:
        try:
            j = json.load(open(f"{out}/train-{r}-t{t}.json"))
        except OSError:
            print(f"| {r} | {t} | missing: see {out}/train-{r}-t{t}.log |||||")
            continue
        m = {x["name"]: x["median_s"] for x in j["modes"]}
        sp = j.get("speedup_paired", {}).get("pingpong")
        ex = j.get("exposed_paired")
        print(f"| {r} | {t} | {m.get('colocated', 0):.3f} | {m.get('cad pingpong', 0):.3f} | {m.get('cad signal', 0):.3f} "
              f"| {sp if sp is None else f'{sp:.3f}'} | {ex if ex is None else f'{100 * ex:.1f}%'} |")
PY
