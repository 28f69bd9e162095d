#!/usr/bin/env bash
# Installs what is missing, builds the release preset and runs the whole test suite (every
# CTest entry except those labelled `slow`). Prints CTest's summary line; exits non-zero on
# any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cmake --preset release >/dev/null
cmake --build --preset release
ctest --preset release "$@"
