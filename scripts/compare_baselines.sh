#!/usr/bin/env bash
# Issue 26's measured comparison of every mode (colocated, wlb at each CP degree, percp, cad
# single-stream and pingpong) with the simulator's prediction beside every row
# (docs/benchmarks.md, "Comparing the modes"). One step per call, so each stays a few minutes,
# or every step in order:
#
#   scripts/compare_baselines.sh OUT all           # every step below, in order (about 12-15 min quiet)
#   scripts/compare_baselines.sh OUT profile2      # mpirun -np 2 profile at bench train's default shapes
#   scripts/compare_baselines.sh OUT dp2-pretrain  # DP 2, pretrain, $TPR (16384) tokens per rank
#   scripts/compare_baselines.sh OUT dp2-prolong   # DP 2, prolong, the same
#   scripts/compare_baselines.sh OUT profile4      # mpirun -np 4 profile at width 256
#   scripts/compare_baselines.sh OUT dp2pp2        # DP 2 x PP 2, prolong, width 256, 4096 per micro-batch
#   scripts/compare_baselines.sh OUT dp4-pretrain  # DP 4, pretrain, width 256, 4096 per rank
#   scripts/compare_baselines.sh OUT dp2pp2-pretrain  # DP 2 x PP 2 as dp2pp2, pretrain
#   scripts/compare_baselines.sh OUT four          # profile4, dp4-pretrain, dp2pp2-pretrain
#
# Each writes OUT/<step>.json (bench train --json) and OUT/<step>.log (the table; before it, the
# batches' attention max/mean before planning; its last column the simulator's step over the
# measured one). The dp2 steps need OUT/hw2.json (profile2), the 4-rank ones OUT/hw4.json (profile4).
# Resumable: a step whose output (OUT/hw2.json, OUT/hw4.json, OUT/<step>.json) exists is
# skipped, so a run cut short is finished by the same command; delete a file to redo its step.
# Every step prints its wall seconds. Run from the repository root after a release build, on a
# quiet machine. TPR and STEPS override the DP 2 steps' tokens per rank (16384; the profile's
# --max-len follows it) and steps per mode (2: one warm-up, one timed). ROUNDS (1) sets
# every step's rounds: the modes run in a fixed order, so with one round a machine that slows
# down during the run reads as a slower mode; with 3 the compare pairs the modes round by round. SMOKE=1 runs every step
# at tiny shapes (width 128, 2 layers, 1024 tokens per rank; a few minutes on a loaded machine)
# to check the script, not to measure.
#
# CAP=C runs every rank of every step, profiles included, under scripts/rank-cap.sh --cpus C
# (CAP_PERIOD_US: its --period-us, default its own; CAP_WEIGHT: its --weight, default 10000):
# each rank a fixed share of a core, busy or idle, as a device (docs/netlab.md, "Emulating
# devices with CPU caps"). With 4 ranks on 2 cores use CAP=0.5. OUT/cap records the caps of
# the files in OUT; a call with other caps is refused (exit 2), so a capped profile never
# meets an uncapped run. Capped ranks wait with DISTCA_WAIT=sleep unless DISTCA_WAIT says
# otherwise (rank-cap.sh; docs/netlab.md), and OUT/cap records the policy too. The issue's 4-rank figures, capped (about 6 min on 2 cores: profile 1, dp4-pretrain 2.6, dp2pp2-pretrain 2.2):
#
#   CAP=0.5 scripts/compare_baselines.sh OUT four
set -euo pipefail
out=${1:?usage: $0 OUT_DIR STEP}
step=${2:?usage: $0 OUT_DIR STEP}
case "$step" in
  all | four | profile2 | dp2-pretrain | dp2-prolong | profile4 | dp2pp2 | dp4-pretrain | dp2pp2-pretrain) ;;
  *)
    echo "distca: error: unknown step '$step' (all, four, profile2, dp2-pretrain, dp2-prolong, profile4, dp2pp2," \
      "dp4-pretrain, dp2pp2-pretrain)" >&2
    exit 2 ;;
esac
capper=()
caps="none"
if [[ -n ${CAP:-} ]]; then
  capper=("$(dirname "$0")/rank-cap.sh" --cpus "$CAP" --weight "${CAP_WEIGHT:-10000}")
  [[ -z ${CAP_PERIOD_US:-} ]] || capper+=(--period-us "$CAP_PERIOD_US")
  capper+=(--)
  "${capper[@]}" true || exit 2  # bad CAP, or no writable CPU cgroup: its one line said which
  export DISTCA_WAIT=${DISTCA_WAIT:-sleep}
  caps="cpus $CAP per rank, period ${CAP_PERIOD_US:+$CAP_PERIOD_US us}${CAP_PERIOD_US:-the rank-cap.sh default}, weight ${CAP_WEIGHT:-10000}, waits $DISTCA_WAIT"
fi
recorded=""
if [[ -s "$out/cap" ]]; then
  recorded=$(cat "$out/cap")
elif compgen -G "$out/*.json" > /dev/null; then
  recorded="none"  # files of a call before OUT/cap existed: uncapped
fi
if [[ -n $recorded && $recorded != "$caps" ]]; then
  echo "distca: error: $out holds files measured with caps '$recorded', not '$caps': use another OUT" >&2
  exit 2
fi
mkdir -p "$out"
echo "$caps" > "$out/cap"
. "$(dirname "$0")/blas-env.sh"
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
bin=build/release/apps/distca
tpr=${TPR:-16384}
w2=512 w4=256 tpr4=4096 maxlen4=8192 quick=()
if [[ ${SMOKE:-0} == 1 ]]; then
  tpr=1024 w2=128 w4=128 tpr4=512 maxlen4=1024
  quick=(--tokens 512 --gemm-repeats 2 --link-repeats 3)
fi
run() {  # np, then the command's arguments
  local np=$1
  shift
  mpirun --oversubscribe --allow-run-as-root --bind-to none -np "$np" -x OMP_NUM_THREADS -x OPENBLAS_CORETYPE \
    "${capper[@]}" "$bin" "$@"
}
output_of() {  # the file a step writes last
  case "$1" in
    profile2) echo "$out/hw2.json" ;;
    profile4) echo "$out/hw4.json" ;;
    *) echo "$out/$1.json" ;;
  esac
}
needs() {  # a step's input file, written by an earlier step
  [[ -s "$1" ]] || { echo "distca: error: $1 is missing: run step $2 first" >&2; exit 2; }
}
one_step() {
  local s=$1 start=$SECONDS
  if [[ -s "$(output_of "$s")" ]]; then
    echo "== $s: skipped ($(output_of "$s") exists)"
    return
  fi
  echo "== $s (caps: $caps)"
  case "$s" in
    profile2)
      run 2 profile --hardware-out "$out/hw2.json" --width "$w2" --max-len "$tpr" --min-seconds 0.05 "${quick[@]}" ;;
    profile4)
      run 4 profile --hardware-out "$out/hw4.json" --width "$w4" --head-dim 64 --heads $((w4 / 64)) \
        --kv-heads $((w4 / 128)) --vocab 512 --max-len "$maxlen4" --min-seconds 0.05 "${quick[@]}" ;;
    dp2-pretrain | dp2-prolong)
      needs "$out/hw2.json" profile2
      run 2 bench train --compare --backend mpi --width "$w2" --workload "${s#dp2-}" --seed 1 --tokens-per-rank "$tpr" \
        --rounds "${ROUNDS:-1}" --steps "${STEPS:-2}" --warmup-steps 1 --hardware "$out/hw2.json" --json "$out/$s.json" \
        2>&1 | tee "$out/$s.log" ;;
    dp2pp2)
      needs "$out/hw4.json" profile4
      run 4 bench train --compare --backend mpi --width "$w4" --pp 2 --micro-batches 2 --workload prolong --seed 1 \
        --tokens-per-rank "$tpr4" --rounds "${ROUNDS:-1}" --steps 3 --warmup-steps 1 --hardware "$out/hw4.json" \
        --json "$out/$s.json" 2>&1 | tee "$out/$s.log" ;;
    dp4-pretrain)
      needs "$out/hw4.json" profile4
      run 4 bench train --compare --backend mpi --width "$w4" --workload pretrain --seed 1 --tokens-per-rank "$tpr4" \
        --rounds "${ROUNDS:-1}" --steps 3 --warmup-steps 1 --hardware "$out/hw4.json" --json "$out/$s.json" 2>&1 | tee "$out/$s.log" ;;
    dp2pp2-pretrain)
      needs "$out/hw4.json" profile4
      run 4 bench train --compare --backend mpi --width "$w4" --pp 2 --micro-batches 2 --workload pretrain --seed 1 \
        --tokens-per-rank "$tpr4" --rounds "${ROUNDS:-1}" --steps 3 --warmup-steps 1 --hardware "$out/hw4.json" \
        --json "$out/$s.json" 2>&1 | tee "$out/$s.log" ;;
  esac
  echo "== $s: $((SECONDS - start)) s"
}
if [[ $step == all || $step == four ]]; then
  steps=(profile2 dp2-pretrain dp2-prolong profile4 dp2pp2)
  [[ $step == four ]] && steps=(profile4 dp4-pretrain dp2pp2-pretrain)
  for s in "${steps[@]}"; do one_step "$s"; done
  echo "== $step: $SECONDS s"
else
  one_step "$step"
fi
