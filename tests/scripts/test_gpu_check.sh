#!/usr/bin/env bash
# scripts/gpu-check.sh with stand-in programs (GPU_CHECK_BIN) and stand-in nvidia-smi and
# compute-sanitizer, in four runs: without a GPU, with one, killed by TERM in the middle of a
# step, and cut by its global deadline. Each run must leave a complete, valid gpu-check.json
# and the log pack under $OUT, written without python3 (a python3 first on PATH that records
# being called must stay uncalled). The JSON is checked here with /usr/bin/python3.
# Usage: test_gpu_check.sh SOURCE_DIR
set -uo pipefail
SRC=$(cd "${1:?usage: test_gpu_check.sh SOURCE_DIR}" && pwd)
T=$(mktemp -d /tmp/gpu-check-test.XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$T"' EXIT
FAILS=0
fail() { echo "FAIL: $*"; FAILS=$((FAILS + 1)); }

mkdir -p "$T/bin" "$T/path" "$T/gpu"
# A python3 that must never run.
printf '#!/bin/sh\ntouch "%s/python-called"\nexit 99\n' "$T" >"$T/path/python3"
# A GoogleTest-like program: its result lines, SLEEP seconds first.
cat >"$T/bin/kernels_cuda_test" <<'EOF'
#!/bin/sh
[ -n "${FAKE_STARTED:-}" ] && touch "$FAKE_STARTED"
sleep "${FAKE_SLEEP:-0}"
echo "[ RUN      ] CudaPlan.A"
echo "[       OK ] CudaPlan.A (3 ms)"
echo "[ RUN      ] CudaPlan.B"
echo "[       OK ] CudaPlan.B (0 ms)"
echo "[ RUN      ] CudaAttention.Fp32MatchesTheReference"
echo "[  SKIPPED ] CudaAttention.Fp32MatchesTheReference (0 ms)"
echo "[ RUN      ] CudaX/Param.Case/1"
echo "[  FAILED  ] CudaX/Param.Case/1, where GetParam() = 4 (1 ms)"
echo "[  FAILED  ] 1 test, listed below:"
echo "[  FAILED  ] CudaX/Param.Case/1, where GetParam() = 4"
exit 1
EOF
cp "$T/bin/kernels_cuda_test" "$T/bin/comm_nccl_test"
# distca: refuses without a GPU (exit 2); with FAKE_GPU, prints a benchmark JSON with a quote.
cat >"$T/bin/distca" <<'EOF'
#!/bin/sh
if [ -z "${FAKE_GPU:-}" ]; then echo "distca: error: --device cuda: no CUDA device" >&2; exit 2; fi
printf '{\n  "gpu": "H200 \\"fake\\"",\n  "summary": {"forward_tflops": 1.5}\n}\n'
EOF
printf '#!/bin/sh\necho "[       OK ] PackCuda.A (1 ms)"\n' >"$T/bin/runtime_pack_cuda_test"
# A real program whose library is gone (where a C compiler exists): ldd finds it missing, so
# the script must skip it, naming the library, and run the others.
if command -v cc >/dev/null 2>&1; then
  echo 'int gone(void) { return 0; }' >"$T/gone.c"
  echo 'int gone(void); int main(void) { return gone(); }' >"$T/main.c"
  cc -shared -fPIC -o "$T/libgone.so" "$T/gone.c" && cc -o "$T/bin/kernels_cuda_cli_test" "$T/main.c" -L"$T" -lgone &&
    rm "$T/libgone.so" || fail "could not build the program with a missing library"
fi
chmod +x "$T"/bin/* "$T"/path/*
# For the GPU runs: nvidia-smi and compute-sanitizer stand-ins.
printf '#!/bin/sh\n[ "$1" = -L ] && { echo "GPU 0: Fake"; exit 0; }\necho "name, memory.total"\necho "Fake H200, 143771 MiB"\n' \
  >"$T/gpu/nvidia-smi"
printf '#!/bin/sh\necho "sanitizer $*" >>"%s/sanitizer-calls"\nshift 4\nexec "$@"\n' "$T" >"$T/gpu/compute-sanitizer"
chmod +x "$T"/gpu/*

# check_json FILE PYTHON-ASSERTIONS: the file parses and the assertions (on `j`) hold.
check_json() {
  /usr/bin/python3 - "$1" "$2" <<'PY' || fail "$2"
import json, sys
j = json.load(open(sys.argv[1]))
steps = {s["name"]: s for s in j["steps"]}
ok = eval(sys.argv[2])
if not ok:
    print(json.dumps(j, indent=1)[:4000])
raise SystemExit(0 if ok else 1)
PY
}
run() {  # run OUTDIR PATH [env...]: the script with the stand-ins; prints its rc
  local out=$1 path=$2
  shift 2
  env "$@" OUT="$out" GPU_CHECK_BIN="$T/bin" PATH="$path" "$SRC/scripts/gpu-check.sh" >"$out.log" 2>&1
  echo $?
}
NOGPU="$T/path:/usr/bin:/bin"

# 1. No GPU: every step reaches its result or its skip; the device steps are skipped.
rc=$(run "$T/o1" "$NOGPU")
[ "$rc" = 1 ] || fail "no-GPU run: rc $rc, expected 1 (a stand-in test fails)"
check_json "$T/o1/gpu-check.json" 'j["finished"] and j["interrupted"] is None and j["gpu"] is False and j["failed"]'
check_json "$T/o1/gpu-check.json" 'set(steps) == {"device", "programs", "kernels_cuda_test", "bench_attention_cuda",
  "comm_nccl_test", "runtime_pack_cuda_test", "kernels_cuda_cli_test", "sanitize_memcheck", "sanitize_racecheck",
  "sanitize_synccheck", "bench_attention_cuda_fp16", "bench_attention_cuda_simple"}'
check_json "$T/o1/gpu-check.json" 'j["tests"]["kernels_cuda_test"] == {"passed": 2, "failed": 1, "skipped": 1,
  "failed_tests": ["CudaX/Param.Case/1"], "skipped_tests": ["CudaAttention.Fp32MatchesTheReference"]}'
check_json "$T/o1/gpu-check.json" 'steps["kernels_cuda_test"]["status"] == "failed" and "GetParam" in steps["kernels_cuda_test"]["log_tail"]'
check_json "$T/o1/gpu-check.json" 'steps["bench_attention_cuda"]["status"] == "skipped" and "no CUDA device" in steps["bench_attention_cuda"]["why"]'
check_json "$T/o1/gpu-check.json" 'steps["sanitize_synccheck"]["why"] == "no GPU"'
if command -v cc >/dev/null 2>&1; then
  check_json "$T/o1/gpu-check.json" 'steps["kernels_cuda_cli_test"]["why"] == "ldd: not found: libgone.so"'
fi
check_json "$T/o1/gpu-check.json" 'any("two ranks" in x for x in j["not_exercised_on_one_gpu"])'
[[ "$(tar tzf "$T/o1/gpu-check-logs.tar.gz")" == *kernels_cuda_test.log* ]] ||
  fail "no-GPU run: log pack lacks kernels_cuda_test.log"

# 2. With a (stand-in) GPU: device line, benchmarks embedded, three sanitizer tools, and a
# device test that skips although a GPU is present fails the check, named.
rc=$(run "$T/o2" "$T/gpu:$NOGPU" FAKE_GPU=1)
[ "$rc" = 1 ] || fail "GPU run: rc $rc, expected 1"
check_json "$T/o2/gpu-check.json" 'j["gpu"] and j["device"] == "Fake H200, 143771 MiB" and j["finished"]'
check_json "$T/o2/gpu-check.json" 'j["benchmarks"]["bench_attention_cuda"]["gpu"] == "H200 \"fake\"" and "bench_attention_cuda_simple" in j["benchmarks"]'
check_json "$T/o2/gpu-check.json" '"CudaAttention.Fp32MatchesTheReference" in j["tests"]["kernels_cuda_test"]["error"]'
check_json "$T/o2/gpu-check.json" 'all(steps["sanitize_" + t]["rc"] == 1 for t in ("memcheck", "racecheck", "synccheck"))'
grep -q -- "--tool synccheck" "$T/sanitizer-calls" || fail "GPU run: compute-sanitizer --tool synccheck not run"

# 3. TERM in the middle of a step (once the stand-in test program has started): the step is
# recorded as interrupted, the JSON is complete and valid, the logs are packed, exit 124.
env OUT="$T/o3" GPU_CHECK_BIN="$T/bin" FAKE_SLEEP=30 FAKE_STARTED="$T/started" PATH="$NOGPU" \
  "$SRC/scripts/gpu-check.sh" >"$T/o3.log" 2>&1 &
pid=$!
for _ in $(seq 600); do [ -e "$T/started" ] && break; sleep 0.1; done
kill -TERM "$pid"
wait "$pid"
rc=$?
[ "$rc" = 124 ] || fail "TERM run: rc $rc, expected 124"
check_json "$T/o3/gpu-check.json" 'not j["finished"] and j["interrupted"].startswith("signal TERM") and j["failed"]'
check_json "$T/o3/gpu-check.json" 'steps["kernels_cuda_test"]["status"] == "interrupted" and "sanitize_memcheck" not in steps'
tar tzf "$T/o3/gpu-check-logs.tar.gz" >/dev/null || fail "TERM run: no valid log pack"
pgrep -f "$T/bin/kernels_cuda_test" >/dev/null && fail "TERM run: the step's program is still running"

# 4. The global deadline: the sleeping step (60 s) is cut to what the 30 s budget leaves, the
# steps after it are skipped as out of time, and the run still finishes with its JSON (the
# bound allows a loaded machine 15 s for the remaining bookkeeping).
run "$T/o4" "$NOGPU" FAKE_SLEEP=60 GPU_CHECK_BUDGET_S=30 >/dev/null
check_json "$T/o4/gpu-check.json" 'j["finished"] and j["deadline_hit"] and j["total_seconds"] <= 45'
check_json "$T/o4/gpu-check.json" 'steps["kernels_cuda_test"]["status"] == "timed_out" and "out of time" in steps["comm_nccl_test"]["why"]'

[ -e "$T/python-called" ] && fail "the script called python3"
if [ "$FAILS" -eq 0 ]; then echo "gpu-check script: all checks passed"; fi
exit "$FAILS"
