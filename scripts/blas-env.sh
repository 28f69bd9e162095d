# Sourced by scripts/run.sh (and by hand before benchmarks): Debian's OpenBLAS 0.3.21 does not
# recognise some current Xeons (they report a generic "Intel Xeon Processor") and falls back
# to its SSE3 "Prescott" kernels, 3-8x slower than the CPU allows. When OPENBLAS_CORETYPE is not
# already set, pick the newest kernel family the CPU supports. The bits of BLAS results depend
# on the kernel family, so compare runs made under the same setting.
if [ -z "${OPENBLAS_CORETYPE:-}" ] && [ -r /proc/cpuinfo ]; then
  if grep -q -m1 -w avx512f /proc/cpuinfo; then
    export OPENBLAS_CORETYPE=SkylakeX
  elif grep -q -m1 -w avx2 /proc/cpuinfo; then
    export OPENBLAS_CORETYPE=Haswell
  fi
fi
