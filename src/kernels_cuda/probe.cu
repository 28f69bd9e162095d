// time_cuda_attention: random device inputs and CUDA-event timing of the attention kernels.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "distca/core/stats.h"
#include "distca/core/cuda_check.h"
#include "distca/kernels_cuda/device.h"
#include "distca/kernels_cuda/probe.h"

// DISTCA_CUBLAS_CHECK(cublasGemmEx(...)): core/cuda_check.h's pattern for cuBLAS statuses.
#define DISTCA_CUBLAS_CHECK(call)                                                                     \
  do {                                                                                                \
    const cublasStatus_t distca_cublas_st_ = (call);                                                  \
    if (distca_cublas_st_ != CUBLAS_STATUS_SUCCESS) {                                                 \
      return ::distca::Status::internal(std::string("cuBLAS error ") + cublasGetStatusName(distca_cublas_st_) + \
                                        " (" + cublasGetStatusString(distca_cublas_st_) + ") in " #call " at " \
                                        __FILE__ ":" + std::to_string(__LINE__));                     \
    }                                                                                                 \
  } while (0)

namespace distca::kernels {
namespace {

// Uniform [-1, 1) from a 64-bit counter hash (splitmix64's finaliser): reproducible and
// independent of the launch shape.
__device__ __forceinline__ float hash_uniform(uint64_t i, uint64_t seed) {
  uint64_t z = i + seed * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

template <class T>
__global__ void fill_kernel(T* x, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float u = hash_uniform(static_cast<uint64_t>(i), seed);
    if constexpr (sizeof(T) == 4) {
      x[i] = u;
    } else if constexpr (std::is_same_v<T, __half>) {
      x[i] = __float2half_rn(u);
    } else {
      x[i] = __float2bfloat16_rn(u);
    }
  }
}

Status fill(DType t, void* x, int64_t n, uint64_t seed, cudaStream_t s) {
  if (n == 0) return {};
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 4096));
  switch (t) {
    case DType::kFloat32: fill_kernel<<<blocks, 256, 0, s>>>(static_cast<float*>(x), n, seed); break;
    case DType::kBFloat16: fill_kernel<<<blocks, 256, 0, s>>>(static_cast<__nv_bfloat16*>(x), n, seed); break;
    case DType::kFloat16: fill_kernel<<<blocks, 256, 0, s>>>(static_cast<__half*>(x), n, seed); break;
  }
  DISTCA_CUDA_CHECK_LAUNCH("fill_kernel");
  return {};
}

// Device allocations and a stream, released on every exit path.
class Arena {
 public:
  ~Arena() {
    if (stream_ != nullptr) (void)cudaStreamSynchronize(stream_);
    if (cublas_ != nullptr) (void)cublasDestroy(cublas_);
    for (void* p : ptrs_) (void)cudaFree(p);
    for (cudaEvent_t e : events_) (void)cudaEventDestroy(e);
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  }
  Result<void*> alloc(int64_t bytes) {
    void* p = nullptr;
    DISTCA_CUDA_CHECK(cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(bytes, 256))));
    ptrs_.push_back(p);
    return p;
  }
  Result<cudaEvent_t> event() {
    cudaEvent_t e = nullptr;
    DISTCA_CUDA_CHECK(cudaEventCreate(&e));
    events_.push_back(e);
    return e;
  }
  Status make_stream() {
    DISTCA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    return {};
  }
  cudaStream_t stream() const { return stream_; }
  Result<cublasHandle_t> cublas() {
    if (cublas_ == nullptr) {
      DISTCA_CUBLAS_CHECK(cublasCreate(&cublas_));
      DISTCA_CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
    }
    return cublas_;
  }

 private:
  std::vector<void*> ptrs_;
  std::vector<cudaEvent_t> events_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
};

}  // namespace

double cuda_probe_bytes(const CudaProbe& pr) {
  double tq = 0, tk = 0;
  for (const auto& [q, k] : pr.tasks) tq += static_cast<double>(q), tk += static_cast<double>(k);
  const double eb = pr.dtype == DType::kFloat32 ? 4 : 2;
  const double qe = tq * pr.n_heads * pr.head_dim, ke = tk * pr.n_kv_heads * pr.head_dim;
  // q, o, dO, dQ; k, v, dK, dV; lse and D (fp32); tile lists (<= one 12-byte tile per row, x3).
  return 4 * qe * eb + 4 * ke * eb + 2 * tq * pr.n_heads * 4 + 3 * (tq + tk) * 12 + (1 << 20);
}

Result<CudaTiming> time_cuda_attention(const CudaProbe& pr) {
  DISTCA_ASSIGN_OR_RETURN(const CudaDeviceInfo info, cuda_device_info());
  (void)info;
  std::vector<int32_t> cu_q{0}, cu_k{0};
  for (const auto& [q, k] : pr.tasks) {
    if (q < 0 || k < 0 || cu_q.back() + q > INT32_MAX || cu_k.back() + k > INT32_MAX) {
      return Status::invalid_argument("tasks: lengths must be >= 0 and their sums fit int32");
    }
    cu_q.push_back(cu_q.back() + static_cast<int32_t>(q));
    cu_k.push_back(cu_k.back() + static_cast<int32_t>(k));
  }
  AttentionParams p;
  p.dtype = pr.dtype;
  p.n_tasks = static_cast<int32_t>(pr.tasks.size());
  p.n_heads = pr.n_heads;
  p.n_kv_heads = pr.n_kv_heads;
  p.head_dim = pr.head_dim;
  p.causal = pr.causal;
  for (size_t t = 0; t < pr.tasks.size(); ++t) {
    p.max_seqlen_q = std::max(p.max_seqlen_q, cu_q[t + 1] - cu_q[t]);
    p.max_seqlen_k = std::max(p.max_seqlen_k, cu_k[t + 1] - cu_k[t]);
  }
  const int64_t eb = pr.dtype == DType::kFloat32 ? 4 : 2;
  const int64_t nq = static_cast<int64_t>(cu_q.back()) * pr.n_heads * pr.head_dim;
  const int64_t nk = static_cast<int64_t>(cu_k.back()) * pr.n_kv_heads * pr.head_dim;

  Arena arena;
  DISTCA_RETURN_IF_ERROR(arena.make_stream());
  const cudaStream_t s = arena.stream();
  void* buf[8];
  for (int i = 0; i < 8; ++i) {
    DISTCA_ASSIGN_OR_RETURN(buf[i], arena.alloc((i < 4 ? nq : nk) * eb));
  }
  DISTCA_ASSIGN_OR_RETURN(void* lse, arena.alloc(static_cast<int64_t>(cu_q.back()) * pr.n_heads * 4));
  DISTCA_ASSIGN_OR_RETURN(void* dcu_q, arena.alloc(static_cast<int64_t>(cu_q.size()) * 4));
  DISTCA_ASSIGN_OR_RETURN(void* dcu_k, arena.alloc(static_cast<int64_t>(cu_k.size()) * 4));
  DISTCA_CUDA_CHECK(cudaMemcpyAsync(dcu_q, cu_q.data(), cu_q.size() * 4, cudaMemcpyHostToDevice, s));
  DISTCA_CUDA_CHECK(cudaMemcpyAsync(dcu_k, cu_k.data(), cu_k.size() * 4, cudaMemcpyHostToDevice, s));
  p.q = static_cast<const float*>(buf[0]);
  p.o = static_cast<float*>(buf[1]);
  p.d_o = static_cast<const float*>(buf[2]);
  p.dq = static_cast<float*>(buf[3]);
  p.k = static_cast<const float*>(buf[4]);
  p.v = static_cast<const float*>(buf[5]);
  p.dk = static_cast<float*>(buf[6]);
  p.dv = static_cast<float*>(buf[7]);
  p.lse = static_cast<float*>(lse);
  p.cu_seqlens_q = static_cast<const int32_t*>(dcu_q);
  p.cu_seqlens_k = static_cast<const int32_t*>(dcu_k);
  DISTCA_RETURN_IF_ERROR(fill(pr.dtype, buf[0], nq, pr.seed, s));
  DISTCA_RETURN_IF_ERROR(fill(pr.dtype, buf[2], nq, pr.seed + 1, s));
  DISTCA_RETURN_IF_ERROR(fill(pr.dtype, buf[4], nk, pr.seed + 2, s));
  DISTCA_RETURN_IF_ERROR(fill(pr.dtype, buf[5], nk, pr.seed + 3, s));

  CudaAttention att(pr.options);
  CudaTiming t;
  // Each call records its start event itself, after its host-side planning and tile upload:
  // the host work stays outside the timed interval (the stream is idle while it runs).
  cudaEvent_t ev[4];
  for (cudaEvent_t& e : ev) {
    DISTCA_ASSIGN_OR_RETURN(e, arena.event());
  }
  std::vector<double> fwd, bwd;
  for (int r = 0; r <= pr.repeats; ++r) {  // r = 0: warm-up
    DISTCA_RETURN_IF_ERROR(att.forward(p, cu_q.data(), cu_k.data(), s, ev[0]));
    t.forward_kernel = att.last_plan().forward;
    DISTCA_CUDA_CHECK(cudaEventRecord(ev[1], s));
    DISTCA_RETURN_IF_ERROR(att.backward(p, cu_q.data(), cu_k.data(), s, ev[2]));
    t.backward_kernel = att.last_plan().backward;
    DISTCA_CUDA_CHECK(cudaEventRecord(ev[3], s));
    DISTCA_CUDA_CHECK(cudaEventSynchronize(ev[3]));
    float f_ms = 0, b_ms = 0;
    DISTCA_CUDA_CHECK(cudaEventElapsedTime(&f_ms, ev[0], ev[1]));
    DISTCA_CUDA_CHECK(cudaEventElapsedTime(&b_ms, ev[2], ev[3]));
    if (r > 0) fwd.push_back(f_ms * 1e-3), bwd.push_back(b_ms * 1e-3);
  }
  t.forward_seconds = fwd.empty() ? 0 : median(fwd);
  t.backward_seconds = bwd.empty() ? 0 : median(bwd);
  AttentionParams h = p;
  h.cu_seqlens_q = cu_q.data();
  h.cu_seqlens_k = cu_k.data();
  t.forward_flops = attention_forward_flops(h);
  t.backward_flops = attention_backward_flops(h);
  return t;
}

}  // namespace distca::kernels

namespace distca::kernels {

Result<double> time_cublas_gemm(int64_t n, DType dtype, int repeats) {
  DISTCA_ASSIGN_OR_RETURN(const CudaDeviceInfo info, cuda_device_info());
  (void)info;
  if (n <= 0 || n > 65536) return Status::invalid_argument("gemm n must be in [1, 65536]");
  const int64_t eb = dtype == DType::kFloat32 ? 4 : 2;
  const cudaDataType_t type = dtype == DType::kFloat32 ? CUDA_R_32F : dtype == DType::kFloat16 ? CUDA_R_16F : CUDA_R_16BF;
  Arena arena;
  DISTCA_RETURN_IF_ERROR(arena.make_stream());
  const cudaStream_t s = arena.stream();
  DISTCA_ASSIGN_OR_RETURN(void* a, arena.alloc(n * n * eb));
  DISTCA_ASSIGN_OR_RETURN(void* b, arena.alloc(n * n * eb));
  DISTCA_ASSIGN_OR_RETURN(void* c, arena.alloc(n * n * eb));
  DISTCA_RETURN_IF_ERROR(fill(dtype, a, n * n, 5, s));
  DISTCA_RETURN_IF_ERROR(fill(dtype, b, n * n, 6, s));
  DISTCA_ASSIGN_OR_RETURN(cublasHandle_t h, arena.cublas());
  DISTCA_CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));  // no TF32 for fp32
  DISTCA_ASSIGN_OR_RETURN(cudaEvent_t e0, arena.event());
  DISTCA_ASSIGN_OR_RETURN(cudaEvent_t e1, arena.event());
  const float alpha = 1.0f, beta = 0.0f;
  const int ni = static_cast<int>(n);
  std::vector<double> tf;
  for (int r = 0; r <= repeats; ++r) {
    DISTCA_CUDA_CHECK(cudaEventRecord(e0, s));
    DISTCA_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, ni, ni, ni, &alpha, a, type, ni, b, type, ni, &beta, c,
                                     type, ni, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    DISTCA_CUDA_CHECK(cudaEventRecord(e1, s));
    DISTCA_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    DISTCA_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    if (r > 0) tf.push_back(2.0 * static_cast<double>(n) * n * n / (ms * 1e-3) / 1e12);
  }
  return tf.empty() ? 0.0 : median(tf);
}

}  // namespace distca::kernels
