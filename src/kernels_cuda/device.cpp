// cuda_device_info(): the device query every CUDA test and the benchmark start with.
#include "distca/kernels_cuda/device.h"

#include <cuda_runtime_api.h>

#include "distca/core/cuda_check.h"

namespace distca::kernels {

Result<CudaDeviceInfo> cuda_device_info() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (cuda_no_device(err)) {
    return Status::not_found(std::string("no CUDA device: ") + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) +
                             ")");
  }
  DISTCA_CUDA_CHECK(err);
  if (count == 0) return Status::not_found("no CUDA device: cudaGetDeviceCount found 0");
  CudaDeviceInfo info;
  DISTCA_CUDA_CHECK(cudaGetDevice(&info.device));
  cudaDeviceProp prop{};
  DISTCA_CUDA_CHECK(cudaGetDeviceProperties(&prop, info.device));
  info.name = prop.name;
  info.sm_major = prop.major;
  info.sm_minor = prop.minor;
  info.sm_count = prop.multiProcessorCount;
  info.global_memory_bytes = static_cast<int64_t>(prop.totalGlobalMem);
  info.shared_memory_per_block_optin = static_cast<int64_t>(prop.sharedMemPerBlockOptin);
  return info;
}

}  // namespace distca::kernels
