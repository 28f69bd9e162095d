#!/usr/bin/env bash
# Issue 26's measured comparison of every mode (colocated, wlb at each CP degree, percp, cad
# single-stream and pingpong) with the simulator's prediction beside every row
# (docs/benchmarks.md, "Comparing the modes"). One step per call, so each stays a few minutes:
#
#   scripts/compare_baselines.sh OUT profile2      # mpirun -np 2 profile at bench train's default shapes
#   scripts/compare_baselines.sh OUT dp2-pretrain  # DP 2, pretrain, $TPR (16384) tokens per rank
#   scripts/compare_baselines.sh OUT dp2-prolong   # DP 2, prolong, the same
#   scripts/compare_baselines.sh OUT profile4      # mpirun -np 4 profile at width 256
#   scripts/compare_baselines.sh OUT dp2pp2        # DP 2 x PP 2, prolong, width 256, 4096 per micro-batch
#
# Each writes OUT/<step>.json (bench train --json) and OUT/<step>.log (the table; before it, the
# batches' attention max/mean before planning). The dp2 steps need OUT/hw2.json (profile2), dp2pp2
# OUT/hw4.json (profile4). Run from the repository root after a release build, on a quiet machine.
# TPR and STEPS override the DP 2 steps' tokens per rank (16384) and steps per mode (2: one
# warm-up, one timed; 12288 with STEPS=3 times two steps in about the same time).
set -euo pipefail
out=${1:?usage: $0 OUT_DIR STEP}
step=${2:?usage: $0 OUT_DIR STEP}
mkdir -p "$out"
. "$(dirname "$0")/blas-env.sh"
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
bin=build/release/apps/distca
run() {  # np, then the command's arguments
  local np=$1
  shift
  mpirun --oversubscribe --allow-run-as-root --bind-to none -np "$np" -x OMP_NUM_THREADS -x OPENBLAS_CORETYPE "$bin" "$@"
}
case "$step" in
  profile2)
    run 2 profile --hardware-out "$out/hw2.json" --max-len 16384 --min-seconds 0.05 ;;
  profile4)
    run 4 profile --hardware-out "$out/hw4.json" --width 256 --head-dim 64 --heads 4 --kv-heads 2 --vocab 512 \
      --max-len 8192 --min-seconds 0.05 ;;
  dp2-pretrain | dp2-prolong)
    run 2 bench train --compare --backend mpi --workload "${step#dp2-}" --seed 1 --tokens-per-rank "${TPR:-16384}" \
      --rounds 1 --steps "${STEPS:-2}" --warmup-steps 1 --hardware "$out/hw2.json" --json "$out/$step.json" \
      2>&1 | tee "$out/$step.log" ;;
  dp2pp2)
    run 4 bench train --compare --backend mpi --width 256 --pp 2 --micro-batches 2 --workload prolong --seed 1 \
      --tokens-per-rank 4096 --rounds 1 --steps 3 --warmup-steps 1 --hardware "$out/hw4.json" \
      --json "$out/$step.json" 2>&1 | tee "$out/$step.log" ;;
  *)
    echo "unknown step '$step' (profile2, dp2-pretrain, dp2-prolong, profile4, dp2pp2)" >&2
    exit 2 ;;
esac
