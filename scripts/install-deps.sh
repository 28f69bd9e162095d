#!/usr/bin/env bash
# Installs the Debian packages distca needs. Idempotent: when everything is present it only
# checks (dpkg-query) and returns in well under a second. Runs as root (or with sudo available).
#
#   scripts/install-deps.sh --run   what scripts/run.sh builds: the CLI and the Python module
#                                   (about 215 packages, 175 MB to download on a bare Debian 12)
#   scripts/install-deps.sh         that and what the tests, benchmarks and plots need
#                                   (scripts/test.sh; about 530 packages, 440 MB)
#
# python3-dev, pybind11-dev and python3-pybind11 build the Python module (python/, for
# /usr/bin/python3), NumPy runs it. The rest: GoogleTest and Google Benchmark; clang and
# libclang-rt-14-dev (which holds the runtime -fsanitize=fuzzer links; libfuzzer-14-dev is only
# the standalone archive) build the fuzz targets (fuzz/, cmake/distca_fuzz.cmake); pytest runs
# the module's tests, torch the PyTorch example; gnuplot draws the sweeps' figures.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  nlohmann-json3-dev libcli11-dev libtomlplusplus-dev
  libopenblas-dev libopenmpi-dev openmpi-bin
  python3-dev pybind11-dev python3-pybind11 python3-numpy
)
case "${1:-}" in
  --run) ;;
  "")
    packages+=(
      libgtest-dev libgmock-dev googletest libbenchmark-dev
      gnuplot-nox
      clang libclang-rt-14-dev
      python3-pytest python3-torch
    ) ;;
  *) echo "usage: scripts/install-deps.sh [--run]" >&2; exit 2 ;;
esac

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
