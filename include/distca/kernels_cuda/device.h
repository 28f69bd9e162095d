// The CUDA device as distca sees it: whether one is usable, and its name and size.
//
// Thread safety: cuda_device_info() may be called from any thread.
#pragma once

#include <cstdint>
#include <string>

#include "distca/core/status.h"

namespace distca::kernels {

struct CudaDeviceInfo {
  int device = 0;        // the current device's ordinal
  std::string name;      // e.g. "NVIDIA H200"
  int sm_major = 0, sm_minor = 0;
  int sm_count = 0;
  int64_t global_memory_bytes = 0;
  int64_t shared_memory_per_block_optin = 0;
};

// The current device. A machine without a GPU or driver gives Status::not_found whose message
// says so ("no CUDA device: ..."), so callers can skip or refuse with one line; any other CUDA
// failure is Status::internal (core/cuda_check.h).
Result<CudaDeviceInfo> cuda_device_info();

}  // namespace distca::kernels
