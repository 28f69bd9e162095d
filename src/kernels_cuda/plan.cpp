// plan_cuda_attention: validation and the launch schedule of the CUDA kernels, on the host and
// without any CUDA call, so it is tested on machines without a GPU (tests/kernels_cuda).
#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

#include "distca/kernels_cuda/attention_cuda.h"
#include "kernel_shapes.h"

namespace distca::kernels {

const char* cuda_kernel_name(CudaKernel k) {
  switch (k) {
    case CudaKernel::kAuto: return "auto";
    case CudaKernel::kSimple: return "simple";
    case CudaKernel::kTiled: return "tiled";
  }
  return "unknown";
}

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Why the tiled kernel cannot take `p` ("" when it can): it needs a 2-byte type, a head_dim its
// fragments are built for, and aligned buffers. The forward loads q, k, v with cp.async (16
// bytes) and stores o as 32-bit words; the backward loads q, k, v and d_o with cp.async and
// stores dq, dk, dv as 32-bit words (o is read by dsum_kernel element by element). Rows are
// head_dim * 2 = 128 or 256 bytes long, so an aligned base aligns every row.
std::string tiled_refusal(const AttentionParams& p, bool backward) {
  if (p.dtype != DType::kBFloat16 && p.dtype != DType::kFloat16) return "it takes bf16/fp16 only";
  if (p.head_dim != 64 && p.head_dim != 128) {
    return "it takes head_dim 64 or 128 (got " + std::to_string(p.head_dim) + ")";
  }
  const auto misaligned = [](const void* x, uintptr_t n) { return reinterpret_cast<uintptr_t>(x) % n != 0; };
  if (misaligned(p.q, 16) || misaligned(p.k, 16) || misaligned(p.v, 16)) return "q, k and v must be 16-byte aligned";
  if (!backward) return misaligned(p.o, 4) ? "o must be 4-byte aligned" : "";
  if (misaligned(p.d_o, 16)) return "d_o must be 16-byte aligned";
  if (misaligned(p.dq, 4) || misaligned(p.dk, 4) || misaligned(p.dv, 4)) return "dq, dk and dv must be 4-byte aligned";
  return "";
}

Result<CudaKernel> resolve(CudaKernel asked, const AttentionParams& p, bool backward, const char* which) {
  if (asked == CudaKernel::kSimple) return CudaKernel::kSimple;
  if (asked == CudaKernel::kAuto) {
    return tiled_refusal(p, backward).empty() ? CudaKernel::kTiled : CudaKernel::kSimple;
  }
  if (asked != CudaKernel::kTiled) {
    return Status::invalid_argument(std::string(which) + ": unknown kernel " +
                                    std::to_string(static_cast<int>(asked)));
  }
  if (const std::string why = tiled_refusal(p, backward); !why.empty()) {
    return Status::invalid_argument(std::string(which) + ": tiled refused: " + why);
  }
  return CudaKernel::kTiled;
}

// Every (task, block) of `rows`-row blocks over each task's `len(t)` rows, with its weight,
// heaviest first; ties by (task, block) so the order is a function of the shapes alone.
template <class Len, class Weight>
std::vector<CudaTile> make_tiles(int32_t n_tasks, int32_t rows, Len len, Weight weight) {
  std::vector<CudaTile> tiles;
  for (int32_t t = 0; t < n_tasks; ++t) {
    const int64_t n = ceil_div(len(t), rows);
    for (int64_t b = 0; b < n; ++b) {
      tiles.push_back({t, static_cast<int32_t>(b), static_cast<int32_t>(weight(t, b))});
    }
  }
  std::stable_sort(tiles.begin(), tiles.end(),
                   [](const CudaTile& a, const CudaTile& b) { return a.weight > b.weight; });
  return tiles;
}

// The tile shapes, threads and shared memory of the plan's kernels.
void set_kernel_shapes(CudaLaunchPlan& plan, int64_t head_dim, bool backward) {
  if (plan.forward == CudaKernel::kTiled) {
    plan.fwd_rows = cuda_shapes::kTiledRows;
    plan.fwd_keys = cuda_shapes::kTiledKeys;
    plan.fwd_threads = cuda_shapes::kTiledThreads;
    plan.fwd_smem_bytes = cuda_shapes::tiled_forward_smem_bytes(head_dim);
  } else {
    plan.fwd_rows = cuda_shapes::kSimpleRows;
    plan.fwd_keys = cuda_shapes::kSimpleChunk;
    plan.fwd_threads = cuda_shapes::kSimpleThreads;
    plan.fwd_smem_bytes = cuda_shapes::simple_forward_smem_bytes(head_dim);
  }
  if (!backward) return;
  if (plan.backward == CudaKernel::kTiled) {
    plan.dq_rows = cuda_shapes::kTiledRows;
    plan.dq_keys = cuda_shapes::kTiledKeys;
    plan.dkv_rows = cuda_shapes::kTiledKeys;
    plan.dkv_chunk = cuda_shapes::kTiledDkvChunk;
    plan.bwd_threads = cuda_shapes::kTiledThreads;
    plan.dq_smem_bytes = cuda_shapes::tiled_dq_smem_bytes(head_dim);
    plan.dkv_smem_bytes = cuda_shapes::tiled_dkv_smem_bytes(head_dim);
  } else {
    plan.dq_rows = cuda_shapes::kSimpleRows;
    plan.dq_keys = cuda_shapes::kSimpleChunk;
    plan.dkv_rows = cuda_shapes::kSimpleRows;
    plan.dkv_chunk = cuda_shapes::kSimpleChunk;
    plan.bwd_threads = cuda_shapes::kSimpleThreads;
    plan.dq_smem_bytes = cuda_shapes::simple_forward_smem_bytes(head_dim);
    plan.dkv_smem_bytes = cuda_shapes::simple_dkv_smem_bytes(head_dim);
  }
}

}  // namespace

Result<CudaLaunchPlan> plan_cuda_attention(const AttentionParams& p, const int32_t* host_cu_q,
                                           const int32_t* host_cu_k, bool backward,
                                           const CudaAttentionOptions& options) {
  if (p.dtype != DType::kFloat32 && p.dtype != DType::kBFloat16 && p.dtype != DType::kFloat16) {
    return Status::invalid_argument("dtype: unknown value " + std::to_string(static_cast<int>(p.dtype)));
  }
  if (host_cu_q == nullptr || host_cu_k == nullptr) {
    return Status::invalid_argument("host cu_seqlens: the host copies of cu_seqlens_q/k are missing");
  }
  if (p.n_tasks > 0 && (p.cu_seqlens_q == nullptr || p.cu_seqlens_k == nullptr)) {
    return Status::invalid_argument("cu_seqlens_q/k: the device arrays are missing");
  }
  // The CPU contract, checked on the host copies (validate() reads cu_seqlens).
  AttentionParams h = p;
  h.dtype = DType::kFloat32;
  h.cu_seqlens_q = host_cu_q;
  h.cu_seqlens_k = host_cu_k;
  DISTCA_RETURN_IF_ERROR(validate(h));
  if (p.head_dim > cuda_shapes::kMaxHeadDim) {
    return Status::invalid_argument("head_dim " + std::to_string(p.head_dim) + " > " +
                                    std::to_string(cuda_shapes::kMaxHeadDim) + ": the CUDA kernels take head_dim <= " +
                                    std::to_string(cuda_shapes::kMaxHeadDim));
  }
  if (p.n_heads > cuda_shapes::kMaxGridY) {
    return Status::invalid_argument("n_heads " + std::to_string(p.n_heads) + " exceeds CUDA's grid limit " +
                                    std::to_string(cuda_shapes::kMaxGridY));
  }

  CudaLaunchPlan plan;
  plan.total_q = h.total_q();
  plan.total_kv = h.total_kv();
  if (plan.total_q > 0 && (p.o == nullptr || p.lse == nullptr)) {
    return Status::invalid_argument("o and lse must be set (total_q > 0)");
  }
  if (backward) {
    if (plan.total_q > 0 && (p.d_o == nullptr || p.dq == nullptr)) {
      return Status::invalid_argument("d_o and dq must be set for the backward (total_q > 0)");
    }
    if (plan.total_kv > 0 && (p.dk == nullptr || p.dv == nullptr)) {
      return Status::invalid_argument("dk and dv must be set for the backward (total_kv > 0)");
    }
  }
  DISTCA_ASSIGN_OR_RETURN(plan.forward, resolve(options.forward, p, false, "forward kernel"));
  plan.backward = CudaKernel::kSimple;
  if (backward) {
    DISTCA_ASSIGN_OR_RETURN(plan.backward, resolve(options.backward, p, true, "backward kernel"));
  }

  set_kernel_shapes(plan, p.head_dim, backward);
  auto ql = [&](int32_t t) -> int64_t { return host_cu_q[t + 1] - host_cu_q[t]; };
  auto kl = [&](int32_t t) -> int64_t { return host_cu_k[t + 1] - host_cu_k[t]; };
  // Keys the query rows [0, r_end) of task t see together: the last row's horizon.
  auto keys_seen = [&](int32_t t, int64_t r_end) { return p.causal ? std::min(kl(t), kl(t) - ql(t) + r_end) : kl(t); };
  auto q_tiles = [&](int32_t rows, int32_t keys) {
    return make_tiles(p.n_tasks, rows, ql, [&](int32_t t, int64_t b) {
      return ceil_div(keys_seen(t, std::min(ql(t), (b + 1) * rows)), keys);
    });
  };
  plan.fwd_tiles = q_tiles(plan.fwd_rows, plan.fwd_keys);

  if (backward) {
    plan.dq_tiles = q_tiles(plan.dq_rows, plan.dq_keys);
    // Key rows [j0, j1) are seen by query rows r >= j0 - (kv_len - q_len) (causal), all otherwise.
    plan.dkv_tiles = make_tiles(p.n_tasks, plan.dkv_rows, kl, [&](int32_t t, int64_t b) {
      const int64_t first = p.causal ? std::max<int64_t>(0, b * plan.dkv_rows - (kl(t) - ql(t))) : 0;
      return ceil_div(std::max<int64_t>(0, ql(t) - first), plan.dkv_chunk);
    });
  }
  for (const auto* tiles : {&plan.fwd_tiles, &plan.dq_tiles, &plan.dkv_tiles}) {
    if (static_cast<int64_t>(tiles->size()) > cuda_shapes::kMaxGridX) {
      return Status::invalid_argument("cu_seqlens: " + std::to_string(tiles->size()) +
                                      " tiles exceed CUDA's grid limit");
    }
  }
  plan.workspace_bytes = cuda_shapes::workspace_layout(plan, p.n_heads).total;
  return plan;
}

}  // namespace distca::kernels
