// FLOPs of whole training steps, counted by the rules of cost/analytic.h: what the benchmarks
// report as a step's work (`bench train`'s FLOP-ideal step). Pure functions.
#pragma once

#include "distca/core/specs.h"

namespace distca {

struct TrainingFlops {
  double linear = 0, attention = 0;
  double total() const { return linear + attention; }
};

// One training step (forward + backward) of `tokens` tokens whose documents hold `pairs` causal
// pairs, over every layer and the LM head: linear 3 x tokens x (n_layers x
// linear_forward_flops_per_token + lm_head_forward_flops_per_token) (backward 2x forward),
// attention n_layers x (attention_forward_flops + attention_backward_flops)(pairs).
TrainingFlops training_step_flops(const ModelSpec& m, double tokens, double pairs);

}  // namespace distca
