#!/usr/bin/env bash
# The README's first command: installs what is missing for it (scripts/install-deps.sh --run),
# builds only the CLI and the Python module (the `first_command` target; the tests, benchmark
# programs and fuzz targets are the test command's) and runs the main job: `distca train` with
# its embedded default (configs/default.toml, docs/training.md). Extra arguments go to
# `distca train`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --run
cmake --preset release >/dev/null
cmake --build --preset release --target first_command
. scripts/blas-env.sh
exec build/release/apps/distca train "$@"
