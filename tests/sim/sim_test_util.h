// Shared set-up of the simulator's strategy tests: an h200 cluster of Llama-3-8B units and a
// simulate() call that fails the test (not the program) on an error.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "distca/core/specs.h"
#include "distca/data/workload.h"
#include "distca/sim/simulator.h"

namespace distca::sim::testing {

// `units` nodes of 8 H200 GPUs (TP = 8 inside a unit), llama-8b, `pp` stages, the strategy
// parsed from its name; everything else at SimOptions' defaults.
inline SimOptions options(const std::string& strategy, int64_t units, int64_t pp = 1) {
  SimOptions o;
  o.model = model_preset("llama-8b").value();
  o.cluster.hw = hardware_preset("h200").value();
  o.cluster.gpus_per_node = 8;
  o.cluster.gpus = 8 * units;
  o.cluster.pp = pp;
  o.strategy = parse_strategy(strategy).value();
  return o;
}

// `m` micro-batches of `ranks` ranks x `tokens` tokens drawn from `dist`.
inline std::vector<Batch> drawn(int64_t ranks, int64_t tokens, int64_t m, uint64_t seed,
                                const std::string& dist = "prolong") {
  WorkloadOptions w;
  w.dist = dist;
  w.ranks = ranks;
  w.tokens_per_rank = tokens;
  w.batches = m;
  w.seed = seed;
  return make_batches(w).value();
}

// simulate(), with an error reported as a test failure and an empty result.
inline SimResult run(const SimOptions& o, const std::vector<Batch>& mbs) {
  auto r = simulate(o, mbs);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? std::move(r).value() : SimResult{};
}

}  // namespace distca::sim::testing
