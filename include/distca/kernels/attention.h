// Core attention over a varlen batch of CA-tasks: the one fused call an attention server runs.
//
// Layouts (row-major, C order; "total" = sum over tasks):
//   q, o, d_o, dq : (total_q, n_heads, head_dim)
//   k, v, dk, dv  : (total_kv, n_kv_heads, head_dim)
//   lse           : (n_heads, total_q), natural log of sum_j exp(scale * q.k_j), fp32
//   cu_seqlens_q  : (n_tasks + 1) int32, 0 = cu[0] <= cu[1] <= ... = total_q; task t owns query
//                   rows [cu_q[t], cu_q[t+1]) and key/value rows [cu_k[t], cu_k[t+1])
//
// Masking: with `causal`, task t (q_len query rows, kv_len keys) is aligned bottom-right: its
// query row r sees keys 0 .. kv_len - q_len + r (FlashAttention's convention when
// seqlen_q < seqlen_k), so q_len <= kv_len is required. Without `causal` every row sees every
// key of its task. Tasks with q_len 0 are allowed (they produce nothing, and their keys get
// zero gradients). A query row that sees no key (non-causal with kv_len 0) gets O = 0 and
// LSE = -inf.
//
// GQA: n_heads is a multiple of n_kv_heads; query head h reads kv head h / (n_heads /
// n_kv_heads).
//
// Numerics: fp32 storage and fp32 compute (BLAS sgemm on blocks, online softmax, a vectorised
// exp2 accurate to about 1 ulp). `dtype` names the storage type so another one can be added
// without changing the struct; float32 is the only one.
//
// Tiling: the query tile callers may depend on (for bitwise agreement between differently cut
// calls) is exported by kernels/attention_traits.h.
//
// Determinism: forward and backward give the same bits whatever the OpenMP thread count and
// schedule: every output element is produced by exactly one work item whose floating-point
// order depends only on the shapes (docs/kernels.md).
//
// The struct holds plain pointers and ints so the CUDA path can take it unchanged.
//
// Thread safety: the calls use OpenMP internally (omp_get_max_threads() threads) and set
// OpenBLAS to one thread for their duration (restoring it afterwards), so do not run two of
// them concurrently from different threads of one process.
#pragma once

#include <cstdint>
#include <mutex>

#include "distca/core/status.h"

namespace distca::kernels {

// kBFloat16 and kFloat16 are for the CUDA path (kernels_cuda/attention_cuda.h: the pointers
// then address 2-byte elements); the CPU path refuses them in validate().
enum class DType : int32_t { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

struct AttentionParams {
  DType dtype = DType::kFloat32;
  // Inputs (forward and backward).
  const float* q = nullptr;  // (total_q, n_heads, head_dim)
  const float* k = nullptr;  // (total_kv, n_kv_heads, head_dim)
  const float* v = nullptr;  // (total_kv, n_kv_heads, head_dim)
  const int32_t* cu_seqlens_q = nullptr;  // (n_tasks + 1)
  const int32_t* cu_seqlens_k = nullptr;  // (n_tasks + 1)
  int32_t n_tasks = 0;
  int32_t n_heads = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t max_seqlen_q = 0;  // max over tasks of q_len (informational on the CPU)
  int32_t max_seqlen_k = 0;  // max over tasks of kv_len
  float softmax_scale = 0;   // 0 means 1 / sqrt(head_dim)
  bool causal = true;

  // Forward outputs; backward inputs.
  float* o = nullptr;    // (total_q, n_heads, head_dim)
  float* lse = nullptr;  // (n_heads, total_q)

  // Backward only.
  const float* d_o = nullptr;  // (total_q, n_heads, head_dim)
  float* dq = nullptr;         // (total_q, n_heads, head_dim)
  float* dk = nullptr;         // (total_kv, n_kv_heads, head_dim)
  float* dv = nullptr;         // (total_kv, n_kv_heads, head_dim)

  int64_t total_q() const { return n_tasks > 0 ? cu_seqlens_q[n_tasks] : 0; }
  int64_t total_kv() const { return n_tasks > 0 ? cu_seqlens_k[n_tasks] : 0; }
  float scale() const;  // softmax_scale, or 1/sqrt(head_dim) when it is 0
};

// Checks shapes and cu_seqlens (the pointers of the inputs, not the outputs): head counts and
// head_dim positive, n_kv_heads divides n_heads, softmax_scale finite and >= 0, cu_seqlens
// start at 0 and never decrease, q_len <= kv_len under causal, max_seqlen_* cover every task
// (0 means "compute it"). The message names the field. Cheap (O(n_tasks)).
Status validate(const AttentionParams& p);

// Forward: writes o and lse. Preconditions: validate(p).ok(), o and lse point to buffers of the
// shapes above (not aliasing the inputs).
void attention_forward(const AttentionParams& p);

// Backward: reads q, k, v, o, lse (from attention_forward) and d_o; writes dq, dk, dv
// (overwritten, not accumulated). Preconditions as for the forward, plus d_o, dq, dk, dv set.
void attention_backward(const AttentionParams& p);

// The process's one lock for these calls (see Thread safety above): a caller that may run
// them, or other OpenMP/BLAS compute, from several threads of one process (the runtime's
// dispatchers under the local backend's rank threads, the Python module with the GIL
// released) holds it around every call.
std::mutex& kernel_mutex();

// Upper bound, in bytes, of the scratch memory attention_forward (and attention_backward when
// `backward`) allocates for a call of these shapes on `threads` OpenMP threads: per-thread
// tiles, and for the backward the dQ chunk partials and the row sums. Callers that budget memory
// (core/memory.h) add it to their own buffers before allocating anything.
double attention_scratch_bytes(int64_t total_q, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                               bool backward, int threads);

// Pairs-based FLOPs (docs/architecture.md): forward 4 * head_dim * n_heads * pairs, where
// pairs counts the (query, key) pairs the mask lets through; backward is 2.5x that.
double attention_pairs(const AttentionParams& p);
double attention_forward_flops(const AttentionParams& p);
double attention_backward_flops(const AttentionParams& p);

}  // namespace distca::kernels
