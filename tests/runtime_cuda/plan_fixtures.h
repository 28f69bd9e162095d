// Plans for the movement tests, from the plan and data layers only (so the GPU test program
// links no kernels or BLAS and travels light to the device machine): the runtime tests'
// random batches (tests/runtime/runtime_check.h, the same recipe) and every scheduler.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "distca/core/check.h"
#include "distca/data/workload.h"
#include "distca/plan/plan.h"

namespace distca::runtime::device::testing {

inline Batch fixture_batch(int ranks, int64_t tokens_per_rank, uint64_t seed) {
  WorkloadOptions w;
  w.dist = "uniform:16:" + std::to_string(2 * tokens_per_rank);
  w.ranks = ranks;
  w.tokens_per_rank = tokens_per_rank;
  w.seed = seed;
  auto b = make_batches(w);
  DISTCA_CHECK(b.ok());
  return b.value()[0];
}

inline ScheduleOptions fixture_options(int32_t n_heads, int32_t n_kv_heads, int32_t head_dim) {
  ScheduleOptions o;
  o.model.name = "movement-test";
  o.model.n_layers = 1;
  o.model.n_heads = n_heads;
  o.model.n_kv_heads = n_kv_heads;
  o.model.head_dim = head_dim;
  o.model.hidden = n_heads * head_dim;
  o.model.ffn = o.model.hidden;
  o.model.vocab = 256;
  o.dtype_bytes = 4;
  o.tolerance = 0.1;
  return o;
}

inline std::vector<std::string> fixture_schedulers(int ranks) {
  std::vector<std::string> s = {"colocated", "wlb", "cad", "cad-symmetric"};
  for (int c = 1; c <= ranks; ++c) {
    if (ranks % c == 0) s.push_back("percp:" + std::to_string(c));
  }
  return s;
}

}  // namespace distca::runtime::device::testing
