// The one switch between the real CUDA build and the host emulation of the kernels
// (host_emulation.h, used by tests/kernels_cuda/test_emulated.cpp only): what a kernel's dynamic
// shared memory is called, and, under emulation, the CUDA spellings the kernels use.
#pragma once

#if defined(DISTCA_CUDA_EMULATION)
#include <algorithm>

#include "host_emulation.h"
namespace distca::kernels::cuda_detail {
using std::max;
using std::min;
}  // namespace distca::kernels::cuda_detail
#else
#define DISTCA_DYNAMIC_SMEM(name) extern __shared__ __align__(128) unsigned char name[]
#endif
