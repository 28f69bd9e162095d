// A varlen batch of attention tasks with random inputs and every output buffer on the host:
// what the kernels' tests, the profiler and the benchmarks run on. Needs only the core layer
// (no BLAS, no OpenMP), so the CUDA kernels' tests build with it in the kernels-only
// configuration (DISTCA_KERNELS_ONLY).
//
// Thread safety: plain functions of their arguments.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "distca/kernels/attention.h"

namespace distca::kernels {

// A varlen batch of (q_len, kv_len) tasks with random inputs and all output buffers.
struct AttentionProblem {
  int32_t n_heads = 1, n_kv_heads = 1, head_dim = 128;
  bool causal = true;
  std::vector<int32_t> cu_q, cu_k;       // (n_tasks + 1)
  std::vector<float> q, k, v, o, lse;    // shapes of attention.h
  std::vector<float> d_o, dq, dk, dv;
};

// Builds a problem for `tasks` ((q_len, kv_len) each) with inputs uniform in [-1, 1) drawn
// from Rng(seed), causal. Precondition: q_len, kv_len >= 0 (q_len <= kv_len unless the
// caller then sets causal = false).
AttentionProblem make_problem(const std::vector<std::pair<int64_t, int64_t>>& tasks, int32_t n_heads,
                              int32_t n_kv_heads, int32_t head_dim, uint64_t seed);

// Params whose pointers refer to `prob`'s buffers (valid while prob lives, unresized).
AttentionParams params_for(AttentionProblem& prob);

}  // namespace distca::kernels
