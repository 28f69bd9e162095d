// The device half of NcclCommunicator::all_reduce_sum_device (rank_order_sum.cu).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace distca::comm::nccl {

// out[i] = ((rows[0][i] + rows[1][i]) + rows[2][i]) + ... + rows[n-1][i] in T, for i < m;
// rows: (n, m) row-major on the device; out: (m) on the device. Enqueued on `stream`; returns
// the launch error (cudaGetLastError), cudaSuccess when m == 0 (nothing launched).
cudaError_t launch_rank_order_sum(const float* rows, int64_t n, int64_t m, float* out, cudaStream_t stream);
cudaError_t launch_rank_order_sum(const double* rows, int64_t n, int64_t m, double* out, cudaStream_t stream);

}  // namespace distca::comm::nccl
