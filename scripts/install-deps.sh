#!/usr/bin/env bash
# Installs every Debian package distca's build, tests, benchmarks and plots need. Idempotent:
# when everything is present it only checks (dpkg-query) and returns in well under a second.
# Runs as root (or with sudo available). clang and libclang-rt-14-dev (which holds the runtime
# -fsanitize=fuzzer links; libfuzzer-14-dev is only the standalone archive) build the fuzz targets
# (fuzz/, cmake/distca_fuzz.cmake). python3-dev, pybind11-dev and python3-pybind11 build the Python
# module (python/, for /usr/bin/python3); NumPy and pytest run its tests, torch the PyTorch example.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  nlohmann-json3-dev libcli11-dev libtomlplusplus-dev
  libopenblas-dev libopenmpi-dev openmpi-bin
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  gnuplot-nox
  clang libclang-rt-14-dev
  python3-dev pybind11-dev python3-pybind11 python3-numpy python3-pytest python3-torch
)

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
