#!/usr/bin/env bash
# The GPU checks of the NCCL backend and the dispatcher's device movement kernels (issue 18,
# docs/runtime.md "NCCL backend"). Two steps, so the device minutes go to running:
#
#   scripts/gpu-check-nccl.sh prepare [DIR]   here (nvcc needed, no GPU): builds the test
#       programs (portable x86-64: no -march=native) and gathers them with the shared libraries
#       the device machine lacks (OpenMPI's, CUDA's runtime) into DIR (default build/gpu-nccl,
#       ~12 MiB: carry it).
#   scripts/gpu-check-nccl.sh run [DIR]       on the GPU machine (DIR carried there): runs them
#       and writes $OUT/nccl.json (per program: exit code, seconds, tests, failures, skips and
#       the GoogleTest report) and $OUT/nccl.log. Exit 0 when no program failed.
#
# On a machine without a GPU `run` still works: the GPU tests report skipped (that is how this
# script was timed before it ever ran on a GPU). NCCL refuses two ranks on one GPU, so the
# mpirun program (comm_nccl_mpi_np2) is not run here: it needs 2 GPUs (and OpenMPI's mpirun).
# libnccl (200+ MiB) does not travel: `run` finds it under /usr/local/cuda or in the Python
# package nvidia-nccl-cu13.
set -uo pipefail
cd "$(dirname "$0")/.."

mode=${1:-}
dir=${2:-build/gpu-nccl}
# The GPU programs only: their host-logic siblings (comm_nccl_logic_test, runtime_tables_test)
# run in CI on every machine and would bring OpenBLAS (36 MiB) along.
programs=(comm_nccl_test runtime_pack_cuda_test)
paths=(tests/comm_nccl/comm_nccl_test tests/runtime_cuda/runtime_pack_cuda_test)

prepare() {
  local build=build/gpu-nccl-build
  local launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDISTCA_CUDA=ON \
        -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc -DDISTCA_NATIVE=OFF -DDISTCA_FUZZ=OFF \
        -DDISTCA_BUILD_BENCH=OFF "${launcher[@]}" >/dev/null || return 1
  cmake --build "$build" --target "${programs[@]}" -j"$(nproc)" || return 1
  rm -rf "$dir" && mkdir -p "$dir/bin" "$dir/lib"
  local i
  for i in "${!programs[@]}"; do cp "$build/${paths[$i]}" "$dir/bin/"; done
  # Shared libraries beside the C and C++ runtimes (the device's own: ours would need glibc
  # 2.36; the programs need glibc 2.34 and GLIBCXX_3.4.30), CUDA's driver and NCCL (found
  # there) and the loader. OpenMPI's libevent needs glibc 2.36: where the device has less,
  # comm_nccl_test cannot load (exit 127, named in nccl.log) while the pack test still runs.
  ldd "$dir"/bin/* | awk '$3 ~ /^\// {print $3}' | sort -u |
    grep -v -E '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libstdc\+\+|libgcc_s|libcuda|libnccl)\.so' |
    while read -r lib; do cp -L "$lib" "$dir/lib/"; done
  du -sh "$dir"
}

find_nccl() {
  local d
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/lib/x86_64-linux-gnu; do
    [[ -e $d/libnccl.so.2 ]] && { echo "$d"; return; }
  done
  python3 - <<'EOF' 2>/dev/null
import importlib.util, os
spec = importlib.util.find_spec("nvidia.nccl")
for loc in (spec.submodule_search_locations or []) if spec else []:
    if os.path.exists(os.path.join(loc, "lib", "libnccl.so.2")):
        print(os.path.join(loc, "lib")); break
EOF
}

run() {
  local out=${OUT:-build/gpu-nccl-out}
  mkdir -p "$out"
  local tmp
  tmp=$(mktemp -d)
  local nccl
  nccl=$(find_nccl)
  export LD_LIBRARY_PATH="$(cd "$dir" && pwd)/lib:${nccl:+$nccl:}/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
  {
    echo "libnccl from: ${nccl:-not found}"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || echo "no nvidia-smi"
    ldd --version 2>&1 | head -1
    for p in "${programs[@]}"; do echo "ldd $p:"; ldd "$dir/bin/$p" 2>&1 | grep -E 'not found|nccl|cudart|mpi' || true; done
  } >"$out/nccl.log"
  local p failed=0
  for p in "${programs[@]}"; do
    local t0 t1 rc
    t0=$(date +%s.%N)
    timeout 180 "$dir/bin/$p" --gtest_output="json:$tmp/$p.json" >"$tmp/$p.out" 2>&1
    rc=$?
    t1=$(date +%s.%N)
    echo "$rc $t0 $t1" >"$tmp/$p.rc"
    { echo "=== $p (exit $rc)"; cat "$tmp/$p.out"; } >>"$out/nccl.log"
    [[ $rc -ne 0 ]] && failed=1
  done
  python3 - "$tmp" "$out/nccl.json" "${programs[@]}" <<'EOF'
import json, os, sys
tmp, dst, progs = sys.argv[1], sys.argv[2], sys.argv[3:]
res = {"check": "gpu-check-nccl", "not_run": {"comm_nccl_mpi_np2": "needs 2 GPUs (NCCL refuses two ranks on one GPU)"},
       "programs": []}
for p in progs:
    rc, t0, t1 = open(os.path.join(tmp, p + ".rc")).read().split()
    entry = {"name": p, "exit": int(rc), "seconds": round(float(t1) - float(t0), 3)}
    try:
        rep = json.load(open(os.path.join(tmp, p + ".json")))
        cases = [c for s in rep.get("testsuites", []) for c in s.get("testsuite", [])]
        entry["tests"] = len(cases)
        entry["failures"] = sum(1 for c in cases if c.get("failures"))
        entry["skipped"] = [c["classname"] + "." + c["name"] for c in cases if c.get("result") == "SKIPPED"]
        entry["report"] = rep
    except (OSError, ValueError) as e:
        entry["report_error"] = str(e)
    res["programs"].append(entry)
res["ok"] = all(e["exit"] == 0 for e in res["programs"])
json.dump(res, open(dst, "w"), indent=1)
print("gpu-check-nccl:", "ok" if res["ok"] else "FAILED",
      "; ".join(f'{e["name"]}: exit {e["exit"]}, {e.get("tests", "?")} tests, {len(e.get("skipped", []))} skipped, {e["seconds"]} s'
                for e in res["programs"]))
EOF
  rm -rf "$tmp"
  return $failed
}

case $mode in
  prepare) prepare ;;
  run) run ;;
  *) echo "usage: scripts/gpu-check-nccl.sh prepare|run [DIR]" >&2; exit 2 ;;
esac
