// AdamW (decoupled weight decay, bias correction), global-norm gradient clipping and the
// learning-rate schedule (linear warm-up, then cosine down to a floor).
//
// Everything works on the model's single contiguous parameter and gradient buffers
// (llama.h). In a data-parallel step the trainer all-reduces the gradients first, then clips
// and steps identically on every rank, so replicas stay bit-identical.
//
// AdamW step t (1-based, after increment), per element, computed in double, stored in fp32:
//   p <- p * (1 - lr * weight_decay)               only where the element's group decays
//   m <- beta1 m + (1 - beta1) g
//   v <- beta2 v + (1 - beta2) g^2
//   p <- p - lr * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)
// This is PyTorch's torch.optim.AdamW. Which elements decay comes from the parameter layout:
// every matrix (embedding, projections, lm_head) decays, the RMSNorm gains do not
// (decay_groups()).
//
// State for checkpoints: m(), v() (one float per parameter each) and step_count(); restore by
// writing the spans and calling set_step_count().
//
// Thread safety: one thread at a time per object; the free functions keep no state.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "distca/core/status.h"
#include "distca/model/llama.h"

namespace distca::model {

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  // betas in [0, 1), eps > 0, weight_decay >= 0, all finite; the message names the field.
  Status validate() const;
};

// A contiguous range of the parameter buffer and whether weight decay applies to it.
struct ParamGroup {
  int64_t offset = 0;
  int64_t size = 0;
  bool decay = false;
};

// One group per tensor of the layout (TensorInfo::decay), adjacent groups with the same flag
// merged.
std::vector<ParamGroup> decay_groups(std::span<const TensorInfo> layout);

class AdamW {
 public:
  // groups must tile [0, n_params) in order without gaps or overlaps.
  static Result<AdamW> create(int64_t n_params, std::vector<ParamGroup> groups,
                              const AdamWConfig& config = {});

  // One update with learning rate lr (>= 0, finite). params and grads have n_params elements.
  Status step(std::span<float> params, std::span<const float> grads, double lr);

  int64_t n_params() const { return static_cast<int64_t>(m_.size()); }
  const AdamWConfig& config() const { return config_; }
  const std::vector<ParamGroup>& groups() const { return groups_; }
  int64_t step_count() const { return step_; }
  void set_step_count(int64_t step) { step_ = step; }
  std::span<float> m() { return m_; }  // (n_params) first moment
  std::span<float> v() { return v_; }  // (n_params) second moment
  std::span<const float> m() const { return m_; }
  std::span<const float> v() const { return v_; }

 private:
  AdamW() = default;
  AdamWConfig config_;
  std::vector<ParamGroup> groups_;
  std::vector<float> m_;  // (n_params)
  std::vector<float> v_;  // (n_params)
  int64_t step_ = 0;
};

// sqrt(sum g^2), accumulated in double over a fixed summation tree (fixed chunks of 2^14 in
// eight interleaved lanes, then the chunks in index order), so the bits do not depend on the
// OpenMP thread count and are the same on every rank. The calling thread's team sums chunks.
double global_norm(std::span<const float> grads);
// The same tree's sum g^2, before the square root.
double squared_norm(std::span<const float> grads);

// The global norm of a parameter buffer split into tensors (the model's layout), defined so
// that it does not depend on how the tensors are spread over pipeline stages:
// sqrt(sum over tensors, in layout order, of squared_norm(tensor)). squares[i] is tensor i's
// squared_norm; a pipeline fills each stage's entries and sums the vectors over the stages
// (adding zeros is exact), then takes this.
double norm_from_tensor_squares(std::span<const double> squares);

// Scales grads by max_norm / norm when norm > max_norm (and both are finite and positive);
// the clipping of clip_grad_norm with a norm computed elsewhere.
void clip_to_norm(std::span<float> grads, double norm, double max_norm);

// Clipping by global norm: when norm > max_norm, scales grads by max_norm / norm. Returns the
// norm before clipping. A non-finite norm leaves grads untouched (the caller decides whether
// to skip the step). max_norm <= 0 disables clipping (the norm is still returned).
double clip_grad_norm(std::span<float> grads, double max_norm);

// Learning rate for the optimizer step with 0-based index `step`:
//   step <  warmup_steps:               max_lr * (step + 1) / warmup_steps
//   warmup_steps <= step < total_steps: min_lr + (max_lr - min_lr) * (1 + cos(pi * r)) / 2,
//                                       r = (step - warmup_steps) / (total_steps - warmup_steps)
//   step >= total_steps:                min_lr
// So the last warm-up step and the first cosine step both use max_lr, the cosine midpoint is
// (max_lr + min_lr) / 2, and step total_steps onward uses min_lr.
struct LrSchedule {
  double max_lr = 3e-4;
  double min_lr = 3e-5;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  // 0 <= min_lr <= max_lr (finite), 0 <= warmup_steps <= total_steps, total_steps > 0.
  Status validate() const;
  double at(int64_t step) const;
};

}  // namespace distca::model
