#!/usr/bin/env bash
# Runs the libFuzzer targets for longer than the test command does:
#   scripts/fuzz.sh [SECONDS] [TARGET...]        (default: 600 seconds each, every target)
#   FUZZ_RUNS=10000000 scripts/fuzz.sh 0 fuzz_npy  (a fixed number of inputs instead)
#   FUZZ_SANITIZE=undefined scripts/fuzz.sh ...     (UBSan only: 2-3x faster, misses what
#                                                     only ASan sees; the default is
#                                                     address,undefined)
# Builds fuzz/ with clang++ into build/fuzz-<sanitizers>, then runs the targets one after another from
# their seed corpus (fuzz/corpus/<target>) plus what earlier runs found (build/fuzz-*/corpus/
# <target>, kept between runs). A crash stops that target, leaves its reproducer in
# build/fuzz-*/artifacts/ and makes the script exit 1; add the reproducer to the seed corpus
# and a unit test (docs/development.md, "Fuzzing").
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}
shift || true
source_dir=$PWD
sanitize=${FUZZ_SANITIZE:-address,undefined}
build=build/fuzz-${sanitize//,/-}
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
cmake -S fuzz -B "$build" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DDISTCA_FUZZ_SANITIZE="$sanitize" \
  "${launcher[@]}" >/dev/null
cmake --build "$build"
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for f in "$build"/fuzz_*; do [ -x "$f" ] && targets+=("$(basename "$f")"); done
fi
mkdir -p "$build/artifacts" "$build/tmp"
export ASAN_OPTIONS="quarantine_size_mb=16:${ASAN_OPTIONS:-}" TMPDIR="$PWD/$build/tmp"
limit=(-max_total_time="$seconds")
if [ -n "${FUZZ_RUNS:-}" ]; then limit=(-runs="$FUZZ_RUNS"); fi
failed=0
for t in "${targets[@]}"; do
  mkdir -p "$build/corpus/$t"
  dict=()
  if [ -f "$source_dir/fuzz/$t.dict" ]; then dict=(-dict="$source_dir/fuzz/$t.dict"); fi
  echo "fuzz: $t (${limit[*]})" >&2
  if ! "$build/$t" "${dict[@]}" "${limit[@]}" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$build/artifacts/$t-" "$build/corpus/$t" "$source_dir/fuzz/corpus/$t" \
      2> "$build/$t.log"; then
    echo "fuzz: $t FAILED; log $build/$t.log, reproducer in $build/artifacts/" >&2
    failed=1
  fi
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$build/$t.log" | sed "s/^/fuzz: $t /" >&2 || true
done
exit $failed
