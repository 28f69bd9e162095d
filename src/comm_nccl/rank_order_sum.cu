// The rank-order sum of all_reduce_sum_device: one thread per element, the n contributions
// added in rank order exactly as serial_rank_order_sum does on the host. Only additions, so
// no contraction into FMA can change the bits (the file is also built with --fmad=false).
#include "rank_order_sum.h"

namespace distca::comm::nccl {
namespace {

template <class T>
__global__ void rank_order_sum_kernel(const T* __restrict__ rows, int64_t n, int64_t m, T* __restrict__ out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < m; i += stride) {
    T acc = rows[i];
    for (int64_t p = 1; p < n; ++p) acc += rows[p * m + i];
    out[i] = acc;
  }
}

template <class T>
cudaError_t launch(const T* rows, int64_t n, int64_t m, T* out, cudaStream_t stream) {
  if (m <= 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const int64_t blocks = (m + kThreads - 1) / kThreads;
  const unsigned grid = static_cast<unsigned>(blocks < 65535 ? blocks : 65535);  // grid-stride beyond
  rank_order_sum_kernel<T><<<grid, kThreads, 0, stream>>>(rows, n, m, out);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_rank_order_sum(const float* rows, int64_t n, int64_t m, float* out, cudaStream_t stream) {
  return launch(rows, n, m, out, stream);
}
cudaError_t launch_rank_order_sum(const double* rows, int64_t n, int64_t m, double* out, cudaStream_t stream) {
  return launch(rows, n, m, out, stream);
}

}  // namespace distca::comm::nccl
