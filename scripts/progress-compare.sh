#!/usr/bin/env bash
# Issue 26's DP 2 comparison with the per-thread CPU split (docs/runtime.md, "Backend mpi:
# thread level and progress"): `bench train --compare` at DP 2 on 2 ranks, run under
# scripts/thread-cpu.py, which prints each rank's CPU seconds of its main thread, of the
# progress thread (distca-progress) and of the other threads after the table. Needs a built
# build/release/apps/distca and mpirun; about 4-5 minutes on a quiet 2-core machine.
# Usage: scripts/progress-compare.sh [pretrain|prolong] [JSON]   (default pretrain, no JSON)
set -euo pipefail
cd "$(dirname "$0")/.."
workload=${1:-pretrain}
json=()
[ -n "${2:-}" ] && json=(--json "$2")
. scripts/blas-env.sh
export OMP_NUM_THREADS=1
root=()
[ "$(id -u)" = 0 ] && root=(--allow-run-as-root)
exec /usr/bin/python3 scripts/thread-cpu.py -- mpirun --oversubscribe "${root[@]}" --bind-to none -np 2 \
  -x OPENBLAS_CORETYPE -x OMP_NUM_THREADS=1 build/release/apps/distca bench train --compare --backend mpi \
  --workload "$workload" --seed 1 --tokens-per-rank 8192 --rounds 2 --steps 3 "${json[@]}"
