#!/usr/bin/env bash
# The one device check: gets the GPU programs (a carried bundle, else a full CUDA build, else
# the kernels-only build that needs nothing but the CUDA toolkit), runs each test program that
# can run, the sanitizers and the kernel benchmarks, and keeps under $OUT:
#   gpu-check.json          every step's status, rc and seconds, the device, the test counts
#                           with the names of failed and skipped tests, the benchmark output,
#                           what one GPU cannot exercise, the end of each failed step's log
#   gpu-check-logs.tar.gz   every step's log and raw output
# Both are rewritten after every step and from a trap on TERM, INT and EXIT, so a run cut at
# any point leaves a valid JSON that says where it stopped ("finished": false). Written by
# the shell alone (no python).
#
# Time: one global deadline, GPU_CHECK_BUDGET_S seconds after the start (default 420); every
# step's limit is cut to what is left of it (less 10 s for the summary), and a step with under
# 5 s left is recorded as skipped. Give the device call a timeout of at least the budget + 30.
#
# Usage: OUT=/some/dir scripts/gpu-check.sh        (OUT defaults to ./gpu-check-out)
#        scripts/gpu-check.sh --bundle [BUILD_DIR]  (on a development machine, see below; set
#          CCACHE_LAUNCHERS="-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache";
#          BUILD_DIR: pack the programs already built there instead, for trying the bundle path)
# Exit: 0 when every step that could run passed; 1 otherwise (gpu-check.json says which);
# 124 when interrupted by a signal.
#
# Where the programs come from, first that applies:
#   GPU_CHECK_BIN=DIR        programs already built (distca, kernels_cuda_test, ...) in DIR
#   build/gpu-bundle.tar.gz  made here by `scripts/gpu-check.sh --bundle` and carried to the
#                            device (run's `carry`): the five programs, stripped and portable,
#                            (CUDA runtime linked in) and every shared library they load
#                            (libstdc++, OpenBLAS, MPI, ...) except glibc's, the driver's
#                            libcuda and CUDA 13's libcublas and libnccl (too big to carry:
#                            found on the device, PATH of the CUDA toolkit or the NCCL wheel),
#                            with the commit it was built from
#   cmake --preset cuda      the full build (needs OpenBLAS, MPI, OpenMP, GTest, CLI11,
#                            toml++, nlohmann-json and NCCL)
#   cmake --preset cuda-kernels  (DISTCA_KERNELS_ONLY: distca_kernels_cuda and its test
#                            programs; needs the CUDA toolkit and GTest, found installed or
#                            built from the source the bundle step packs as build/gtest-src)
# A bundle whose kernels_cuda_test does not start on the image falls through to the builds
# (with the bundle's googletest source). Each program runs only when `ldd` finds every library
# it loads; else it is skipped naming the missing ones, and the others still run.
#
# Adding a check: one `step NAME LIMIT_S command...` line (output to $WORK/NAME.log); a test
# program goes through run_tests (its counts land in the JSON), a benchmark through bench.
set -uo pipefail

cd "$(dirname "$0")/.."
BUNDLE=build/gpu-bundle.tar.gz
PROGRAMS="distca kernels_cuda_test kernels_cuda_cli_test comm_nccl_test runtime_pack_cuda_test"
if [ "${1:-}" = "--bundle" ]; then
  set -e
  b=${2:-build/cuda-bundle}
  if [ -z "${2:-}" ]; then
    # Portable code (no -march=native: the device's CPU may lack this one's instructions).
    cmake --preset cuda -B "$b" -DDISTCA_BUILD_BENCH=OFF -DDISTCA_NATIVE=OFF ${CCACHE_LAUNCHERS:-} >/dev/null
    # shellcheck disable=SC2086
    cmake --build "$b" --target $PROGRAMS -j"$(nproc)"
  fi
  stage=build/gpu-bundle
  rm -rf "$stage" && mkdir -p "$stage/bin" "$stage/lib"
  for p in apps/distca tests/kernels_cuda/kernels_cuda_test tests/kernels_cuda/kernels_cuda_cli_test \
           tests/comm_nccl/comm_nccl_test tests/runtime_cuda/runtime_pack_cuda_test; do
    if [ -x "$b/$p" ]; then cp "$b/$p" "$stage/bin/"; else echo "bundle: $b/$p not built, left out"; fi
  done
  strip "$stage"/bin/*
  # Every library the binaries load except glibc's (the device's is newer), the driver's
  # libcuda (it must match the device's kernel module) and CUDA 13's libcublas(Lt) and libnccl
  # (over 800 MB, past what a device call carries; the device image has CUDA 13 and NCCL).
  # The CUDA runtime is linked in statically.
  for bin in "$stage"/bin/*; do ldd "$bin"; done | awk '/=> \//{print $3}' | sort -u |
    grep -v -E '/(libc|libm|libdl|libpthread|librt|libresolv|libcuda|libcublas|libcublasLt|libnccl|ld-linux[^/]*)\.so' |
    while read -r lib; do cp -L "$lib" "$stage/lib/"; done
  for bin in "$stage"/bin/*; do
    echo "$(basename "$bin"): $(ldd "$bin" | grep -o -E 'lib(cublas|cublasLt|nccl)\.so[.0-9]*' | sort -u | tr '\n' ' ')"
  done >"$stage/needs-from-device"
  { git rev-parse HEAD 2>/dev/null || echo unknown; git status --porcelain 2>/dev/null | wc -l; } >"$stage/commit"
  # GoogleTest's source (Debian's googletest package) for the kernels-only build on a device
  # without GTest installed.
  [ -d /usr/src/googletest ] && rm -rf build/gtest-src && cp -r /usr/src/googletest build/gtest-src
  tar czf "$BUNDLE" -C build gpu-bundle $([ -d build/gtest-src ] && echo gtest-src)
  echo "bundle: $BUNDLE ($(du -h "$BUNDLE" | cut -f1)); carry it to the device run"
  exit 0
fi

OUT="${OUT:-$PWD/gpu-check-out}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
# Logs and raw outputs live in WORK and are packed into $OUT after every step: the device tool
# returns at most 8 files from $OUT.
WORK="$(mktemp -d /tmp/gpu-check.XXXXXX)"
PROGS="$(mktemp -d /tmp/gpu-check-programs.XXXXXX)"  # the unpacked bundle or links to a build
JOBS="$(nproc)"
printf -v START '%(%s)T' -1
BUDGET="${GPU_CHECK_BUDGET_S:-420}"
DEADLINE=$((START + BUDGET))
RESERVE=10
HAVE_GPU=0
DEVICE=""
SOURCE=none      # where the programs came from: bin, bundle, full, kernels-only, none
BUNDLE_COMMIT=""
FAILED=0
FINISHED=false
INTERRUPTED=""
DEADLINE_HIT=false
S_NAME=() S_STATUS=() S_RC=() S_SEC=() S_WHY=()
TEST_JSON=()     # "name":{...} of every test program that ran
BENCH_JSON=()    # "name":{...} of every benchmark that produced its JSON
CUR_STEP="" CUR_PID="" CUR_T0=0
# Tests that skip BECAUSE a GPU is present (they check the no-GPU behaviour), or that need two.
NO_GPU_ONLY=" CudaAttentionRunner.NoDeviceIsAStatusNotACrash BenchAttentionCuda.WithoutAGpuIsRefused
  NcclComm.NoDeviceIsTheSameOneLineErrorOnEveryRank NcclComm.TwoRanksOnTwoGpusMatchTheBootstrapBitwise "

# --- JSON, written by the shell -------------------------------------------------------------

# JSON by the shell, with few processes (the device machine may be loaded): each helper sets
# REPLY. json_str: $1 as a JSON string; control bytes other than tab/newline/CR and non-ASCII
# bytes are dropped (logs may hold anything).
json_str() {
  local s=$1
  if [[ $s == *[![:print:]]* ]]; then s=$(printf '%s' "$s" | LC_ALL=C tr -d '\000-\010\013\014\016-\037\177-\377'); fi
  s=${s//\\/\\\\}
  s=${s//\"/\\\"}
  s=${s//$'\t'/\\t}
  s=${s//$'\r'/\\r}
  s=${s//$'\n'/\\n}
  REPLY="\"$s\""
}
json_list() {  # a JSON array of strings from the arguments
  local out="" x
  for x in "$@"; do json_str "$x"; out+="${out:+, }$REPLY"; done
  REPLY="[$out]"
}
join_json() {  # REPLY = the arguments after $1 joined by $1
  local sep=$1 out="" x
  shift
  for x in "$@"; do out+="${out:+$sep}$x"; done
  REPLY=$out
}
now() { printf -v NOW '%(%s)T' -1; }
bool() { if [ "$1" = 1 ] || [ "$1" = true ]; then REPLY=true; else REPLY=false; fi; }

write_json() {
  local i steps=() st j
  now
  for i in "${!S_NAME[@]}"; do
    json_str "${S_NAME[$i]}"
    st="{\"name\": $REPLY, \"status\": \"${S_STATUS[$i]}\", \"rc\": ${S_RC[$i]}, \"seconds\": ${S_SEC[$i]}"
    if [ -n "${S_WHY[$i]}" ]; then json_str "${S_WHY[$i]}"; st+=", \"why\": $REPLY"; fi
    case "${S_STATUS[$i]}" in
      failed|timed_out|interrupted)
        if [ -f "$WORK/${S_NAME[$i]}.log" ]; then
          json_str "$(tail -c 3000 "$WORK/${S_NAME[$i]}.log")"
          st+=", \"log_tail\": $REPLY"
        fi ;;
    esac
    steps+=("$st}")
  done
  j="{"$'\n'"  \"finished\": $FINISHED,"$'\n'
  if [ -n "$INTERRUPTED" ]; then json_str "$INTERRUPTED"; else REPLY=null; fi
  j+="  \"interrupted\": $REPLY,"$'\n'
  bool "$FAILED"; j+="  \"failed\": $REPLY,"$'\n'
  bool "$HAVE_GPU"; j+="  \"gpu\": $REPLY,"$'\n'
  json_str "$DEVICE"; j+="  \"device\": $REPLY,"$'\n'
  j+="  \"programs_from\": \"$SOURCE\","$'\n'
  json_str "$BUNDLE_COMMIT"; j+="  \"bundle_commit\": $REPLY,"$'\n'
  j+="  \"total_seconds\": $((NOW - START)),"$'\n'"  \"budget_seconds\": $BUDGET,"$'\n'
  j+="  \"deadline_hit\": $DEADLINE_HIT,"$'\n'
  join_json $',\n    ' "${steps[@]}"; j+="  \"steps\": ["$'\n'"    $REPLY"$'\n'"  ],"$'\n'
  join_json ', ' "${TEST_JSON[@]}"; j+="  \"tests\": {$REPLY},"$'\n'
  join_json ', ' "${BENCH_JSON[@]}"; j+="  \"benchmarks\": {$REPLY},"$'\n'
  json_list \
    "comm_nccl: grouped NCCL send/recv between two ranks (NcclComm.TwoRanksOnTwoGpusMatchTheBootstrapBitwise, comm_nccl_mpi_np2): NCCL refuses two ranks on one GPU" \
    "comm_nccl: a count mismatch between ranks of an all_to_all_v on the device (host-tested only: comm_nccl_logic_test)" \
    "comm_nccl: the timeout and ncclCommAbort path with a peer that stops, and the abort of communicators after a failed initialisation on one rank" \
    "runtime_cuda: device data movement between two processes (runtime_pack_cuda_test moves between ranks simulated on one GPU)"
  j+="  \"not_exercised_on_one_gpu\": $REPLY"$'\n'"}"
  printf '%s\n' "$j" >"$OUT/.gpu-check.json.tmp" && mv -f "$OUT/.gpu-check.json.tmp" "$OUT/gpu-check.json"
}

# Rewrites the JSON and the log pack (each atomically: a temporary file, then a rename).
save() {
  write_json
  tar czf "$OUT/.gpu-check-logs.tar.gz.tmp" -C "$WORK" . 2>/dev/null &&
    mv -f "$OUT/.gpu-check-logs.tar.gz.tmp" "$OUT/gpu-check-logs.tar.gz"
}

record() {  # record NAME STATUS RC SECONDS WHY
  S_NAME+=("$1") S_STATUS+=("$2") S_RC+=("$3") S_SEC+=("$4") S_WHY+=("$5")
}
skip() {  # skip NAME WHY: a step that did not run (no new log: the JSON alone is rewritten)
  record "$1" skipped null 0 "$2"
  echo "== $1: skipped ($2)"
  write_json
}

# On TERM/INT: stop the running step, record it as interrupted, write everything, exit 124.
on_signal() {
  trap - TERM INT
  now
  INTERRUPTED="signal $1 at $((NOW - START)) s"
  if [ -n "$CUR_PID" ]; then
    kill -TERM "$CUR_PID" 2>/dev/null
    wait "$CUR_PID" 2>/dev/null
    now
    record "$CUR_STEP" interrupted null "$((NOW - CUR_T0))" "$INTERRUPTED"
  fi
  FAILED=1
  save
  exit 124
}
on_exit() {
  [ "$FINISHED" = true ] || save
  rm -rf "$WORK" "$PROGS"
}
trap 'on_signal TERM' TERM
trap 'on_signal INT' INT
trap on_exit EXIT

# step NAME LIMIT_S CMD...: runs CMD with LIMIT_S cut to the deadline, logs to $WORK/NAME.log.
# A failing step marks the run failed but the sequence goes on. Returns CMD's rc (124: time).
step() {
  local name=$1 limit=$2
  shift 2
  now
  local left=$((DEADLINE - RESERVE - NOW))
  if [ "$left" -lt 5 ]; then
    DEADLINE_HIT=true
    skip "$name" "out of time (the ${BUDGET} s budget)"
    return 124
  fi
  if [ "$limit" -gt "$left" ]; then limit=$left; DEADLINE_HIT=true; fi
  echo "== $name (limit ${limit}s)"
  CUR_STEP=$name CUR_T0=$NOW
  # In the background, so a signal reaches the trap at once (bash runs traps between commands).
  timeout --kill-after=5 "$limit" "$@" >"$WORK/$name.log" 2>&1 &
  CUR_PID=$!
  wait "$CUR_PID"
  local rc=$?
  CUR_PID=""
  now
  local dt=$((NOW - CUR_T0)) status=passed
  [ "$rc" -eq 0 ] || status=failed
  [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && status=timed_out
  record "$name" "$status" "$rc" "$dt" ""
  echo "   $status (rc=$rc) in ${dt}s"
  tail -n 3 "$WORK/$name.log" | sed 's/^/   | /'
  [ "$rc" -eq 0 ] || FAILED=1
  save
  return "$rc"
}
# unavailable WHY FAILED_BEFORE: the last step failed for a reason of the machine, not of the
# code (a fallback follows, or the tool cannot run here): not a finding.
unavailable() {
  local i=$((${#S_STATUS[@]} - 1))
  S_STATUS[$i]=unavailable
  S_WHY[$i]=$1
  FAILED=$2
  save
}

# The libraries `$1` loads that ldd cannot find, space-separated ("" when none).
missing_libs() { ldd "$1" 2>/dev/null | awk '/not found/{print $1}' | sort -u | tr '\n' ' ' | sed 's/ $//'; }

# Counts of a GoogleTest program's log (its per-test result lines): "NAME": {...}. On a GPU,
# a skipped test outside NO_GPU_ONLY fails the run.
test_counts() {
  local name=$1 log=$2 passed failed skipped extra=""
  passed=$(grep -c -E '^\[ +OK +\] [^ ]+.* \([0-9]+ ms\)$' "$log")
  local fl=() sl=() t
  while read -r t; do [ -n "$t" ] && fl+=("$t"); done < <(sed -n -E 's/^\[  FAILED  \] ([^ ,]+)(, where .*)? \([0-9]+ ms\)$/\1/p' "$log")
  while read -r t; do [ -n "$t" ] && sl+=("$t"); done < <(sed -n -E 's/^\[  SKIPPED \] ([^ ,]+)(, where .*)? \([0-9]+ ms\)$/\1/p' "$log")
  failed=${#fl[@]} skipped=${#sl[@]}
  if [ "$HAVE_GPU" = 1 ]; then
    local wrong=()
    for t in "${sl[@]}"; do [[ "$NO_GPU_ONLY" == *" $t "* ]] || wrong+=("$t"); done
    if [ "${#wrong[@]}" -gt 0 ]; then
      json_str "tests skipped although a GPU is present: ${wrong[*]}"
      extra=", \"error\": $REPLY"
      FAILED=1
    fi
  fi
  local entry="\"$name\": {\"passed\": $passed, \"failed\": $failed, \"skipped\": $skipped"
  json_list "${fl[@]}"
  entry+=", \"failed_tests\": $REPLY"
  json_list "${sl[@]}"
  TEST_JSON+=("$entry, \"skipped_tests\": $REPLY$extra}")
}

# run_tests NAME LIMIT_S [gtest flags...]: the test program NAME from $BIN, if it exists and
# loads; its counts go to the JSON.
run_tests() {
  local name=$1 limit=$2
  shift 2
  local bin="$BIN/$name" miss
  if [ ! -x "$bin" ]; then skip "$name" "not built ($SOURCE)"; return; fi
  miss=$(missing_libs "$bin")
  if [ -n "$miss" ]; then skip "$name" "ldd: not found: $miss"; return; fi
  step "$name" "$limit" "$bin" --gtest_output="json:$WORK/$name.json" "$@"
  [ -f "$WORK/$name.log" ] && test_counts "$name" "$WORK/$name.log" && save
}

# bench NAME LIMIT_S distca-args...: one `distca bench attention --json` run; its JSON is kept
# when it completed.
bench() {
  local name=$1 limit=$2
  shift 2
  step "$name" "$limit" sh -c '"$0" "$@" > "'"$WORK/$name.json"'"' "$BIN/distca" bench attention --json "$@" || return
  if [ -s "$WORK/$name.json" ] && [ "$(tail -c 2 "$WORK/$name.json" | tr -d '\n ')" = "}" ]; then
    BENCH_JSON+=("\"$name\": $(<"$WORK/$name.json")")
    save
  fi
}

save
# 1. The device (absent on CPU-only machines: then the device steps below are skipped).
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  HAVE_GPU=1
  step device 30 nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv &&
    DEVICE=$(tail -n 1 "$WORK/device.log")
else
  skip device "no nvidia-smi or no GPU"
fi

# 2. The programs: given, from the bundle, or built (full, else kernels-only).
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}"
LAUNCHERS=()
if command -v ccache >/dev/null 2>&1; then
  LAUNCHERS=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
GEN=()
command -v ninja >/dev/null 2>&1 || GEN=(-G "Unix Makefiles")
# copy_built DIR: the programs of a build tree into one folder, as the bundle has them.
BIN="$PROGS/bin"
mkdir -p "$BIN"
copy_built() {
  local p
  for p in "$1/apps/distca" "$1"/tests/kernels_cuda/kernels_cuda_test "$1"/tests/kernels_cuda/kernels_cuda_cli_test \
           "$1"/tests/comm_nccl/comm_nccl_test "$1"/tests/runtime_cuda/runtime_pack_cuda_test; do
    [ -x "$p" ] && ln -sf "$PWD/$p" "$BIN/"
  done
}
GTEST_SRC=build/gtest-src  # googletest's source for the kernels-only build (or the bundle's)

# use_bundle: the carried bundle's programs. Fails (so a build follows) when its
# kernels_cuda_test cannot start here (a library missing or too old on this image).
use_bundle() {
  local dir="$PROGS/bundle" lib found before=$FAILED
  mkdir -p "$dir"
  step bundle 60 tar xzf "$BUNDLE" -C "$dir" || return 1
  [ -d "$dir/gtest-src" ] && GTEST_SRC="$dir/gtest-src"
  BUNDLE_COMMIT=$(tr '\n' ' ' <"$dir/gpu-bundle/commit" 2>/dev/null | sed 's/ $//')
  export LD_LIBRARY_PATH="$dir/gpu-bundle/lib:$LD_LIBRARY_PATH"
  # libcublas, libnccl (left out of the bundle) or anything else missing: wherever the image
  # has them (NCCL may come only with a Python wheel), each search bounded.
  for lib in $(for b in "$dir"/gpu-bundle/bin/*; do missing_libs "$b"; done | tr ' ' '\n' | sort -u); do
    found=$(timeout 30 find / \( -path /proc -o -path /sys -o -path /dev \) -prune -o -name "$lib" -print -quit 2>/dev/null)
    [ -n "$found" ] && LD_LIBRARY_PATH="$(dirname "$found"):$LD_LIBRARY_PATH"
  done
  { for b in "$dir"/gpu-bundle/bin/*; do echo "$b: $(missing_libs "$b")"; done; } >"$WORK/bundle_ldd.log"
  if ! step bundle_starts 30 "$dir/gpu-bundle/bin/kernels_cuda_test" --gtest_list_tests; then
    unavailable "the bundle's kernels_cuda_test does not start here: building instead" "$before"
    return 1
  fi
  SOURCE=bundle
  BIN="$dir/gpu-bundle/bin"
}

# use_build: the full build, else the kernels-only one (CUDA toolkit and googletest's source).
use_build() {
  local before=$FAILED gtest=()
  if step configure 90 cmake --preset cuda -DDISTCA_BUILD_BENCH=OFF "${GEN[@]}" "${LAUNCHERS[@]}"; then
    # shellcheck disable=SC2086
    step build 300 cmake --build build/cuda --target $PROGRAMS -j"$JOBS" && SOURCE=full && copy_built build/cuda
    return
  fi
  unavailable "the full build's dependencies are missing here: trying the kernels-only build" "$before"
  [ -d "$GTEST_SRC" ] && gtest=(-DDISTCA_GTEST_SOURCE_DIR="$(cd "$GTEST_SRC" && pwd)")
  step configure_kernels_only 60 cmake --preset cuda-kernels "${GEN[@]}" "${LAUNCHERS[@]}" "${gtest[@]}" &&
    step build_kernels_only 240 cmake --build build/cuda-kernels --target kernels_cuda_test -j"$JOBS" &&
    SOURCE=kernels-only && copy_built build/cuda-kernels
}

if [ -n "${GPU_CHECK_BIN:-}" ]; then
  SOURCE=bin
  BIN="$(cd "$GPU_CHECK_BIN" && pwd)"
  record programs passed 0 0 "GPU_CHECK_BIN=$BIN"
elif ! { [ -f "$BUNDLE" ] && use_bundle; }; then
  use_build
fi
export DISTCA_CLI="$BIN/distca"  # kernels_cuda_cli_test runs this binary

# 3. The kernel tests first (accuracy against fp64, determinism; device tests skip without a
# GPU and, with one, a skip fails the check), then the bf16 benchmark: the figures that matter.
run_tests kernels_cuda_test 90
if [ "$HAVE_GPU" = 1 ] && [ -x "$BIN/distca" ] && [ -z "$(missing_libs "$BIN/distca")" ]; then
  # d = 128, causal, 32/8 heads, single tasks 1K..16K and shard batches of a 16K context
  # (docs/kernels.md, "CUDA"), beside cuBLAS GEMM measured in the same run.
  bench bench_attention_cuda 60 --device cuda --dtype bf16 --max-len 16384 --context 16384 --repeats 3
elif [ -x "$BIN/distca" ] && [ -z "$(missing_libs "$BIN/distca")" ]; then
  # Without a GPU the command must refuse with one line and exit 2.
  "$BIN/distca" bench attention --device cuda >"$WORK/bench_attention_cuda.log" 2>&1
  rc=$?
  if [ "$rc" -eq 2 ]; then
    skip bench_attention_cuda "no GPU (refused: $(head -c 200 "$WORK/bench_attention_cuda.log"))"
  else
    record bench_attention_cuda_refusal failed "$rc" 0 "expected exit 2 without a GPU"
    FAILED=1
    save
  fi
else
  skip bench_attention_cuda "no distca program that loads ($SOURCE)"
fi

# 4. The NCCL backend (one rank against its bootstrap, bitwise), the dispatcher's device data
# movement against the host tables (bitwise), the CLI contract.
run_tests comm_nccl_test 90
run_tests runtime_pack_cuda_test 90
run_tests kernels_cuda_cli_test 60

# 5. compute-sanitizer on a small pack: out-of-bounds accesses, shared-memory races, barrier
# misuse. On gVisor it refuses the device ("not supported"): recorded as a skip.
SANITIZER=$(command -v compute-sanitizer 2>/dev/null)
for c in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
  [ -z "$SANITIZER" ] && [ -x "$c" ] && SANITIZER=$c
done
for tool in memcheck racecheck synccheck; do
  if [ "$HAVE_GPU" != 1 ]; then
    skip "sanitize_$tool" "no GPU"
  elif [ -z "$SANITIZER" ]; then
    skip "sanitize_$tool" "compute-sanitizer not found (PATH, /usr/local/cuda/bin, /usr/local/cuda/compute-sanitizer)"
  elif [ ! -x "$BIN/kernels_cuda_test" ]; then
    skip "sanitize_$tool" "no kernels_cuda_test"
  else
    before=$FAILED
    if ! step "sanitize_$tool" 60 "$SANITIZER" --tool "$tool" --error-exitcode 3 \
        "$BIN/kernels_cuda_test" --gtest_filter=CudaAttention.SanitizerPack &&
       grep -q -i "not supported" "$WORK/sanitize_$tool.log"; then
      unavailable "compute-sanitizer: device not supported on this runtime" "$before"
    fi
  fi
done

# 6. The other benchmarks: fp16, and the simple (CUDA-core) kernels for what the tiled gain.
if [ "$HAVE_GPU" = 1 ] && [ -x "$BIN/distca" ] && [ -z "$(missing_libs "$BIN/distca")" ]; then
  bench bench_attention_cuda_fp16 45 --device cuda --dtype fp16 --max-len 16384 --context 16384 --repeats 3
  bench bench_attention_cuda_simple 45 --device cuda --dtype bf16 --kernel simple --max-len 4096 --context 4096 \
    --repeats 2
else
  skip bench_attention_cuda_fp16 "no GPU or no distca program"
  skip bench_attention_cuda_simple "no GPU or no distca program"
fi

FINISHED=true
save
now
echo "== done in $((NOW - START))s: $OUT/gpu-check.json, logs in $OUT/gpu-check-logs.tar.gz"
exit "$FAILED"
