#!/usr/bin/env bash
# Installs what is missing, builds the release preset and runs the main job: `distca train`
# with its embedded default (configs/default.toml, docs/training.md). Extra arguments go to
# `distca train`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake --preset release >/dev/null
cmake --build --preset release
. scripts/blas-env.sh
exec build/release/apps/distca train "$@"
