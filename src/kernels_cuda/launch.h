// The kernel launchers (attention_simple.cu, attention_tiled.cu) as the host runner calls them.
// Each enqueues on `stream`, checks the launch, and never synchronises.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "distca/core/status.h"
#include "distca/kernels_cuda/attention_cuda.h"

namespace distca::kernels::cuda_detail {

// Device pointers and shapes of one call, by value into every kernel.
struct DeviceArgs {
  DType dtype = DType::kFloat32;
  const void* q = nullptr;    // (total_q, n_heads, head_dim) of dtype
  const void* k = nullptr;    // (total_kv, n_kv_heads, head_dim)
  const void* v = nullptr;
  void* o = nullptr;          // (total_q, n_heads, head_dim): forward output, backward input
  float* lse = nullptr;       // (n_heads, total_q)
  const void* d_o = nullptr;  // like o
  void* dq = nullptr;         // like q
  void* dk = nullptr;         // like k
  void* dv = nullptr;
  float* dsum = nullptr;      // workspace (n_heads, total_q): rowsum(dO o O)
  const int32_t* cu_q = nullptr;  // (n_tasks + 1)
  const int32_t* cu_k = nullptr;
  int32_t n_heads = 0, n_kv_heads = 0, head_dim = 0, group = 1;
  float scale = 0;
  bool causal = true;
  int64_t total_q = 0;
};

Status launch_simple_forward(const DeviceArgs& a, const CudaLaunchPlan& plan, const CudaTile* tiles,
                             cudaStream_t stream);
Status launch_dsum(const DeviceArgs& a, cudaStream_t stream);
Status launch_simple_dq(const DeviceArgs& a, const CudaLaunchPlan& plan, const CudaTile* tiles, cudaStream_t stream);
Status launch_simple_dkv(const DeviceArgs& a, const CudaLaunchPlan& plan, const CudaTile* tiles, cudaStream_t stream);
Status launch_tiled_forward(const DeviceArgs& a, const CudaLaunchPlan& plan, const CudaTile* tiles,
                            cudaStream_t stream);
// dQ, then dK/dV (after launch_dsum).
Status launch_tiled_backward(const DeviceArgs& a, const CudaLaunchPlan& plan, const CudaTile* dq_tiles,
                             const CudaTile* dkv_tiles, cudaStream_t stream);

}  // namespace distca::kernels::cuda_detail
