#include "distca/cost/analytic.h"
#include "distca/cost/step_flops.h"

#include "distca/core/check.h"

namespace distca {

int64_t causal_pairs(int64_t a, int64_t b) {
  DISTCA_CHECK(0 <= a && a <= b);
  return (b * (b + 1) - a * (a + 1)) / 2;
}

int64_t task_pairs(int64_t q_len, int64_t kv_len) {
  DISTCA_CHECK(0 <= q_len && q_len <= kv_len);
  return causal_pairs(kv_len - q_len, kv_len);
}

double attention_forward_flops(const ModelSpec& m, double pairs) {
  return 4.0 * static_cast<double>(m.head_dim) * static_cast<double>(m.n_heads) * pairs;
}

double attention_backward_flops(const ModelSpec& m, double pairs) {
  return kAttentionBackwardFactor * attention_forward_flops(m, pairs);
}

double linear_forward_flops_per_token(const ModelSpec& m) {
  const double h = static_cast<double>(m.hidden);
  return 2.0 * h *
         (2.0 * static_cast<double>(m.q_dim()) + 2.0 * static_cast<double>(m.kv_dim()) +
          3.0 * static_cast<double>(m.ffn));
}

double lm_head_forward_flops_per_token(const ModelSpec& m) {
  return 2.0 * static_cast<double>(m.hidden) * static_cast<double>(m.vocab);
}

RowBytes row_bytes(const ModelSpec& m, int64_t dtype_bytes) {
  RowBytes r;
  r.q = m.q_dim() * dtype_bytes;
  r.kv = 2 * m.kv_dim() * dtype_bytes;
  r.o = m.q_dim() * dtype_bytes;
  r.lse = m.n_heads * 4;
  return r;
}

TrainingFlops training_step_flops(const ModelSpec& m, double tokens, double pairs) {
  const double layers = static_cast<double>(m.n_layers);
  const double per_token = layers * linear_forward_flops_per_token(m) + lm_head_forward_flops_per_token(m);
  return {3.0 * tokens * per_token, layers * (attention_forward_flops(m, pairs) + attention_backward_flops(m, pairs))};
}

double linear_seconds_per_token(const ModelSpec& m, const HardwareSpec& hw, double mfu) {
  DISTCA_CHECK(mfu > 0 && hw.peak_flops > 0);
  return linear_forward_flops_per_token(m) / (mfu * hw.peak_flops);
}

}  // namespace distca
