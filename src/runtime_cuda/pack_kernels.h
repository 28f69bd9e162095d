// The kernels behind DeviceCopy / DeviceGatherAdd (pack_kernels.cu). C++17 (nvcc), raw device
// pointers only; pack.cpp owns the tables and checks the returned launch errors.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "distca/runtime_cuda/window.h"

namespace distca::runtime::device {

// pairs: [2 * rows] (src row, dst row) on the device. Returns cudaGetLastError after the launch.
cudaError_t launch_copy_rows(const int64_t* pairs, int64_t rows, const float* src, const Window& sw, float* dst,
                             const Window& dw, int64_t width, cudaStream_t stream);
// dsts [n_dst], offsets [n_dst + 1], srcs [offsets[n_dst]] on the device.
cudaError_t launch_gather_add(const int64_t* dsts, const int64_t* offsets, const int64_t* srcs, int64_t n_dst,
                              const float* src, const Window& sw, float* dst, const Window& dw, int64_t width,
                              cudaStream_t stream);

}  // namespace distca::runtime::device
