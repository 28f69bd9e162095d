#!/usr/bin/env bash
# Issue 29's tensor-parallel figures on this machine (docs/benchmarks.md, "Simulator
# validation" and "bench train --tp"): the simulator against measured runs at 1 and 2 ranks
# (dp1 = TP 1 x DP 1, dp2 = TP 1 x DP 2, tp2x1 = TP 2 x DP 1 with --tp-overlap off, the
# blocking collectives the simulator models; each with its predicted / measured step, idle and
# time blocked in communication), then bench train's default workload at --tp 2 on 2 ranks,
# the collectives overlapped as by default (exposed communication, the TP collectives' share,
# balance), then the TP
# collectives of the tp2x1 runs against the profile's measured price of one
# (scripts/tp_collective_report.py: measured share of the step, predicted, per collective
# measured / profile / left over, and what is left a step beside the profile's TP wait,
# links.tp_wait x the measured compute). LAUNCHES=N (default 3): the validation's bench train
# runs per configuration, each its own mpirun, a row the launch with the median step
# (`--launches`). Needs a built build/release/apps/distca and mpirun; about 6 minutes on a
# quiet 2-core machine (4 with LAUNCHES=1).
# Usage: scripts/tp-validate.sh [OUT_DIR]   (default tp-val; must not exist yet)
# CAP=C (caps block below): then also TP 2 x DP 2 on 4 ranks, each under scripts/rank-cap.sh
# --cpus C (CAP_PERIOD_US, CAP_WEIGHT: its --period-us, default its own, and --weight, default
# 10000), a device's fixed share of a core
# (docs/netlab.md, "Emulating devices with CPU caps"; the ranks' MPI waits sleep, DISTCA_WAIT=sleep,
# unless DISTCA_WAIT is set), with a 4-rank profile measured under the same caps:
# OUT_DIR/hw4-capped.json, OUT_DIR/bench-tp2x2-capped.json (about 10 more minutes
# at CAP=0.5 on 2 cores: the profile 2.5, bench train 8).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-tp-val}
. scripts/blas-env.sh
export OMP_NUM_THREADS=1
distca=build/release/apps/distca
root=()
[ "$(id -u)" = 0 ] && root=(--allow-run-as-root)
# --- caps (helper "caps"): checked before any work.
capper=()
if [ -n "${CAP:-}" ]; then
  capper=(scripts/rank-cap.sh --cpus "$CAP" --weight "${CAP_WEIGHT:-10000}")
  [ -z "${CAP_PERIOD_US:-}" ] || capper+=(--period-us "$CAP_PERIOD_US")
  capper+=(--)
  "${capper[@]}" true || exit 2  # bad CAP, or no writable CPU cgroup: its one line said which
fi
# --- end caps
"$distca" bench simulate --validate --ranks 1,2 --launches "${LAUNCHES:-3}" --out "$out" --json "$out.validate.json" \
  --timeout 600
mpirun --oversubscribe "${root[@]}" -np 2 "$distca" bench train --backend mpi --tp 2 --rounds 2 \
  --json "$out/bench-tp2.json"
/usr/bin/python3 scripts/tp_collective_report.py "$out"
# --- caps (helper "caps"): TP 2 x DP 2, every rank capped, profile and run under the same caps.
if [ ${#capper[@]} -gt 0 ]; then
  capped() { mpirun --oversubscribe "${root[@]}" --bind-to none -np 4 -x OMP_NUM_THREADS -x OPENBLAS_CORETYPE "${capper[@]}" "$distca" "$@"; }
  capped profile --hardware-out "$out/hw4-capped.json" --min-seconds 0.05
  capped bench train --backend mpi --tp 2 --rounds 2 --hardware "$out/hw4-capped.json" \
    --json "$out/bench-tp2x2-capped.json" 2>&1 | tee "$out/bench-tp2x2-capped.log"
fi
# --- end caps
