// Analytic counts: causal pairs, FLOPs and bytes, as docs/architecture.md ("shared
// arithmetic") defines them. Everything here is exact integer arithmetic or a closed formula;
// the planner, the simulator and the benchmarks all use these same functions so that their
// numbers agree.
//
// Conventions. A CA-task of a document covers query rows [a, b) with context [0, b); in kernel
// terms q_len = b - a, kv_len = b, causal aligned bottom-right (query row r of the task sees
// keys 0 .. kv_len - q_len + r). FLOP counts are per layer and per model replica (all heads);
// multiply by n_layers for a whole model.
#pragma once

#include <cstdint>

#include "distca/core/specs.h"

namespace distca {

// (query, key) pairs of query rows [a, b) over context [0, b): (b(b+1) - a(a+1)) / 2.
// Preconditions: 0 <= a <= b.
int64_t causal_pairs(int64_t a, int64_t b);
// Pairs of a bottom-right-aligned task: q_len rows at the end of a kv_len context.
// Equals causal_pairs(kv_len - q_len, kv_len). Preconditions: 0 <= q_len <= kv_len.
int64_t task_pairs(int64_t q_len, int64_t kv_len);
// Pairs of a whole document of length L: L(L+1)/2.
inline int64_t document_pairs(int64_t len) { return causal_pairs(0, len); }

// Attention FLOPs for `pairs` causal pairs: forward 4 * head_dim * n_heads * pairs (QK^T and
// PV, two FLOPs per multiply-add); backward 2.5x forward.
double attention_forward_flops(const ModelSpec& m, double pairs);
double attention_backward_flops(const ModelSpec& m, double pairs);
inline constexpr double kAttentionBackwardFactor = 2.5;

// Context-independent FLOPs per token per layer, forward: 2 * h * (2 q_dim + 2 kv_dim + 3 i)
// (Q and O projections, K and V projections, SwiGLU gate/up/down). Backward is 2x forward.
double linear_forward_flops_per_token(const ModelSpec& m);
// The LM head, once per token: 2 * h * vocab (forward).
double lm_head_forward_flops_per_token(const ModelSpec& m);

// Bytes per token row of each tensor that crosses ranks, for activations of `dtype_bytes`
// (2 for bf16, 4 for fp32). LSE is always fp32, one value per query head.
struct RowBytes {
  int64_t q = 0;    // one Q row: n_heads * head_dim
  int64_t kv = 0;   // one K row plus one V row: 2 * n_kv_heads * head_dim
  int64_t o = 0;    // one O row: n_heads * head_dim
  int64_t lse = 0;  // one LSE row: n_heads * 4 bytes
};
RowBytes row_bytes(const ModelSpec& m, int64_t dtype_bytes);

// Linear seconds per token per layer (forward) at the given model FLOP utilisation.
double linear_seconds_per_token(const ModelSpec& m, const HardwareSpec& hw, double mfu);

}  // namespace distca
