// Shared by the train layer's tests: the small model they train (fast enough for many steps).
#pragma once

#include <cstdint>

#include "distca/train/config.h"

namespace distca::train::testing {

// The embedded default with a model of `layers` layers of width 64 (4 heads of 16, 2 K/V
// heads, ffn 128, vocabulary 64).
inline TrainConfig small_model_config(int64_t layers) {
  TrainConfig c;
  c.model_overrides.n_layers = layers;
  c.model_overrides.hidden = 64;
  c.model_overrides.n_heads = 4;
  c.model_overrides.n_kv_heads = 2;
  c.model_overrides.head_dim = 16;
  c.model_overrides.ffn = 128;
  c.model_overrides.vocab = 64;
  return c;
}

}  // namespace distca::train::testing
