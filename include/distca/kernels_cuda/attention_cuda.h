// Core attention on a CUDA device: the CPU kernel's contract (kernels/attention.h) with device
// buffers, one fused varlen call over a batch of CA-tasks, forward and backward.
//
// The same AttentionParams struct, read this way:
//   dtype         : kFloat32, kBFloat16 or kFloat16: the element type of q, k, v, o, d_o, dq,
//                   dk, dv (the `float*` fields then address 2-byte elements; cast with
//                   reinterpret_cast). Compute is fp32 in every case; lse is always fp32.
//   q, o, d_o, dq : DEVICE (total_q, n_heads, head_dim), row-major, contiguous
//   k, v, dk, dv  : DEVICE (total_kv, n_kv_heads, head_dim)
//   lse           : DEVICE fp32 (n_heads, total_q), natural log, -inf for a row with no key
//   cu_seqlens_q/k: DEVICE int32 (n_tasks + 1); the same values must be passed as host copies
//                   (host_cu_q, host_cu_k below: the runtime has its plan on the host anyway),
//                   which are validated and tiled on the host; the device arrays are what the
//                   kernels read. Passing device arrays that differ from the host copies is
//                   undefined behaviour.
//   everything else (heads, head_dim, max_seqlen_*, softmax_scale, causal) as on the CPU.
// Masking (bottom-right causal), GQA (query head h reads kv head h / (n_heads / n_kv_heads)),
// empty tasks, and O = 0 / LSE = -inf for rows without keys are exactly those of attention.h.
// head_dim <= 256 (kSimple); the tiled kernel takes head_dim 64 or 128 in bf16/fp16.
//
// Determinism: every output element is written by exactly one thread whose floating-point
// order depends only on the shapes (no atomics anywhere; dQ and dK/dV come from separate
// kernels, each looping in a fixed order), so two calls on the same inputs give the same bits.
// The bits differ from the CPU kernel's (a different order and exp).
//
// Thread safety: a CudaAttention object is used by one host thread at a time; two objects may
// run concurrently on different streams.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "distca/core/status.h"
#include "distca/kernels/attention.h"

namespace distca::kernels {

enum class CudaKernel : int32_t {
  kAuto = 0,    // kTiled where it applies (bf16/fp16, head_dim 64 or 128), else kSimple
  kSimple = 1,  // one warp per row, fp32 CUDA cores: any dtype, head_dim <= 256 (the yardstick)
  kTiled = 2,   // FA2-style tensor-core tiles (mma.sync m16n8k16, cp.async): bf16/fp16, head_dim 64/128
};
const char* cuda_kernel_name(CudaKernel k);

struct CudaAttentionOptions {
  CudaKernel forward = CudaKernel::kAuto;
  CudaKernel backward = CudaKernel::kAuto;
};

// One block of work: query rows (or key rows, for dK/dV) [block * rows, (block + 1) * rows) of
// task `task`, clipped to the task. `weight` is the number of inner blocks it visits (the
// schedule sorts by it; it never changes what is computed).
struct CudaTile {
  int32_t task = 0;
  int32_t block = 0;
  int32_t weight = 0;
};

// What a call launches, computed on the host from the shapes and the host cu_seqlens (pure
// function; no CUDA call). Tile lists hold every (task, block) exactly once (tasks with
// q_len 0 have no query tiles; their key tiles exist so dK/dV are zeroed), heaviest first, ties
// by (task, block): the long causal tiles start first so they do not finish last.
struct CudaLaunchPlan {
  CudaKernel forward = CudaKernel::kSimple;   // resolved (never kAuto)
  CudaKernel backward = CudaKernel::kSimple;  // resolved; kSimple when not planning a backward
  int32_t fwd_rows = 0;   // query rows per forward tile
  int32_t fwd_keys = 0;   // keys per inner step of the forward
  int32_t dq_rows = 0;    // query rows per dQ tile (backward)
  int32_t dq_keys = 0;    // keys per inner step of dQ
  int32_t dkv_rows = 0;   // key rows per dK/dV tile (backward)
  int32_t dkv_chunk = 0;  // query rows per inner step of dK/dV
  int32_t fwd_threads = 0, bwd_threads = 0;
  int64_t fwd_smem_bytes = 0, dq_smem_bytes = 0, dkv_smem_bytes = 0;  // dynamic shared memory
  int64_t total_q = 0, total_kv = 0;
  std::vector<CudaTile> fwd_tiles;  // grid.x of the forward (grid.y = n_heads)
  std::vector<CudaTile> dq_tiles;   // grid.x of the dQ kernel (grid.y = n_heads); backward only
  std::vector<CudaTile> dkv_tiles;  // grid.x of the dK/dV kernel (grid.y = n_kv_heads)
  // Device workspace of the call: the tile lists and, for the backward, D = rowsum(dO o O)
  // as fp32 (n_heads, total_q).
  int64_t workspace_bytes = 0;
};

// Validates `p` (validate() of attention.h on the host copies, plus: a known dtype,
// head_dim <= 256, the kernels' dtype/head_dim limits when forced, output pointers set for
// the shapes, the grid within CUDA's limits) and computes the launch. Messages name the field.
Result<CudaLaunchPlan> plan_cuda_attention(const AttentionParams& p, const int32_t* host_cu_q,
                                           const int32_t* host_cu_k, bool backward,
                                           const CudaAttentionOptions& options = {});

// Runs the kernels. Owns a device workspace (grown as needed, freed in the destructor) and a
// pinned host staging buffer for the tile lists, so a call enqueues its work on `stream` and
// returns without waiting for the device, except that a call first waits (on the host) for
// the previous call of the same object to have consumed its staging buffer, and a call that
// must grow the workspace synchronises the device first (once per new maximum size): use one
// object per concurrently running stream (ping-pong: one per nano-batch), sized by a first
// call on the largest shapes.
class CudaAttention {
 public:
  explicit CudaAttention(CudaAttentionOptions options = {}) : options_(options) {}
  ~CudaAttention();
  CudaAttention(const CudaAttention&) = delete;
  CudaAttention& operator=(const CudaAttention&) = delete;

  // Writes o and lse. Preconditions: the buffers of the shapes above, outputs not aliasing
  // inputs, all on the current device. `kernels_start` (optional, for timing) is recorded on
  // `stream` after the host-side planning and the tile upload, right before the call's first
  // kernel (at the end of a call that launches none), so an event pair from it to one recorded
  // after the call times the kernels without the host work.
  Status forward(const AttentionParams& p, const int32_t* host_cu_q, const int32_t* host_cu_k,
                 cudaStream_t stream, cudaEvent_t kernels_start = nullptr);
  // Reads q, k, v, o, lse (from forward) and d_o; overwrites dq, dk, dv. `kernels_start` as in
  // forward (recorded before D = rowsum(dO o O), the first of the backward's kernels).
  Status backward(const AttentionParams& p, const int32_t* host_cu_q, const int32_t* host_cu_k,
                  cudaStream_t stream, cudaEvent_t kernels_start = nullptr);

  const CudaLaunchPlan& last_plan() const { return plan_; }

 private:
  Status reserve(int64_t device_bytes, int64_t host_bytes);
  Status stage_tiles(const CudaLaunchPlan& plan, cudaStream_t stream);

  CudaAttentionOptions options_;
  CudaLaunchPlan plan_;
  void* device_ = nullptr;  // workspace: tiles, then D (backward)
  int64_t device_bytes_ = 0;
  void* host_ = nullptr;  // pinned staging of the tile lists
  int64_t host_bytes_ = 0;
  cudaEvent_t staged_ = nullptr;  // recorded after the last upload from host_
  cudaEvent_t done_ = nullptr;    // recorded after the last call's kernels (workspace free again)
};

}  // namespace distca::kernels
