// Validation and FLOP accounting of AttentionParams (shared by the fast path, the reference
// and the CLI).
#include <cmath>
#include <string>

#include "distca/kernels/attention.h"

namespace distca::kernels {

float AttentionParams::scale() const {
  return softmax_scale != 0.0f ? softmax_scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
}

namespace {
Status check_cu(const int32_t* cu, int32_t n_tasks, const char* name) {
  if (cu == nullptr) return Status::invalid_argument(std::string(name) + " is missing");
  if (cu[0] != 0) {
    return Status::invalid_argument(std::string(name) + "[0] must be 0 (got " + std::to_string(cu[0]) + ")");
  }
  for (int32_t t = 0; t < n_tasks; ++t) {
    if (cu[t + 1] < cu[t]) {
      return Status::invalid_argument(std::string(name) + " decreases at entry " + std::to_string(t + 1) +
                                      " (" + std::to_string(cu[t]) + " then " + std::to_string(cu[t + 1]) + ")");
    }
  }
  return {};
}
}  // namespace

Status validate(const AttentionParams& p) {
  if (p.dtype != DType::kFloat32) return Status::invalid_argument("dtype: only float32 is supported");
  if (p.n_tasks < 0) return Status::invalid_argument("n_tasks must be >= 0");
  if (p.n_heads <= 0) return Status::invalid_argument("n_heads must be positive");
  if (p.n_kv_heads <= 0) return Status::invalid_argument("n_kv_heads must be positive");
  if (p.n_heads % p.n_kv_heads != 0) {
    return Status::invalid_argument("n_heads (" + std::to_string(p.n_heads) + ") must be a multiple of n_kv_heads (" +
                                    std::to_string(p.n_kv_heads) + ")");
  }
  if (p.head_dim <= 0) return Status::invalid_argument("head_dim must be positive");
  if (!(std::isfinite(p.softmax_scale) && p.softmax_scale >= 0.0f)) {
    return Status::invalid_argument("softmax_scale must be finite and >= 0 (0: 1/sqrt(head_dim))");
  }
  DISTCA_RETURN_IF_ERROR(check_cu(p.cu_seqlens_q, p.n_tasks, "cu_seqlens_q"));
  DISTCA_RETURN_IF_ERROR(check_cu(p.cu_seqlens_k, p.n_tasks, "cu_seqlens_k"));
  for (int32_t t = 0; t < p.n_tasks; ++t) {
    const int32_t ql = p.cu_seqlens_q[t + 1] - p.cu_seqlens_q[t];
    const int32_t kl = p.cu_seqlens_k[t + 1] - p.cu_seqlens_k[t];
    if (p.causal && ql > kl) {
      return Status::invalid_argument("task " + std::to_string(t) + ": q_len " + std::to_string(ql) +
                                      " > kv_len " + std::to_string(kl) + " under causal masking");
    }
    if (p.max_seqlen_q > 0 && ql > p.max_seqlen_q) {
      return Status::invalid_argument("max_seqlen_q " + std::to_string(p.max_seqlen_q) + " < q_len " +
                                      std::to_string(ql) + " of task " + std::to_string(t));
    }
    if (p.max_seqlen_k > 0 && kl > p.max_seqlen_k) {
      return Status::invalid_argument("max_seqlen_k " + std::to_string(p.max_seqlen_k) + " < kv_len " +
                                      std::to_string(kl) + " of task " + std::to_string(t));
    }
  }
  // Empty tensors may come without storage (a batch whose every task has q_len 0 or kv_len 0).
  if (p.total_q() > 0 && p.q == nullptr) return Status::invalid_argument("q must be set (total_q > 0)");
  if (p.total_kv() > 0 && (p.k == nullptr || p.v == nullptr)) {
    return Status::invalid_argument("k and v must be set (total_kv > 0)");
  }
  return {};
}

double attention_pairs(const AttentionParams& p) {
  double pairs = 0;
  for (int32_t t = 0; t < p.n_tasks; ++t) {
    const double ql = p.cu_seqlens_q[t + 1] - p.cu_seqlens_q[t];
    const double kl = p.cu_seqlens_k[t + 1] - p.cu_seqlens_k[t];
    // Bottom-right causal: rows see kl - ql + 1 .. kl keys.
    pairs += p.causal ? ql * (kl - ql) + ql * (ql + 1) / 2 : ql * kl;
  }
  return pairs;
}

double attention_forward_flops(const AttentionParams& p) {
  return 4.0 * p.head_dim * p.n_heads * attention_pairs(p);
}

double attention_backward_flops(const AttentionParams& p) { return 2.5 * attention_forward_flops(p); }

}  // namespace distca::kernels
