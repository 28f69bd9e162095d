#!/usr/bin/env bash
# The one device check: builds distca with CUDA, runs the GPU tests and benchmarks, and writes
# $OUT/gpu-check.json (every step's status and time, the device, the test counts, the
# benchmark summaries, the end of each failed step's log) and $OUT/gpu-check-logs.tar.gz
# (every step's log and raw output). Budget: under 8 minutes on an
# H200 machine (16 cores); a normal run is expected to take 3 to 5 (an estimate: not yet timed
# there), and the step limits below add up to under 9 if every step hangs. On a machine
# without a GPU it still builds and runs the tests (the device tests report SKIPPED) and
# records the benchmarks as not run, exiting 0.
#
# Usage: OUT=/some/dir scripts/gpu-check.sh        (OUT defaults to ./gpu-check-out)
#        scripts/gpu-check.sh --bundle              (on a development machine: see below; set
#          CCACHE_LAUNCHERS="-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache")
# Exit: 0 when every step that could run passed; 1 otherwise (gpu-check.json says which).
#
# The device machine's image has CUDA, CMake and ninja but maybe not the project's C++
# dependencies (OpenBLAS, OpenMPI, GTest, CLI11, ...), and it cannot download them. So where
# `cmake --preset cuda` fails there, the script runs a prebuilt bundle instead:
# `scripts/gpu-check.sh --bundle` here builds the CUDA targets and packs the five binaries and
# the shared libraries they need beyond glibc, libstdc++ and the CUDA toolkit (about 20 MB) into
# build/gpu-bundle.tar.gz; carry that path to the device run (run's `carry`).
#
# Adding a check: one `step NAME TIMEOUT_S command...` line in the sequence below (its output
# goes to $WORK/NAME.log); a step that produces JSON for the summary writes it under $WORK and
# is named in the summary block at the end.
set -uo pipefail

cd "$(dirname "$0")/.."
BUNDLE=build/gpu-bundle.tar.gz
if [ "${1:-}" = "--bundle" ]; then
  set -e
  # Portable code (no -march=native: the device's CPU may lack this one's instructions).
  b=build/cuda-bundle
  cmake --preset cuda -B "$b" -DDISTCA_BUILD_BENCH=OFF -DDISTCA_NATIVE=OFF ${CCACHE_LAUNCHERS:-} >/dev/null
  cmake --build "$b" --target distca kernels_cuda_test kernels_cuda_cli_test comm_nccl_test runtime_pack_cuda_test \
    -j"$(nproc)"
  stage=build/gpu-bundle
  rm -rf "$stage" && mkdir -p "$stage/bin" "$stage/lib"
  cp "$b/apps/distca" "$b/tests/kernels_cuda/kernels_cuda_test" "$b/tests/kernels_cuda/kernels_cuda_cli_test" \
     "$b/tests/comm_nccl/comm_nccl_test" "$b/tests/runtime_cuda/runtime_pack_cuda_test" "$stage/bin/"
  strip "$stage"/bin/*
  # Every library the binaries load except the C runtime, libstdc++/libgcc (newer there) and the
  # CUDA toolkit's (the device has its own, matching its driver).
  ldd "$stage"/bin/* | awk '/=> \//{print $3}' | sort -u |
    grep -v -E '/(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so|/usr/local/cuda' |
    while read -r lib; do cp -L "$lib" "$stage/lib/"; done
  tar czf "$BUNDLE" -C build gpu-bundle
  echo "bundle: $BUNDLE ($(du -h "$BUNDLE" | cut -f1)); carry it to the device run"
  exit 0
fi
OUT="${OUT:-$PWD/gpu-check-out}"
mkdir -p "$OUT"
# Step logs and raw outputs go to WORK and come back packed as $OUT/gpu-check-logs.tar.gz: the
# device tool returns at most 8 files from $OUT, so $OUT holds two (that and gpu-check.json).
WORK="$(mktemp -d /tmp/gpu-check.XXXXXX)"
JOBS="$(nproc)"
BUILD=build/cuda
START=$(date +%s)
: >"$WORK/steps.tsv"
FAILED=0

# step NAME TIMEOUT_S CMD...: runs CMD with a time limit, logs to $WORK/NAME.log, appends
# "NAME<TAB>rc<TAB>seconds" to $WORK/steps.tsv. A failing step marks the run failed but the
# sequence goes on (later steps decide for themselves whether they can run).
step() {
  local name=$1 limit=$2
  shift 2
  local t0=$(date +%s)
  echo "== $name (limit ${limit}s)"
  timeout --kill-after=10 "$limit" "$@" >"$WORK/$name.log" 2>&1
  local rc=$?
  local dt=$(($(date +%s) - t0))
  printf '%s\t%s\t%s\n' "$name" "$rc" "$dt" >>"$WORK/steps.tsv"
  echo "   rc=$rc in ${dt}s (log: $WORK/$name.log)"
  tail -n 3 "$WORK/$name.log" | sed 's/^/   | /'
  [ "$rc" -eq 0 ] || FAILED=1
  return "$rc"
}
# skip NAME WHY: records a step that did not run.
skip() {
  printf '%s\tskipped\t0\t%s\n' "$1" "$2" >>"$WORK/steps.tsv"
  echo "== $1: skipped ($2)"
}

# 1. The device (absent on CPU-only machines: then the device steps below are skipped).
HAVE_GPU=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  HAVE_GPU=1
  step device 30 nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
else
  skip device "no nvidia-smi or no GPU"
fi

# 2. Configure and build the CUDA targets (ccache when present), or use the bundle.
LAUNCHERS=()
if command -v ccache >/dev/null 2>&1; then
  LAUNCHERS=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
GEN=()
command -v ninja >/dev/null 2>&1 || GEN=(-G "Unix Makefiles")
DISTCA="$BUILD/apps/distca"
TESTS="$BUILD/tests/kernels_cuda"
NCCL_TEST="$BUILD/tests/comm_nccl/comm_nccl_test"
PACK_TEST="$BUILD/tests/runtime_cuda/runtime_pack_cuda_test"
BEFORE=$FAILED
if [ "${GPU_CHECK_USE_BUNDLE:-0}" = 1 ]; then  # for testing the bundle path on a full machine
  skip configure "GPU_CHECK_USE_BUNDLE=1"
  CONFIGURED=1
else
  step configure 60 cmake --preset cuda -DDISTCA_BUILD_BENCH=OFF "${GEN[@]}" "${LAUNCHERS[@]}"
  CONFIGURED=$?
fi
if [ "$CONFIGURED" -eq 0 ]; then
  step build 300 cmake --build "$BUILD" --target distca kernels_cuda_test kernels_cuda_cli_test comm_nccl_test \
    runtime_pack_cuda_test -j"$JOBS"
  BUILT=$?
elif [ -f "$BUNDLE" ]; then
  # The prebuilt bundle (see the top): unpack, and find the CUDA libraries it leaves out.
  FAILED=$BEFORE  # a failed configure is expected on an image without the C++ dependencies
  dir=/tmp/distca-gpu-bundle
  rm -rf "$dir" && mkdir -p "$dir" && tar xzf "$BUNDLE" -C "$dir"
  DISTCA="$dir/gpu-bundle/bin/distca"
  TESTS="$dir/gpu-bundle/bin"
  NCCL_TEST="$TESTS/comm_nccl_test"
  PACK_TEST="$TESTS/runtime_pack_cuda_test"
  export LD_LIBRARY_PATH="$dir/gpu-bundle/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}"
  for lib in $(ldd "$dir"/gpu-bundle/bin/* | awk '/not found/{print $1}' | sort -u); do
    found=$(find / -xdev -name "$lib" -print -quit 2>/dev/null)
    [ -n "$found" ] && LD_LIBRARY_PATH="$(dirname "$found"):$LD_LIBRARY_PATH"
  done
  export DISTCA_CLI="$DISTCA"  # kernels_cuda_cli_test runs this binary
  step bundle 30 sh -c "ldd '$dir'/gpu-bundle/bin/* | grep 'not found' && exit 1; ls -l '$dir/gpu-bundle/bin'"
  BUILT=$?
else
  BUILT=1
fi

# 3. The CUDA kernel tests (device tests skip without a GPU; with one, a skip is a failure).
if [ "$BUILT" -eq 0 ]; then
  step kernels_cuda_test 60 "$TESTS/kernels_cuda_test" \
    --gtest_output="json:$WORK/kernels_cuda_test.json"
  step kernels_cuda_cli_test 45 "$TESTS/kernels_cuda_cli_test" \
    --gtest_output="json:$WORK/kernels_cuda_cli_test.json"
  # Out-of-bounds accesses and shared-memory races of every kernel on a small pack (works on
  # Firecracker machines; on gVisor compute-sanitizer refuses the device: then it is recorded).
  if [ "$HAVE_GPU" -eq 1 ] && command -v compute-sanitizer >/dev/null 2>&1; then
    for tool in memcheck racecheck; do
      before=$FAILED
      if ! step "sanitize_$tool" 60 compute-sanitizer --tool "$tool" --error-exitcode 3 \
          "$TESTS/kernels_cuda_test" --gtest_filter=CudaAttention.SanitizerPack &&
         grep -q -i "not supported" "$WORK/sanitize_$tool.log"; then
        FAILED=$before  # the sanitizer cannot run on this runtime: not a finding
        skip "sanitize_${tool}_unsupported" "compute-sanitizer: device not supported here"
      fi
    done
  fi
else
  skip kernels_cuda_test "build failed"
fi

# 3b. The NCCL backend (one rank on the GPU against its bootstrap, bitwise; two ranks need two
# GPUs) and the dispatcher's device data movement against the host tables, bitwise
# (docs/runtime.md, "NCCL backend").
if [ "$BUILT" -eq 0 ]; then
  step comm_nccl_test 120 "$NCCL_TEST" --gtest_output="json:$OUT/comm_nccl_test.json"
  step runtime_pack_cuda_test 120 "$PACK_TEST" --gtest_output="json:$OUT/runtime_pack_cuda_test.json"
else
  skip comm_nccl_test "build failed"
fi

# 4. The kernel benchmarks: d = 128, causal, 32/8 heads, single tasks 1K..16K and shard batches
# of a 16K context (docs/kernels.md, "CUDA"), beside cuBLAS GEMM measured in the same run.
if [ "$BUILT" -eq 0 ] && [ "$HAVE_GPU" -eq 1 ]; then
  step bench_attention_cuda 50 sh -c "'$DISTCA' bench attention --device cuda --dtype bf16 \
    --max-len 16384 --context 16384 --repeats 3 --json > '$WORK/bench_attention_cuda.json'"
  step bench_attention_cuda_fp16 40 sh -c "'$DISTCA' bench attention --device cuda --dtype fp16 \
    --max-len 16384 --context 16384 --repeats 3 --json > '$WORK/bench_attention_cuda_fp16.json'"
  # The simple (CUDA-core) kernels on short cases: how much the tiled ones gain.
  step bench_attention_cuda_simple 40 sh -c "'$DISTCA' bench attention --device cuda --dtype bf16 \
    --kernel simple --max-len 4096 --context 4096 --repeats 2 --json > '$WORK/bench_attention_cuda_simple.json'"
elif [ "$BUILT" -eq 0 ]; then
  # Without a GPU the command must refuse with one line and exit 2: checked, then recorded.
  "$DISTCA" bench attention --device cuda >"$WORK/bench_attention_cuda.log" 2>&1
  rc=$?
  if [ "$rc" -eq 2 ]; then skip bench_attention_cuda "no GPU (refused: $(head -c 200 "$WORK/bench_attention_cuda.log"))"
  else step bench_attention_cuda_refusal 5 false; fi
else
  skip bench_attention_cuda "build failed"
fi

# 5. The summary: $OUT/gpu-check.json.
TOTAL=$(($(date +%s) - START))
WORK="$WORK" OUT="$OUT" HAVE_GPU="$HAVE_GPU" TOTAL="$TOTAL" FAILED="$FAILED" /usr/bin/env python3 - <<'PY'

import json, os
out = os.environ["WORK"]
res = {"gpu": os.environ["HAVE_GPU"] == "1", "total_seconds": int(os.environ["TOTAL"]), "steps": []}
for line in open(os.path.join(out, "steps.tsv")):
    f = line.rstrip("\n").split("\t")
    s = {"name": f[0], "rc": f[1], "seconds": int(f[2])}
    if len(f) > 3:
        s["why"] = f[3]
    res["steps"].append(s)
def load(name):
    p = os.path.join(out, name)
    try:
        with open(p) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None
dev = os.path.join(out, "device.log")
if os.path.exists(dev):
    res["device"] = open(dev).read().strip().splitlines()[-1]
# Tests that skip BECAUSE a GPU is present (they check the no-GPU behaviour).
NO_GPU_ONLY = ("CudaAttentionRunner.NoDeviceIsAStatusNotACrash", "BenchAttentionCuda.WithoutAGpuIsRefused",
               "NcclComm.NoDeviceIsTheSameOneLineErrorOnEveryRank",
               # needs 2 GPUs (NCCL refuses two ranks on one GPU); the lent machine has one
               "NcclComm.TwoRanksOnTwoGpusMatchTheBootstrapBitwise")
for test in ("kernels_cuda_test", "kernels_cuda_cli_test", "comm_nccl_test", "runtime_pack_cuda_test"):
    t = load(test + ".json")
    if t is None:
        continue
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    failed, skipped = [], []
    for suite in t.get("testsuites", []):
        for c in suite.get("testsuite", []):
            name = suite["name"] + "." + c["name"]
            if c.get("failures"):
                counts["failed"] += 1; failed.append(name)
            elif c.get("result") == "SKIPPED" or c.get("status") == "NOTRUN":
                counts["skipped"] += 1; skipped.append(name)
            else:
                counts["passed"] += 1
    res[test] = dict(counts, failed_tests=failed, skipped_tests=skipped)
    wrongly_skipped = [n for n in skipped if n not in NO_GPU_ONLY]
    if res["gpu"] and wrongly_skipped:
        res[test]["error"] = "tests skipped although a GPU is present: " + ", ".join(wrongly_skipped)
        res["failed"] = True
for name in ("bench_attention_cuda", "bench_attention_cuda_fp16", "bench_attention_cuda_simple"):
    b = load(name + ".json")
    if b is not None:
        res[name] = {k: b.get(k) for k in ("gpu", "dtype", "kernel", "cublas_gemm_tflops", "summary", "cases")}
res["failed"] = res.get("failed", False) or os.environ["FAILED"] == "1"
# The end of every failed step's log, so the JSON alone says what went wrong.
for st in res["steps"]:
    if st["rc"] not in ("0", "skipped"):
        try:
            st["log_tail"] = open(os.path.join(out, st["name"] + ".log"), errors="replace").read()[-3000:]
        except OSError:
            pass
json.dump(res, open(os.path.join(os.environ["OUT"], "gpu-check.json"), "w"), indent=2)
print(json.dumps({k: res[k] for k in ("gpu", "total_seconds", "failed")}))
raise SystemExit(1 if res["failed"] else 0)
PY
RC=$?  # the summary's verdict: 1 when any step failed (or a device test skipped on a GPU)
tar czf "$OUT/gpu-check-logs.tar.gz" -C "$WORK" . && rm -rf "$WORK"
echo "== done in ${TOTAL}s: $OUT/gpu-check.json, logs in $OUT/gpu-check-logs.tar.gz"
exit "$RC"
