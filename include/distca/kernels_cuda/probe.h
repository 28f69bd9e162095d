// Timing the CUDA attention kernels on random inputs: what `distca bench attention --device cuda`
// runs (and, later, a profiled H200 cost table).
//
// Thread safety: uses the current device and its own stream; one at a time per process.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "distca/core/status.h"
#include "distca/kernels_cuda/attention_cuda.h"

namespace distca::kernels {

struct CudaProbe {
  std::vector<std::pair<int64_t, int64_t>> tasks;  // (q_len, kv_len) each
  int32_t n_heads = 32, n_kv_heads = 8, head_dim = 128;
  DType dtype = DType::kBFloat16;
  bool causal = true;
  int repeats = 5;  // timed repetitions after one warm-up (median)
  CudaAttentionOptions options;
  uint64_t seed = 1;
};

struct CudaTiming {
  double forward_seconds = 0, backward_seconds = 0;  // medians (CUDA events from a call's first kernel to its end)
  double forward_flops = 0, backward_flops = 0;      // pairs-based (attention.h)
  CudaKernel forward_kernel = CudaKernel::kSimple, backward_kernel = CudaKernel::kSimple;
};

// Device bytes time_cuda_attention allocates for `probe` (inputs, outputs, gradients, the
// kernels' workspace), so callers can refuse a probe that does not fit before running it.
double cuda_probe_bytes(const CudaProbe& probe);

// Allocates the buffers, fills q, k, v, dO with uniform [-1, 1) values (a counter hash of
// `seed`, on the device), runs forward + backward once, then `repeats` timed times. Errors:
// invalid_argument for bad shapes (named as in plan_cuda_attention), not_found without a
// device, internal for CUDA failures.
Result<CudaTiming> time_cuda_attention(const CudaProbe& probe);

// The baseline measured beside the kernels: cuBLAS GEMM (n x n x n, `dtype` in and out, fp32
// accumulation; fp32 without TF32) TFLOP/s, median of `repeats` after a warm-up. Every cuBLAS
// call is checked (Status::internal naming the call, file and line).
Result<double> time_cublas_gemm(int64_t n, DType dtype, int repeats);

}  // namespace distca::kernels
