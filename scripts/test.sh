#!/usr/bin/env bash
# Installs what is missing (every package, scripts/install-deps.sh), builds the whole release
# preset (the tests, the benchmark programs and the clang fuzz sub-build included; a missing
# tool for any of them fails the configure, DISTCA_REQUIRE_TEST_TOOLS) and runs the whole test
# suite (every CTest entry except those labelled `slow`). Prints CTest's summary line; exits
# non-zero on any failure. Where nvcc is present (/usr/local/cuda), it then compiles the CUDA layer (the
# cuda preset's CUDA libraries and GPU test programs, not the rest of the tree again) and runs
# those programs: on a machine without a GPU their device tests report skipped and their
# CPU-side tests run (scripts/gpu-check.sh runs everything on a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cmake --preset release -DDISTCA_REQUIRE_TEST_TOOLS=ON >/dev/null
cmake --build --preset release
ctest --preset release "$@"
if [ -x /usr/local/cuda/bin/nvcc ]; then
  cmake --preset cuda >/dev/null
  cmake --build --preset cuda --target kernels_cuda_test kernels_cuda_emulated_test comm_nccl_test runtime_pack_cuda_test
  for t in kernels_cuda/kernels_cuda_test kernels_cuda/kernels_cuda_emulated_test comm_nccl/comm_nccl_test \
           runtime_cuda/runtime_pack_cuda_test; do
    build/cuda/tests/$t --gtest_brief=1
  done
fi
