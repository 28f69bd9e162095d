// CudaAttention: plans a call on the host, stages its tile lists into the device workspace and
// enqueues the kernels (launch.h) on the caller's stream.
#include "distca/kernels_cuda/attention_cuda.h"

#include <cstring>

#include "distca/core/cuda_check.h"
#include "kernel_shapes.h"
#include "launch.h"

namespace distca::kernels {

using cuda_detail::DeviceArgs;

namespace {

DeviceArgs device_args(const AttentionParams& p, const CudaLaunchPlan& plan) {
  DeviceArgs a;
  a.dtype = p.dtype;
  a.q = p.q;
  a.k = p.k;
  a.v = p.v;
  a.o = p.o;
  a.lse = p.lse;
  a.d_o = p.d_o;
  a.dq = p.dq;
  a.dk = p.dk;
  a.dv = p.dv;
  a.cu_q = p.cu_seqlens_q;
  a.cu_k = p.cu_seqlens_k;
  a.n_heads = p.n_heads;
  a.n_kv_heads = p.n_kv_heads;
  a.head_dim = p.head_dim;
  a.group = p.n_heads / p.n_kv_heads;
  a.scale = p.scale();
  a.causal = p.causal;
  a.total_q = plan.total_q;
  return a;
}

}  // namespace

CudaAttention::~CudaAttention() {
  // Errors cannot be reported from a destructor; the frees are best effort after the work that
  // may still use the buffers has finished.
  for (cudaEvent_t e : {staged_, done_}) {
    if (e == nullptr) continue;
    (void)cudaEventSynchronize(e);
    (void)cudaEventDestroy(e);
  }
  if (device_ != nullptr) {
    (void)cudaDeviceSynchronize();
    (void)cudaFree(device_);
  }
  if (host_ != nullptr) (void)cudaFreeHost(host_);
}

Status CudaAttention::reserve(int64_t device_bytes, int64_t host_bytes) {
  if (staged_ == nullptr) DISTCA_CUDA_CHECK(cudaEventCreateWithFlags(&staged_, cudaEventDisableTiming));
  if (done_ == nullptr) DISTCA_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  // The previous call's upload must have left the staging buffer before it is rewritten, and
  // its kernels must be done with the device workspace before that is replaced.
  DISTCA_CUDA_CHECK(cudaEventSynchronize(staged_));
  if (device_bytes > device_bytes_) {
    if (device_ != nullptr) {
      DISTCA_CUDA_CHECK(cudaDeviceSynchronize());
      DISTCA_CUDA_CHECK(cudaFree(device_));
      device_ = nullptr;
      device_bytes_ = 0;
    }
    DISTCA_CUDA_CHECK(cudaMalloc(&device_, static_cast<size_t>(device_bytes)));
    device_bytes_ = device_bytes;
  }
  if (host_bytes > host_bytes_) {
    if (host_ != nullptr) {
      DISTCA_CUDA_CHECK(cudaFreeHost(host_));
      host_ = nullptr;
      host_bytes_ = 0;
    }
    DISTCA_CUDA_CHECK(cudaMallocHost(&host_, static_cast<size_t>(host_bytes)));
    host_bytes_ = host_bytes;
  }
  return {};
}

Status CudaAttention::stage_tiles(const CudaLaunchPlan& plan, cudaStream_t stream) {
  const cuda_shapes::WorkspaceLayout w = cuda_shapes::workspace_layout(plan, 1);
  DISTCA_RETURN_IF_ERROR(reserve(plan.workspace_bytes, w.tiles_bytes));
  if (w.tiles_bytes == 0) return {};
  // The previous call may have run on another stream: its kernels must be done reading the
  // workspace before this upload overwrites it (a device-side wait; the host goes on).
  DISTCA_CUDA_CHECK(cudaStreamWaitEvent(stream, done_, 0));
  auto* host = static_cast<char*>(host_);
  auto copy = [&](const std::vector<CudaTile>& t, int64_t offset) {
    if (!t.empty()) std::memcpy(host + offset, t.data(), t.size() * sizeof(CudaTile));
  };
  copy(plan.fwd_tiles, w.fwd_tiles);
  copy(plan.dq_tiles, w.dq_tiles);
  copy(plan.dkv_tiles, w.dkv_tiles);
  DISTCA_CUDA_CHECK(cudaMemcpyAsync(device_, host_, static_cast<size_t>(w.tiles_bytes), cudaMemcpyHostToDevice, stream));
  DISTCA_CUDA_CHECK(cudaEventRecord(staged_, stream));
  return {};
}

namespace {

Status mark(cudaEvent_t e, cudaStream_t stream) {
  if (e != nullptr) DISTCA_CUDA_CHECK(cudaEventRecord(e, stream));
  return {};
}

}  // namespace

Status CudaAttention::forward(const AttentionParams& p, const int32_t* host_cu_q, const int32_t* host_cu_k,
                              cudaStream_t stream, cudaEvent_t kernels_start) {
  DISTCA_ASSIGN_OR_RETURN(plan_, plan_cuda_attention(p, host_cu_q, host_cu_k, false, options_));
  if (plan_.fwd_tiles.empty()) return mark(kernels_start, stream);
  DISTCA_RETURN_IF_ERROR(stage_tiles(plan_, stream));
  DISTCA_RETURN_IF_ERROR(mark(kernels_start, stream));
  const DeviceArgs a = device_args(p, plan_);
  const auto* tiles = reinterpret_cast<const CudaTile*>(device_);
  DISTCA_RETURN_IF_ERROR(plan_.forward == CudaKernel::kTiled
                             ? cuda_detail::launch_tiled_forward(a, plan_, tiles, stream)
                             : cuda_detail::launch_simple_forward(a, plan_, tiles, stream));
  DISTCA_CUDA_CHECK(cudaEventRecord(done_, stream));
  return {};
}

Status CudaAttention::backward(const AttentionParams& p, const int32_t* host_cu_q, const int32_t* host_cu_k,
                               cudaStream_t stream, cudaEvent_t kernels_start) {
  DISTCA_ASSIGN_OR_RETURN(plan_, plan_cuda_attention(p, host_cu_q, host_cu_k, true, options_));
  if (plan_.dq_tiles.empty() && plan_.dkv_tiles.empty()) return mark(kernels_start, stream);
  DISTCA_RETURN_IF_ERROR(stage_tiles(plan_, stream));
  DISTCA_RETURN_IF_ERROR(mark(kernels_start, stream));
  const cuda_shapes::WorkspaceLayout w = cuda_shapes::workspace_layout(plan_, p.n_heads);
  DeviceArgs a = device_args(p, plan_);
  auto* base = static_cast<char*>(device_);
  a.dsum = reinterpret_cast<float*>(base + w.dsum);
  DISTCA_RETURN_IF_ERROR(cuda_detail::launch_dsum(a, stream));
  const auto* dq_tiles = reinterpret_cast<const CudaTile*>(base + w.dq_tiles);
  const auto* dkv_tiles = reinterpret_cast<const CudaTile*>(base + w.dkv_tiles);
  if (plan_.backward == CudaKernel::kTiled) {
    DISTCA_RETURN_IF_ERROR(cuda_detail::launch_tiled_backward(a, plan_, dq_tiles, dkv_tiles, stream));
  } else {
    DISTCA_RETURN_IF_ERROR(cuda_detail::launch_simple_dq(a, plan_, dq_tiles, stream));
    DISTCA_RETURN_IF_ERROR(cuda_detail::launch_simple_dkv(a, plan_, dkv_tiles, stream));
  }
  DISTCA_CUDA_CHECK(cudaEventRecord(done_, stream));
  return {};
}

}  // namespace distca::kernels
