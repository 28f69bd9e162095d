// A small hand-made hardware profile (cost/hardware_profile.h) for the tests of its reader and
// of the simulator's profile terms: every figure is a round number, so a test can state the
// prediction in closed form.
#pragma once

#include <cstdint>

#include "distca/core/specs.h"
#include "distca/cost/hardware_profile.h"

namespace distca::testing {

inline constexpr double kProfileAloneFlops = 1e10;      // FLOP/s of every GEMM, rank 0 alone
inline constexpr double kProfileConcurrentFlops = 5e9;  // every rank at once

// The shapes the profile was "measured" at: hidden 64, 4 heads (2 K/V) of 16, ffn 128,
// vocab 100 (a model of `layers` such layers).
inline ModelSpec profile_test_model(int64_t layers) {
  ModelSpec m;
  m.name = "small";
  m.n_layers = layers;
  m.hidden = 64;
  m.n_heads = 4;
  m.n_kv_heads = 2;
  m.head_dim = 16;
  m.ffn = 128;
  m.vocab = 100;
  return m;
}

// `ranks` ranks on `cores` cores, 1 thread each: the 24 GEMMs at kProfileAloneFlops alone and
// kProfileConcurrentFlops at once; attention forward seconds on the grid {16, 32}: (16, 16)
// 1e-5, (16, 32) 2e-5, (32, 32) 4e-5, backward `backward_ratio` x forward (throughputs, pairs
// / seconds, 136/3.5e-5, 392/7e-5, 528/1.4e-4 at 2.5: the diagonal points below 0.9 x the
// peak, so a task on a grid point costs the point's seconds); with ranks > 1, links: all-to-all
// latency 1e-4 s, 1e9 B/s; p2p 3e-4 s, 2e8 B/s. No element-wise figures.
inline HardwareProfile test_hardware_profile(int64_t ranks, int64_t cores = 2, double backward_ratio = 2.5) {
  HardwareProfile p;
  p.cpu = "test";
  p.cores = cores;
  p.ranks = ranks;
  p.threads_per_rank = 1;
  p.blas = "Haswell";
  p.shape = {64, 4, 2, 16, 128, 100, 32};
  p.gemms = profile_gemm_list(p.shape);
  for (GemmRecord& g : p.gemms) {
    g.seconds_alone = g.flops() / kProfileAloneFlops;
    g.seconds_concurrent = g.flops() / kProfileConcurrentFlops;
  }
  CostTable t;
  t.n_heads = 4;
  t.n_kv_heads = 2;
  t.head_dim = 16;
  t.q_lens = {16, 32};
  t.kv_lens = {16, 32};
  t.seconds = {{1e-5, 2e-5}, {0, 4e-5}};
  p.attention_forward = t;
  for (auto& row : t.seconds) {
    for (double& s : row) s *= backward_ratio;
  }
  p.attention_backward = t;
  if (ranks > 1) {
    p.all_to_all = LinkProfile{1e-4, 1e9, {{64, 1e-4}, {1 << 20, 1e-3}}};
    p.p2p = LinkProfile{3e-4, 2e8, {{64, 3e-4}, {1 << 20, 5e-3}}};
  }
  return p;
}

}  // namespace distca::testing
